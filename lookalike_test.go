package inbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqlinbox/inbox"
)

// Engines that speak PostgreSQL's or MySQL's protocol without its semantics:
// CheckSchema reads what the server is and refuses a form it cannot hold,
// naming the engine, the form and what to use instead; the forms it can
// hold pass.
func TestCheckSchemaLookalikes(t *testing.T) {
	const (
		pgVersion = "SELECT current_setting('server_version_num')::int, version()"
		pgColumns = "SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = COALESCE(NULLIF($1, ''), current_schema()) AND table_name = $2"
		myVersion = "SELECT VERSION()"
		myWsrep   = "SHOW GLOBAL VARIABLES LIKE 'wsrep_on'"
		myColumns = "SELECT column_name, column_type FROM information_schema.columns WHERE table_schema = COALESCE(NULLIF(?, ''), DATABASE()) AND table_name = ?"
	)
	tables := map[inbox.Form]inbox.Table{
		inbox.Lease:    {Name: "jobs", LockedUntil: "locked_until"},
		inbox.RowLock:  {Name: "jobs"},
		inbox.Advisory: {Name: "jobs", AdvisoryKey: "id"},
	}
	pgCols := func(f inbox.Form) *sqlmock.Rows {
		r := rows("column_name,data_type", row("id", "bigint"), row("attempt", "integer"), row("payload", "bytea"))
		if f == inbox.Lease {
			r.AddRow("locked_until", "timestamp with time zone")
		}
		return r
	}
	myCols := func(f inbox.Form) *sqlmock.Rows {
		r := rows("column_name,column_type", row("id", "bigint"), row("attempt", "int"), row("payload", "blob"))
		if f == inbox.Lease {
			r.AddRow("locked_until", "datetime(6)")
		}
		return r
	}
	const (
		cockroach = "CockroachDB CCL v23.1.11 (x86_64-pc-linux-gnu, built 2023/09/27 01:53:43, go1.19.10)"
		postgres  = "PostgreSQL 15.20 (Debian 15.20-0+deb12u1) on x86_64-pc-linux-gnu"
		tidb      = "8.0.11-TiDB-v7.5.0"
		vitess    = "8.0.30-Vitess"
		mariadb   = "10.11.19-MariaDB-0+deb12u1"
	)
	for _, tc := range []struct {
		engine  string
		dialect inbox.Dialect
		version string
		galera  bool
		form    inbox.Form
		want    []string // words the one problem names; none for a form that passes
	}{
		{"cockroach", inbox.Postgres, cockroach, false, inbox.Advisory, []string{"CockroachDB", "advisory", "#13546", "lease form"}},
		{"cockroach", inbox.Postgres, cockroach, false, inbox.RowLock, []string{"CockroachDB", "row-lock form", "lease form"}},
		{"cockroach", inbox.Postgres, cockroach, false, inbox.Lease, nil},
		{"postgres", inbox.Postgres, postgres, false, inbox.Advisory, nil},
		{"tidb", inbox.MySQL, tidb, false, inbox.Lease, []string{"TiDB", "SKIP LOCKED", "lease form", "advisory form"}},
		{"tidb", inbox.MySQL, tidb, false, inbox.RowLock, []string{"TiDB", "row lock form", "advisory form"}},
		{"tidb", inbox.MySQL, tidb, false, inbox.Advisory, nil},
		{"vitess", inbox.MySQL, vitess, false, inbox.Lease, []string{"Vitess", "SKIP LOCKED", "advisory form"}},
		{"vitess", inbox.MySQL, vitess, false, inbox.RowLock, []string{"Vitess", "row lock form", "advisory form"}},
		{"vitess", inbox.MySQL, vitess, false, inbox.Advisory, nil},
		{"galera", inbox.MySQL, mariadb, true, inbox.Advisory, []string{"Galera", "GET_LOCK", "lease form"}},
		{"galera", inbox.MySQL, mariadb, true, inbox.RowLock, []string{"Galera", "row-lock form", "1213", "lease form"}},
		{"galera", inbox.MySQL, mariadb, true, inbox.Lease, nil},
		{"mariadb", inbox.MySQL, mariadb, false, inbox.Advisory, nil},
	} {
		t.Run(tc.engine+"/"+tc.form.String(), func(t *testing.T) {
			m := newMock(t)
			q := newQueue(t, m, inbox.Config{Dialect: tc.dialect, Table: tables[tc.form]})
			if tc.dialect == inbox.Postgres {
				m.ExpectQuery(pgVersion).WithoutArgs().WillReturnRows(rows("num,version", row(int64(130000), tc.version)))
				m.ExpectQuery(pgColumns).WithArgs("", "jobs").WillReturnRows(pgCols(tc.form))
			} else {
				m.ExpectQuery(myVersion).WithoutArgs().WillReturnRows(rows("version", row(tc.version)))
				if tc.form != inbox.Lease {
					wsrep := rows("Variable_name,Value")
					if tc.galera {
						wsrep.AddRow("wsrep_on", "ON")
					}
					m.ExpectQuery(myWsrep).WithoutArgs().WillReturnRows(wsrep)
				}
				m.ExpectQuery(myColumns).WithArgs("", "jobs").WillReturnRows(myCols(tc.form))
			}
			err := q.CheckSchema(context.Background())
			m.met(t)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("CheckSchema = %v, want nil: the %s form holds on %s", err, tc.form, tc.engine)
				}
				return
			}
			var se *inbox.SchemaError
			if !errors.As(err, &se) || len(se.Problems) != 1 {
				t.Fatalf("CheckSchema = %v, want one problem", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(se.Problems[0], w) {
					t.Errorf("problem %q does not name %q", se.Problems[0], w)
				}
			}
		})
	}
}
