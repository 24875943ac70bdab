package worker

import (
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqlinbox/inbox"
)

// The due waker wakes the queue's loops at each time it was given, the
// earliest first whatever the order they came in, and forgets them once
// stopped.
func TestDueWaker(t *testing.T) {
	db, _, err := sqlmock.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	q, err := inbox.New(db, inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "due_jobs", LockedUntil: "locked_until"}})
	if err != nil {
		t.Fatal(err)
	}
	w := &dueWaker{q: q}
	defer w.stop()
	start := time.Now()
	rang := q.NextWake()
	w.add(start.Add(time.Hour))
	w.add(start.Add(20 * time.Millisecond))
	select {
	case <-rang:
	case <-time.After(30 * time.Second):
		t.Fatal("no wake-up for the time 20 ms ahead")
	}
	if time.Since(start) < 20*time.Millisecond {
		t.Error("woken before the earliest time")
	}
	w.mu.Lock()
	left, at := len(w.times), w.at
	w.mu.Unlock()
	if left != 1 || !at.Equal(start.Add(time.Hour)) {
		t.Errorf("after the wake-up: %d times left, timer at %v; want the hour's alone", left, at)
	}
	w.stop()
	if len(w.times) != 0 || w.timer.Stop() {
		t.Error("stop left times or an armed timer")
	}
}
