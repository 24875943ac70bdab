package inbox_test

import (
	"context"
	"testing"

	"github.com/sqlinbox/inbox"
)

// The schema check reports a priority column that accepts NULL, on every
// engine, naming the fix; a NOT NULL one passes. Before: the check passed,
// and every claim meeting a row from before the column was added failed
// to read its NULL priority (dbtest's TestUsersNullPriority).
func TestCheckSchemaPriorityNullable(t *testing.T) {
	want := []string{`Table.Priority "priority" accepts NULL`, "UPDATE jobs SET priority = 0 WHERE priority IS NULL", "NOT NULL DEFAULT 0"}
	tb := inbox.Table{Name: "jobs", LockedUntil: "locked_until", Priority: "priority"}
	t.Run("postgres", func(t *testing.T) {
		for _, nullable := range []bool{true, false} {
			m := newMock(t)
			q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: tb})
			m.ExpectQuery(pgProbe).WithoutArgs().WillReturnRows(pgAnswer(pg15))
			m.ExpectQuery(pgColumns).WithArgs("", "jobs").WillReturnRows(rows("column_name,data_type", row("id", "bigint"),
				row("attempt", "integer"), row("payload", "bytea"), row("locked_until", "timestamp with time zone"), row("priority", "integer")))
			m.ExpectQuery("SELECT is_nullable = 'YES' FROM information_schema.columns "+
				"WHERE table_schema = COALESCE(NULLIF($1, ''), current_schema()) AND table_name = $2 AND column_name = $3").
				WithArgs("", "jobs", "priority").WillReturnRows(rows("nullable", row(nullable)))
			checkPriorityProblem(t, m, q, nullable, want)
		}
	})
	t.Run("mysql", func(t *testing.T) {
		m := newMock(t)
		q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: tb})
		m.ExpectQuery(myProbe).WithoutArgs().WillReturnRows(myAnswer(mariadb1011, mariaComment))
		m.ExpectQuery(myColumns).WithArgs("", "jobs").WillReturnRows(rows("column_name,column_type", row("id", "bigint"),
			row("attempt", "int"), row("payload", "blob"), row("locked_until", "datetime(6)"), row("priority", "int")))
		m.ExpectQuery(myFill).WithArgs("", "jobs", "id", "id").WillReturnRows(myAutoID())
		m.ExpectQuery(myEngine).WithArgs("", "jobs").WillReturnRows(rows("engine", row("InnoDB")))
		m.ExpectQuery("SELECT is_nullable = 'YES' FROM information_schema.columns "+
			"WHERE table_schema = COALESCE(NULLIF(?, ''), DATABASE()) AND table_name = ? AND column_name = ?").
			WithArgs("", "jobs", "priority").WillReturnRows(rows("nullable", row(int64(1))))
		checkPriorityProblem(t, m, q, true, want)
	})
	t.Run("sqlite", func(t *testing.T) {
		for _, nullable := range []bool{true, false} {
			m := newMock(t)
			q := newQueue(t, m, inbox.Config{Dialect: inbox.SQLite, Table: tb})
			m.ExpectQuery(sqliteProbe).WithoutArgs().WillReturnRows(rows("v", row("3.46.1")))
			m.ExpectQuery("SELECT name, type FROM pragma_table_xinfo(?)").WithArgs("jobs").WillReturnRows(rows("name,type",
				row("id", "INTEGER"), row("attempt", "INTEGER"), row("payload", "BLOB"), row("locked_until", "TEXT"), row("priority", "INTEGER")))
			m.ExpectQuery(`SELECT "notnull" = 0 FROM pragma_table_xinfo(?, ?) WHERE name = ? COLLATE NOCASE`).
				WithArgs("jobs", "main", "priority").WillReturnRows(rows("nullable", row(nullable)))
			m.ExpectQuery("SELECT type, pk, (SELECT COUNT(*) FROM pragma_table_info(?, ?) WHERE pk > 0) FROM pragma_table_info(?, ?) WHERE name = ? COLLATE NOCASE").
				WithArgs("jobs", "main", "jobs", "main", "id").WillReturnRows(rows("type,pk,pks", row("INTEGER", int64(1), int64(1))))
			m.ExpectQuery("SELECT sql FROM `main`.sqlite_master WHERE type = 'table' AND name = ? COLLATE NOCASE").WithArgs("jobs").
				WillReturnRows(rows("sql", row("CREATE TABLE jobs (id INTEGER PRIMARY KEY AUTOINCREMENT)")))
			checkPriorityProblem(t, m, q, nullable, want)
		}
	})
}

// checkPriorityProblem runs the check: one problem naming want when
// nullable, none otherwise.
func checkPriorityProblem(t *testing.T, m *mock, q *inbox.Queue, nullable bool, want []string) {
	t.Helper()
	if !nullable {
		if err := q.CheckSchema(context.Background()); err != nil {
			t.Errorf("a NOT NULL priority: CheckSchema = %v, want nil", err)
		}
		m.Met(t)
		return
	}
	ps := checkProblems(t, m, q)
	if len(ps) != 1 {
		t.Fatalf("%d problems, want 1: %q", len(ps), ps)
	}
	hasWords(t, ps[0], want...)
}
