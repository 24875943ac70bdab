package main

import (
	"context"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/listen/pgxlisten"
	"github.com/sqlinbox/inbox/worker"
)

// config names the notification channel: Enqueue sends on it, and the
// listener listens on it.
var config = inbox.Config{
	Dialect:       inbox.Postgres,
	Table:         inbox.Table{Name: "listen_jobs", LockedUntil: "locked_until", DeadTable: "listen_jobs_dead"},
	NotifyChannel: "listen_jobs_ready",
}

// workers is the number of worker loops of the process.
const workers = 8

// serve runs the worker loops and one listener until ctx ends or one of
// them fails, which stops the others.
func serve(ctx context.Context, q *inbox.Queue, dsn string, handle worker.Handler) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, workers+1)
	go func() {
		errs <- worker.Listen(ctx, q, pgxlisten.Listener{ConnString: dsn})
	}()
	for range workers {
		go func() {
			errs <- worker.Run(ctx, q, worker.Config{Poll: time.Minute}, handle)
		}()
	}
	var first error
	for range workers + 1 {
		if err := <-errs; err != nil && first == nil {
			first = err
			cancel()
		}
	}
	return first
}
