package periodic

import (
	"fmt"
	"time"
)

// nextTick returns s's first tick after last, in UTC and rounded up to the
// microsecond (the state table's precision), or the zero Time when s has
// none. A schedule whose answer is not after last is an error: the entry
// would tick forever at one instant.
func nextTick(s Schedule, last time.Time) (time.Time, error) {
	t := s.Next(last)
	if t.IsZero() {
		return time.Time{}, nil
	}
	t = ceilMicro(t.UTC())
	if !t.After(last) {
		return time.Time{}, fmt.Errorf("its schedule's Next(%s) returned %s, which is not after it", last.Format(time.RFC3339Nano), t.Format(time.RFC3339Nano))
	}
	return t, nil
}

// ceilMicro rounds t up to a whole microsecond.
func ceilMicro(t time.Time) time.Time {
	if r := t.Truncate(time.Microsecond); r.Before(t) {
		return r.Add(time.Microsecond)
	}
	return t
}

// maxScan is how many ticks after last dueTicks steps through before it
// looks for the latest ones from nearer now instead: a downtime of a year on
// a schedule of seconds must not cost a step per tick it missed.
const maxScan = 4096

// dueTicks returns the ticks of s after last and not after now that a policy
// of most enqueues, the latest most of them, in order; none when no tick is due.
//
// It steps through the ticks from last, which is one step when the
// scheduler keeps up. When more than maxScan ticks are due it searches a
// window before now instead, sized to hold about 2 × most ticks at the rate
// the scan met, and doubles the window until it holds most ticks or reaches
// back to last.
func dueTicks(s Schedule, last, now time.Time, most int) ([]time.Time, error) {
	ticks, end, err := scanTicks(s, last, now, most, maxScan)
	if err != nil || end.IsZero() {
		return ticks, err
	}
	// end is the maxScan-th tick, and more are due.
	window := maxDuration
	if per := max(end.Sub(last)/maxScan, time.Microsecond); per < maxDuration/time.Duration(2*most) {
		window = per * time.Duration(2*most)
	}
	for {
		from := last
		if window < now.Sub(last) {
			from = now.Add(-window)
		}
		ticks, _, err := scanTicks(s, from, now, most, -1)
		if err != nil || len(ticks) >= most || from.Equal(last) {
			return ticks, err
		}
		if window > maxDuration/2 {
			window = maxDuration
		} else {
			window *= 2
		}
	}
}

// scanTicks steps through s's ticks after from up to now and returns the
// latest most of them in order. With a limit of 0 or more it stops after that
// many steps and returns the last tick it reached as end, the zero Time when
// it reached now or the schedule's end first.
func scanTicks(s Schedule, from, now time.Time, most, limit int) (ticks []time.Time, end time.Time, err error) {
	ring := make([]time.Time, 0, most)
	start := 0
	for t, n := from, 0; ; n++ {
		if n == limit {
			end = t
			break
		}
		next, err := nextTick(s, t)
		if err != nil {
			return nil, time.Time{}, err
		}
		if next.IsZero() || next.After(now) {
			break
		}
		if len(ring) < most {
			ring = append(ring, next)
		} else {
			ring[start] = next
			start = (start + 1) % most
		}
		t = next
	}
	return append(ring[start:len(ring):len(ring)], ring[:start]...), end, nil
}
