package fakeclock

import (
	"testing"
	"time"
)

func TestClock(t *testing.T) {
	start := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	c := New(start)
	ch := c.After(10 * time.Second)
	now := c.After(0)
	select {
	case <-now:
	default:
		t.Fatal("After(0) did not fire at once")
	}
	if got := c.Next(t); !got.Equal(start.Add(10 * time.Second)) {
		t.Fatalf("Next %v, want the timer's instant", got)
	}
	c.WaitingFor(t, start.Add(10*time.Second))
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

// The waits wake at an After call from another goroutine, and
// WaitAftersOr returns when done is closed.
func TestClockWaits(t *testing.T) {
	c := New(time.Unix(0, 0))
	got := make(chan time.Time)
	go func() { got <- c.Next(t) }()
	c.After(time.Minute)
	if at := <-got; !at.Equal(time.Unix(60, 0)) {
		t.Fatalf("Next %v, want a minute in", at)
	}
	done := make(chan struct{})
	close(done)
	c.WaitAftersOr(t, 5, done)
}
