// Package enginetest runs package periodic, with schedules of its own and of
// package cron, on every engine: SQLite (mattn/go-sqlite3, always), PostgreSQL
// (lib/pq, INBOX_POSTGRES_DSN) and MariaDB (go-sql-driver/mysql,
// INBOX_MYSQL_DSN); a suite whose variable is unset skips and says so, or
// fails under INBOX_REQUIRE_DBS=1. It lives in the cron module because the
// root module names no driver. Each test makes tables of its own, named at
// random, and drops them.
package enginetest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	_ "time/tzdata"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/lib/pq"
	_ "github.com/mattn/go-sqlite3"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/optin"
	"github.com/sqlinbox/inbox/periodic"
	"github.com/sqlinbox/inbox/periodic/internal/testclock"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(childEnv); role != "" {
		os.Exit(childMain(role))
	}
	os.Exit(m.Run())
}

// engine is one database and driver the suite runs on.
type engine struct {
	name    string
	driver  string
	dialect inbox.Dialect
	// dsn returns the data source, skipping t when there is none.
	dsn func(t testing.TB) string
	// jobs is the queue table's definition (lease form, a text payload).
	jobs string
}

var engines = []engine{
	{
		name: "sqlite", driver: "sqlite3", dialect: inbox.SQLite,
		dsn: func(t testing.TB) string {
			// WAL lets the schedulers read while one writes; the busy
			// timeout makes a writer wait for another rather than fail.
			return "file:" + filepath.Join(t.TempDir(), "periodic.db") + "?_busy_timeout=20000&_journal_mode=WAL"
		},
		jobs: `CREATE TABLE %s (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    attempt INTEGER NOT NULL DEFAULT 1,
    locked_until TEXT,
    payload TEXT NOT NULL
)`,
	},
	{
		name: "postgres", driver: "postgres", dialect: inbox.Postgres,
		dsn: func(t testing.TB) string {
			return optin.DSN(t, "INBOX_POSTGRES_DSN", "the PostgreSQL suite of package periodic")
		},
		jobs: `CREATE TABLE %s (
    id bigserial PRIMARY KEY,
    attempt integer NOT NULL DEFAULT 1,
    locked_until timestamptz,
    payload text NOT NULL
)`,
	},
	{
		name: "mariadb", driver: "mysql", dialect: inbox.MariaDB,
		dsn: func(t testing.TB) string {
			return optin.DSN(t, "INBOX_MYSQL_DSN", "the MariaDB suite of package periodic")
		},
		jobs: `CREATE TABLE %s (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    attempt INT NOT NULL DEFAULT 1,
    locked_until DATETIME(6) NULL,
    payload VARCHAR(255) NOT NULL
) ENGINE=InnoDB`,
	},
}

func engineNamed(name string) (engine, error) {
	for _, e := range engines {
		if e.name == name {
			return e, nil
		}
	}
	return engine{}, fmt.Errorf("no engine %q", name)
}

// forEach runs f on every engine, each a subtest.
func forEach(t *testing.T, f func(t *testing.T, v *env)) {
	for _, e := range engines {
		e := e
		t.Run(e.name, func(t *testing.T) { f(t, setup(t, e)) })
	}
}

// env is one test's tables on one engine.
type env struct {
	e     engine
	dsn   string
	jobs  string // the queue table
	state string // the state table
	admin *sql.DB
	// crashed is closed when a Run returns before it is stopped.
	crashed chan struct{}
	crash   sync.Once
}

// setup makes the test's tables, dropped when it ends.
func setup(t testing.TB, e engine) *env {
	t.Helper()
	v := &env{e: e, dsn: e.dsn(t), crashed: make(chan struct{})}
	suffix := randomHex(t)
	v.jobs, v.state = "pjobs_"+suffix, "pstate_"+suffix
	v.admin = v.open(t, nil)
	ddl, err := periodic.CreateTableSQL(e.dialect, v.state)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{fmt.Sprintf(e.jobs, v.jobs), ddl} {
		if _, err := v.admin.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	t.Cleanup(func() {
		for _, table := range []string{v.jobs, v.state} {
			if _, err := v.admin.Exec("DROP TABLE " + table); err != nil {
				t.Errorf("drop %s: %v", table, err)
			}
		}
	})
	return v
}

func randomHex(t testing.TB) string {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// open returns a pool of its own on the test's database, its calls counted
// and passed to hook (nil for none), closed when the test ends.
func (v *env) open(t testing.TB, hook hookFunc) *sql.DB {
	t.Helper()
	db, _ := v.openCounter(t, hook)
	return db
}

// openCounted opens a pool on dsn through a counting connector.
func openCounted(e engine, dsn string, hook hookFunc) (*sql.DB, *counter, error) {
	probe, err := sql.Open(e.driver, dsn)
	if err != nil {
		return nil, nil, err
	}
	drv := probe.Driver()
	probe.Close()
	c := &counter{hook: hook}
	db := sql.OpenDB(&connector{d: drv, dsn: dsn, c: c})
	db.SetMaxOpenConns(4)
	return db, c, nil
}

// openCounter is open, returning the pool's counter too.
func (v *env) openCounter(t testing.TB, hook hookFunc) (*sql.DB, *counter) {
	t.Helper()
	db, c, err := openCounted(v.e, v.dsn, hook)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db, c
}

// queue returns a queue on the test's jobs table through db.
func (v *env) queue(t testing.TB, db *sql.DB) *inbox.Queue {
	t.Helper()
	q, err := newQueue(v.e, db, v.jobs)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func newQueue(e engine, db *sql.DB, jobs string) (*inbox.Queue, error) {
	return inbox.New(db, inbox.Config{Dialect: e.dialect, Table: inbox.Table{Name: jobs, LockedUntil: "locked_until"}})
}

// scheduler returns a scheduler of entries on db, its queue's, and the
// test's state table, on the clock's wall time and the timers of after
// (real time when clock is nil).
func (v *env) scheduler(t testing.TB, db *sql.DB, clock *testclock.Clock, after func(time.Duration) <-chan time.Time, entries []periodic.Entry, onError func(error)) *periodic.Scheduler {
	t.Helper()
	cfg := periodic.Config{Table: v.state, Entries: entries, OnError: onError, After: after}
	if clock != nil {
		cfg.Now = clock.Now
	}
	s, err := periodic.New(v.queue(t, db), db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// proc is a scheduler running in a process of its own, as far as the
// database can tell: a pool of its own, timers of its own.
type proc struct {
	s    *periodic.Scheduler
	r    *run
	db   *sql.DB
	c    *counter
	drop func()
}

// spawn starts a proc of entries on clock, its pool's calls passed to hook.
func (v *env) spawn(t testing.TB, clock *testclock.Clock, entries []periodic.Entry, hook hookFunc, onError func(error)) *proc {
	t.Helper()
	p := &proc{}
	p.db, p.c = v.openCounter(t, hook)
	var after func(time.Duration) <-chan time.Time
	after, p.drop = clock.Owner()
	p.s = v.scheduler(t, p.db, clock, after, entries, onError)
	p.r = v.start(t, p.s)
	return p
}

// kill ends p as a crash between two statements would, to the database:
// its Run stops, its connections close, its timers go.
func (p *proc) kill(t testing.TB) {
	t.Helper()
	p.r.stop(t)
	p.drop()
	p.db.Close()
}

// waitIdle waits until n schedulers wait on the clock: each has done what
// was due. It fails t at once should a Run return meanwhile.
func (v *env) waitIdle(t testing.TB, clock *testclock.Clock, n int) {
	t.Helper()
	clock.WaitWaiting(t, n, v.crashed)
}

// payload is what the job of entry's tick carries.
func payload(entry string, tick time.Time) string {
	return entry + "|" + tick.UTC().Format(time.RFC3339Nano)
}

// entry returns an entry whose jobs carry payload.
func entry(name string, s periodic.Schedule, missed periodic.MissedPolicy) periodic.Entry {
	return periodic.Entry{Name: name, Schedule: s, Missed: missed, Job: func(tick time.Time) inbox.Job {
		return inbox.Job{Data: []any{payload(name, tick)}}
	}}
}

func every(t testing.TB, d time.Duration) periodic.Schedule {
	t.Helper()
	s, err := periodic.Every(d)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// payloads counts the jobs of the queue table by payload.
func (v *env) payloads(t testing.TB) map[string]int {
	t.Helper()
	rows, err := v.admin.Query("SELECT payload FROM " + v.jobs)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var p string
		if err := rows.Scan(&p); err != nil {
			t.Fatal(err)
		}
		out[p]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// count returns the rows of table.
func (v *env) count(t testing.TB, table string) int {
	t.Helper()
	var n int
	if err := v.admin.QueryRow("SELECT COUNT(*) FROM " + table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// wantTicks checks that the jobs of the queue table are exactly want, each
// once: entries by name, the ticks each should have.
func (v *env) wantTicks(t testing.TB, want map[string][]time.Time) {
	t.Helper()
	got := v.payloads(t)
	missing, dup, extra := []string{}, []string{}, []string{}
	seen := map[string]bool{}
	for name, ticks := range want {
		for _, tick := range ticks {
			p := payload(name, tick)
			seen[p] = true
			switch n := got[p]; {
			case n == 0:
				missing = append(missing, p)
			case n > 1:
				dup = append(dup, fmt.Sprintf("%s ×%d", p, n))
			}
		}
	}
	for p := range got {
		if !seen[p] {
			extra = append(extra, p)
		}
	}
	sort.Strings(missing)
	sort.Strings(dup)
	sort.Strings(extra)
	if len(missing)+len(dup)+len(extra) > 0 {
		t.Errorf("jobs: %d missing %s\n%d enqueued more than once %s\n%d not expected %s",
			len(missing), short(missing), len(dup), short(dup), len(extra), short(extra))
	}
}

func short(s []string) string {
	if len(s) > 12 {
		return strings.Join(s[:12], ", ") + ", …"
	}
	return strings.Join(s, ", ")
}

// ticksBetween returns s's ticks after from and not after to.
func ticksBetween(s periodic.Schedule, from, to time.Time) []time.Time {
	var out []time.Time
	for t := s.Next(from); !t.IsZero() && !t.After(to); t = s.Next(t) {
		out = append(out, t.UTC())
	}
	return out
}

// lastTicks returns the state table's last ticks, by entry.
func (v *env) lastTicks(t testing.TB, s *periodic.Scheduler) map[string]time.Time {
	t.Helper()
	states, err := s.Entries(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]time.Time{}
	for _, st := range states {
		out[st.Name] = st.Last
	}
	return out
}

// run is one Run of a scheduler, in a goroutine.
type run struct {
	cancel   context.CancelFunc
	done     chan struct{}
	err      error
	stopping atomic.Bool
}

// start runs s until stop; should Run return before, crashed is closed.
func (v *env) start(t testing.TB, s *periodic.Scheduler) *run {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &run{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = s.Run(ctx)
		if !r.stopping.Load() {
			v.crash.Do(func() { close(v.crashed) })
		}
	}()
	t.Cleanup(func() { r.stopping.Store(true); cancel(); <-r.done })
	return r
}

// stop ends the run and fails t if Run returned an error.
func (r *run) stop(t testing.TB) {
	t.Helper()
	r.stopping.Store(true)
	r.cancel()
	select {
	case <-r.done:
	case <-time.After(time.Minute):
		t.Fatal("Run did not return a minute after its context ended")
	}
	if r.err != nil {
		t.Errorf("Run: %v", r.err)
	}
}
