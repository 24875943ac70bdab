package enginetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/periodic"
	"github.com/sqlinbox/inbox/periodic/internal/testclock"
)

// usersKeyed gives the test's queue table a unique key column and index,
// and returns the schema that qualifies the test's tables.
func (v *env) usersKeyed(t *testing.T) string {
	t.Helper()
	schemaSQL, col := "SELECT 'main'", "TEXT"
	switch v.e.dialect {
	case inbox.Postgres:
		schemaSQL, col = "SELECT current_schema()", "text"
	case inbox.MariaDB:
		schemaSQL, col = "SELECT DATABASE()", "varchar(191) NULL"
	}
	for _, s := range []string{"ALTER TABLE " + v.jobs + " ADD COLUMN unique_key " + col,
		"CREATE UNIQUE INDEX " + v.jobs + "_key ON " + v.jobs + " (unique_key)"} {
		if _, err := v.admin.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	var schema string
	if err := v.admin.QueryRow(schemaSQL).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	return schema
}

// usersSpawn starts a scheduler of entries on a pool of its own, with the
// queue table and the state table named as given.
func (v *env) usersSpawn(t *testing.T, clock *testclock.Clock, jobs, state string, entries []periodic.Entry, onError func(error)) *proc {
	t.Helper()
	p := &proc{}
	p.db, p.c = v.openCounter(t, nil)
	q, err := inbox.New(p.db, inbox.Config{Dialect: v.e.dialect,
		Table: inbox.Table{Name: jobs, LockedUntil: "locked_until", UniqueKey: "unique_key"}})
	if err != nil {
		t.Fatal(err)
	}
	var after func(time.Duration) <-chan time.Time
	after, p.drop = clock.Owner()
	p.s, err = periodic.New(q, p.db, periodic.Config{Table: state, Entries: entries, OnError: onError, Now: clock.Now, After: after})
	if err != nil {
		t.Fatal(err)
	}
	p.r = v.start(t, p.s)
	return p
}

// usersKeyedEntry is an entry whose every job carries the unique key
// "report".
func usersKeyedEntry(name string, s periodic.Schedule, missed periodic.MissedPolicy) periodic.Entry {
	return periodic.Entry{Name: name, Schedule: s, Missed: missed, Job: func(tick time.Time) inbox.Job {
		return inbox.Job{Data: []any{payload(name, tick)}, UniqueKey: "report"}
	}}
}

// usersTwo starts two schedulers of entries at 09:59: one on the plain
// names of the queue and state tables, the other on a pool of its own with
// both names qualified.
func (v *env) usersTwo(t *testing.T, entries []periodic.Entry, log *errorLog) (*testclock.Clock, *proc) {
	schema := v.usersKeyed(t)
	clock := testclock.New(at("09:59"))
	p := v.usersSpawn(t, clock, v.jobs, v.state, entries, log.add)
	v.usersSpawn(t, clock, schema+"."+v.jobs, schema+"."+v.state, entries, log.add)
	v.waitIdle(t, clock, 2)
	return clock, p
}

// TestUsersPeriodicKeyHeld: an entry whose job's unique key is still held
// by the job of an earlier tick (not run yet) skips the tick: the held job
// stands for it. The row moves on, nothing is reported, and the other
// entry of the same wake-up is enqueued; once the holder is gone the next
// tick enqueues again. Two schedulers, on two pools, name the queue and
// state tables plainly and qualified. Before, the tick failed with
// ErrDuplicate, was reported and tried again every backoff until the
// holder left, and then enqueued late.
func TestUsersPeriodicKeyHeld(t *testing.T) {
	forEach(t, func(t *testing.T, v *env) {
		minute := every(t, time.Minute)
		var log errorLog
		clock, p := v.usersTwo(t, []periodic.Entry{entry("plain", minute, periodic.SkipToLatest),
			usersKeyedEntry("keyed", minute, periodic.SkipToLatest)}, &log)
		clock.Advance(time.Minute) // 10:00
		v.waitIdle(t, clock, 2)
		clock.Advance(time.Minute) // 10:01: keyed|10:00 holds the key
		v.waitIdle(t, clock, 2)
		v.wantTicks(t, map[string][]time.Time{"plain": ats("10:00", "10:01"), "keyed": ats("10:00")})
		if last := v.lastTicks(t, p.s)["keyed"]; !last.Equal(at("10:01")) {
			t.Errorf("keyed: last tick %v, want 10:01 (skipped, done)", last)
		}
		if _, err := v.admin.Exec("DELETE FROM "+v.jobs+" WHERE payload = "+v.usersBind(1), payload("keyed", at("10:00"))); err != nil {
			t.Fatal(err)
		}
		clock.Advance(time.Minute) // 10:02: the key is free
		v.waitIdle(t, clock, 2)
		v.wantTicks(t, map[string][]time.Time{"plain": ats("10:00", "10:01", "10:02"), "keyed": ats("10:02")})
		if got := log.list(); len(got) != 0 {
			t.Errorf("OnError: %q", got)
		}
	})
}

// TestUsersPeriodicKeyBackfill: a keyed entry under Backfill(3) with three
// ticks due at once (the schedulers were behind) enqueues the first tick's
// job; the two others find the key held by it and are skipped, and the
// row moves to the latest. Before, EnqueueMany refused the key given twice
// in one call, the transaction rolled back, and every try after sent the
// same ticks again: the entry never moved again.
func TestUsersPeriodicKeyBackfill(t *testing.T) {
	forEach(t, func(t *testing.T, v *env) {
		minute := every(t, time.Minute)
		var log errorLog
		clock, p := v.usersTwo(t, []periodic.Entry{entry("plain", minute, periodic.Backfill(3)),
			usersKeyedEntry("keyed", minute, periodic.Backfill(3))}, &log)
		clock.Advance(3 * time.Minute) // 10:00, 10:01, 10:02 at once
		v.waitIdle(t, clock, 2)
		v.wantTicks(t, map[string][]time.Time{"plain": ats("10:00", "10:01", "10:02"), "keyed": ats("10:00")})
		if last := v.lastTicks(t, p.s)["keyed"]; !last.Equal(at("10:02")) {
			t.Errorf("keyed: last tick %v, want 10:02", last)
		}
		if got := log.list(); len(got) != 0 {
			t.Errorf("OnError: %q", got)
		}
	})
}

// usersBind is the engine's placeholder n.
func (v *env) usersBind(n int) string {
	if v.e.dialect == inbox.Postgres {
		return fmt.Sprintf("$%d", n)
	}
	return "?"
}
