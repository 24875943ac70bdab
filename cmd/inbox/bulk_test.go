package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/optin"
)

// Bad bulk commands are usage errors, refused before a connection is
// asked for.
func TestBulkUsageErrors(t *testing.T) {
	r := withRefusing(t)
	base := []string{"-engine", "sqlite", "-table", "jobs", "-lease-column", "locked_until", "-dead-table", "dead"}
	for _, tc := range []struct {
		name string
		args []string
		says string
	}{
		{"requeue all with an id", []string{"requeue", "-all", "7"}, `requeue -all takes no id, got ["7"]`},
		{"batch 0", []string{"requeue", "-all", "-batch", "0", "-yes"}, "requeue -batch 0: want 1 to 1000"},
		{"batch too big", []string{"requeue", "-all", "-batch", "1001", "-yes"}, "requeue -batch 1001: want 1 to 1000"},
		{"negative age", []string{"requeue", "-all", "-older", "-1h", "-yes"}, "requeue -older -1h0m0s: want a positive age"},
		{"negative max", []string{"requeue", "-all", "-max", "-1", "-yes"}, "requeue -max -1: want a positive count"},
		{"requeue two ids", []string{"requeue", "1", "2"}, "requeue takes one id, or -all"},
		{"delete-dead no id", []string{"delete-dead"}, "delete-dead takes one id"},
		{"delete-dead text id", []string{"delete-dead", "x"}, `id "x" is not an integer`},
		{"run-now two ids", []string{"run-now", "1", "2"}, "run-now takes one id"},
		{"run-now text id", []string{"run-now", "1x"}, `id "1x" is not an integer`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runArgs(dsnSet, append(base, tc.args...)...)
			if code != exitUsage || stdout != "" || !strings.Contains(stderr, tc.says) {
				t.Errorf("exit %d, stdout %q, stderr %q; want %d saying %q", code, stdout, stderr, exitUsage, tc.says)
			}
			if r.n.Load() != 0 {
				t.Errorf("a connection was asked for")
			}
		})
	}
	if got := codeOf(inbox.ErrNotWaiting); got != exitRefused {
		t.Errorf("ErrNotWaiting: exit %d, want %d", got, exitRefused)
	}
}

func TestBulkCommandsSQLite(t *testing.T) { testBulkCommands(t, sqliteEngine(t)) }

func TestBulkCommandsPostgres(t *testing.T) {
	testBulkCommands(t, postgresEngine(optin.DSN(t, "INBOX_POSTGRES_DSN", "the command's PostgreSQL suite")))
}

func TestBulkCommandsMariaDB(t *testing.T) {
	testBulkCommands(t, mariadbEngine(optin.DSN(t, "INBOX_MYSQL_DSN", "the command's MariaDB suite")))
}

// bulkSetup creates e's tables and returns the database, a queue on them
// and the command line described by a config file.
func bulkSetup(t *testing.T, e engine) (*sql.DB, *inbox.Queue, cli) {
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
	t.Cleanup(drop)
	for _, s := range e.create {
		if _, err := db.ExecContext(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	q, err := inbox.New(db, inbox.Config{Dialect: drivers[e.name].dialect, Table: e.table})
	if err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(t.TempDir(), "queue.json")
	b, _ := json.Marshal(e.table)
	if err := os.WriteFile(config, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return db, q, cli{t: t, e: e, config: config}
}

// testBulkCommands runs delete-dead, requeue -all and run-now against e:
// requeue -all without -yes prints the count and changes nothing; with it,
// no more than -max; a waiting job runs now once, a job in work is
// refused.
func testBulkCommands(t *testing.T, e engine) {
	ctx := context.Background()
	db, q, c := bulkSetup(t, e)
	for _, p := range []string{"a", "b", "c", "d", "e"} {
		bulkEnqueue(t, q, db, p, time.Time{})
	}
	ds, err := q.Claim(ctx, 5)
	if err != nil || len(ds) != 5 {
		t.Fatalf("claim: %d, %v", len(ds), err)
	}
	var dead []int64
	for _, d := range ds {
		d.SetError(errors.New("boom"))
		if err := d.Dead(ctx); err != nil {
			t.Fatal(err)
		}
		dead = append(dead, d.ID().(int64))
	}
	bulkRequeueCommands(t, c, dead)
	bulkRunNowCommands(t, c, q, db)
}

func bulkEnqueue(t *testing.T, q *inbox.Queue, db *sql.DB, p string, notBefore time.Time) int64 {
	t.Helper()
	id, err := q.Enqueue(context.Background(), db, inbox.Job{Data: []any{[]byte(p)}, NotBefore: notBefore})
	if err != nil {
		t.Fatal(err)
	}
	return id.(int64)
}

// bulkRequeueCommands: requeue -all without -yes, delete-dead, then
// requeue -all with -max and with -older, over the five dead jobs.
func bulkRequeueCommands(t *testing.T, c cli, dead []int64) {
	deadCount := func() int64 {
		t.Helper()
		var st statsOut
		c.must(exitOK, &st, "stats")
		return st.Dead
	}
	code, stdout, _ := runArgs(map[string]string{"INBOX_DSN": c.e.dsn}, "-engine", c.e.name, "-config", c.config, "-json", "requeue", "-all")
	var refusal struct {
		Error string `json:"error"`
		Code  int    `json:"code"`
		Count int64  `json:"count"`
	}
	if err := json.Unmarshal([]byte(stdout), &refusal); err != nil || code != exitRefused || refusal.Count != 5 ||
		!strings.Contains(refusal.Error, "5 dead jobs of any age would be requeued: add -yes to requeue them, and -max 5") {
		t.Fatalf("requeue -all without -yes: exit %d, %q", code, stdout)
	}
	if n := deadCount(); n != 5 {
		t.Fatalf("%d dead after a refused requeue -all, want 5", n)
	}
	var del deleteOut
	c.must(exitOK, &del, "delete-dead", itoa(dead[0]))
	c.must(exitNotFound, nil, "delete-dead", itoa(dead[0]))
	var all requeueAllOut
	c.must(exitOK, &all, "requeue", "-all", "-yes", "-batch", "2", "-max", "3")
	if n := deadCount(); all.Requeued != 3 || n != 1 {
		t.Errorf("requeue -all -max 3: %+v, %d dead; want 3 and 1", all, n)
	}
	c.must(exitOK, &all, "requeue", "-all", "-yes", "-older", "1h")
	if all.Requeued != 0 || deadCount() != 1 {
		t.Errorf("requeue -all -older 1h: %+v; want 0, the deaths are recent", all)
	}
}

// bulkRunNowCommands: a job an hour away runs now once; an unknown id is
// not found; a job in work is refused, and its holder's ack holds.
func bulkRunNowCommands(t *testing.T, c cli, q *inbox.Queue, db *sql.DB) {
	ctx := context.Background()
	waiting := bulkEnqueue(t, q, db, "later", time.Now().Add(time.Hour))
	var now runNowOut
	c.must(exitOK, &now, "run-now", itoa(waiting))
	if now.Ready != float64(waiting) {
		t.Errorf("run-now: %+v", now)
	}
	c.must(exitRefused, nil, "run-now", itoa(waiting))
	c.must(exitNotFound, nil, "run-now", "999999")
	held, err := q.Claim(ctx, 10)
	if err != nil || len(held) != 4 {
		t.Fatalf("claim of the requeued and the run-now jobs: %d, %v", len(held), err)
	}
	c.must(exitRefused, nil, "run-now", itoa(held[0].ID().(int64)))
	for _, d := range held {
		if err := d.Ack(ctx); err != nil {
			t.Errorf("ack %v after a refused run-now: %v", d.ID(), err)
		}
	}
}
