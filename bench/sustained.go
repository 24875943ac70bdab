package main

// -run sustained: the lease form on PostgreSQL under a fixed enqueue rate
// for a long while, as in production, to see whether throughput and the
// claim's latency hold up as dead rows come and go. First the workers'
// throughput is measured on a full table (a few seconds); then jobs are
// enqueued at a fraction of it (-sustain-load, 0.8) for -sustain, in
// batches every 100 ms, while the workers claim one job at a time and
// acknowledge it. The run is cut into ten windows; each reports the jobs
// acknowledged per second, the claim's p50 and p99, the backlog and the
// table's dead rows.
//
// This machine's PostgreSQL runs with autovacuum off. The run vacuums and
// analyzes the table itself every -sustain-vacuum (30 s: autovacuum's naptime is a
// minute, and a table churning thousands of rows a second passes its
// threshold at every visit), or never with -sustain-vacuum 0. With
// -sustain-hold a transaction that took a snapshot stays open for the whole
// run, as a long row-lock job holds one: vacuum can then remove no row
// deleted after it began.

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqlinbox/inbox"
)

// Flags of -run sustained.
var (
	sustainFor     = 10 * time.Minute
	sustainLoad    = 0.8
	sustainWorkers = 4
	sustainVacuum  = 30 * time.Second
	sustainHold    bool
)

// sustainWindows is how many windows a run is cut into.
const sustainWindows = 10

// window is what one stretch of the run saw.
type window struct {
	acked       int
	claims      []time.Duration // each claim's time
	backlog     int64           // pending rows at its end
	dead        int64           // the table's dead rows at its end (pg_stat_user_tables)
	vacuums     int
	vacuumTaken time.Duration
}

func runSustained(ctx context.Context, out, log io.Writer, es []engine, dir string) error {
	for _, e := range es {
		if e.family != "postgres" {
			continue
		}
		if err := sustainedOne(ctx, out, log, e, dir); err != nil {
			return fmt.Errorf("sustained %s: %w", e.name, err)
		}
	}
	return nil
}

func sustainedOne(ctx context.Context, out, log io.Writer, e engine, dir string) error {
	db, err := e.open(dir, sustainWorkers+4)
	if err != nil {
		return err
	}
	defer db.Close()
	table := "bench_sustained_" + e.name
	if err := e.createTable(ctx, db, table); err != nil {
		return err
	}
	defer e.drop(context.WithoutCancel(ctx), db, table)
	for _, s := range depthIndexes(e, table) {
		if _, err := db.ExecContext(ctx, s); err != nil {
			return err
		}
	}
	q, err := inbox.New(db, inbox.Config{Dialect: e.dialect, Table: inbox.Table{Name: table, LockedUntil: "locked_until"}, Lease: 30 * time.Second})
	if err != nil {
		return err
	}

	// The workers' throughput, on a table with plenty of jobs.
	calib, jobs := max(sustainFor/60, time.Second), 200000
	if sustainFor < time.Minute {
		jobs = 20000 // a short check
	}
	if err := e.fill(ctx, db, table, jobs, payload); err != nil {
		return err
	}
	var done atomic.Int64
	runWorkers(ctx, q, calib, &done, nil)
	capacity := float64(done.Load()) / calib.Seconds()
	if err := e.empty(ctx, db, table); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, "VACUUM "+table); err != nil {
		return err
	}
	rate := capacity * sustainLoad
	fmt.Fprintf(log, "sustained %s: the workers' throughput %.0f jobs/s; enqueueing %.0f jobs/s for %v\n", e.name, capacity, rate, sustainFor)

	if sustainHold {
		// A snapshot held open: vacuum keeps every row deleted after it.
		tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
		if err != nil {
			return err
		}
		defer tx.Rollback()
		var x int64
		if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM "+table).Scan(&x); err != nil {
			return err
		}
	}

	ws := make([]window, sustainWindows)
	span := sustainFor / sustainWindows
	start := time.Now()
	index := func() int { return min(int(time.Since(start)/span), sustainWindows-1) }
	var mu sync.Mutex
	record := func(took time.Duration, acked bool) {
		mu.Lock()
		w := &ws[index()]
		w.claims = append(w.claims, took)
		if acked {
			w.acked++
		}
		mu.Unlock()
	}
	runCtx, cancel := context.WithTimeout(ctx, sustainFor)
	defer cancel()
	errs := make(chan error, 3)
	go func() { errs <- enqueueAt(runCtx, e, db, table, rate) }()
	go func() { errs <- vacuumEvery(runCtx, db, table, ws, index, &mu) }()
	go func() { errs <- sampleWindows(runCtx, db, table, ws, span, start, &mu) }()
	runWorkers(runCtx, q, sustainFor, &done, record)
	for i := 0; i < 3; i++ {
		if err := <-errs; err != nil && runCtx.Err() == nil {
			return err
		}
	}

	hold := "no"
	if sustainHold {
		hold = "yes"
	}
	vac := "every " + sustainVacuum.String()
	if sustainVacuum == 0 {
		vac = "never"
	}
	fmt.Fprintf(out, "Lease form, %s, %d workers claiming one job at a time; %.0f jobs/s enqueued (%.0f %% of the %.0f jobs/s measured); %v; vacuum %s; a transaction held open: %s.\n\n",
		e.label, sustainWorkers, rate, sustainLoad*100, capacity, sustainFor, vac, hold)
	fmt.Fprintln(out, "| window | acknowledged jobs/s | claim p50 | claim p99 | backlog | dead rows | vacuums (time) |")
	fmt.Fprintln(out, "|--:|--:|--:|--:|--:|--:|--:|")
	for i, w := range ws {
		p50, p99 := percentile(w.claims, 50), percentile(w.claims, 99)
		fmt.Fprintf(out, "| %d | %.0f | %v | %v | %d | %d | %d (%v) |\n", i+1, float64(w.acked)/span.Seconds(),
			p50.Round(time.Microsecond), p99.Round(time.Microsecond), w.backlog, w.dead, w.vacuums, w.vacuumTaken.Round(time.Millisecond))
	}
	first, last := ws[0], ws[len(ws)-1]
	fmt.Fprintf(out, "\nLast window over first: throughput %.2f, claim p99 %.2f.\n\n",
		float64(last.acked)/float64(max(first.acked, 1)),
		float64(percentile(last.claims, 99))/float64(max(percentile(first.claims, 99), 1)))
	return nil
}

// runWorkers runs sustainWorkers loops of Claim(1) and Ack for d, counting
// the jobs acknowledged in done and telling record each claim's time.
func runWorkers(ctx context.Context, q *inbox.Queue, d time.Duration, done *atomic.Int64, record func(time.Duration, bool)) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var wg sync.WaitGroup
	for i := 0; i < sustainWorkers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Statements run to their end: the loop stops between rounds.
			bg := context.WithoutCancel(ctx)
			for ctx.Err() == nil {
				t := time.Now()
				ds, err := q.Claim(bg, 1)
				took := time.Since(t)
				acked := false
				if err == nil && len(ds) == 1 {
					acked = ds[0].Ack(bg) == nil
				}
				if acked {
					done.Add(1)
				}
				if record != nil {
					record(took, acked)
				}
				if err == nil && len(ds) == 0 {
					// An empty queue: the enqueuer is behind. Wait a tick, as a
					// loop's poll would.
					select {
					case <-ctx.Done():
					case <-time.After(time.Millisecond):
					}
				}
			}
		}()
	}
	wg.Wait()
}

// enqueueAt inserts rate jobs a second, a tenth of them every 100 ms.
func enqueueAt(ctx context.Context, e engine, db *sql.DB, table string, rate float64) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	start, sent := time.Now(), 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		due := int(rate * time.Since(start).Seconds())
		if err := e.fill(ctx, db, table, due-sent, payload); err != nil {
			return err
		}
		sent = due
	}
}

// vacuumEvery vacuums the table every sustainVacuum, counting in the window.
func vacuumEvery(ctx context.Context, db *sql.DB, table string, ws []window, index func() int, mu *sync.Mutex) error {
	if sustainVacuum == 0 {
		return nil
	}
	tick := time.NewTicker(sustainVacuum)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		t := time.Now()
		// Both what autovacuum does: remove dead rows, refresh statistics.
		if _, err := db.ExecContext(ctx, "VACUUM (ANALYZE) "+table); err != nil {
			return err
		}
		mu.Lock()
		w := &ws[index()]
		w.vacuums++
		w.vacuumTaken += time.Since(t)
		mu.Unlock()
	}
}

// sampleWindows reads the backlog and the dead rows at each window's end.
func sampleWindows(ctx context.Context, db *sql.DB, table string, ws []window, span time.Duration, start time.Time, mu *sync.Mutex) error {
	for i := range ws {
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(start.Add(span*time.Duration(i+1) - 50*time.Millisecond))):
		}
		bg := context.WithoutCancel(ctx)
		var backlog, dead int64
		if err := db.QueryRowContext(bg, "SELECT count(*) FROM "+table+" WHERE locked_until IS NULL").Scan(&backlog); err != nil {
			return err
		}
		// The statistics collector reports with a delay of its own.
		if err := db.QueryRowContext(bg, "SELECT coalesce(n_dead_tup, 0) FROM pg_stat_user_tables WHERE relname = $1", table).Scan(&dead); err != nil {
			return err
		}
		mu.Lock()
		ws[i].backlog, ws[i].dead = backlog, dead
		mu.Unlock()
	}
	return nil
}
