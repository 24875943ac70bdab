package inbox

import (
	"context"
	"testing"
	"time"
)

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
