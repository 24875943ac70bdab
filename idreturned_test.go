package inbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqlinbox/inbox"
)

// A job inserted without a Job.ID whose id the database does not report is
// an error wrapping ErrIDNotReturned, never id 0 or nil: on MySQL and
// MariaDB LastInsertId is 0 for an id a DEFAULT (uuid()) assigned, on
// SQLite RETURNING gives NULL for a TEXT primary key with no default.
// RequeueDead rolls back: the dead job stays, nothing is written back. An
// id among the data columns is the value given. Before: Enqueue and
// RequeueDead returned id 0 ("requeued as job 0", and the requeued job's
// last error written to job 0), EnqueueMany 0, 1, 2, …, and a job whose id
// was data id 0.
func TestIDNotReturned(t *testing.T) {
	ctx := context.Background()
	p := []byte("p")
	notReturned := func(t *testing.T, what string, id any, err error) {
		t.Helper()
		if !errors.Is(err, inbox.ErrIDNotReturned) || id != nil {
			t.Errorf("%s = %v, %v; want ErrIDNotReturned and no id", what, id, err)
		}
	}
	for _, d := range []inbox.Dialect{inbox.MySQL, inbox.MariaDB} {
		t.Run(d.Name(), func(t *testing.T) {
			m := newMock(t)
			q := newQueue(t, m, inbox.Config{Dialect: d, Table: deadDesc("lease")})
			st := q.Statements()
			m.ExpectExec(st.Jobs.Enqueue.SQL).WithArgs(p).WillReturnResult(sqlmock.NewResult(0, 1))
			id, err := q.Enqueue(ctx, m.DB, inbox.Job{Data: []any{p}})
			notReturned(t, "Enqueue", id, err)

			// No @@auto_increment_increment is read: there are no ids to step.
			m.ExpectExec("INSERT INTO `jobs` (`payload`) VALUES (?), (?)").WithArgs(p, p).WillReturnResult(sqlmock.NewResult(0, 2))
			ids, err := q.EnqueueMany(ctx, m.DB, []inbox.Job{{Data: []any{p}}, {Data: []any{p}}})
			if !errors.Is(err, inbox.ErrIDNotReturned) || ids != nil {
				t.Errorf("EnqueueMany = %v, %v; want ErrIDNotReturned and no ids", ids, err)
			}

			// Given ids are returned as given, LastInsertId unread.
			m.ExpectQuery(st.Dead.Has.SQL).WithArgs("a").WillReturnRows(rows("1"))
			m.ExpectExec(st.Jobs.EnqueueID.SQL).WithArgs("a", p).WillReturnResult(sqlmock.NewResult(0, 1))
			if id, err := q.Enqueue(ctx, m.DB, inbox.Job{ID: "a", Data: []any{p}}); err != nil || id != "a" {
				t.Errorf("Enqueue with an id = %v, %v; want a", id, err)
			}

			// The id among the data columns: the value given is the id.
			qd := newQueue(t, m, inbox.Config{Dialect: d, Table: inbox.Table{Name: "jobs", LockedUntil: "locked_until", Data: []string{"id"}}})
			m.ExpectExec(qd.Statements().Jobs.Enqueue.SQL).WithArgs(int64(42)).WillReturnResult(sqlmock.NewResult(0, 1))
			if id, err := qd.Enqueue(ctx, m.DB, inbox.Job{Data: []any{int64(42)}}); err != nil || id != int64(42) {
				t.Errorf("Enqueue of id 42 as data = %v, %v; want 42", id, err)
			}
			m.ExpectExec("INSERT INTO `jobs` (`id`) VALUES (?), (?)").WithArgs(int64(42), int64(44)).WillReturnResult(sqlmock.NewResult(0, 2))
			if ids, err := qd.EnqueueMany(ctx, m.DB, []inbox.Job{{Data: []any{int64(42)}}, {Data: []any{int64(44)}}}); err != nil ||
				len(ids) != 2 || ids[0] != int64(42) || ids[1] != int64(44) {
				t.Errorf("EnqueueMany of ids 42 and 44 as data = %v, %v; want [42 44]", ids, err)
			}

			m.ExpectBegin()
			m.ExpectQuery(st.Dead.Take.SQL).WithArgs("a").WillReturnRows(rows("id,payload,last_error", row("a", p, "boom")))
			m.ExpectExec(st.Dead.TakeDelete.SQL).WithArgs("a").WillReturnResult(affected(1))
			m.ExpectExec(st.Jobs.Enqueue.SQL).WithArgs(p).WillReturnResult(sqlmock.NewResult(0, 1))
			m.ExpectRollback()
			id, err = q.RequeueDead(ctx, "a")
			notReturned(t, "RequeueDead", id, err)
			m.Met(t)
		})
	}
	t.Run("sqlite", func(t *testing.T) {
		m := newMock(t)
		q := newQueue(t, m, inbox.Config{Dialect: inbox.SQLite, Table: deadDesc("lease")})
		st := q.Statements()
		m.ExpectQuery(st.Jobs.Enqueue.SQL).WithArgs(p).WillReturnRows(rows("id", row(nil)))
		id, err := q.Enqueue(ctx, m.DB, inbox.Job{Data: []any{p}})
		notReturned(t, "Enqueue", id, err)
		m.ExpectQuery("INSERT INTO `jobs` (`payload`) VALUES (?), (?) RETURNING `id`").WithArgs(p, p).
			WillReturnRows(rows("id", row("x"), row(nil)))
		ids, err := q.EnqueueMany(ctx, m.DB, []inbox.Job{{Data: []any{p}}, {Data: []any{p}}})
		if !errors.Is(err, inbox.ErrIDNotReturned) || ids != nil {
			t.Errorf("EnqueueMany = %v, %v; want ErrIDNotReturned and no ids", ids, err)
		}
		m.Met(t)
	})
}

// myFilledRows answers myFill: column_name, column_default (nil: none),
// extra, generation_expression.
func myFilledRows(vals ...[]any) *sqlmock.Rows {
	r := sqlmock.NewRows([]string{"column_name", "column_default", "extra", "generation_expression"})
	for _, v := range vals {
		r.AddRow(v[0], v[1], v[2], v[3])
	}
	return r
}

// On MySQL and MariaDB the schema check refuses an id the server assigns
// other than by AUTO_INCREMENT (a default, a generated column), naming the
// fix; an AUTO_INCREMENT id and a text id without a default (every Job
// given its ID) pass. Before: the check passed DEFAULT (uuid()), and every
// Enqueue returned id 0.
func TestCheckSchemaServerAssignedID(t *testing.T) {
	tb := inbox.Table{Name: "jobs", LockedUntil: "locked_until"}
	for _, tc := range []struct {
		name string
		fill []any
		want []string
	}{
		{"uuid default", []any{"id", "uuid()", "", ""}, []string{"column jobs.id (Table.ID)", "DEFAULT uuid()", "not by AUTO_INCREMENT",
			"LastInsertId is 0", "AUTO_INCREMENT integer key", "give every Job an ID"}},
		{"mysql expression default", []any{"id", "uuid()", "DEFAULT_GENERATED", ""}, []string{"DEFAULT uuid()", "AUTO_INCREMENT integer key"}},
		{"generated", []any{"id", nil, "STORED GENERATED", "concat(`a`,`b`)"}, []string{"generated column (concat(`a`,`b`))", "give every Job an ID"}},
		{"auto_increment", []any{"id", nil, "auto_increment", ""}, nil},
		{"text without default", []any{"id", nil, "", ""}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMock(t)
			q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: tb})
			m.ExpectQuery(myProbe).WithoutArgs().WillReturnRows(myAnswer(mariadb1011, mariaComment))
			m.ExpectQuery(myColumns).WithArgs("", "jobs").WillReturnRows(rows("column_name,column_type", row("id", "varchar(36)"),
				row("attempt", "int"), row("payload", "blob"), row("locked_until", "datetime(6)")))
			m.ExpectQuery(myFill).WithArgs("", "jobs", "id", "id").WillReturnRows(myFilledRows(tc.fill))
			m.ExpectQuery(myEngine).WithArgs("", "jobs").WillReturnRows(rows("engine", row("InnoDB")))
			expectIDPrimary(m, "")
			if tc.want == nil {
				expectClocks(m, 4)
				if err := q.CheckSchema(context.Background()); err != nil {
					t.Errorf("CheckSchema = %v, want nil", err)
				}
				m.Met(t)
				return
			}
			ps := checkProblems(t, m, q)
			if len(ps) != 1 {
				t.Fatalf("%d problems, want 1: %q", len(ps), ps)
			}
			hasWords(t, ps[0], tc.want...)
		})
	}
}

// An advisory key on a column other than the id that Enqueue does not
// write (not in Table.Data) is refused unless the database fills it (a
// default, an identity or a generated column), on every engine, naming the
// fix; one listed in Data is not asked about. New cannot tell (a default
// may fill it), so it accepts the description. Before: the check passed,
// and the first Enqueue failed with MariaDB's error 1364.
func TestCheckSchemaKeyNotWritten(t *testing.T) {
	keyed := inbox.Table{Name: "jobs", AdvisoryKey: "customer"}
	want := []string{"column jobs.customer (Table.AdvisoryKey)", `not in Table.Data ["payload"]`, "has no default", "list it in Table.Data"}
	t.Run("postgres", func(t *testing.T) {
		for _, filled := range []bool{false, true} {
			m := newMock(t)
			q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: keyed})
			m.ExpectQuery(pgProbe).WithoutArgs().WillReturnRows(pgAnswer(pg15))
			m.ExpectQuery(pgColumns).WithArgs("", "jobs").WillReturnRows(rows("column_name,data_type", row("id", "bigint"),
				row("attempt", "integer"), row("payload", "bytea"), row("customer", "text")))
			m.ExpectQuery(pgKeyFilled).WithArgs("", "jobs", "customer").WillReturnRows(rows("filled", row(filled)))
			if filled {
				// Sessions are asked about only once the rest is fit.
				expectOwnSessions(m, pg15)
			}
			checkKeyProblem(t, m, q, filled, want)
		}
	})
	t.Run("mysql", func(t *testing.T) {
		for _, dflt := range []any{nil, "NULL", "'acme'"} {
			m := newMock(t)
			q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: keyed})
			m.ExpectQuery(myProbe).WithoutArgs().WillReturnRows(myAnswer(mariadb1011, mariaComment))
			m.ExpectQuery(myWsrep).WithoutArgs().WillReturnRows(rows("Variable_name,Value", row("wsrep_on", "OFF")))
			m.ExpectQuery(myColumns).WithArgs("", "jobs").WillReturnRows(rows("column_name,column_type", row("id", "bigint"),
				row("attempt", "int"), row("payload", "blob"), row("customer", "varchar(64)")))
			// MariaDB's bare NULL is a nullable column's missing default.
			m.ExpectQuery(myFill).WithArgs("", "jobs", "id", "customer").WillReturnRows(myFilledRows(
				[]any{"id", nil, "auto_increment", ""}, []any{"customer", dflt, "", ""}))
			m.ExpectQuery(myEngine).WithArgs("", "jobs").WillReturnRows(rows("engine", row("InnoDB")))
			checkKeyProblem(t, m, q, dflt == "'acme'", want)
		}
	})
	t.Run("sqlite", func(t *testing.T) {
		for _, filled := range []bool{false, true} {
			m := newMock(t)
			q := newQueue(t, m, inbox.Config{Dialect: inbox.SQLite, Table: keyed})
			m.ExpectQuery(sqliteProbe).WithoutArgs().WillReturnRows(rows("v", row("3.46.1")))
			m.ExpectQuery("SELECT name, type FROM pragma_table_xinfo(?)").WithArgs("jobs").WillReturnRows(rows("name,type",
				row("id", "INTEGER"), row("attempt", "INTEGER"), row("payload", "BLOB"), row("customer", "TEXT")))
			m.ExpectQuery("SELECT type, pk, (SELECT COUNT(*) FROM pragma_table_info(?, ?) WHERE pk > 0) FROM pragma_table_info(?, ?) WHERE name = ? COLLATE NOCASE").
				WithArgs("jobs", "main", "jobs", "main", "id").WillReturnRows(rows("type,pk,pks", row("TEXT", int64(1), int64(1))))
			m.ExpectQuery("SELECT dflt_value IS NOT NULL OR hidden IN (2, 3) FROM pragma_table_xinfo(?, ?) WHERE name = ? COLLATE NOCASE").
				WithArgs("jobs", "main", "customer").WillReturnRows(rows("filled", row(filled)))
			checkKeyProblem(t, m, q, filled, want)
		}
	})
	// Listed in Data, or the id itself: Enqueue writes it, nothing is asked.
	for _, tb := range []inbox.Table{
		{Name: "jobs", AdvisoryKey: "customer", Data: []string{"payload", "customer"}},
		{Name: "jobs", AdvisoryKey: "id"},
	} {
		m := newMock(t)
		q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: tb})
		m.ExpectQuery(pgProbe).WithoutArgs().WillReturnRows(pgAnswer(pg15))
		m.ExpectQuery(pgColumns).WithArgs("", "jobs").WillReturnRows(rows("column_name,data_type", row("id", "bigint"),
			row("attempt", "integer"), row("payload", "bytea"), row("customer", "text")))
		expectOwnSessions(m, pg15)
		if err := q.CheckSchema(context.Background()); err != nil {
			t.Errorf("%+v: CheckSchema = %v, want nil", tb, err)
		}
		m.Met(t)
	}
}

// checkKeyProblem runs the check: one problem naming want unless filled.
func checkKeyProblem(t *testing.T, m *mock, q *inbox.Queue, filled bool, want []string) {
	t.Helper()
	if filled {
		if err := q.CheckSchema(context.Background()); err != nil {
			t.Errorf("a key the database fills: CheckSchema = %v, want nil", err)
		}
		m.Met(t)
		return
	}
	ps := checkProblems(t, m, q)
	if len(ps) != 1 {
		t.Fatalf("%d problems, want 1: %q", len(ps), ps)
	}
	hasWords(t, ps[0], want...)
	if strings.Contains(ps[0], "Table.ID") {
		t.Errorf("problem %q names the id", ps[0])
	}
}
