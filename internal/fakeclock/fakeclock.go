// Package fakeclock is the one fake clock of the module's tests: a
// Config.Now and Config.After whose time moves only when a test advances
// it, so that lease and keeper tests pause time instead of sleeping. It is
// test support, imported by test files only (the root's, the worker
// package's and dbtest's).
package fakeclock

import (
	"strconv"
	"sync"
	"testing"
	"time"
)

// wait is how long a test waits for something to wait on the clock before
// it fails: a keeper that stopped waiting is a bug, not slowness, but a
// machine shared by parallel suites can be slow to get there.
const wait = time.Minute

// Clock is a fake clock, safe for concurrent use.
type Clock struct {
	mu      sync.Mutex
	now     time.Time
	timers  []timer
	afters  int           // After calls so far
	changed chan struct{} // closed and replaced at every After call
}

type timer struct {
	at time.Time
	ch chan time.Time
}

// New returns a clock standing at start.
func New(start time.Time) *Clock {
	return &Clock{now: start, changed: make(chan struct{})}
}

// Now returns the clock's time: Config.Now.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// After returns a channel that receives the clock's time once the clock has
// been advanced by d or more; at once when d is not positive, as
// time.After does: Config.After.
func (c *Clock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.now
	} else {
		c.timers = append(c.timers, timer{at: c.now.Add(d), ch: ch})
	}
	c.afters++
	close(c.changed)
	c.changed = make(chan struct{})
	return ch
}

// Advance moves the clock forward by d and fires the timers it reaches.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.timers[:0]
	for _, tm := range c.timers {
		if tm.at.After(c.now) {
			kept = append(kept, tm)
			continue
		}
		tm.ch <- c.now
	}
	c.timers = kept
}

// Afters returns how many times After was called.
func (c *Clock) Afters() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.afters
}

// Pending returns how many timers wait for the clock.
func (c *Clock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// WaitAfters blocks until After has been called at least n times.
func (c *Clock) WaitAfters(t testing.TB, n int) {
	t.Helper()
	c.WaitAftersOr(t, n, nil)
}

// WaitAftersOr is WaitAfters that also returns when done is closed.
func (c *Clock) WaitAftersOr(t testing.TB, n int, done <-chan struct{}) {
	t.Helper()
	c.until(t, done, func() bool { return c.afters >= n }, func() string {
		return "After call " + strconv.Itoa(n) + ", got " + strconv.Itoa(c.afters)
	})
}

// Next blocks until a timer waits for the clock and returns the earliest
// instant waited for.
func (c *Clock) Next(t testing.TB) time.Time {
	t.Helper()
	c.until(t, nil, func() bool { return len(c.timers) > 0 }, func() string { return "a timer" })
	c.mu.Lock()
	defer c.mu.Unlock()
	first := c.timers[0].at
	for _, tm := range c.timers[1:] {
		if tm.at.Before(first) {
			first = tm.at
		}
	}
	return first
}

// WaitingFor blocks until a timer waits for the instant at.
func (c *Clock) WaitingFor(t testing.TB, at time.Time) {
	t.Helper()
	c.until(t, nil, func() bool {
		for _, tm := range c.timers {
			if tm.at.Equal(at) {
				return true
			}
		}
		return false
	}, func() string { return "a timer for " + at.String() })
}

// until blocks until cond, called under the clock's lock, holds or done is
// closed, waking at each After call; it fails t, saying what it waited for,
// after a minute.
func (c *Clock) until(t testing.TB, done <-chan struct{}, cond func() bool, what func() string) {
	t.Helper()
	deadline := time.After(wait)
	for {
		c.mu.Lock()
		ok, changed := cond(), c.changed
		c.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-done:
			return
		case <-deadline:
			c.mu.Lock()
			msg := what()
			c.mu.Unlock()
			t.Fatalf("fake clock: waited %v for %s", wait, msg)
		}
	}
}
