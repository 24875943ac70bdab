package dbtest

// The worker loop, worker.Run, on every engine and driver: how it settles by
// the handler's result, what it gives back at shutdown under each form, and
// how an idle loop wakes. Every wait is for a signal, or a poll with a
// deadline. A test that must show a job was found by a wake-up and not by
// the fallback poll sets the poll to ten minutes (workXNever) and requires
// the job within workXDeadline: no timing is asserted, only that the job
// was handled while no poll could have fired. Tables are
// conf_work_<what>_<engine>.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/connhook"
	"github.com/sqlinbox/inbox/worker"
)

const (
	workXLoops    = 8                      // loops per test
	workXNever    = 10 * time.Minute       // a fallback interval no test outlasts
	workXDeadline = 30 * time.Second       // how long a test waits for an event
	workXPoll     = 100 * time.Millisecond // the fallback interval of tests that rely on it
)

// workXRun is n Work loops on one queue, started by workXStart.
type workXRun struct {
	cancel   context.CancelFunc
	returned chan error // a value per loop that returned
	n        int

	mu   sync.Mutex
	seen int // loops whose return was received
}

// workXStart runs n loops of worker.Run(q, cfg, h) until stop, which the test's
// cleanup calls too.
func workXStart(t *testing.T, q *inbox.Queue, n int, cfg worker.Config, h worker.Handler) *workXRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &workXRun{cancel: cancel, returned: make(chan error, n), n: n}
	for range n {
		go func() { r.returned <- worker.Run(ctx, q, cfg, h) }()
	}
	t.Cleanup(func() { r.stop(t) })
	return r
}

// wait waits for k more loops to return, each with nil.
func (r *workXRun) wait(t testing.TB, k int) {
	t.Helper()
	deadline := time.NewTimer(workXDeadline)
	defer deadline.Stop()
	for i := 0; i < k; i++ {
		select {
		case err := <-r.returned:
			r.mu.Lock()
			r.seen++
			r.mu.Unlock()
			if err != nil {
				t.Errorf("Work returned %v, want nil", err)
			}
		case <-deadline.C:
			t.Errorf("%d loops still running %v after their context ended", k-i, workXDeadline)
			return
		}
	}
}

// stop ends the loops' context and waits for those still running.
func (r *workXRun) stop(t testing.TB) {
	t.Helper()
	r.cancel()
	r.mu.Lock()
	left := r.n - r.seen
	r.mu.Unlock()
	r.wait(t, left)
}

// workXRecv receives one value from ch, failing after workXDeadline.
func workXRecv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(workXDeadline):
		t.Fatalf("waited %v for %s", workXDeadline, what)
	}
	var zero T
	return zero
}

// workXPayload returns d's payload, from a handler's goroutine.
func workXPayload(t testing.TB, d *inbox.Delivery) string {
	var p []byte
	if err := d.Scan(&p); err != nil {
		t.Errorf("scan job %v: %v", d.ID(), err)
	}
	return string(p)
}

// workXEnqueue enqueues one job through ex and returns its id.
func workXEnqueue(t testing.TB, q *inbox.Queue, ex inbox.Executor, p string) any {
	t.Helper()
	id, err := q.Enqueue(context.Background(), ex, inbox.Job{Data: []any{[]byte(p)}})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// workXEnqueueQuiet enqueues one job in a transaction of its own and
// commits it without Queue.Wake, as another process would: nothing in this
// process learns of it.
func workXEnqueueQuiet(t testing.TB, q *inbox.Queue, db *sql.DB, p string) any {
	t.Helper()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	id := workXEnqueue(t, q, tx, p)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return id
}

// workXDueCol is the column that delays a job under form: the lease, or
// the not-before column.
func workXDueCol(form string) string {
	if form == "lease" {
		return "locked_until"
	}
	return "not_before"
}

// workXTime reads a time column of row id, the zero time for NULL.
func workXTime(t testing.TB, e Engine, db *sql.DB, table, col string, id any) time.Time {
	t.Helper()
	var raw any
	if err := db.QueryRow(bind(e, "SELECT "+col+" FROM "+table+" WHERE id = ?"), id).Scan(&raw); err != nil {
		t.Fatalf("%s of %s %v: %v", col, table, id, err)
	}
	if raw == nil {
		return time.Time{}
	}
	tm, err := e.Dialect.ScanTime(raw)
	if err != nil {
		t.Fatal(err)
	}
	return tm
}

// workXUntil polls f until it returns nil, failing with its last error
// after workXDeadline.
func workXUntil(t testing.TB, what string, f func() error) {
	t.Helper()
	eventually(t, workXDeadline, what, f)
}

// workXLastError adds the column last_error to table and its dead table,
// and names it in tb: Retry and Dead then keep the handler's error there.
func workXLastError(t testing.TB, e Engine, db *sql.DB, table string, tb *inbox.Table) {
	t.Helper()
	for _, name := range []string{table, table + "_dead"} {
		mustExec(t, e, db, "ALTER TABLE "+name+" ADD COLUMN last_error TEXT")
	}
	tb.LastError = "last_error"
}

// workXRecorder records what a handler and a backoff saw.
type workXRecorder struct {
	mu       sync.Mutex
	attempts map[any][]int    // per job id, the attempts delivered
	errors   map[any][]string // per job id, the last error delivered with each
	backoffs []int
}

func newWorkXRecorder() *workXRecorder {
	return &workXRecorder{attempts: map[any][]int{}, errors: map[any][]string{}}
}

func (r *workXRecorder) delivered(d *inbox.Delivery) {
	r.mu.Lock()
	r.attempts[d.ID()] = append(r.attempts[d.ID()], d.Attempt())
	r.errors[d.ID()] = append(r.errors[d.ID()], d.LastError())
	r.mu.Unlock()
}

// checkErrors fails the test unless job id was delivered with these last
// errors, in order.
func (r *workXRecorder) checkErrors(t testing.TB, id any, want ...string) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if got := r.errors[id]; !slices.Equal(got, want) {
		t.Errorf("job %v delivered with last errors %q, want %q", id, got, want)
	}
}

func (r *workXRecorder) backoff(n int) {
	r.mu.Lock()
	r.backoffs = append(r.backoffs, n)
	r.mu.Unlock()
}

func (r *workXRecorder) check(t testing.TB, id any, attempts, backoffs []int) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if got := r.attempts[id]; !slices.Equal(got, attempts) {
		t.Errorf("job %v delivered with attempts %v, want %v", id, got, attempts)
	}
	if backoffs != nil && !slices.Equal(r.backoffs, backoffs) {
		t.Errorf("backoff called for attempts %v, want %v", r.backoffs, backoffs)
	}
}

// TestWorkRetries: a handler error retries the job after worker.Config.Backoff
// of the attempt that failed, the attempt counted and the error kept: the
// row carries the next attempt and the delay (an hour here, checked in the
// row); a delay that runs out is picked up by the fallback poll; each
// attempt is delivered with the error of the one before; the third acks.
func TestWorkRetries(t *testing.T) {
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, workXLoops+2)
		table := newTable(t, e, db, "work_retry_"+form)
		tb := Table(table, form)
		workXLastError(t, e, db, table, &tb)
		q := newQueue(t, db, queueConfig(e, tb, nil))
		rec := newWorkXRecorder()
		id := enqueueOne(t, q, db, "retry")
		failed1, acked := make(chan struct{}, 1), make(chan struct{}, 1)
		cfg := worker.Config{Poll: workXPoll, MaxAttempts: 5, Backoff: func(n int) time.Duration {
			rec.backoff(n)
			if n == 1 {
				return time.Hour
			}
			return 150 * time.Millisecond
		}}
		workXStart(t, q, workXLoops, cfg, func(ctx context.Context, d *inbox.Delivery) error {
			rec.delivered(d)
			switch d.Attempt() {
			case 1:
				failed1 <- struct{}{}
				return errors.New("boom 1")
			case 2:
				return errors.New("boom 2")
			}
			acked <- struct{}{}
			return nil
		})
		workXRecv(t, failed1, "the first attempt")
		// The retry commits the next attempt and the backoff's hour.
		workXUntil(t, "the retry to reach the row", func() error {
			n := attemptOf(t, e, db, table, id)
			due := workXTime(t, e, db, table, workXDueCol(form), id)
			if n != 2 || time.Until(due) < 55*time.Minute || time.Until(due) > 61*time.Minute {
				return fmt.Errorf("attempt %d, %s %v (in %v), want 2 and an hour from now", n, workXDueCol(form), due, time.Until(due))
			}
			return nil
		})
		// Due at once, and the loops told so.
		mustExec(t, e, db, "UPDATE "+table+" SET "+workXDueCol(form)+" = NULL WHERE id = ?", id)
		q.Wake()
		workXRecv(t, acked, "the third attempt")
		workXUntil(t, "the ack", func() error {
			if n := countRows(t, db, table); n != 0 {
				return fmt.Errorf("%d rows left", n)
			}
			return nil
		})
		rec.check(t, id, []int{1, 2, 3}, []int{1, 2})
		rec.checkErrors(t, id, "", "boom 1", "boom 2")
		if n := countRows(t, db, table+"_dead"); n != 0 {
			t.Errorf("%d rows in the dead table", n)
		}
	})
}

// TestWorkPanics: a handler's panic is recovered into a retry, after the
// backoff of its attempt, that keeps the panic's text as the job's last
// error; the loop goes on with the other jobs.
func TestWorkPanics(t *testing.T) {
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, workXLoops+2)
		table := newTable(t, e, db, "work_panic_"+form)
		tb := Table(table, form)
		workXLastError(t, e, db, table, &tb)
		q := newQueue(t, db, queueConfig(e, tb, nil))
		rec := newWorkXRecorder()
		bad := enqueueOne(t, q, db, "bad")
		good := enqueueOne(t, q, db, "good")
		done := make(chan any, 2)
		cfg := worker.Config{Poll: workXNever, Backoff: func(n int) time.Duration { rec.backoff(n); return 0 }}
		r := workXStart(t, q, workXLoops, cfg, func(ctx context.Context, d *inbox.Delivery) error {
			rec.delivered(d)
			if workXPayload(t, d) == "bad" && d.Attempt() == 1 {
				panic("kaboom")
			}
			done <- d.ID()
			return nil
		})
		got := []any{workXRecv(t, done, "a job"), workXRecv(t, done, "the other job")}
		workXUntil(t, "the acks", func() error {
			if n := countRows(t, db, table); n != 0 {
				return fmt.Errorf("%d rows left", n)
			}
			return nil
		})
		r.stop(t)
		if !slices.Contains(got, bad) || !slices.Contains(got, good) {
			t.Errorf("handled %v, want %v and %v", got, bad, good)
		}
		rec.check(t, bad, []int{1, 2}, []int{1})
		rec.checkErrors(t, bad, "", "inbox: handler panicked: kaboom")
		rec.check(t, good, []int{1}, nil)
		idleSoon(t, db, q)
	})
}

// TestWorkDead: a job whose handler fails MaxAttempts times goes to the dead
// table with the attempt it failed at and its error; without a dead table
// (and with Config.RetryForever) it is retried past MaxAttempts.
func TestWorkDead(t *testing.T) {
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, workXLoops+2)
		table := newTable(t, e, db, "work_dead_"+form)
		tb := Table(table, form)
		workXLastError(t, e, db, table, &tb)
		q := newQueue(t, db, queueConfig(e, tb, nil))
		rec := newWorkXRecorder()
		id := enqueueOne(t, q, db, "dead")
		cfg := worker.Config{Poll: workXNever, MaxAttempts: 3, Backoff: func(n int) time.Duration { rec.backoff(n); return 0 }}
		r := workXStart(t, q, workXLoops, cfg, func(ctx context.Context, d *inbox.Delivery) error {
			rec.delivered(d)
			return fmt.Errorf("attempt %d failed", d.Attempt())
		})
		workXUntil(t, "the move to the dead table", func() error {
			if n, m := countRows(t, db, table+"_dead"), countRows(t, db, table); n != 1 || m != 0 {
				return fmt.Errorf("%d dead rows and %d rows left, want 1 and 0", n, m)
			}
			return nil
		})
		r.stop(t)
		var attempt int
		var lastError string
		if err := db.QueryRow(bind(e, "SELECT attempt, last_error FROM "+table+"_dead WHERE id = ?"), id).Scan(&attempt, &lastError); err != nil {
			t.Fatal(err)
		}
		if attempt != 3 || lastError != "attempt 3 failed" {
			t.Errorf("dead row has attempt %d and last error %q, want 3 and %q", attempt, lastError, "attempt 3 failed")
		}
		rec.check(t, id, []int{1, 2, 3}, []int{1, 2})
		rec.checkErrors(t, id, "", "attempt 1 failed", "attempt 2 failed")

		// Without a dead table, and with Config.RetryForever (Run refuses
		// the table without it), MaxAttempts does not stop the retries.
		tb.DeadTable = ""
		q = newQueue(t, db, queueConfig(e, tb, nil))
		rec = newWorkXRecorder()
		id = enqueueOne(t, q, db, "no dead table")
		cfg.MaxAttempts, cfg.RetryForever = 1, true
		acked := make(chan struct{}, 1)
		r = workXStart(t, q, workXLoops, cfg, func(ctx context.Context, d *inbox.Delivery) error {
			rec.delivered(d)
			if d.Attempt() < 3 {
				return errors.New("failed")
			}
			acked <- struct{}{}
			return nil
		})
		workXRecv(t, acked, "the third attempt")
		workXUntil(t, "the ack", func() error {
			if n := countRows(t, db, table); n != 0 {
				return fmt.Errorf("%d rows left", n)
			}
			return nil
		})
		r.stop(t)
		rec.check(t, id, []int{1, 2, 3}, []int{1, 2})
		if n := countRows(t, db, table+"_dead"); n != 1 {
			t.Errorf("%d dead rows, want the first job's alone", n)
		}
		idleSoon(t, db, q)
	})
}

// TestWorkWake: idle loops whose fallback poll cannot fire during the test
// handle a job enqueued through the *sql.DB, through a *sql.Conn, and
// through a *sql.Tx followed by Queue.Wake after the commit. Each time the
// loops are fresh and have all made their first claim (counted by the
// pool's driver), so that only a wake-up can bring the job.
func TestWorkWake(t *testing.T) {
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		db, count := workXOpenCounting(t, e, workXLoops+2)
		table := newTable(t, e, db, "work_wake_"+form)
		q := newQueue(t, db, queueConfig(e, Table(table, form), nil))
		count.watch(q)
		handled := make(chan any, 1)
		h := func(ctx context.Context, d *inbox.Delivery) error { handled <- d.ID(); return nil }
		ctx := context.Background()
		for _, how := range []string{"*sql.DB", "*sql.Conn", "*sql.Tx and Wake"} {
			claims := count.claims()
			r := workXStart(t, q, workXLoops, worker.Config{Poll: workXNever}, h)
			count.waitClaims(t, claims+workXLoops)
			var id any
			switch how {
			case "*sql.DB":
				id = workXEnqueue(t, q, db, how)
			case "*sql.Conn":
				conn, err := db.Conn(ctx)
				if err != nil {
					t.Fatal(err)
				}
				id = workXEnqueue(t, q, conn, how)
				conn.Close()
			default:
				id = workXEnqueueQuiet(t, q, db, how)
				q.Wake()
			}
			if got := workXRecv(t, handled, "the job enqueued through "+how); got != id {
				t.Errorf("handled %v, want %v", got, id)
			}
			r.stop(t)
		}
		idleSoon(t, db, q)
	})
}

// TestWorkDue: a job enqueued with a not-before time a moment ahead is
// handled once due, found by the fallback poll, and not before.
func TestWorkDue(t *testing.T) {
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, workXLoops+2)
		table := newTable(t, e, db, "work_due_"+form)
		q := newQueue(t, db, queueConfig(e, Table(table, form), nil))
		at := make(chan time.Time, 1)
		workXStart(t, q, workXLoops, worker.Config{Poll: workXPoll}, func(ctx context.Context, d *inbox.Delivery) error {
			at <- time.Now()
			return nil
		})
		due := time.Now().Add(150 * time.Millisecond)
		if _, err := q.Enqueue(context.Background(), db, inbox.Job{Data: []any{[]byte("due")}, NotBefore: due}); err != nil {
			t.Fatal(err)
		}
		// The clocks compared are the host's; the column keeps microseconds.
		if got := workXRecv(t, at, "the due job"); got.Before(due.Add(-time.Millisecond)) {
			t.Errorf("handled at %v, before its not-before time %v", got, due)
		}
	})
}

// TestWorkPollHandover: the loop that polls finds a job by its fallback
// timer and starts handling it, with room left in its batch (so it wakes
// no one); another idle loop must take the polling over, so that a second
// job enqueued quietly (as by another process) is handled while the first
// handler still runs. The pool has room for every loop's batch, so that
// each loop's first claim sends a statement.
func TestWorkPollHandover(t *testing.T) {
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		const batch = 2
		db, count := workXOpenCounting(t, e, workXLoops*batch+2)
		table := newTable(t, e, db, "work_handover_"+form)
		q := newQueue(t, db, queueConfig(e, Table(table, form), nil))
		count.watch(q)
		started := make(chan string, 2)
		release := make(chan struct{})
		workXStart(t, q, workXLoops, worker.Config{Poll: workXPoll, Batch: batch}, func(ctx context.Context, d *inbox.Delivery) error {
			p := workXPayload(t, d)
			started <- p
			if p == "first" {
				<-release
			}
			return nil
		})
		t.Cleanup(func() { close(release) })
		// Every loop has made its first claim: only the polling one's
		// timer can find the first job.
		count.waitClaims(t, workXLoops)
		workXEnqueueQuiet(t, q, db, "first")
		if p := workXRecv(t, started, "the first job"); p != "first" {
			t.Fatalf("handled %q first", p)
		}
		workXEnqueueQuiet(t, q, db, "second")
		if p := workXRecv(t, started, "the second job while the first one's handler runs"); p != "second" {
			t.Fatalf("handled %q second", p)
		}
	})
}

// TestWorkIdlePolls: eight idle loops on an empty table cost one statement
// per fallback interval for the process, not one claim per loop: the one
// loop that polls sends the dialect's probe where the claim is a
// transaction (MySQL's lease, the row lock), and the claim's first read
// where it is one statement. No transaction is begun while they idle.
func TestWorkIdlePolls(t *testing.T) {
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		const poll = 50 * time.Millisecond
		const polls = 5
		db, count := workXOpenCounting(t, e, workXLoops+2)
		table := newTable(t, e, db, "work_idle_"+form)
		q := newQueue(t, db, queueConfig(e, Table(table, form), nil))
		count.watch(q)
		st := q.Statements()
		pollSQL := st.Jobs.Probe.SQL
		if pollSQL == "" {
			pollSQL = st.Claim.For(1).SQL // the loops claim one job at a time
			if form == "advisory" {
				pollSQL = st.Advisory.Candidates.SQL
				if st.Advisory.LockFirst.SQL != "" && !st.Advisory.LockFirstContended { // MariaDB walks until contended
					pollSQL = st.Advisory.LockFirst.SQL
				}
			}
		}
		snapshot := func() (all, begins, polled int) {
			count.mu.Lock()
			defer count.mu.Unlock()
			return count.all, count.begins, count.each[pollSQL]
		}
		workXStart(t, q, workXLoops, worker.Config{Poll: poll}, func(context.Context, *inbox.Delivery) error {
			t.Error("a job was handled from an empty table")
			return nil
		})
		// Each loop's first claim has sent its first statement; what a
		// claim sends after it is not counted (the window opens at the
		// next poll).
		count.waitClaims(t, workXLoops)
		_, _, p0 := snapshot()
		deadline := time.Now().Add(workXDeadline)
		for _, _, p := snapshot(); p == p0; _, _, p = snapshot() {
			if time.Now().After(deadline) {
				t.Fatalf("no poll within %v", workXDeadline)
			}
			time.Sleep(time.Millisecond)
		}
		began := time.Now()
		all0, begins0, p1 := snapshot()
		for _, _, p := snapshot(); p < p1+polls; _, _, p = snapshot() {
			if time.Now().After(deadline) {
				t.Fatalf("%d polls within %v", p-p1, workXDeadline)
			}
			time.Sleep(time.Millisecond)
		}
		all, begins, p := snapshot()
		elapsed := time.Since(began)
		if all-all0 != p-p1 || begins != begins0 {
			t.Errorf("%d polls sent %d statements and began %d transactions; want one statement each and none", p-p1, all-all0, begins-begins0)
		}
		// One loop polls at a time, once an interval: the polls counted
		// after the first cannot outrun the clock by much. The slack
		// (twice the intervals, and three) covers a loaded machine, where
		// a late poll is followed by one on time and this goroutine lags
		// in seeing them; sixteen loops polling apart would send sixteen
		// an interval.
		if limit := 2*int(elapsed/poll) + 3; p-p1 > limit {
			t.Errorf("%d polls in %v with a fallback interval of %v: more than one loop polls", p-p1, elapsed, poll)
		}
	})
}

// TestWorkPollsPerTable: tables of one name in two schemas (a tenant's
// each, say) share the process's wake-ups, which costs a claim that finds
// nothing, but not the fallback poll: the loops of each table poll it every
// interval, however many loops the other table has. Before, one loop polled
// for both, and a job enqueued quietly (by another process) into the table
// with fewer loops waited as many intervals as its loops lost the draw for
// the polling to the other table's.
func TestWorkPollsPerTable(t *testing.T) {
	eachEngine(t, func(e Engine) bool { return !e.IsSQLite() }, func(t *testing.T, e Engine) {
		const poll, polls = 40 * time.Millisecond, 12
		db, count := workXOpenCounting(t, e, workXLoops+4)
		table := newTable(t, e, db, "work_pertable")
		const schema = "inbox_other"
		create := "CREATE SCHEMA IF NOT EXISTS " + schema
		if e.IsMySQL() {
			create = "CREATE DATABASE IF NOT EXISTS " + schema
		}
		if _, err := db.Exec(create); err != nil {
			t.Fatal(err)
		}
		other := schema + "." + table
		e.CreateTable(t, db, other)
		dropAtEnd(t, e, db, other, other+"_dead", other+"_claims")
		qa := newQueue(t, db, queueConfig(e, Table(table, "lease"), nil))
		qb := newQueue(t, db, queueConfig(e, Table(other, "lease"), nil))
		count.watch(qa)
		count.watch(qb)
		// What an idle lease loop sends when its interval runs out.
		pollOf := func(q *inbox.Queue) string {
			if st := q.Statements(); st.Jobs.Probe.SQL != "" {
				return st.Jobs.Probe.SQL
			}
			return q.Statements().Claim.For(1).SQL // a batch of one
		}
		pa, pb := pollOf(qa), pollOf(qb)
		polled := func() (a, b int) {
			count.mu.Lock()
			defer count.mu.Unlock()
			return count.each[pa], count.each[pb]
		}
		h := func(context.Context, *inbox.Delivery) error {
			t.Error("a job was handled from an empty table")
			return nil
		}
		cfg := worker.Config{Poll: poll}
		workXStart(t, qa, workXLoops-1, cfg, h)
		workXStart(t, qb, 1, cfg, h)
		count.waitClaims(t, workXLoops)
		a0, b0 := polled()
		deadline := time.Now().Add(workXDeadline)
		for a, _ := polled(); a < a0+polls; a, _ = polled() {
			if time.Now().After(deadline) {
				t.Fatalf("%d polls of %s within %v", a-a0, table, workXDeadline)
			}
			time.Sleep(time.Millisecond)
		}
		// The other table's one loop polls as often as this table's seven
		// between them: a third is the margin for the timers' jitter on a
		// loaded machine; a loop losing the draw to seven would poll about
		// one time in seven.
		if a, b := polled(); b-b0 < polls/3 {
			t.Errorf("while the loops of %s polled %d times, the loop of %s polled %d times; want each table polled every interval", table, a-a0, other, b-b0)
		}
	})
}

// TestWorkFlood: 10,000 enqueues in a burst, each a wake-up, reach eight
// loops with a batch of 16: every job is handled once; the goroutines stay
// within a bound while they run (a handler and a lease keeper per job in
// work) and return to their starting number after; the heap does not keep
// what the wake-ups allocated.
func TestWorkFlood(t *testing.T) {
	eachEngine(t, func(e Engine) bool { return e.Name == "mattn" || e.Name == "pgx" }, func(t *testing.T, e Engine) {
		const (
			jobs      = 10000
			enqueuers = 4
			batch     = 16
		)
		dsn := e.DSN(t, t.TempDir())
		if e.IsPostgres() && strings.Contains(dsn, "://") {
			// The flood tests the loop, not the disk: commits do not wait
			// for their WAL flush.
			if strings.Contains(dsn, "?") {
				dsn += "&synchronous_commit=off"
			} else {
				dsn += "?synchronous_commit=off"
			}
		}
		db := e.OpenDSN(t, dsn, workXLoops+4)
		table := newTable(t, e, db, "work_flood")
		q := newQueue(t, db, queueConfig(e, Table(table, "lease"), nil))
		// Warm the pool: its connections' own goroutines, if any, count in
		// the starting number.
		var warm sync.WaitGroup
		for range workXLoops + 4 {
			warm.Add(1)
			go func() { defer warm.Done(); _ = db.QueryRow("SELECT COUNT(*) FROM " + table).Scan(new(int)) }()
		}
		warm.Wait()
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		start := runtime.NumGoroutine()
		bound := start + workXLoops + 2*workXLoops*batch + 32

		var (
			mu      sync.Mutex
			seen    = make(map[any]int, jobs)
			peak    atomic.Int64
			handled atomic.Int64
			all     = make(chan struct{})
		)
		r := workXStart(t, q, workXLoops, worker.Config{Poll: workXNever, Batch: batch}, func(ctx context.Context, d *inbox.Delivery) error {
			if n := int64(runtime.NumGoroutine()); n > peak.Load() {
				peak.Store(n) // a lower bound of the peak is enough: it is checked against a bound
			}
			mu.Lock()
			seen[d.ID()]++
			mu.Unlock()
			if handled.Add(1) == jobs {
				close(all)
			}
			return nil
		})
		var wg sync.WaitGroup
		ids := make([][]any, enqueuers)
		for g := range enqueuers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range jobs / enqueuers {
					id, err := q.Enqueue(context.Background(), db, inbox.Job{Data: []any{[]byte(fmt.Sprint(g, "-", i))}})
					if err != nil {
						t.Error(err)
						return
					}
					ids[g] = append(ids[g], id)
				}
			}()
		}
		wg.Wait()
		workXRecv(t, all, fmt.Sprintf("%d jobs to be handled", jobs))
		workXUntil(t, "the acks", func() error {
			if n := countRows(t, db, table); n != 0 {
				return fmt.Errorf("%d rows left", n)
			}
			return nil
		})
		r.stop(t)
		mu.Lock()
		for _, g := range ids {
			for _, id := range g {
				if seen[id] != 1 {
					t.Errorf("job %v handled %d times, want once", id, seen[id])
				}
			}
		}
		if len(seen) != jobs {
			t.Errorf("handled %d distinct jobs, want %d", len(seen), jobs)
		}
		mu.Unlock()
		if p := int(peak.Load()); p > bound {
			t.Errorf("%d goroutines while the flood ran, over the bound %d (%d at the start)", p, bound, start)
		}
		workXUntil(t, "the goroutines to return to their starting number", func() error {
			if n := runtime.NumGoroutine(); n > start {
				return fmt.Errorf("%d goroutines, %d at the start", n, start)
			}
			return nil
		})
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 16<<20 {
			t.Errorf("the heap grew by %d bytes over the flood", grew)
		}
		t.Logf("FIGURE: flood %s: goroutines %d at the start, peak seen %d, %d after; heap %+d KiB",
			e.Name, start, peak.Load(), runtime.NumGoroutine(), (int64(after.HeapAlloc)-int64(before.HeapAlloc))>>10)
	})
}

// workXCounter counts the claim statements that reached the driver and
// returned, so that a test can tell when every loop has made its first
// claim, and every statement run and transaction begun. It is safe for
// concurrent use.
type workXCounter struct {
	claimed *connhook.Watch
	mu      sync.Mutex
	all     int            // every statement run, watched or not
	begins  int            // transactions begun
	each    map[string]int // runs of each statement
}

// watch adds q's claim statements: its first read of a claim under every
// form and engine.
func (c *workXCounter) watch(q *inbox.Queue) {
	st := q.Statements()
	for _, s := range append([]dialect.Stmt{st.Claim.Take, st.Claim.TakeOne, st.Claim.Select, st.Advisory.Candidates, st.Advisory.LockFirst, st.Claim.Pick}, st.Claim.TakeBounded...) {
		if s.SQL != "" {
			c.claimed.Add(s.SQL)
		}
	}
}

func (c *workXCounter) sent(query string) {
	c.mu.Lock()
	c.all++
	c.each[query]++
	c.mu.Unlock()
	c.claimed.Saw(query)
}

func (c *workXCounter) claims() int { return c.claimed.Count() }

// waitClaims waits until n claim statements have returned.
func (c *workXCounter) waitClaims(t testing.TB, n int) {
	t.Helper()
	c.claimed.Wait(t, n, workXDeadline)
}

// workXOpenCounting is Engine.Open through a driver wrapper that counts the
// claim statements the counter watches.
func workXOpenCounting(t *testing.T, e Engine, maxConns int) (*sql.DB, *workXCounter) {
	t.Helper()
	inner, err := connhook.Connector(e.Driver, e.DSN(t, t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	c := &workXCounter{claimed: connhook.NewWatch(), each: map[string]int{}}
	db := sql.OpenDB(connhook.Wrap(inner, connhook.Hooks{Before: c.before, After: c.after}))
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	if err := db.Ping(); err != nil {
		t.Fatalf("%s: %v", e.Name, err)
	}
	t.Cleanup(func() { db.Close() })
	return db, c
}

// before counts the transactions begun.
func (c *workXCounter) before(_ context.Context, call connhook.Call) {
	if call.Kind == connhook.Begin {
		c.mu.Lock()
		c.begins++
		c.mu.Unlock()
	}
}

// after counts the statements run without error, prepared or not
// (go-sql-driver/mysql without interpolateParams prepares each statement
// with arguments).
func (c *workXCounter) after(_ context.Context, call connhook.Call, err error, _ time.Duration) {
	if call.Kind.Runs() && err == nil {
		c.sent(call.SQL)
	}
}

// TestWorkBatchTwoPools: lease loops with batches, whose jobs settle
// together through a batcher, drain one table over two pools, one naming it
// plainly and the other by its qualified name, while each loop's context is
// cancelled at a random point and the loop started again. A job handed to
// a handler is acknowledged even when its loop stops meanwhile (the lease
// form keeps its lease), so each job reaches a handler exactly once, never
// two at a time, no settlement fails, and the table ends empty.
func TestWorkBatchTwoPools(t *testing.T) {
	eachEngine(t, nil, func(t *testing.T, e Engine) {
		jobs := 400
		if e.IsSQLite() && raceBuild() {
			jobs = 150
		}
		workBatchTwoPools(t, e, jobs, prepareAll)
	})
}

// TestWorkBatchTwoPoolsPrepared is TestWorkBatchTwoPools with
// Config.Prepare: loops cut off at random points while their statements
// run prepared, on two pools.
func TestWorkBatchTwoPoolsPrepared(t *testing.T) {
	eachEngine(t, nil, func(t *testing.T, e Engine) {
		jobs := 200
		if e.IsSQLite() && raceBuild() {
			jobs = 100
		}
		workBatchTwoPools(t, e, jobs, true)
	})
}

// workBatchTwoPools drains jobs with eight Work loops of lease batches over
// two pools, one naming the table plainly and the other by its qualified
// name, each loop's context ended at a random point and the loop run again.
func workBatchTwoPools(t *testing.T, e Engine, jobs int, prepare bool) {
	const (
		loops = 8 // four per pool
		batch = 4
	)
	db1, db2 := openTwo(t, e, loops/2+2)
	what := "work_two"
	if prepare {
		what = "work_two_prep"
	}
	table := concTable(t, e, db1, what)
	cfg1, cfg2 := queueConfig(e, Table(table, "lease"), nil), queueConfig(e, Table(concQualified(t, e, db1, table), "lease"), nil)
	cfg1.Prepare, cfg2.Prepare = prepare, prepare
	q1 := newQueue(t, db1, cfg1)
	q2 := newQueue(t, db2, cfg2)
	want := concFill(t, e, db1, table, jobs, 1)

	var (
		mu        sync.Mutex
		delivered = map[string]int{}
		inWork    = map[string]bool{}
		failures  []error
	)
	cfg := worker.Config{Poll: workXPoll, Batch: batch, OnError: func(err error) {
		mu.Lock()
		failures = append(failures, err)
		mu.Unlock()
	}}
	handle := func(ctx context.Context, d *inbox.Delivery) error {
		id := concKey(d.ID())
		mu.Lock()
		if inWork[id] {
			t.Errorf("job %s handled by two loops at once", id)
		}
		inWork[id] = true
		delivered[id]++
		mu.Unlock()
		var one int
		if err := db1.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil { // a moment's work
			t.Errorf("handler's statement: %v", err)
		}
		mu.Lock()
		inWork[id] = false
		mu.Unlock()
		return nil
	}
	workXRunCut(t, []*inbox.Queue{q1, q2}, loops, cfg, handle, func() int { return countRows(t, db1, table) })
	mu.Lock()
	defer mu.Unlock()
	for _, err := range failures {
		t.Errorf("a claim or settlement failed: %v", err)
	}
	for id := range want {
		if delivered[id] != 1 {
			t.Errorf("job %s reached a handler %d times, want once", id, delivered[id])
		}
	}
	if len(delivered) != len(want) {
		t.Errorf("%d jobs handled, %d enqueued", len(delivered), len(want))
	}
}

// TestWorkBatchLongHandlers: the handlers of a lease batch that run past
// half the lease, on the real clock, are kept by their keepers (started
// together by the batch's one start timer): each lease is extended at least
// twice, no handler's context ends, and each job is acknowledged once.
func TestWorkBatchLongHandlers(t *testing.T) {
	eachEngine(t, nil, func(t *testing.T, e Engine) {
		const (
			jobs  = 3
			lease = 2 * time.Second // extended each second; a second of slack before the margin
		)
		db := e.Open(t, 4)
		table := concTable(t, e, db, "work_long")
		cfg := queueConfig(e, Table(table, "lease"), nil)
		cfg.Lease = lease
		q := newQueue(t, db, cfg)
		concFill(t, e, db, table, jobs, 1)
		var mu sync.Mutex
		handled := map[string]int{}
		r := workXStart(t, q, 1, worker.Config{Poll: workXPoll, Batch: jobs}, func(ctx context.Context, d *inbox.Delivery) error {
			first := d.Expiry()
			deadline := time.Now().Add(workXDeadline)
			for moved := 0; moved < 2; {
				select {
				case <-ctx.Done():
					t.Errorf("job %v: the handler's context ended: %v", d.ID(), context.Cause(ctx))
					return ctx.Err()
				case <-time.After(20 * time.Millisecond): // polling the delivery's expiry, with a deadline
				}
				if now := d.Expiry(); now.After(first) {
					moved++
					first = now
				}
				if time.Now().After(deadline) {
					t.Errorf("job %v: its lease was not extended twice in %v", d.ID(), workXDeadline)
					return errors.New("not extended")
				}
			}
			mu.Lock()
			handled[concKey(d.ID())]++
			mu.Unlock()
			return nil
		})
		workXUntil(t, "the long handlers", func() error {
			if n := countRows(t, db, table); n != 0 {
				return fmt.Errorf("%d rows left", n)
			}
			return nil
		})
		r.stop(t)
		mu.Lock()
		defer mu.Unlock()
		if len(handled) != jobs {
			t.Errorf("%d jobs handled, want %d", len(handled), jobs)
		}
		for id, n := range handled {
			if n != 1 {
				t.Errorf("job %s handled %d times", id, n)
			}
		}
	})
}

// workXReturned waits for n loops of r to return on their own, before any
// stop, and returns their errors.
func workXReturned(t *testing.T, r *workXRun, n int) []error {
	t.Helper()
	var errs []error
	deadline := time.NewTimer(workXDeadline)
	defer deadline.Stop()
	for len(errs) < n {
		select {
		case err := <-r.returned:
			r.mu.Lock()
			r.seen++
			r.mu.Unlock()
			errs = append(errs, err)
		case <-deadline.C:
			t.Fatalf("%d of %d loops still running after %v: the loop did not end on an error that cannot heal", n-len(errs), n, workXDeadline)
		}
	}
	return errs
}

// TestWorkUnhealable (issue 22, item 1): errors that cannot heal end the
// loops, which return them, on every engine and form, eight loops on two
// pools: a data column the table lacks (every claim fails; the schema check
// names the column), the wrong dialect (the check names the one to use), a
// dead table that does not exist (the burial fails;
// the schema check names it, and the job is still there), and a pool of one
// connection under the forms that hold one per job (nothing could ever be
// claimed). Before, each loop reported through OnError, when set, and ran
// until its context ended.
func TestWorkUnhealable(t *testing.T) {
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		h := func(context.Context, *inbox.Delivery) error { return errors.New("failed") }
		t.Run("missing column", func(t *testing.T) {
			db1, db2 := openTwo(t, e, workXLoops)
			table := newTable(t, e, db1, "work_unheal_col_"+form)
			// A job to claim: the advisory form's candidates read no data
			// column, so only its claim of a row fails.
			enqueueOne(t, newQueue(t, db1, queueConfig(e, Table(table, form), nil)), db1, "never")
			tb := Table(table, form)
			tb.Data = []string{"payload", "no_such_column"}
			r1 := workXStart(t, newQueue(t, db1, queueConfig(e, tb, nil)), workXLoops/2, worker.Config{Poll: workXPoll}, h)
			r2 := workXStart(t, newQueue(t, db2, queueConfig(e, tb, nil)), workXLoops/2, worker.Config{Poll: workXPoll}, h)
			for _, err := range append(workXReturned(t, r1, workXLoops/2), workXReturned(t, r2, workXLoops/2)...) {
				var se *inbox.SchemaError
				if !errors.As(err, &se) || !strings.Contains(err.Error(), "no_such_column") {
					t.Errorf("Run returned %v, want a *inbox.SchemaError naming no_such_column", err)
				}
			}
		})
		t.Run("missing dead table", func(t *testing.T) {
			db1, db2 := openTwo(t, e, workXLoops)
			table := newTable(t, e, db1, "work_unheal_dead_"+form)
			tb := Table(table, form)
			tb.DeadTable = table + "_nodead"
			q1, q2 := newQueue(t, db1, queueConfig(e, tb, nil)), newQueue(t, db2, queueConfig(e, tb, nil))
			id := enqueueOne(t, q1, db1, "buried")
			ran := make(chan struct{}, 1)
			once := func(context.Context, *inbox.Delivery) error {
				select {
				case ran <- struct{}{}:
				default:
				}
				return errors.New("failed")
			}
			cfg := worker.Config{Poll: workXPoll, MaxAttempts: 1}
			r1 := workXStart(t, q1, workXLoops/2, cfg, once)
			r2 := workXStart(t, q2, workXLoops/2, cfg, once)
			workXRecv(t, ran, "the handler")
			// The loop that tried to bury the job returns; under the row
			// lock the job comes back at once, and the loops that claim it
			// next may return too. The rest run on until stopped.
			var errs []error
			var which *workXRun
			select {
			case err := <-r1.returned:
				errs, which = append(errs, err), r1
			case err := <-r2.returned:
				errs, which = append(errs, err), r2
			case <-time.After(workXDeadline):
				t.Fatalf("no loop returned within %v of a burial into a missing dead table", workXDeadline)
			}
			which.mu.Lock()
			which.seen++
			which.mu.Unlock()
			errs = append(append(errs, workXDrain(t, r1)...), workXDrain(t, r2)...)
			var se *inbox.SchemaError
			if !errors.As(errs[0], &se) || !strings.Contains(errs[0].Error(), tb.DeadTable) {
				t.Errorf("Run returned %v, want a *inbox.SchemaError naming %s", errs[0], tb.DeadTable)
			}
			for _, err := range errs[1:] {
				if err != nil && !errors.As(err, &se) {
					t.Errorf("a loop returned %v, want nil or the schema error", err)
				}
			}
			if n := countRows(t, db1, table); n != 1 {
				t.Errorf("%d rows left, want job %v still there", n, id)
			}
		})
		if e.IsSQLite() {
			return
		}
		t.Run("wrong dialect", func(t *testing.T) {
			db1, db2 := openTwo(t, e, workXLoops)
			table := newTable(t, e, db1, "work_unheal_dialect_"+form)
			enqueueOne(t, newQueue(t, db1, queueConfig(e, Table(table, form), nil)), db1, "never")
			cfg := queueConfig(e, Table(table, form), nil)
			cfg.Dialect = inbox.MySQL
			if e.IsMySQL() {
				cfg.Dialect = inbox.Postgres
			}
			r1 := workXStart(t, newQueue(t, db1, cfg), workXLoops/2, worker.Config{Poll: workXPoll}, h)
			r2 := workXStart(t, newQueue(t, db2, cfg), workXLoops/2, worker.Config{Poll: workXPoll}, h)
			for _, err := range append(workXReturned(t, r1, workXLoops/2), workXReturned(t, r2, workXLoops/2)...) {
				var se *inbox.SchemaError
				if !errors.As(err, &se) {
					t.Errorf("Run with %s on %s returned %v, want a *inbox.SchemaError naming the dialect to use", cfg.Dialect.Name(), e.Name, err)
				}
			}
		})
		if form == "lease" {
			return
		}
		t.Run("pool of one", func(t *testing.T) {
			db := e.Open(t, 1)
			table := newTable(t, e, db, "work_unheal_pool_"+form)
			q := newQueue(t, db, queueConfig(e, Table(table, form), nil))
			enqueueOne(t, q, db, "never")
			r := workXStart(t, q, workXLoops, worker.Config{Poll: workXPoll}, h)
			for _, err := range workXReturned(t, r, workXLoops) {
				if !errors.Is(err, inbox.ErrPoolTooSmall) {
					t.Errorf("Run returned %v, want ErrPoolTooSmall", err)
				}
			}
			if n := attemptOf(t, e, db, table, firstID(t, db, table)); n != 1 {
				t.Errorf("attempt %d, want 1: nothing may have changed", n)
			}
		})
	})
}

// workXDrain stops r's loops and returns what those still running return.
func workXDrain(t *testing.T, r *workXRun) []error {
	t.Helper()
	r.cancel()
	r.mu.Lock()
	left := r.n - r.seen
	r.mu.Unlock()
	return workXReturned(t, r, left)
}

// TestWorkRefuses (issue 22, item 2): what the loop cannot honour is refused
// at start, before any I/O, on every engine: the row lock and advisory
// forms without a not-before column (a failing job ran 3,119 times in 3 s),
// a table without a dead table (a failing job retried forever), a fallback
// interval under a millisecond. The job enqueued before is untouched.
func TestWorkRefuses(t *testing.T) {
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, workXLoops)
		table := newTable(t, e, db, "work_refuses_"+form)
		id := enqueueOne(t, newQueue(t, db, queueConfig(e, Table(table, form), nil)), db, "kept")
		h := func(context.Context, *inbox.Delivery) error {
			t.Error("a handler ran under a configuration that was refused")
			return nil
		}
		type refusal struct {
			tb   inbox.Table
			cfg  worker.Config
			want string
		}
		noDead := Table(table, form)
		noDead.DeadTable = ""
		cases := []refusal{
			{noDead, worker.Config{}, "name inbox.Table.DeadTable"},
			{Table(table, form), worker.Config{Poll: time.Microsecond}, "Config.Poll 1µs"},
			{Table(table, form), worker.Config{Workers: -1}, "Config.Workers -1 is negative"},
		}
		if form != "lease" {
			noDelay := Table(table, form)
			noDelay.NotBefore = ""
			cases = append(cases, refusal{noDelay, worker.Config{}, "name inbox.Table.NotBefore"})
		}
		for _, c := range cases {
			err := worker.Run(context.Background(), newQueue(t, db, queueConfig(e, c.tb, nil)), c.cfg, h)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Run(%+v) = %v, want an error naming %q", c.cfg, err, c.want)
			}
		}
		if n := attemptOf(t, e, db, table, id); n != 1 || countRows(t, db, table) != 1 {
			t.Errorf("attempt %d, %d rows: the refused loops changed the table", n, countRows(t, db, table))
		}
	})
}

// TestWorkRetryOnTime (issue 22, item 3): a retry's backoff starts the next
// attempt when it is due, not at the loops' next fallback poll: eight loops
// on two pools whose poll cannot fire during the test (workXNever) run the
// second attempt of a job that failed with a 300 ms backoff within
// workXDeadline, on every engine and form. Before, the job waited for the
// ten-minute poll.
func TestWorkRetryOnTime(t *testing.T) {
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		db1, db2 := openTwo(t, e, workXLoops)
		table := newTable(t, e, db1, "work_ontime_"+form)
		tb := Table(table, form)
		q1, q2 := newQueue(t, db1, queueConfig(e, tb, nil)), newQueue(t, db2, queueConfig(e, tb, nil))
		attempts := make(chan int, 4)
		h := func(_ context.Context, d *inbox.Delivery) error {
			attempts <- d.Attempt()
			if d.Attempt() == 1 {
				return errors.New("failed")
			}
			return nil
		}
		// What the loops meet goes into a failure's message: a failed
		// Retry, for one, leaves the job to its one-minute lease.
		var (
			mu  sync.Mutex
			met []error
		)
		cfg := worker.Config{Poll: workXNever, Backoff: func(int) time.Duration { return 300 * time.Millisecond }, OnError: func(err error) {
			mu.Lock()
			met = append(met, err)
			mu.Unlock()
		}}
		workXStart(t, q1, workXLoops/2, cfg, h)
		workXStart(t, q2, workXLoops/2, cfg, h)
		enqueueOne(t, q1, db1, "delayed")
		for want := 1; want <= 2; want++ {
			select {
			case a := <-attempts:
				if a != want {
					t.Fatalf("attempt %d came as attempt number %d", a, want)
				}
			case <-time.After(workXDeadline):
				mu.Lock()
				defer mu.Unlock()
				t.Fatalf("waited %v for attempt %d (the second is due 300 ms after the first); the loops met: %v", workXDeadline, want, met)
			}
		}
		workXUntil(t, "the ack", func() error {
			if n := countRows(t, db1, table); n != 0 {
				return fmt.Errorf("%d rows left", n)
			}
			return nil
		})
	})
}

// TestWorkPollsPerInterval (issue 21, item 9): loops of one queue and pool
// with different fallback intervals each poll at their own. Seven loops
// whose poll cannot fire during the test start first and take the polling;
// one loop on a 100 ms poll, on the same pool, starts after them; a job
// enqueued without a wake-up (as another process would) is handled within
// workXDeadline. Before, the loops shared one polling turn whatever their
// intervals, and the job waited for the ten-minute poll.
func TestWorkPollsPerInterval(t *testing.T) {
	eachForm(t, leaseOnly, func(t *testing.T, e Engine, form string) {
		db, count := workXOpenCounting(t, e, workXLoops+2)
		table := newTable(t, e, db, "work_perinterval")
		q := newQueue(t, db, queueConfig(e, Table(table, form), nil))
		count.watch(q)
		handled := make(chan any, 1)
		h := func(_ context.Context, d *inbox.Delivery) error {
			handled <- d.ID()
			return nil
		}
		workXStart(t, q, workXLoops-1, worker.Config{Poll: workXNever}, h)
		count.waitClaims(t, workXLoops-1)
		workXStart(t, q, 1, worker.Config{Poll: workXPoll}, h)
		count.waitClaims(t, workXLoops)
		id := workXEnqueueQuiet(t, q, db, "quiet")
		if got := workXRecv(t, handled, "the quietly enqueued job, found by the 100 ms loop's poll"); got != id {
			t.Errorf("handled %v, want %v", got, id)
		}
	})
}
