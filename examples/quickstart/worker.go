package main

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/worker"
)

// serve runs the package's worker loop until ctx ends: it claims a report,
// renders it under a keeper, and settles it by render's result. Enqueue
// through the *sql.DB wakes an idle loop at once; pollInterval is the
// fallback for jobs that become due on their own (a retry delay).
func serve(ctx context.Context, q *inbox.Queue, l *log.Logger) error {
	cfg := worker.Config{
		Poll:        pollInterval,
		MaxAttempts: maxAttempts,
		Backoff:     func(attempt int) time.Duration { return retryDelay * time.Duration(attempt) },
	}
	return worker.Run(ctx, q, cfg, func(ctx context.Context, d *inbox.Delivery) error {
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

// work is a loop of your own instead of worker.Run: it claims and handles one
// job at a time until ctx ends. When nothing is claimable it waits for a
// wake-up (an Enqueue through the *sql.DB in this process) or pollInterval;
// after the interval alone it asks the probe, one statement, before it
// claims again.
func work(ctx context.Context, q *inbox.Queue, l *log.Logger) error {
	probe := false // the last wait ended with the interval alone
	for ctx.Err() == nil {
		// Read before the claim: an Enqueue during the claim still ends
		// the wait that follows it.
		woken := q.NextWake()
		if probe {
			found, err := q.Probe(ctx)
			if err != nil && ctx.Err() == nil {
				return err
			}
			if !found {
				probe = idle(ctx, woken)
				continue
			}
		}
		ds, err := q.Claim(ctx, 1)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		if len(ds) == 0 {
			probe = idle(ctx, woken)
			continue
		}
		probe = false
		d := ds[0]
		outcome, err := handle(ctx, d)
		if err != nil {
			return err
		}
		l.Printf("report %v, attempt %d: %s", d.ID(), d.Attempt(), outcome)
	}
	return nil
}

// idle waits for a wake-up, pollInterval or ctx's end, and reports whether
// the interval ended the wait.
func idle(ctx context.Context, woken <-chan struct{}) bool {
	select {
	case <-ctx.Done():
	case <-woken:
	case <-time.After(pollInterval):
		return true
	}
	return false
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
