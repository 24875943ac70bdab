package enginetest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox/periodic"
	"github.com/sqlinbox/inbox/periodic/internal/testclock"
)

// thousand returns 1,000 entries: half every minute, 300 every two minutes,
// 200 every five.
func thousand(t testing.TB) []periodic.Entry {
	t.Helper()
	var out []periodic.Entry
	for i := 0; i < 1000; i++ {
		d := time.Minute
		switch {
		case i >= 800:
			d = 5 * time.Minute
		case i >= 500:
			d = 2 * time.Minute
		}
		out = append(out, entry(fmt.Sprintf("e%04d", i), every(t, d), periodic.SkipToLatest))
	}
	return out
}

// verbs returns the first word of each call: "query", "exec", "begin"…
func verbs(calls []string) []string {
	out := make([]string, len(calls))
	for i, c := range calls {
		out[i], _, _ = strings.Cut(c, " ")
	}
	return out
}

// A scheduler of 1,000 entries whose ticks another process enqueues costs
// one statement per wake-up, whatever the number of entries due, and none
// between ticks; alone, it enqueues the ticks of a wake-up in a handful of
// statements.
func TestThousandEntries(t *testing.T) {
	forEach(t, func(t *testing.T, v *env) {
		entries := thousand(t)
		// The other process's clock runs first: its ticks are done by the
		// time this one wakes.
		begin := at("09:00").Add(30 * time.Second)
		other, mine := testclock.New(begin), testclock.New(begin)
		a := v.spawn(t, other, entries, nil, nil)
		other.WaitWaiting(t, 1, v.crashed)
		b := v.spawn(t, mine, entries, nil, nil)
		mine.WaitWaiting(t, 1, v.crashed)
		if got := verbs(b.c.since(0)); strings.Join(got, " ") != "query" {
			t.Errorf("start of a scheduler of registered entries: sent %s, want one query", short(got))
		}
		// The ticks are on the minute, the clocks half a minute past.
		for minute := 1; minute <= 10; minute++ {
			other.Advance(time.Minute)
			other.WaitWaiting(t, 1, v.crashed)
			n := b.c.sent()
			mine.Advance(30 * time.Second) // to the tick
			mine.WaitWaiting(t, 1, v.crashed)
			if got := verbs(b.c.since(n)); strings.Join(got, " ") != "query" {
				t.Errorf("minute %d: a wake-up whose ticks were done sent %s, want one query", minute, short(got))
			}
			n = b.c.sent()
			mine.Advance(30 * time.Second) // between ticks
			mine.WaitWaiting(t, 1, v.crashed)
			if got := b.c.since(n); len(got) > 0 {
				t.Errorf("minute %d: sent %d statements between ticks: %s", minute, len(got), short(verbs(got)))
			}
		}
		a.kill(t)
		jobs := v.count(t, v.jobs)
		// 09:10:30 to 09:20:30: ten minutes, 500 + 5 × 300 + 2 × 200
		// ticks, every wake-up enqueueing its own.
		n := b.c.sent()
		for minute := 1; minute <= 10; minute++ {
			k := b.c.sent()
			mine.Advance(time.Minute)
			mine.WaitWaiting(t, 1, v.crashed)
			got := verbs(b.c.since(k))
			if len(got) < 5 || len(got) > 8 || got[0] != "query" || got[1] != "begin" || got[2] != "exec" || got[len(got)-1] != "commit" {
				t.Errorf("minute %d: a wake-up enqueueing its ticks sent %d statements %s, want a read, then one transaction of a few statements", minute, len(got), short(got))
			}
		}
		if got, want := v.count(t, v.jobs)-jobs, 10*500+5*300+2*200; got != want {
			t.Errorf("enqueued %d jobs alone, want %d", got, want)
		}
		t.Logf("%d statements for 10 wake-ups of 1,000 entries", b.c.sent()-n)
		b.kill(t)
	})
}

// BenchmarkIdleWake measures a wake-up of a scheduler of 1,000 entries whose
// ticks another process enqueued: one statement, whatever the entries.
func BenchmarkIdleWake(b *testing.B) {
	for _, e := range engines {
		e := e
		b.Run(e.name, func(b *testing.B) {
			v := setup(b, e)
			entries := thousand(b)
			begin := at("09:00").Add(30 * time.Second)
			other, mine := testclock.New(begin), testclock.New(begin)
			a := v.spawn(b, other, entries, nil, nil)
			other.WaitWaiting(b, 1, v.crashed)
			p := v.spawn(b, mine, entries, nil, nil)
			mine.WaitWaiting(b, 1, v.crashed)
			sent := 0
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				other.Advance(time.Minute)
				other.WaitWaiting(b, 1, v.crashed)
				n := p.c.sent()
				b.StartTimer()
				mine.Advance(time.Minute)
				mine.WaitWaiting(b, 1, v.crashed)
				sent += p.c.sent() - n
			}
			b.StopTimer()
			b.ReportMetric(float64(sent)/float64(b.N), "statements/wake")
			a.kill(b)
			p.kill(b)
		})
	}
}
