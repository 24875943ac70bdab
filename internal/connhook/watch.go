package connhook

import (
	"sync"
	"testing"
	"time"
)

// Watch counts the runs of the statements it watches, for a test to wait
// until a pool has sent them, without sleeping: a hook calls Saw. Make one
// with NewWatch; it is safe for concurrent use.
type Watch struct {
	mu      sync.Mutex
	sqls    map[string]bool
	n       int
	changed chan struct{} // closed and replaced at every count
}

// NewWatch returns a Watch that watches nothing yet.
func NewWatch() *Watch {
	return &Watch{sqls: map[string]bool{}, changed: make(chan struct{})}
}

// Add watches the statement whose text is sql.
func (w *Watch) Add(sql string) {
	w.mu.Lock()
	w.sqls[sql] = true
	w.mu.Unlock()
}

// Saw counts a run of sql if it is watched.
func (w *Watch) Saw(sql string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.sqls[sql] {
		w.n++
		close(w.changed)
		w.changed = make(chan struct{})
	}
}

// Count returns the runs of watched statements seen.
func (w *Watch) Count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// Wait waits until n runs of watched statements have been seen, and fails
// t if they have not within timeout.
func (w *Watch) Wait(t testing.TB, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		w.mu.Lock()
		got, changed := w.n, w.changed
		w.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("waited %v for %d runs of the watched statements, saw %d", timeout, n, got)
		}
	}
}
