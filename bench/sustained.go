package main

// -run sustained: each claim form on each engine under a fixed enqueue rate
// for a long while, as in production, to see whether throughput and the
// claim's latency hold up as dead rows come and go. First the workers'
// throughput is measured on a full table (a few seconds); then jobs are
// enqueued at a fraction of it (-sustain-load, 0.8) for -sustain, in
// batches every 100 ms, while the workers claim one job at a time and
// acknowledge it. The run is cut into ten windows; each reports the jobs
// acknowledged per second, the claim's p50 and p99, the backlog and what
// the engine has yet to clean up after the deleted rows.
//
// What stands for dead rows differs by engine. PostgreSQL: the table's
// n_dead_tup. This machine's PostgreSQL runs with autovacuum off, so the run
// vacuums and analyzes the table itself every -sustain-vacuum (30 s:
// autovacuum's naptime is a minute, and a table churning thousands of rows a
// second passes its threshold at every visit), or never with
// -sustain-vacuum 0. MariaDB and MySQL: InnoDB's history list length, the
// committed changes purge has yet to clean up; there is nothing to vacuum,
// purge runs on its own. SQLite: the WAL file's size; a deleted row's pages
// go to the freelist and are reused, so nothing needs a vacuum, but a
// checkpoint can only reset the WAL once no reader needs its older pages.
//
// With -sustain-hold a transaction that has read the table stays open for
// the whole run, as a long row-lock job holds one: on PostgreSQL vacuum can
// then remove no row deleted after it began, on InnoDB purge stays behind
// its read view, on SQLite no checkpoint passes its snapshot.

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
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

// sustainForms are the forms to run; nil means those of -forms. The tests
// set it: the flag is only defined once main has run.
var sustainForms []string

// sustainWindows is how many windows a run is cut into.
const sustainWindows = 10

// window is what one stretch of the run saw.
type window struct {
	acked       int
	claims      []time.Duration // each claim's time
	backlog     int64           // pending rows at its end
	dead        int64           // what stands for dead rows at its end (see sustainedDead); -1 unread
	vacuums     int
	vacuumTaken time.Duration
}

// sustainRun is one form on one engine, measured.
type sustainRun struct {
	e              engine
	form           string
	capacity, rate float64
	ws             []window
	failed         int   // claims and acks that returned an error
	firstErr       error // the first of them
}

// formsForSustained reads -forms (through the flag package, as run's
// options do not reach this mode), takes lease-async as lease, since here
// each worker acknowledges its one job itself, and drops repeats.
func formsForSustained() ([]string, error) {
	list := sustainForms
	if list == nil {
		list = []string{"lease", "rowlock", "advisory"}
		if f := flag.Lookup("forms"); f != nil {
			list = strings.Split(f.Value.String(), ",")
		}
	}
	var forms []string
	for _, f := range list {
		f = strings.TrimSpace(f)
		if f == "lease-async" {
			f = "lease"
		}
		if f != "lease" && f != "rowlock" && f != "advisory" {
			return nil, fmt.Errorf("sustained: unknown form %q (want lease, rowlock or advisory)", f)
		}
		if !contains(forms, f) {
			forms = append(forms, f)
		}
	}
	return forms, nil
}

func runSustained(ctx context.Context, out, log io.Writer, es []engine, dir string) error {
	forms, err := formsForSustained()
	if err != nil {
		return err
	}
	for _, e := range es {
		for _, form := range forms {
			if !contains(e.forms(), form) {
				fmt.Fprintf(log, "sustained %s: no %s form on %s, skipped\n", e.name, form, e.family)
				continue
			}
			r, err := sustainedOne(ctx, log, e, form, dir)
			if err != nil {
				return fmt.Errorf("sustained %s %s: %w", e.name, form, err)
			}
			r.print(out)
			if r.failed > 0 {
				return fmt.Errorf("sustained %s %s: %d claims or acks failed, the first: %w", e.name, form, r.failed, r.firstErr)
			}
		}
	}
	return nil
}

func sustainedOne(ctx context.Context, log io.Writer, e engine, form, dir string) (sustainRun, error) {
	r := sustainRun{e: e, form: form}
	// A connection per worker (row lock and advisory hold theirs while a job
	// is in work), then the enqueuer, the sampler, the vacuum, the held
	// transaction and one spare.
	db, err := e.open(dir, sustainWorkers+5)
	if err != nil {
		return r, err
	}
	defer db.Close()
	table := "bench_sustained_" + e.name + "_" + form
	if err := e.createTable(ctx, db, table); err != nil {
		return r, err
	}
	defer e.drop(context.WithoutCancel(ctx), db, table)
	if form == "lease" {
		// Row lock and advisory claim through the primary key (docs/schema.md).
		for _, s := range depthIndexes(e, table) {
			if _, err := db.ExecContext(ctx, s); err != nil {
				return r, err
			}
		}
	}
	cfg := inbox.Config{Dialect: e.dialect, Table: benchTable(table, form)}
	if form == "lease" {
		cfg.Lease = 30 * time.Second
	}
	q, err := inbox.New(db, cfg)
	if err != nil {
		return r, err
	}
	dead, err := sustainedDead(ctx, e, db, table)
	if err != nil {
		return r, err
	}

	// The workers' throughput, on a table with plenty of jobs.
	calib, jobs := max(sustainFor/60, time.Second), 200000
	if sustainFor < time.Minute {
		jobs = 20000 // a short check
	}
	if err := e.fill(ctx, db, table, jobs, payload); err != nil {
		return r, err
	}
	var done atomic.Int64
	r.failed, r.firstErr = runWorkers(ctx, q, calib, &done, nil)
	r.capacity = float64(done.Load()) / calib.Seconds()
	if err := e.empty(ctx, db, table); err != nil {
		return r, err
	}
	if e.family == "postgres" {
		if _, err := db.ExecContext(ctx, "VACUUM "+table); err != nil {
			return r, err
		}
	}
	r.rate = r.capacity * sustainLoad
	fmt.Fprintf(log, "sustained %s %s: the workers' throughput %.0f jobs/s; enqueueing %.0f jobs/s for %v\n", e.name, form, r.capacity, r.rate, sustainFor)

	if sustainHold {
		release, err := holdSnapshot(ctx, e, db, table)
		if err != nil {
			return r, err
		}
		defer release()
	}

	r.ws = make([]window, sustainWindows)
	ws := r.ws
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
	backlog := "SELECT count(*) FROM " + table
	if form == "lease" {
		backlog += " WHERE locked_until IS NULL" // claimed rows stay until acknowledged
	}
	runCtx, cancel := context.WithTimeout(ctx, sustainFor)
	defer cancel()
	errs := make(chan error, 3)
	go func() { errs <- enqueueAt(runCtx, e, db, table, r.rate) }()
	go func() { errs <- vacuumEvery(runCtx, e, db, table, ws, index, &mu) }()
	go func() { errs <- sampleWindows(runCtx, db, backlog, dead, ws, span, start, &mu) }()
	failed, first := runWorkers(runCtx, q, sustainFor, &done, record)
	r.failed += failed
	if r.firstErr == nil {
		r.firstErr = first
	}
	for i := 0; i < 3; i++ {
		// Their statements run to their end, as the workers' do: any error
		// is one.
		if err := <-errs; err != nil {
			return r, err
		}
	}
	return r, nil
}

// sustainedDead returns the query of what stands for the table's dead rows
// on e, read at each window's end; -1 when it cannot be read.
func sustainedDead(ctx context.Context, e engine, db *sql.DB, table string) (func(context.Context) (int64, error), error) {
	switch e.family {
	case "postgres":
		return func(ctx context.Context) (int64, error) {
			// The statistics collector reports with a delay of its own.
			var n int64
			err := db.QueryRowContext(ctx, "SELECT coalesce(n_dead_tup, 0) FROM pg_stat_user_tables WHERE relname = $1", table).Scan(&n)
			return n, err
		}, nil
	case "mysql":
		return func(ctx context.Context) (int64, error) { return historyLength(ctx, db) }, nil
	default:
		// The main database's file, as SQLite names it; its WAL is beside it.
		var seq int
		var name, file string
		if err := db.QueryRowContext(ctx, "SELECT seq, name, file FROM pragma_database_list WHERE name = 'main'").Scan(&seq, &name, &file); err != nil {
			return nil, err
		}
		return func(context.Context) (int64, error) {
			fi, err := os.Stat(file + "-wal")
			if err != nil {
				return -1, nil
			}
			return fi.Size(), nil
		}, nil
	}
}

// historyLength reads InnoDB's history list length: the metric where it is
// enabled (MariaDB: ENABLED = 1, the default on 10.11), else the line of SHOW
// ENGINE INNODB STATUS (MySQL, whose INNODB_METRICS has no ENABLED column,
// or a disabled metric).
func historyLength(ctx context.Context, db *sql.DB) (int64, error) {
	var n int64
	err := db.QueryRowContext(ctx, "SELECT `count` FROM information_schema.INNODB_METRICS WHERE name = 'trx_rseg_history_len' AND enabled = 1").Scan(&n)
	if err == nil {
		return n, nil
	}
	var typ, name, status string
	if err := db.QueryRowContext(ctx, "SHOW ENGINE INNODB STATUS").Scan(&typ, &name, &status); err != nil {
		return -1, err
	}
	for _, l := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "History list length "); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return -1, nil
}

// holdSnapshot opens a transaction that reads table and keeps its snapshot
// until release: PostgreSQL and InnoDB in REPEATABLE READ, where the first
// read fixes the snapshot (START TRANSACTION WITH CONSISTENT SNAPSHOT's
// effect); SQLite a deferred read transaction on a connection of its own,
// since the DSNs' _txlock=immediate would make BeginTx take the write lock.
func holdSnapshot(ctx context.Context, e engine, db *sql.DB, table string) (release func(), err error) {
	var x int64
	if e.family != "sqlite" {
		tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
		if err != nil {
			return nil, err
		}
		if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM "+table).Scan(&x); err != nil {
			tx.Rollback()
			return nil, err
		}
		return func() { tx.Rollback() }, nil
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	end := func() {
		conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
		conn.Close()
	}
	if _, err := conn.ExecContext(ctx, "BEGIN DEFERRED"); err != nil {
		conn.Close()
		return nil, err
	}
	if err := conn.QueryRowContext(ctx, "SELECT count(*) FROM "+table).Scan(&x); err != nil {
		end()
		return nil, err
	}
	return end, nil
}

// print writes the run's table: the PostgreSQL lease figures of the README
// were printed in the same shape.
func (r sustainRun) print(out io.Writer) {
	hold := "no"
	var vac, deadCol string
	switch r.e.family {
	case "postgres":
		vac, deadCol = "vacuum every "+sustainVacuum.String(), "dead rows"
		if sustainVacuum == 0 {
			vac = "vacuum never"
		}
		if sustainHold {
			hold = "yes"
		}
	case "mysql":
		vac, deadCol = "no vacuum (InnoDB purges deleted rows on its own; the history list length is what purge has yet to clean up)", "history list length"
		if sustainHold {
			hold = "yes (REPEATABLE READ, having read the table: purge stays behind it)"
		}
	default:
		vac, deadCol = "no vacuum (SQLite reuses deleted rows' pages from its freelist; the WAL file's size in place of dead rows)", "WAL bytes"
		if sustainHold {
			hold = "yes (a read transaction on its own connection: no checkpoint passes it)"
		}
	}
	title := map[string]string{"lease": "Lease", "rowlock": "Row-lock", "advisory": "Advisory"}[r.form]
	fmt.Fprintf(out, "%s form on %s (%s), %d workers claiming one job at a time; %.0f jobs/s enqueued (%.0f %% of the %.0f jobs/s measured); %v; %s; a transaction held open: %s.\n\n",
		title, r.e.name, r.e.label, sustainWorkers, r.rate, sustainLoad*100, r.capacity, sustainFor, vac, hold)
	fmt.Fprintf(out, "| window | acknowledged jobs/s | claim p50 | claim p99 | backlog | %s | vacuums (time) |\n", deadCol)
	fmt.Fprintln(out, "|--:|--:|--:|--:|--:|--:|--:|")
	span := sustainFor / sustainWindows
	for i, w := range r.ws {
		p50, p99 := percentile(w.claims, 50), percentile(w.claims, 99)
		dead, vacs := "-", "-"
		if w.dead >= 0 {
			dead = strconv.FormatInt(w.dead, 10)
		}
		if r.e.family == "postgres" {
			vacs = fmt.Sprintf("%d (%v)", w.vacuums, w.vacuumTaken.Round(time.Millisecond))
		}
		fmt.Fprintf(out, "| %d | %.0f | %v | %v | %d | %s | %s |\n", i+1, float64(w.acked)/span.Seconds(),
			p50.Round(time.Microsecond), p99.Round(time.Microsecond), w.backlog, dead, vacs)
	}
	first, last := r.ws[0], r.ws[len(r.ws)-1]
	fmt.Fprintf(out, "\nLast window over first: throughput %.2f, claim p99 %.2f.\n\n",
		float64(last.acked)/float64(max(first.acked, 1)),
		float64(percentile(last.claims, 99))/float64(max(percentile(first.claims, 99), 1)))
	if r.failed > 0 {
		fmt.Fprintf(out, "Claims or acks failed: %d, the first: %v.\n\n", r.failed, r.firstErr)
	}
}

// runWorkers runs sustainWorkers loops of Claim(1) and Ack for d, counting
// the jobs acknowledged in done and telling record each claim's time. It
// returns how many claims and acks failed, and the first error.
func runWorkers(ctx context.Context, q *inbox.Queue, d time.Duration, done *atomic.Int64, record func(time.Duration, bool)) (failed int, first error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var mu sync.Mutex
	fail := func(err error) {
		mu.Lock()
		failed++
		if first == nil {
			first = err
		}
		mu.Unlock()
	}
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
				if err != nil {
					fail(fmt.Errorf("claim: %w", err))
				} else if len(ds) == 1 {
					if err := ds[0].Ack(bg); err != nil {
						fail(err)
						// A lease whose Ack failed on the way is given back
						// rather than left to expire; a settled one refuses.
						_ = ds[0].Release(bg)
					} else {
						acked = true
					}
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
	return failed, first
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
		if err := e.fill(context.WithoutCancel(ctx), db, table, due-sent, payload); err != nil {
			return fmt.Errorf("enqueue: %w", err)
		}
		sent = due
	}
}

// vacuumEvery vacuums a PostgreSQL table every sustainVacuum, counting in the
// window. InnoDB's purge and SQLite's freelist need no one to call them.
func vacuumEvery(ctx context.Context, e engine, db *sql.DB, table string, ws []window, index func() int, mu *sync.Mutex) error {
	if sustainVacuum == 0 || e.family != "postgres" {
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
		if _, err := db.ExecContext(context.WithoutCancel(ctx), "VACUUM (ANALYZE) "+table); err != nil {
			return err
		}
		mu.Lock()
		w := &ws[index()]
		w.vacuums++
		w.vacuumTaken += time.Since(t)
		mu.Unlock()
	}
}

// sampleWindows reads the backlog (by the query backlog) and the dead rows
// at each window's end.
func sampleWindows(ctx context.Context, db *sql.DB, backlog string, dead func(context.Context) (int64, error), ws []window, span time.Duration, start time.Time, mu *sync.Mutex) error {
	for i := range ws {
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(start.Add(span*time.Duration(i+1) - 50*time.Millisecond))):
		}
		bg := context.WithoutCancel(ctx)
		var n int64
		if err := db.QueryRowContext(bg, backlog).Scan(&n); err != nil {
			return err
		}
		d, err := dead(bg)
		if err != nil {
			return err
		}
		mu.Lock()
		ws[i].backlog, ws[i].dead = n, d
		mu.Unlock()
	}
	return nil
}
