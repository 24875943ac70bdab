package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/optin"
)

// engine is one database the command runs against in TestCommands.
type engine struct {
	name   string // -engine
	driver string
	dsn    string
	table  inbox.Table
	create []string // the tables' DDL
	drop   []string
}

func sqliteEngine(t *testing.T) engine {
	schema, err := os.ReadFile("../../schema/sqlite-lease.sql")
	if err != nil {
		t.Fatal(err)
	}
	return engine{
		name: "sqlite", driver: "sqlite",
		dsn: "file:" + filepath.Join(t.TempDir(), "q.db") + "?_pragma=busy_timeout(5000)",
		table: inbox.Table{Name: "cli_jobs", LockedUntil: "locked_until", DeadTable: "cli_jobs_dead",
			DeadAt: "dead_at", LastError: "last_error", Priority: "priority", EnqueuedAt: "enqueued_at",
			ControlTable: "cli_jobs_control"},
		create: []string{
			strings.ReplaceAll(string(schema), "jobs", "cli_jobs"),
			`ALTER TABLE cli_jobs ADD COLUMN last_error TEXT`,
			`ALTER TABLE cli_jobs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0`,
			`ALTER TABLE cli_jobs ADD COLUMN enqueued_at TEXT`,
			`ALTER TABLE cli_jobs_dead ADD COLUMN last_error TEXT`,
			`ALTER TABLE cli_jobs_dead ADD COLUMN dead_at TEXT`,
			`CREATE TABLE cli_jobs_control (queue TEXT PRIMARY KEY, paused_at TEXT, paused_by TEXT)`,
		},
	}
}

// rowLockTable is the description of the PostgreSQL and MariaDB tables.
var rowLockTable = inbox.Table{Name: "inbox_cli_jobs", NotBefore: "not_before", DeadTable: "inbox_cli_jobs_dead",
	DeadAt: "dead_at", LastError: "last_error", Priority: "priority", EnqueuedAt: "enqueued_at",
	ControlTable: "inbox_cli_jobs_control"}

var rowLockDrop = []string{
	`DROP TABLE IF EXISTS inbox_cli_jobs`, `DROP TABLE IF EXISTS inbox_cli_jobs_dead`, `DROP TABLE IF EXISTS inbox_cli_jobs_control`,
}

func postgresEngine(dsn string) engine {
	return engine{
		name: "postgres", driver: "postgres", dsn: dsn, table: rowLockTable, drop: rowLockDrop,
		create: []string{
			`CREATE TABLE inbox_cli_jobs (id bigserial PRIMARY KEY, attempt integer NOT NULL DEFAULT 1,
				payload bytea NOT NULL, not_before timestamptz, last_error text,
				priority integer NOT NULL DEFAULT 0, enqueued_at timestamptz)`,
			`CREATE TABLE inbox_cli_jobs_dead (id bigint PRIMARY KEY, attempt integer NOT NULL,
				payload bytea NOT NULL, last_error text, dead_at timestamptz)`,
			`CREATE TABLE inbox_cli_jobs_control (queue text PRIMARY KEY, paused_at timestamptz, paused_by text)`,
		},
	}
}

func mariadbEngine(dsn string) engine {
	return engine{
		name: "mariadb", driver: "mysql", dsn: dsn, table: rowLockTable, drop: rowLockDrop,
		create: []string{
			`CREATE TABLE inbox_cli_jobs (id bigint AUTO_INCREMENT PRIMARY KEY, attempt integer NOT NULL DEFAULT 1,
				payload blob NOT NULL, not_before DATETIME(6) NULL, last_error text NULL,
				priority integer NOT NULL DEFAULT 0, enqueued_at DATETIME(6) NULL,
				INDEX inbox_cli_jobs_priority (priority DESC, id)) ENGINE=InnoDB`,
			`CREATE TABLE inbox_cli_jobs_dead (id bigint PRIMARY KEY, attempt integer NOT NULL,
				payload blob NOT NULL, last_error text NULL, dead_at DATETIME(6) NULL) ENGINE=InnoDB`,
			`CREATE TABLE inbox_cli_jobs_control (queue varchar(191) PRIMARY KEY, paused_at DATETIME(6) NULL, paused_by text NULL) ENGINE=InnoDB`,
		},
	}
}

func TestCommandsSQLite(t *testing.T) { testCommands(t, sqliteEngine(t)) }

func TestCommandsPostgres(t *testing.T) {
	testCommands(t, postgresEngine(optin.DSN(t, "INBOX_POSTGRES_DSN", "the command's PostgreSQL suite")))
}

func TestCommandsMariaDB(t *testing.T) {
	testCommands(t, mariadbEngine(optin.DSN(t, "INBOX_MYSQL_DSN", "the command's MariaDB suite")))
}

// cli runs the command line against e, with the table described by a
// config file, and decodes its JSON output into out (when not nil).
type cli struct {
	t      *testing.T
	e      engine
	config string
}

func (c cli) run(out any, args ...string) int {
	c.t.Helper()
	env := map[string]string{"INBOX_DSN": c.e.dsn, "USER": "tester"}
	all := append([]string{"-engine", c.e.name, "-config", c.config, "-json"}, args...)
	code, stdout, stderr := runArgs(env, all...)
	if stderr != "" {
		c.t.Errorf("%q: stderr %q", args, stderr)
	}
	if code != exitOK {
		var e struct {
			Error string `json:"error"`
			Code  int    `json:"code"`
		}
		if err := json.Unmarshal([]byte(stdout), &e); err != nil || e.Code != code || e.Error == "" {
			c.t.Errorf("%q: exit %d, output %q, want {error, code}", args, code, stdout)
		}
		return code
	}
	if out != nil {
		dec := json.NewDecoder(strings.NewReader(stdout))
		dec.DisallowUnknownFields()
		if err := dec.Decode(out); err != nil {
			c.t.Errorf("%q: output %q: %v", args, stdout, err)
		}
	}
	return code
}

// must runs args and fails the test on an exit code other than want.
func (c cli) must(want int, out any, args ...string) {
	c.t.Helper()
	if code := c.run(out, args...); code != want {
		c.t.Fatalf("%q: exit %d, want %d", args, code, want)
	}
}

func ids(p jobsOut) []int64 {
	var out []int64
	for _, j := range p.Jobs {
		out = append(out, int64(j.ID.(float64)))
	}
	return out
}

func testCommands(t *testing.T, e engine) {
	ctx := context.Background()
	db, err := sql.Open(e.driver, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	drop := func() {
		for _, s := range e.drop {
			if _, err := db.ExecContext(ctx, s); err != nil {
				t.Errorf("%s: %v", s, err)
			}
		}
	}
	drop()
	t.Cleanup(drop) // before db.Close: cleanups run last first
	for _, s := range e.create {
		if _, err := db.ExecContext(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	dialect := drivers[e.name].dialect
	q, err := inbox.New(db, inbox.Config{Dialect: dialect, Table: e.table})
	if err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(t.TempDir(), "queue.json")
	b, _ := json.Marshal(e.table)
	if err := os.WriteFile(config, b, 0o600); err != nil {
		t.Fatal(err)
	}
	c := cli{t: t, e: e, config: config}
	enqueue := func(payload string, notBefore time.Time) int64 {
		id, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte(payload)}, NotBefore: notBefore})
		if err != nil {
			t.Fatal(err)
		}
		return id.(int64)
	}
	// kill claims the next job and moves it to the dead table.
	kill := func() int64 {
		ds, err := q.Claim(ctx, 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("claim: %v, %d jobs", err, len(ds))
		}
		ds[0].SetError(errors.New("boom"))
		if err := ds[0].Dead(ctx); err != nil {
			t.Fatal(err)
		}
		return ds[0].ID().(int64)
	}
	stats := func() statsOut {
		t.Helper()
		var st statsOut
		c.must(exitOK, &st, "stats")
		return st
	}

	var ok checkOut
	c.must(exitOK, &ok, "check")
	if !ok.OK {
		t.Errorf("check: %+v", ok)
	}

	j1 := enqueue("p1", time.Time{})
	j2 := enqueue("p2", time.Time{})
	j3 := enqueue("p3", time.Now().Add(time.Hour))
	if st := stats(); st.Ready != 2 || st.Waiting != 1 || st.Dead != 0 || st.Paused {
		t.Errorf("stats: %+v", st)
	}

	var page jobsOut
	c.must(exitOK, &page, "jobs")
	if got := ids(page); len(got) != 3 || got[0] != j3 || got[2] != j1 || page.Older || page.Newer {
		t.Errorf("jobs: %v %+v", got, page)
	}
	c.must(exitOK, &page, "jobs", "-state", "ready")
	if got := ids(page); len(got) != 2 || got[0] != j2 || page.State != "ready" || page.Jobs[0].State != "ready" {
		t.Errorf("jobs -state ready: %+v", page)
	}
	if d := page.Jobs[0].Data; len(d) != 1 || d[0] != "p2" {
		t.Errorf("data %v, want [p2]", d)
	}
	c.must(exitOK, &page, "jobs", "-state", "waiting")
	if got := ids(page); len(got) != 1 || got[0] != j3 || page.Jobs[0].Due == nil {
		t.Errorf("jobs -state waiting: %+v", page)
	}
	c.must(exitOK, &page, "jobs", "-limit", "1")
	if got := ids(page); len(got) != 1 || got[0] != j3 || !page.Older {
		t.Errorf("jobs -limit 1: %+v", page)
	}
	c.must(exitOK, &page, "jobs", "-limit", "1", "-after", itoa(j3))
	if got := ids(page); len(got) != 1 || got[0] != j2 || !page.Older || !page.Newer {
		t.Errorf("jobs -after: %+v", page)
	}

	var job jobOut
	c.must(exitOK, &job, "show", itoa(j1))
	if job.State != "ready" || job.Attempt != 1 || job.EnqueuedAt == nil || int64(job.ID.(float64)) != j1 {
		t.Errorf("show: %+v", job)
	}
	c.must(exitNotFound, nil, "show", "999999")
	c.must(exitNotFound, nil, "cancel", "999999")
	c.must(exitNotFound, nil, "requeue", itoa(j1)) // not dead

	// j1 dies, shows as dead, is listed and requeued once.
	if got := kill(); got != j1 {
		t.Fatalf("killed %d, want %d", got, j1)
	}
	c.must(exitOK, &job, "show", itoa(j1))
	if job.State != "dead" || job.LastError != "boom" || job.DeadAt == nil {
		t.Errorf("show dead: %+v", job)
	}
	c.must(exitOK, &page, "jobs", "-state", "dead")
	if got := ids(page); len(got) != 1 || got[0] != j1 || page.Jobs[0].State != "dead" || page.Older {
		t.Errorf("jobs -state dead: %+v", page)
	}
	if st := stats(); st.Dead != 1 || st.Ready != 1 {
		t.Errorf("stats: %+v", st)
	}
	var rq requeueOut
	c.must(exitOK, &rq, "requeue", itoa(j1))
	newID := int64(rq.NewID.(float64))
	if int64(rq.ID.(float64)) != j1 || newID <= j3 {
		t.Errorf("requeue: %+v", rq)
	}
	c.must(exitNotFound, nil, "requeue", itoa(j1))
	if st := stats(); st.Dead != 0 || st.Ready != 2 {
		t.Errorf("stats after requeue: %+v", st)
	}

	// A job in work: the row lock refuses to cancel it, the lease does not.
	ds, err := q.Claim(ctx, 1)
	if err != nil || len(ds) != 1 || ds[0].ID() != j2 {
		t.Fatalf("claim: %v %v", err, ds)
	}
	if q.Form() == inbox.RowLock {
		c.must(exitRefused, nil, "jobs", "-state", "inwork")
		c.must(exitRefused, nil, "cancel", itoa(j2))
		c.must(exitOK, &job, "show", itoa(j2))
		if job.State != "inwork" {
			t.Errorf("show in work: %+v", job)
		}
		if err := ds[0].Release(ctx); err != nil {
			t.Fatal(err)
		}
		c.must(exitOK, &job, "show", itoa(j2)) // the refusal changed nothing
		if job.State != "ready" {
			t.Errorf("show after release: %+v", job)
		}
	} else {
		c.must(exitOK, &page, "jobs", "-state", "inwork")
		if got := ids(page); len(got) != 1 || got[0] != j2 {
			t.Errorf("jobs -state inwork: %+v", page)
		}
		var cc cancelOut
		c.must(exitOK, &cc, "cancel", itoa(j2))
		if err := ds[0].Ack(ctx); !errors.Is(err, inbox.ErrCancelled) {
			t.Errorf("ack after cancel: %v", err)
		}
		c.must(exitNotFound, nil, "show", itoa(j2))
	}
	var cc cancelOut
	c.must(exitOK, &cc, "cancel", itoa(j3))
	if int64(cc.Cancelled.(float64)) != j3 {
		t.Errorf("cancel: %+v", cc)
	}
	c.must(exitNotFound, nil, "cancel", itoa(j3))

	// purge refuses without -yes, and then deletes nothing.
	kill()
	c.must(exitRefused, nil, "purge")
	c.must(exitRefused, nil, "purge", "-older", "1h")
	if st := stats(); st.Dead != 1 {
		t.Errorf("dead after refused purge: %+v", st)
	}
	var pg purgeOut
	c.must(exitOK, &pg, "purge", "-older", "1h", "-yes")
	if pg.Purged != 0 {
		t.Errorf("purge -older 1h: %+v", pg)
	}
	c.must(exitOK, &pg, "purge", "-yes")
	if pg.Purged != 1 {
		t.Errorf("purge: %+v", pg)
	}

	var ps pauseOut
	c.must(exitOK, &ps, "pause", "-by", "ops")
	if !ps.Paused || ps.By != "ops" || ps.Since == nil {
		t.Errorf("pause: %+v", ps)
	}
	if st := stats(); !st.Paused || st.PausedSince == nil {
		t.Errorf("stats paused: %+v", st)
	}
	c.must(exitOK, &ps, "resume")
	if ps.Paused {
		t.Errorf("resume: %+v", ps)
	}
	if st := stats(); st.Paused {
		t.Errorf("stats resumed: %+v", st)
	}

	// What the description lacks is refused; flags override the file.
	c.must(exitRefused, nil, "-control-table", "", "pause")
	c.must(exitRefused, nil, "-enqueued-at", "", "stats")
	c.must(exitRefused, nil, "-dead-at", "", "purge", "-older", "1h", "-yes")
	if p, err := q.Paused(ctx); err != nil || p.Paused {
		t.Errorf("paused after a refused pause: %+v, %v", p, err)
	}

	// A table that is not there: check reports it, exit 1.
	code, stdout, _ := runArgs(map[string]string{"INBOX_DSN": e.dsn},
		"-engine", e.name, "-config", config, "-table", "inbox_cli_missing", "-json", "check")
	var ce struct {
		Error    string   `json:"error"`
		Code     int      `json:"code"`
		Problems []string `json:"problems"`
	}
	if err := json.Unmarshal([]byte(stdout), &ce); err != nil || code != exitFailed || ce.Code != exitFailed || len(ce.Problems) == 0 {
		t.Errorf("check of a missing table: exit %d, %q", code, stdout)
	}

	// The text output.
	j4 := enqueue("p4", time.Time{})
	code, stdout, stderr := runArgs(map[string]string{"INBOX_DSN": e.dsn}, "-engine", e.name, "-config", config, "stats")
	if code != exitOK || !strings.Contains(stdout, "ready") || stderr != "" {
		t.Errorf("stats text: exit %d, %q %q", code, stdout, stderr)
	}
	code, stdout, _ = runArgs(map[string]string{"INBOX_DSN": e.dsn}, "-engine", e.name, "-config", config, "jobs")
	if code != exitOK || !strings.HasPrefix(stdout, "ID") || !strings.Contains(stdout, itoa(j4)) {
		t.Errorf("jobs text: exit %d, %q", code, stdout)
	}
	code, _, stderr = runArgs(map[string]string{"INBOX_DSN": e.dsn}, "-engine", e.name, "-config", config, "show", "999999")
	if code != exitNotFound || !strings.Contains(stderr, "no job") {
		t.Errorf("show text: exit %d, %q", code, stderr)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
