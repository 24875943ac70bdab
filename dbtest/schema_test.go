package dbtest

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/sqlinbox/inbox"
)

// definitionOf returns table's definition as the engine states it, empty
// when there is no such table.
func definitionOf(t testing.TB, e Engine, db *sql.DB, table string) string {
	t.Helper()
	var def sql.NullString
	var err error
	switch {
	case e.IsPostgres():
		err = db.QueryRow("SELECT string_agg(column_name || ' ' || data_type || ' ' || is_nullable || ' ' || COALESCE(column_default, ''), ', ' ORDER BY ordinal_position) "+
			"FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = $1", table).Scan(&def)
	case e.IsMySQL():
		err = db.QueryRow("SELECT GROUP_CONCAT(CONCAT(column_name, ' ', column_type, ' ', is_nullable, ' ', COALESCE(column_default, '')) ORDER BY ordinal_position SEPARATOR ', ') "+
			"FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = ?", table).Scan(&def)
	default:
		err = db.QueryRow("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", table).Scan(&def)
		if errors.Is(err, sql.ErrNoRows) {
			err = nil
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	return def.String
}

// checkUnchanged runs the schema check and asserts that it changed nothing: the
// definitions and rows of the named tables are as before.
func checkUnchanged(t *testing.T, e Engine, db *sql.DB, q *inbox.Queue, tables ...string) error {
	t.Helper()
	snap := func() string {
		var b strings.Builder
		for _, tb := range tables {
			def := definitionOf(t, e, db, tb)
			b.WriteString(tb + ": " + def + "\n")
			if def != "" {
				b.WriteString(strings.Join(dumpRows(t, db, tb), "\n") + "\n")
			}
		}
		return b.String()
	}
	before := snap()
	err := q.CheckSchema(context.Background())
	if after := snap(); after != before {
		t.Errorf("the schema check changed the database:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	mustBeIdle(t, db, q)
	return err
}

// problemsOf expects a *SchemaError and returns its problems.
func problemsOf(t *testing.T, err error) []string {
	t.Helper()
	var se *inbox.SchemaError
	if !errors.As(err, &se) {
		t.Fatalf("schema check: %v, want a *SchemaError", err)
	}
	return se.Problems
}

// hasProblem fails unless some problem contains every one of words, in any
// case.
func hasProblem(t *testing.T, problems []string, words ...string) {
	t.Helper()
	for _, p := range problems {
		all := true
		for _, w := range words {
			all = all && strings.Contains(strings.ToLower(p), strings.ToLower(w))
		}
		if all {
			return
		}
	}
	t.Errorf("no problem names %q among:\n%s", words, strings.Join(problems, "\n"))
}

// TestSchemaCheck: the check passes a correct table in every form, reports a
// missing table, reports every problem of a wrong table at once, refuses
// each engine's wrong time type for the lease column, and changes nothing.
func TestSchemaCheck(t *testing.T) {
	eachEngine(t, nil, func(t *testing.T, e Engine) {
		db := e.Open(t, 2)
		table := newTable(t, e, db, "schema")
		mustExec(t, e, db, "INSERT INTO "+table+" (payload) VALUES (?)", []byte("keep me"))

		for _, form := range formsWithKey(e) {
			q := newQueue(t, db, queueConfig(e, Table(table, form), nil))
			if err := checkUnchanged(t, e, db, q, table, table+"_dead"); err != nil {
				t.Errorf("%s: a correct table: %v", form, err)
			}
		}
		if !e.IsSQLite() {
			claims := Table(table, "rowlock-claims")
			if err := checkUnchanged(t, e, db, newQueue(t, db, queueConfig(e, claims, nil)), table, table+"_dead", table+"_claims"); err != nil {
				t.Errorf("a correct table with a claims counter: %v", err)
			}
			// The side table is checked: missing, and with a claims column
			// of a text type.
			noClaims := tableName(e, "schema_noclaims")
			mustExec(t, e, db, "DROP TABLE IF EXISTS "+noClaims)
			claims.ClaimsTable = noClaims
			ps := problemsOf(t, checkUnchanged(t, e, db, newQueue(t, db, queueConfig(e, claims, nil)), table, noClaims))
			hasProblem(t, ps, noClaims, "does not exist")
			badClaims := tableName(e, "schema_badclaims")
			textType := "text"
			if e.IsMySQL() {
				textType = "varchar(10)"
			}
			mustExec(t, e, db, "DROP TABLE IF EXISTS "+badClaims)
			mustExec(t, e, db, "CREATE TABLE "+badClaims+" (id bigint PRIMARY KEY, claims "+textType+" NOT NULL)")
			dropAtEnd(t, e, db, badClaims)
			claims.ClaimsTable = badClaims
			ps = problemsOf(t, checkUnchanged(t, e, db, newQueue(t, db, queueConfig(e, claims, nil)), table, badClaims))
			if len(ps) != 1 {
				t.Errorf("%d problems, want 1:\n%s", len(ps), strings.Join(ps, "\n"))
			}
			hasProblem(t, ps, badClaims, "claims", textType)
		}

		missing := tableName(e, "schema_missing")
		mustExec(t, e, db, "DROP TABLE IF EXISTS "+missing)
		mustExec(t, e, db, "DROP TABLE IF EXISTS "+missing+"_dead")
		q := newQueue(t, db, queueConfig(e, Table(missing, "lease"), nil))
		ps := problemsOf(t, checkUnchanged(t, e, db, q, missing, missing+"_dead"))
		hasProblem(t, ps, missing, "does not exist")
		hasProblem(t, ps, missing+"_dead", "does not exist")

		// attempt of a text type, locked_until and the data column note
		// missing: three problems, one error.
		bad := tableName(e, "schema_bad")
		attemptType := "text"
		if e.IsMySQL() {
			attemptType = "varchar(10)"
		}
		mustExec(t, e, db, "DROP TABLE IF EXISTS "+bad)
		// SQLite's id is AUTOINCREMENT, as the check asks (the ids
		// subtest of TestConcIDsNeverReused shows why).
		idDecl := "id integer PRIMARY KEY"
		if e.IsSQLite() {
			idDecl += " AUTOINCREMENT"
		}
		mustExec(t, e, db, "CREATE TABLE "+bad+" ("+idDecl+", attempt "+attemptType+" NOT NULL, payload "+map[bool]string{true: "bytea", false: "blob"}[e.IsPostgres()]+")")
		dropAtEnd(t, e, db, bad)
		btb := Table(bad, "lease")
		btb.DeadTable = ""
		btb.Data = []string{"payload", "note"}
		ps = problemsOf(t, checkUnchanged(t, e, db, newQueue(t, db, queueConfig(e, btb, nil)), bad))
		if len(ps) != 3 {
			t.Errorf("%d problems, want 3:\n%s", len(ps), strings.Join(ps, "\n"))
		}
		hasProblem(t, ps, "attempt", attemptType)
		hasProblem(t, ps, "locked_until")
		hasProblem(t, ps, "note")

		// Each engine's tempting but wrong lease column.
		wrong := tableName(e, "schema_time")
		var timeType, want string
		switch {
		case e.IsPostgres():
			timeType, want = "timestamp", "timestamp without time zone"
		case e.IsMySQL():
			timeType, want = "DATETIME NULL", "fractional seconds"
		default:
			timeType, want = "DATETIME", "DATETIME"
		}
		mustExec(t, e, db, "DROP TABLE IF EXISTS "+wrong)
		mustExec(t, e, db, "CREATE TABLE "+wrong+" ("+idDecl+", attempt integer NOT NULL DEFAULT 1, locked_until "+timeType+", payload "+map[bool]string{true: "bytea", false: "blob"}[e.IsPostgres()]+")")
		dropAtEnd(t, e, db, wrong)
		wtb := Table(wrong, "lease")
		wtb.DeadTable = ""
		ps = problemsOf(t, checkUnchanged(t, e, db, newQueue(t, db, queueConfig(e, wtb, nil)), wrong))
		if len(ps) != 1 {
			t.Errorf("%d problems, want 1:\n%s", len(ps), strings.Join(ps, "\n"))
		}
		hasProblem(t, ps, "locked_until", want)
	})
}
