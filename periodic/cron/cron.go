// Package cron reads cron expressions into schedules of package
// github.com/sqlinbox/inbox/periodic, with the parser of
// github.com/robfig/cron/v3. It is a module of its own so that package
// periodic stays on the standard library.
package cron

import (
	"errors"
	"fmt"
	"strings"
	"time"

	robfig "github.com/robfig/cron/v3"

	"github.com/sqlinbox/inbox/periodic"
)

// parser reads the standard five fields (minute, hour, day of month, month,
// day of week) and the descriptors @yearly (@annually), @monthly, @weekly,
// @daily (@midnight) and @hourly.
var parser = robfig.NewParser(robfig.Minute | robfig.Hour | robfig.Dom | robfig.Month | robfig.Dow | robfig.Descriptor)

// Parse returns the schedule of the cron expression spec in the time zone
// loc: "30 2 * * *" ticks at 02:30 in loc every day. The fields are the
// standard five, minute, hour, day of month, month and day of week, with
// lists, ranges, steps and names ("0 9-17/2 * * mon-fri"), where a
// restricted day of month and day of week both match (either one ticks); or
// a descriptor: @yearly, @annually, @monthly, @weekly, @daily, @midnight or
// @hourly.
//
// The ticks are those robfig/cron/v3 computes, in loc: a time that a switch
// to summer time skips does not tick (robfig moves on to the next match), and
// a time that the switch back repeats ticks once per instant it names, so
// twice for a spec naming that hour. A time.Local loc is the machine's zone,
// which every process running the entry must share; a named zone
// (time.LoadLocation) does not depend on the machine. robfig looks five years
// ahead at most: a spec with no tick in five years ("0 0 29 2 *" from 2097)
// ticks no more.
//
// It returns an error, naming spec, for a nil loc, a spec robfig cannot
// parse, a spec with no tick (the 30th of February), a time zone prefix
// (TZ= or CRON_TZ=: the zone is loc), and @every, whose ticks are a delay
// from whenever a process starts and so differ between processes: use
// periodic.Every.
func Parse(spec string, loc *time.Location) (periodic.Schedule, error) {
	s, err := parse(spec, loc)
	if err != nil {
		return nil, fmt.Errorf("cron: Parse(%q): %w", spec, err)
	}
	return s, nil
}

func parse(spec string, loc *time.Location) (s *schedule, err error) {
	if loc == nil {
		return nil, errors.New("nil location: give the time zone, time.UTC for UTC")
	}
	trimmed := strings.TrimSpace(spec)
	switch {
	case trimmed == "":
		return nil, errors.New("empty spec")
	case strings.HasPrefix(trimmed, "TZ=") || strings.HasPrefix(trimmed, "CRON_TZ="):
		return nil, errors.New("a time zone prefix: the time zone is Parse's loc")
	case strings.HasPrefix(trimmed, "@every"):
		return nil, errors.New("@every ticks a delay after a process starts, which differs between processes: use periodic.Every")
	}
	// The parser has panicked on inputs it should have refused; a bad
	// spec is an error here whatever it does.
	defer func() {
		if p := recover(); p != nil {
			s, err = nil, fmt.Errorf("the parser failed: %v", p)
		}
	}()
	parsed, err := parser.Parse(trimmed)
	if err != nil {
		return nil, err
	}
	spec6, ok := parsed.(*robfig.SpecSchedule)
	if !ok {
		return nil, fmt.Errorf("the parser returned a %T, not a fixed set of times", parsed)
	}
	spec6.Location = loc
	s = &schedule{spec: trimmed, s: spec6, loc: loc}
	// Every spec of five fields that can tick does so within five years,
	// leap days included, from any start; robfig looks that far.
	if s.Next(time.Date(2000, 1, 1, 0, 0, 0, 0, loc)).IsZero() {
		return nil, errors.New("the spec never ticks")
	}
	return s, nil
}

// schedule is a parsed cron expression in its time zone.
type schedule struct {
	spec string
	s    *robfig.SpecSchedule
	loc  *time.Location
}

// Next returns the first tick after after, in loc.
func (s *schedule) Next(after time.Time) time.Time {
	// robfig reads a time.Local schedule in the zone of the time given.
	return s.s.Next(after.In(s.loc))
}

// String is the spec and its zone: `"0 2 * * *" in Europe/Paris`.
func (s *schedule) String() string { return fmt.Sprintf("%q in %s", s.spec, s.loc) }
