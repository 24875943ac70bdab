// Package listen relays PostgreSQL notifications to the idle [worker.Run]
// loops of a process: [PGX] (github.com/jackc/pgx/v5) and [PQ]
// (github.com/lib/pq) satisfy [worker.Listener], each on a connection of its
// own that listens on the queue's notification channel. Enqueue sends the
// notification in its own statement when [inbox.Config.NotifyChannel] is
// set, so it arrives when the job commits. Run one listener per process:
//
//	q, err := inbox.New(db, inbox.Config{Dialect: inbox.Postgres, Table: table, NotifyChannel: "jobs_ready"})
//	...
//	g, ctx := errgroup.WithContext(ctx)
//	g.Go(func() error { return worker.Listen(ctx, q, listen.PGX{ConnString: dsn}) })
//	for range 8 {
//		g.Go(func() error { return worker.Run(ctx, q, worker.Config{}, handle) })
//	}
//	err = g.Wait()
//
// A listener reconnects when its connection is lost (a server restart, a
// network cut, pg_terminate_backend), after MinReconnect, doubled after each
// failed attempt up to MaxReconnect. Notifications sent while it was away
// are lost, so it wakes the loops after every connection, the first
// included: a lost connection costs the loops one claim, never a job left
// waiting. A connection that stays silent for HealthCheck is pinged, so that
// one that died without a word (a half-open TCP connection) is found.
//
// The listener holds a session for as long as it runs: through PgBouncer it
// needs session pooling, as LISTEN does not work in transaction pooling.
//
// The package belongs to the examples module because it imports the
// drivers; inbox itself imports the standard library only. Copy it, or
// import it as github.com/sqlinbox/inbox/examples/listen.
package listen

import (
	"context"
	"time"
)

// Defaults of the listeners' durations, for fields left zero.
const (
	DefaultMinReconnect = 100 * time.Millisecond
	DefaultMaxReconnect = 10 * time.Second
	DefaultHealthCheck  = 30 * time.Second
)

// timing is a listener's durations with the defaults filled in.
type timing struct {
	min, max, health time.Duration
}

func timings(minReconnect, maxReconnect, health time.Duration) timing {
	t := timing{min: minReconnect, max: maxReconnect, health: health}
	if t.min <= 0 {
		t.min = DefaultMinReconnect
	}
	if t.max <= 0 {
		t.max = DefaultMaxReconnect
	}
	if t.max < t.min {
		t.max = t.min
	}
	if t.health <= 0 {
		t.health = DefaultHealthCheck
	}
	return t
}

// sleep waits d, reporting false when ctx ends first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
