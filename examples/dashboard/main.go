// Command dashboard serves the operators' dashboard (package dashboard) and
// the Prometheus metrics (package metrics) of a queue on an embedded SQLite
// file, while workers of this process produce jobs and fail some of them, so
// that the page has something to show: jobs ready, waiting for a retry, in
// work and dead, with their errors.
//
//	go run ./examples/dashboard [-addr 127.0.0.1:8080] [-db jobs.db] [-workers 4] [-every 200ms] [-fail 0.3]
//
// It prints the dashboard's URL; the metrics are at /metrics. The dashboard
// has no authentication of its own: a real service mounts it behind its own.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"math/rand"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/dashboard"
	"github.com/sqlinbox/inbox/metrics"
	"github.com/sqlinbox/inbox/worker"
	_ "modernc.org/sqlite"
)

// Schema is the lease form's table with the optional columns the dashboard
// shows (enqueued_at for the age, last_error, dead_at) and the indexes that
// keep its reads indexed (docs/schema.md).
const Schema = `
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    attempt INTEGER NOT NULL DEFAULT 1,
    locked_until TEXT,
    payload BLOB NOT NULL,
    last_error TEXT,
    enqueued_at TEXT
);
CREATE TABLE IF NOT EXISTS jobs_dead (
    id INTEGER PRIMARY KEY,
    attempt INTEGER NOT NULL,
    payload BLOB NOT NULL,
    last_error TEXT,
    dead_at TEXT
);
CREATE INDEX IF NOT EXISTS jobs_claimable ON jobs (locked_until, id);
CREATE INDEX IF NOT EXISTS jobs_age ON jobs (locked_until, enqueued_at);
CREATE INDEX IF NOT EXISTS jobs_dead_at ON jobs_dead (dead_at, id);
`

// Table describes Schema's tables.
var Table = inbox.Table{Name: "jobs", LockedUntil: "locked_until", DeadTable: "jobs_dead",
	LastError: "last_error", EnqueuedAt: "enqueued_at", DeadAt: "dead_at"}

// OpenSQLite opens (creating) the SQLite file path with Schema.
func OpenSQLite(path string) (*sql.DB, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)")
	if err != nil {
		return nil, err
	}
	if _, err := db.Exec(Schema); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

type options struct {
	addr, db string
	workers  int
	every    time.Duration // between two enqueued jobs
	fail     float64       // the share of attempts that fail
	attempts int           // the attempt whose failure buries a job
}

func main() {
	var o options
	flag.StringVar(&o.addr, "addr", "127.0.0.1:8080", "address to serve the dashboard on")
	flag.StringVar(&o.db, "db", "", "SQLite file (default: a new one in a temporary directory)")
	flag.IntVar(&o.workers, "workers", 4, "worker loops")
	flag.DurationVar(&o.every, "every", 200*time.Millisecond, "time between two jobs enqueued")
	flag.Float64Var(&o.fail, "fail", 0.3, "share of attempts that fail")
	flag.IntVar(&o.attempts, "attempts", 3, "the attempt whose failure moves a job to the dead table")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, o, func(url string) { fmt.Println("dashboard:", url) }); err != nil && !errors.Is(err, context.Canceled) {
		log.Fatal(err)
	}
}

// run serves until ctx ends, telling ready the dashboard's URL once it
// listens.
func run(ctx context.Context, o options, ready func(url string)) error {
	if o.db == "" {
		dir, err := os.MkdirTemp("", "inbox-dashboard")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		o.db = filepath.Join(dir, "jobs.db")
	}
	db, err := OpenSQLite(o.db)
	if err != nil {
		return err
	}
	defer db.Close()
	q, err := inbox.New(db, inbox.Config{Dialect: inbox.SQLite, Table: Table, Lease: 30 * time.Second})
	if err != nil {
		return err
	}
	if err := q.CheckSchema(ctx); err != nil {
		return err
	}
	var counters metrics.Counters
	dash, err := dashboard.New(dashboard.Config{
		Queues:      []dashboard.QueueConfig{{Name: "jobs", Queue: q, Done: counters.Done}},
		SampleEvery: 5 * time.Second,
	})
	if err != nil {
		return err
	}
	prom, err := metrics.Handler(5*time.Second, metrics.Queue{Name: "jobs", Queue: q, Counters: &counters, InWork: q.InWork})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", prom)
	mux.Handle("/", dash)
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	goRun := func(f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, http.ErrServerClosed) {
				errs <- err
				cancel()
			}
		}()
	}
	goRun(func() error { return dash.Run(ctx) }) // the charts' samples
	goRun(func() error { return produce(ctx, q, db, o.every) })
	goRun(func() error { return work(ctx, q, &counters, o) })
	goRun(func() error { return srv.Serve(ln) })
	ready("http://" + ln.Addr().String() + "/")
	<-ctx.Done()
	shut, done := context.WithTimeout(context.Background(), 5*time.Second)
	defer done()
	srv.Shutdown(shut)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return ctx.Err()
	}
}

// produce enqueues a job every interval.
func produce(ctx context.Context, q *inbox.Queue, db *sql.DB, every time.Duration) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		payload := fmt.Sprintf(`{"mail": %d, "to": "user%d@example.com"}`, n, n%97)
		if _, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte(payload)}}); err != nil && ctx.Err() == nil {
			return err
		}
	}
}

// failures are the errors the handler fails with: one carries HTML, which
// the dashboard shows as text.
var failures = []string{
	"smtp: 451 4.7.1 greylisted, try again later",
	"dial tcp 10.0.0.7:25: connect: connection refused",
	`template: mail:3: unexpected "<b>" in operand`,
	"context deadline exceeded",
}

// work runs the worker loops: handlers that take 20–200 ms and fail at the
// rate asked. Their events feed the metrics and the dashboard's throughput,
// and the jobs that die are logged.
func work(ctx context.Context, q *inbox.Queue, c *metrics.Counters, o options) error {
	logEvents := worker.SlogEvents(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	cfg := worker.Config{
		Workers:     o.workers,
		MaxAttempts: o.attempts,
		Backoff:     func(int) time.Duration { return 3 * time.Second },
		OnEvent: func(e worker.Event) {
			c.Observe(e)
			logEvents(e)
		},
	}
	return worker.Run(ctx, q, cfg, func(ctx context.Context, d *inbox.Delivery) error {
		return handle(ctx, o.fail)
	})
}

func handle(ctx context.Context, fail float64) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Duration(20+rand.Intn(180)) * time.Millisecond):
	}
	if rand.Float64() < fail {
		return errors.New(failures[rand.Intn(len(failures))])
	}
	return nil
}
