// Command listen is a worker process on PostgreSQL that other processes
// wake: eight worker loops, and one listener of the module
// github.com/sqlinbox/inbox/listen/pgxlisten relaying the notifications
// that Enqueue sends on the queue's channel when a job commits. With
// -enqueue n it is the other process: it enqueues n jobs in one
// transaction, and exits.
//
//	go run ./examples/listen &
//	go run ./examples/listen -enqueue 3
//
// The DSN is INBOX_POSTGRES_DSN. A lib/pq program imports
// github.com/sqlinbox/inbox/listen/pqlisten instead, and passes
// pqlisten.Listener{DSN: dsn}.
package main

import (
	"context"
	"database/sql"
	"flag"
	"log"
	"os"
	"os/signal"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/worker"
)

// schema is the queue table, in the lease form, and its dead table.
var schema = []string{
	`CREATE TABLE IF NOT EXISTS listen_jobs (
    id bigserial PRIMARY KEY,
    attempt integer NOT NULL DEFAULT 1,
    locked_until timestamptz,
    payload bytea NOT NULL
)`,
	`CREATE TABLE IF NOT EXISTS listen_jobs_dead (
    id bigint PRIMARY KEY,
    attempt integer NOT NULL,
    payload bytea NOT NULL
)`,
}

func main() {
	enqueue := flag.Int("enqueue", 0, "enqueue this many jobs in one transaction and exit, instead of working")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	handle := func(ctx context.Context, d *inbox.Delivery) error {
		log.Printf("job %v, attempt %d", d.ID(), d.Attempt())
		return nil
	}
	if err := run(ctx, os.Getenv("INBOX_POSTGRES_DSN"), *enqueue, handle); err != nil {
		log.Fatal(err)
	}
}

// run enqueues n jobs when n > 0, and otherwise works the queue with handle
// until ctx ends.
func run(ctx context.Context, dsn string, n int, handle worker.Handler) error {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	for _, s := range schema {
		if _, err := db.ExecContext(ctx, s); err != nil {
			return err
		}
	}
	q, err := inbox.New(db, config)
	if err != nil {
		return err
	}
	if n > 0 {
		return enqueue(ctx, db, q, n)
	}
	return serve(ctx, q, dsn, handle)
}

// enqueue enqueues n jobs in one transaction: their notifications are sent
// when it commits, and only the listeners relay them to the loops.
func enqueue(ctx context.Context, db *sql.DB, q *inbox.Queue, n int) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // after Commit, a no-op
	for range n {
		if _, err := q.Enqueue(ctx, tx, inbox.Job{Data: []any{[]byte("hello")}}); err != nil {
			return err
		}
	}
	return tx.Commit()
}
