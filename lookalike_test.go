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
	// pgProbe and myProbe are the first statements of the server dialects,
	// their own family's first: what no user creates or sets.
	pgProbe     = "SELECT pg_catalog.version()"
	myProbe     = "SELECT version(), @@version_comment"
	sqliteProbe = "SELECT sqlite_version()"
	pgColumns   = "SELECT column_name, COALESCE(data_type || '(' || CAST(character_maximum_length AS text) || ')', data_type) FROM information_schema.columns " +
		"WHERE table_schema = COALESCE(NULLIF($1, ''), current_schema()) AND table_name = $2"
	pgKeyFilled = "SELECT column_default IS NOT NULL OR is_identity = 'YES' OR is_generated = 'ALWAYS' FROM information_schema.columns " +
		"WHERE table_schema = COALESCE(NULLIF($1, ''), current_schema()) AND table_name = $2 AND column_name = $3"
	myWsrep   = "SHOW GLOBAL VARIABLES LIKE 'wsrep_on'"
	myColumns = "SELECT column_name, column_type FROM information_schema.columns WHERE table_schema = COALESCE(NULLIF(?, ''), DATABASE()) AND table_name = ?"
	myFill    = "SELECT column_name, column_default, extra, COALESCE(generation_expression, '') FROM information_schema.columns " +
		"WHERE table_schema = COALESCE(NULLIF(?, ''), DATABASE()) AND table_name = ? AND column_name IN (?, ?)"
	myEngine = "SELECT COALESCE(engine, '') FROM information_schema.tables WHERE table_schema = COALESCE(NULLIF(?, ''), DATABASE()) AND table_name = ?"
	// Whether a lease table's primary key is its id alone (a claim of
	// several walks it).
	myIDPrimary = "SELECT COUNT(*) FROM information_schema.statistics s WHERE s.table_schema = COALESCE(NULLIF(?, ''), DATABASE()) " +
		"AND s.table_name = ? AND s.index_name = 'PRIMARY' AND s.seq_in_index = 1 AND s.column_name = ? AND NOT EXISTS (SELECT 1 " +
		"FROM information_schema.statistics o WHERE o.table_schema = s.table_schema AND o.table_name = s.table_name " +
		"AND o.index_name = 'PRIMARY' AND o.seq_in_index = 2)"
)

// pgAnswer is what pgProbe returns; myAnswer what myProbe returns.
func pgAnswer(version string) *sqlmock.Rows { return rows("version", row(version)) }

func myAnswer(version, comment string) *sqlmock.Rows {
	return rows("version,version_comment", row(version, comment))
}

// myAutoID is myFill's answer for an AUTO_INCREMENT id: column_name,
// column_default, extra, generation_expression.
func myAutoID() *sqlmock.Rows {
	return rows("column_name,column_default,extra,generation_expression", row("id", nil, "auto_increment", ""))
}

// What each engine answers its family's probe, from its documentation:
//   - PostgreSQL 15 as Debian builds it: pg_catalog.version() as this
//     machine's server gives it.
//   - CockroachDB: version() "CockroachDB CCL v23.1.11 (…)", its build
//     (crdb_version, which SET cannot change, holds the same); its
//     built-ins are pg_catalog's (cockroach pkg/sql/information_schema.go
//     lists them there), and SQLAlchemy's PostgreSQL dialect, which
//     sqlalchemy-cockroachdb builds on, reads the version with
//     "select pg_catalog.version()".
//   - YugabyteDB: version() "PostgreSQL 11.2-YB-2.18.0.0-b0 …" (the
//     "11.2-YB-2.2.0.0-b0" form quoted in yugabyte/yugabyte-db#5154; v2.25
//     moved to PostgreSQL 15), PostgreSQL's PG_VERSION_STR as built.
//   - TiDB: VERSION() "5.7.25-TiDB-v6.5.0" on v6.5, "8.0.11-TiDB-v7.5.7" on
//     v7.5 (the VERSION column of docs.pingcap.com/tidb/v6.5 and v7.5
//     information-schema-tidb-servers-info), any text with server-version
//     set; version_comment "TiDB Server (Apache License 2.0) Community
//     Edition, MySQL 8.0 compatible", a ScopeNone variable (pingcap/tidb
//     sessionctx/variable/sysvar.go).
//   - Vitess: "5.7.9-vitess-11.0.0-SNAPSHOT" from v10 to v15
//     (vitessio/vitess#7882, #7337), "8.0.30-Vitess" from v16 (its 16.0.0
//     release notes, "VTGate Advertised MySQL Version"), any text with
//     --mysql_server_version; vtgate answers version_comment itself with
//     servenv.AppVersion.String(), "Version: 16.0.0 (Git revision … branch
//     '…') built on … by …@… using go… linux/amd64" (go/vt/sysvars lists it
//     read-only; vtgate binds it to that text, not to the tablet's).
//   - MariaDB 10.11 as Debian builds it: this machine's server.
const (
	pg15          = "PostgreSQL 15.20 (Debian 15.20-0+deb12u1) on x86_64-pc-linux-gnu, compiled by gcc (Debian 12.2.0-14+deb12u1) 12.2.0, 64-bit"
	cockroach     = "CockroachDB CCL v23.1.11 (x86_64-pc-linux-gnu, built 2023/09/27 01:53:43, go1.19.10)"
	yugabyte218   = "PostgreSQL 11.2-YB-2.18.0.0-b0 on x86_64-pc-linux-gnu, compiled by clang version 15.0.3, 64-bit"
	yugabyte225   = "PostgreSQL 15.2-YB-2.25.1.0-b0 on x86_64-pc-linux-gnu, compiled by clang version 17.0.6, 64-bit"
	tidb65        = "5.7.25-TiDB-v6.5.0"
	tidb75        = "8.0.11-TiDB-v7.5.7"
	tidbComment   = "TiDB Server (Apache License 2.0) Community Edition, MySQL 8.0 compatible"
	vitess11      = "5.7.9-vitess-11.0.0-SNAPSHOT"
	vitess16      = "8.0.30-Vitess"
	vitessComment = "Version: 16.0.0 (Git revision 0f1c1ac4 branch 'HEAD') built on Tue Feb 28 13:09:36 UTC 2023 by vitess@buildkitsandbox using go1.20.1 linux/amd64"
	mariadb1011   = "10.11.19-MariaDB-0+deb12u1"
	mariaComment  = "Debian 12"
	mysqlComment  = "MySQL Community Server - GPL"
	overridden    = "8.0.36" // a look-alike's version string set to MySQL's
)

// Engines that speak PostgreSQL's or MySQL's protocol without its semantics:
// CheckSchema tells each by what it answers in its first statement, what no
// user can create or set, the version string a second signal, and refuses a
// form it cannot hold for the reason that applies, naming the engine, the
// form and what to use instead; the forms it can hold pass. Before: TiDB
// and Vitess with their version strings set to MySQL's passed every form;
// TiDB 6.5's and Vitess 10–15's own strings ("5.7…") had the advisory form
// refused as "older than 8.0, which brought SKIP LOCKED", which the
// advisory form does not use; and what told the look-alikes apart were
// names any user can create (a schema crdb_internal, a database _vt, a
// function yb_servers), which had PostgreSQL and MariaDB refused as
// CockroachDB, Vitess or YugabyteDB (dbtest's TestSchemaLookalikeNames).
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
	for _, tc := range []struct {
		engine  string
		dialect inbox.Dialect
		version string
		comment string // MySQL's family: version_comment
		galera  bool   // a MySQL or MariaDB server only
		form    inbox.Form
		want    []string // words the one problem names; none for a form that passes
	}{
		{"cockroach", inbox.Postgres, cockroach, "", false, inbox.Advisory, []string{"CockroachDB", "advisory", "#13546", "lease form"}},
		{"cockroach", inbox.Postgres, cockroach, "", false, inbox.RowLock, []string{"CockroachDB", "row-lock form", "lease form"}},
		{"cockroach", inbox.Postgres, cockroach, "", false, inbox.Lease, nil},
		{"postgres", inbox.Postgres, pg15, "", false, inbox.Advisory, nil},
		{"postgres", inbox.Postgres, pg15, "", false, inbox.RowLock, nil},
		{"yugabyte-2.18", inbox.Postgres, yugabyte218, "", false, inbox.Lease, []string{"YugabyteDB", "PostgreSQL 11", "MATERIALIZED"}},
		{"yugabyte-2.25", inbox.Postgres, yugabyte225, "", false, inbox.Lease, nil},
		{"yugabyte-2.25", inbox.Postgres, yugabyte225, "", false, inbox.Advisory, nil},
		{"tidb-7.5", inbox.MySQL, tidb75, tidbComment, false, inbox.Lease, []string{"TiDB", "SKIP LOCKED", "lease form", "advisory form"}},
		{"tidb-7.5", inbox.MySQL, tidb75, tidbComment, false, inbox.RowLock, []string{"TiDB", "row lock form", "advisory form"}},
		{"tidb-7.5", inbox.MySQL, tidb75, tidbComment, false, inbox.Advisory, nil},
		{"tidb-6.5", inbox.MySQL, tidb65, tidbComment, false, inbox.Advisory, nil},
		{"tidb-6.5", inbox.MySQL, tidb65, tidbComment, false, inbox.Lease, []string{"TiDB", "SKIP LOCKED", "advisory form"}},
		{"tidb-overridden", inbox.MySQL, overridden, tidbComment, false, inbox.Lease, []string{"TiDB", "version_comment", "advisory form"}},
		{"tidb-overridden", inbox.MySQL, overridden, tidbComment, false, inbox.Advisory, nil},
		{"vitess-16", inbox.MySQL, vitess16, vitessComment, false, inbox.Lease, []string{"Vitess", "SKIP LOCKED", "advisory form"}},
		{"vitess-16", inbox.MySQL, vitess16, vitessComment, false, inbox.RowLock, []string{"Vitess", "row lock form", "advisory form"}},
		{"vitess-16", inbox.MySQL, vitess16, vitessComment, false, inbox.Advisory, nil},
		{"vitess-11", inbox.MySQL, vitess11, vitessComment, false, inbox.Advisory, nil},
		{"vitess-11", inbox.MySQL, vitess11, vitessComment, false, inbox.RowLock, []string{"Vitess", "row lock form", "advisory form"}},
		{"vitess-overridden", inbox.MySQL, overridden, vitessComment, false, inbox.RowLock, []string{"Vitess", "version_comment", "advisory form"}},
		// A vtgate that passes version_comment to a tablet's mysqld: the
		// version string.
		{"vitess-16-comment-passed-on", inbox.MySQL, vitess16, mysqlComment, false, inbox.Lease, []string{"Vitess", "version string", "advisory form"}},
		{"galera", inbox.MySQL, mariadb1011, mariaComment, true, inbox.Advisory, []string{"Galera", "GET_LOCK", "lease form"}},
		{"galera", inbox.MySQL, mariadb1011, mariaComment, true, inbox.RowLock, []string{"Galera", "row-lock form", "1213", "lease form"}},
		{"galera", inbox.MySQL, mariadb1011, mariaComment, true, inbox.Lease, nil},
		{"mariadb", inbox.MySQL, mariadb1011, mariaComment, false, inbox.Advisory, nil},
		{"mariadb", inbox.MySQL, mariadb1011, mariaComment, false, inbox.RowLock, nil},
		{"mysql-5.7", inbox.MySQL, "5.7.44", mysqlComment, false, inbox.Advisory, nil},
		{"mysql-5.7", inbox.MySQL, "5.7.44", mysqlComment, false, inbox.Lease, []string{"MySQL 5.7.44", "older than 8.0", "SKIP LOCKED", "lease form"}},
	} {
		t.Run(tc.engine+"/"+tc.form.String(), func(t *testing.T) {
			m := newMock(t)
			q := newQueue(t, m, inbox.Config{Dialect: tc.dialect, Table: tables[tc.form]})
			if tc.dialect == inbox.Postgres {
				m.ExpectQuery(pgProbe).WithoutArgs().WillReturnRows(pgAnswer(tc.version))
				m.ExpectQuery(pgColumns).WithArgs("", "jobs").WillReturnRows(pgCols(tc.form))
				if tc.form == inbox.Advisory && tc.want == nil {
					// Sessions are asked about only once the rest is fit.
					expectOwnSessions(m, tc.version)
				}
			} else {
				m.ExpectQuery(myProbe).WithoutArgs().WillReturnRows(myAnswer(tc.version, tc.comment))
				// Galera is a MySQL or MariaDB server's; TiDB and Vitess
				// are not asked.
				v := strings.ToLower(tc.version)
				lookalike := strings.Contains(tc.comment, "TiDB") || strings.Contains(tc.comment, "Git revision") ||
					strings.Contains(v, "tidb") || strings.Contains(v, "vitess")
				if tc.form != inbox.Lease && !lookalike {
					wsrep := rows("Variable_name,Value")
					if tc.galera {
						wsrep.AddRow("wsrep_on", "ON")
					}
					m.ExpectQuery(myWsrep).WithoutArgs().WillReturnRows(wsrep)
				}
				m.ExpectQuery(myColumns).WithArgs("", "jobs").WillReturnRows(myCols(tc.form))
				m.ExpectQuery(myFill).WithArgs("", "jobs", "id", "id").WillReturnRows(myAutoID())
				m.ExpectQuery(myEngine).WithArgs("", "jobs").WillReturnRows(rows("engine", row("InnoDB")))
				if tc.form == inbox.Lease {
					expectIDPrimary(m, "")
				}
			}
			if tc.want == nil && tc.form == inbox.Lease && tc.dialect != inbox.Postgres {
				expectClocks(m, 4)
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

// The advisory form's session check on PostgreSQL (schema.go): its first
// statement, and the one that reads a session.
const (
	pgSessionFirst = "SELECT pg_catalog.version(), pg_catalog.pg_backend_pid(), CAST(pg_catalog.pg_postmaster_start_time() AS text)"
	pgSessionAt    = "SELECT pg_catalog.pg_backend_pid(), CAST(pg_catalog.pg_postmaster_start_time() AS text)"
)

// expectOwnSessions answers the advisory form's session check as a server
// reached directly does: the check's connection always in backend 100, a
// second connection's transaction in backend 200, three rounds. An engine
// the check does not probe (CockroachDB) is asked its first statement only.
func expectOwnSessions(m *mock, version string) {
	const start = "2026-12-05 05:00:00+00"
	m.ExpectQuery(pgSessionFirst).WithoutArgs().WillReturnRows(rows("version,pid,start", row(version, int64(100), start)))
	if strings.Contains(version, "CockroachDB") {
		return
	}
	for round := 0; round < 3; round++ {
		m.ExpectQuery(pgSessionAt).WithoutArgs().WillReturnRows(rows("pid,start", row(int64(100), start)))
		m.ExpectBegin()
		m.ExpectQuery(pgSessionAt).WithoutArgs().WillReturnRows(rows("pid,start", row(int64(200), start)))
		m.ExpectRollback()
		m.ExpectQuery(pgSessionAt).WithoutArgs().WillReturnRows(rows("pid,start", row(int64(100), start)))
	}
}

// expectIDPrimary answers the schema check's question whether the lease
// table jobs (in schema) has its id alone as primary key: yes.
func expectIDPrimary(m *mock, schema string) {
	m.ExpectQuery(myIDPrimary).WithArgs(schema, "jobs", "id").WillReturnRows(rows("n", row(int64(1))))
}
