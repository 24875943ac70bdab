// Command quickstart is the README's quick start, runnable: a lease queue on
// a SQLite file, two workers, and every settlement (Ack, Retry, Dead, and
// Release at shutdown).
//
//	go run ./examples/quickstart
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sqlinbox/inbox"
	_ "modernc.org/sqlite"
)

// schema is the reference schema, a dead table and the recommended index:
// the README's SQLite lease schema.
var schema = []string{
	`CREATE TABLE IF NOT EXISTS report_jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    attempt INTEGER NOT NULL DEFAULT 1,
    locked_until TEXT,
    payload BLOB NOT NULL
)`,
	`CREATE TABLE IF NOT EXISTS report_jobs_dead (
    id INTEGER PRIMARY KEY,
    attempt INTEGER NOT NULL,
    payload BLOB NOT NULL
)`,
	`CREATE INDEX IF NOT EXISTS report_jobs_claimable ON report_jobs (locked_until, id)`,
}

// reportTable describes report_jobs: naming the lease column selects the
// lease form.
var reportTable = inbox.Table{
	Name:        "report_jobs",
	LockedUntil: "locked_until",
	DeadTable:   "report_jobs_dead",
}

const (
	maxAttempts  = 3
	retryDelay   = 100 * time.Millisecond // times the attempt; short for the demo
	pollInterval = 100 * time.Millisecond // an idle worker's fallback; the examples share it
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

// run enqueues three reports, one of which never renders, and works until
// every report is settled, with the package's worker loop.
func run(ctx context.Context, w io.Writer) error { return runWith(ctx, w, serve) }

// runWith is run with the given worker: serve, or work, a loop of your own.
func runWith(ctx context.Context, w io.Writer, worker func(context.Context, *inbox.Queue, *log.Logger) error) error {
	dir, err := os.MkdirTemp("", "inbox-quickstart-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	dsn := "file:" + filepath.Join(dir, "reports.db") + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)"

	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	for _, s := range schema {
		if _, err := db.ExecContext(ctx, s); err != nil {
			return err
		}
	}
	q, err := inbox.New(db, inbox.Config{
		Dialect: inbox.SQLite,
		Table:   reportTable,
		Lease:   30 * time.Second,
	})
	if err != nil {
		return err
	}
	if err := q.CheckSchema(ctx); err != nil {
		return err // a *inbox.SchemaError lists every problem found
	}

	for _, name := range []string{"Q1 sales", "Q2 sales", "broken"} {
		id, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte(name)}})
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "enqueued report %v (%s)\n", id, name)
	}

	l := log.New(w, "", 0)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- worker(wctx, q, l)
		}()
	}
	// Stop the workers once the queue is empty.
	err = waitEmpty(ctx, db)
	stop()
	wg.Wait()
	close(errs)
	for werr := range errs {
		err = errors.Join(err, werr)
	}
	if err != nil {
		return err
	}
	var dead, attempt int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*), COALESCE(MAX(attempt), 0) FROM report_jobs_dead").Scan(&dead, &attempt); err != nil {
		return err
	}
	fmt.Fprintf(w, "queue empty; %d report in report_jobs_dead, after attempt %d\n", dead, attempt)
	return nil
}

// waitEmpty returns once report_jobs is empty.
func waitEmpty(ctx context.Context, db *sql.DB) error {
	for {
		var n int
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM report_jobs").Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// render stands for the real work.
func render(ctx context.Context, payload []byte) error {
	if string(payload) == "broken" {
		return errors.New("the data source is down")
	}
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-time.After(50 * time.Millisecond):
		return nil
	}
}
