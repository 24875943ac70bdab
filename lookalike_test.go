package inbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqlinbox/inbox"
)

// The schema check's statements, pinned for every dialect.
const (
	// serverProbe is the first statement of the server dialects: version()
	// and what only each look-alike has.
	serverProbe = "SELECT version(), " +
		"(SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = 'crdb_internal'), " +
		"(SELECT COUNT(*) FROM information_schema.routines WHERE routine_name = 'yb_servers'), " +
		"(SELECT COUNT(*) FROM information_schema.tables WHERE UPPER(table_schema) = 'INFORMATION_SCHEMA' AND UPPER(table_name) = 'TIDB_SERVERS_INFO'), " +
		"(SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = '_vt')"
	sqliteProbe = "SELECT sqlite_version()"
	pgColumns   = "SELECT column_name, COALESCE(data_type || '(' || CAST(character_maximum_length AS text) || ')', data_type) FROM information_schema.columns " +
		"WHERE table_schema = COALESCE(NULLIF($1, ''), current_schema()) AND table_name = $2"
	myWsrep   = "SHOW GLOBAL VARIABLES LIKE 'wsrep_on'"
	myColumns = "SELECT column_name, column_type FROM information_schema.columns WHERE table_schema = COALESCE(NULLIF(?, ''), DATABASE()) AND table_name = ?"
	myEngine  = "SELECT COALESCE(engine, '') FROM information_schema.tables WHERE table_schema = COALESCE(NULLIF(?, ''), DATABASE()) AND table_name = ?"
)

// probeAnswer is what serverProbe returns: version() and the counts of
// crdb_internal, yb_servers, TIDB_SERVERS_INFO and _vt.
func probeAnswer(version string, crdb, yb, tidb, vitess int64) *sqlmock.Rows {
	return rows("version,crdb,yb,tidb,vt", row(version, crdb, yb, tidb, vitess))
}

// What each engine answers serverProbe, from its documentation:
//   - PostgreSQL 15 as Debian builds it: version() as this machine's server
//     gives it; none of the look-alikes' objects.
//   - CockroachDB: version() "CockroachDB CCL v23.1.11 (…)"; SHOW SCHEMAS
//     lists crdb_internal in every database (cockroachlabs.com/docs/stable/
//     system-catalogs); information_schema.routines exists and is empty of
//     built-ins (cockroachdb/cockroach#104083).
//   - YugabyteDB: version() "PostgreSQL 11.2-YB-2.18.0.0-b0 …" (the
//     "11.2-YB-2.2.0.0-b0" form quoted in yugabyte/yugabyte-db#5154; v2.25
//     moved to PostgreSQL 15); yb_servers() is a function of YSQL
//     (docs.yugabyte.com/stable/api/ysql/exprs/func_yb_servers).
//   - TiDB: VERSION() "5.7.25-TiDB-v6.5.0" on v6.5, "8.0.11-TiDB-v7.5.7" on
//     v7.5 (the VERSION column of docs.pingcap.com/tidb/v6.5 and v7.5
//     information-schema-tidb-servers-info), any text with server-version
//     set; information_schema.TIDB_SERVERS_INFO exists from v4.
//   - Vitess: "5.7.9-vitess-11.0.0-SNAPSHOT" from v10 to v15
//     (vitessio/vitess#7882, #7337), "8.0.30-Vitess" from v16 (its 16.0.0
//     release notes, "VTGate Advertised MySQL Version"), any text with
//     --mysql_server_version; vttablet's sidecar database _vt
//     (go/vt/sidecardb).
//   - MariaDB 10.11 as Debian builds it: this machine's server.
const (
	pg15        = "PostgreSQL 15.20 (Debian 15.20-0+deb12u1) on x86_64-pc-linux-gnu, compiled by gcc (Debian 12.2.0-14+deb12u1) 12.2.0, 64-bit"
	cockroach   = "CockroachDB CCL v23.1.11 (x86_64-pc-linux-gnu, built 2023/09/27 01:53:43, go1.19.10)"
	yugabyte218 = "PostgreSQL 11.2-YB-2.18.0.0-b0 on x86_64-pc-linux-gnu, compiled by clang version 15.0.3, 64-bit"
	yugabyte225 = "PostgreSQL 15.2-YB-2.25.1.0-b0 on x86_64-pc-linux-gnu, compiled by clang version 17.0.6, 64-bit"
	tidb65      = "5.7.25-TiDB-v6.5.0"
	tidb75      = "8.0.11-TiDB-v7.5.7"
	vitess11    = "5.7.9-vitess-11.0.0-SNAPSHOT"
	vitess16    = "8.0.30-Vitess"
	mariadb1011 = "10.11.19-MariaDB-0+deb12u1"
	overridden  = "8.0.36" // a look-alike's version string set to MySQL's
)

// Engines that speak PostgreSQL's or MySQL's protocol without its semantics:
// CheckSchema tells each by what it answers in its first statement, the
// version string a second signal, and refuses a form it cannot hold for the
// reason that applies, naming the engine, the form and what to use instead;
// the forms it can hold pass. Before: TiDB and Vitess with their version
// strings set to MySQL's passed every form; TiDB 6.5's and Vitess 10–15's
// own strings ("5.7…") had the advisory form refused as "older than 8.0,
// which brought SKIP LOCKED", which the advisory form does not use.
func TestCheckSchemaLookalikes(t *testing.T) {
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
	type marks struct{ crdb, yb, tidb, vt int64 }
	for _, tc := range []struct {
		engine  string
		dialect inbox.Dialect
		version string
		marks   marks
		galera  bool // a MySQL or MariaDB server only
		form    inbox.Form
		want    []string // words the one problem names; none for a form that passes
	}{
		{"cockroach", inbox.Postgres, cockroach, marks{crdb: 1}, false, inbox.Advisory, []string{"CockroachDB", "advisory", "#13546", "lease form"}},
		{"cockroach", inbox.Postgres, cockroach, marks{crdb: 1}, false, inbox.RowLock, []string{"CockroachDB", "row-lock form", "lease form"}},
		{"cockroach", inbox.Postgres, cockroach, marks{crdb: 1}, false, inbox.Lease, nil},
		{"postgres", inbox.Postgres, pg15, marks{}, false, inbox.Advisory, nil},
		{"yugabyte-2.18", inbox.Postgres, yugabyte218, marks{yb: 1}, false, inbox.Lease, []string{"YugabyteDB", "PostgreSQL 11", "MATERIALIZED"}},
		{"yugabyte-2.25", inbox.Postgres, yugabyte225, marks{yb: 1}, false, inbox.Lease, nil},
		{"yugabyte-2.25", inbox.Postgres, yugabyte225, marks{yb: 1}, false, inbox.Advisory, nil},
		{"tidb-7.5", inbox.MySQL, tidb75, marks{tidb: 1}, false, inbox.Lease, []string{"TiDB", "SKIP LOCKED", "lease form", "advisory form"}},
		{"tidb-7.5", inbox.MySQL, tidb75, marks{tidb: 1}, false, inbox.RowLock, []string{"TiDB", "row lock form", "advisory form"}},
		{"tidb-7.5", inbox.MySQL, tidb75, marks{tidb: 1}, false, inbox.Advisory, nil},
		{"tidb-6.5", inbox.MySQL, tidb65, marks{tidb: 1}, false, inbox.Advisory, nil},
		{"tidb-6.5", inbox.MySQL, tidb65, marks{tidb: 1}, false, inbox.Lease, []string{"TiDB", "SKIP LOCKED", "advisory form"}},
		{"tidb-overridden", inbox.MySQL, overridden, marks{tidb: 1}, false, inbox.Lease, []string{"TiDB", "TIDB_SERVERS_INFO", "advisory form"}},
		{"tidb-overridden", inbox.MySQL, overridden, marks{tidb: 1}, false, inbox.Advisory, nil},
		{"vitess-16", inbox.MySQL, vitess16, marks{vt: 1}, false, inbox.Lease, []string{"Vitess", "SKIP LOCKED", "advisory form"}},
		{"vitess-16", inbox.MySQL, vitess16, marks{vt: 1}, false, inbox.RowLock, []string{"Vitess", "row lock form", "advisory form"}},
		{"vitess-16", inbox.MySQL, vitess16, marks{vt: 1}, false, inbox.Advisory, nil},
		{"vitess-11", inbox.MySQL, vitess11, marks{vt: 1}, false, inbox.Advisory, nil},
		{"vitess-11", inbox.MySQL, vitess11, marks{vt: 1}, false, inbox.RowLock, []string{"Vitess", "row lock form", "advisory form"}},
		{"vitess-overridden", inbox.MySQL, overridden, marks{vt: 1}, false, inbox.RowLock, []string{"Vitess", "_vt", "advisory form"}},
		// A sidecar database hidden from the user: the version string.
		{"vitess-16-no-sidecar", inbox.MySQL, vitess16, marks{}, false, inbox.Lease, []string{"Vitess", "version string", "advisory form"}},
		{"galera", inbox.MySQL, mariadb1011, marks{}, true, inbox.Advisory, []string{"Galera", "GET_LOCK", "lease form"}},
		{"galera", inbox.MySQL, mariadb1011, marks{}, true, inbox.RowLock, []string{"Galera", "row-lock form", "1213", "lease form"}},
		{"galera", inbox.MySQL, mariadb1011, marks{}, true, inbox.Lease, nil},
		{"mariadb", inbox.MySQL, mariadb1011, marks{}, false, inbox.Advisory, nil},
		{"mysql-5.7", inbox.MySQL, "5.7.44", marks{}, false, inbox.Advisory, nil},
		{"mysql-5.7", inbox.MySQL, "5.7.44", marks{}, false, inbox.Lease, []string{"MySQL 5.7.44", "older than 8.0", "SKIP LOCKED", "lease form"}},
	} {
		t.Run(tc.engine+"/"+tc.form.String(), func(t *testing.T) {
			m := newMock(t)
			q := newQueue(t, m, inbox.Config{Dialect: tc.dialect, Table: tables[tc.form]})
			mk := tc.marks
			m.ExpectQuery(serverProbe).WithoutArgs().WillReturnRows(probeAnswer(tc.version, mk.crdb, mk.yb, mk.tidb, mk.vt))
			if tc.dialect == inbox.Postgres {
				m.ExpectQuery(pgColumns).WithArgs("", "jobs").WillReturnRows(pgCols(tc.form))
			} else {
				// Galera is a MySQL or MariaDB server's; TiDB and Vitess
				// are not asked.
				v := strings.ToLower(tc.version)
				lookalike := mk.tidb+mk.vt > 0 || strings.Contains(v, "tidb") || strings.Contains(v, "vitess")
				if tc.form != inbox.Lease && !lookalike {
					wsrep := rows("Variable_name,Value")
					if tc.galera {
						wsrep.AddRow("wsrep_on", "ON")
					}
					m.ExpectQuery(myWsrep).WithoutArgs().WillReturnRows(wsrep)
				}
				m.ExpectQuery(myColumns).WithArgs("", "jobs").WillReturnRows(myCols(tc.form))
				m.ExpectQuery(myEngine).WithArgs("", "jobs").WillReturnRows(rows("engine", row("InnoDB")))
			}
			err := q.CheckSchema(context.Background())
			m.Met(t)
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
