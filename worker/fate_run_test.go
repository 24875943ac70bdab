package worker_test

// The handler decides its job's fate (issue 22 item 5), pinned with
// sqlmock's exact matcher on the PostgreSQL lease: a Permanent error goes
// dead at its first attempt, a Snooze retries after its own delay without
// the backoff, a handler that settled its delivery itself leaves the loop
// sending nothing and reporting nothing, and Config.Timeout ends the
// handler's context with worker.ErrTimeout and retries after the backoff.
// fate_test.go checks the rules themselves, inside the package.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/worker"
)

func TestWorkPostgresFates(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable, Lease: time.Minute})
	exp := utc0.Add(time.Minute)
	cols := "id,attempt,locked_until,payload"
	claimRow := func(id int64) {
		m.ExpectQuery(pgLeaseClaim).WithArgs(1, 1, 1, minute).WillReturnRows(rows(cols, row(id, int64(1), exp, []byte("p"))))
	}
	claimRow(1) // Permanent: dead at attempt 1 of 25
	m.ExpectExec(pgLeaseDead).WithArgs(int64(1), int64(2), at(exp), int64(1)).WillReturnResult(affected(1))
	claimRow(2) // Snooze(5m): retried after 5 minutes, not the backoff
	m.ExpectExec(pgLeaseRetry).WithArgs(int64(300_000_000), int64(2), int64(2), at(exp)).WillReturnResult(affected(1))
	claimRow(3) // the handler releases the job itself, then fails
	m.ExpectExec(pgLeaseRelease).WithArgs(int64(3), int64(2), at(exp)).WillReturnResult(affected(1))
	claimRow(4) // the timeout
	m.ExpectExec(pgLeaseRetry).WithArgs(int64(90_000_000), int64(4), int64(2), at(exp)).WillReturnResult(affected(1))
	m.ExpectQuery(pgLeaseClaim).WithArgs(1, 1, 1, minute).WillReturnRows(rows(cols))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		mu       sync.Mutex
		reported []error
		ends     []worker.Event
		cause    error
	)
	cfg := worker.Config{
		Backoff: func(int) time.Duration { return 90 * time.Second },
		Timeout: 20 * time.Millisecond,
		OnError: func(err error) { mu.Lock(); reported = append(reported, err); mu.Unlock() },
		OnEvent: func(e worker.Event) {
			if e.Kind == worker.EventEnd {
				mu.Lock()
				ends = append(ends, e)
				mu.Unlock()
			}
		},
	}
	done := workRun(ctx, q, cfg, func(hctx context.Context, d *inbox.Delivery) error {
		switch d.ID() {
		case int64(1):
			return worker.Permanent(errors.New("no such customer"))
		case int64(2):
			return worker.Snooze(5 * time.Minute)
		case int64(3):
			if err := d.Release(hctx); err != nil {
				t.Errorf("the handler's Release: %v", err)
			}
			return errors.New("given back by the handler")
		}
		m.After("query "+pgLeaseClaim, cancel) // the next claim is the last
		<-hctx.Done()
		cause = context.Cause(hctx)
		return hctx.Err()
	})
	workDone(t, done)
	m.Since(t, 0,
		"query "+pgLeaseClaim, "exec "+pgLeaseDead,
		"query "+pgLeaseClaim, "exec "+pgLeaseRetry,
		"query "+pgLeaseClaim, "exec "+pgLeaseRelease,
		"query "+pgLeaseClaim, "exec "+pgLeaseRetry,
		"query "+pgLeaseClaim)
	m.Met(t)
	if !errors.Is(cause, worker.ErrTimeout) {
		t.Errorf("the handler's context ended with cause %v, want worker.ErrTimeout", cause)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reported) != 0 {
		t.Errorf("OnError got %v, want nothing (the handler's own settlement is not an error)", reported)
	}
	want := []worker.Outcome{worker.OutcomeDead, worker.OutcomeSnoozed, worker.OutcomeSettled, worker.OutcomeRetried}
	if len(ends) != len(want) {
		t.Fatalf("%d ends, want %d: %+v", len(ends), len(want), ends)
	}
	for i, e := range ends {
		if e.Outcome != want[i] || e.SettleErr != nil {
			t.Errorf("job %v ended %v (settle error %v), want %v", e.ID, e.Outcome, e.SettleErr, want[i])
		}
	}
	if ends[1].Delay != 5*time.Minute {
		t.Errorf("snooze delay %v, want 5m", ends[1].Delay)
	}
	if !errors.Is(ends[0].Err, worker.ErrNoRetry) || ends[0].Err.Error() != "no such customer" {
		t.Errorf("the permanent error reads %q (matches ErrNoRetry: %v)", ends[0].Err, errors.Is(ends[0].Err, worker.ErrNoRetry))
	}
	if !errors.Is(ends[3].Err, worker.ErrTimeout) || !errors.Is(ends[3].Err, context.DeadlineExceeded) {
		t.Errorf("the timed-out run's error %q, want one matching worker.ErrTimeout and the handler's", ends[3].Err)
	}
}

// A Permanent error on a table without a dead table (Config.RetryForever)
// deletes the job, its one Ack, rather than retry it: OutcomeDropped.
func TestWorkPostgresPermanentDropped(t *testing.T) {
	m := newMock(t)
	tb := leaseTable
	tb.DeadTable = ""
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: tb, Lease: time.Minute})
	exp := utc0.Add(time.Minute)
	cols := "id,attempt,locked_until,payload"
	m.ExpectQuery(pgLeaseClaim).WithArgs(1, 1, 1, minute).WillReturnRows(rows(cols, row(int64(1), int64(1), exp, []byte("p"))))
	m.ExpectExec(pgLeaseAck).WithArgs(int64(1), int64(2), at(exp)).WillReturnResult(affected(1))
	m.ExpectQuery(pgLeaseClaim).WithArgs(1, 1, 1, minute).WillReturnRows(rows(cols))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var end worker.Event
	cfg := worker.Config{RetryForever: true, OnEvent: func(e worker.Event) {
		if e.Kind == worker.EventEnd {
			end = e
		}
	}}
	done := workRun(ctx, q, cfg, func(context.Context, *inbox.Delivery) error {
		m.After("query "+pgLeaseClaim, cancel)
		return fmt.Errorf("order 1: %w", worker.Permanent(errors.New("no such customer")))
	})
	workDone(t, done)
	m.Since(t, 0, "query "+pgLeaseClaim, "exec "+pgLeaseAck, "query "+pgLeaseClaim)
	m.Met(t)
	if end.Outcome != worker.OutcomeDropped || !errors.Is(end.Err, worker.ErrNoRetry) {
		t.Errorf("end %v with %v, want dropped with an error matching ErrNoRetry", end.Outcome, end.Err)
	}
}
