package worker

import (
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqlinbox/inbox"
)

// TestPollDuties: the idle loops of one queue with one fallback interval
// share one poll duty; another interval (issue 21: a 200 ms loop waited
// more than 8 s behind a 30 s sibling's polling) or another queue has its
// own; the entry goes with the last loop, so that it keeps no queue
// reachable.
func TestPollDuties(t *testing.T) {
	db, _, err := sqlmock.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	queue := func(name string) *inbox.Queue {
		q, err := inbox.New(db, inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: name, LockedUntil: "locked_until"}})
		if err != nil {
			t.Fatal(err)
		}
		return q
	}
	jobs := queue("jobs")
	a, b := acquireDuty(jobs, time.Second), acquireDuty(jobs, time.Second)
	if a != b {
		t.Error("two loops of one queue and interval have two poll duties")
	}
	if ok, _ := a.take(); !ok {
		t.Fatal("the first loop cannot take the polling")
	}
	for _, other := range []*pollDuty{acquireDuty(jobs, 200*time.Millisecond), acquireDuty(queue("tenant.jobs"), time.Second), acquireDuty(queue("jobs"), time.Second)} {
		if other == a {
			t.Errorf("%v shares the poll duty of jobs every second", other.key)
		}
		if ok, _ := other.take(); !ok {
			t.Errorf("%v cannot poll while jobs's 1 s loop polls", other.key)
		}
		other.drop()
		other.release()
	}
	ok, free := b.take()
	if ok {
		t.Fatal("a second loop of the same queue and interval polls too")
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
