package inboxtest_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/inboxtest"
	"github.com/sqlinbox/inbox/worker"
)

// RunHandler returns what worker.Run does with a job, for every fate a
// handler can give it, on each form and engine: the handler has returned and
// the job is settled when it returns, with nothing to expect or poll.
func TestRunHandler(t *testing.T) {
	queues := map[string]inbox.Config{
		"sqlite lease": {},
		"postgres lease": {Dialect: inbox.Postgres, Lease: time.Minute,
			Table: inbox.Table{Name: "jobs", LockedUntil: "locked_until", DeadTable: "jobs_dead"}},
		"mariadb lease": {Dialect: inbox.MariaDB, Lease: time.Minute,
			Table: inbox.Table{Name: "jobs", LockedUntil: "locked_until", DeadTable: "jobs_dead"}},
		"postgres rowlock": {Dialect: inbox.Postgres,
			Table: inbox.Table{Name: "jobs", NotBefore: "not_before", DeadTable: "jobs_dead"}},
		"mysql rowlock": {Dialect: inbox.MySQL,
			Table: inbox.Table{Name: "jobs", NotBefore: "not_before", DeadTable: "jobs_dead"}},
		"postgres advisory": {Dialect: inbox.Postgres,
			Table: inbox.Table{Name: "jobs", AdvisoryKey: "id", NotBefore: "not_before", DeadTable: "jobs_dead"}},
		"sqlite advisory": {Dialect: inbox.SQLite,
			Table: inbox.Table{Name: "jobs", AdvisoryKey: "id", NotBefore: "not_before", DeadTable: "jobs_dead"}},
	}
	failed := errors.New("smtp down")
	cases := []struct {
		name    string
		attempt int
		handle  worker.Handler
		want    inboxtest.Result
	}{
		{"nil acks", 1, func(context.Context, *inbox.Delivery) error { return nil },
			inboxtest.Result{Outcome: worker.OutcomeAcked, Attempt: 1}},
		{"an error retries after the backoff", 1, func(context.Context, *inbox.Delivery) error { return failed },
			inboxtest.Result{Outcome: worker.OutcomeRetried, Delay: time.Minute, Err: failed}},
		{"the last attempt goes dead", 3, func(context.Context, *inbox.Delivery) error { return failed },
			inboxtest.Result{Outcome: worker.OutcomeDead, Err: failed}},
		{"permanent goes dead at once", 1, func(context.Context, *inbox.Delivery) error { return worker.Permanent(failed) },
			inboxtest.Result{Outcome: worker.OutcomeDead, Err: failed}},
		{"snooze", 3, func(context.Context, *inbox.Delivery) error { return worker.Snooze(time.Hour) },
			inboxtest.Result{Outcome: worker.OutcomeSnoozed, Delay: time.Hour}},
		{"own release", 1, func(ctx context.Context, d *inbox.Delivery) error { return errors.Join(d.Release(ctx), failed) },
			inboxtest.Result{Outcome: worker.OutcomeSettled, Settled: "release", Err: failed}},
		{"own ack", 1, func(ctx context.Context, d *inbox.Delivery) error { return errors.Join(d.Ack(ctx), failed) },
			inboxtest.Result{Outcome: worker.OutcomeSettled, Settled: "ack", Err: failed}},
		{"own dead", 1, func(ctx context.Context, d *inbox.Delivery) error { return d.Dead(ctx) },
			inboxtest.Result{Outcome: worker.OutcomeSettled, Settled: "dead"}},
		{"own retry", 1, func(ctx context.Context, d *inbox.Delivery) error { return d.Retry(ctx, time.Hour) },
			inboxtest.Result{Outcome: worker.OutcomeSettled, Settled: "retry"}},
	}
	cfg := worker.Config{MaxAttempts: 3, Backoff: func(int) time.Duration { return time.Minute }}
	for qname, qc := range queues {
		for _, c := range cases {
			t.Run(qname+"/"+c.name, func(t *testing.T) {
				got := inboxtest.RunHandler(t, c.handle, inboxtest.Job{ID: 7, Attempt: c.attempt, Data: []any{[]byte("ada")}},
					inboxtest.HandlerOptions{Queue: qc, Worker: cfg})
				if got.Outcome != c.want.Outcome || got.Delay != c.want.Delay || got.Settled != c.want.Settled ||
					(c.want.Err != nil && !errors.Is(got.Err, c.want.Err)) || got.Attempt != c.attempt ||
					(c.want.Err == nil && got.Outcome != worker.OutcomeSnoozed && got.Err != nil) {
					t.Errorf("got %+v, want %+v", got, c.want)
				}
			})
		}
	}
}

// The loop's own causes: a timeout fails the attempt, its error matching
// worker.ErrTimeout; a shutdown past the grace period releases the job; a
// panic retries with its text; a permanent error without a dead table
// drops the job.
func TestRunHandlerCauses(t *testing.T) {
	wait := func(ctx context.Context, d *inbox.Delivery) error {
		<-ctx.Done()
		return ctx.Err()
	}
	r := inboxtest.RunHandler(t, wait, inboxtest.Job{Data: []any{[]byte("x")}},
		inboxtest.HandlerOptions{Worker: worker.Config{Timeout: time.Millisecond, Backoff: func(int) time.Duration { return time.Second }}})
	if r.Outcome != worker.OutcomeRetried || r.Delay != time.Second || !errors.Is(r.Err, worker.ErrTimeout) {
		t.Errorf("timeout: %+v, want retried after 1s with worker.ErrTimeout", r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stop := func(hctx context.Context, d *inbox.Delivery) error {
		cancel()
		return wait(hctx, d)
	}
	r = inboxtest.RunHandler(t, stop, inboxtest.Job{Data: []any{[]byte("x")}},
		inboxtest.HandlerOptions{Context: ctx, Worker: worker.Config{Grace: time.Millisecond}})
	if r.Outcome != worker.OutcomeReleased {
		t.Errorf("shutdown: %+v, want released", r)
	}
	r = inboxtest.RunHandler(t, func(context.Context, *inbox.Delivery) error { panic("kaboom") }, inboxtest.Job{Data: []any{[]byte("x")}},
		inboxtest.HandlerOptions{})
	if r.Outcome != worker.OutcomeRetried || r.Err == nil || !strings.Contains(r.Err.Error(), "kaboom") {
		t.Errorf("panic: %+v, want retried with its text", r)
	}
	r = inboxtest.RunHandler(t, func(context.Context, *inbox.Delivery) error {
		t.Error("the handler ran after the shutdown")
		return nil
	},
		inboxtest.Job{Data: []any{[]byte("x")}}, inboxtest.HandlerOptions{Context: ctx, Worker: worker.Config{Grace: -1}})
	if r.Outcome != worker.OutcomeReleased {
		t.Errorf("a shutdown before the start: %+v, want released unrun", r)
	}
	noDead := inbox.Config{Dialect: inbox.SQLite, Lease: time.Minute, Table: inbox.Table{Name: "jobs", LockedUntil: "locked_until"}}
	r = inboxtest.RunHandler(t, func(context.Context, *inbox.Delivery) error { return worker.Permanent(errors.New("bad")) },
		inboxtest.Job{Data: []any{[]byte("x")}}, inboxtest.HandlerOptions{Queue: noDead, Worker: worker.Config{RetryForever: true}})
	if r.Outcome != worker.OutcomeDropped {
		t.Errorf("permanent without a dead table: %+v, want dropped", r)
	}
}

// sendWelcome is a handler under test: a job whose address is missing can
// never succeed.
func sendWelcome(ctx context.Context, d *inbox.Delivery) error {
	var to []byte
	if err := d.Scan(&to); err != nil {
		return err
	}
	if len(to) == 0 {
		return worker.Permanent(errors.New("no address"))
	}
	return nil
}

func TestSendWelcome(t *testing.T) {
	r := inboxtest.RunHandler(t, sendWelcome, inboxtest.Job{Data: []any{[]byte("")}}, inboxtest.HandlerOptions{})
	if r.Outcome != worker.OutcomeDead {
		t.Errorf("no address: %v (%v), want dead at once", r.Outcome, r.Err)
	}
	r = inboxtest.RunHandler(t, sendWelcome, inboxtest.Job{Data: []any{[]byte("ada@example.com")}}, inboxtest.HandlerOptions{})
	if r.Outcome != worker.OutcomeAcked {
		t.Errorf("an address: %v (%v), want acked", r.Outcome, r.Err)
	}
}
