package enginetest

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlinbox/inbox/periodic"
	"github.com/sqlinbox/inbox/periodic/cron"
	"github.com/sqlinbox/inbox/periodic/internal/testclock"
)

func mustCron(t testing.TB, spec, zone string) periodic.Schedule {
	t.Helper()
	loc, err := time.LoadLocation(zone)
	if err != nil {
		t.Fatal(err)
	}
	s, err := cron.Parse(spec, loc)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// errorLog collects what OnError is told.
type errorLog struct {
	mu  sync.Mutex
	got []string
}

func (l *errorLog) add(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, err.Error())
}

func (l *errorLog) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.got...)
}

// errInjected is a COMMIT that never reached the database: the process died
// after its compare-and-set and its jobs were written, before committing.
var errInjected = errors.New("injected: the process died before its COMMIT")

// Three schedulers, each on a pool of its own, run five entries (intervals
// and cron specs, one in Paris across the switch to summer time) for two
// hours of a shared clock, in steps of 30 seconds: one is killed and
// replaced, another restarted, and a third loses every fifth COMMIT, rolled
// back as a process dying before it would leave it. Every tick from the
// registration to the end is enqueued exactly once.
func TestExactlyOnce(t *testing.T) {
	forEach(t, func(t *testing.T, v *env) {
		entries := []periodic.Entry{
			entry("minute", every(t, time.Minute), periodic.SkipToLatest),
			entry("ninety", every(t, 90*time.Second), periodic.Backfill(10)),
			entry("five", every(t, 5*time.Minute), periodic.SkipToLatest),
			entry("paris-2m", mustCron(t, "*/2 * * * *", "Europe/Paris"), periodic.Backfill(10)),
			entry("quarters", mustCron(t, "7,22,37,52 * * * *", "UTC"), periodic.SkipToLatest),
		}
		// Paris moves to summer time at 01:00 UTC.
		begin := time.Date(2025, 3, 30, 0, 20, 10, 0, time.UTC)
		clock := testclock.New(begin)
		var log errorLog
		var commits atomic.Int64
		dying := func(call, _ string) error {
			if call == "commit" && commits.Add(1)%5 == 0 {
				return errInjected
			}
			return nil
		}
		procs := []*proc{
			v.spawn(t, clock, entries, nil, log.add),
			v.spawn(t, clock, entries, nil, log.add),
			v.spawn(t, clock, entries, dying, log.add),
		}
		v.waitIdle(t, clock, 3)
		const steps = 240
		for i := 1; i <= steps; i++ {
			switch i {
			case 40: // killed, replaced five steps later
				procs[0].kill(t)
				procs = procs[1:]
			case 45:
				procs = append(procs, v.spawn(t, clock, entries, nil, log.add))
			case 100: // restarted at once
				procs[0].kill(t)
				procs[0] = v.spawn(t, clock, entries, nil, log.add)
			}
			clock.Advance(30 * time.Second)
			v.waitIdle(t, clock, len(procs))
		}
		// Let the backoffs of a last failed COMMIT run out.
		for i := 0; i < 4; i++ {
			clock.Advance(time.Second)
			v.waitIdle(t, clock, len(procs))
		}
		end := clock.Now()
		lasts := v.lastTicks(t, procs[0].s)
		for _, p := range procs {
			p.kill(t)
		}
		want := map[string][]time.Time{}
		for _, e := range entries {
			ticks := ticksBetween(e.Schedule, begin, end)
			want[e.Name] = ticks
			if latest := ticks[len(ticks)-1]; !lasts[e.Name].Equal(latest) {
				t.Errorf("entry %s: last tick %v, want %v", e.Name, lasts[e.Name], latest)
			}
		}
		if n := len(want["paris-2m"]); n != 60 {
			t.Errorf("paris-2m: %d ticks in two hours, want 60 (summer time moves no minute)", n)
		}
		v.wantTicks(t, want)
		if commits.Load() < 20 {
			t.Errorf("the dying scheduler committed %d times: too few to have died", commits.Load())
		}
		for _, msg := range log.list() {
			if !strings.Contains(msg, errInjected.Error()) {
				t.Errorf("OnError: %s", msg)
			}
		}
	})
}
