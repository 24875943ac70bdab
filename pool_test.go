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
