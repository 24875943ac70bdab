package dbtest

import (
	"sync"
	"testing"
	"time"
)

// fakeClock is a clock that moves only when a test advances it, for
// Config.Now and Config.After: lease tests pause time instead of sleeping.
// It is safe for concurrent use.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	timers  []fakeTimer
	afters  int           // After calls so far
	changed chan struct{} // closed and replaced at every After call
}

type fakeTimer struct {
	at time.Time
	ch chan time.Time
}

// newFakeClock returns a clock standing at start.
func newFakeClock(start time.Time) *fakeClock {
	return &fakeClock{now: start, changed: make(chan struct{})}
}

// Now returns the clock's time.
func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// After returns a channel that receives the clock's time once the clock has
// been advanced by d or more; at once when d is not positive.
func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.now
	} else {
		c.timers = append(c.timers, fakeTimer{at: c.now.Add(d), ch: ch})
	}
	c.afters++
	close(c.changed)
	c.changed = make(chan struct{})
	return ch
}

// Advance moves the clock forward by d and fires the timers it reaches.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.timers[:0]
	for _, tm := range c.timers {
		if !tm.at.After(c.now) {
			tm.ch <- c.now
		} else {
			kept = append(kept, tm)
		}
	}
	c.timers = kept
}

// Afters returns how many times After was called.
func (c *fakeClock) Afters() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.afters
}

// Pending returns how many timers wait for the clock.
func (c *fakeClock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// WaitAfters blocks until After has been called at least n times, failing
// the test if that takes longer than a generous deadline: a keeper that
// stopped waiting on the clock is a bug, not slowness.
func (c *fakeClock) WaitAfters(t testing.TB, n int) {
	t.Helper()
	c.WaitAftersOr(t, n, nil)
}

// WaitAftersOr is WaitAfters that also returns when done is closed.
func (c *fakeClock) WaitAftersOr(t testing.TB, n int, done <-chan struct{}) {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		c.mu.Lock()
		got, changed := c.afters, c.changed
		c.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-changed:
		case <-done:
			return
		case <-deadline:
			t.Fatalf("fake clock: waited a minute for After call %d, got %d", n, got)
		}
	}
}

func TestFakeClock(t *testing.T) {
	start := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	c := newFakeClock(start)
	ch := c.After(10 * time.Second)
	now := c.After(0)
	select {
	case <-now:
	default:
		t.Fatal("After(0) did not fire at once")
	}
	c.Advance(9 * time.Second)
	select {
	case <-ch:
		t.Fatal("timer fired a second early")
	default:
	}
	if c.Pending() != 1 {
		t.Fatalf("pending %d, want 1", c.Pending())
	}
	c.Advance(time.Second)
	select {
	case got := <-ch:
		if !got.Equal(start.Add(10 * time.Second)) {
			t.Fatalf("fired with %v", got)
		}
	default:
		t.Fatal("timer did not fire at its time")
	}
	c.WaitAfters(t, 2)
	if c.Afters() != 2 || c.Pending() != 0 {
		t.Fatalf("afters %d pending %d, want 2 and 0", c.Afters(), c.Pending())
	}
}
