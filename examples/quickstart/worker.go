package main

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/sqlinbox/inbox"
)

// work claims and handles one job at a time until ctx ends. The package never
// polls: when nothing is claimable, the worker looks again a little later.
func work(ctx context.Context, q *inbox.Queue, l *log.Logger) error {
	for {
		ds, err := q.Claim(ctx, 1)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		if len(ds) == 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		d := ds[0]
		outcome, err := handle(ctx, d)
		if err != nil {
			return err
		}
		l.Printf("report %v, attempt %d: %s", d.ID(), d.Attempt(), outcome)
	}
}

// handle renders one report while a keeper extends its lease, then settles
// it, and says how.
func handle(ctx context.Context, d *inbox.Delivery) (string, error) {
	var payload []byte
	if err := d.Scan(&payload); err != nil {
		return "", err
	}
	// The keeper extends the lease every half lease while render runs, and
	// cancels hctx with cause inbox.ErrLeaseLost if the job is lost.
	hctx, stop := d.Keep(ctx)
	defer stop()
	err := render(hctx, payload)

	// Settle even when ctx was cancelled by a shutdown.
	sctx := context.WithoutCancel(ctx)
	switch {
	case errors.Is(context.Cause(hctx), inbox.ErrLeaseLost):
		return "lease lost: another worker has it", nil
	case err == nil:
		return "acked", d.Ack(sctx)
	case ctx.Err() != nil:
		// Shutting down: give the job back without spending its attempt.
		return "released", d.Release(sctx)
	case d.Attempt() >= maxAttempts:
		return "dead: " + err.Error(), d.Dead(sctx)
	default:
		return "retry: " + err.Error(), d.Retry(sctx, retryDelay*time.Duration(d.Attempt()))
	}
}
