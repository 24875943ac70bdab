package inbox

import (
	"database/sql"
	"runtime"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
)

// TestPoolRegistryReleased: the pool rule's registry keeps a pool's count
// while a queue on it lives, shares it between queues, and lets it go with
// the last queue, so that it never keeps a pool reachable.
func TestPoolRegistryReleased(t *testing.T) {
	db, _, err := sqlmock.New()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	registered := func() bool {
		holdsMu.Lock()
		defer holdsMu.Unlock()
		_, ok := holdsFor[db]
		return ok
	}
	newQueue := func() *Queue {
		q, err := New(db, Config{Dialect: Postgres, Table: Table{Name: "jobs"}})
		if err != nil {
			t.Fatal(err)
		}
		return q
	}
	a, b := newQueue(), newQueue()
	if a.holds != b.holds || !registered() {
		t.Fatal("two queues on one pool do not share its count")
	}
	runtime.KeepAlive(a)
	a = nil
	deadline := time.Now().Add(30 * time.Second)
	// b still lives: the entry must stay while a is collected.
	for i := 0; i < 5; i++ {
		runtime.GC()
	}
	if !registered() {
		t.Fatal("the entry went while a queue on the pool lives")
	}
	runtime.KeepAlive(b)
	b = nil
	for registered() {
		if time.Now().After(deadline) {
			t.Fatal("the pool is still registered after its last queue was collected")
		}
		runtime.GC()
		runtime.Gosched() // finalizers run on a goroutine of their own
	}
}

// TestPollDuties: the idle Work loops of one table, as described, on one
// pool share one poll duty; another name (another schema's table of the same
// bare name, or another spelling), or another pool, has its own; the entry
// goes with the last loop, so that it keeps no pool reachable.
func TestPollDuties(t *testing.T) {
	open := func() *sql.DB {
		db, _, err := sqlmock.New()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	db1, db2 := open(), open()
	queue := func(db *sql.DB, name string) *Queue {
		q, err := New(db, Config{Dialect: Postgres, Table: Table{Name: name, LockedUntil: "locked_until"}})
		if err != nil {
			t.Fatal(err)
		}
		return q
	}
	jobs := queue(db1, "jobs")
	a, b := acquireDuty(jobs), acquireDuty(queue(db1, "jobs"))
	if a != b {
		t.Error("two loops of one table on one pool have two poll duties")
	}
	if jobs.bell != queue(db1, "tenant.jobs").bell {
		t.Error("jobs and tenant.jobs do not share their wake-ups")
	}
	for _, other := range []*Queue{queue(db1, "tenant.jobs"), queue(db1, "public.jobs"), queue(db2, "jobs")} {
		d := acquireDuty(other)
		if d == a {
			t.Errorf("%s on pool %p shares the poll duty of jobs on pool %p", other.names.Raw.Name, other.db, db1)
		}
		if ok, _ := d.take(); !ok {
			t.Errorf("%s cannot poll", other.names.Raw.Name)
		}
		d.drop()
		d.release()
	}
	if ok, _ := a.take(); !ok {
		t.Fatal("the first loop cannot take the polling")
	}
	ok, free := b.take()
	if ok {
		t.Fatal("a second loop of the same table polls too")
	}
	a.drop()
	select {
	case <-free:
	default:
		t.Error("dropping the polling does not tell the waiting loop")
	}
	a.release()
	b.release()
	dutiesMu.Lock()
	defer dutiesMu.Unlock()
	if len(duties) != 0 {
		t.Errorf("%d poll duties left after every loop returned", len(duties))
	}
}
