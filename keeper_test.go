package inbox

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqlinbox/inbox/internal/fakedb"
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

// waitLeaseLost waits for the keeper's deadline to cancel the handler's
// context, with ErrLeaseLost as its cause.
func waitLeaseLost(t *testing.T, kctx context.Context) {
	t.Helper()
	select {
	case <-kctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the deadline did not cancel the handler's context")
	}
	if cause := context.Cause(kctx); !errors.Is(cause, ErrLeaseLost) {
		t.Fatalf("cause %v, want ErrLeaseLost", cause)
	}
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
	d.lease.sentAt = time.Now()
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
	d.lease.sentAt = time.Now().Add(-q.lease / 2) // the first extension is due now
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
	d.lease.sentAt = time.Now()
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
	if want := d.lease.sentAt.Add(q.lease - q.margin); !giveUp.Equal(want) {
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
	waitLeaseLost(t, kctx)
	if n := keeperGoroutines() - before; n != 0 {
		t.Fatalf("%d keeper goroutines, want none", n)
	}
	btMet(t, sm)
}

// TestKeepRacesPause pauses and settles a delivery from other goroutines
// while Keep sets its keeper up: they must find the keeper whole (its start
// timer in place) or not at all.
func TestKeepRacesPause(t *testing.T) {
	f := fakedb.NewLease()
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

// The keepers of one claim kept through a keepStarter arm no timer each:
// the starter's one timer stands for all, and quick handlers end them
// before it runs.
func TestKeepStarterOneTimer(t *testing.T) {
	db, sm := btMock(t)
	q := btNew(t, db, Postgres, false)
	before := keeperGoroutines()
	sent := time.Now()
	s := newKeepStarter(q, sent, 3)
	var stops []func()
	var ks []*keeper
	for i := 0; i < 3; i++ {
		d := btDel(q, int64(i+1), 1, btExp)
		d.lease.sentAt = sent
		_, stop := d.keep(context.Background(), s)
		stops = append(stops, stop)
		ks = append(ks, d.keeper)
	}
	for i, k := range ks {
		if k.start != nil {
			t.Errorf("keeper %d armed a start timer of its own", i)
		}
		if st := stateOf(k); st != keeperWaiting {
			t.Errorf("keeper %d: state %d, want waiting", i, st)
		}
	}
	if s.timer == nil {
		t.Fatal("the starter armed no timer")
	}
	// A delivery of another claim is not the starter's.
	other := btDel(q, int64(9), 1, btExp)
	other.lease.sentAt = sent.Add(time.Millisecond)
	_, stopOther := other.keep(context.Background(), s)
	if other.keeper.start == nil {
		t.Error("a keeper of another claim was taken by the starter")
	}
	stopOther()
	for _, stop := range stops {
		stop()
	}
	s.stop()
	if s.timer.Stop() {
		t.Error("the starter's timer was still armed after stop")
	}
	if n := keeperGoroutines() - before; n != 0 {
		t.Errorf("%d keeper goroutines, want none before half the lease", n)
	}
	if n := q.InWork(); n != 0 {
		t.Errorf("InWork %d after every keeper ended", n)
	}
	btMet(t, sm)
}

// When the first extension is due, the starter starts every keeper still
// waiting, and each extends its own lease.
func TestKeepStarterStarts(t *testing.T) {
	db, sm := btMock(t)
	sm.MatchExpectationsInOrder(false)
	q := btNew(t, db, Postgres, false)
	sent := time.Now().Add(-q.lease / 2) // due now
	s := newKeepStarter(q, sent, 2)
	defer s.stop()
	next := btExp.Add(time.Minute)
	var ds []*Delivery
	var stops []func()
	// Every expectation is set before the first keeper starts: the first
	// extension is due at once, and sqlmock is not to be given expectations
	// while a query runs.
	for i := 0; i < 2; i++ {
		sm.ExpectQuery(`UPDATE "jobs" SET "locked_until" = (statement_timestamp() + $1 * interval '1 microsecond') WHERE "id" = $2 AND "attempt" = $3 AND "locked_until" = $4 RETURNING "locked_until"`).
			WithArgs(q.lease.Microseconds(), int64(i+1), int64(2), btExp).
			WillReturnRows(sqlmock.NewRows([]string{"locked_until"}).AddRow(next))
	}
	for i := 0; i < 2; i++ {
		d := btDel(q, int64(i+1), 1, btExp)
		d.lease.sentAt = sent
		_, stop := d.keep(context.Background(), s)
		ds, stops = append(ds, d), append(stops, stop)
	}
	for i, d := range ds {
		pollFor(t, fmt.Sprintf("keeper %d's extension", i), func() bool { return d.Expiry().Equal(next) })
	}
	for _, stop := range stops {
		stop()
	}
	btMet(t, sm)
}

// A keeper of the starter paused before it started (Shutdown) stays held
// with no timer of its own: the starter runs again at the deadline, and
// then cancels its handler with ErrLeaseLost.
func TestKeepStarterHeldDeadline(t *testing.T) {
	db, sm := btMock(t)
	q := btNew(t, db, Postgres, false)
	sent := time.Now()
	s := newKeepStarter(q, sent, 1)
	defer s.stop()
	d := btDel(q, int64(1), 1, btExp)
	d.lease.sentAt = sent
	kctx, stop := d.keep(context.Background(), s)
	defer stop()
	k := d.keeper
	if err := q.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := stateOf(k); st != keeperHeld || k.start != nil {
		t.Fatalf("after Shutdown: state %d, own timer %v; want held, none", st, k.start != nil)
	}
	// The start runs before the deadline: the keeper stays held, and the
	// starter keeps it for the deadline.
	s.fire()
	if kctx.Err() != nil {
		t.Fatalf("the start ended a held keeper's handler: %v", context.Cause(kctx))
	}
	s.mu.Lock()
	kept := len(s.ks)
	s.mu.Unlock()
	if st := stateOf(k); st != keeperHeld || kept != 1 {
		t.Fatalf("after the start: state %d, %d keepers kept; want held, 1", st, kept)
	}
	// At the deadline (moved to now) the starter's next run cancels.
	k.mu.Lock()
	k.giveUp = time.Now()
	k.mu.Unlock()
	s.mu.Lock()
	s.timer.Reset(0)
	s.mu.Unlock()
	waitLeaseLost(t, kctx)
	btMet(t, sm)
}

// A KeepGroup starts the keepers of one claim on the group's one timer,
// none of their own; Pause holds every keeper of the group, one kept after
// the pause included, until its deadline; Stop disarms the timer. Under the
// row lock a group keeps nothing.
func TestKeepGroup(t *testing.T) {
	db, sm := btMock(t)
	q := btNew(t, db, Postgres, false)
	sent := time.Now()
	var ds []*Delivery
	for i := 0; i < 3; i++ {
		d := btDel(q, int64(i+1), 1, btExp)
		d.lease.sentAt = sent
		ds = append(ds, d)
	}
	g := NewKeepGroup(ds)
	var stops []func()
	for _, d := range ds[:2] {
		_, stop := g.Keep(context.Background(), d)
		stops = append(stops, stop)
		if d.keeper.start != nil {
			t.Errorf("keeper of %v armed a start timer of its own", d.ID())
		}
	}
	if g.starter == nil || g.starter.timer == nil {
		t.Fatal("the group armed no shared timer")
	}
	g.Pause()
	_, stop := g.Keep(context.Background(), ds[2])
	stops = append(stops, stop)
	for _, d := range ds {
		if st := stateOf(d.keeper); st != keeperHeld {
			t.Errorf("keeper of %v: state %d after Pause, want held", d.ID(), st)
		}
	}
	if n := q.InWork(); n != 3 {
		t.Errorf("InWork %d with three keepers, want 3", n)
	}
	for _, stop := range stops {
		stop()
	}
	g.Stop()
	if g.starter.timer.Stop() {
		t.Error("the group's timer was still armed after Stop")
	}
	if n := q.InWork(); n != 0 {
		t.Errorf("InWork %d after every keeper ended", n)
	}
	btMet(t, sm)

	// A single delivery's group times its keeper itself.
	one := btDel(q, int64(9), 1, btExp)
	one.lease.sentAt = time.Now()
	g1 := NewKeepGroup([]*Delivery{one})
	_, stop1 := g1.Keep(context.Background(), one)
	if g1.starter != nil || one.keeper.start == nil {
		t.Error("a group of one shares a timer")
	}
	g1.Pause()
	if st := stateOf(one.keeper); st != keeperHeld {
		t.Errorf("keeper of a group of one: state %d after Pause, want held", st)
	}
	stop1()
	g1.Stop()

	rl, err := New(db, Config{Dialect: Postgres, Table: Table{Name: "jobs"}})
	if err != nil {
		t.Fatal(err)
	}
	d := &Delivery{q: rl, id: int64(1), attempt: 1}
	rg := NewKeepGroup([]*Delivery{d, d})
	kctx, stopRL := rg.Keep(context.Background(), d)
	if d.keeper != nil || rg.starter != nil {
		t.Error("a row-lock group keeps")
	}
	rg.Pause()
	stopRL()
	rg.Stop()
	if kctx.Err() == nil {
		t.Error("stop left the row-lock handler's context running")
	}
}
