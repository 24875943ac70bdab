package main

import (
	"context"
	"errors"
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

// serve runs eight worker loops and one listener until ctx ends or either
// fails, which stops the other.
func serve(ctx context.Context, q *inbox.Queue, dsn string, handle worker.Handler) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	listened := make(chan error, 1)
	go func() {
		err := worker.Listen(ctx, q, pgxlisten.Listener{ConnString: dsn})
		cancel()
		listened <- err
	}()
	err := worker.Run(ctx, q, worker.Config{Workers: 8, Poll: time.Minute}, handle)
	cancel()
	return errors.Join(err, <-listened)
}
