// Package periodic enqueues jobs on a schedule into an [inbox.Queue], each
// tick exactly once across any number of processes, with no leader.
//
// A [Scheduler] is given named entries, each a [Schedule] and a function
// building the tick's job. Its state is one row per entry in a small table of
// the queue's database ([CreateTableSQL]) holding the entry's last tick: a
// process enqueues a tick in the transaction that moves that row from the
// value it read to the tick, a compare-and-set that one process alone can
// win, so the job and the row commit together or not at all. Package
// github.com/sqlinbox/inbox/periodic/cron, a module of its own, reads cron
// expressions into schedules. See docs/periodic.md.
package periodic

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sqlinbox/inbox"
)

// DefaultTable is the state table's name when Config.Table is empty.
const DefaultTable = "inbox_periodic"

// MaxNameLen is the longest entry name, in bytes.
const MaxNameLen = 200

// A Schedule says when an entry ticks. Next returns the first tick strictly
// after after, or the zero Time when no tick comes. The ticks must be a fixed
// set of instants, the same whatever time Next is asked from and in every
// process ("every hour on the hour", not "an hour after the process
// started"): a tick is enqueued once because every process computes the same
// ticks. [Every] and package periodic/cron's schedules are such sets.
//
// The state table keeps microseconds: a tick with a finer part counts as the
// next whole microsecond.
type Schedule interface {
	Next(after time.Time) time.Time
}

// every ticks at the multiples of a duration since the Unix epoch.
type every time.Duration

// unixEpoch is where the ticks of Every are counted from.
var unixEpoch = time.Unix(0, 0).UTC()

// Every returns a schedule ticking at the multiples of d since the Unix
// epoch (00:00 UTC, 1 January 1970), so that every process agrees on the
// ticks: Every(time.Hour) ticks on the hour in UTC, and so in every zone
// whose offset is whole hours. Its ticks lie between the years 1678 and 2262,
// the range of a time.Duration from the epoch; outside it Next returns the
// zero Time. It returns an error for a d that is not positive, or not a
// whole number of microseconds (the state table's precision).
func Every(d time.Duration) (Schedule, error) {
	if d <= 0 {
		return nil, fmt.Errorf("periodic: Every(%v): the interval must be positive", d)
	}
	if d%time.Microsecond != 0 {
		return nil, fmt.Errorf("periodic: Every(%v): the interval must be a whole number of microseconds, the state table's precision", d)
	}
	return every(d), nil
}

func (e every) Next(after time.Time) time.Time {
	d := time.Duration(e)
	since := after.Sub(unixEpoch) // saturates outside 1678–2262
	if since == minDuration || since == maxDuration {
		return time.Time{}
	}
	k := since / d
	if since%d < 0 {
		k-- // floor, before the epoch
	}
	if k+1 > maxDuration/d {
		return time.Time{}
	}
	return unixEpoch.Add((k + 1) * d)
}

// String is "every 1h0m0s".
func (e every) String() string { return "every " + time.Duration(e).String() }

const (
	minDuration time.Duration = -1 << 63
	maxDuration time.Duration = 1<<63 - 1
)

// MissedPolicy says which of the ticks that came due while no process ran an
// entry are enqueued when one does again. The zero value is [SkipToLatest].
// The ticks the policy passes over are done for good: their jobs are never
// enqueued.
type MissedPolicy struct {
	backfill int // the most ticks enqueued at once; 0 for the latest alone
	set      bool
}

// SkipToLatest enqueues the latest tick that came due and none before it,
// so that a scheduler back after a downtime runs the entry once, as of now.
// It is the zero [MissedPolicy].
var SkipToLatest = MissedPolicy{}

// Backfill enqueues every tick that came due, in tick order, but at most the
// latest n of them: an entry down for a day on an hourly schedule with
// Backfill(6) gets the last six hours' jobs. [New] refuses an n under 1.
func Backfill(n int) MissedPolicy { return MissedPolicy{backfill: n, set: true} }

// max is how many ticks the policy enqueues at most at once.
func (p MissedPolicy) max() int {
	if !p.set {
		return 1
	}
	return p.backfill
}

// String is "skip to latest" or "backfill 6".
func (p MissedPolicy) String() string {
	if !p.set {
		return "skip to latest"
	}
	return fmt.Sprintf("backfill %d", p.backfill)
}

// Entry is one named schedule and the job its ticks enqueue.
type Entry struct {
	// Name keys the entry's row in the state table: 1 to [MaxNameLen]
	// bytes of ASCII letters, digits and _ - . : /, unique in the
	// scheduler regardless of case (MySQL compares names without it).
	// Every process running the entry gives it the same name and schedule;
	// renaming an entry starts it afresh, as a new one.
	Name string
	// Schedule says when the entry ticks.
	Schedule Schedule
	// Job builds the job of one tick, given the tick in UTC. It runs in
	// the goroutine of [Scheduler.Run] before the tick is enqueued, and may
	// run again for the same tick when the transaction enqueueing it fails
	// or another process wins it, so it should have no effect but its
	// result. The job is enqueued with [inbox.Queue.EnqueueMany].
	Job func(tick time.Time) inbox.Job
	// Missed is the policy for ticks missed while no process ran the entry.
	Missed MissedPolicy
}

// Config configures a [Scheduler]. Its zero value, but for Entries, means the
// defaults. [New] takes it by value.
type Config struct {
	// Table is the state table, optionally schema-qualified; empty means
	// [DefaultTable]. [CreateTableSQL] gives its definition. Schedulers of
	// other queues may share it, their entries named apart.
	Table string
	// Entries are the scheduler's entries, at least one.
	Entries []Entry
	// Now is the clock; nil means time.Now. Processes whose clocks disagree
	// still enqueue each tick once: the first clock to reach a tick runs it.
	Now func() time.Time
	// After replaces time.After, with Now, so that a test clock drives the
	// scheduler's waits.
	After func(time.Duration) <-chan time.Time
	// OnError, when set, is told of the errors Run meets once started and
	// does not return: a statement that failed (the entries concerned are
	// tried again after a backoff of 100 ms doubled up to a minute), a
	// schedule that misbehaves. It runs in Run's goroutine. This is where to
	// log.
	OnError func(error)
}

// Scheduler enqueues the ticks of its entries into a queue. It is immutable
// after [New] and safe for concurrent use; [Scheduler.Run] keeps its own state
// for the length of the call.
type Scheduler struct {
	q       *inbox.Queue
	db      *sql.DB
	entries []Entry
	byName  map[string]int
	now     func() time.Time
	after   func(time.Duration) <-chan time.Time
	onError func(error)
	sql     *statements
	timeArg func(time.Time) any
	scan    func(any) (time.Time, error)
}

// New returns a scheduler enqueueing the ticks of cfg.Entries into q, its
// state in cfg.Table of db, which must be the database of q's table: a tick's
// job and its row commit in one transaction. It does no I/O. It returns an
// error, naming the entry and the field, for a nil q or db, no entries, an
// entry with a bad or duplicate name, no schedule, no job, or a Backfill under
// 1; for a bad table name; and for a dialect periodic writes no SQL for (it
// knows PostgreSQL, MySQL, MariaDB and SQLite, and dialects wrapping them).
func New(q *inbox.Queue, db *sql.DB, cfg Config) (*Scheduler, error) {
	if q == nil {
		return nil, errors.New("periodic: new: nil queue")
	}
	if db == nil {
		return nil, errors.New("periodic: new: nil database")
	}
	if len(cfg.Entries) == 0 {
		return nil, errors.New("periodic: new: no entries")
	}
	s := &Scheduler{q: q, db: db, byName: make(map[string]int, len(cfg.Entries)), now: cfg.Now, after: cfg.After, onError: cfg.OnError}
	folded := make(map[string]string, len(cfg.Entries))
	for i, e := range cfg.Entries {
		if err := checkName(e.Name); err != nil {
			return nil, fmt.Errorf("periodic: new: Entries[%d].Name %q: %v", i, e.Name, err)
		}
		if other, dup := folded[strings.ToLower(e.Name)]; dup {
			return nil, fmt.Errorf("periodic: new: Entries[%d].Name %q: the name of another entry, %q (names are compared regardless of case)", i, e.Name, other)
		}
		folded[strings.ToLower(e.Name)] = e.Name
		if e.Schedule == nil {
			return nil, fmt.Errorf("periodic: new: entry %q: nil Schedule", e.Name)
		}
		if e.Job == nil {
			return nil, fmt.Errorf("periodic: new: entry %q: nil Job", e.Name)
		}
		if e.Missed.max() < 1 {
			return nil, fmt.Errorf("periodic: new: entry %q: Backfill(%d): the bound must be at least 1", e.Name, e.Missed.backfill)
		}
		s.byName[e.Name] = i
	}
	s.entries = append([]Entry(nil), cfg.Entries...)
	d := q.Config().Dialect
	st, err := newStatements(d, cfg.Table)
	if err != nil {
		return nil, fmt.Errorf("periodic: new: %w", err)
	}
	s.sql, s.timeArg, s.scan = st, d.TimeArg, d.ScanTime
	if s.now == nil {
		s.now = time.Now
	}
	if s.after == nil {
		s.after = time.After
	}
	return s, nil
}

// checkName enforces the rule of Entry.Name.
func checkName(n string) error {
	if n == "" {
		return errors.New("empty name")
	}
	if len(n) > MaxNameLen {
		return fmt.Errorf("longer than %d bytes", MaxNameLen)
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		ok := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("_-.:/", c) >= 0
		if !ok {
			return fmt.Errorf("character %q at byte %d: names are ASCII letters, digits and _ - . : /", c, i)
		}
	}
	return nil
}

// EntryState is one entry's state as [Scheduler.Entries] read it.
type EntryState struct {
	// Name is the entry's.
	Name string
	// Last is the entry's last tick, enqueued or passed over by its
	// policy, in UTC: every tick up to it is done. When the entry was
	// registered, before its first tick, it is the time of registration.
	// Zero when no scheduler has registered the entry yet.
	Last time.Time
	// Next is the tick after Last by the entry's schedule, in UTC: the next
	// one to be enqueued. Zero when Last is, or when the schedule has no
	// tick after Last.
	Next time.Time
}

// Entries reads the state of the scheduler's entries, in the order of
// Config.Entries, in one statement per thousand entries: for a dashboard or
// a health check. A failed read is returned as "periodic: entries: …".
func (s *Scheduler) Entries(ctx context.Context) ([]EntryState, error) {
	names := make([]string, len(s.entries))
	for i, e := range s.entries {
		names[i] = e.Name
	}
	lasts, err := s.read(ctx, names)
	if err != nil {
		return nil, fmt.Errorf("periodic: entries: %w", err)
	}
	out := make([]EntryState, len(s.entries))
	for i, e := range s.entries {
		out[i].Name = e.Name
		last, ok := lasts[e.Name]
		if !ok {
			continue
		}
		out[i].Last = last
		if next, err := nextTick(e.Schedule, last); err == nil {
			out[i].Next = next
		}
	}
	return out, nil
}
