package dbtest

// The suites' scaffolding: running a test on every engine and form, its
// tables, pools, queues and configuration, and waiting with a deadline.

import (
	"database/sql"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/dbtest/internal/cluster"
	"github.com/sqlinbox/inbox/internal/fakeclock"
)

// openTwo opens two pools on the same database (for SQLite, the same
// file): two processes, as far as the queue can tell.
func openTwo(t *testing.T, e Engine, maxConns int) (*sql.DB, *sql.DB) {
	t.Helper()
	dsn := e.DSN(t, t.TempDir())
	return e.OpenDSN(t, dsn, maxConns), e.OpenDSN(t, dsn, maxConns)
}

// keyedQueue returns a queue that enqueues (payload, k) into an advisory-k
// table.
func keyedQueue(t testing.TB, db *sql.DB, e Engine, table string) *inbox.Queue {
	tb := Table(table, "advisory-k")
	tb.Data = []string{"payload", "k"}
	return newQueue(t, db, queueConfig(e, tb, nil))
}

// clockStart is where fake clocks start: far from the real clock, so a
// statement that read the engine's clock instead of the injected one would
// see every lease as long expired or far in the future.
var clockStart = time.Date(2031, 3, 4, 5, 6, 7, 123456789, time.UTC)

// eachForm runs fn as subtest <engine>/<form> for every engine and every
// form forms lists for it.
func eachForm(t *testing.T, forms func(Engine) []string, fn func(t *testing.T, e Engine, form string)) {
	t.Helper()
	for _, e := range Engines {
		for _, form := range forms(e) {
			t.Run(e.Name+"/"+form, func(t *testing.T) { fn(t, e, form) })
		}
	}
}

// eachEngine runs fn as subtest <engine> for every engine keep accepts
// (every engine when keep is nil).
func eachEngine(t *testing.T, keep func(Engine) bool, fn func(t *testing.T, e Engine)) {
	t.Helper()
	for _, e := range Engines {
		if keep != nil && !keep(e) {
			continue
		}
		t.Run(e.Name, func(t *testing.T) { fn(t, e) })
	}
}

func formsOf(e Engine) []string { return e.Forms() }

// formsWithKey adds the advisory form keyed on a shared column.
func formsWithKey(e Engine) []string { return append(e.Forms(), "advisory-k") }

func leaseOnly(Engine) []string { return []string{"lease"} }

func notSQLite(e Engine) bool { return !e.IsSQLite() }

// tableName is the table of one test on one engine: conf_<what>_<engine>.
func tableName(e Engine, what string) string {
	return "conf_" + strings.ReplaceAll(what, "-", "_") + "_" + e.Name
}

// newTable creates the table of one test (dropping any left by an earlier
// run), and drops it again when the test passed.
func newTable(t *testing.T, e Engine, db *sql.DB, what string) string {
	t.Helper()
	table := tableName(e, what)
	e.CreateTable(t, db, table)
	dropAtEnd(t, e, db, table, table+"_dead", table+"_claims")
	return table
}

// addColumns adds optional columns to table in each engine's type:
// last_error, priority (NOT NULL DEFAULT 0) and enqueued_at, and on the
// dead table dead.last_error and dead.dead_at.
func addColumns(t testing.TB, e Engine, db *sql.DB, table string, cols ...string) {
	t.Helper()
	for _, c := range cols {
		tb := table
		if name, ok := strings.CutPrefix(c, "dead."); ok {
			tb, c = table+"_dead", name
		}
		types, ok := columnTypes[c]
		if !ok {
			t.Fatalf("addColumns: no column %q", c)
		}
		typ := types[0]
		switch {
		case e.IsMySQL():
			typ = types[1]
		case e.IsSQLite():
			typ = types[2]
		}
		mustExec(t, e, db, "ALTER TABLE "+tb+" ADD COLUMN "+c+" "+typ)
	}
}

// columnTypes are the optional columns' types on PostgreSQL, MySQL and
// SQLite.
var columnTypes = map[string][3]string{
	"last_error":  {"text", "text NULL", "TEXT"},
	"priority":    {"integer NOT NULL DEFAULT 0", "integer NOT NULL DEFAULT 0", "INTEGER NOT NULL DEFAULT 0"},
	"enqueued_at": {"timestamptz", "DATETIME(6) NULL", "TEXT"},
	"dead_at":     {"timestamptz", "DATETIME(6) NULL", "TEXT"},
}

// dropAtEnd drops tables after a passing test; a failing one leaves them
// to look at.
func dropAtEnd(t *testing.T, e Engine, db *sql.DB, tables ...string) {
	if e.IsSQLite() {
		return // the file goes with the test's directory
	}
	t.Cleanup(func() {
		if t.Failed() {
			return
		}
		for _, tb := range tables {
			if _, err := db.Exec("DROP TABLE IF EXISTS " + tb); err != nil {
				t.Errorf("drop %s: %v", tb, err)
			}
		}
	})
}

// queueConfig is the usual configuration: the form's table description, the
// fake clock when one is given, a one-minute lease for the lease form.
func queueConfig(e Engine, tb inbox.Table, clock *fakeclock.Clock) inbox.Config {
	cfg := inbox.Config{Dialect: e.Dialect, Table: tb, Prepare: prepareAll}
	if tb.LockedUntil != "" {
		cfg.Lease = time.Minute
	}
	if clock != nil {
		cfg.Now, cfg.After = clock.Now, clock.After
	}
	return cfg
}

// prepareAll, set by INBOX_TEST_PREPARE=1, runs the suites' queues with
// Config.Prepare: every path once more through prepared statements.
var prepareAll = os.Getenv("INBOX_TEST_PREPARE") == "1"

func newQueue(t testing.TB, db *sql.DB, cfg inbox.Config) *inbox.Queue {
	t.Helper()
	q, err := inbox.New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// raceBuild reports whether the test binary was built with -race.
func raceBuild() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

// textIDTable creates a table whose id is text given by the caller.
func textIDTable(t *testing.T, e Engine, db *sql.DB, table string) {
	t.Helper()
	idType, timeType, blob := "text", "timestamptz", "bytea"
	switch {
	case e.IsMySQL():
		idType, timeType, blob = "varchar(36)", "DATETIME(6) NULL", "blob"
	case e.IsSQLite():
		idType, timeType, blob = "TEXT", "TEXT", "BLOB"
	}
	for _, s := range []string{
		"DROP TABLE IF EXISTS " + table, "DROP TABLE IF EXISTS " + table + "_dead",
		"CREATE TABLE " + table + " (id " + idType + " PRIMARY KEY, attempt integer NOT NULL DEFAULT 1, locked_until " + timeType +
			", payload " + blob + " NOT NULL, not_before " + timeType + ")",
		"CREATE TABLE " + table + "_dead (id " + idType + " PRIMARY KEY, attempt integer NOT NULL, payload " + blob + " NOT NULL)",
	} {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	dropAtEnd(t, e, db, table, table+"_dead", table+"_claims")
}

// engineNamed returns the engine named name.
func engineNamed(name string) (Engine, error) {
	for _, e := range Engines {
		if e.Name == name {
			return e, nil
		}
	}
	return Engine{}, fmt.Errorf("no engine %q", name)
}

// formConfig is the queue configuration of a table in a form.
func formConfig(e Engine, table, form string, lease time.Duration) inbox.Config {
	cfg := inbox.Config{Dialect: e.Dialect, Table: Table(table, form), Prepare: prepareAll}
	if form == "lease" {
		cfg.Lease = lease
	}
	return cfg
}

// supports reports whether e supports form.
func supports(e Engine, form string) bool {
	for _, f := range e.Forms() {
		if f == form {
			return true
		}
	}
	return false
}

// logWall logs, when t and its subtests are done, how long they took.
func logWall(t *testing.T) {
	start := time.Now()
	t.Cleanup(func() { t.Logf("FIGURE: wall %s: %v", t.Name(), time.Since(start).Round(time.Millisecond)) })
}

// eventually polls f until it returns nil, failing t with f's last
// error after timeout (cluster.Eventually, which the cluster suites share).
func eventually(t testing.TB, timeout time.Duration, what string, f func() error) {
	t.Helper()
	cluster.Eventually(t, timeout, what, f)
}

// eventuallyEvery is eventually polling every interval.
func eventuallyEvery(t testing.TB, timeout, interval time.Duration, what string, f func() error) {
	t.Helper()
	cluster.Poll(t, timeout, interval, what, f)
}

// dropNow drops tables, for a cleanup.
func dropNow(t testing.TB, db *sql.DB, tables ...string) {
	t.Helper()
	for _, tb := range tables {
		if _, err := db.Exec("DROP TABLE IF EXISTS " + tb); err != nil && !errors.Is(err, sql.ErrConnDone) {
			t.Errorf("dropping %s: %v", tb, err)
		}
	}
}

// serverEngines lists the engines with server sessions to cut.
func serverEngines() []Engine {
	var es []Engine
	for _, e := range Engines {
		if !e.IsSQLite() {
			es = append(es, e)
		}
	}
	return es
}
