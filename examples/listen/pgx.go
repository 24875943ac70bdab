package listen

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sqlinbox/inbox/worker"
)

// PGX is an [worker.Listener] on a pgx connection of its own, opened with
// pgx.ConnectConfig, listening with LISTEN and waiting with
// Conn.WaitForNotification. Only ConnString (or Config) is required; the
// other fields have defaults. A PGX value may serve several Listen calls,
// each with a connection of its own.
type PGX struct {
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

var _ worker.Listener = PGX{}

// Listen calls wake for every notification on channel, and once after each
// connection, until ctx ends; then it closes its connection and returns
// nil. It reconnects whenever its connection is lost. The only error it
// returns is a ConnString that does not parse, at once.
func (l PGX) Listen(ctx context.Context, channel string, wake func()) error {
	cfg := l.Config
	if cfg == nil {
		var err error
		if cfg, err = pgx.ParseConfig(l.ConnString); err != nil {
			return fmt.Errorf("listen: pgx: %w", err)
		}
	}
	tm := timings(l.MinReconnect, l.MaxReconnect, l.HealthCheck)
	wait := tm.min
	for {
		listened, err := l.session(ctx, cfg.Copy(), channel, wake, tm.health)
		if ctx.Err() != nil {
			return nil
		}
		if l.OnError != nil {
			l.OnError(fmt.Errorf("listen: pgx: %w", err))
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
func (l PGX) session(ctx context.Context, cfg *pgx.ConnConfig, channel string, wake func(), health time.Duration) (bool, error) {
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
