package periodic_test

import (
	"context"
	"database/sql/driver"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/fakedb"
	"github.com/sqlinbox/inbox/periodic"
	"github.com/sqlinbox/inbox/periodic/internal/testclock"
)

// timeIs matches a time parameter: the value d.TimeArg gives, compared as
// an instant when it is a time.Time.
type timeIs struct{ want any }

func (a timeIs) Match(v driver.Value) bool {
	if w, ok := a.want.(time.Time); ok {
		got, ok := v.(time.Time)
		return ok && got.Equal(w)
	}
	return v == a.want
}

// errs collects what OnError is told.
type errs struct {
	mu  sync.Mutex
	got []string
}

func (e *errs) add(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.got = append(e.got, err.Error())
}

func (e *errs) list() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.got...)
}

// running runs s until the test ends it with stop, which fails the test if
// Run returned an error.
func running(t *testing.T, s *periodic.Scheduler) (stop func(), done <-chan struct{}) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan struct{})
	var err error
	go func() {
		defer close(ch)
		err = s.Run(ctx)
	}()
	stop = func() {
		t.Helper()
		cancel()
		<-ch
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	t.Cleanup(func() { cancel(); <-ch })
	return stop, ch
}

// The statements of a scheduler of two minutely entries on each engine,
// pinned exactly, through its start (one entry registered, one new), a
// wake-up whose ticks another process enqueued (one statement), one whose
// compare-and-set another process beat (rolled back, read again), and a
// failed read (reported, tried again after the backoff).
func TestRunStatements(t *testing.T) {
	for _, c := range []struct {
		d                            inbox.Dialect
		read2, read1, register, cas2 string
	}{
		{inbox.Postgres,
			`SELECT name, last_tick FROM "inbox_periodic" WHERE name IN ($1, $2)`,
			`SELECT name, last_tick FROM "inbox_periodic" WHERE name IN ($1)`,
			`INSERT INTO "inbox_periodic" (name, last_tick) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING`,
			`UPDATE "inbox_periodic" SET last_tick = CASE name WHEN $1 THEN CAST($2 AS timestamptz) WHEN $3 THEN CAST($4 AS timestamptz) END WHERE name IN ($5, $6) AND last_tick = CASE name WHEN $7 THEN CAST($8 AS timestamptz) WHEN $9 THEN CAST($10 AS timestamptz) END`},
		{inbox.MariaDB,
			"SELECT name, last_tick FROM `inbox_periodic` WHERE name IN (?, ?)",
			"SELECT name, last_tick FROM `inbox_periodic` WHERE name IN (?)",
			"INSERT INTO `inbox_periodic` (name, last_tick) VALUES (?, ?) ON DUPLICATE KEY UPDATE name = name",
			"UPDATE `inbox_periodic` SET last_tick = CASE name WHEN ? THEN ? WHEN ? THEN ? END WHERE name IN (?, ?) AND last_tick = CASE name WHEN ? THEN ? WHEN ? THEN ? END"},
		{inbox.SQLite,
			"SELECT name, last_tick FROM `inbox_periodic` WHERE name IN (?, ?)",
			"SELECT name, last_tick FROM `inbox_periodic` WHERE name IN (?)",
			"INSERT INTO `inbox_periodic` (name, last_tick) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
			"UPDATE `inbox_periodic` SET last_tick = CASE name WHEN ? THEN ? WHEN ? THEN ? END WHERE name IN (?, ?) AND last_tick = CASE name WHEN ? THEN ? WHEN ? THEN ? END"},
	} {
		t.Run(c.d.Name(), func(t *testing.T) {
			m := fakedb.New(t)
			d := c.d
			at := func(hms string) time.Time {
				tm, err := time.Parse("15:04:05.999999", hms)
				if err != nil {
					t.Fatal(err)
				}
				return time.Date(2025, 3, 10, tm.Hour(), tm.Minute(), tm.Second(), tm.Nanosecond(), time.UTC)
			}
			arg := func(tm time.Time) timeIs { return timeIs{d.TimeArg(tm)} }
			rows := func(a, b string) *sqlmock.Rows {
				r := sqlmock.NewRows([]string{"name", "last_tick"})
				if a != "" {
					r.AddRow("a", d.TimeArg(at(a)))
				}
				if b != "" {
					r.AddRow("b", d.TimeArg(at(b)))
				}
				return r
			}
			clock := testclock.New(at("12:00:30.5000007"))
			var reported errs
			s, err := periodic.New(queueOn(t, m, d), m.DB, periodic.Config{
				Entries: []periodic.Entry{
					{Name: "a", Schedule: minutely(t), Job: jobOf("a")},
					{Name: "b", Schedule: minutely(t), Job: jobOf("b"), Missed: periodic.Backfill(3)},
				},
				Now: clock.Now, After: clock.After, OnError: reported.add,
			})
			if err != nil {
				t.Fatal(err)
			}
			// Start: a is registered, b is not: b's registration time is
			// the clock's, to the microsecond.
			m.ExpectQuery(c.read2).WithArgs("a", "b").WillReturnRows(rows("12:00:00", ""))
			m.ExpectExec(c.register).WithArgs("b", arg(at("12:00:30.5"))).WillReturnResult(sqlmock.NewResult(0, 1))
			m.ExpectQuery(c.read1).WithArgs("b").WillReturnRows(rows("", "12:00:30.5"))
			// 12:01: another process enqueued both ticks.
			m.ExpectQuery(c.read2).WithArgs("a", "b").WillReturnRows(rows("12:01:00", "12:01:00"))
			// 12:02: another process beats this one to both rows.
			m.ExpectQuery(c.read2).WithArgs("a", "b").WillReturnRows(rows("12:01:00", "12:01:00"))
			m.ExpectBegin()
			m.ExpectExec(c.cas2).WithArgs("a", arg(at("12:02:00")), "b", arg(at("12:02:00")), "a", "b", "a", arg(at("12:01:00")), "b", arg(at("12:01:00"))).
				WillReturnResult(sqlmock.NewResult(0, 0))
			m.ExpectRollback()
			m.ExpectQuery(c.read2).WithArgs("a", "b").WillReturnRows(rows("12:02:00", "12:02:00"))
			// 12:03: the read fails, and succeeds 100 ms later.
			m.ExpectQuery(c.read2).WithArgs("a", "b").WillReturnError(errors.New("connection refused"))
			m.ExpectQuery(c.read2).WithArgs("a", "b").WillReturnRows(rows("12:03:00", "12:03:00"))

			stop, done := running(t, s)
			step := func(what string, d time.Duration, want ...string) {
				t.Helper()
				clock.WaitWaiting(t, 1, done)
				if got, ok := clock.Earliest(); !ok || got != d {
					t.Fatalf("%s: the scheduler waits %v, want %v", what, got, d)
				}
				n := m.Sent()
				clock.Advance(d)
				clock.WaitWaiting(t, 1, done)
				got := m.Log(n)
				for i := range got {
					got[i], _, _ = strings.Cut(got[i], " ")
				}
				if strings.Join(got, " ") != strings.Join(want, " ") {
					t.Errorf("%s: sent %q, want %q", what, got, want)
				}
			}
			step("12:01, done elsewhere", 29500*time.Millisecond-700*time.Nanosecond, "query")
			step("12:02, beaten", time.Minute, "query", "begin", "exec", "rollback", "query")
			step("12:03, read fails", time.Minute, "query")
			step("12:03, tried again", minBackoff, "query")
			clock.WaitWaiting(t, 1, done)
			if got, _ := clock.Earliest(); got != time.Minute-minBackoff {
				t.Errorf("after 12:03: the scheduler waits %v, want %v", got, time.Minute-minBackoff)
			}
			stop()
			m.Met(t)
			if got := reported.list(); len(got) != 1 || got[0] != "periodic: read: connection refused" {
				t.Errorf("OnError got %q, want the failed read", got)
			}
		})
	}
}

// minBackoff is the first backoff after an error.
const minBackoff = 100 * time.Millisecond

func minutely(t testing.TB) periodic.Schedule {
	t.Helper()
	s, err := periodic.Every(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A row that reads back unchanged after its compare-and-set failed means
// the column does not compare equal to the value read (a type other than
// CreateTableSQL's): an error, reported, and not a loop of statements.
func TestRunCASNeverMatches(t *testing.T) {
	m := fakedb.New(t)
	d := inbox.Postgres
	start := time.Date(2025, 3, 10, 12, 0, 30, 0, time.UTC)
	last := start.Truncate(time.Minute)
	clock := testclock.New(start)
	var reported errs
	s, err := periodic.New(queueOn(t, m, d), m.DB, periodic.Config{
		Table:   "ops.ticks",
		Entries: []periodic.Entry{{Name: "a", Schedule: minutely(t), Job: jobOf("a")}},
		Now:     clock.Now, After: clock.After, OnError: reported.add,
	})
	if err != nil {
		t.Fatal(err)
	}
	read := `SELECT name, last_tick FROM "ops"."ticks" WHERE name IN ($1)`
	row := func() *sqlmock.Rows { return sqlmock.NewRows([]string{"name", "last_tick"}).AddRow("a", last) }
	m.ExpectQuery(read).WithArgs("a").WillReturnRows(row())
	m.ExpectQuery(read).WithArgs("a").WillReturnRows(row())
	m.ExpectBegin()
	m.ExpectExec(`UPDATE "ops"."ticks" SET last_tick = $1 WHERE name = $2 AND last_tick = $3`).
		WithArgs(timeIs{last.Add(time.Minute)}, "a", timeIs{last}).WillReturnResult(sqlmock.NewResult(0, 0))
	m.ExpectRollback()
	m.ExpectQuery(read).WithArgs("a").WillReturnRows(row())
	stop, done := running(t, s)
	clock.WaitWaiting(t, 1, done)
	clock.Advance(30 * time.Second)
	clock.WaitWaiting(t, 1, done)
	if got, _ := clock.Earliest(); got != minBackoff {
		t.Errorf("the scheduler waits %v, want the backoff", got)
	}
	stop()
	m.Met(t)
	want := `periodic: entry "a": the compare-and-set of its row failed, yet the row still holds the last tick read, 2025-03-10T12:00:00Z: is last_tick of the type CreateTableSQL gives?`
	if got := reported.list(); len(got) != 1 || got[0] != want {
		t.Errorf("OnError got %q\nwant %q", got, want)
	}
}

// A start that fails is Run's error, and nothing more is sent.
func TestRunStartFails(t *testing.T) {
	m := fakedb.New(t)
	s, err := periodic.New(queueOn(t, m, inbox.SQLite), m.DB, periodic.Config{
		Entries: []periodic.Entry{{Name: "a", Schedule: minutely(t), Job: jobOf("a")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	m.ExpectQuery("SELECT name, last_tick FROM `inbox_periodic` WHERE name IN (?)").WithArgs("a").
		WillReturnError(errors.New("no such table: inbox_periodic"))
	err = s.Run(context.Background())
	if err == nil || err.Error() != "periodic: start: no such table: inbox_periodic" {
		t.Errorf("Run: %v, want the start's error", err)
	}
	m.Met(t)
	if n := m.Sent(); n != 1 {
		t.Errorf("sent %q, want the one read", m.Log(0))
	}
}
