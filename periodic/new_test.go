package periodic_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/fakedb"
	"github.com/sqlinbox/inbox/periodic"
)

func jobOf(name string) func(time.Time) inbox.Job {
	return func(tick time.Time) inbox.Job {
		return inbox.Job{Data: []any{name + "@" + tick.Format(time.RFC3339Nano)}}
	}
}

func hourly(t testing.TB) periodic.Schedule {
	t.Helper()
	s, err := periodic.Every(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func queueOn(t testing.TB, m *fakedb.DB, d inbox.Dialect) *inbox.Queue {
	t.Helper()
	q, err := inbox.New(m.DB, inbox.Config{Dialect: d, Table: inbox.Table{Name: "jobs", LockedUntil: "locked_until"}})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// renamed is a dialect of an engine periodic has no SQL for.
type renamed struct{ inbox.Dialect }

func (renamed) Name() string { return "cockroachdb" }

// wrapped wraps a dialect, naming it.
type wrapped struct{ renamed }

func (w wrapped) Unwrap() inbox.Dialect { return w.renamed.Dialect }

// Bad input is refused by New with an error naming the entry and the field,
// before anything is sent.
func TestNewRefuses(t *testing.T) {
	m := fakedb.New(t)
	q := queueOn(t, m, inbox.Postgres)
	ok := periodic.Entry{Name: "report", Schedule: hourly(t), Job: jobOf("report")}
	with := func(f func(*periodic.Entry)) []periodic.Entry {
		e := ok
		f(&e)
		return []periodic.Entry{e}
	}
	for _, c := range []struct {
		q    *inbox.Queue
		cfg  periodic.Config
		want string
	}{
		{nil, periodic.Config{Entries: []periodic.Entry{ok}}, "periodic: new: nil queue"},
		{q, periodic.Config{}, "periodic: new: no entries"},
		{q, periodic.Config{Entries: with(func(e *periodic.Entry) { e.Name = "" })}, `periodic: new: Entries[0].Name "": empty name`},
		{q, periodic.Config{Entries: with(func(e *periodic.Entry) { e.Name = "daily report" })},
			`periodic: new: Entries[0].Name "daily report": character ' ' at byte 5: names are ASCII letters, digits and _ - . : /`},
		{q, periodic.Config{Entries: with(func(e *periodic.Entry) { e.Name = strings.Repeat("x", 201) })},
			`periodic: new: Entries[0].Name "` + strings.Repeat("x", 201) + `": longer than 200 bytes`},
		{q, periodic.Config{Entries: []periodic.Entry{ok, with(func(e *periodic.Entry) { e.Name = "Report" })[0]}},
			`periodic: new: Entries[1].Name "Report": the name of another entry, "report" (names are compared regardless of case)`},
		{q, periodic.Config{Entries: with(func(e *periodic.Entry) { e.Schedule = nil })}, `periodic: new: entry "report": nil Schedule`},
		{q, periodic.Config{Entries: with(func(e *periodic.Entry) { e.Job = nil })}, `periodic: new: entry "report": nil Job`},
		{q, periodic.Config{Entries: with(func(e *periodic.Entry) { e.Missed = periodic.Backfill(0) })},
			`periodic: new: entry "report": Backfill(0): the bound must be at least 1`},
		{q, periodic.Config{Entries: []periodic.Entry{ok}, Table: "a.b.c"}, `periodic: new: table "a.b.c": at most one dot, between schema and table`},
		{q, periodic.Config{Entries: []periodic.Entry{ok}, Table: "periodic; DROP TABLE jobs"},
			`periodic: new: table "periodic; DROP TABLE jobs": character ';' at byte 8: identifiers are letters, digits and underscores, not starting with a digit`},
		{queueOn(t, m, renamed{inbox.Postgres}), periodic.Config{Entries: []periodic.Entry{ok}},
			`periodic: new: dialect "cockroachdb": periodic writes SQL for postgres, mysql, mariadb and sqlite, and dialects wrapping them (Unwrap)`},
	} {
		s, err := periodic.New(c.q, m.DB, c.cfg)
		if err == nil || err.Error() != c.want || s != nil {
			t.Errorf("New = %v, %v\nwant the error %s", s, err, c.want)
		}
	}
	if _, err := periodic.New(q, nil, periodic.Config{Entries: []periodic.Entry{ok}}); err == nil || err.Error() != "periodic: new: nil database" {
		t.Errorf("New with a nil database: %v", err)
	}
	if n := m.Sent(); n != 0 {
		t.Errorf("New sent %d calls, want none: %q", n, m.Log(0))
	}
	// A dialect wrapping a known one is that one's.
	if _, err := periodic.New(queueOn(t, m, wrapped{renamed{inbox.MariaDB}}), m.DB, periodic.Config{Entries: []periodic.Entry{ok}}); err != nil {
		t.Errorf("New on a wrapped dialect: %v", err)
	}
}

// CreateTableSQL gives each engine's table, quoted by its dialect.
func TestCreateTableSQL(t *testing.T) {
	for _, c := range []struct {
		d     inbox.Dialect
		table string
		want  string
	}{
		{inbox.Postgres, "", `CREATE TABLE IF NOT EXISTS "inbox_periodic" (
    name text PRIMARY KEY,
    last_tick timestamptz NOT NULL
)`},
		{inbox.Postgres, "ops.ticks", `CREATE TABLE IF NOT EXISTS "ops"."ticks" (
    name text PRIMARY KEY,
    last_tick timestamptz NOT NULL
)`},
		{inbox.MySQL, "", "CREATE TABLE IF NOT EXISTS `inbox_periodic` (\n    name VARCHAR(200) NOT NULL PRIMARY KEY,\n    last_tick DATETIME(6) NOT NULL\n) ENGINE=InnoDB"},
		{inbox.MariaDB, "ticks", "CREATE TABLE IF NOT EXISTS `ticks` (\n    name VARCHAR(200) NOT NULL PRIMARY KEY,\n    last_tick DATETIME(6) NOT NULL\n) ENGINE=InnoDB"},
		{inbox.SQLite, "", "CREATE TABLE IF NOT EXISTS `inbox_periodic` (\n    name TEXT NOT NULL PRIMARY KEY,\n    last_tick TEXT NOT NULL\n)"},
	} {
		got, err := periodic.CreateTableSQL(c.d, c.table)
		if err != nil || got != c.want {
			t.Errorf("CreateTableSQL(%s, %q) = %q, %v\nwant %q", c.d.Name(), c.table, got, err, c.want)
		}
	}
	if _, err := periodic.CreateTableSQL(renamed{inbox.SQLite}, ""); err == nil {
		t.Error("CreateTableSQL on an unknown dialect: no error")
	}
}

// The policies read as what they do.
func TestMissedPolicyString(t *testing.T) {
	if got := periodic.SkipToLatest.String(); got != "skip to latest" {
		t.Errorf("SkipToLatest: %q", got)
	}
	var zero periodic.MissedPolicy
	if zero != periodic.SkipToLatest {
		t.Error("the zero policy is not SkipToLatest")
	}
	if got := periodic.Backfill(6).String(); got != "backfill 6" {
		t.Errorf("Backfill(6): %q", got)
	}
}
