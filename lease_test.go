package inbox_test

// Keeper tests: a fake clock drives Delivery.Keep through Config.Now and
// Config.After, and sqlmock answers its extensions.

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/fakeclock"
)

// eventually polls cond until it holds, failing the test after 10s.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// keepers returns the ids of the goroutines running a keeper, from a dump of
// every goroutine's stack: exact where a count of goroutines would also see
// those of other tests coming and going.
func keepers() map[string]bool {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	ids := map[string]bool{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		// Matched by its creator: a goroutine not yet scheduled shows
		// the go-statement wrapper rather than keeper.run.
		if strings.Contains(g, "created by github.com/sqlinbox/inbox.(*keeper).startLocked") {
			ids[strings.Fields(g)[1]] = true
		}
	}
	return ids
}

// startedKeeper returns the id of the one keeper goroutine not in before.
func startedKeeper(t testing.TB, before map[string]bool) string {
	t.Helper()
	var started []string
	for id := range keepers() {
		if !before[id] {
			started = append(started, id)
		}
	}
	if len(started) != 1 {
		t.Fatalf("%d keeper goroutines started, want 1", len(started))
	}
	return started[0]
}

// keeperGone waits until the keeper goroutine id has ended.
func keeperGone(t testing.TB, id string) {
	t.Helper()
	eventually(t, "keeper goroutine "+id+" gone", func() bool { return !keepers()[id] })
}

// done waits for ctx to end, failing the test after 10s.
func done(t testing.TB, ctx context.Context) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("context not cancelled within 10s")
	}
}

// keeperSetup claims job 7 (attempt 1) at utc0 on a Postgres lease queue
// of one minute driven by clk.
func keeperSetup(t *testing.T, clk *fakeclock.Clock, margin time.Duration) (*mock, *inbox.Queue, *inbox.Delivery) {
	t.Helper()
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable, Lease: time.Minute,
		Now: clk.Now, After: clk.After, KeepMargin: margin})
	m.ExpectQuery(pgLeaseClaimInjected).WithArgs(1, at(utc0), 1, 1, at(utc0.Add(time.Minute))).
		WillReturnRows(rows("id,attempt,locked_until,payload", row(int64(7), int64(1), utc0.Add(time.Minute), []byte("p"))))
	d := claim(t, q, 1, 7)[0]
	return m, q, d
}

// A keeper extends every half lease, each time with the expiry the last
// extension wrote as the token: five minutes of work on a one-minute lease.
func TestKeeperExtendsEveryHalfLease(t *testing.T) {
	clk := fakeclock.New(t0)
	m, q, d := keeperSetup(t, clk, 0)
	ctx, stop := d.Keep(context.Background())
	defer stop()
	token := utc0.Add(time.Minute)
	for i := 1; i <= 10; i++ {
		if w, want := clk.Next(t), clk.Now().Add(30*time.Second); !w.Equal(want) {
			t.Fatalf("extension %d: keeper waits until %v, want half a lease later, %v", i, w, want)
		}
		next := utc0.Add(time.Duration(i)*30*time.Second + time.Minute)
		m.ExpectExec(pgLeaseExtendInjected).WithArgs(at(next), int64(7), int64(2), at(token)).WillReturnResult(affected(1))
		clk.Advance(30 * time.Second)
		clk.Next(t) // the extension is done once the keeper waits again
		if got := d.Expiry(); !got.Equal(next) {
			t.Fatalf("extension %d: Expiry() = %v, want %v", i, got, next)
		}
		token = next
		if ctx.Err() != nil {
			t.Fatalf("extension %d: handler context ended: %v", i, context.Cause(ctx))
		}
	}
	if q.InWork() != 1 {
		t.Errorf("InWork() = %d with a keeper running, want 1", q.InWork())
	}
	m.ExpectExec(pgLeaseAck).WithArgs(int64(7), int64(2), at(token)).WillReturnResult(affected(1))
	ok(t, "Ack after five minutes", d.Ack(context.Background()))
	m.Met(t)
}

// An extension that finds the token gone cancels the handler's context
// with cause ErrLeaseLost, and the delivery is finished.
func TestKeeperLeaseLost(t *testing.T) {
	clk := fakeclock.New(t0)
	m, q, d := keeperSetup(t, clk, 0)
	before := keepers()
	ctx, stop := d.Keep(context.Background())
	defer stop()
	id := startedKeeper(t, before)
	clk.Next(t)
	m.ExpectExec(pgLeaseExtendInjected).WithArgs(at(utc0.Add(90*time.Second)), int64(7), int64(2), at(utc0.Add(time.Minute))).
		WillReturnResult(affected(0))
	// Within the lease the row is read: there, another's (a later attempt).
	m.ExpectQuery(q.Statements().Settle.Verdict.SQL).WithArgs(int64(7)).
		WillReturnRows(sqlmock.NewRows([]string{"attempt", "locked_until"}).AddRow(int64(3), utc0.Add(2*time.Minute)))
	clk.Advance(30 * time.Second)
	done(t, ctx)
	if cause := context.Cause(ctx); !errors.Is(cause, inbox.ErrLeaseLost) || errors.Is(cause, inbox.ErrCancelled) {
		t.Fatalf("cause = %v, want ErrLeaseLost alone", cause)
	}
	m.Quiet(t, "Ack after a lost lease", func() {
		if err := d.Ack(context.Background()); !errors.Is(err, inbox.ErrSettled) {
			t.Errorf("Ack after a lost lease = %v, want ErrSettled", err)
		}
	})
	keeperGone(t, id)
	if q.InWork() != 0 {
		t.Errorf("InWork() = %d after the keeper ended", q.InWork())
	}
	m.Met(t)
}

// An extension that finds the row gone within the lease (Queue.Cancel
// deleted it: no other claim could have taken it) cancels the handler's
// context with cause ErrCancelled, which matches ErrLeaseLost too.
func TestKeeperCancelled(t *testing.T) {
	clk := fakeclock.New(t0)
	m, q, d := keeperSetup(t, clk, 0)
	ctx, stop := d.Keep(context.Background())
	defer stop()
	clk.Next(t)
	m.ExpectExec(pgLeaseExtendInjected).WithArgs(at(utc0.Add(90*time.Second)), int64(7), int64(2), at(utc0.Add(time.Minute))).
		WillReturnResult(affected(0))
	m.ExpectQuery(q.Statements().Settle.Verdict.SQL).WithArgs(int64(7)).WillReturnRows(sqlmock.NewRows([]string{"attempt", "locked_until"}))
	clk.Advance(30 * time.Second)
	done(t, ctx)
	if cause := context.Cause(ctx); !errors.Is(cause, inbox.ErrCancelled) || !errors.Is(cause, inbox.ErrLeaseLost) {
		t.Fatalf("cause = %v, want ErrCancelled, matching ErrLeaseLost", cause)
	}
	m.Quiet(t, "Ack after a cancel", func() {
		if err := d.Ack(context.Background()); !errors.Is(err, inbox.ErrSettled) || !errors.Is(err, inbox.ErrCancelled) {
			t.Errorf("Ack after a cancel = %v, want ErrSettled and ErrCancelled", err)
		}
	})
	m.Met(t)
}

// Past the lease a row gone may be another claim's acknowledged job: no
// read, ErrLeaseLost.
func TestExtendGoneAfterLease(t *testing.T) {
	clk := fakeclock.New(t0)
	m, _, d := keeperSetup(t, clk, 0)
	clk.Advance(time.Minute)
	m.ExpectExec(pgLeaseExtendInjected).WithArgs(at(utc0.Add(2*time.Minute)), int64(7), int64(2), at(utc0.Add(time.Minute))).
		WillReturnResult(affected(0))
	if err := d.Extend(context.Background()); !errors.Is(err, inbox.ErrLeaseLost) || errors.Is(err, inbox.ErrCancelled) {
		t.Fatalf("Extend past the lease = %v, want ErrLeaseLost alone", err)
	}
	m.Met(t)
}

// Extensions failing with driver errors are retried; when the clock reaches
// the last known expiry less KeepMargin the keeper cancels the handler,
// before the lease runs out, without sending a doomed extension.
func TestKeeperGivesUpBeforeExpiry(t *testing.T) {
	errDown := errors.New("connection refused")
	for _, tc := range []struct {
		name   string
		margin time.Duration
		// fails are the instants (after the claim) of the extensions that
		// fail: first at half the lease, then every tenth of it.
		fails  []time.Duration
		giveUp time.Duration
	}{
		{"default margin, a tenth", 0, []time.Duration{30 * time.Second, 36 * time.Second, 42 * time.Second, 48 * time.Second}, 54 * time.Second},
		{"margin 20s", 20 * time.Second, []time.Duration{30 * time.Second, 36 * time.Second}, 40 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := fakeclock.New(t0)
			m, _, d := keeperSetup(t, clk, tc.margin)
			before := keepers()
			ctx, stop := d.Keep(context.Background())
			defer stop()
			id := startedKeeper(t, before)
			expiry := utc0.Add(time.Minute)
			for _, at0 := range tc.fails {
				w := clk.Next(t)
				if want := t0.Add(at0); !w.Equal(want) {
					t.Fatalf("keeper waits until %v, want %v", w.Sub(t0), at0)
				}
				m.ExpectExec(pgLeaseExtendInjected).WithArgs(at(utc0.Add(at0+time.Minute)), int64(7), int64(2), at(expiry)).
					WillReturnError(errDown)
				clk.Advance(w.Sub(clk.Now()))
				clk.Next(t)
				if ctx.Err() != nil {
					t.Fatalf("cancelled at %v, before the margin: %v", clk.Now().Sub(t0), context.Cause(ctx))
				}
			}
			m.Quiet(t, "giving up", func() {
				w := clk.Next(t)
				if want := t0.Add(tc.giveUp); !w.Equal(want) {
					t.Fatalf("keeper waits until %v, want %v", w.Sub(t0), tc.giveUp)
				}
				clk.Advance(w.Sub(clk.Now()))
				done(t, ctx)
			})
			if cause := context.Cause(ctx); !errors.Is(cause, inbox.ErrLeaseLost) {
				t.Fatalf("cause = %v, want ErrLeaseLost", cause)
			}
			if now := clk.Now(); !now.Before(expiry) {
				t.Errorf("cancelled at %v, not before the expiry %v", now, expiry)
			}
			if !d.Expiry().Equal(expiry) {
				t.Errorf("Expiry() = %v after failed extensions, want %v", d.Expiry(), expiry)
			}
			keeperGone(t, id)
			m.Met(t)
		})
	}
}

// A failed extension followed by a good one puts the keeper back on its
// half-lease schedule from the good one.
func TestKeeperRecovers(t *testing.T) {
	clk := fakeclock.New(t0)
	m, _, d := keeperSetup(t, clk, 0)
	ctx, stop := d.Keep(context.Background())
	defer stop()
	clk.Next(t)
	m.ExpectExec(pgLeaseExtendInjected).WithArgs(at(utc0.Add(90*time.Second)), int64(7), int64(2), at(utc0.Add(time.Minute))).
		WillReturnError(errors.New("connection reset"))
	clk.Advance(30 * time.Second)
	if w := clk.Next(t); !w.Equal(t0.Add(36 * time.Second)) {
		t.Fatalf("retry at %v, want 36s", w.Sub(t0))
	}
	m.ExpectExec(pgLeaseExtendInjected).WithArgs(at(utc0.Add(96*time.Second)), int64(7), int64(2), at(utc0.Add(time.Minute))).
		WillReturnResult(affected(1))
	clk.Advance(6 * time.Second)
	if w := clk.Next(t); !w.Equal(t0.Add(66 * time.Second)) {
		t.Fatalf("next extension at %v, want 66s", w.Sub(t0))
	}
	if ctx.Err() != nil || !d.Expiry().Equal(utc0.Add(96*time.Second)) {
		t.Fatalf("after recovery: ctx %v, expiry %v", context.Cause(ctx), d.Expiry())
	}
	stop()
	m.Met(t)
}

// stop() stops the keeper, cancels the context, and leaves no goroutine.
func TestKeeperStop(t *testing.T) {
	clk := fakeclock.New(t0)
	m, q, d := keeperSetup(t, clk, 0)
	before := keepers()
	ctx, stop := d.Keep(context.Background())
	id := startedKeeper(t, before)
	clk.Next(t)
	stop()
	if !errors.Is(context.Cause(ctx), context.Canceled) {
		t.Errorf("after stop: cause %v, want context.Canceled", context.Cause(ctx))
	}
	keeperGone(t, id)
	if q.InWork() != 0 {
		t.Errorf("InWork() = %d after stop, want 0", q.InWork())
	}
	m.Quiet(t, "a stopped keeper", func() { clk.Advance(5 * time.Minute) })
	stop() // twice is harmless
	m.Met(t)
}

// A settlement with a verdict ends the keeper for good.
func TestKeeperStoppedBySettlement(t *testing.T) {
	clk := fakeclock.New(t0)
	m, q, d := keeperSetup(t, clk, 0)
	before := keepers()
	ctx, stop := d.Keep(context.Background())
	defer stop()
	id := startedKeeper(t, before)
	clk.Next(t)
	m.ExpectExec(pgLeaseAck).WithArgs(int64(7), int64(2), at(utc0.Add(time.Minute))).WillReturnResult(affected(1))
	ok(t, "Ack", d.Ack(context.Background()))
	keeperGone(t, id)
	if q.InWork() != 0 {
		t.Errorf("InWork() = %d after Ack, want 0", q.InWork())
	}
	m.Quiet(t, "after Ack", func() { clk.Advance(5 * time.Minute) })
	if ctx.Err() != nil {
		t.Errorf("Ack cancelled the handler's context: %v", context.Cause(ctx))
	}
	m.Met(t)
}

// When nobody extends the lease any more and no verdict is known, the
// handler is stopped by the last known expiry less the margin: after
// Shutdown (the job keeps its lease and may still settle), and after a
// settlement that failed without a verdict (a driver error, or its context
// ended). The deadline holds whatever the clock does before it, and an
// extension made earlier moves it.
func TestKeeperFencesWithoutVerdict(t *testing.T) {
	for _, tc := range []struct {
		name string
		// stop ends the extensions, with expiry the token's expiry then.
		stop func(t *testing.T, m *mock, q *inbox.Queue, d *inbox.Delivery, expiry time.Time)
	}{
		{"Shutdown", func(t *testing.T, m *mock, q *inbox.Queue, _ *inbox.Delivery, _ time.Time) {
			m.Quiet(t, "Shutdown of a lease queue", func() { ok(t, "Shutdown", q.Shutdown(context.Background())) })
		}},
		{"Ack with a driver error", func(t *testing.T, m *mock, _ *inbox.Queue, d *inbox.Delivery, expiry time.Time) {
			errDown := errors.New("driver: bad connection")
			m.ExpectExec(pgLeaseAck).WithArgs(int64(7), int64(2), at(expiry)).WillReturnError(errDown)
			if err := d.Ack(context.Background()); !errors.Is(err, errDown) {
				t.Fatalf("Ack = %v, want the driver's error", err)
			}
		}},
		{"Ack with an ended context", func(t *testing.T, m *mock, _ *inbox.Queue, d *inbox.Delivery, _ time.Time) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			m.Quiet(t, "Ack with an ended context", func() {
				if err := d.Ack(ctx); !errors.Is(err, context.Canceled) {
					t.Fatalf("Ack = %v, want context.Canceled", err)
				}
			})
		}},
	} {
		for _, extended := range []bool{false, true} {
			name := tc.name
			if extended {
				name += " after an extension"
			}
			t.Run(name, func(t *testing.T) {
				clk := fakeclock.New(t0)
				m, q, d := keeperSetup(t, clk, 0)
				before := keepers()
				ctx, stop := d.Keep(context.Background())
				defer stop()
				id := startedKeeper(t, before)
				clk.WaitingFor(t, t0.Add(30*time.Second))
				expiry, giveUp := utc0.Add(time.Minute), t0.Add(54*time.Second)
				if extended {
					// Sent at 30s: the lease runs to 90s, the deadline is
					// 84s.
					next := utc0.Add(90 * time.Second)
					m.ExpectExec(pgLeaseExtendInjected).WithArgs(at(next), int64(7), int64(2), at(expiry)).WillReturnResult(affected(1))
					clk.Advance(30 * time.Second)
					clk.WaitingFor(t, t0.Add(60*time.Second))
					expiry, giveUp = next, t0.Add(84*time.Second)
				}
				tc.stop(t, m, q, d, expiry)
				clk.WaitingFor(t, giveUp)
				m.Quiet(t, "a keeper without a verdict", func() {
					clk.Advance(giveUp.Add(-time.Microsecond).Sub(clk.Now()))
				})
				if ctx.Err() != nil {
					t.Fatalf("handler stopped at %v, before the deadline %v: %v", clk.Now().Sub(t0), giveUp.Sub(t0), context.Cause(ctx))
				}
				if !keepers()[id] {
					t.Fatal("the keeper ended without a verdict, its deadline disarmed")
				}
				m.Quiet(t, "the deadline", func() {
					clk.Advance(time.Microsecond)
					done(t, ctx)
				})
				if cause := context.Cause(ctx); !errors.Is(cause, inbox.ErrLeaseLost) {
					t.Fatalf("cause = %v, want ErrLeaseLost", cause)
				}
				keeperGone(t, id)
				// The lease is still the job's until it expires: it may
				// settle.
				m.ExpectExec(pgLeaseAck).WithArgs(int64(7), int64(2), at(expiry)).WillReturnResult(affected(1))
				ok(t, "Ack after the deadline", d.Ack(context.Background()))
				if q.InWork() != 0 {
					t.Errorf("InWork() = %d after Ack", q.InWork())
				}
				m.Met(t)
			})
		}
	}
}

// Keep outside the lease form, or on a settled delivery, starts nothing and
// still hands back a context that stop cancels.
func TestKeepWithoutLease(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: rowLockTable})
	m.ExpectBegin()
	m.ExpectQuery(pgRowLockClaim).WithoutArgs().WillReturnRows(rows("id,attempt,payload", row(int64(7), int64(1), []byte("p"))))
	d := claim(t, q, 1, 7)[0]
	m.Quiet(t, "Keep and Extend under a row lock", func() {
		before := keepers()
		ctx, stop := d.Keep(context.Background())
		for id := range keepers() {
			if !before[id] {
				t.Errorf("Keep under a row lock started keeper goroutine %s", id)
			}
		}
		ok(t, "Extend under a row lock", d.Extend(context.Background()))
		if ctx.Err() != nil {
			t.Fatal("context done before stop")
		}
		stop()
		if ctx.Err() == nil {
			t.Fatal("stop did not cancel the context")
		}
	})
	m.ExpectExec(pgRowLockAck).WithArgs(int64(7)).WillReturnResult(affected(1))
	m.ExpectCommit()
	ok(t, "Ack", d.Ack(context.Background()))
	m.Quiet(t, "Keep after settling", func() {
		ctx, stop := d.Keep(context.Background())
		stop()
		if ctx.Err() == nil {
			t.Fatal("stop did not cancel the context")
		}
	})
	m.Met(t)
}
