package enginetest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/periodic"
	"github.com/sqlinbox/inbox/periodic/cron"
	"github.com/sqlinbox/inbox/periodic/internal/testclock"
)

// Bad input is refused with a clear error, and nothing reaches the
// database: an unparsable cron spec, a zero interval, a scheduler without a
// schedule, a state table that does not exist (Run's start).
func TestBadInput(t *testing.T) {
	forEach(t, func(t *testing.T, v *env) {
		if _, err := cron.Parse("61 * * * *", time.UTC); err == nil || err.Error() != `cron: Parse("61 * * * *"): end of range (61) above maximum (59): 61` {
			t.Errorf("an unparsable spec: %v", err)
		}
		s, err := periodic.Every(0)
		if err == nil || err.Error() != "periodic: Every(0s): the interval must be positive" {
			t.Errorf("a zero interval: %v", err)
		}
		db, c := v.openCounter(t, nil)
		q := v.queue(t, db)
		_, err = periodic.New(q, db, periodic.Config{Table: v.state, Entries: []periodic.Entry{{Name: "zero", Schedule: s, Job: func(time.Time) inbox.Job { return inbox.Job{} }}}})
		if err == nil || err.Error() != `periodic: new: entry "zero": nil Schedule` {
			t.Errorf("New without a schedule: %v", err)
		}
		if n := c.sent(); n != 0 {
			t.Errorf("sent %q, want nothing", c.since(0))
		}

		missing, err := periodic.New(q, db, periodic.Config{Table: "no_such_table", Entries: []periodic.Entry{entry("a", every(t, time.Minute), periodic.SkipToLatest)}})
		if err != nil {
			t.Fatal(err)
		}
		err = missing.Run(context.Background())
		if err == nil || !strings.HasPrefix(err.Error(), "periodic: start: ") || !strings.Contains(err.Error(), "no_such_table") {
			t.Errorf("Run on a missing table: %v", err)
		}
		if n := v.count(t, v.jobs) + v.count(t, v.state); n != 0 {
			t.Errorf("%d rows written", n)
		}
	})
}

// An entry whose job the queue refuses is reported and tried again after
// its backoff, and holds up no other entry: its row stays where it was.
func TestBadJob(t *testing.T) {
	forEach(t, func(t *testing.T, v *env) {
		minute := every(t, time.Minute)
		bad := periodic.Entry{Name: "bad", Schedule: minute, Job: func(time.Time) inbox.Job {
			return inbox.Job{Data: []any{"one", "too many"}}
		}}
		entries := []periodic.Entry{entry("good", minute, periodic.SkipToLatest), bad, entry("fine", minute, periodic.SkipToLatest)}
		clock := testclock.New(at("09:59"))
		var log errorLog
		p := v.spawn(t, clock, entries, nil, log.add)
		v.waitIdle(t, clock, 1)
		clock.Advance(time.Minute)
		v.waitIdle(t, clock, 1)
		clock.Advance(100 * time.Millisecond) // the bad entry's backoff
		v.waitIdle(t, clock, 1)
		v.wantTicks(t, map[string][]time.Time{"good": ats("10:00"), "fine": ats("10:00")})
		want := `periodic: entry "bad", ticks 2025-03-10T10:00:00Z to 2025-03-10T10:00:00Z: inbox: enqueue many: job 0: 2 data values for the 1 data columns [payload]`
		got := log.list()
		if len(got) != 2 || got[0] != want || got[1] != want {
			t.Errorf("OnError got %q\nwant twice %s", got, want)
		}
		for _, st := range mustEntries(t, p.s) {
			if wantLast := at("10:00"); st.Name == "bad" {
				wantLast = at("09:59")
				if !st.Last.Equal(wantLast) {
					t.Errorf("%s: last tick %v, want %v", st.Name, st.Last, wantLast)
				}
			} else if !st.Last.Equal(wantLast) {
				t.Errorf("%s: last tick %v, want %v", st.Name, st.Last, wantLast)
			}
		}
		p.kill(t)
	})
}
