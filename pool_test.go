package inbox

import (
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
	if jobs.NextWake() == rang {
		t.Error("NextWake after a wake-up returns the closed channel")
	}
}
