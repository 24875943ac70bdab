package dbtest

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sqlinbox/inbox"
)

// fuzzXCanary is the table every round trip keeps beside the queue table;
// it must come out of every input untouched.
const fuzzXCanary = "fuzz_canary"

// fuzzXNames is one fuzzed description: the table and its columns, and the
// form (lease: lock names the lease column; advisory: lock names the key
// column).
type fuzzXNames struct {
	table, id, attempt, data, lock string
	advisory                       bool
}

// fuzzXSeeds are names that have broken SQL builders before: quotes of
// every engine, statement separators, an injection aimed at the canary,
// unicode, blanks, reserved words, the length limits and collisions.
var fuzzXSeeds = []fuzzXNames{
	{"jobs", "id", "attempt", "payload", "locked_until", false},
	{"jobs", "id", "attempt", "payload", "k", true},
	{"select", "order", "group", "from", "where", false},
	{"order", "select", "table", "index", "limit", true},
	{"Jobs", "Id", "ATTEMPT", "PayLoad", "Locked_Until", false},
	{"_", "_1", "__", "_x_", "___", false},
	{`jo"bs`, "id", "attempt", "payload", "locked_until", false},
	{"jo`bs", "id", "attempt", "payload", "locked_until", false},
	{"jo'bs", "id", "attempt", "payload", "locked_until", false},
	{"jo[bs]", "id", "attempt", "payload", "locked_until", false},
	{"jobs;", "id", "attempt", "payload", "locked_until", false},
	{`"; DROP TABLE fuzz_canary; --`, "id", "attempt", "payload", "locked_until", false},
	{`jobs" (x int); DROP TABLE fuzz_canary; --`, "id", "attempt", "payload", "locked_until", false},
	{"jobs", `id"; DROP TABLE fuzz_canary; --`, "attempt", "payload", "locked_until", false},
	{"jobs", "id", "attempt", "payload`; DROP TABLE fuzz_canary; --", "locked_until", false},
	{"jobs", "id", "attempt", "payload", "k'); DROP TABLE fuzz_canary; --", true},
	{"jöbs", "ид", "attempt", "payload", "locked_until", false},
	{"jobs\u200b", "id", "attempt", "payload", "locked_until", false},
	{"jobs🙂", "id", "attempt", "payload", "locked_until", false},
	{"my jobs", "the id", "attempt", "payload", "locked_until", false},
	{" jobs", "id ", "attempt", "payload", "locked_until", false},
	{"jobs\t", "id", "attempt\n", "payload", "locked_until", false},
	{"jobs\x00x", "id", "attempt", "payload", "locked_until", false},
	{"j" + strings.Repeat("o", 61) + "b", "i" + strings.Repeat("d", 62), "attempt", "payload", "l" + strings.Repeat("u", 62), false},
	{"j" + strings.Repeat("o", 62) + "b", "id", "attempt", "payload", "locked_until", false},
	{"jobs", "id", "a" + strings.Repeat("t", 63), "payload", "locked_until", false},
	{"1jobs", "id", "attempt", "payload", "locked_until", false},
	{"jobs", "1d", "attempt", "payload", "locked_until", false},
	{"", "id", "attempt", "payload", "locked_until", false},
	{"jobs", "", "", "", "locked_until", false},
	{"main.jobs", "id", "attempt", "payload", "locked_until", false},
	{"a.b.c", "id", "attempt", "payload", "locked_until", false},
	{".jobs", "id", "attempt", "payload", "locked_until", false},
	{"jobs.", "id", "attempt", "payload", "locked_until", false},
	{"jobs", "id", "id", "payload", "locked_until", false},
	{"jobs", "x", "X", "payload", "locked_until", false},
	{"jobs", "id", "attempt", "id", "locked_until", false},
	{"jobs", "id", "attempt", "payload", "ID", true},
	{"jobs", "id", "attempt", "payload", "Payload", false},
	{"sqlite_jobs", "id", "attempt", "payload", "locked_until", false},
	{fuzzXCanary, "id", "attempt", "payload", "locked_until", false},
}

// FuzzTableNames: for arbitrary table and column names, inbox.New either
// refuses the description or the names round-trip exactly through a real
// SQLite database (in memory, both drivers): the table made with the
// dialect's quoting takes a job through Enqueue, Claim and Ack, keeps
// exactly the names given, and a canary table beside it is untouched. CI
// runs the seeds; `go test -fuzz FuzzTableNames ./dbtest` explores.
func FuzzTableNames(f *testing.F) {
	for _, s := range fuzzXSeeds {
		f.Add(s.table, s.id, s.attempt, s.data, s.lock, s.advisory)
	}
	var n atomic.Int64
	f.Fuzz(func(t *testing.T, table, id, attempt, data, lock string, advisory bool) {
		names := fuzzXNames{table, id, attempt, data, lock, advisory}
		for _, e := range Engines {
			if !e.IsSQLite() {
				continue
			}
			// A fresh in-memory database per input, on one connection:
			// each connection would get its own.
			db, err := sql.Open(e.Driver, fmt.Sprintf("file:fuzz%d?mode=memory", n.Add(1)))
			if err != nil {
				t.Fatal(err)
			}
			// Closed however the round trip ends, t.Skip included.
			defer db.Close()
			db.SetMaxOpenConns(1)
			fuzzXRoundTrip(t, e, db, "", names)
		}
	})
}

// TestFuzzSeedsServers runs the seeds' round trip on PostgreSQL (both
// drivers) and MariaDB, each in a schema (database) of its own that the test
// drops, so that reserved words and odd names never land beside other
// tables. Names with a dot are SQLite-only here: the schema qualifies every
// table.
func TestFuzzSeedsServers(t *testing.T) {
	logWall(t)
	for _, e := range serverEngines() {
		t.Run(e.Name, func(t *testing.T) {
			t.Parallel()
			db := e.Open(t, 4)
			schema := fmt.Sprintf("fuzz_%s_%d", e.Name, os.Getpid())
			create, drop := "CREATE SCHEMA "+schema, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"
			if e.IsMySQL() {
				create, drop = "CREATE DATABASE "+schema, "DROP DATABASE IF EXISTS "+schema
			}
			if _, err := db.Exec(drop); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Exec(create); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if _, err := db.Exec(drop); err != nil {
					t.Errorf("%s: %v", drop, err)
				}
			})
			accepted, refused := 0, 0
			for i, s := range fuzzXSeeds {
				if strings.Contains(s.table, ".") {
					continue
				}
				t.Run(fmt.Sprint(i), func(t *testing.T) {
					if fuzzXRoundTrip(t, e, db, schema, s) {
						accepted++
					} else {
						refused++
					}
				})
			}
			// The seeds hold both kinds; a run that saw only one checked
			// half the property.
			if accepted == 0 || refused == 0 {
				t.Errorf("%d seeds accepted and %d refused; want some of each", accepted, refused)
			}
			t.Logf("FIGURE: fuzz seeds on %s: %d accepted and round-tripped, %d refused at construction", e.Name, accepted, refused)
		})
	}
}

// fuzzXRoundTrip checks one description on db: refused by New, or
// round-tripped exactly. schema, when not empty, qualifies every table. It
// reports whether New accepted the description.
func fuzzXRoundTrip(t *testing.T, e Engine, db *sql.DB, schema string, n fuzzXNames) bool {
	t.Helper()
	ctx := context.Background()
	name := n.table
	if schema != "" {
		name = schema + "." + n.table
	}
	tb := inbox.Table{Name: name, ID: n.id, Attempt: n.attempt, Data: []string{n.data}}
	if n.data == "" {
		tb.Data = nil
	}
	if n.advisory {
		tb.AdvisoryKey = n.lock
	} else {
		tb.LockedUntil = n.lock
	}
	q, err := inbox.New(db, inbox.Config{Dialect: e.Dialect, Table: tb, Prepare: prepareAll})
	if err != nil {
		// Refused: the error says which part of the description.
		if !strings.HasPrefix(err.Error(), "inbox: ") || !strings.Contains(err.Error(), "Table") {
			t.Fatalf("New refused %+v with %q, which names no field of the description", tb, err)
		}
		return false
	}

	// Accepted: the names as the table will hold them, defaults filled in.
	def := func(v, d string) string {
		if v == "" {
			return d
		}
		return v
	}
	idCol, attCol, dataCol := def(n.id, "id"), def(n.attempt, "attempt"), def(n.data, "payload")
	if n.advisory && n.lock == "" {
		t.Fatalf("New accepted the advisory form without a key column: %+v", tb)
	}
	if strings.EqualFold(n.table, fuzzXCanary) {
		t.Skipf("the description names the canary table %q itself", n.table)
	}
	if e.IsSQLite() {
		if sch, tbl, ok := strings.Cut(n.table, "."); ok && (!strings.EqualFold(sch, "main") || strings.HasPrefix(strings.ToLower(tbl), "sqlite_")) {
			t.Skipf("SQLite itself refuses table %q (attached schemas are main and temp; sqlite_ is reserved)", n.table)
		}
		if strings.HasPrefix(strings.ToLower(n.table), "sqlite_") {
			t.Skipf("SQLite itself refuses table %q (sqlite_ is reserved)", n.table)
		}
	}
	// Quoted names are case-sensitive on PostgreSQL; MariaDB and SQLite
	// compare column names without case.
	same := strings.EqualFold
	if e.IsPostgres() {
		same = func(a, b string) bool { return a == b }
	}
	types := fuzzXTypes(e)
	type col struct{ name, typ string }
	cols := []col{{idCol, types["id"]}, {attCol, types["attempt"]}}
	dataIsID := same(dataCol, idCol)
	if !dataIsID {
		cols = append(cols, col{dataCol, types["data"]})
	}
	lockType := types["lease"]
	if n.advisory {
		lockType = types["key"]
	}
	if !(n.advisory && same(n.lock, idCol)) {
		for _, c := range cols {
			if same(c.name, n.lock) {
				t.Skipf("the description names column %q for two roles of different types; New accepts it, there is nothing to round-trip", n.lock)
			}
		}
		cols = append(cols, col{n.lock, lockType})
	}

	quote := func(s string) string {
		v, err := e.Dialect.QuoteIdent(s)
		if err != nil {
			t.Fatalf("New accepted %q but QuoteIdent refuses it: %v", s, err)
		}
		return v
	}
	qualify := func(tbl string) string {
		if schema != "" {
			return quote(schema) + "." + quote(tbl)
		}
		if sch, t2, ok := strings.Cut(tbl, "."); ok {
			return quote(sch) + "." + quote(t2)
		}
		return quote(tbl)
	}
	canary := qualify(fuzzXCanary)
	exec := func(s string, args ...any) {
		t.Helper()
		if _, err := db.ExecContext(ctx, bind(e, s), args...); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	exec("DROP TABLE IF EXISTS " + canary)
	exec("CREATE TABLE " + canary + " (x varchar(20) NOT NULL)")
	exec("INSERT INTO "+canary+" (x) VALUES (?)", "alive")
	qt := qualify(n.table)
	exec("DROP TABLE IF EXISTS " + qt)
	defs := make([]string, len(cols))
	for i, c := range cols {
		defs[i] = quote(c.name) + " " + c.typ
	}
	exec("CREATE TABLE " + qt + " (" + strings.Join(defs, ", ") + ")")
	defer exec("DROP TABLE IF EXISTS " + qt)
	if err := q.CheckSchema(ctx); err != nil {
		t.Fatalf("schema check of the table made from %+v: %v", tb, err)
	}

	// A job goes through Enqueue, Claim and Ack.
	job := inbox.Job{ID: int64(42), Data: []any{[]byte("round trip")}}
	if dataIsID {
		job = inbox.Job{Data: []any{int64(42)}}
	}
	if id, err := q.Enqueue(ctx, db, job); err != nil || id != int64(42) {
		t.Fatalf("enqueue into %+v: id %v (%T), %v; want 42", tb, id, id, err)
	}
	ds, err := q.Claim(ctx, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("claim from %+v: %d deliveries, %v", tb, len(ds), err)
	}
	d := ds[0]
	if d.ID() != int64(42) || d.Attempt() != 1 {
		t.Errorf("claimed job %v attempt %d, want 42 attempt 1", d.ID(), d.Attempt())
	}
	if dataIsID {
		var v int64
		if err := d.Scan(&v); err != nil || v != 42 {
			t.Errorf("data %v, %v; want 42", v, err)
		}
	} else {
		var v []byte
		if err := d.Scan(&v); err != nil || string(v) != "round trip" {
			t.Errorf("data %q, %v; want %q", v, err, "round trip")
		}
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatalf("ack in %+v: %v", tb, err)
	}
	var left int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+qt).Scan(&left); err != nil || left != 0 {
		t.Errorf("%d rows left after the ack (%v)", left, err)
	}

	// The canary is untouched, no table appeared or went, and the queue
	// table holds exactly the names given.
	var x string
	var rows int
	if err := db.QueryRowContext(ctx, "SELECT MIN(x), COUNT(*) FROM "+canary).Scan(&x, &rows); err != nil || x != "alive" || rows != 1 {
		t.Fatalf("canary after %+v: %q, %d rows, %v", tb, x, rows, err)
	}
	bare := n.table
	if _, t2, ok := strings.Cut(n.table, "."); ok && schema == "" {
		bare = t2
	}
	wantTables := []string{fuzzXCanary, bare}
	sort.Strings(wantTables)
	if got := fuzzXList(t, e, db, schema, "tables", ""); strings.Join(got, "\x00") != strings.Join(wantTables, "\x00") {
		t.Errorf("tables %q, want exactly %q", got, wantTables)
	}
	want := make([]string, len(cols))
	for i, c := range cols {
		want[i] = c.name
	}
	sort.Strings(want)
	if got := fuzzXList(t, e, db, schema, "columns", bare); strings.Join(got, "\x00") != strings.Join(want, "\x00") {
		t.Errorf("columns of %q: %q, want exactly %q", bare, got, want)
	}
	return true
}

// fuzzXTypes are the column types of each role on e.
func fuzzXTypes(e Engine) map[string]string {
	switch {
	case e.IsPostgres():
		return map[string]string{"id": "bigint PRIMARY KEY", "attempt": "integer NOT NULL DEFAULT 1", "data": "bytea",
			"lease": "timestamptz", "key": "text NOT NULL DEFAULT ''"}
	case e.IsMySQL():
		return map[string]string{"id": "bigint PRIMARY KEY", "attempt": "integer NOT NULL DEFAULT 1", "data": "blob",
			"lease": "DATETIME(6) NULL", "key": "varchar(64) NOT NULL DEFAULT ''"}
	}
	return map[string]string{"id": "INTEGER PRIMARY KEY AUTOINCREMENT", "attempt": "INTEGER NOT NULL DEFAULT 1", "data": "BLOB",
		"lease": "TEXT", "key": "TEXT NOT NULL DEFAULT ''"}
}

// fuzzXList lists, sorted, the tables of schema (SQLite: of main) or the
// columns of table, as the engine's catalog spells them.
func fuzzXList(t *testing.T, e Engine, db *sql.DB, schema, what, table string) []string {
	t.Helper()
	var q string
	var args []any
	switch {
	case e.IsSQLite() && what == "tables":
		// sqlite_sequence is SQLite's own, made for AUTOINCREMENT.
		q = "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'"
	case e.IsSQLite():
		q, args = "SELECT name FROM pragma_table_info(?)", []any{table}
	case what == "tables":
		q, args = "SELECT table_name FROM information_schema.tables WHERE table_schema = ?", []any{schema}
	default:
		q, args = "SELECT column_name FROM information_schema.columns WHERE table_schema = ? AND table_name = ?", []any{schema, table}
	}
	rows, err := db.Query(bind(e, q), args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}
