// Command hello is the README's quick start, whole: a job queue in a SQLite
// file, a few jobs enqueued, and eight workers of package worker handling
// them until the queue is empty.
//
//	go run ./examples/hello
package main

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sync/atomic"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/worker"
	_ "modernc.org/sqlite"
)

// schema is the queue table and its dead table, where a job that failed
// its last attempt goes.
var schema = []string{
	`CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    attempt INTEGER NOT NULL DEFAULT 1,
    locked_until TEXT,
    payload BLOB NOT NULL
)`,
	`CREATE TABLE IF NOT EXISTS jobs_dead (
    id INTEGER PRIMARY KEY,
    attempt INTEGER NOT NULL,
    payload BLOB NOT NULL
)`,
}

func main() {
	dir, err := os.MkdirTemp("", "hello-inbox-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := run(context.Background(), filepath.Join(dir, "jobs.db")); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, path string) error {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		return err
	}
	defer db.Close()
	for _, s := range schema {
		if _, err := db.ExecContext(ctx, s); err != nil {
			return err
		}
	}
	// Naming the lease column selects the lease form, SQLite's.
	q, err := inbox.New(db, inbox.Config{
		Dialect: inbox.SQLite,
		Table:   inbox.Table{Name: "jobs", LockedUntil: "locked_until", DeadTable: "jobs_dead"},
	})
	if err != nil {
		return err
	}
	for _, name := range []string{"Ada", "Grace", "Edsger"} {
		if _, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte(name)}}); err != nil {
			return err
		}
	}

	ctx, stop := context.WithCancel(ctx)
	defer stop()
	var handled atomic.Int32
	// Eight loops claim, run the handler and settle by its result: nil
	// acks, an error retries after a backoff, and after the last attempt
	// moves the job to jobs_dead. An idle loop waits for the next Enqueue.
	// Run returns when ctx ends.
	return worker.Run(ctx, q, worker.Config{Workers: 8}, func(ctx context.Context, d *inbox.Delivery) error {
		var name []byte
		if err := d.Scan(&name); err != nil {
			return err
		}
		fmt.Printf("hello, %s (job %v)\n", name, d.ID())
		if handled.Add(1) == 3 {
			stop() // every job is handled
		}
		return nil
	})
}
