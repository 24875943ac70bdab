package cron_test

import (
	"strings"
	"testing"
	"time"
	_ "time/tzdata"

	"github.com/sqlinbox/inbox/periodic"
	"github.com/sqlinbox/inbox/periodic/cron"
)

func zone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func parse(t *testing.T, spec string, loc *time.Location) periodic.Schedule {
	t.Helper()
	s, err := cron.Parse(spec, loc)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// next returns the n ticks of s after from, in UTC.
func next(s periodic.Schedule, from time.Time, n int) []string {
	var out []string
	for t := from; len(out) < n; {
		t = s.Next(t)
		if t.IsZero() {
			break
		}
		out = append(out, t.UTC().Format("2006-01-02 15:04 Mon"))
	}
	return out
}

// The standard fields and the descriptors tick where cron says, in the
// zone given, whatever the zone of the time Next is asked from.
func TestParse(t *testing.T) {
	paris := zone(t, "Europe/Paris")
	from := time.Date(2025, 1, 30, 23, 30, 0, 0, time.UTC) // a Thursday
	for _, c := range []struct {
		spec string
		loc  *time.Location
		want []string
	}{
		{"*/20 * * * *", time.UTC, []string{"2025-01-30 23:40 Thu", "2025-01-31 00:00 Fri", "2025-01-31 00:20 Fri"}},
		{"30 2 * * *", paris, []string{"2025-01-31 01:30 Fri", "2025-02-01 01:30 Sat"}},
		{"0 9-17/4 * * mon-fri", time.UTC, []string{"2025-01-31 09:00 Fri", "2025-01-31 13:00 Fri", "2025-01-31 17:00 Fri", "2025-02-03 09:00 Mon"}},
		// A restricted day of month and day of week: either ticks.
		{"0 0 1 * sun", time.UTC, []string{"2025-02-01 00:00 Sat", "2025-02-02 00:00 Sun", "2025-02-09 00:00 Sun"}},
		{"@hourly", time.UTC, []string{"2025-01-31 00:00 Fri", "2025-01-31 01:00 Fri"}},
		{"@daily", paris, []string{"2025-01-31 23:00 Fri", "2025-02-01 23:00 Sat"}},
		{"@midnight", time.UTC, []string{"2025-01-31 00:00 Fri"}},
		{"@weekly", time.UTC, []string{"2025-02-02 00:00 Sun"}},
		{"@monthly", time.UTC, []string{"2025-02-01 00:00 Sat", "2025-03-01 00:00 Sat"}},
		{"@yearly", time.UTC, []string{"2026-01-01 00:00 Thu"}},
		{"@annually", time.UTC, []string{"2026-01-01 00:00 Thu"}},
		{"  0 0 29 2 *  ", time.UTC, []string{"2028-02-29 00:00 Tue"}},
	} {
		s := parse(t, c.spec, c.loc)
		if got := next(s, from, len(c.want)); strings.Join(got, ", ") != strings.Join(c.want, ", ") {
			t.Errorf("%q in %s: %q, want %q", c.spec, c.loc, got, c.want)
		}
		if got := next(s, from.In(zone(t, "Asia/Tokyo")), len(c.want)); strings.Join(got, ", ") != strings.Join(c.want, ", ") {
			t.Errorf("%q in %s from a time in Tokyo: %q, want %q", c.spec, c.loc, got, c.want)
		}
	}
}

// Summer time as robfig/cron computes it, and as the package doc says: a
// local time that the switch skips does not tick, one that it repeats ticks
// at each instant it names.
func TestSummerTime(t *testing.T) {
	ny := zone(t, "America/New_York")
	spring := parse(t, "30 2 * * *", ny)
	if got, want := next(spring, time.Date(2025, 3, 8, 12, 0, 0, 0, ny), 2), []string{"2025-03-10 06:30 Mon", "2025-03-11 06:30 Tue"}; strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Errorf("02:30 in New York around 9 March 2025: %q, want %q (no tick on the 9th)", got, want)
	}
	fall := parse(t, "30 1 * * *", ny)
	if got, want := next(fall, time.Date(2025, 11, 1, 12, 0, 0, 0, ny), 3), []string{"2025-11-02 05:30 Sun", "2025-11-02 06:30 Sun", "2025-11-03 06:30 Mon"}; strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Errorf("01:30 in New York around 2 November 2025: %q, want %q (two ticks on the 2nd)", got, want)
	}
}

// A spec that cannot work is an error naming it, and never a panic.
func TestParseRefuses(t *testing.T) {
	for _, c := range []struct {
		spec string
		loc  *time.Location
		want string
	}{
		{"61 * * * *", time.UTC, `cron: Parse("61 * * * *"): end of range (61) above maximum (59): 61`},
		{"not a spec", time.UTC, `cron: Parse("not a spec"): expected exactly 5 fields, found 3: [not a spec]`},
		{"* * * *", time.UTC, `cron: Parse("* * * *"): expected exactly 5 fields, found 4: [* * * *]`},
		{"0 0 * * * *", time.UTC, `cron: Parse("0 0 * * * *"): expected exactly 5 fields, found 6: [0 0 * * * *]`},
		{"*/0 * * * *", time.UTC, `cron: Parse("*/0 * * * *"): step of range should be a positive number: */0`},
		{"", time.UTC, `cron: Parse(""): empty spec`},
		{"@fortnightly", time.UTC, `cron: Parse("@fortnightly"): unrecognized descriptor: @fortnightly`},
		{"@every 1h", time.UTC, `cron: Parse("@every 1h"): @every ticks a delay after a process starts, which differs between processes: use periodic.Every`},
		{"CRON_TZ=Europe/Paris 0 2 * * *", time.UTC, `cron: Parse("CRON_TZ=Europe/Paris 0 2 * * *"): a time zone prefix: the time zone is Parse's loc`},
		{"TZ=", time.UTC, `cron: Parse("TZ="): a time zone prefix: the time zone is Parse's loc`},
		{"0 0 30 2 *", time.UTC, `cron: Parse("0 0 30 2 *"): the spec never ticks`},
		{"0 0 31 4,6,9,11 *", time.UTC, `cron: Parse("0 0 31 4,6,9,11 *"): the spec never ticks`},
		{"0 2 * * *", nil, `cron: Parse("0 2 * * *"): nil location: give the time zone, time.UTC for UTC`},
	} {
		s, err := cron.Parse(c.spec, c.loc)
		if err == nil || err.Error() != c.want || s != nil {
			t.Errorf("Parse(%q) = %v, %v\nwant the error %s", c.spec, s, err, c.want)
		}
	}
}

// Odd input never panics.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"* * * * *", "1-2-3 * * * *", "*/ * * * *", "/5 * * * *", "5-1 * * * *", "TZ= * * * *", "@", "0 0 L * *", "? ? ? ? ?", "0-0/1 0 1 1 0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		s, err := cron.Parse(spec, time.UTC)
		if err == nil {
			s.Next(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
		}
	})
}

// A schedule shows its spec and zone.
func TestString(t *testing.T) {
	s := parse(t, "0 2 * * *", zone(t, "Europe/Paris"))
	if got := s.(interface{ String() string }).String(); got != `"0 2 * * *" in Europe/Paris` {
		t.Errorf("String: %s", got)
	}
}
