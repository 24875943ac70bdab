package main

// -run unique: what a unique key costs an Enqueue. One producer enqueues
// one job per call through the pool (a statement that commits by itself),
// on the lease form's recommended table: plain jobs; jobs with a fresh
// unique key each (inserted, the key's index written too); and jobs whose
// key is held (refused with the holder read: ErrDuplicate). The sides
// alternate in -segments rounds of -duration / segments, each into its own
// emptied table; jobs/s is the median of a side's segments, and the ratios
// are to the plain Enqueue of the same run.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/sqlinbox/inbox"
)

func runUnique(ctx context.Context, out io.Writer, es []engine, duration time.Duration, segments int, dir string) error {
	if _, err := headerOf(out, es, dir, nil); err != nil {
		return err
	}
	fmt.Fprintf(out, "Enqueue of one job of 128 bytes per call through the pool, one producer; the sides alternate in %d segments of %v; jobs/s is the median of the segments; plain / key / key held.\n\n",
		segments, duration/time.Duration(segments))
	fmt.Fprintln(out, "| engine | driver | plain jobs/s | unique key jobs/s | ratio | key held (ErrDuplicate) calls/s | ratio |")
	fmt.Fprintln(out, "|---|---|---:|---:|---:|---:|---:|")
	for _, e := range es {
		ps, done, err := uniqueProducers(ctx, e, dir)
		if err != nil {
			done()
			return fmt.Errorf("%s: %w", e.name, err)
		}
		rates, err := enqueueLineOf(ctx, ps, duration/time.Duration(segments), segments, 200)
		done()
		if err != nil {
			return fmt.Errorf("%s: %w", e.name, err)
		}
		fmt.Fprintf(out, "| %s | %s | %.0f | %.0f | %.2f | %.0f | %.2f |\n", e.family, e.label, rates[0], rates[1], rates[1]/rates[0], rates[2], rates[2]/rates[0])
	}
	return nil
}

// uniqueProducers returns the three sides of an engine, each on a table
// of its own with a unique key column; done drops them.
func uniqueProducers(ctx context.Context, e engine, dir string) (ps []producer, done func(), err error) {
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
	typ := map[string]string{"postgres": "text", "mysql": "varchar(191) NULL", "sqlite": "TEXT"}[e.family]
	for _, name := range []string{"plain", "key", "held"} {
		table := "bench_uniq_" + name + "_" + e.name
		if err := e.createTable(ctx, db, table); err != nil {
			return nil, done, err
		}
		undo = append(undo, func() { e.drop(context.Background(), db, table) })
		stmts := append(depthIndexes(e, table), "ALTER TABLE "+table+" ADD COLUMN unique_key "+typ,
			"CREATE UNIQUE INDEX "+table+"_uk ON "+table+" (unique_key)")
		for _, s := range stmts {
			if _, err := db.ExecContext(ctx, s); err != nil {
				return nil, done, err
			}
		}
		tb := benchTable(table, "lease")
		tb.UniqueKey = "unique_key"
		q, err := inbox.New(db, inbox.Config{Dialect: e.dialect, Table: tb, Prepare: prepareFor(e)})
		if err != nil {
			return nil, done, err
		}
		undo = append(undo, func() { _ = q.Close() })
		var seq int
		p := producer{name: name, empty: func(ctx context.Context) error {
			if err := e.empty(ctx, db, table); err != nil || name != "held" {
				return err
			}
			_, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{payload}, UniqueKey: "held"})
			return err
		}}
		p.call = func(ctx context.Context, n int) error {
			for range n {
				job := inbox.Job{Data: []any{payload}}
				switch name {
				case "key":
					seq++
					job.UniqueKey = "k" + strconv.Itoa(seq)
				case "held":
					job.UniqueKey = "held"
				}
				_, err := q.Enqueue(ctx, db, job)
				if name == "held" && errors.Is(err, inbox.ErrDuplicate) {
					err = nil
				}
				if err != nil {
					return err
				}
			}
			return nil
		}
		ps = append(ps, p)
	}
	return ps, done, nil
}
