// Command report is the reference guide's example in Go: reports that render
// for longer than their lease, on an embedded SQLite file.
//
// It starts a worker process that claims a report and is killed mid-report,
// as a crash would kill it: no deferred call runs, nothing is settled. Three
// workers of this process render the other reports while their keepers
// ([inbox.Delivery.Keep]) extend the leases; the dead worker's report stays
// out of the queue until its lease runs out, then comes back with attempt 2
// and is rendered and acked.
//
//	go run ./examples/report [-db reports.db] [-lease 1s] [-render 2.5s]
//
// The SQLite driver is modernc.org/sqlite: pure Go, so `go run` needs no C
// compiler on a fresh machine (mattn/go-sqlite3 needs cgo).
package main

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sqlinbox/inbox"
	_ "modernc.org/sqlite"
)

// schema is the reference guide's table, exactly.
const schema = `CREATE TABLE IF NOT EXISTS report_jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    attempt INTEGER NOT NULL DEFAULT 1,
    locked_until TEXT,
    payload BLOB NOT NULL
)`

// reports are the jobs enqueued, in id order: the first one goes to the
// worker process that dies.
var reports = []string{"Q1 sales", "Q2 sales", "Q3 sales"}

// options are the example's flags.
type options struct {
	db      string        // the SQLite file; empty: a new one in a temporary directory
	lease   time.Duration // the queue's lease
	render  time.Duration // how long each report renders
	workers int           // workers in this process
}

func defaultOptions() options {
	return options{lease: time.Second, render: 2500 * time.Millisecond, workers: 3}
}

// The worker process learns its part from these variables, so that a test
// binary re-executed the same way plays it too.
const (
	envChild  = "INBOX_REPORT_CHILD" // the database file
	envStart  = "INBOX_REPORT_START" // the parent's start, Unix nanoseconds
	envLease  = "INBOX_REPORT_LEASE"
	envRender = "INBOX_REPORT_RENDER"
)

// midReport is the line the worker process prints, not shown, once it is
// rendering: the parent kills it when it reads it.
const midReport = "!mid-report"

func main() {
	if os.Getenv(envChild) != "" {
		os.Exit(child())
	}
	o := defaultOptions()
	flag.StringVar(&o.db, "db", "", "SQLite file (default: a new file in a temporary directory, removed after); report_jobs must be empty")
	flag.DurationVar(&o.lease, "lease", o.lease, "lease: how long a crashed worker's report stays out of the queue")
	flag.DurationVar(&o.render, "render", o.render, "how long each report renders (longer than the lease)")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, os.Stdout, o); err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(1)
	}
}

// open opens the SQLite file. WAL lets readers pass the writer; the busy
// timeout makes the processes' writes wait for each other rather than fail.
func open(path string) (*sql.DB, error) {
	return sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)")
}

// newQueue describes report_jobs: naming the lease column selects the lease
// form.
func newQueue(db *sql.DB, lease time.Duration) (*inbox.Queue, error) {
	return inbox.New(db, inbox.Config{
		Dialect: inbox.SQLite,
		Table:   inbox.Table{Name: "report_jobs", LockedUntil: "locked_until"},
		Lease:   lease,
	})
}

// logger prints timestamped lines, relative to the parent's start, from
// every goroutine and from the worker process.
type logger struct {
	mu    sync.Mutex
	w     io.Writer
	start time.Time
}

func (l *logger) rel(t time.Time) string {
	return fmt.Sprintf("+%.2fs", t.Sub(l.start).Seconds())
}

func (l *logger) printf(who, format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.w, "%-7s %-12s %s\n", l.rel(time.Now()), who, fmt.Sprintf(format, args...))
}

// line writes a line the worker process printed, as it is.
func (l *logger) line(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintln(l.w, s)
}

// run is the example: it returns an error when any report was not acked
// exactly once, or the crashed report did not come back as it should.
func run(ctx context.Context, w io.Writer, o options) error {
	log := &logger{w: w, start: time.Now()}
	if o.db == "" {
		dir, err := os.MkdirTemp("", "inbox-report-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		o.db = filepath.Join(dir, "reports.db")
	}
	db, err := open(o.db)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, schema); err != nil {
		return err
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM report_jobs").Scan(&n); err != nil {
		return err
	}
	if n != 0 {
		return fmt.Errorf("report_jobs in %s holds %d rows: give the example an empty table", o.db, n)
	}
	q, err := newQueue(db, o.lease)
	if err != nil {
		return err
	}
	if err := q.CheckSchema(ctx); err != nil {
		return err
	}
	log.printf("main", "report_jobs in %s: lease %v, each report renders %v", o.db, o.lease, o.render)
	var ids []int64
	for _, name := range reports {
		id, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte(name)}})
		if err != nil {
			return err
		}
		ids = append(ids, id.(int64))
		log.printf("main", "enqueued report %d (%s)", id, name)
	}

	crashed, expiry, err := crash(ctx, log, db, o)
	if err != nil {
		return err
	}

	wk := &workers{q: q, log: log, o: o, crashed: crashed, crashExpiry: expiry,
		acked: map[int64]int{}, total: len(ids)}
	if err := wk.run(ctx); err != nil {
		return err
	}

	for _, id := range ids {
		if wk.acked[id] != 1 {
			return fmt.Errorf("report %d acked %d times, want once", id, wk.acked[id])
		}
	}
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM report_jobs").Scan(&n); err != nil {
		return err
	}
	if n != 0 {
		return fmt.Errorf("%d rows left in report_jobs", n)
	}
	if !wk.sawReturn {
		return fmt.Errorf("report %d never came back with attempt 2", crashed)
	}
	log.printf("main", "%d reports acked once each, report %d on its second attempt; report_jobs is empty", len(ids), crashed)
	return nil
}

// crash starts a worker process, waits until it is rendering a report and
// kills it. It returns the report's id and its lease's expiry as stored.
func crash(ctx context.Context, log *logger, db *sql.DB, o options) (int64, time.Time, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, time.Time{}, err
	}
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(),
		envChild+"="+o.db,
		envStart+"="+strconv.FormatInt(log.start.UnixNano(), 10),
		envLease+"="+o.lease.String(),
		envRender+"="+o.render.String())
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, time.Time{}, err
	}
	if err := cmd.Start(); err != nil {
		return 0, time.Time{}, err
	}
	log.printf("main", "started worker process pid %d", cmd.Process.Pid)
	var id int64
	sc := bufio.NewScanner(out)
	for id == 0 && sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, midReport+" "); ok {
			id, err = strconv.ParseInt(rest, 10, 64)
			if err != nil {
				cmd.Process.Kill()
				cmd.Wait()
				return 0, time.Time{}, fmt.Errorf("worker process said %q", line)
			}
			continue
		}
		log.line(line)
	}
	if id == 0 {
		err := cmd.Wait()
		return 0, time.Time{}, fmt.Errorf("worker process ended before rendering: %v", err)
	}
	// SIGKILL on Unix: the process gets no chance to settle or to stop its
	// keeper, exactly as when it crashes or its machine dies.
	if err := cmd.Process.Kill(); err != nil {
		return 0, time.Time{}, err
	}
	werr := cmd.Wait()
	log.printf("main", "CRASH: killed pid %d mid-report (%v); nobody extends report %d's lease any more", cmd.Process.Pid, werr, id)

	var attempt int
	var raw string
	err = db.QueryRowContext(ctx, "SELECT attempt, locked_until FROM report_jobs WHERE id = ?", id).Scan(&attempt, &raw)
	if err != nil {
		return 0, time.Time{}, err
	}
	expiry, err := time.Parse(inbox.SQLiteTimeFormat, raw)
	if err != nil {
		return 0, time.Time{}, err
	}
	log.printf("main", "report %d in the table: attempt=%d (the crash spent attempt 1), locked_until=%s (%s): no claim takes it before then",
		id, attempt, raw, log.rel(expiry))
	return id, expiry, nil
}

// child is the worker process: it claims one report, keeps its lease and
// renders until it is killed.
func child() int {
	start, err := strconv.ParseInt(os.Getenv(envStart), 10, 64)
	lease, err2 := time.ParseDuration(os.Getenv(envLease))
	render, err3 := time.ParseDuration(os.Getenv(envRender))
	if err := errors.Join(err, err2, err3); err != nil {
		fmt.Fprintln(os.Stderr, "worker process:", err)
		return 2
	}
	log := &logger{w: os.Stdout, start: time.Unix(0, start)}
	who := fmt.Sprintf("pid %d", os.Getpid())
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "worker process:", err)
		return 1
	}
	db, err := open(os.Getenv(envChild))
	if err != nil {
		return fail(err)
	}
	q, err := newQueue(db, lease)
	if err != nil {
		return fail(err)
	}
	ctx := context.Background()
	ds, err := q.Claim(ctx, 1)
	if err != nil {
		return fail(err)
	}
	if len(ds) == 0 {
		return fail(errors.New("nothing to claim"))
	}
	d := ds[0]
	var payload []byte
	if err := d.Scan(&payload); err != nil {
		return fail(err)
	}
	log.printf(who, "claimed report %v (%s), attempt %d, lease until %s", d.ID(), payload, d.Attempt(), log.rel(d.Expiry()))
	hctx, stop := d.Keep(ctx)
	defer stop()
	step := render / 10
	steps := 0
	for {
		select {
		case <-hctx.Done():
			return fail(context.Cause(hctx))
		case <-time.After(step):
		}
		steps++
		log.printf(who, "report %v: rendered %d%%", d.ID(), steps*10)
		if steps == 1 {
			fmt.Printf("%s %v\n", midReport, d.ID())
		}
	}
}

// workers render the reports in this process.
type workers struct {
	q           *inbox.Queue
	log         *logger
	o           options
	crashed     int64     // the report the dead worker held
	crashExpiry time.Time // when its lease runs out

	mu        sync.Mutex
	acked     map[int64]int
	total     int
	waitShown bool
	sawReturn bool // the crashed report was claimed again, with attempt 2, after its lease ran out
}

// run runs the workers until every report is acked.
func (wk *workers) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, wk.o.workers)
	for i := 1; i <= wk.o.workers; i++ {
		go func(who string) { errs <- wk.loop(ctx, cancel, who) }(fmt.Sprintf("worker %d", i))
	}
	var first error
	for i := 0; i < wk.o.workers; i++ {
		if err := <-errs; err != nil && first == nil {
			first = err
			cancel()
		}
	}
	return first
}

// pollInterval is how long an idle worker waits before it claims again; the
// examples share it.
const pollInterval = 100 * time.Millisecond

// loop is one worker: claim a report, render it under a keeper, ack it;
// when nothing is claimable, look again a little later.
func (wk *workers) loop(ctx context.Context, done context.CancelFunc, who string) error {
	for {
		ds, err := wk.q.Claim(ctx, 1)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		if len(ds) == 0 {
			wk.mu.Lock()
			if !wk.waitShown && time.Now().Before(wk.crashExpiry) {
				wk.waitShown = true
				wk.log.printf(who, "nothing to claim: report %d stays out until its lease runs out at %s", wk.crashed, wk.log.rel(wk.crashExpiry))
			}
			wk.mu.Unlock()
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(pollInterval):
			}
			continue
		}
		if err := wk.handle(ctx, who, ds[0]); err != nil {
			return err
		}
		wk.mu.Lock()
		all := len(wk.acked) == wk.total
		wk.mu.Unlock()
		if all {
			done()
		}
	}
}

// handle renders one report and acks it.
func (wk *workers) handle(ctx context.Context, who string, d *inbox.Delivery) error {
	log := wk.log
	var payload []byte
	if err := d.Scan(&payload); err != nil {
		return err
	}
	id := d.ID().(int64)
	claimed := time.Now()
	note := ""
	if d.Attempt() > 1 {
		note = ": rendering again after a lost attempt"
		if id == wk.crashed && d.Attempt() == 2 {
			note += fmt.Sprintf(" (its lease ran out at %s)", log.rel(wk.crashExpiry))
			if claimed.Before(wk.crashExpiry) {
				return fmt.Errorf("report %d came back at %s, before its lease ran out at %s", id, log.rel(claimed), log.rel(wk.crashExpiry))
			}
			wk.mu.Lock()
			wk.sawReturn = true
			wk.mu.Unlock()
		}
	}
	log.printf(who, "claimed report %d (%s), attempt %d, lease until %s%s", id, payload, d.Attempt(), log.rel(d.Expiry()), note)

	hctx, stop := d.Keep(ctx)
	defer stop()
	extensions, err := wk.render(hctx, who, d)
	if errors.Is(context.Cause(hctx), inbox.ErrLeaseLost) {
		// Another worker may hold the report by now: settling is not ours.
		log.printf(who, "report %d: lease lost, rendering abandoned; the report comes back when the lease runs out", id)
		return nil
	}
	if err != nil {
		return err
	}
	if err := d.Ack(ctx); err != nil {
		return err
	}
	wk.mu.Lock()
	wk.acked[id]++
	wk.mu.Unlock()
	log.printf(who, "report %d rendered in %.1fs on a %v lease (%d extensions), acked", id, time.Since(claimed).Seconds(), wk.o.lease, extensions)
	return nil
}

// render stands for the report's real work: it takes o.render, and shows
// each extension of the lease the keeper makes meanwhile.
func (wk *workers) render(ctx context.Context, who string, d *inbox.Delivery) (int, error) {
	step := wk.o.render / 10
	seen := d.Expiry()
	extensions := 0
	for i := 1; i <= 10; i++ {
		select {
		case <-ctx.Done():
			return extensions, context.Cause(ctx)
		case <-time.After(step):
		}
		if e := d.Expiry(); !e.Equal(seen) {
			seen = e
			extensions++
			wk.log.printf(who, "report %v: rendered %d%%, keeper extended the lease to %s", d.ID(), i*10, wk.log.rel(e))
		}
	}
	return extensions, nil
}
