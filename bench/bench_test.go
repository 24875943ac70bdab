package main

// The CI check of the benchmark program: every line of its table (each
// form, both sides, a batch of one and of sixteen) runs here at a tiny size
// on one driver per engine family, through the program's own code, and must
// acknowledge every job and leave none. Speed is not looked at.

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/optin"
)

func TestDrain(t *testing.T) {
	eachCell(t, "bench_ci_", 2, func(e engine) []string { return e.forms() },
		func(ctx context.Context, t *testing.T, c cell, db *sql.DB, table string) {
			const jobs = 150
			for _, hand := range []bool{false, true} {
				done, left, err := drain(ctx, c, db, table, hand, jobs)
				if err != nil {
					t.Fatalf("hand-written %v: %v", hand, err)
				}
				if done != jobs || left != 0 {
					t.Fatalf("hand-written %v: %d of %d jobs acknowledged, %d rows left", hand, done, jobs, left)
				}
			}
		})
}

// eachCell runs check on a fresh table for every cell of one driver per
// engine family: each form forms gives, a batch of one and of sixteen. An
// engine whose DSN is unset skips, or fails under INBOX_REQUIRE_DBS=1.
func eachCell(t *testing.T, prefix string, workers int, forms func(engine) []string,
	check func(ctx context.Context, t *testing.T, c cell, db *sql.DB, table string)) {
	for _, name := range []string{"pq", "mysql", "mattn"} {
		t.Run(name, func(t *testing.T) {
			e := needEngine(t, name)
			for _, form := range forms(e) {
				for _, batch := range []int{1, 16} {
					c := cell{e: e, form: form, workers: workers, batch: batch}
					t.Run(strings.TrimPrefix(c.String(), name+"/"), func(t *testing.T) {
						ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
						defer cancel()
						db, err := e.open(t.TempDir(), c.conns())
						if err != nil {
							t.Fatal(err)
						}
						defer db.Close()
						table := prefix + e.name
						if err := e.createTable(ctx, db, table); err != nil {
							t.Fatal(err)
						}
						defer e.drop(context.Background(), db, table)
						check(ctx, t, c, db, table)
					})
				}
			}
		})
	}
}

// The table's command line parses, and a bad one is refused.
func TestOptions(t *testing.T) {
	if _, err := parseEngines("pq,nosuch"); err == nil {
		t.Error("an unknown engine was accepted")
	}
	if _, err := parseInts("1,0"); err == nil {
		t.Error("a worker count of 0 was accepted")
	}
	ws, err := parseInts("1, 4,16")
	if err != nil || len(ws) != 3 || ws[2] != 16 {
		t.Errorf("parseInts: %v %v", ws, err)
	}
}

// needEngine returns the engine of the driver name. One whose DSN is unset
// skips the test, or fails it under INBOX_REQUIRE_DBS=1.
func needEngine(t *testing.T, name string) engine {
	t.Helper()
	e, err := engineNamed(name)
	if err != nil {
		t.Fatal(err)
	}
	if e.env != "" {
		optin.DSN(t, e.env, "the bench runs on "+name)
	}
	return e
}

// -prepare auto prepares inbox's statements where docs/operations.md says
// to: lib/pq, both SQLite drivers, inbox.MariaDB, MySQL without
// interpolateParams.
func TestPrepareFor(t *testing.T) {
	defer func(p string) { prepareInbox = p }(prepareInbox)
	t.Setenv("INBOX_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/x?parseTime=true")
	// The engines as listed: engineNamed would ask the server its version.
	listed := func(name string) engine {
		for _, e := range engines {
			if e.name == name {
				return e
			}
		}
		t.Fatalf("no engine %q", name)
		return engine{}
	}
	want := map[string]bool{"pq": true, "pgx": false, "mysql": true, "mysqlplain": true, "mattn": true, "modernc": true}
	for _, mode := range []string{"auto", "on", "off"} {
		prepareInbox = mode
		for name, auto := range want {
			e := listed(name)
			w := map[string]bool{"auto": auto, "on": true, "off": false}[mode]
			if got := prepareFor(e); got != w {
				t.Errorf("-prepare %s, %s: prepareFor = %v, want %v", mode, name, got, w)
			}
		}
	}
	prepareInbox = "auto"
	t.Setenv("INBOX_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/x?interpolateParams=true&parseTime=true")
	if prepareFor(listed("mysql")) {
		t.Error("-prepare auto prepared MySQL's statements under interpolateParams=true")
	}
	maria := listed("mysql")
	maria.dialect = inbox.MariaDB
	if !prepareFor(maria) {
		t.Error("-prepare auto left inbox.MariaDB's statements as text under interpolateParams=true")
	}
}

// -claims-at-once reaches the Config of inbox's side and the headers that
// describe that side; 0 leaves both as they were.
func TestClaimsAtOnceFlag(t *testing.T) {
	defer func(n int) { claimsAtOnce = n }(claimsAtOnce)
	e := needEngine(t, "mattn")
	db, err := e.open(t.TempDir(), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	claimsAtOnce = -1
	if _, err := newInboxSide(e, db, "bench_bound", "lease", 1); err == nil || !strings.Contains(err.Error(), "Config.ClaimsAtOnce -1") {
		t.Errorf("-claims-at-once -1: newInboxSide = %v, want inbox.New's error naming Config.ClaimsAtOnce", err)
	}
	claimsAtOnce = 2
	if _, err := newInboxSide(e, db, "bench_bound", "lease", 16); err != nil {
		t.Fatal(err)
	}
	for name, header := range map[string]string{"table": handTableKind(), "peers": peerInboxLoop()} {
		if !strings.Contains(header, "Config.ClaimsAtOnce 2") {
			t.Errorf("-claims-at-once 2: the %s header %q does not name the bound", name, header)
		}
	}
	claimsAtOnce = 0
	for name, header := range map[string]string{"table": handTableKind(), "peers": peerInboxLoop()} {
		if strings.Contains(header, "ClaimsAtOnce") {
			t.Errorf("no bound: the %s header %q names one", name, header)
		}
	}
}
