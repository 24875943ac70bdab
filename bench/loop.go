package main

// -run work: the throughput of worker.Run against the hand-written
// claim/ack loop of the table (hand_side.go) and inbox's own Claim/Ack loop
// (inbox_side.go), in the same run, on the same pool. For a line of n
// workers and batch b, Work runs n loops with worker.Config.Batch b and the
// no-op handler of the table (-work-hold makes some of its handlers slow);
// the other two sides run n workers of their rounds. The sides alternate in
// segments (work, hand, Claim/Ack, then backwards), the tables topped up
// before each; a Work segment ends by cancelling the loops' context, and its
// time runs until every loop has returned, its last acknowledgements
// included.
//
// Work and Claim/Ack share inbox's table, which has the recommended lease
// indexes under the lease form; the hand-written side has a table of its
// own, with its primary key only unless -hand-indexes (as for the table).
//
// With a batch over one the lease lines differ in how they acknowledge:
// the hand-written side the batch in one statement, the Claim/Ack side
// through the Batcher's AckAll after handling the jobs in turn, Work by the
// loop's own gathering: one AckAll for a batch of quick handlers, groups
// sent as they end once the batch's first millisecond has passed.

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/worker"
)

// The Work side's uneven handlers (-work-hold): one job in workHoldEvery,
// by the order the loops handle them, holds for workHold.
var (
	workHold      time.Duration
	workHoldEvery = 16
)

// loopForms are the forms -run work measures.
var loopForms = []string{"lease", "lease-shallow", "rowlock", "advisory"}

func runLoop(ctx context.Context, out, log io.Writer, es []engine, forms []string, workers, batches []int, duration time.Duration, segments int, dir string) error {
	if _, err := headerOf(out, es, dir, nil); err != nil {
		return err
	}
	fmt.Fprintf(out, "Each side of a line measured for %v in %d alternating segments; Work and Claim/Ack on inbox's table (lease: its recommended indexes), hand-written on its own table (%s); Work/hand = worker.Run jobs/s over the hand-written loop's.\n\n", duration, segments, handTableKind())
	fmt.Fprintln(out, "| engine | driver | form | workers | batch | Work jobs/s | hand-written jobs/s | Claim/Ack loop jobs/s | Work/hand | Work/Claim-Ack |")
	fmt.Fprintln(out, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
	best := map[string]float64{}
	for _, c := range loopCells(es, forms, workers, batches) {
		rs, err := loopCell(ctx, c, dir, prefill(best, c, duration/time.Duration(segments)), duration, segments)
		if err != nil {
			return fmt.Errorf("%v: %w", c, err)
		}
		key := fmt.Sprintf("%s/%s/%d", c.e.name, c.form, c.batch)
		best[key] = max(best[key], rs[0].rate(), rs[1].rate(), rs[2].rate())
		fmt.Fprintf(out, "| %s | %s | %s | %d | %d | %.0f | %.0f | %.0f | %.2f | %.2f |\n",
			c.e.family, c.e.label, c.form, c.workers, c.batch, rs[0].rate(), rs[1].rate(), rs[2].rate(), rs[0].rate()/rs[1].rate(), rs[0].rate()/rs[2].rate())
		fmt.Fprintf(log, "%v: work %d jobs in %v, hand %d in %v, claim/ack %d in %v\n", c,
			rs[0].jobs, rs[0].elapsed.Round(time.Millisecond), rs[1].jobs, rs[1].elapsed.Round(time.Millisecond),
			rs[2].jobs, rs[2].elapsed.Round(time.Millisecond))
	}
	return nil
}

// loopCells lists the lines of a run over the loop forms: each engine,
// each form of forms it has, each worker count and batch, in that order.
func loopCells(es []engine, forms []string, workers, batches []int) []cell {
	var cs []cell
	for _, e := range es {
		for _, form := range forms {
			form = strings.TrimSpace(form)
			if !contains(loopForms, form) || !contains(e.forms(), form) {
				continue
			}
			for _, w := range workers {
				for _, b := range batches {
					cs = append(cs, cell{e: e, form: form, workers: w, batch: b})
				}
			}
		}
	}
	return cs
}

// loopCell measures the three sides of a line: Work, hand-written,
// Claim/Ack.
func loopCell(ctx context.Context, c cell, dir string, want int, duration time.Duration, segments int) (rs [3]result, err error) {
	db, err := c.e.open(dir, c.conns())
	if err != nil {
		return rs, err
	}
	defer db.Close()
	tables, drop, err := createTables(ctx, c, db)
	defer drop()
	if err != nil {
		return rs, err
	}
	q, err := inbox.New(db, sideConfig(c.e, benchTable(tables[0], c.form)))
	if err != nil {
		return rs, err
	}
	defer q.Shutdown(context.WithoutCancel(ctx))
	var sides [2]side
	for k, hand := range []bool{true, false} {
		if sides[k], err = newSide(c, db, tables[1-k], hand); err != nil {
			return rs, err
		}
		defer sides[k].close()
	}
	if err := fillTables(ctx, c, db, tables, want); err != nil {
		return rs, err
	}
	seg := duration / time.Duration(segments)
	// Jobs left in inbox's table (Work, Claim/Ack) and the hand-written one.
	left := [2]int{want, want}
	order := []int{0, 1, 2}
	for i := 0; i < segments; i++ {
		for _, which := range order {
			t := 0 // the table of the side
			if which == 1 {
				t = 1
			}
			if left[t] < want {
				if err := c.e.fill(ctx, db, tables[t], want-left[t], payload); err != nil {
					return rs, fmt.Errorf("fill: %w", err)
				}
				left[t] = want
			}
			var r result
			if which == 0 {
				r = measureWork(ctx, q, c, left[t], seg)
			} else {
				r = measure(ctx, sides[which-1], c.workers, left[t], seg, 10*time.Second)
			}
			if r.err != nil {
				return rs, fmt.Errorf("%s: %w", [3]string{"Work", "hand-written", "Claim/Ack"}[which], r.err)
			}
			left[t] -= r.jobs
			rs[which].jobs += r.jobs
			rs[which].elapsed += r.elapsed
		}
		order[0], order[2] = order[2], order[0]
	}
	return rs, nil
}

// measureWork runs c.workers Work loops on q for duration, or until total
// jobs were handled, and counts the jobs handled; its time ends when every
// loop has returned.
func measureWork(ctx context.Context, q *inbox.Queue, c cell, total int, duration time.Duration) result {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var handled atomic.Int64
	var once sync.Once
	start := time.Now()
	timer := time.AfterFunc(duration, cancel)
	defer timer.Stop()
	h := func(_ context.Context, d *inbox.Delivery) error {
		k := handled.Add(1)
		if k >= int64(total) {
			once.Do(cancel)
		}
		if workHold > 0 && k%int64(workHoldEvery) == 0 {
			time.Sleep(workHold)
		}
		return handle(d)
	}
	// The lease's loops run in one call, as a user runs them; the forms
	// that hold a connection per job run a call per loop, each checked
	// against the pool for its own batch, as the cell's pool is capped.
	calls, loops := c.workers, 1
	if q.Form() == inbox.Lease {
		calls, loops = 1, c.workers
	}
	errs := make(chan error, calls)
	var wg sync.WaitGroup
	for range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- worker.Run(ctx, q, worker.Config{Workers: loops, Batch: c.batch, NoDelay: true, RetryForever: true}, h)
		}()
	}
	wg.Wait()
	r := result{jobs: int(handled.Load()), elapsed: time.Since(start)}
	close(errs)
	for err := range errs {
		if err != nil && r.err == nil {
			r.err = err
		}
	}
	return r
}

// workDrain fills table with jobs and works through them with Work loops,
// reporting how many were handled and how many rows are left: the check that
// the Work side does the work it measures.
func workDrain(ctx context.Context, c cell, db *sql.DB, table string, jobs int) (done, left int, err error) {
	if err := c.e.empty(ctx, db, table); err != nil {
		return 0, 0, err
	}
	if err := c.e.fill(ctx, db, table, jobs, payload); err != nil {
		return 0, 0, err
	}
	q, err := inbox.New(db, inbox.Config{Dialect: c.e.dialect, Table: benchTable(table, c.form)})
	if err != nil {
		return 0, 0, err
	}
	r := measureWork(ctx, q, c, jobs, time.Minute)
	if r.err != nil {
		return r.jobs, 0, r.err
	}
	left, err = count(ctx, db, table)
	return r.jobs, left, err
}
