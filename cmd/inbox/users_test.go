package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/optin"
)

// usersEngine is one database of TestUsersCLI: its -engine, driver, DSN,
// the statement reading the schema that qualifies a table, and the
// declaration of a text id (given by the server where it can assign one).
type usersEngine struct {
	name, driver, dsn, schemaSQL, idDecl, ts, blob string
	serverIDs                                      bool
}

// usersHostile is an error text and a payload with an escape sequence
// (clear the screen, set the window's title), a bell, a carriage return,
// a C1 control, a NUL byte and invalid UTF-8.
const usersHostile = "boom \x1b[2J\x1b]0;owned\x07 \r over \u009b31m \x00 nul \xff\xfe bad"

// TestUsersCLI runs the command against tables named qualified
// (public.x on PostgreSQL, db.x on MariaDB, main.x on SQLite) with text
// ids (UUIDs the server assigns on PostgreSQL and SQLite), a job whose
// error text and payload hold control characters, NUL and invalid UTF-8:
// every -json output is valid JSON, show reads the id, requeue and cancel
// take it; no text output, on stdout or stderr, carries a control
// character other than newline and tab, or a byte that is not UTF-8.
func TestUsersCLI(t *testing.T) {
	for _, e := range []usersEngine{
		{name: "postgres", driver: "postgres", dsn: "INBOX_POSTGRES_DSN", schemaSQL: "SELECT current_schema()",
			idDecl: "uuid PRIMARY KEY DEFAULT gen_random_uuid()", ts: "timestamptz", blob: "bytea", serverIDs: true},
		{name: "mariadb", driver: "mysql", dsn: "INBOX_MYSQL_DSN", schemaSQL: "SELECT DATABASE()",
			idDecl: "varchar(36) PRIMARY KEY", ts: "DATETIME(6) NULL", blob: "blob"},
		{name: "sqlite", driver: "sqlite", schemaSQL: "SELECT 'main'",
			idDecl: "TEXT PRIMARY KEY DEFAULT (lower(hex(randomblob(16))))", ts: "TEXT", blob: "BLOB", serverIDs: true},
	} {
		t.Run(e.name, func(t *testing.T) {
			if e.dsn == "" {
				e.dsn = "file:" + filepath.Join(t.TempDir(), "q.db") + "?_pragma=busy_timeout(5000)"
			} else {
				e.dsn = optin.DSN(t, e.dsn, "the command's "+e.name+" suite")
			}
			usersCLI(t, e)
		})
	}
}

// usersTables creates users_cli_jobs, its dead and control tables, and
// returns the handle and the description with qualified names.
func usersTables(t *testing.T, e usersEngine) (*sql.DB, inbox.Table) {
	db, err := sql.Open(e.driver, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	var schema string
	if err := db.QueryRow(e.schemaSQL).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	drop := []string{"DROP TABLE IF EXISTS users_cli_jobs", "DROP TABLE IF EXISTS users_cli_jobs_dead", "DROP TABLE IF EXISTS users_cli_jobs_control"}
	deadID := strings.Fields(e.idDecl)[0]
	for _, s := range append(drop,
		"CREATE TABLE users_cli_jobs (id "+e.idDecl+", attempt integer NOT NULL DEFAULT 1, locked_until "+e.ts+
			", payload "+e.blob+" NOT NULL, last_error text, enqueued_at "+e.ts+")",
		"CREATE TABLE users_cli_jobs_dead (id "+deadID+" PRIMARY KEY, attempt integer NOT NULL, payload "+e.blob+
			" NOT NULL, last_error text, dead_at "+e.ts+")",
		"CREATE TABLE users_cli_jobs_control (queue varchar(200) PRIMARY KEY, paused_at "+e.ts+", paused_by text)") {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	t.Cleanup(func() {
		for _, s := range drop {
			db.Exec(s)
		}
	})
	return db, inbox.Table{Name: schema + ".users_cli_jobs", LockedUntil: "locked_until", LastError: "last_error",
		EnqueuedAt: "enqueued_at", DeadTable: schema + ".users_cli_jobs_dead", DeadAt: "dead_at",
		ControlTable: schema + ".users_cli_jobs_control"}
}

func usersCLI(t *testing.T, e usersEngine) {
	ctx := context.Background()
	db, tb := usersTables(t, e)
	q, err := inbox.New(db, inbox.Config{Dialect: drivers[e.name].dialect, Table: tb})
	if err != nil {
		t.Fatal(err)
	}
	ids := usersCLIJobs(t, e, db, q)
	flags := []string{"-engine", e.name, "-table", tb.Name, "-lease-column", "locked_until", "-last-error", "last_error",
		"-enqueued-at", "enqueued_at", "-dead-table", tb.DeadTable, "-dead-at", "dead_at", "-control-table", tb.ControlTable, "-text-ids"}
	env := map[string]string{"INBOX_DSN": e.dsn, "USER": "ops\x1b[2J"}
	// run runs args with -json, then without (once only when
	// wantCode is exitOK+100: a command that changes the table).
	run := func(wantCode int, args ...string) (json, text string) {
		t.Helper()
		modes := []bool{true, false}
		if wantCode >= 100 {
			wantCode, modes = wantCode-100, modes[:1]
		}
		for _, asJSON := range modes {
			all := append([]string(nil), flags...)
			if asJSON {
				all = append(all, "-json")
			}
			code, stdout, stderr := runArgs(env, append(all, args...)...)
			if code != wantCode {
				t.Errorf("%q (json %v): exit %d, want %d: %q %q", args, asJSON, code, wantCode, stdout, stderr)
			}
			if asJSON {
				usersValidJSON(t, args, stdout, stderr)
				json = stdout
			} else {
				usersTerminalSafe(t, args, stdout+stderr)
				text = stdout + stderr
			}
		}
		return json, text
	}
	plainTable := tb
	plainTable.Name, plainTable.ControlTable = "users_cli_jobs", "users_cli_jobs_control"
	plain, err := inbox.New(db, inbox.Config{Dialect: drivers[e.name].dialect, Table: plainTable})
	if err != nil {
		t.Fatal(err)
	}
	plainPaused := func() bool {
		st, err := plain.Paused(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st.Paused
	}
	usersCLIRun(t, run, ids, e.serverIDs, plainPaused)
}

// usersCLIJobs enqueues three jobs on q and returns their ids: the first
// and third ready, the second dead with the hostile error.
func usersCLIJobs(t *testing.T, e usersEngine, db *sql.DB, q *inbox.Queue) []string {
	t.Helper()
	ctx := context.Background()
	var ids []string
	for i, p := range []string{"ready", usersHostile} {
		job := inbox.Job{Data: []any{[]byte(p)}}
		if !e.serverIDs {
			job.ID = []string{"0b7c2a3e-0000-4000-8000-000000000001", "9a1b7c33-0000-4000-8000-000000000002"}[i]
		}
		id, err := q.Enqueue(ctx, db, job)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id.(string))
	}
	ds, err := q.Claim(ctx, 2)
	if err != nil || len(ds) != 2 {
		t.Fatalf("claim: %d, %v", len(ds), err)
	}
	for _, d := range ds {
		if d.ID() == ids[1] {
			d.SetError(errors.New(usersHostile))
			if err := d.Dead(ctx); err != nil {
				t.Fatal(err)
			}
		} else if err := d.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	extra := inbox.Job{Data: []any{[]byte("later")}}
	if !e.serverIDs {
		extra.ID = "c4d5e6f7-0000-4000-8000-000000000003"
	}
	id, err := q.Enqueue(ctx, db, extra)
	if err != nil {
		t.Fatal(err)
	}
	ids = append(ids, id.(string))
	return ids
}

// usersCLIRun runs each command on the jobs: ids[0] and ids[2] ready,
// ids[1] dead with the hostile error.
func usersCLIRun(t *testing.T, run func(int, ...string) (string, string), ids []string, serverIDs bool, plainPaused func() bool) {
	run(exitOK, "check")
	run(exitOK, "stats")
	out, _ := run(exitOK, "jobs")
	if !strings.Contains(out, ids[0]) {
		t.Errorf("jobs: %s, want %s", out, ids[0])
	}
	out, text := run(exitOK, "show", ids[1])
	var job jobOut
	if err := json.Unmarshal([]byte(out), &job); err != nil || job.ID != ids[1] || job.State != "dead" ||
		!strings.HasPrefix(job.LastError, "boom \x1b[2J") || !strings.Contains(job.LastError, "\ufffd nul \ufffd\ufffd bad") {
		t.Errorf("show %s: %+v, %v", ids[1], job, err)
	}
	if !strings.Contains(text, `\x1b[2J`) {
		t.Errorf("show %s: the escape is not written visibly:\n%s", ids[1], text)
	}
	out, _ = run(exitOK, "jobs", "-state", "dead")
	if !strings.Contains(out, ids[1]) {
		t.Errorf("jobs -state dead: %s", out)
	}
	var page jobsOut
	out, _ = run(exitOK, "jobs", "-limit", "1")
	if err := json.Unmarshal([]byte(out), &page); err != nil || len(page.Jobs) != 1 || !page.Older {
		t.Fatalf("jobs -limit 1: %s, %v", out, err)
	}
	first := page.Jobs[0].ID.(string)
	out, _ = run(exitOK, "jobs", "-limit", "1", "-after", first)
	if err := json.Unmarshal([]byte(out), &page); err != nil || len(page.Jobs) != 1 || page.Older || !page.Newer || page.Jobs[0].ID == first {
		t.Errorf("jobs -after %s: %s, %v; want the other of the two jobs in the queue table", first, out, err)
	}
	run(exitOK+100, "pause")
	var st statsOut
	out, _ = run(exitOK, "stats")
	if err := json.Unmarshal([]byte(out), &st); err != nil || !st.Paused || !plainPaused() {
		t.Errorf("stats after pause: %s, %v; the queue named plainly paused: %v", out, err, plainPaused())
	}
	run(exitOK+100, "resume")
	// PostgreSQL cannot read these bytes as a uuid (22021, 22P02); the
	// others find no such job: no job either way (3), the output JSON, or
	// safe text.
	run(exitNotFound, "show", "\x1b]0;x\x07\xff\x00-not-an-id")
	run(exitNotFound, "cancel", "not-a-uuid")
	run(exitNotFound, "show", "00000000-0000-4000-8000-00000000dead")
	usersCLIRequeue(t, run, ids[1], serverIDs)
	out, _ = run(exitOK+100, "cancel", ids[0])
	run(exitNotFound, "cancel", ids[0])
	if !strings.Contains(out, ids[0]) {
		t.Errorf("cancel %s: %s", ids[0], out)
	}
}

// usersCLIRequeue requeues the dead job id: under a new id where the
// server assigns ids, shown ready; where the caller gives them, requeue
// alone is refused (exit 4, naming -as) and the job stays dead, -as its own
// id is refused as any dead id is, and -as a fresh id requeues it.
func usersCLIRequeue(t *testing.T, run func(int, ...string) (string, string), id string, serverIDs bool) {
	t.Helper()
	args := []string{"requeue", id}
	if !serverIDs {
		if out, errOut := run(exitRefused, "requeue", id); !strings.Contains(out+errOut, "requeue -as NEWID") {
			t.Errorf("requeue %s on a table that assigns no ids: %s %s, want the -as hint", id, out, errOut)
		}
		run(exitRefused, "requeue", "-as", id, id)
		if out, _ := run(exitOK, "show", id); !strings.Contains(out, `"state": "dead"`) {
			t.Errorf("show %s after refused requeues: %s", id, out)
		}
		args = []string{"requeue", "-as", "8d0e2c52-requeued-" + id[:8], id}
	}
	var rq requeueOut
	out, _ := run(exitOK+100, args...)
	if err := json.Unmarshal([]byte(out), &rq); err != nil || rq.ID != id || rq.NewID == nil || rq.NewID == id {
		t.Errorf("requeue %s: %s, %v", id, out, err)
	} else if out, _ = run(exitOK, "show", rq.NewID.(string)); !strings.Contains(out, `"state": "ready"`) {
		t.Errorf("show %v after the requeue: %s", rq.NewID, out)
	}
	run(exitNotFound, "requeue", id)
}

// usersValidJSON fails t unless stdout is one valid JSON object and stderr
// is empty.
func usersValidJSON(t *testing.T, args []string, stdout, stderr string) {
	t.Helper()
	if !json.Valid([]byte(stdout)) || !strings.HasPrefix(stdout, "{") || stderr != "" {
		t.Errorf("%q -json: stdout %q, stderr %q", args, stdout, stderr)
	}
}

// usersTerminalSafe fails t if out holds a byte a terminal would act on:
// a control character but newline and tab, or bytes that are not UTF-8.
func usersTerminalSafe(t *testing.T, args []string, out string) {
	t.Helper()
	if !utf8.ValidString(out) {
		t.Errorf("%q: text output is not UTF-8:\n%q", args, out)
	}
	for i, r := range out {
		if unicode.IsControl(r) && r != '\n' && r != '\t' {
			t.Errorf("%q: text output has %q at %d:\n%q", args, r, i, out)
			return
		}
	}
}
