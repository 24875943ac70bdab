package inbox

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
)

// With the real clock a keeper's goroutine starts only when the first
// extension is due. These tests look inside the keeper, as what they check
// (no goroutine, which timers are armed) cannot be seen from outside
// without waiting half a lease.

// keeperGoroutines counts the goroutines running a keeper.
func keeperGoroutines() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "created by github.com/sqlinbox/inbox.(*keeper).startLocked")
}

func stateOf(k *keeper) keeperState {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.state
}

func pollFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// A handler that returns within half a lease never has a keeper goroutine,
// and its stop leaves no timer armed.
func TestKeeperIdleUntilHalfLease(t *testing.T) {
	db, sm := btMock(t)
	q := btNew(t, db, Postgres, false)
	before := keeperGoroutines()
	d := btDel(q, int64(1), 1, btExp)
	d.sentAt = time.Now()
	kctx, stop := d.Keep(context.Background())
	k := d.keeper
	if s := stateOf(k); s != keeperWaiting {
		t.Fatalf("state %d after Keep, want waiting", s)
	}
	if n := keeperGoroutines() - before; n != 0 {
		t.Fatalf("%d keeper goroutines after Keep, want none before half the lease", n)
	}
	if n := q.InWork(); n != 1 {
		t.Fatalf("InWork %d with a keeper waiting, want 1", n)
	}
	stop()
	if s := stateOf(k); s != keeperEnded {
		t.Fatalf("state %d after stop, want ended", s)
	}
	if k.start.Stop() {
		t.Fatal("the start timer was still armed after stop")
	}
	if n := q.InWork(); n != 0 {
		t.Fatalf("InWork %d after stop, want 0", n)
	}
	if cause := context.Cause(kctx); !errors.Is(cause, context.Canceled) {
		t.Fatalf("cause after stop %v, want context.Canceled", cause)
	}
	btMet(t, sm)
}

// At half the lease the keeper's goroutine starts and extends.
func TestKeeperStartsWhenExtensionDue(t *testing.T) {
	db, sm := btMock(t)
	q := btNew(t, db, Postgres, false)
	d := btDel(q, int64(1), 1, btExp)
	d.sentAt = time.Now().Add(-q.lease / 2) // the first extension is due now
	next := btExp.Add(time.Minute)
	sm.ExpectQuery(`UPDATE "jobs" SET "locked_until" = (statement_timestamp() + $1 * interval '1 microsecond') WHERE "id" = $2 AND "attempt" = $3 AND "locked_until" = $4 RETURNING "locked_until"`).
		WithArgs(q.lease.Microseconds(), int64(1), int64(2), btExp).
		WillReturnRows(sqlmock.NewRows([]string{"locked_until"}).AddRow(next))
	kctx, stop := d.Keep(context.Background())
	k := d.keeper
	pollFor(t, "the extension", func() bool { return d.Expiry().Equal(next) })
	if s := stateOf(k); s != keeperRunning {
		t.Fatalf("state %d after an extension, want running", s)
	}
	stop()
	if err := kctx.Err(); err == nil || errors.Is(context.Cause(kctx), ErrLeaseLost) {
		t.Fatalf("after stop: %v (%v), want cancelled without ErrLeaseLost", err, context.Cause(kctx))
	}
	btMet(t, sm)
}

// A keeper paused before its goroutine started (a settlement without a
// verdict, Shutdown) starts none, and its deadline cancels the handler with
// ErrLeaseLost.
func TestKeeperHeldBeforeStart(t *testing.T) {
	db, sm := btMock(t)
	q := btNew(t, db, Postgres, false)
	before := keeperGoroutines()
	d := btDel(q, int64(1), 1, btExp)
	d.sentAt = time.Now()
	kctx, stop := d.Keep(context.Background())
	defer stop()
	k := d.keeper
	if err := q.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := stateOf(k); s != keeperHeld {
		t.Fatalf("state %d after Shutdown, want held", s)
	}
	k.mu.Lock()
	giveUp := k.giveUp
	k.mu.Unlock()
	if want := d.sentAt.Add(q.lease - q.margin); !giveUp.Equal(want) {
		t.Fatalf("deadline %v, want the claim's expiry less the margin, %v", giveUp, want)
	}
	// A run of the start timer that raced the pause is early: it must
	// neither start the keeper nor cancel.
	k.started()
	if s := stateOf(k); s != keeperHeld {
		t.Fatalf("state %d after an early run of the timer, want held", s)
	}
	if kctx.Err() != nil {
		t.Fatalf("the pause ended the handler's context: %v", context.Cause(kctx))
	}
	// The deadline lies a lease less the margin after the claim; move it
	// to now and fire the timer that stands for it.
	k.mu.Lock()
	k.giveUp = time.Time{}
	k.mu.Unlock()
	k.start.Reset(0)
	select {
	case <-kctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the deadline did not cancel the handler's context")
	}
	if cause := context.Cause(kctx); !errors.Is(cause, ErrLeaseLost) {
		t.Fatalf("cause %v, want ErrLeaseLost", cause)
	}
	if n := keeperGoroutines() - before; n != 0 {
		t.Fatalf("%d keeper goroutines, want none", n)
	}
	btMet(t, sm)
}

// TestKeepRacesPause pauses and settles a delivery from other goroutines
// while Keep sets its keeper up: they must find the keeper whole (its start
// timer in place) or not at all.
func TestKeepRacesPause(t *testing.T) {
	f := newBTFake()
	q := btQueue(t, f)
	ctx := context.Background()
	for i := 0; i < 2000; i++ {
		ds, err := q.Claim(ctx, 1)
		if err != nil || len(ds) != 1 {
			t.Fatal(len(ds), err)
		}
		d := ds[0]
		paused := make(chan struct{})
		started := make(chan struct{})
		go func() {
			defer close(paused)
			close(started)
			// Pause the moment the keeper is visible, to land in Keep's
			// set-up if it is not done under the keeper's lock.
			for j := 0; j < 1_000_000; j++ {
				d.mu.Lock()
				k := d.keeper
				d.mu.Unlock()
				if k != nil {
					d.pauseKeeper()
					return
				}
				if j%1000 == 999 {
					runtime.Gosched()
				}
			}
		}()
		<-started
		_, stop := d.Keep(ctx)
		<-paused
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
		stop()
	}
	if n := q.InWork(); n != 0 {
		t.Fatalf("%d deliveries still tracked after every keeper ended", n)
	}
}
