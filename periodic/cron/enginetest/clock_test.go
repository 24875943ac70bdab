package enginetest

import (
	"testing"
	"time"

	"github.com/sqlinbox/inbox/periodic"
	"github.com/sqlinbox/inbox/periodic/internal/testclock"
)

func at(hm string) time.Time {
	t, err := time.Parse("15:04", hm)
	if err != nil {
		panic(err)
	}
	return time.Date(2025, 3, 10, t.Hour(), t.Minute(), 0, 0, time.UTC)
}

func ats(hms ...string) []time.Time {
	out := make([]time.Time, len(hms))
	for i, hm := range hms {
		out[i] = at(hm)
	}
	return out
}

// The wall clock set forward by five hours under two waiting schedulers:
// within a minute they notice, and each entry gets the ticks its policy
// keeps of the five missed, once. Set back by three hours: nothing is
// enqueued, nor any statement sent, until the clock is back at the first
// tick not done, which is enqueued once.
func TestClockJump(t *testing.T) {
	forEach(t, func(t *testing.T, v *env) {
		hour := every(t, time.Hour)
		entries := []periodic.Entry{
			entry("skip", hour, periodic.SkipToLatest),
			entry("fill3", hour, periodic.Backfill(3)),
			entry("fillall", hour, periodic.Backfill(100)),
		}
		clock := testclock.New(at("10:30"))
		procs := []*proc{v.spawn(t, clock, entries, nil, nil), v.spawn(t, clock, entries, nil, nil)}
		v.waitIdle(t, clock, 2)
		clock.Advance(30 * time.Minute) // 11:00
		v.waitIdle(t, clock, 2)

		clock.Set(at("16:10"))
		clock.Advance(time.Minute) // the schedulers wait a minute at most
		v.waitIdle(t, clock, 2)
		v.wantTicks(t, map[string][]time.Time{
			"skip":    ats("11:00", "16:00"),
			"fill3":   ats("11:00", "14:00", "15:00", "16:00"),
			"fillall": ats("11:00", "12:00", "13:00", "14:00", "15:00", "16:00"),
		})

		clock.Set(at("13:11"))
		sent := []int{procs[0].c.sent(), procs[1].c.sent()}
		for clock.Now().Before(at("16:59")) {
			clock.Advance(time.Minute)
			v.waitIdle(t, clock, 2)
		}
		for i, p := range procs {
			if got := p.c.since(sent[i]); len(got) > 0 {
				t.Errorf("scheduler %d sent %d statements while its clock was behind: %q", i, len(got), got)
			}
		}
		if n := v.count(t, v.jobs); n != 12 {
			t.Errorf("%d jobs after the clock was set back, want the 12 before", n)
		}
		clock.Advance(time.Minute) // 17:00
		v.waitIdle(t, clock, 2)
		v.wantTicks(t, map[string][]time.Time{
			"skip":    ats("11:00", "16:00", "17:00"),
			"fill3":   ats("11:00", "14:00", "15:00", "16:00", "17:00"),
			"fillall": ats("11:00", "12:00", "13:00", "14:00", "15:00", "16:00", "17:00"),
		})
		for _, st := range mustEntries(t, procs[0].s) {
			if !st.Last.Equal(at("17:00")) || !st.Next.Equal(at("18:00")) {
				t.Errorf("Entries: %s last %v next %v, want 17:00 and 18:00", st.Name, st.Last, st.Next)
			}
		}
		for _, p := range procs {
			p.kill(t)
		}
	})
}

// Every process down for two hours: the schedulers that start again enqueue
// what each entry's policy keeps of the ticks missed, once between them,
// and go on from there.
func TestMissedTicks(t *testing.T) {
	forEach(t, func(t *testing.T, v *env) {
		ten := every(t, 10*time.Minute)
		entries := []periodic.Entry{
			entry("skip", ten, periodic.SkipToLatest),
			entry("fill4", ten, periodic.Backfill(4)),
			entry("fillall", ten, periodic.Backfill(1000)),
			entry("ny-fill2", mustCron(t, "*/10 * * * *", "America/New_York"), periodic.Backfill(2)),
		}
		clock := testclock.New(at("08:05"))
		procs := []*proc{v.spawn(t, clock, entries, nil, nil), v.spawn(t, clock, entries, nil, nil)}
		v.waitIdle(t, clock, 2)
		clock.Advance(5 * time.Minute) // 08:10
		v.waitIdle(t, clock, 2)
		for _, p := range procs {
			p.kill(t)
		}

		clock.Advance(2*time.Hour + 2*time.Minute) // 10:12, nobody running
		procs = []*proc{v.spawn(t, clock, entries, nil, nil), v.spawn(t, clock, entries, nil, nil)}
		v.waitIdle(t, clock, 2)
		all := ticksBetween(ten, at("08:05"), at("10:12"))
		want := map[string][]time.Time{
			"skip":     ats("08:10", "10:10"),
			"fill4":    ats("08:10", "09:40", "09:50", "10:00", "10:10"),
			"fillall":  all,
			"ny-fill2": ats("08:10", "10:00", "10:10"),
		}
		v.wantTicks(t, want)
		if len(all) != 13 {
			t.Fatalf("%d ticks from 08:10 to 10:10, want 13", len(all))
		}

		clock.Advance(8 * time.Minute) // 10:20
		v.waitIdle(t, clock, 2)
		for name := range want {
			want[name] = append(want[name], at("10:20"))
		}
		v.wantTicks(t, want)
		for _, p := range procs {
			p.kill(t)
		}
	})
}
