// Package pgxlisten wakes the idle [worker.Run] loops of a process when
// PostgreSQL notifies that a job was enqueued, listening on a pgx
// (github.com/jackc/pgx/v5) connection of its own. Enqueue sends the
// notification in its own statement when [inbox.Config.NotifyChannel] is
// set, so it arrives when the job commits. Run one listener per process:
//
//	q, err := inbox.New(db, inbox.Config{Dialect: inbox.Postgres, Table: table, NotifyChannel: "jobs_ready"})
//	...
//	go func() { errs <- worker.Listen(ctx, q, pgxlisten.Listener{ConnString: dsn}) }()
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
// The module imports pgx and the standard library only. Its Listener
// satisfies [worker.Listener] by its method alone, so the package does not
// import inbox. For lib/pq, import github.com/sqlinbox/inbox/listen/pqlisten.
//
// [worker.Run]: https://pkg.go.dev/github.com/sqlinbox/inbox/worker#Run
// [worker.Listener]: https://pkg.go.dev/github.com/sqlinbox/inbox/worker#Listener
// [inbox.Config.NotifyChannel]: https://pkg.go.dev/github.com/sqlinbox/inbox#Config
package pgxlisten

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Defaults of the listener's durations, for fields left zero.
const (
	DefaultMinReconnect = 100 * time.Millisecond
	DefaultMaxReconnect = 10 * time.Second
	DefaultHealthCheck  = 30 * time.Second
)

// Listener listens on a pgx connection of its own, opened with
// pgx.ConnectConfig, listening with LISTEN and waiting with
// Conn.WaitForNotification. Only ConnString (or Config) is required; the
// other fields have defaults. A Listener value may serve several Listen
// calls, each with a connection of its own.
type Listener struct {
	// ConnString is the server, in any form pgx.ParseConfig accepts.
	ConnString string
	// Config, when not nil, is used instead of ConnString; each connection
	// gets a copy.
	Config *pgx.ConnConfig
	// MinReconnect is the wait before reconnecting, doubled after each
	// failed attempt up to MaxReconnect. Zero means [DefaultMinReconnect]
	// and [DefaultMaxReconnect].
	MinReconnect, MaxReconnect time.Duration
	// HealthCheck is how long the connection may stay silent before it is
	// pinged. Zero means [DefaultHealthCheck].
	HealthCheck time.Duration
	// OnError, when not nil, is called with every error that cost the
	// listener its connection or a connection attempt, from the goroutine
	// running Listen, before it reconnects.
	OnError func(error)
}

// Listen calls wake for every notification on channel, and once after each
// connection, until ctx ends; then it closes its connection and returns
// nil. It reconnects whenever its connection is lost. The only error it
// returns is a ConnString that does not parse, at once.
func (l Listener) Listen(ctx context.Context, channel string, wake func()) error {
	cfg := l.Config
	if cfg == nil {
		var err error
		if cfg, err = pgx.ParseConfig(l.ConnString); err != nil {
			return fmt.Errorf("pgxlisten: %w", err)
		}
	}
	tm := timings(l.MinReconnect, l.MaxReconnect, l.HealthCheck)
	wait := tm.min
	for {
		listened, err := session(ctx, cfg.Copy(), channel, wake, tm.health)
		if ctx.Err() != nil {
			return nil
		}
		if l.OnError != nil {
			l.OnError(fmt.Errorf("pgxlisten: %w", err))
		}
		if listened {
			wait = tm.min // a working connection was lost: start over
		}
		if !sleep(ctx, wait) {
			return nil
		}
		wait = min(2*wait, tm.max)
	}
}

// session connects, listens and relays notifications until the connection
// fails or ctx ends. It reports whether LISTEN succeeded.
func session(ctx context.Context, cfg *pgx.ConnConfig, channel string, wake func(), health time.Duration) (bool, error) {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return false, err
	}
	defer func() {
		// Close says goodbye to the server; a dead connection must not
		// hold the return up.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = conn.Close(cctx)
		cancel()
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return false, err
	}
	// Notifications sent before LISTEN (or while a lost connection was
	// down) never arrive: the loops look for themselves.
	wake()
	for {
		// A wait that times out leaves the connection usable (pgx sets a
		// deadline on the socket, which does not close it).
		wctx, cancel := context.WithTimeout(ctx, health)
		_, err := conn.WaitForNotification(wctx)
		silent := err != nil && wctx.Err() != nil
		cancel()
		switch {
		case err == nil:
			wake()
		case ctx.Err() != nil:
			return true, nil
		case silent:
			pctx, cancel := context.WithTimeout(ctx, health)
			err = conn.Ping(pctx)
			cancel()
			if err != nil {
				return true, fmt.Errorf("health check: %w", err)
			}
		default:
			return true, err
		}
	}
}

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
