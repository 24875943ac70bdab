package main

// -run enqueue: jobs per second of producers enqueueing in bulk, calls of
// -enqueue-jobs jobs each (1,000 by default): a loop of Queue.Enqueue in one
// transaction (the way to enqueue many before EnqueueMany), Queue.EnqueueMany
// through the pool, and on pgx River's InsertMany (INSERT … unnest,
// returning the rows) and InsertManyFast (COPY FROM), each into its own
// table with the indexes of its schema (inbox: the lease form's recommended
// ones). The sides alternate in -segments rounds, each measured for
// -duration / segments; a table is emptied (untimed) before each of its
// segments, so that every segment inserts into the same empty table. jobs/s
// is the median of a side's segments.

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/sqlinbox/inbox"
)

// enqueueJobs is the jobs of one call (-enqueue-jobs).
var enqueueJobs = 1000

// enqueuePrefix starts the names of the mode's tables.
var enqueuePrefix = "bench_enq_"

// producer is one side of -run enqueue: call inserts n jobs at once; empty
// deletes every job, untimed.
type producer struct {
	name  string
	call  func(ctx context.Context, n int) error
	empty func(ctx context.Context) error
}

func runEnqueue(ctx context.Context, out, log io.Writer, es []engine, duration time.Duration, segments int, dir string) error {
	if _, err := headerOf(out, es, dir, nil); err != nil {
		return err
	}
	fmt.Fprintf(out, "Calls of %d jobs of 128 bytes each, one producer; the sides alternate in %d segments of %v, each into its emptied table; jobs/s is the median of the segments; ratios are to the loop of Enqueue in one transaction. EnqueueMany's queue: %s; Enqueue in the transaction sends text.\n\n",
		enqueueJobs, segments, duration/time.Duration(segments), preparedOrText())
	fmt.Fprintln(out, "| engine | driver | loop of Enqueue in a tx, jobs/s | EnqueueMany jobs/s | ratio | River InsertMany jobs/s | ratio | River InsertManyFast (COPY) jobs/s | ratio |")
	fmt.Fprintln(out, "|---|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, e := range es {
		ps, done, err := enqueueProducers(ctx, e, dir, log)
		if err != nil {
			done()
			return fmt.Errorf("%s: %w", e.name, err)
		}
		rates, err := enqueueLine(ctx, ps, duration/time.Duration(segments), segments)
		done()
		if err != nil {
			return fmt.Errorf("%s: %w", e.name, err)
		}
		line := fmt.Sprintf("| %s | %s | %.0f | %.0f | %.1f |", e.family, e.label, rates[0], rates[1], rates[1]/rates[0])
		if len(rates) > 2 {
			line += fmt.Sprintf(" %.0f | %.2f | %.0f | %.2f |", rates[2], rates[1]/rates[2], rates[3], rates[1]/rates[3])
		} else {
			line += " | | | |"
		}
		fmt.Fprintln(out, line)
	}
	fmt.Fprintln(out, "\nThe ratios after River's columns are EnqueueMany / River.")
	return nil
}

// enqueueLine measures the producers in alternating segments and returns
// each one's median rate.
func enqueueLine(ctx context.Context, ps []producer, seg time.Duration, segments int) ([]float64, error) {
	return enqueueLineOf(ctx, ps, seg, segments, enqueueJobs)
}

// enqueueLineOf is enqueueLine with calls of n jobs.
func enqueueLineOf(ctx context.Context, ps []producer, seg time.Duration, segments, n int) ([]float64, error) {
	rs := make([]result, len(ps))
	for i := 0; i < segments; i++ {
		for k := range ps {
			p := ps[(k+i)%len(ps)]
			if err := p.empty(ctx); err != nil {
				return nil, err
			}
			var r result
			start := time.Now()
			for time.Since(start) < seg || r.jobs == 0 {
				if err := p.call(ctx, n); err != nil {
					return nil, fmt.Errorf("%s: %w", p.name, err)
				}
				r.jobs += n
			}
			r.elapsed = time.Since(start)
			j := (k + i) % len(ps)
			rs[j].segs = append(rs[j].segs, r.rate())
		}
	}
	out := make([]float64, len(ps))
	for k, r := range rs {
		out[k] = r.median()
	}
	return out, nil
}

// enqueueProducers returns the sides of an engine: the loop, EnqueueMany
// and, on pgx, River's two; done drops their tables and closes their pools.
func enqueueProducers(ctx context.Context, e engine, dir string, log io.Writer) (ps []producer, done func(), err error) {
	var undo []func()
	done = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	db, err := e.open(dir, 4)
	if err != nil {
		return nil, done, err
	}
	undo = append(undo, func() { db.Close() })
	for _, name := range []string{"loop", "many"} {
		table := enqueuePrefix + name + "_" + e.name
		if err := e.createTable(ctx, db, table); err != nil {
			return nil, done, err
		}
		undo = append(undo, func() { e.drop(context.Background(), db, table) })
		for _, s := range depthIndexes(e, table) {
			if _, err := db.ExecContext(ctx, s); err != nil {
				return nil, done, err
			}
		}
		// EnqueueMany on the pool runs prepared where -prepare says so; the
		// loop's Enqueue in the caller's transaction is always text.
		q, err := inbox.New(db, inbox.Config{Dialect: e.dialect, Table: benchTable(table, "lease"), Prepare: prepareFor(e)})
		if err != nil {
			return nil, done, err
		}
		undo = append(undo, func() { _ = q.Close() })
		p := producer{name: name, empty: func(ctx context.Context) error { return e.empty(ctx, db, table) }}
		if name == "loop" {
			p.call = func(ctx context.Context, n int) error {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer tx.Rollback()
				for range n {
					if _, err := q.Enqueue(ctx, tx, inbox.Job{Data: []any{payload}}); err != nil {
						return err
					}
				}
				return tx.Commit()
			}
		} else {
			p.call = func(ctx context.Context, n int) error {
				jobs := make([]inbox.Job, n)
				for i := range jobs {
					jobs[i].Data = []any{payload}
				}
				_, err := q.EnqueueMany(ctx, db, jobs)
				return err
			}
		}
		ps = append(ps, p)
	}
	if e.name != "pgx" {
		return ps, done, nil
	}
	if err := riverMigrate(ctx, e, dir, log); err != nil {
		return nil, done, fmt.Errorf("River migrations: %w", err)
	}
	undo = append(undo, func() { riverDropSchema(context.Background(), e, dir) })
	pool, err := riverPool(ctx, e, dir, 4)
	if err != nil {
		return nil, done, err
	}
	undo = append(undo, pool.Close)
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: riverLogger(log)})
	if err != nil {
		return nil, done, err
	}
	params := func(n int) []river.InsertManyParams {
		ps := make([]river.InsertManyParams, n)
		for i := range ps {
			ps[i] = river.InsertManyParams{Args: riverArgs{Payload: payload}}
		}
		return ps
	}
	empty := func(ctx context.Context) error {
		_, err := pool.Exec(ctx, "TRUNCATE river_job")
		return err
	}
	ps = append(ps,
		producer{name: "River InsertMany", empty: empty, call: func(ctx context.Context, n int) error {
			_, err := client.InsertMany(ctx, params(n))
			return err
		}},
		producer{name: "River InsertManyFast", empty: empty, call: func(ctx context.Context, n int) error {
			_, err := client.InsertManyFast(ctx, params(n))
			return err
		}})
	return ps, done, nil
}
