package periodic

import (
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2025, 3, 10, 12, 0, 0, 0, time.UTC)

func mustEvery(t *testing.T, d time.Duration) Schedule {
	t.Helper()
	s, err := Every(d)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Every refuses an interval that is not positive, or finer than the state
// table keeps, saying why.
func TestEveryRefuses(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{0, "periodic: Every(0s): the interval must be positive"},
		{-time.Second, "periodic: Every(-1s): the interval must be positive"},
		{1500 * time.Nanosecond, "periodic: Every(1.5µs): the interval must be a whole number of microseconds, the state table's precision"},
	} {
		s, err := Every(c.d)
		if err == nil || err.Error() != c.want || s != nil {
			t.Errorf("Every(%v) = %v, %v; want nil, %q", c.d, s, err, c.want)
		}
	}
}

// Every's ticks are the multiples of the interval since the epoch, whatever
// time Next is asked from: every process agrees on them.
func TestEveryNext(t *testing.T) {
	hour := mustEvery(t, time.Hour)
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Skip("no time zone database:", err)
	}
	for _, c := range []struct {
		s           Schedule
		after, want time.Time
	}{
		{hour, t0, t0.Add(time.Hour)},
		{hour, t0.Add(-time.Nanosecond), t0},
		{hour, t0.Add(59 * time.Minute).In(paris), t0.Add(time.Hour)},
		{mustEvery(t, 7*time.Second), time.Unix(0, 0), time.Unix(7, 0)},
		{mustEvery(t, 7*time.Second), time.Unix(-1, 0), time.Unix(0, 0)},
		{mustEvery(t, 7*time.Second), time.Unix(-8, 0), time.Unix(-7, 0)},
		{mustEvery(t, 90*time.Minute), t0, time.Date(2025, 3, 10, 13, 30, 0, 0, time.UTC)},
		{hour, time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC), time.Time{}},
		{hour, time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC), time.Time{}},
	} {
		if got := c.s.Next(c.after); !got.Equal(c.want) {
			t.Errorf("%v.Next(%v) = %v, want %v", c.s, c.after, got, c.want)
		}
	}
}

// counting counts the calls of a schedule's Next.
type counting struct {
	Schedule
	n int
}

func (c *counting) Next(after time.Time) time.Time { c.n++; return c.Schedule.Next(after) }

func ticksEqual(t *testing.T, what string, got, want []time.Time) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d ticks %v, want %d %v", what, len(got), got, len(want), want)
	}
	for i := range got {
		if !got[i].Equal(want[i]) {
			t.Fatalf("%s: tick %d is %v, want %v", what, i, got[i], want[i])
		}
	}
}

// The ticks due are those after the last tick and not after now, the latest
// of them as many as the policy takes, in order.
func TestDueTicks(t *testing.T) {
	minute := mustEvery(t, time.Minute)
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	for _, c := range []struct {
		name      string
		last, now time.Time
		most      int
		want      []time.Time
	}{
		{"none yet", at(0), at(0).Add(59 * time.Second), 1, nil},
		{"one on time", at(0), at(1), 1, []time.Time{at(1)}},
		{"one late", at(0), at(1).Add(30 * time.Second), 5, []time.Time{at(1)}},
		{"skip to latest", at(0), at(10).Add(time.Second), 1, []time.Time{at(10)}},
		{"backfill all", at(0), at(3), 5, []time.Time{at(1), at(2), at(3)}},
		{"backfill bound", at(0), at(10), 3, []time.Time{at(8), at(9), at(10)}},
		{"last between ticks", at(0).Add(20 * time.Second), at(2), 5, []time.Time{at(1), at(2)}},
		{"clock behind", at(10), at(3), 5, nil},
	} {
		got, err := dueTicks(minute, c.last, c.now, c.most)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		ticksEqual(t, c.name, got, c.want)
	}
}

// A year missed on a schedule of seconds costs about as many steps as the
// ticks the policy keeps, not one per tick missed.
func TestDueTicksLongDowntime(t *testing.T) {
	sec := &counting{Schedule: mustEvery(t, time.Second)}
	now := t0.AddDate(1, 0, 0).Add(500 * time.Millisecond)
	for _, most := range []int{1, 10, 5000} {
		sec.n = 0
		got, err := dueTicks(sec, t0, now, most)
		if err != nil {
			t.Fatal(err)
		}
		want := make([]time.Time, most)
		for i := range want {
			want[i] = now.Truncate(time.Second).Add(time.Duration(i-most+1) * time.Second)
		}
		ticksEqual(t, "a year of seconds", got, want)
		if limit := maxScan + 8*most + 64; sec.n > limit {
			t.Errorf("backfill %d: %d calls of Next, want at most %d", most, sec.n, limit)
		}
	}
}

// sparse ticks every second in the first hour of the year 2025 and never
// again: the latest ticks lie far before now.
type sparse struct{ every Schedule }

func (s sparse) Next(after time.Time) time.Time {
	end := time.Date(2025, 1, 1, 1, 0, 0, 0, time.UTC)
	t := s.every.Next(after)
	if t.After(end) {
		return time.Time{}
	}
	return t
}

// A schedule whose ticks end, or thin out, before now still yields its
// latest ticks.
func TestDueTicksEnds(t *testing.T) {
	s := sparse{mustEvery(t, time.Second)}
	last := time.Date(2024, 12, 31, 0, 0, 0, 0, time.UTC)
	end := time.Date(2025, 1, 1, 1, 0, 0, 0, time.UTC)
	got, err := dueTicks(s, last, t0, 2)
	if err != nil {
		t.Fatal(err)
	}
	ticksEqual(t, "ended", got, []time.Time{end.Add(-time.Second), end})
	if got, err := dueTicks(s, end, t0, 2); err != nil || len(got) != 0 {
		t.Errorf("after its end: %v, %v; want none", got, err)
	}
}

// fixed is a broken schedule: its next tick is always the same instant.
type fixed time.Time

func (f fixed) Next(time.Time) time.Time { return time.Time(f) }

// submicro ticks a nanosecond past each whole second.
type submicro struct{}

func (submicro) Next(after time.Time) time.Time {
	return after.Truncate(time.Second).Add(time.Second + time.Nanosecond)
}

// A schedule that does not move forward is an error, not a loop; ticks
// finer than a microsecond are rounded up to the next one.
func TestNextTick(t *testing.T) {
	_, err := nextTick(fixed(t0), t0)
	if err == nil || !strings.Contains(err.Error(), "which is not after it") {
		t.Errorf("a schedule standing still: %v", err)
	}
	if _, err := dueTicks(fixed(t0), t0, t0.Add(time.Hour), 1); err == nil {
		t.Error("dueTicks on a schedule standing still: no error")
	}
	got, err := nextTick(submicro{}, t0)
	if want := t0.Add(time.Second + time.Microsecond); err != nil || !got.Equal(want) {
		t.Errorf("nextTick = %v, %v; want %v", got, err, want)
	}
	if got, err := nextTick(fixed(time.Time{}), t0); err != nil || !got.IsZero() {
		t.Errorf("a schedule without a next tick: %v, %v; want the zero time", got, err)
	}
}
