package listen

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lib/pq"

	"github.com/sqlinbox/inbox/worker"
)

// PQ is an [worker.Listener] on a pq.Listener, lib/pq's own reconnecting
// listener, which holds a connection of its own. Only DSN is required; the
// other fields have defaults. A PQ value may serve several Listen calls,
// each with a connection of its own.
type PQ struct {
	// DSN is the server, as lib/pq takes it (a URL or key=value pairs).
	DSN string
	// MinReconnect is the wait before reconnecting, doubled after each
	// failed attempt up to MaxReconnect (pq.NewListener's two intervals).
	// Zero means [DefaultMinReconnect] and [DefaultMaxReconnect].
	MinReconnect, MaxReconnect time.Duration
	// HealthCheck is how long the connection may stay silent before it is
	// pinged, as lib/pq advises. Zero means [DefaultHealthCheck].
	HealthCheck time.Duration
	// OnError, when not nil, is called with every error that cost the
	// listener its connection or a connection attempt, from lib/pq's
	// goroutine: it must return quickly.
	OnError func(error)
}

var _ worker.Listener = PQ{}

// Listen calls wake for every notification on channel, and once after each
// connection, until ctx ends; then it closes the pq.Listener and returns
// nil once lib/pq's goroutine has ended (at most MaxReconnect later, when it
// was waiting to reconnect). lib/pq reconnects whenever the connection is
// lost. Listen returns an error at once for a DSN that does not parse, and
// when the server refuses LISTEN.
func (l PQ) Listen(ctx context.Context, channel string, wake func()) error {
	if _, err := pq.NewConnector(l.DSN); err != nil {
		return fmt.Errorf("listen: pq: %w", err)
	}
	tm := timings(l.MinReconnect, l.MaxReconnect, l.HealthCheck)
	events := func(ev pq.ListenerEventType, err error) {
		if err != nil && l.OnError != nil {
			l.OnError(fmt.Errorf("listen: pq: %s: %w", ev, err))
		}
	}
	pl := pq.NewListener(l.DSN, tm.min, tm.max, events)
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
		return fmt.Errorf("listen: pq: LISTEN %s: %w", channel, err)
	}
	wake() // notifications sent before LISTEN never arrive
	health := time.NewTimer(tm.health)
	defer health.Stop()
	var pinging atomic.Bool
	for {
		select {
		case _, ok := <-pl.Notify:
			if !ok {
				return nil
			}
			// A nil notification follows a reconnection: those sent
			// meanwhile are lost, and the loops look for themselves.
			wake()
		case <-health.C:
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
			return nil
		}
		if !health.Stop() {
			select {
			case <-health.C:
			default:
			}
		}
		health.Reset(tm.health)
	}
}
