package worker_test

// The worker loop, Run, pinned with sqlmock's exact matcher (the harness and
// the SQL in sqlmock_test.go): what it sends for each outcome of a handler
// (ack, retry after the backoff, dead past MaxAttempts, a panic), what it
// gives back at shutdown under each form, the claims a wake-up causes, and
// what it does after an error. One loop with a batch of one, so that the
// statements come in one order; the loop is stopped by ending its context
// from a driver hook or from the handler, never by a timer.

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/worker"
)

// workRun runs one Work loop on q until its context ends, and returns a
// channel that receives its result.
func workRun(ctx context.Context, q *inbox.Queue, cfg worker.Config, h worker.Handler) <-chan error {
	done := make(chan error, 1)
	go func() { done <- worker.Run(ctx, q, cfg, h) }()
	return done
}

// workDone waits for the loop's result, failing after a generous deadline.
func workDone(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Work returned %v, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Work did not return 30s after its context ended")
	}
}

// workLog records the handler's deliveries and the backoff's calls.
type workLog struct {
	mu       sync.Mutex
	handled  []string // "id@attempt"
	backoffs []int
}

func (l *workLog) handle(d *inbox.Delivery) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.handled = append(l.handled, fmt.Sprintf("%v@%d", d.ID(), d.Attempt()))
}

func (l *workLog) backoff(n int) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.backoffs = append(l.backoffs, n)
	return 90 * time.Second
}

func (l *workLog) check(t *testing.T, handled string, backoffs ...int) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if got := strings.Join(l.handled, " "); got != handled {
		t.Errorf("handled %q, want %q", got, handled)
	}
	if !slices.Equal(l.backoffs, backoffs) {
		t.Errorf("backoff called for attempts %v, want %v", l.backoffs, backoffs)
	}
}

// A bad configuration is an error before any I/O.
func TestWorkRefuses(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable})
	h := func(context.Context, *inbox.Delivery) error { return nil }
	for _, c := range []struct {
		cfg  worker.Config
		h    worker.Handler
		want string
	}{
		{worker.Config{}, nil, "handler is nil"},
		{worker.Config{Batch: -1}, h, "Config.Batch -1"},
		{worker.Config{Batch: inbox.MaxClaim + 1}, h, "Config.Batch 1001"},
		{worker.Config{Poll: -time.Second}, h, "Config.Poll -1s"},
		{worker.Config{MaxAttempts: -1}, h, "Config.MaxAttempts -1"},
		{worker.Config{Poll: time.Microsecond}, h, "Config.Poll 1µs is under 1ms"},
	} {
		m.Quiet(t, c.want, func() {
			err := worker.Run(context.Background(), q, c.cfg, c.h)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "worker: run: ") {
				t.Errorf("Run(%+v) = %v, want an error naming %q", c.cfg, err, c.want)
			}
		})
	}
}

// DefaultBackoff: a second doubled each attempt, capped at an hour, less up
// to a fifth.
func TestDefaultBackoff(t *testing.T) {
	for n := 1; n <= 15; n++ {
		base := time.Hour
		if n <= 12 {
			base = min(time.Second<<(n-1), time.Hour)
		}
		lo, hi := base, time.Duration(0)
		for i := 0; i < 200; i++ {
			d := worker.DefaultBackoff(n)
			lo, hi = min(lo, d), max(hi, d)
		}
		if lo < base-base/5 || hi > base {
			t.Errorf("DefaultBackoff(%d) in [%v, %v], want within [%v, %v]", n, lo, hi, base-base/5, base)
		}
		if lo == hi {
			t.Errorf("DefaultBackoff(%d) always %v: no jitter", n, lo)
		}
	}
}

// Lease form: nil acks; an error retries after the backoff of the failed
// attempt; an error at MaxAttempts moves the job to the dead table, no
// backoff asked; a panic retries like an error. The loop stops when the claim
// after the last job finds nothing and its context ends.
func TestWorkPostgresLease(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable, Lease: time.Minute})
	exp := utc0.Add(time.Minute)
	cols := "id,attempt,locked_until,payload"
	claimRow := func(id, attempt int64) {
		m.ExpectQuery(pgLeaseClaim).WithArgs(1, 1, 1, minute).WillReturnRows(rows(cols, row(id, attempt, exp, []byte("p"))))
	}
	claimRow(7, 1)
	m.ExpectExec(pgLeaseAck).WithArgs(int64(7), int64(2), at(exp)).WillReturnResult(affected(1))
	claimRow(8, 1)
	m.ExpectExec(pgLeaseRetry).WithArgs(int64(90_000_000), int64(8), int64(2), at(exp)).WillReturnResult(affected(1))
	claimRow(9, 3)
	m.ExpectExec(pgLeaseDead).WithArgs(int64(9), int64(4), at(exp), int64(3)).WillReturnResult(affected(1))
	claimRow(10, 1)
	m.ExpectExec(pgLeaseRetry).WithArgs(int64(90_000_000), int64(10), int64(2), at(exp)).WillReturnResult(affected(1))
	m.ExpectQuery(pgLeaseClaim).WithArgs(1, 1, 1, minute).WillReturnRows(rows(cols))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var log workLog
	done := workRun(ctx, q, worker.Config{MaxAttempts: 3, Backoff: log.backoff}, func(ctx context.Context, d *inbox.Delivery) error {
		log.handle(d)
		switch d.ID() {
		case int64(7):
			return nil
		case int64(10):
			m.After("query "+pgLeaseClaim, cancel) // the next claim is the last
			panic("kaboom")
		}
		return errors.New("failed")
	})
	workDone(t, done)
	m.Since(t, 0,
		"query "+pgLeaseClaim, "exec "+pgLeaseAck,
		"query "+pgLeaseClaim, "exec "+pgLeaseRetry,
		"query "+pgLeaseClaim, "exec "+pgLeaseDead,
		"query "+pgLeaseClaim, "exec "+pgLeaseRetry,
		"query "+pgLeaseClaim)
	m.Met(t)
	log.check(t, "7@1 8@1 9@3 10@1", 1, 1)
}

// Lease form at shutdown: the handler's context lives on, and the job keeps
// its lease and settles by the handler's result: an ack, or a retry after
// the backoff; nothing is released and nothing more claimed.
func TestWorkPostgresLeaseShutdown(t *testing.T) {
	for _, fail := range []bool{false, true} {
		m := newMock(t)
		q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable, Lease: time.Minute})
		exp := utc0.Add(time.Minute)
		m.ExpectQuery(pgLeaseClaim).WithArgs(1, 1, 1, minute).WillReturnRows(rows("id,attempt,locked_until,payload", row(int64(7), int64(1), exp, []byte("p"))))
		settle := "exec " + pgLeaseAck
		if fail {
			settle = "exec " + pgLeaseRetry
			m.ExpectExec(pgLeaseRetry).WithArgs(int64(90_000_000), int64(7), int64(2), at(exp)).WillReturnResult(affected(1))
		} else {
			m.ExpectExec(pgLeaseAck).WithArgs(int64(7), int64(2), at(exp)).WillReturnResult(affected(1))
		}
		ctx, cancel := context.WithCancel(context.Background())
		var log workLog
		var hctxErr error
		done := workRun(ctx, q, worker.Config{Backoff: log.backoff}, func(hctx context.Context, d *inbox.Delivery) error {
			log.handle(d)
			cancel()
			<-ctx.Done()
			hctxErr = hctx.Err()
			if fail {
				return errors.New("failed after the shutdown")
			}
			return nil
		})
		workDone(t, done)
		if hctxErr != nil {
			t.Errorf("fail %v: the handler's context ended with the loop's: %v", fail, hctxErr)
		}
		m.Since(t, 0, "query "+pgLeaseClaim, settle)
		m.Met(t)
		if fail {
			log.check(t, "7@1", 1)
		} else {
			log.check(t, "7@1")
		}
		if q.InWork() != 0 {
			t.Errorf("InWork() = %d", q.InWork())
		}
	}
}

// Lease form past the grace period: the handler's context lives on through
// Config.Grace, the lease still held, then ends with cause
// worker.ErrShutdown; the handler's failure then releases the job (its
// attempt given back) instead of retrying it, and Run returns.
func TestWorkPostgresLeaseGraceEnds(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable, Lease: time.Minute})
	exp := utc0.Add(time.Minute)
	m.ExpectQuery(pgLeaseClaim).WithArgs(1, 1, 1, minute).WillReturnRows(rows("id,attempt,locked_until,payload", row(int64(7), int64(1), exp, []byte("p"))))
	m.ExpectExec(pgLeaseRelease).WithArgs(int64(7), int64(2), at(exp)).WillReturnResult(affected(1))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var atShutdown, cause error
	done := workRun(ctx, q, worker.Config{Grace: 50 * time.Millisecond}, func(hctx context.Context, d *inbox.Delivery) error {
		cancel()
		atShutdown = hctx.Err()
		<-hctx.Done()
		cause = context.Cause(hctx)
		return fmt.Errorf("stopped: %w", hctx.Err())
	})
	workDone(t, done)
	if atShutdown != nil {
		t.Errorf("the handler's context ended (%v) with the loop's, before the grace period", atShutdown)
	}
	if !errors.Is(cause, worker.ErrShutdown) {
		t.Errorf("the handler's context ended with cause %v, want worker.ErrShutdown", cause)
	}
	m.Since(t, 0, "query "+pgLeaseClaim, "exec "+pgLeaseRelease)
	m.Met(t)
}

// Row-lock form: each outcome commits the held transaction; at shutdown the
// handler runs on for Config.Grace, then its context ends with cause
// worker.ErrShutdown and the job is released, its transaction rolled back,
// the attempt not spent.
func TestWorkPostgresRowLock(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: rowLockTable})
	cols := "id,attempt,payload"
	claimRow := func(id, attempt int64) {
		m.ExpectBegin()
		m.ExpectQuery(pgRowLockClaim).WithoutArgs().WillReturnRows(rows(cols, row(id, attempt, []byte("p"))))
	}
	claimRow(7, 1)
	m.ExpectExec(pgRowLockAck).WithArgs(int64(7)).WillReturnResult(affected(1))
	m.ExpectCommit()
	claimRow(8, 1)
	m.ExpectExec(pgRowLockRetry).WithArgs(int64(90_000_000), int64(8)).WillReturnResult(affected(1))
	m.ExpectCommit()
	claimRow(9, 3)
	m.ExpectExec(pgRowLockDead).WithArgs(int64(9), int64(3)).WillReturnResult(affected(1))
	m.ExpectCommit()
	claimRow(10, 1)
	m.ExpectRollback()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var log workLog
	var cause, atShutdown error
	done := workRun(ctx, q, worker.Config{MaxAttempts: 3, Backoff: log.backoff, Grace: 50 * time.Millisecond}, func(hctx context.Context, d *inbox.Delivery) error {
		log.handle(d)
		switch d.ID() {
		case int64(7):
			return nil
		case int64(10):
			cancel() // the shutdown, mid-handler
			atShutdown = hctx.Err()
			<-hctx.Done()
			cause = context.Cause(hctx)
			return hctx.Err()
		}
		return errors.New("failed")
	})
	workDone(t, done)
	if atShutdown != nil {
		t.Errorf("the handler's context ended (%v) with the loop's, before the grace period", atShutdown)
	}
	if !errors.Is(cause, worker.ErrShutdown) {
		t.Errorf("the handler's context ended with cause %v, want worker.ErrShutdown", cause)
	}
	m.Since(t, 0,
		"begin", "query "+pgRowLockClaim, "exec "+pgRowLockAck, "commit",
		"begin", "query "+pgRowLockClaim, "exec "+pgRowLockRetry, "commit",
		"begin", "query "+pgRowLockClaim, "exec "+pgRowLockDead, "commit",
		"begin", "query "+pgRowLockClaim, "rollback")
	m.Met(t)
	log.check(t, "7@1 8@1 9@3 10@1", 1)
	if q.InWork() != 0 {
		t.Errorf("InWork() = %d after the shutdown", q.InWork())
	}
}

// What Run cannot honour it refuses at start, before any I/O, naming the
// fix: a row-lock or advisory table without a not-before column (a failed
// job would run again at once: 3,119 runs in 3 s), a table without a dead
// table (a failing job retried forever), a pool of one connection under the
// row lock (nothing could ever be claimed).
func TestWorkRefusesWhatItCannotHonour(t *testing.T) {
	h := func(context.Context, *inbox.Delivery) error { return nil }
	for _, c := range []struct {
		tb   inbox.Table
		cfg  worker.Config
		want string
	}{
		{inbox.Table{Name: "jobs", DeadTable: "dead_jobs"}, worker.Config{}, "name inbox.Table.NotBefore (or set Config.NoDelay"},
		{inbox.Table{Name: "jobs", AdvisoryKey: "id", DeadTable: "dead_jobs"}, worker.Config{}, "name inbox.Table.NotBefore (or set Config.NoDelay"},
		{inbox.Table{Name: "jobs", LockedUntil: "locked_until"}, worker.Config{}, "name inbox.Table.DeadTable (or set Config.RetryForever)"},
		{inbox.Table{Name: "jobs", NotBefore: "not_before"}, worker.Config{}, "name inbox.Table.DeadTable (or set Config.RetryForever)"},
	} {
		m := newMock(t)
		q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: c.tb})
		m.Quiet(t, c.want, func() {
			err := worker.Run(context.Background(), q, c.cfg, h)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "worker: run: table jobs") {
				t.Errorf("Run(%+v) = %v, want an error naming %q", c.tb, err, c.want)
			}
		})
	}
	m := newMock(t)
	m.DB.SetMaxOpenConns(1)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: rowLockTable})
	done := make(chan error, 1)
	go func() { done <- worker.Run(context.Background(), q, worker.Config{}, h) }()
	select {
	case err := <-done:
		if !errors.Is(err, inbox.ErrPoolTooSmall) {
			t.Errorf("Run on a pool of one = %v, want ErrPoolTooSmall", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run on a pool of one under the row lock did not return: it cannot claim anything")
	}
}

// Row-lock form without a not-before column, with Config.NoDelay: a failed
// job cannot be delayed, so the retry counts the attempt alone.
func TestWorkPostgresRowLockNoDelay(t *testing.T) {
	const claimSQL = `SELECT "id", "attempt", "payload" FROM "jobs" ORDER BY "id" LIMIT 1 FOR UPDATE SKIP LOCKED`
	const retrySQL = `UPDATE "jobs" SET "attempt" = "attempt" + 1 WHERE "id" = $1`
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "jobs", DeadTable: "dead_jobs"}})
	m.ExpectBegin()
	m.ExpectQuery(claimSQL).WithoutArgs().WillReturnRows(rows("id,attempt,payload", row(int64(8), int64(1), []byte("p"))))
	m.ExpectExec(retrySQL).WithArgs(int64(8)).WillReturnResult(affected(1))
	m.ExpectCommit()
	m.ExpectBegin()
	m.ExpectQuery(claimSQL).WithoutArgs().WillReturnRows(rows("id,attempt,payload"))
	m.ExpectRollback()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var log workLog
	done := workRun(ctx, q, worker.Config{Backoff: log.backoff, NoDelay: true}, func(_ context.Context, d *inbox.Delivery) error {
		log.handle(d)
		m.After("query "+claimSQL, cancel)
		return errors.New("failed")
	})
	workDone(t, done)
	m.Since(t, 0, "begin", "query "+claimSQL, "exec "+retrySQL, "commit", "begin", "query "+claimSQL, "rollback")
	m.Met(t)
	log.check(t, "8@1", 1)
}

// Advisory form: each outcome runs on the pinned connection, then unlocks;
// at shutdown without a grace period (Config.Grace < 0) the handler's
// context ends at once with cause worker.ErrShutdown, and the job is
// released (its attempt given back) and unlocked.
func TestWorkPostgresAdvisory(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: advisoryTable})
	cols := "id,attempt,payload"
	pgIdent(m, `"jobs"`)
	claimRow := func(id, attempt int64) {
		// Candidates for a batch of one: twice one, no key held, and 8.
		m.ExpectQuery(pgAdvLockFirst).WithArgs(10, "public.jobs", 10, 10).WillReturnRows(rows("id,k,a,locked", row(id, id, attempt, true)))
		m.ExpectQuery(pgAdvClaim).WithArgs(id, attempt).WillReturnRows(rows(cols, row(id, attempt, []byte("p"))))
	}
	claimRow(1, 1)
	m.ExpectExec(pgAdvAck).WithArgs(int64(1), int64(2)).WillReturnResult(affected(1))
	pgUnlocked(m, "1")
	claimRow(2, 1)
	m.ExpectExec(pgAdvRetry).WithArgs(int64(90_000_000), int64(2), int64(2)).WillReturnResult(affected(1))
	pgUnlocked(m, "2")
	claimRow(3, 3)
	m.ExpectExec(pgAdvDead).WithArgs(int64(3), int64(4), int64(3)).WillReturnResult(affected(1))
	pgUnlocked(m, "3")
	claimRow(4, 1)
	m.ExpectExec(pgAdvRelease).WithArgs(int64(4), int64(2)).WillReturnResult(affected(1))
	pgUnlocked(m, "4")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var log workLog
	var cause error
	done := workRun(ctx, q, worker.Config{MaxAttempts: 3, Backoff: log.backoff, Grace: -1}, func(hctx context.Context, d *inbox.Delivery) error {
		log.handle(d)
		switch d.ID() {
		case int64(1):
			return nil
		case int64(4):
			cancel()
			<-hctx.Done()
			cause = context.Cause(hctx)
			return hctx.Err()
		}
		return errors.New("failed")
	})
	workDone(t, done)
	if !errors.Is(cause, worker.ErrShutdown) {
		t.Errorf("the handler's context ended with cause %v, want worker.ErrShutdown", cause)
	}
	claim := []string{"query " + pgAdvLockFirst, "query " + pgAdvClaim}
	var want []string
	want = append(want, "query "+pgIdentity)
	for _, settle := range []string{pgAdvAck, pgAdvRetry, pgAdvDead, pgAdvRelease} {
		want = append(append(want, claim...), "exec "+settle, "query "+pgUnlock)
	}
	m.Since(t, 0, want...)
	m.Met(t)
	log.check(t, "1@1 2@1 3@3 4@1", 1)
	if q.InWork() != 0 {
		t.Errorf("InWork() = %d after the shutdown", q.InWork())
	}
}

// A batch: the jobs of one claim are handled side by side and each settled
// by its own handler's result, through batched statements (which group
// settlements arriving together; the handlers here finish one after the
// other's settlement, so each goes alone); a full batch is claimed again at
// once.
func TestWorkBatch(t *testing.T) {
	var (
		batchAck   = `DELETE FROM "jobs" WHERE ` + pgBatchWhere(1) + ` RETURNING "id"`
		batchRetry = `UPDATE "jobs" SET "locked_until" = (statement_timestamp() + $1 * interval '1 microsecond') WHERE ` + pgBatchWhere(2) + ` RETURNING "id"`
		exps       = `{"2024-03-01 12:01:00.123456+00"}`
	)
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable, Lease: time.Minute})
	exp := utc0.Add(time.Minute)
	cols := "id,attempt,locked_until,payload"
	m.ExpectQuery(pgClaimUpTo(4)).WithArgs(3, 3, 3, minute).WillReturnRows(rows(cols,
		row(int64(1), int64(1), exp, []byte("p")), row(int64(2), int64(1), exp, []byte("p")), row(int64(3), int64(1), exp, []byte("p"))))
	m.ExpectQuery(batchAck).WithArgs(pgBatchArgs("{1}", "{2}", exps)...).WillReturnRows(rows("id", row(int64(1))))
	m.ExpectQuery(batchRetry).WithArgs(append([]driver.Value{int64(90_000_000)}, pgBatchArgs("{2}", "{2}", exps)...)...).WillReturnRows(rows("id", row(int64(2))))
	m.ExpectQuery(batchAck).WithArgs(pgBatchArgs("{3}", "{2}", exps)...).WillReturnRows(rows("id", row(int64(3))))
	// The batch was full: the loop claims again before it idles. That claim
	// ends the test.
	m.ExpectQuery(pgClaimUpTo(4)).WithArgs(3, 3, 3, minute).WillReturnRows(rows(cols))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var log workLog
	all := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { wg.Wait(); close(all) }()
	// Job 1 finishes first; job 2 once job 1 is acknowledged, job 3 once
	// job 2's retry is written.
	turn := map[int64]chan struct{}{1: make(chan struct{}), 2: make(chan struct{}), 3: make(chan struct{})}
	close(turn[1])
	m.After("query "+batchAck, func() {
		close(turn[2])
		m.After("query "+batchRetry, func() { close(turn[3]) })
	})
	done := workRun(ctx, q, worker.Config{Batch: 3, Backoff: log.backoff}, func(_ context.Context, d *inbox.Delivery) error {
		log.handle(d)
		if d.ID() == int64(1) {
			m.After("query "+pgClaimUpTo(4), cancel) // the first claim was answered
		}
		wg.Done()
		<-all // all three handlers run at once
		<-turn[d.ID().(int64)]
		if d.ID() == int64(2) {
			return errors.New("failed")
		}
		return nil
	})
	workDone(t, done)
	m.Met(t)
	want := []string{"query " + pgClaimUpTo(4), "query " + batchAck, "query " + batchRetry, "query " + batchAck, "query " + pgClaimUpTo(4)}
	if got := m.Log(0); !slices.Equal(got, want) {
		t.Errorf("calls:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	log.mu.Lock()
	slices.Sort(log.handled)
	log.mu.Unlock()
	log.check(t, "1@1 2@1 3@1", 1)
}

// Wake-ups: an idle loop (fallback interval an hour) claims again when a
// job is enqueued through the *sql.DB, when Wake follows a transaction's
// commit, and when a Listener relays a notification; Enqueue with a
// notification channel notifies in the insert itself.
func TestWorkWakes(t *testing.T) {
	const (
		insert       = `INSERT INTO "jobs" ("payload") VALUES ($1) RETURNING "id"`
		insertNotify = `WITH j AS (INSERT INTO "jobs" ("payload") VALUES ($1) RETURNING "id") SELECT j."id" FROM j CROSS JOIN pg_notify('jobs_ready', '') AS n`
	)
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable, Lease: time.Minute, NotifyChannel: "jobs_ready"})
	plain := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable, Lease: time.Minute})
	exp := utc0.Add(time.Minute)
	cols := "id,attempt,locked_until,payload"
	p := []byte("p")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// idle expects a claim that finds nothing and returns a channel closed
	// once it has been answered: from then on the loop is idle, or sees any
	// wake-up that follows.
	idle := func() (<-chan struct{}, func()) {
		m.ExpectQuery(pgLeaseClaim).WithArgs(1, 1, 1, minute).WillReturnRows(rows(cols))
		ch := make(chan struct{})
		return ch, func() { close(ch) }
	}
	wait := func(ch <-chan struct{}) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(30 * time.Second):
			t.Fatal("the loop did not claim within 30s")
		}
	}
	// The handler reports each job and installs the hook the test hands
	// it for the claim that follows.
	type turn struct {
		id   any
		next chan func()
	}
	handled := make(chan turn)
	job := func(id int64) {
		m.ExpectQuery(pgLeaseClaim).WithArgs(1, 1, 1, minute).WillReturnRows(rows(cols, row(id, int64(1), exp, p)))
		m.ExpectExec(pgLeaseAck).WithArgs(id, int64(2), at(exp)).WillReturnResult(affected(1))
	}
	// handle waits for job want and has the next claim run then.
	handle := func(want int64, then func()) {
		t.Helper()
		select {
		case tr := <-handled:
			if tr.id != want {
				t.Fatalf("handled %v, want %d", tr.id, want)
			}
			tr.next <- then
		case <-time.After(30 * time.Second):
			t.Fatalf("job %d not handled within 30s of its wake-up", want)
		}
	}

	first, answered := idle()
	m.After("query "+pgLeaseClaim, answered)
	done := workRun(ctx, q, worker.Config{Poll: time.Hour}, func(_ context.Context, d *inbox.Delivery) error {
		next := make(chan func())
		handled <- turn{d.ID(), next}
		m.After("query "+pgLeaseClaim, <-next)
		return nil
	})
	wait(first)

	// Through the *sql.DB, by a queue without the channel: a plain insert.
	m.ExpectQuery(insert).WithArgs(p).WillReturnRows(rows("id", row(int64(1))))
	job(1)
	next, answered := idle()
	_, err := plain.Enqueue(ctx, m.DB, inbox.Job{Data: []any{p}})
	ok(t, "Enqueue", err)
	handle(1, answered)
	wait(next)

	// In a transaction, with the channel: the notification goes with the
	// insert; the loops of this process wake when Wake follows the commit.
	m.ExpectBegin()
	m.ExpectQuery(insertNotify).WithArgs(p).WillReturnRows(rows("id", row(int64(2))))
	m.ExpectCommit()
	tx, err := m.DB.Begin()
	ok(t, "Begin", err)
	_, err = q.Enqueue(ctx, tx, inbox.Job{Data: []any{p}})
	ok(t, "Enqueue", err)
	ok(t, "Commit", tx.Commit())
	job(2)
	next, answered = idle()
	q.Wake()
	handle(2, answered)
	wait(next)

	// A listener's notification, as from another process.
	l := &fakeListener{ready: make(chan func())}
	lctx, lcancel := context.WithCancel(ctx)
	listened := make(chan error, 1)
	go func() { listened <- worker.Listen(lctx, q, l) }()
	var wake func()
	select {
	case wake = <-l.ready:
	case <-time.After(30 * time.Second):
		t.Fatal("Listen did not start the listener")
	}
	if l.channel != "jobs_ready" {
		t.Errorf("listener got channel %q, want jobs_ready", l.channel)
	}
	job(3)
	m.ExpectQuery(pgLeaseClaim).WithArgs(1, 1, 1, minute).WillReturnRows(rows(cols))
	wake()
	handle(3, cancel)
	lcancel()
	if err := <-listened; err != nil {
		t.Errorf("Listen returned %v", err)
	}
	workDone(t, done)
	m.Since(t, 0,
		"query "+pgLeaseClaim,
		"query "+insert, "query "+pgLeaseClaim, "exec "+pgLeaseAck, "query "+pgLeaseClaim,
		"begin", "query "+insertNotify, "commit", "query "+pgLeaseClaim, "exec "+pgLeaseAck, "query "+pgLeaseClaim,
		"query "+pgLeaseClaim, "exec "+pgLeaseAck, "query "+pgLeaseClaim)
	m.Met(t)

	// Listen needs the channel; MySQL and SQLite have no notifications.
	if err := worker.Listen(ctx, plain, l); err == nil || !strings.Contains(err.Error(), "NotifyChannel") {
		t.Errorf("Listen without a channel: %v", err)
	}
	for _, d := range []inbox.Dialect{inbox.MySQL, inbox.SQLite} {
		if _, err := inbox.New(m.DB, inbox.Config{Dialect: d, Table: leaseTable, NotifyChannel: "jobs_ready"}); err == nil {
			t.Errorf("%s accepted a notification channel", d.Name())
		}
	}
	if _, err := inbox.New(m.DB, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable, NotifyChannel: "jobs'); DROP TABLE jobs; --"}); err == nil {
		t.Error("a channel that is not an identifier was accepted")
	}
}

// fakeListener hands the test its wake function and waits for ctx.
type fakeListener struct {
	channel string
	ready   chan func()
}

func (l *fakeListener) Listen(ctx context.Context, channel string, wake func()) error {
	l.channel = channel
	l.ready <- wake
	<-ctx.Done()
	return nil
}

// The loop records the handler's error, or a panic's text, for Retry and
// Dead to write into Table.LastError. The statements are pinned in the
// engine files' tests; this pins the text the loop passes.
func TestWorkRecordsErrors(t *testing.T) {
	m := newMock(t)
	tb := leaseTable
	tb.LastError = "last_error"
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: tb, Lease: time.Minute})
	st := q.Statements()
	exp := utc0.Add(time.Minute)
	cols := "id,attempt,locked_until,payload,last_error"
	args := func(s dialect.Stmt, text string) []driver.Value {
		out := make([]driver.Value, len(s.Args))
		for i, a := range s.Args {
			out[i] = sqlmock.AnyArg()
			if a == dialect.ArgError {
				out[i] = text
			}
		}
		return out
	}
	m.ExpectQuery(st.Claim.For(1).SQL).WillReturnRows(rows(cols, row(int64(7), int64(1), exp, []byte("p"), nil)))
	m.ExpectExec(st.Settle.Retry.SQL).WithArgs(args(st.Settle.Retry, "inbox: handler panicked: kaboom")...).WillReturnResult(affected(1))
	m.ExpectQuery(st.Claim.For(1).SQL).WillReturnRows(rows(cols, row(int64(7), int64(2), exp, []byte("p"), "inbox: handler panicked: kaboom")))
	m.ExpectExec(st.Settle.Dead.SQL).WithArgs(args(st.Settle.Dead, "still failing")...).WillReturnResult(affected(1))
	m.ExpectQuery(st.Claim.For(1).SQL).WillReturnRows(rows(cols))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var seen []string
	done := workRun(ctx, q, worker.Config{MaxAttempts: 2}, func(_ context.Context, d *inbox.Delivery) error {
		seen = append(seen, d.LastError())
		if d.Attempt() == 1 {
			panic("kaboom")
		}
		m.After("query "+st.Claim.For(1).SQL, cancel)
		return errors.New("still failing")
	})
	workDone(t, done)
	m.Met(t)
	if want := []string{"", "inbox: handler panicked: kaboom"}; !slices.Equal(seen, want) {
		t.Errorf("delivered with last errors %q, want %q", seen, want)
	}
}

// A claim answered after the loop's context ended is given back at once and
// none of its handlers runs: a lease batch in one statement, its attempts
// not spent.
func TestWorkGivesBackLateClaim(t *testing.T) {
	batchRelease := `UPDATE "jobs" SET "locked_until" = NULL, "attempt" = "attempt" - 1 WHERE ` + pgBatchWhere(1) + ` RETURNING "id"`
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable, Lease: time.Minute})
	exp := utc0.Add(time.Minute)
	m.ExpectQuery(pgClaimUpTo(4)).WithArgs(3, 3, 3, minute).WillReturnRows(rows("id,attempt,locked_until,payload",
		row(int64(1), int64(1), exp, []byte("p")), row(int64(2), int64(1), exp, []byte("p")), row(int64(3), int64(1), exp, []byte("p"))))
	m.ExpectQuery(batchRelease).WithArgs(pgBatchArgs("{1,2,3}", "{2,2,2}",
		`{"2024-03-01 12:01:00.123456+00","2024-03-01 12:01:00.123456+00","2024-03-01 12:01:00.123456+00"}`)...).
		WillReturnRows(rows("id", row(int64(1)), row(int64(2)), row(int64(3))))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The loop's context ends while the claim is on its way back.
	m.After("query "+pgClaimUpTo(4), cancel)
	var log workLog
	done := workRun(ctx, q, worker.Config{Batch: 3}, func(_ context.Context, d *inbox.Delivery) error {
		log.handle(d)
		return nil
	})
	workDone(t, done)
	m.Met(t)
	log.check(t, "")
	if q.InWork() != 0 {
		t.Errorf("InWork() = %d after the jobs were given back", q.InWork())
	}
}

// An idle loop whose claim is a transaction (MySQL's lease) asks the probe,
// one statement, when its fallback interval runs out, and claims only once
// the probe finds a row; a probe that fails is reported and waited out
// like one that found nothing, after a schema check that could not run.
func TestWorkProbes(t *testing.T) {
	const probe = "SELECT 1 FROM `jobs` WHERE `locked_until` IS NULL OR `locked_until` <= UTC_TIMESTAMP(6) LIMIT 1"
	const cols = "id,attempt,payload,UTC_TIMESTAMP(6)"
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: leaseTable, Lease: time.Minute})
	m.ExpectBegin()
	m.ExpectQuery(myLeaseFirstClock).WithArgs(1).WillReturnRows(rows(cols))
	m.ExpectQuery(myLeaseDueClock).WithArgs(1).WillReturnRows(rows(cols))
	m.ExpectQuery(myLeaseFreeClock).WithArgs(1).WillReturnRows(rows(cols))
	m.ExpectCommit()
	m.ExpectQuery(probe).WithoutArgs().WillReturnRows(rows("1"))
	m.ExpectQuery(probe).WithoutArgs().WillReturnError(errors.New("server gone"))
	// The failure has the loop check the schema, which fails too: the
	// server is away, which may heal, and the loop goes on.
	m.ExpectQuery(myProbe).WithoutArgs().WillReturnError(errors.New("server gone"))
	m.ExpectQuery(pgProbe).WithoutArgs().WillReturnError(errors.New("server gone"))
	m.ExpectQuery(sqliteProbe).WithoutArgs().WillReturnError(errors.New("server gone"))
	m.ExpectQuery(probe).WithoutArgs().WillReturnRows(rows("1", row(int64(1))))
	m.ExpectBegin()
	m.ExpectQuery(myLeaseFirstClock).WithArgs(1).WillReturnRows(rows(cols, row(int64(7), int64(1), []byte("p7"), []byte("2024-03-01 12:00:00.123456"))))
	m.ExpectExec(myLeaseMarkOne).WithArgs("2024-03-01 12:01:00.123456", int64(7), int64(1), "2024-03-01 12:00:00.123456").WillReturnResult(affected(1))
	m.ExpectCommit()
	m.ExpectExec(myLeaseAck).WithArgs(int64(7), int64(2), "2024-03-01 12:01:00.123456").WillReturnResult(affected(1))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var log workLog
	var mu sync.Mutex
	var reported []string
	cfg := worker.Config{Poll: time.Millisecond, OnError: func(err error) {
		mu.Lock()
		defer mu.Unlock()
		reported = append(reported, err.Error())
	}}
	done := workRun(ctx, q, cfg, func(_ context.Context, d *inbox.Delivery) error {
		log.handle(d)
		m.After("exec "+myLeaseAck, cancel)
		return nil
	})
	workDone(t, done)
	m.Since(t, 0,
		"begin", "query "+myLeaseFirstClock, "query "+myLeaseDueClock, "query "+myLeaseFreeClock, "commit",
		"query "+probe, "query "+probe, "query "+myProbe, "query "+pgProbe, "query "+sqliteProbe, "query "+probe,
		"begin", "query "+myLeaseFirstClock, "exec "+myLeaseMarkOne, "commit",
		"exec "+myLeaseAck)
	m.Met(t)
	log.check(t, "7@1")
	mu.Lock()
	defer mu.Unlock()
	if len(reported) != 1 || !strings.HasPrefix(reported[0], "inbox: probe: ") || !strings.Contains(reported[0], "server gone") {
		t.Errorf("OnError got %q, want the failed probe alone", reported)
	}
}

// What the loop meets and does not return goes to Config.OnError: here a
// claim the driver fails, which may heal. The loop then checks the schema
// (which cannot run either) and claims again after a backoff, until its
// context ends.
func TestWorkOnError(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable})
	errDown := errors.New("connection refused")
	m.ExpectQuery(pgLeaseClaim).WillReturnError(errDown)
	// The failure has the loop check the schema, which fails too: the
	// server may come back, so the loop claims again.
	m.ExpectQuery(pgProbe).WillReturnError(errDown)
	m.ExpectQuery(myProbe).WillReturnError(errDown)
	m.ExpectQuery(sqliteProbe).WillReturnError(errDown)
	m.ExpectQuery(pgLeaseClaim).WillReturnError(errDown)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var seen []error
	cfg := worker.Config{Poll: time.Millisecond, OnError: func(err error) {
		seen = append(seen, err)
		if len(seen) == 2 {
			cancel()
		}
	}}
	if err := worker.Run(ctx, q, cfg, func(context.Context, *inbox.Delivery) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 2 || !errors.Is(seen[0], errDown) || !errors.Is(seen[1], errDown) {
		t.Fatalf("OnError saw %v, want the driver's error twice", seen)
	}
	m.Met(t)
}
