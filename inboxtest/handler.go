package inboxtest

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/worker"
)

// HandlerOptions configures [RunHandler]. Its zero value is a job of the
// lease form on SQLite under Run's defaults.
type HandlerOptions struct {
	// Queue is the configuration of the queue the job comes from. A zero
	// Dialect means inbox.SQLite; a zero Table means a lease table "jobs"
	// with the dead table "jobs_dead" and the data column "payload".
	Queue inbox.Config
	// Worker is the loop's configuration: MaxAttempts, Backoff, NoDelay,
	// RetryForever, Timeout and Grace decide the job's fate as they do in
	// worker.Run; OnEvent is told the job's start and end.
	Worker worker.Config
	// Context is the loop's context, Background when nil: ending it while
	// the handler runs is a shutdown.
	Context context.Context
}

// Result is what the worker loop did with the job once its handler
// returned.
type Result struct {
	// Outcome is acked, retried, dead, released, snoozed, dropped, or
	// settled when the handler settled the job itself (see Settled).
	Outcome worker.Outcome
	// Delay is the wait before the next attempt (retried, snoozed).
	Delay time.Duration
	// Err is the handler's error as the loop saw it (a timeout's wrapped
	// to match worker.ErrTimeout; a panic's carries its text), nil when it
	// returned nil.
	Err error
	// Settled names the handler's own settlement, for OutcomeSettled:
	// "ack", "retry", "release" or "dead".
	Settled string
	// Attempt is the attempt the job was delivered with.
	Attempt int
	// ID is the job's id as the claim delivered it (Job.ID, 1 when nil).
	ID any
}

// String says what the loop did in the package's terms: "Ack",
// "Retry(after 2s, error \"carrier down\")", "Dead(error \"bad\")",
// "Release", "Snooze(after 1h0m0s)", "Drop(error \"bad\")", "the
// handler's own Retry".
func (r Result) String() string {
	var name string
	var details []string
	switch r.Outcome {
	case worker.OutcomeAcked:
		name = "Ack"
	case worker.OutcomeRetried:
		name = "Retry"
		details = append(details, "after "+delayWords(r.Delay))
	case worker.OutcomeDead:
		name = "Dead"
	case worker.OutcomeReleased:
		name = "Release"
	case worker.OutcomeSnoozed:
		name = "Snooze"
		details = append(details, "after "+delayWords(r.Delay))
	case worker.OutcomeDropped:
		name = "Drop"
	case worker.OutcomeSettled:
		name = "the handler's own settlement"
		if r.Settled != "" {
			name = "the handler's own " + strings.ToUpper(r.Settled[:1]) + r.Settled[1:]
		}
	default:
		name = r.Outcome.String()
	}
	if r.Err != nil && r.Outcome != worker.OutcomeSnoozed {
		details = append(details, errorWords(r.Err.Error()))
	}
	if len(details) > 0 {
		name += "(" + strings.Join(details, ", ") + ")"
	}
	return name
}

// Expect reports whether the loop did with the job what want says, and
// fails t (t.Errorf) otherwise, naming both in the package's terms:
//
//	inboxtest: expected Ack of job 7, got Retry(after 2s, error "carrier down")
//
// It compares the Outcome; the Delay of a retry or a snooze, which
// [AnyDelay] lets be any above zero (what worker.DefaultBackoff, which is
// jittered, gives); Settled, when want names it; and Err, when want has
// one: the same error (errors.Is) or one with the same text.
func (r Result) Expect(t testing.TB, want Result) bool {
	t.Helper()
	ok := r.Outcome == want.Outcome
	if ok && (want.Outcome == worker.OutcomeRetried || want.Outcome == worker.OutcomeSnoozed) {
		if want.Delay == AnyDelay {
			ok = r.Delay > 0
		} else {
			ok = r.Delay == want.Delay
		}
	}
	if ok && want.Settled != "" {
		ok = r.Settled == want.Settled
	}
	if ok && want.Err != nil {
		ok = r.Err != nil && (errors.Is(r.Err, want.Err) || r.Err.Error() == want.Err.Error())
	}
	if !ok {
		t.Errorf("inboxtest: expected %s of job %v, got %s", want, r.ID, r)
	}
	return ok
}

// RunHandler runs handle on one delivery of job, claimed from an in-memory
// stand-in of the database, and settles it as worker.Run would, by the same
// code (worker.Handle): the result says what the loop did. Nothing is
// expected on a sqlmock and nothing needs polling: the handler has returned
// and its job is settled when RunHandler returns.
//
//	r := inboxtest.RunHandler(t, sendMail, inboxtest.Job{Data: []any{[]byte("ada@example.com")}}, inboxtest.HandlerOptions{})
//	if r.Outcome != worker.OutcomeAcked { t.Errorf("mail: %v (%v)", r.Outcome, r.Err) }
//
// A zero Job.ID means 1. The stand-in answers the queue's own statements
// only, sent as text or prepared (Config.Prepare): a handler that writes
// through Delivery.Tx (row lock) needs a sqlmock and [Mock]. RunHandler
// fails the test (t.Fatal) for a configuration the queue or the loop
// refuses and for a job that does not fit it. [Result.Expect] checks the
// result and says, if it differs, what was expected and what the loop did:
//
//	inboxtest.RunHandler(t, sendMail, job, opts).Expect(t, inboxtest.Result{Outcome: worker.OutcomeAcked})
func RunHandler(t testing.TB, handle worker.Handler, job Job, opts HandlerOptions) Result {
	t.Helper()
	cfg := opts.Queue
	if cfg.Dialect == nil {
		cfg.Dialect = inbox.SQLite
	}
	if cfg.Table.Name == "" {
		cfg.Table = inbox.Table{Name: "jobs", LockedUntil: "locked_until", DeadTable: "jobs_dead"}
		if cfg.Lease == 0 {
			cfg.Lease = time.Minute
		}
	}
	if job.ID == nil {
		job.ID = int64(1)
	}
	ctx := opts.Context
	if ctx == nil {
		ctx = context.Background()
	}
	s, err := newStandIn(cfg)
	if err != nil {
		t.Fatalf("inboxtest: run handler: %v", err)
	}
	db := sql.OpenDB(s)
	t.Cleanup(func() { db.Close() })
	q, err := inbox.New(db, cfg)
	if err != nil {
		t.Fatalf("inboxtest: run handler: %v", err)
	}
	s.learn(q)
	d := claimFor(t, s, q, job)
	s.begin(opSettle, nil)
	end, err := worker.Handle(ctx, q, opts.Worker, d, handle)
	calls, _ := s.end()
	if err != nil {
		t.Fatalf("inboxtest: run handler: %v", err)
	}
	r := Result{Outcome: end.Outcome, Delay: end.Delay, Err: end.Err, Attempt: d.Attempt(), ID: d.ID()}
	if end.Kind == 0 {
		// The grace period had ended (a cancelled Context, Grace < 0):
		// the job went back unrun.
		r.Outcome = worker.OutcomeReleased
	}
	if r.Outcome == worker.OutcomeSettled {
		r.Settled = settledBy(calls)
	}
	if end.SettleErr != nil {
		t.Fatalf("inboxtest: run handler: the loop's %s of job %v failed: %v", r, r.ID, end.SettleErr)
	}
	return r
}

// claimFor claims job from the stand-in through q.
func claimFor(t testing.TB, s *standIn, q *inbox.Queue, j Job) *inbox.Delivery {
	t.Helper()
	nj, err := s.normalize(j)
	if err != nil {
		t.Fatalf("inboxtest: run handler: the job: %v", err)
	}
	s.begin(opClaim, []job{nj})
	ds, err := q.Claim(context.Background(), 1)
	s.end()
	if err != nil || len(ds) != 1 {
		t.Fatalf("inboxtest: run handler: the claim of job %v returned %d deliveries: %v", nj.id, len(ds), err)
	}
	return ds[0]
}

// settledBy names the settlement the calls sent: a move to the dead table,
// an ack, a retry, or else a release (under the row lock a rollback alone).
func settledBy(calls []call) string {
	kind := "release"
	for _, c := range calls {
		switch {
		case c.op == "prepare":
			// Config.Prepare: the statement runs next, if at all.
		case c.is("Settle.Dead"):
			// Its DeadDelete may have the Ack's text: the insert tells.
			return "dead"
		case c.is("Settle.Ack"):
			kind = "ack"
		case c.is("Settle.Retry") && kind == "release":
			kind = "retry"
		}
	}
	return kind
}
