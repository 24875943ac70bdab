package dbtest

// The edge of a row-lock attempt (issue 21, items 1, 2, 3 and 9): what a
// failed attempt leaves behind, what a failed statement in the handler does
// to the settlement, what an error text the column cannot hold does, and
// the claims counter and the claim's deadline when the session or the pool
// gets in the way.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/worker"
)

// attXLoops is how many worker.Run loops the loop tests run: four per pool.
const attXLoops = 8

// attXSetup makes a row-lock table (with not_before) whose table and dead
// table have last_error of type errType, and an effects table whose job_id
// is its primary key, as an orders service's shipments are one per order.
// It returns two pools on the database and the table's two spellings, plain
// and qualified, with the effects table.
func attXSetup(t *testing.T, e Engine, what, errType string) (db1, db2 *sql.DB, plain, qualified, effects string) {
	t.Helper()
	db1, db2 = openTwo(t, e, attXLoops/2+2)
	plain = concTable(t, e, db1, what)
	for _, name := range []string{plain, plain + "_dead"} {
		mustExec(t, e, db1, "ALTER TABLE "+name+" ADD COLUMN last_error "+errType)
	}
	effects = plain + "_fx"
	mustExec(t, e, db1, "DROP TABLE IF EXISTS "+effects)
	mustExec(t, e, db1, "CREATE TABLE "+effects+" (job_id bigint PRIMARY KEY, note varchar(200) NOT NULL)")
	dropAtEnd(t, e, db1, effects)
	return db1, db2, plain, concQualified(t, e, db1, plain), effects
}

// attXTable describes table under the row lock with last_error.
func attXTable(table string) inbox.Table {
	tb := Table(table, "rowlock")
	tb.LastError = "last_error"
	return tb
}

// attXDead returns the dead table's rows: per id, attempt and last_error
// (NULL as "<nil>").
func attXDead(t testing.TB, e Engine, db *sql.DB, table string) map[string]string {
	t.Helper()
	rows, err := db.Query("SELECT id, attempt, last_error FROM " + table + "_dead")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var id any
		var attempt int
		var last sql.NullString
		if err := rows.Scan(&id, &attempt, &last); err != nil {
			t.Fatal(err)
		}
		text := "<nil>"
		if last.Valid {
			text = last.String
		}
		out[concKey(id)] = fmt.Sprintf("attempt=%d last_error=%s", attempt, text)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// attXLastError returns row id's last_error, "<nil>" for NULL.
func attXLastError(t testing.TB, e Engine, db *sql.DB, table string, id any) string {
	t.Helper()
	var last sql.NullString
	if err := db.QueryRow(bind(e, "SELECT last_error FROM "+table+" WHERE id = ?"), id).Scan(&last); err != nil {
		t.Fatalf("last_error of %v: %v", id, err)
	}
	if !last.Valid {
		return "<nil>"
	}
	return last.String
}

// attXStorable is text as the package stores it (inbox.Delivery.SetError):
// NUL and invalid bytes become U+FFFD, cut to inbox.MaxErrorText bytes.
func attXStorable(s string) string {
	var b strings.Builder
	for len(s) > 0 {
		r, size := utf8.DecodeRuneInString(s) // RuneError for each bad byte
		if r == 0 {
			r = utf8.RuneError
		}
		if b.Len()+utf8.RuneLen(r) > inbox.MaxErrorText {
			break
		}
		b.WriteRune(r)
		s = s[size:]
	}
	return b.String()
}

// attXLoopRun runs attXLoops worker.Run loops, half on each pool and spelling,
// with MaxAttempts 3 and a constant backoff, until every job of table is in
// the dead table or the deadline passes, and returns what the handler saw:
// per job, the start of each run and the last error it returned.
type attXLoopRun struct {
	mu     sync.Mutex
	starts map[string][]time.Time
	last   map[string]string
}

func (r *attXLoopRun) runs() (total, most int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.starts {
		total += len(s)
		most = max(most, len(s))
	}
	return total, most
}

func attXLoop(t *testing.T, e Engine, db1, db2 *sql.DB, plain, qualified string, jobs int, backoff time.Duration,
	handle func(ctx context.Context, d *inbox.Delivery) error) *attXLoopRun {
	t.Helper()
	q1 := newQueue(t, db1, queueConfig(e, attXTable(plain), nil))
	q2 := newQueue(t, db2, queueConfig(e, attXTable(qualified), nil))
	for i := range jobs {
		enqueueOne(t, q1, db1, fmt.Sprintf("order-%d", i))
	}
	r := &attXLoopRun{starts: map[string][]time.Time{}, last: map[string]string{}}
	var failures []error
	cfg := worker.Config{Poll: workXPoll, MaxAttempts: 3, Backoff: func(int) time.Duration { return backoff },
		OnError: func(err error) {
			r.mu.Lock()
			failures = append(failures, err)
			r.mu.Unlock()
		}}
	h := func(ctx context.Context, d *inbox.Delivery) error {
		id := concKey(d.ID())
		r.mu.Lock()
		r.starts[id] = append(r.starts[id], time.Now())
		r.mu.Unlock()
		err := handle(ctx, d)
		if err != nil {
			r.mu.Lock()
			r.last[id] = err.Error()
			r.mu.Unlock()
		}
		return err
	}
	start := time.Now()
	run1 := workXStart(t, q1, attXLoops/2, cfg, h)
	run2 := workXStart(t, q2, attXLoops/2, cfg, h)
	deadline := time.Now().Add(60 * time.Second)
	for countRows(t, db1, plain+"_dead") < jobs {
		if time.Now().After(deadline) {
			total, most := r.runs()
			t.Fatalf("FIGURE: %s: %d of %d jobs dead after %v: %d handler runs, up to %d for one job (MaxAttempts 3); attempts in the table: %v",
				e.Name, countRows(t, db1, plain+"_dead"), jobs, time.Since(start).Round(time.Millisecond), total, most, concIDs(t, db1, plain))
		}
		time.Sleep(20 * time.Millisecond) // polling the dead table, with a deadline
	}
	run1.stop(t)
	run2.stop(t)
	total, most := r.runs()
	t.Logf("FIGURE: %s: %d jobs dead after %v: %d handler runs, up to %d for one job (MaxAttempts 3)",
		e.Name, jobs, time.Since(start).Round(time.Millisecond), total, most)
	r.mu.Lock()
	for _, err := range failures {
		t.Errorf("a claim or settlement failed: %v", err)
	}
	r.mu.Unlock()
	mustBeIdle(t, db1, q1)
	mustBeIdle(t, db2, q2)
	return r
}

// attXCheckDead checks that each of the jobs ran three times, at least
// backoff apart, and lies in the dead table with attempt 3 and the last
// error its handler returned.
func attXCheckDead(t *testing.T, e Engine, db *sql.DB, table string, r *attXLoopRun, jobs int, backoff time.Duration) {
	t.Helper()
	dead := attXDead(t, e, db, table)
	if len(dead) != jobs {
		t.Errorf("%d jobs in the dead table, want %d", len(dead), jobs)
	}
	if n := countRows(t, db, table); n != 0 {
		t.Errorf("%d jobs left in the table", n)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, row := range dead {
		if want := "attempt=3 last_error=" + attXStorable(r.last[id]); row != want {
			t.Errorf("dead job %s: %s, want %s", id, row, want)
		}
		starts := r.starts[id]
		if len(starts) != 3 {
			t.Errorf("job %s ran %d times, want 3", id, len(starts))
		}
		for i := 1; i < len(starts); i++ {
			// The retry's not-before is the engine's clock when it
			// settled, after the run started, plus the backoff; a
			// millisecond for the clocks' rounding.
			if gap := starts[i].Sub(starts[i-1]); gap < backoff-time.Millisecond {
				t.Errorf("job %s: run %d started %v after run %d, before the backoff of %v", id, i+1, gap, i, backoff)
			}
		}
	}
}

// TestRowLockFailedAttemptWrites (issue 21, item 1): worker.Run loops whose
// handler writes a shipment through Delivery.Tx, then fails. Nothing of a
// failed attempt stays: no shipment row survives, every attempt's write
// succeeds (the first attempt's row would make the second fail on the
// duplicate key), and the error recorded is the handler's own.
func TestRowLockFailedAttemptWrites(t *testing.T) {
	eachEngine(t, notSQLite, func(t *testing.T, e Engine) {
		const (
			jobs    = 16
			backoff = 50 * time.Millisecond
		)
		db1, db2, plain, qualified, effects := attXSetup(t, e, "att_writes", "TEXT")
		insert := bind(e, "INSERT INTO "+effects+" (job_id, note) VALUES (?, ?)")
		r := attXLoop(t, e, db1, db2, plain, qualified, jobs, backoff, func(ctx context.Context, d *inbox.Delivery) error {
			if _, err := d.Tx().ExecContext(ctx, insert, d.ID(), fmt.Sprintf("shipment of attempt %d", d.Attempt())); err != nil {
				return err
			}
			return fmt.Errorf("carrier down on attempt %d", d.Attempt())
		})
		attXCheckDead(t, e, db1, plain, r, jobs, backoff)
		if rows := dumpRows(t, db1, effects); len(rows) != 0 {
			t.Errorf("failed attempts left %d shipments: %q", len(rows), rows)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		for id, last := range r.last {
			if last != "carrier down on attempt 3" {
				t.Errorf("job %s: the handler's last error was %q: an attempt's own write failed", id, last)
			}
		}
	})
}

// TestRowLockFailedStatement (issue 21, item 2): worker.Run loops whose handler
// runs a statement that fails through Delivery.Tx (a duplicate key, which
// on PostgreSQL aborts the held transaction) and returns its error. Every
// attempt is spent, the backoff applies between them, and after
// MaxAttempts the job is in the dead table with the handler's error.
func TestRowLockFailedStatement(t *testing.T) {
	eachEngine(t, notSQLite, func(t *testing.T, e Engine) {
		const (
			jobs    = 12
			backoff = 200 * time.Millisecond
		)
		db1, db2, plain, qualified, effects := attXSetup(t, e, "att_stmt", "TEXT")
		mustExec(t, e, db1, "INSERT INTO "+effects+" (job_id, note) VALUES (0, 'taken')")
		insert := bind(e, "INSERT INTO "+effects+" (job_id, note) VALUES (0, ?)")
		r := attXLoop(t, e, db1, db2, plain, qualified, jobs, backoff, func(ctx context.Context, d *inbox.Delivery) error {
			_, err := d.Tx().ExecContext(ctx, insert, fmt.Sprint(d.ID()))
			if err == nil {
				return errors.New("the duplicate key was accepted")
			}
			return err
		})
		attXCheckDead(t, e, db1, plain, r, jobs, backoff)
		if n := countRows(t, db1, effects); n != 1 {
			t.Errorf("%d effects, want the one row made before", n)
		}
	})
}

// attXHand drives one job by the hand-written API through MaxAttempts 3:
// each attempt claims it (alternating the two queues), runs write on the
// delivery when not nil, records text with SetError, and settles with
// Retry, or Dead at the third; it returns each settlement's error.
func attXHand(t *testing.T, qs [2]*inbox.Queue, text string, write func(d *inbox.Delivery) error) {
	t.Helper()
	ctx := context.Background()
	for attempt := 1; attempt <= 3; attempt++ {
		d := claimOne(t, qs[attempt%2])
		if d.Attempt() != attempt {
			t.Fatalf("delivered attempt %d, want %d", d.Attempt(), attempt)
		}
		if write != nil {
			if err := write(d); err != nil {
				_ = d.Release(ctx)
				t.Fatalf("attempt %d: the handler's write: %v", attempt, err)
			}
		}
		d.SetError(errors.New(text))
		var err error
		if attempt < 3 {
			err = d.Retry(ctx, 0)
		} else {
			err = d.Dead(ctx)
		}
		if err != nil {
			t.Fatalf("attempt %d: settlement with a %d-byte error text: %v", attempt, len(text), err)
		}
	}
}

// TestRowLockErrorTexts (issue 21, item 3): error texts with a NUL byte,
// invalid UTF-8 and 5,000 bytes reach last_error, made storable, on every
// Retry, and the job dies at its third attempt with the text in the dead
// table; with the handler writing through Tx (a savepoint) and without.
func TestRowLockErrorTexts(t *testing.T) {
	eachEngine(t, notSQLite, func(t *testing.T, e Engine) {
		db1, db2, plain, qualified, effects := attXSetup(t, e, "att_texts", "TEXT")
		qs := [2]*inbox.Queue{
			newQueue(t, db1, queueConfig(e, attXTable(plain), nil)),
			newQueue(t, db2, queueConfig(e, attXTable(qualified), nil)),
		}
		insert := bind(e, "INSERT INTO "+effects+" (job_id, note) VALUES (?, 'x')")
		for _, text := range []string{"parse error near \x00 in input", "panic: bad \xff\xfe bytes", strings.Repeat("long error ", 455)[:5000]} {
			for _, viaTx := range []bool{false, true} {
				t.Run(fmt.Sprintf("%q, tx %v", text[:8], viaTx), func(t *testing.T) {
					emptyTables(t, db1, plain)
					mustExec(t, e, db1, "DELETE FROM "+effects)
					id := enqueueOne(t, qs[0], db1, "text")
					var write func(d *inbox.Delivery) error
					if viaTx {
						write = func(d *inbox.Delivery) error {
							_, err := d.Tx().Exec(insert, d.ID())
							return err
						}
					}
					attXHand(t, qs, text, write)
					dead := attXDead(t, e, db1, plain)
					if got, want := dead[concKey(id)], "attempt=3 last_error="+attXStorable(text); got != want {
						t.Errorf("dead job %v: %.80q…, want %.80q…", id, got, want)
					}
					if n := countRows(t, db1, effects); n != 0 {
						t.Errorf("%d effects of failed attempts", n)
					}
				})
			}
		}
		mustBeIdle(t, db1, qs[0])
		mustBeIdle(t, db2, qs[1])
	})
}

// TestRowLockNarrowLastError (issue 21, item 3): last_error is varchar(100)
// in the table and the dead table. A Retry or Dead whose text the column
// cannot hold is sent again without it: the job is retried and dies at its
// third attempt, its last_error left NULL; a short text is still kept.
func TestRowLockNarrowLastError(t *testing.T) {
	eachEngine(t, notSQLite, func(t *testing.T, e Engine) {
		db1, db2, plain, qualified, effects := attXSetup(t, e, "att_narrow", "varchar(100)")
		qs := [2]*inbox.Queue{
			newQueue(t, db1, queueConfig(e, attXTable(plain), nil)),
			newQueue(t, db2, queueConfig(e, attXTable(qualified), nil)),
		}
		insert := bind(e, "INSERT INTO "+effects+" (job_id, note) VALUES (?, 'x')")
		long := strings.Repeat("a long error text, ", 30)
		for _, viaTx := range []bool{false, true} {
			t.Run(fmt.Sprintf("tx %v", viaTx), func(t *testing.T) {
				emptyTables(t, db1, plain)
				mustExec(t, e, db1, "DELETE FROM "+effects)
				id := enqueueOne(t, qs[0], db1, "narrow")
				var write func(d *inbox.Delivery) error
				if viaTx {
					write = func(d *inbox.Delivery) error {
						_, err := d.Tx().Exec(insert, d.ID())
						return err
					}
				}
				attXHand(t, qs, long, write)
				if got, want := attXDead(t, e, db1, plain)[concKey(id)], "attempt=3 last_error=<nil>"; got != want {
					t.Errorf("dead job %v: %s, want %s", id, got, want)
				}
				if n := countRows(t, db1, effects); n != 0 {
					t.Errorf("%d effects of failed attempts", n)
				}
			})
		}
		// A text that fits is kept.
		emptyTables(t, db1, plain)
		id := enqueueOne(t, qs[0], db1, "short")
		d := claimOne(t, qs[1])
		d.SetError(errors.New("short"))
		if err := d.Retry(context.Background(), 0); err != nil {
			t.Fatal(err)
		}
		if got := attXLastError(t, e, db1, plain, id); got != "short" {
			t.Errorf("last_error %q, want \"short\"", got)
		}
		mustBeIdle(t, db1, qs[0])
		mustBeIdle(t, db2, qs[1])
	})
}

// TestRowLockTxSettlements: with the hand-written API, the claim
// transaction's writes through Delivery.Tx commit with Ack alone; Retry and
// Dead record the attempt without them, even after a statement that failed
// (on PostgreSQL, an aborted transaction), and even after the handler
// rolled the transaction back itself, when they settle in a transaction of
// their own, unless another claim took the job meanwhile (ErrLeaseLost,
// nothing changed).
func TestRowLockTxSettlements(t *testing.T) {
	eachEngine(t, notSQLite, func(t *testing.T, e Engine) {
		db1, db2, plain, qualified, effects := attXSetup(t, e, "att_tx", "TEXT")
		q := newQueue(t, db1, queueConfig(e, attXTable(plain), nil))
		other := newQueue(t, db2, queueConfig(e, attXTable(qualified), nil))
		ctx := context.Background()
		insert := bind(e, "INSERT INTO "+effects+" (job_id, note) VALUES (?, ?)")
		write := func(d *inbox.Delivery, note string) error {
			_, err := d.Tx().ExecContext(ctx, insert, d.ID(), note)
			return err
		}
		notes := func() []string {
			var out []string
			for _, r := range dumpRows(t, db1, effects) {
				out = append(out, rowFields(r)["note"])
			}
			return out
		}
		id := enqueueOne(t, q, db1, "tx")
		step := func(name string, attempt int, do func(d *inbox.Delivery) error) {
			t.Helper()
			d := claimOne(t, q)
			if d.Attempt() != attempt {
				t.Fatalf("%s: delivered attempt %d, want %d", name, d.Attempt(), attempt)
			}
			if err := do(d); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
		step("write, Retry", 1, func(d *inbox.Delivery) error {
			if err := write(d, "retried"); err != nil {
				return err
			}
			d.SetError(errors.New("first failure"))
			return d.Retry(ctx, 0)
		})
		if a, fx, last := attemptOf(t, e, db1, plain, id), notes(), attXLastError(t, e, db1, plain, id); a != 2 || len(fx) != 0 || last != "first failure" {
			t.Fatalf("after write and Retry: attempt %d, effects %q, last_error %q; want 2, none, the handler's", a, fx, last)
		}
		step("write, Release", 2, func(d *inbox.Delivery) error {
			if err := write(d, "released"); err != nil {
				return err
			}
			return d.Release(ctx)
		})
		if a, fx := attemptOf(t, e, db1, plain, id), notes(); a != 2 || len(fx) != 0 {
			t.Fatalf("after write and Release: attempt %d, effects %q; want 2, none", a, fx)
		}
		step("failed statement, Retry", 2, func(d *inbox.Delivery) error {
			if err := write(d, "before"); err != nil {
				return err
			}
			if _, err := d.Tx().ExecContext(ctx, "SELECT no_such_column FROM "+effects); err == nil {
				return errors.New("a bad statement succeeded")
			}
			d.SetError(errors.New("bad statement"))
			return d.Retry(ctx, 0)
		})
		if a, fx, last := attemptOf(t, e, db1, plain, id), notes(), attXLastError(t, e, db1, plain, id); a != 3 || len(fx) != 0 || last != "bad statement" {
			t.Fatalf("after a failed statement and Retry: attempt %d, effects %q, last_error %q; want 3, none, the handler's", a, fx, last)
		}
		step("handler's rollback, Retry", 3, func(d *inbox.Delivery) error {
			if err := write(d, "rolled back"); err != nil {
				return err
			}
			if err := d.Tx().Rollback(); err != nil {
				return err
			}
			d.SetError(errors.New("after a rollback"))
			return d.Retry(ctx, 0)
		})
		if a, fx, last := attemptOf(t, e, db1, plain, id), notes(), attXLastError(t, e, db1, plain, id); a != 4 || len(fx) != 0 || last != "after a rollback" {
			t.Fatalf("after the handler's rollback and Retry: attempt %d, effects %q, last_error %q; want 4, none, the handler's", a, fx, last)
		}
		// Rolled back, the job is free: another claim takes it before the
		// Retry, which then changes nothing.
		d := claimOne(t, q)
		if err := d.Tx().Rollback(); err != nil {
			t.Fatal(err)
		}
		taken := claimOne(t, other)
		before := dumpRows(t, db1, plain)
		if err := d.Retry(ctx, 0); !errors.Is(err, inbox.ErrLeaseLost) {
			t.Fatalf("Retry of a job another claim holds: %v, want ErrLeaseLost", err)
		}
		if err := d.Retry(ctx, 0); !errors.Is(err, inbox.ErrSettled) {
			t.Fatalf("second Retry: %v, want ErrSettled", err)
		}
		if err := taken.Release(ctx); err != nil {
			t.Fatal(err)
		}
		sameRows(t, "a Retry that lost the job", before, dumpRows(t, db1, plain))
		step("failed statement, Dead", 4, func(d *inbox.Delivery) error {
			if err := write(d, "dead"); err != nil {
				return err
			}
			if _, err := d.Tx().ExecContext(ctx, insert, d.ID(), "duplicate"); err == nil {
				return errors.New("a duplicate key was accepted")
			}
			d.SetError(errors.New("buried"))
			return d.Dead(ctx)
		})
		if dead, fx := attXDead(t, e, db1, plain), notes(); dead[concKey(id)] != "attempt=4 last_error=buried" || len(fx) != 0 {
			t.Fatalf("after a failed statement and Dead: dead %q, effects %q; want attempt 4 with the handler's error, none", dead, fx)
		}
		id = enqueueOne(t, q, db1, "acked")
		step("write, Ack", 1, func(d *inbox.Delivery) error {
			if err := write(d, "acked"); err != nil {
				return err
			}
			return d.Ack(ctx)
		})
		if fx := notes(); len(fx) != 1 || fx[0] != `"acked"` && fx[0] != "acked" {
			t.Fatalf("after write and Ack: effects %q, want the acked write", fx)
		}
		mustBeIdle(t, db1, q)
		mustBeIdle(t, db2, other)
	})
}

// TestRowLockDeadlockedHandlers: two handlers write through their
// transactions into each other's rows and deadlock. The victim's statement
// fails (MySQL and MariaDB roll its whole transaction back, savepoint and
// row lock included; PostgreSQL aborts it); both jobs' Retry still counts
// their attempt and neither keeps a write.
func TestRowLockDeadlockedHandlers(t *testing.T) {
	eachEngine(t, notSQLite, func(t *testing.T, e Engine) {
		db1, db2, plain, _, effects := attXSetup(t, e, "att_deadlock", "TEXT")
		q1 := newQueue(t, db1, queueConfig(e, attXTable(plain), nil))
		q2 := newQueue(t, db2, queueConfig(e, attXTable(plain), nil))
		ctx := context.Background()
		mustExec(t, e, db1, "INSERT INTO "+effects+" (job_id, note) VALUES (1, 'a'), (2, 'b')")
		ids := []any{enqueueOne(t, q1, db1, "x"), enqueueOne(t, q1, db1, "y")}
		var ds []*inbox.Delivery
		for _, q := range []*inbox.Queue{q1, q2} {
			got, err := q.Claim(ctx, 1)
			if err != nil || len(got) != 1 {
				t.Fatalf("claim: %d, %v", len(got), err)
			}
			ds = append(ds, got...)
		}
		update := bind(e, "UPDATE "+effects+" SET note = ? WHERE job_id = ?")
		for i, d := range ds {
			if _, err := d.Tx().ExecContext(ctx, update, "mine", i+1); err != nil {
				t.Fatal(err)
			}
		}
		errs := make(chan error, 2)
		for i, d := range ds {
			go func() {
				_, err := d.Tx().ExecContext(ctx, update, "yours", 2-i)
				errs <- err
			}()
		}
		var failed int
		for range ds {
			if err := workXRecv(t, errs, "the crossed writes"); err != nil {
				failed++
				t.Logf("FIGURE: %s: the deadlock's victim: %v", e.Name, err)
			}
		}
		if failed == 0 {
			t.Fatal("the crossed writes did not deadlock")
		}
		for _, d := range ds {
			d.SetError(errors.New("deadlocked"))
			if err := d.Retry(ctx, 0); err != nil {
				t.Fatalf("Retry of job %v: %v", d.ID(), err)
			}
		}
		for _, id := range ids {
			if a := attemptOf(t, e, db1, plain, id); a != 2 {
				t.Errorf("job %v: attempt %d after Retry, want 2", id, a)
			}
		}
		if rows := dumpRows(t, db1, effects); len(rows) != 2 || strings.Contains(strings.Join(rows, " "), "mine") || strings.Contains(strings.Join(rows, " "), "yours") {
			t.Errorf("effects %q: a failed attempt's write stayed", rows)
		}
		mustBeIdle(t, db1, q1)
		mustBeIdle(t, db2, q2)
	})
}

// TestRowLockClaimDeadline (issue 21, item 9): a row-lock Claim whose
// context ends while it waits for a pool connection returns then, with the
// context's error, however long the pool stays busy.
func TestRowLockClaimDeadline(t *testing.T) {
	eachEngine(t, notSQLite, func(t *testing.T, e Engine) {
		const conns = 3
		db := e.Open(t, conns)
		table := concTable(t, e, db, "att_deadline")
		q := newQueue(t, db, queueConfig(e, Table(table, "rowlock"), nil))
		enqueueOne(t, q, db, "d")
		ctx := context.Background()
		// The caller's own work takes every connection: the pool rule
		// counts jobs in work, which are none, so the claim must wait.
		var busy []*sql.Conn
		for range conns {
			c, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			busy = append(busy, c)
		}
		const patience = 5 * time.Second
		freed := make(chan time.Time, 1)
		timer := time.AfterFunc(patience, func() {
			freed <- time.Now()
			for _, c := range busy {
				_ = c.Close()
			}
		})
		claimCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		ds, err := q.Claim(claimCtx, 1)
		took := time.Since(start)
		returned := time.Now()
		t.Logf("FIGURE: %s: a Claim with a 300ms deadline on a busy pool returned after %v: %d jobs, %v", e.Name, took.Round(time.Millisecond), len(ds), err)
		if timer.Stop() {
			for _, c := range busy {
				_ = c.Close()
			}
		} else if at := <-freed; !returned.Before(at) {
			t.Errorf("Claim returned only once the pool's connections were freed, %v after its start", at.Sub(start).Round(time.Millisecond))
		}
		if !errors.Is(err, context.DeadlineExceeded) || len(ds) != 0 {
			t.Errorf("Claim: %d jobs, %v; want none and the deadline", len(ds), err)
		}
		if d := claimOne(t, q); d.Attempt() != 1 {
			t.Errorf("attempt %d after the failed claim, want 1", d.Attempt())
		} else if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
		mustBeIdle(t, db, q)
	})
}

// TestCutRowLockClaimsRelease (issue 21, item 9): a holder whose session is
// cut ended without settling, whatever it calls after: its Release fails
// and the claims table keeps its count, so that a job whose holders keep
// being cut reaches MaxClaims and the dead table.
func TestCutRowLockClaimsRelease(t *testing.T) {
	for _, e := range serverEngines() {
		t.Run(e.Name, func(t *testing.T) {
			ctx := context.Background()
			db := e.Open(t, 4)
			admin := e.Open(t, 2)
			table := fmt.Sprintf("cut_%s_claims_%d", e.Name, os.Getpid())
			checkAtEnd(e, table, 0)
			e.CreateTable(t, admin, table)
			t.Cleanup(func() { dropNow(t, admin, table, table+"_dead", table+"_claims") })
			q := newQueue(t, db, formConfig(e, table, "rowlock-claims", 0))
			id := enqueueOne(t, q, db, "cut")
			// A cut session's backend lets its row lock go as it exits,
			// after its error reached the client: the job is claimable
			// again soon, not at once.
			for cut := 1; cut <= ClaimsLimit+1; cut++ {
				var ds []*inbox.Delivery
				eventually(t, 30*time.Second, fmt.Sprintf("cut %d: the job claimed", cut), func() error {
					var err error
					ds, err = q.Claim(ctx, 1)
					if err != nil || len(ds) != 1 {
						return fmt.Errorf("claim: %d, %v (dead: %q)", len(ds), err, dumpRows(t, admin, table+"_dead"))
					}
					return nil
				})
				sid, err := sessionID(ctx, e, ds[0].Tx())
				if err != nil {
					t.Fatal(err)
				}
				terminateSession(t, e, admin, sid)
				err = ds[0].Release(ctx)
				claims := claimsCounted(t, e, admin, table, id)
				t.Logf("FIGURE: %s: cut %d: Release: %v; claims counted %d", e.Name, cut, err, claims)
				if err == nil {
					t.Errorf("cut %d: the cut holder's Release succeeded", cut)
				}
				if claims != cut {
					t.Fatalf("cut %d: claims %d, want %d: a cut holder's delivery must count", cut, claims, cut)
				}
			}
			eventually(t, 30*time.Second, "the job moved dead by the claim past MaxClaims", func() error {
				ds, err := q.Claim(ctx, 1)
				if err != nil || len(ds) != 0 {
					t.Fatalf("claim past MaxClaims: %d, %v; want nothing", len(ds), err)
				}
				if dead := dumpRows(t, admin, table+"_dead"); len(dead) != 1 {
					return fmt.Errorf("dead table %q, want the job", dead)
				}
				return nil
			})
		})
	}
}

// TestRowLockFailedAttemptsCut: eight worker.Run loops over two pools, one
// naming the table plainly and the other by its qualified name, each
// loop's context ended at a random point and the loop run again. The
// handler writes a shipment through Delivery.Tx and fails its first two
// attempts. Whatever the cuts (a job whose loop stops is released, its
// writes rolled back), each job ends acknowledged with the one shipment of
// the attempt that succeeded: none of a failed or released attempt's.
func TestRowLockFailedAttemptsCut(t *testing.T) {
	eachEngine(t, notSQLite, func(t *testing.T, e Engine) {
		const jobs = 40
		db1, db2, plain, qualified, effects := attXSetup(t, e, "att_cut", "TEXT")
		q1 := newQueue(t, db1, queueConfig(e, attXTable(plain), nil))
		q2 := newQueue(t, db2, queueConfig(e, attXTable(qualified), nil))
		for i := range jobs {
			enqueueOne(t, q1, db1, fmt.Sprintf("order-%d", i))
		}
		insert := bind(e, "INSERT INTO "+effects+" (job_id, note) VALUES (?, ?)")
		var mu sync.Mutex
		var failures []error
		runs := 0
		// No grace period: a cut ends the handler's context, and may land
		// on its statement through the held transaction.
		cfg := worker.Config{Poll: workXPoll, Grace: -1, Backoff: func(int) time.Duration { return 0 }, OnError: func(err error) {
			mu.Lock()
			failures = append(failures, err)
			mu.Unlock()
		}}
		handle := func(ctx context.Context, d *inbox.Delivery) error {
			mu.Lock()
			runs++
			mu.Unlock()
			if _, err := d.Tx().ExecContext(ctx, insert, d.ID(), fmt.Sprintf("attempt %d", d.Attempt())); err != nil {
				return err
			}
			if d.Attempt() < 3 {
				return fmt.Errorf("carrier down on attempt %d", d.Attempt())
			}
			return nil
		}
		start := time.Now()
		workXRunCut(t, []*inbox.Queue{q1, q2}, attXLoops, cfg, handle, func() int {
			return countRows(t, db1, plain) + countRows(t, db1, plain+"_dead")
		})
		mu.Lock()
		defer mu.Unlock()
		// A cut that lands on a handler's statement through the held
		// transaction breaks its connection (lib/pq and go-sql-driver/mysql
		// close it, pgx too): the job's Release or Ack then fails, and the
		// job comes back with its writes rolled back, which the shipments
		// below show.
		t.Logf("FIGURE: %s: %d jobs acknowledged after %v: %d handler runs, %d settlements failed on a connection the cut broke, loops cut at random",
			e.Name, jobs, time.Since(start).Round(time.Millisecond), runs, len(failures))
		for _, err := range failures {
			// A failed attempt's verdict never fails: its loop was not
			// cut, or it would have released the job.
			if msg := err.Error(); strings.HasPrefix(msg, "inbox: retry") || strings.HasPrefix(msg, "inbox: dead") {
				t.Errorf("a failed attempt's settlement failed: %v", err)
			}
		}
		rows := dumpRows(t, db1, effects)
		if len(rows) != jobs {
			t.Errorf("%d shipments for %d jobs", len(rows), jobs)
		}
		for _, r := range rows {
			if note := rowFields(r)["note"]; !strings.Contains(note, "attempt 3") {
				t.Errorf("shipment %s: written by a failed attempt", r)
			}
		}
		idleSoon(t, db1, q1)
		idleSoon(t, db2, q2)
	})
}
