// Package testclock is the fake clock of package periodic's tests: a wall
// clock (Config.Now) that a test sets anywhere, backwards included, and
// timers (Config.After) that run on elapsed time, as real timers do, so that
// a test can set the wall clock back or forward under a waiting scheduler.
// It is test support, imported by test files only.
package testclock

import (
	"sync"
	"testing"
	"time"
)

// wait is how long a test waits for the schedulers to wait on the clock
// before it fails: on a loaded machine a round of statements can be slow,
// but a minute is a hang.
const wait = time.Minute

// Clock is a fake clock, safe for concurrent use.
type Clock struct {
	mu      sync.Mutex
	wall    time.Time
	elapsed time.Duration // since New: what timers run on
	timers  []timer
	owners  int
	changed chan struct{} // closed and replaced at every After call
}

type timer struct {
	at    time.Duration // elapsed time at which it fires
	ch    chan time.Time
	owner int // 0 for After's, or an Owner's
}

// New returns a clock whose wall reads start.
func New(start time.Time) *Clock {
	return &Clock{wall: start, changed: make(chan struct{})}
}

// Now returns the wall clock: Config.Now.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.wall
}

// After returns a channel that receives the wall clock's time once d has
// elapsed; at once when d is not positive: Config.After.
func (c *Clock) After(d time.Duration) <-chan time.Time { return c.after(d, 0) }

// Owner returns an After whose timers drop removes: a scheduler stopped
// while it waits leaves a timer that nobody will receive from, which must
// not count as a scheduler waiting.
func (c *Clock) Owner() (after func(time.Duration) <-chan time.Time, drop func()) {
	c.mu.Lock()
	c.owners++
	id := c.owners
	c.mu.Unlock()
	after = func(d time.Duration) <-chan time.Time { return c.after(d, id) }
	drop = func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		kept := c.timers[:0]
		for _, tm := range c.timers {
			if tm.owner != id {
				kept = append(kept, tm)
			}
		}
		c.timers = kept
	}
	return after, drop
}

func (c *Clock) after(d time.Duration, owner int) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.wall
	} else {
		c.timers = append(c.timers, timer{at: c.elapsed + d, ch: ch, owner: owner})
	}
	close(c.changed)
	c.changed = make(chan struct{})
	return ch
}

// Advance lets d elapse: the wall clock moves by d and the timers due fire.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wall = c.wall.Add(d)
	c.elapsed += d
	kept := c.timers[:0]
	for _, tm := range c.timers {
		if tm.at > c.elapsed {
			kept = append(kept, tm)
			continue
		}
		tm.ch <- c.wall
	}
	c.timers = kept
}

// Set sets the wall clock to t, as an operator or NTP would, without time
// elapsing: no timer fires.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wall = t
}

// Earliest returns how long until the earliest timer fires, and false when
// none waits.
func (c *Clock) Earliest() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.timers) == 0 {
		return 0, false
	}
	first := c.timers[0].at
	for _, tm := range c.timers[1:] {
		first = min(first, tm.at)
	}
	return first - c.elapsed, true
}

// WaitWaiting blocks until n timers wait: n schedulers, each waiting for
// its next tick, have done everything due before it. It fails t after a
// minute, or at once when done, if not nil, is closed first (a scheduler
// returned).
func (c *Clock) WaitWaiting(t testing.TB, n int, done <-chan struct{}) {
	t.Helper()
	deadline := time.After(wait)
	for {
		c.mu.Lock()
		got, changed := len(c.timers), c.changed
		c.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-changed:
		case <-done:
			t.Fatalf("testclock: a scheduler returned while waiting for %d timers (%d wait)", n, got)
		case <-deadline:
			t.Fatalf("testclock: waited %v for %d timers, %d wait", wait, n, got)
		}
	}
}
