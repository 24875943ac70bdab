package main

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/sqlinbox/inbox"
)

// serve runs the package's worker loop until ctx ends: it claims a report,
// renders it under a keeper, and settles it by render's result. Enqueue
// through the *sql.DB wakes an idle loop at once; pollInterval is the
// fallback for jobs that become due on their own (a retry delay).
func serve(ctx context.Context, q *inbox.Queue, l *log.Logger) error {
	cfg := inbox.WorkConfig{
		Poll:        pollInterval,
		MaxAttempts: maxAttempts,
		Backoff:     func(attempt int) time.Duration { return retryDelay * time.Duration(attempt) },
	}
	return q.Work(ctx, cfg, func(ctx context.Context, d *inbox.Delivery) error {
		var payload []byte
		if err := d.Scan(&payload); err != nil {
			return err
		}
		err := render(ctx, payload) // nil acks; an error retries, or buries the last attempt
		l.Printf("report %v, attempt %d: %s", d.ID(), d.Attempt(), outcome(d, err))
		return err
	})
}

// outcome says what the loop does with a result.
func outcome(d *inbox.Delivery, err error) string {
	switch {
	case err == nil:
		return "acked"
	case d.Attempt() >= maxAttempts:
		return "dead: " + err.Error()
	}
	return "retry: " + err.Error()
}

// work is a loop of your own instead of Queue.Work: it claims and handles one
// job at a time until ctx ends, and when nothing is claimable it looks again
// after pollInterval.
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
			case <-time.After(pollInterval):
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
		d.SetError(err)
		return "dead: " + err.Error(), d.Dead(sctx)
	default:
		d.SetError(err)
		return "retry: " + err.Error(), d.Retry(sctx, retryDelay*time.Duration(d.Attempt()))
	}
}
