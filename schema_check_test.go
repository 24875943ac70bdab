package inbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
)

// checkProblems runs the schema check, asserts that every expectation was
// met, and returns the problems of its *SchemaError.
func checkProblems(t *testing.T, m *mock, q *inbox.Queue) []string {
	t.Helper()
	err := q.CheckSchema(context.Background())
	m.Met(t)
	var se *inbox.SchemaError
	if !errors.As(err, &se) {
		t.Fatalf("CheckSchema = %v, want a *SchemaError", err)
	}
	return se.Problems
}

// hasWords fails unless problem contains every word.
func hasWords(t *testing.T, problem string, words ...string) {
	t.Helper()
	for _, w := range words {
		if !strings.Contains(problem, w) {
			t.Errorf("problem %q does not name %q", problem, w)
		}
	}
}

// A dialect sent to a server of another engine is told in the check's
// first statement, which parses on every server (or, for SQLite's, fails
// recognisably and the other probe names the server): one problem naming
// the server found and the dialect to use, and nothing else is sent.
// Before: the server's raw error ("function current_setting does not
// exist", "syntax error at or near `"…).
func TestCheckSchemaWrongDialect(t *testing.T) {
	lease := inbox.Table{Name: "jobs", LockedUntil: "locked_until"}
	for _, tc := range []struct {
		name    string
		dialect inbox.Dialect
		expect  func(m *mock)
		want    []string
	}{
		{"postgres on mariadb", inbox.Postgres, func(m *mock) {
			m.ExpectQuery(pgProbe).WithoutArgs().WillReturnError(errors.New("Error 1305 (42000): FUNCTION pg_catalog.version does not exist"))
			m.ExpectQuery(myProbe).WithoutArgs().WillReturnRows(myAnswer(mariadb1011, mariaComment))
		}, []string{"MariaDB", mariadb1011, "not PostgreSQL", "inbox.Postgres cannot run there", "use inbox.MariaDB or inbox.MySQL"}},
		{"postgres on tidb", inbox.Postgres, func(m *mock) {
			m.ExpectQuery(pgProbe).WithoutArgs().WillReturnError(errors.New("Error 1305 (42000): FUNCTION pg_catalog.version does not exist"))
			m.ExpectQuery(myProbe).WithoutArgs().WillReturnRows(myAnswer(overridden, tidbComment))
		}, []string{"TiDB", "version_comment", "not PostgreSQL", "use inbox.MySQL (advisory form)"}},
		{"mysql on postgres", inbox.MySQL, func(m *mock) {
			m.ExpectQuery(myProbe).WithoutArgs().WillReturnError(errors.New(`pq: column "version_comment" does not exist`))
			m.ExpectQuery(pgProbe).WithoutArgs().WillReturnRows(pgAnswer(pg15))
		}, []string{"PostgreSQL", "PostgreSQL 15.20", "not MySQL or MariaDB", "inbox.MySQL cannot run there", "use inbox.Postgres"}},
		{"mariadb on postgres", inbox.MariaDB, func(m *mock) {
			m.ExpectQuery(myProbe).WithoutArgs().WillReturnError(errors.New(`pq: column "version_comment" does not exist`))
			m.ExpectQuery(pgProbe).WithoutArgs().WillReturnRows(pgAnswer(pg15))
		}, []string{"PostgreSQL", "inbox.MariaDB cannot run there", "use inbox.Postgres"}},
		{"mysql on cockroach", inbox.MySQL, func(m *mock) {
			m.ExpectQuery(myProbe).WithoutArgs().WillReturnError(errors.New("ERROR: at or near \"@\": syntax error"))
			m.ExpectQuery(pgProbe).WithoutArgs().WillReturnRows(pgAnswer(cockroach))
		}, []string{"CockroachDB", "pg_catalog.version()", "examples/cockroach"}},
		{"sqlite on postgres", inbox.SQLite, func(m *mock) {
			m.ExpectQuery(sqliteProbe).WithoutArgs().WillReturnError(errors.New("pq: function sqlite_version() does not exist"))
			m.ExpectQuery(pgProbe).WithoutArgs().WillReturnRows(pgAnswer(pg15))
		}, []string{"PostgreSQL 15.20", "not SQLite", "inbox.SQLite cannot run there", "use inbox.Postgres"}},
		{"sqlite on mariadb", inbox.SQLite, func(m *mock) {
			m.ExpectQuery(sqliteProbe).WithoutArgs().WillReturnError(errors.New("Error 1305 (42000): FUNCTION inbox.sqlite_version does not exist"))
			m.ExpectQuery(pgProbe).WithoutArgs().WillReturnError(errors.New("Error 1305 (42000): FUNCTION pg_catalog.version does not exist"))
			m.ExpectQuery(myProbe).WithoutArgs().WillReturnRows(myAnswer(mariadb1011, mariaComment))
		}, []string{"MariaDB", "not SQLite", "use inbox.MariaDB or inbox.MySQL"}},
		{"postgres on sqlite", inbox.Postgres, func(m *mock) {
			m.ExpectQuery(pgProbe).WithoutArgs().WillReturnError(errors.New(`near "(": syntax error`))
			m.ExpectQuery(myProbe).WithoutArgs().WillReturnError(errors.New("no such function: version"))
			m.ExpectQuery(sqliteProbe).WithoutArgs().WillReturnRows(rows("v", row("3.46.1")))
		}, []string{"SQLite", "3.46.1", "not PostgreSQL", "use inbox.SQLite"}},
		{"mysql on sqlite", inbox.MySQL, func(m *mock) {
			m.ExpectQuery(myProbe).WithoutArgs().WillReturnError(errors.New("no such function: version"))
			m.ExpectQuery(pgProbe).WithoutArgs().WillReturnError(errors.New(`near "(": syntax error`))
			m.ExpectQuery(sqliteProbe).WithoutArgs().WillReturnRows(rows("v", row("3.46.1")))
		}, []string{"SQLite", "not MySQL or MariaDB", "use inbox.SQLite"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMock(t)
			q := newQueue(t, m, inbox.Config{Dialect: tc.dialect, Table: lease})
			tc.expect(m)
			ps := checkProblems(t, m, q)
			if len(ps) != 1 {
				t.Fatalf("%d problems, want 1: %q", len(ps), ps)
			}
			hasWords(t, ps[0], tc.want...)
		})
	}
	// When neither probe answers, the first one's error is returned.
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: lease})
	cut := errors.New("connection reset")
	m.ExpectQuery(pgProbe).WithoutArgs().WillReturnError(cut)
	m.ExpectQuery(myProbe).WithoutArgs().WillReturnError(errors.New("another"))
	m.ExpectQuery(sqliteProbe).WithoutArgs().WillReturnError(errors.New("a third"))
	if err := q.CheckSchema(context.Background()); !errors.Is(err, cut) {
		t.Errorf("CheckSchema = %v, want the probe's error", err)
	}
	m.Met(t)
}

// A MySQL or MariaDB table whose storage engine is not InnoDB is reported
// in every form, for the queue, dead and claims tables, naming the table,
// its engine and the fix. Before: MyISAM passed, and 4 loops ran each of
// 40 jobs more than once.
func TestCheckSchemaStorageEngine(t *testing.T) {
	for _, d := range []inbox.Dialect{inbox.MySQL, inbox.MariaDB} {
		for _, form := range []inbox.Form{inbox.Lease, inbox.RowLock, inbox.Advisory} {
			t.Run(d.Name()+"/"+form.String(), func(t *testing.T) {
				m := newMock(t)
				tb := inbox.Table{Name: "app.jobs", DeadTable: "jobs_dead"}
				cols := rows("column_name,column_type", row("id", "bigint"), row("attempt", "int"), row("payload", "blob"))
				switch form {
				case inbox.Lease:
					tb.LockedUntil = "locked_until"
					cols.AddRow("locked_until", "datetime(6)")
				case inbox.Advisory:
					tb.AdvisoryKey = "id"
				}
				q := newQueue(t, m, inbox.Config{Dialect: d, Table: tb})
				m.ExpectQuery(myProbe).WithoutArgs().WillReturnRows(myAnswer(mariadb1011, mariaComment))
				if form != inbox.Lease {
					m.ExpectQuery(myWsrep).WithoutArgs().WillReturnRows(rows("Variable_name,Value", row("wsrep_on", "OFF")))
				}
				m.ExpectQuery(myColumns).WithArgs("app", "jobs").WillReturnRows(cols)
				m.ExpectQuery(myColumns).WithArgs("", "jobs_dead").
					WillReturnRows(rows("column_name,column_type", row("id", "bigint"), row("attempt", "int"), row("payload", "blob")))
				m.ExpectQuery(myFill).WithArgs("app", "jobs", "id", "id").WillReturnRows(myAutoID())
				m.ExpectQuery(myEngine).WithArgs("app", "jobs").WillReturnRows(rows("engine", row("MyISAM")))
				m.ExpectQuery(myEngine).WithArgs("", "jobs_dead").WillReturnRows(rows("engine", row("Aria")))
				if form == inbox.Lease {
					expectIDPrimary(m, "app")
				}
				ps := checkProblems(t, m, q)
				if len(ps) != 2 {
					t.Fatalf("%d problems, want 2: %q", len(ps), ps)
				}
				hasWords(t, ps[0], "table app.jobs", "MyISAM", "not InnoDB", "ALTER TABLE app.jobs ENGINE=InnoDB")
				hasWords(t, ps[1], "table jobs_dead", "Aria", "not InnoDB", "ALTER TABLE jobs_dead ENGINE=InnoDB")
			})
		}
	}
}

// A LastError column that cannot hold MaxErrorText (2000) bytes is
// reported, in the queue table and in the dead table, naming the column,
// its length and the fix; text and a varchar of 2000 pass. Before: the
// check passed varchar(100), and each Retry with a longer error failed.
func TestCheckSchemaLastErrorLength(t *testing.T) {
	tb := inbox.Table{Name: "jobs", LockedUntil: "locked_until", DeadTable: "jobs_dead", LastError: "last_error"}
	t.Run("postgres", func(t *testing.T) {
		m := newMock(t)
		q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: tb})
		m.ExpectQuery(pgProbe).WithoutArgs().WillReturnRows(pgAnswer(pg15))
		m.ExpectQuery(pgColumns).WithArgs("", "jobs").WillReturnRows(rows("column_name,data_type", row("id", "bigint"), row("attempt", "integer"),
			row("payload", "bytea"), row("locked_until", "timestamp with time zone"), row("last_error", "character varying(100)")))
		m.ExpectQuery(pgColumns).WithArgs("", "jobs_dead").WillReturnRows(rows("column_name,data_type", row("id", "bigint"), row("attempt", "integer"),
			row("payload", "bytea"), row("last_error", "character varying(1999)")))
		ps := checkProblems(t, m, q)
		if len(ps) != 2 {
			t.Fatalf("%d problems, want 2: %q", len(ps), ps)
		}
		hasWords(t, ps[0], "column jobs.last_error (Table.LastError)", "character varying(100)", "holds 100 characters", "MaxErrorText (2000 bytes)",
			"ALTER TABLE jobs ALTER COLUMN last_error TYPE text")
		hasWords(t, ps[1], "column jobs_dead.last_error", "1999", "ALTER TABLE jobs_dead ALTER COLUMN last_error TYPE text")

		m = newMock(t)
		q = newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: tb})
		m.ExpectQuery(pgProbe).WithoutArgs().WillReturnRows(pgAnswer(pg15))
		m.ExpectQuery(pgColumns).WithArgs("", "jobs").WillReturnRows(rows("column_name,data_type", row("id", "bigint"), row("attempt", "integer"),
			row("payload", "bytea"), row("locked_until", "timestamp with time zone"), row("last_error", "text")))
		m.ExpectQuery(pgColumns).WithArgs("", "jobs_dead").WillReturnRows(rows("column_name,data_type", row("id", "bigint"), row("attempt", "integer"),
			row("payload", "bytea"), row("last_error", "character varying(2000)")))
		if err := q.CheckSchema(context.Background()); err != nil {
			t.Errorf("text and varchar(2000): CheckSchema = %v, want nil", err)
		}
		m.Met(t)
	})
	for _, d := range []inbox.Dialect{inbox.MySQL, inbox.MariaDB} {
		t.Run(d.Name(), func(t *testing.T) {
			for _, c := range []struct{ queue, dead string }{{"varchar(100)", "tinytext"}, {"text", "varchar(2000)"}} {
				m := newMock(t)
				q := newQueue(t, m, inbox.Config{Dialect: d, Table: tb})
				m.ExpectQuery(myProbe).WithoutArgs().WillReturnRows(myAnswer(mariadb1011, mariaComment))
				m.ExpectQuery(myColumns).WithArgs("", "jobs").WillReturnRows(rows("column_name,column_type", row("id", "bigint"), row("attempt", "int"),
					row("payload", "blob"), row("locked_until", "datetime(6)"), row("LAST_ERROR", c.queue)))
				m.ExpectQuery(myColumns).WithArgs("", "jobs_dead").WillReturnRows(rows("column_name,column_type", row("id", "bigint"), row("attempt", "int"),
					row("payload", "blob"), row("last_error", c.dead)))
				m.ExpectQuery(myFill).WithArgs("", "jobs", "id", "id").WillReturnRows(myAutoID())
				m.ExpectQuery(myEngine).WithArgs("", "jobs").WillReturnRows(rows("engine", row("InnoDB")))
				m.ExpectQuery(myEngine).WithArgs("", "jobs_dead").WillReturnRows(rows("engine", row("InnoDB")))
				expectIDPrimary(m, "")
				if c.queue == "text" {
					expectClocks(m, 4)
					if err := q.CheckSchema(context.Background()); err != nil {
						t.Errorf("text and varchar(2000): CheckSchema = %v, want nil", err)
					}
					m.Met(t)
					continue
				}
				ps := checkProblems(t, m, q)
				if len(ps) != 2 {
					t.Fatalf("%d problems, want 2: %q", len(ps), ps)
				}
				hasWords(t, ps[0], "column jobs.last_error (Table.LastError)", "varchar(100)", "holds 100 characters", "MaxErrorText (2000 bytes)",
					"ALTER TABLE jobs MODIFY last_error TEXT")
				hasWords(t, ps[1], "column jobs_dead.last_error", "tinytext", "holds 255", "ALTER TABLE jobs_dead MODIFY last_error TEXT")
			}
		})
	}
}

// expectClocks expects CheckSchema's reads of MySQL's clock on n
// connections of the pool, each answering this process's clock as it is
// now: the test runs within milliseconds, far under the margin.
func expectClocks(m *mock, n int) {
	for i := 0; i < n; i++ {
		m.ExpectQuery("SELECT UTC_TIMESTAMP(6)").WithoutArgs().WillReturnRows(rows("now", row(time.Now().UTC().Format("2006-01-02 15:04:05.000000"))))
	}
}
