package worker

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// Permanent keeps the error's text and chain and adds ErrNoRetry, wrapped
// or not; Snooze carries its delay through a wrapping; the loop's fate
// reads them before the shutdown and the attempts.
func TestFateErrors(t *testing.T) {
	base := errors.New("no such customer")
	p := fmt.Errorf("order 7: %w", Permanent(base))
	if !errors.Is(p, ErrNoRetry) || !errors.Is(p, base) || p.Error() != "order 7: no such customer" {
		t.Errorf("Permanent wrapped: %q, Is(ErrNoRetry) %v, Is(base) %v", p, errors.Is(p, ErrNoRetry), errors.Is(p, base))
	}
	if err := Permanent(nil); err == nil || !errors.Is(err, ErrNoRetry) {
		t.Errorf("Permanent(nil) = %v", err)
	}
	w := &loop{attempts: 3, dead: true, delays: true, backoff: func(int) time.Duration { return time.Minute }}
	for _, c := range []struct {
		attempt    int
		err, cause error
		want       Outcome
		delay      time.Duration
	}{
		{1, nil, ErrShutdown, OutcomeAcked, 0},
		{1, fmt.Errorf("later: %w", Snooze(time.Hour)), nil, OutcomeSnoozed, time.Hour},
		{3, Snooze(-time.Hour), nil, OutcomeSnoozed, 0},
		{1, p, nil, OutcomeDead, 0},
		{1, p, ErrShutdown, OutcomeDead, 0},
		{1, context.Canceled, ErrShutdown, OutcomeReleased, 0},
		{3, context.Canceled, ErrShutdown, OutcomeReleased, 0},
		{2, context.DeadlineExceeded, ErrTimeout, OutcomeRetried, time.Minute},
		{3, base, nil, OutcomeDead, 0},
	} {
		if o, d := w.fate(c.attempt, c.err, c.cause); o != c.want || d != c.delay {
			t.Errorf("fate(%d, %v, %v) = %v %v, want %v %v", c.attempt, c.err, c.cause, o, d, c.want, c.delay)
		}
	}
	w.dead = false
	if o, _ := w.fate(1, p, nil); o != OutcomeDropped {
		t.Errorf("a permanent error without a dead table: %v, want dropped", o)
	}
	w.delays = false
	if o, d := w.fate(1, Snooze(time.Hour), nil); o != OutcomeSnoozed || d != 0 {
		t.Errorf("a snooze without delays: %v %v, want snoozed at once", o, d)
	}
}
