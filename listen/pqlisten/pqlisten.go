// Package pqlisten wakes the idle [worker.Run] loops of a process when
// PostgreSQL notifies that a job was enqueued, listening through a
// pq.Listener, lib/pq's (github.com/lib/pq) own reconnecting listener on a
// connection of its own. Enqueue sends the notification in its own
// statement when [inbox.Config.NotifyChannel] is set, so it arrives when
// the job commits. Run one listener per process:
//
//	q, err := inbox.New(db, inbox.Config{Dialect: inbox.Postgres, Table: table, NotifyChannel: "jobs_ready"})
//	...
//	go func() { errs <- worker.Listen(ctx, q, pqlisten.Listener{DSN: dsn}) }()
//
// A listener reconnects when its connection is lost (a server restart, a
// network cut, pg_terminate_backend), after MinReconnect, doubled after each
// failed attempt up to MaxReconnect. Notifications sent while it was away
// are lost, so it wakes the loops after every connection, the first
// included: a lost connection costs the loops one claim, never a job left
// waiting. A connection that stays silent for HealthCheck is pinged, so that
// one that died without a word (a half-open TCP connection) is found.
//
// lib/pq's own ping waits for its answer without a deadline, so the
// listener's connections fail a read or write that has waited twice
// HealthCheck: a connection lost without a word otherwise blocks the
// pq.Listener, its reconnection and its Close, for good.
//
// The listener holds a session for as long as it runs: through PgBouncer it
// needs session pooling, as LISTEN does not work in transaction pooling.
//
// The module imports lib/pq and the standard library only. Its Listener
// satisfies [worker.Listener] by its method alone, so the package does not
// import inbox. For pgx, import github.com/sqlinbox/inbox/listen/pgxlisten.
//
// [worker.Run]: https://pkg.go.dev/github.com/sqlinbox/inbox/worker#Run
// [worker.Listener]: https://pkg.go.dev/github.com/sqlinbox/inbox/worker#Listener
// [inbox.Config.NotifyChannel]: https://pkg.go.dev/github.com/sqlinbox/inbox#Config
package pqlisten

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lib/pq"
)

// Defaults of the listener's durations, for fields left zero.
const (
	DefaultMinReconnect = 100 * time.Millisecond
	DefaultMaxReconnect = 10 * time.Second
	DefaultHealthCheck  = 30 * time.Second
)

// Listener listens through a pq.Listener, which holds a connection of its
// own. Only DSN is required; the other fields have defaults. A Listener
// value may serve several Listen calls, each with a connection of its own.
type Listener struct {
	// DSN is the server, as lib/pq takes it (a URL or key=value pairs).
	DSN string
	// MinReconnect is the wait before reconnecting, doubled after each
	// failed attempt up to MaxReconnect (pq.NewListener's two intervals).
	// Zero means [DefaultMinReconnect] and [DefaultMaxReconnect].
	MinReconnect, MaxReconnect time.Duration
	// HealthCheck is how long the connection may stay silent before it is
	// pinged, as lib/pq advises; a connection that then stays silent, twice
	// HealthCheck without a byte from the server, is closed and replaced.
	// Zero means [DefaultHealthCheck].
	HealthCheck time.Duration
	// OnError, when not nil, is called with every error that cost the
	// listener its connection or a connection attempt, from lib/pq's
	// goroutine: it must return quickly.
	OnError func(error)
}

// Listen calls wake for every notification on channel, and once after each
// connection, until ctx ends; then it closes the pq.Listener and returns
// nil once lib/pq's goroutine has ended (at most MaxReconnect later, when it
// was waiting to reconnect). lib/pq reconnects whenever the connection is
// lost. Listen returns an error at once for a DSN that does not parse, and
// when the server refuses LISTEN.
func (l Listener) Listen(ctx context.Context, channel string, wake func()) error {
	if _, err := pq.NewConnector(l.DSN); err != nil {
		return fmt.Errorf("pqlisten: %w", err)
	}
	minWait, maxWait, health := l.timings()
	events := func(ev pq.ListenerEventType, err error) {
		if err != nil && l.OnError != nil {
			l.OnError(fmt.Errorf("pqlisten: %s: %w", ev, err))
		}
	}
	pl := pq.NewDialListener(idleDialer{idle: idleFor(health)}, l.DSN, minWait, maxWait, events)
	var pings sync.WaitGroup
	// Close unblocks a Listen call still waiting for a first connection.
	stop := context.AfterFunc(ctx, func() { _ = pl.Close() })
	defer func() {
		stop()
		_ = pl.Close() // an error means closed already
		for range pl.Notify {
			// Until lib/pq's goroutine closes it: it must not block on a
			// full channel, nor outlive this call.
		}
		pings.Wait()
	}()
	if err := pl.Listen(channel); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("pqlisten: LISTEN %s: %w", channel, err)
	}
	wake() // notifications sent before LISTEN never arrive
	relay(ctx, pl, wake, health, &pings)
	return nil
}

// relay wakes the loops for every notification until ctx ends or lib/pq
// closes its channel, pinging the connection after health of silence.
func relay(ctx context.Context, pl *pq.Listener, wake func(), health time.Duration, pings *sync.WaitGroup) {
	timer := time.NewTimer(health)
	defer timer.Stop()
	var pinging atomic.Bool
	for {
		select {
		case _, ok := <-pl.Notify:
			if !ok {
				return
			}
			// A nil notification follows a reconnection: those sent
			// meanwhile are lost, and the loops look for themselves.
			wake()
		case <-timer.C:
			// Ping from a goroutine, one at a time, as a dead connection
			// may keep it waiting: lib/pq notices the loss and reconnects.
			if pinging.CompareAndSwap(false, true) {
				pings.Add(1)
				go func() {
					defer pings.Done()
					defer pinging.Store(false)
					_ = pl.Ping()
				}()
			}
		case <-ctx.Done():
			return
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(health)
	}
}

// timings returns the listener's durations with the defaults filled in.
func (l Listener) timings() (minWait, maxWait, health time.Duration) {
	minWait, maxWait, health = l.MinReconnect, l.MaxReconnect, l.HealthCheck
	if minWait <= 0 {
		minWait = DefaultMinReconnect
	}
	if maxWait <= 0 {
		maxWait = DefaultMaxReconnect
	}
	if maxWait < minWait {
		maxWait = minWait
	}
	if health <= 0 {
		health = DefaultHealthCheck
	}
	return minWait, maxWait, health
}
