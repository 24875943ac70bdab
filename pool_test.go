package inbox

import (
	"testing"

	"github.com/DATA-DOG/go-sqlmock"
)

// TestInWorkRegistryShrinks: the registry of what jobs in work hold keeps
// a pool's connections and a scope's keys while something is held, shares
// them between queues, and drops the entry with the last hold, so that it
// never keeps a pool reachable nor grows with the queues made.
func TestInWorkRegistryShrinks(t *testing.T) {
	db, _, err := sqlmock.New()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	newQueue := func() *Queue {
		q, err := New(db, Config{Dialect: Postgres, Table: Table{Name: "jobs", AdvisoryKey: "key"}})
		if err != nil {
			t.Fatal(err)
		}
		return q
	}
	held := func() (conns int, keys bool) {
		inWork.mu.Lock()
		defer inWork.mu.Unlock()
		_, keys = inWork.keys[db]
		return inWork.conns[db], keys
	}
	a, b := newQueue(), newQueue()
	if n, keys := held(); n != 0 || keys {
		t.Fatal("queues that hold nothing registered their pool")
	}
	if got, _ := a.holds.reserve(2); got != 2 {
		t.Fatalf("reserved %d connections, want 2", got)
	}
	_, _ = b.holds.reserve(1)
	if !a.keys.take("k") || b.keys.take("k") {
		t.Fatal("two queues of one pool both took key k")
	}
	if n, keys := held(); n != 3 || !keys {
		t.Fatalf("held %d connections (keys %v), want the two queues' 3 and a key", n, keys)
	}
	a.holds.unreserve(2)
	a.keys.drop("k")
	b.holds.unreserve(1)
	inWork.mu.Lock()
	_, conns := inWork.conns[db]
	_, keys := inWork.keys[db]
	inWork.mu.Unlock()
	if conns || keys {
		t.Errorf("entries left after the last hold went: connections %v, keys %v", conns, keys)
	}
}

// TestBells: the queues of one table, whatever its spelling or schema
// ("jobs", "tenant.jobs") and pool, share the wake-ups of NextWake; another
// table has its own.
func TestBells(t *testing.T) {
	queue := func(name string) *Queue {
		db, _, err := sqlmock.New()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		q, err := New(db, Config{Dialect: Postgres, Table: Table{Name: name, LockedUntil: "locked_until"}})
		if err != nil {
			t.Fatal(err)
		}
		return q
	}
	jobs := queue("jobs")
	for _, same := range []string{"tenant.jobs", "JOBS", "jobs"} {
		if q := queue(same); q.bell != jobs.bell {
			t.Errorf("%s does not share the wake-ups of jobs", same)
		}
	}
	other := queue("reports")
	if other.bell == jobs.bell {
		t.Fatal("reports shares the wake-ups of jobs")
	}
	rang, quiet := jobs.NextWake(), other.NextWake()
	queue("public.jobs").Wake()
	select {
	case <-rang:
	default:
		t.Error("Wake on public.jobs did not close the channel NextWake gave before it")
	}
	select {
	case <-quiet:
		t.Error("Wake on jobs woke reports")
	default:
	}
	waits.mu.Lock()
	_, kept := waits.ch["jobs"]
	waits.mu.Unlock()
	if kept {
		t.Error("the wake-up left the table's channel in the registry")
	}
	if jobs.NextWake() == rang {
		t.Error("NextWake after a wake-up returns the closed channel")
	}
}
