package inbox_test

// The sqlmock harness shared by the unit tests. The SQL pins themselves are
// in sql_postgres_test.go, sql_mysql_test.go and sql_sqlite_test.go: each
// writes the statements of its engine out literally, so that a change to the
// SQL shows up in a test diff.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/fakedb"
)

// t0 is the injected clock's first instant: 14:00 at +02:00 with
// nanoseconds, so that the pins show every time passed as UTC truncated to
// the microsecond (utc0).
var (
	t0   = time.Date(2024, 3, 1, 14, 0, 0, 123456789, time.FixedZone("CEST", 2*3600))
	utc0 = time.Date(2024, 3, 1, 12, 0, 0, 123456000, time.UTC)
)

// The descriptions the pins use: one per form, each with a dead table, the
// row-lock and advisory ones with a not-before column, and the row lock
// with its claims counter's side table.
var (
	leaseTable    = inbox.Table{Name: "jobs", LockedUntil: "locked_until", DeadTable: "dead_jobs"}
	rowLockTable  = inbox.Table{Name: "jobs", NotBefore: "not_before", DeadTable: "dead_jobs"}
	claimsTable   = inbox.Table{Name: "jobs", NotBefore: "not_before", ClaimsTable: "job_claims", MaxClaims: 3, DeadTable: "dead_jobs"}
	advisoryTable = inbox.Table{Name: "jobs", AdvisoryKey: "id", NotBefore: "not_before", DeadTable: "dead_jobs"}
)

// mock is a database on the fake driver (internal/fakedb): sqlmock with
// exact SQL matching, behind a driver that logs every call arriving at it.
type mock = fakedb.DB

// newMock returns a mock whose database the test closes at its end.
func newMock(t testing.TB) *mock { t.Helper(); return fakedb.New(t) }

// at matches a time.Time argument at the instant, in UTC: how the Postgres
// dialect passes times.
type at time.Time

func (a at) Match(v driver.Value) bool {
	t, ok := v.(time.Time)
	return ok && t.Equal(time.Time(a)) && t.Location() == time.UTC
}

// capture matches any argument and keeps it, for times read from the real
// clock.
type capture struct{ v driver.Value }

func (c *capture) Match(v driver.Value) bool { c.v = v; return true }

// newQueue returns a queue on m, failing the test on an error.
func newQueue(t testing.TB, m *mock, cfg inbox.Config) *inbox.Queue {
	t.Helper()
	q, err := inbox.New(m.DB, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// claim claims up to max jobs and checks that want ids came back, in order.
func claim(t testing.TB, q *inbox.Queue, max int, want ...int64) []*inbox.Delivery {
	t.Helper()
	return claimCtx(t, context.Background(), q, max, want...)
}

// claimCtx is claim with the claim's context.
func claimCtx(t testing.TB, ctx context.Context, q *inbox.Queue, max int, want ...int64) []*inbox.Delivery {
	t.Helper()
	ds, err := q.Claim(ctx, max)
	if err != nil {
		t.Fatalf("Claim(%d): %v", max, err)
	}
	var got []any
	for _, d := range ds {
		got = append(got, d.ID())
	}
	var wantIDs []any
	for _, id := range want {
		wantIDs = append(wantIDs, id)
	}
	if !reflect.DeepEqual(got, wantIDs) {
		t.Fatalf("Claim(%d) ids = %v, want %v", max, got, wantIDs)
	}
	return ds
}

// settleInTx begins a transaction, sets expect's expectations, runs settle
// in it and commits, failing the test on an error.
func settleInTx(t testing.TB, m *mock, name string, expect func(), settle func(tx *sql.Tx) error) {
	t.Helper()
	m.ExpectBegin()
	tx, err := m.DB.Begin()
	ok(t, "Begin", err)
	expect()
	ok(t, name, settle(tx))
	m.ExpectCommit()
	ok(t, name+" commit", tx.Commit())
}

// ok fails the test if err is not nil.
func ok(t testing.TB, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// affected is an Exec result of n rows.
func affected(n int64) driver.Result { return sqlmock.NewResult(0, n) }

// rows is a result set with columns cols.
func rows(cols string, vals ...[]driver.Value) *sqlmock.Rows {
	r := sqlmock.NewRows(strings.Split(cols, ","))
	for _, v := range vals {
		r.AddRow(v...)
	}
	return r
}

// row is one row of values.
func row(vals ...driver.Value) []driver.Value { return vals }

// mariaLevel is the column inbox.MariaDB's claim reads end with: whether
// the session runs at READ COMMITTED.
const mariaLevel = ", @@tx_isolation = 'READ-COMMITTED'"

// mariaRead is inbox.MySQL's claim read q as inbox.MariaDB sends it.
func mariaRead(q string) string {
	i := strings.Index(q, " FROM ")
	return q[:i] + mariaLevel + q[i:]
}

// atLevel appends the level column to a claim read's rows, each saying
// READ COMMITTED, where claimSQL reads it.
func atLevel(claimSQL, cols string, vals ...[]driver.Value) *sqlmock.Rows {
	if !strings.Contains(claimSQL, mariaLevel) {
		return rows(cols, vals...)
	}
	for i := range vals {
		vals[i] = append(vals[i], int64(1))
	}
	return rows(cols+",level", vals...)
}

// TestStatementsPlaceholders checks, for every form, dialect and clock,
// that each statement has as many placeholders as arguments: numbered ones
// ($1…$n, each once and in order) on Postgres, ? elsewhere.
func TestStatementsPlaceholders(t *testing.T) {
	m := newMock(t)
	named := map[inbox.Dialect]bool{inbox.Postgres: true}
	tables := map[string]inbox.Table{
		"lease": leaseTable, "row lock": rowLockTable, "claims": claimsTable, "advisory": advisoryTable,
		"advisory tenant": {Name: "app.jobs", AdvisoryKey: "tenant", Data: []string{"kind", "body"}},
		"lease no data":   {Name: "jobs", LockedUntil: "locked_until", Data: []string{}},
	}
	checked := 0
	for _, d := range []inbox.Dialect{inbox.Postgres, inbox.MySQL, inbox.SQLite} {
		for name, tb := range tables {
			for _, clock := range []func() time.Time{nil, func() time.Time { return t0 }} {
				q, err := inbox.New(m.DB, inbox.Config{Dialect: d, Table: tb, Now: clock})
				if err != nil {
					if d == inbox.SQLite && tb.LockedUntil == "" && tb.AdvisoryKey == "" {
						continue // no row lock on SQLite: TestNewRefuses
					}
					t.Fatalf("%s %s: %v", d.Name(), name, err)
				}
				st := reflect.ValueOf(*q.Statements())
				type namedStmt struct {
					name string
					s    dialect.Stmt
				}
				var all []namedStmt
				var walk func(v reflect.Value, path string)
				walk = func(v reflect.Value, path string) {
					for i := 0; i < v.NumField(); i++ {
						name := path + v.Type().Field(i).Name
						switch f := v.Field(i).Interface().(type) {
						case dialect.Stmt:
							all = append(all, namedStmt{name, f})
						case []dialect.Stmt:
							for k, s := range f {
								all = append(all, namedStmt{fmt.Sprintf("%s[%d]", name, k), s})
							}
						case bool: // Advisory.LockFirstContended: how the core sends them
						default:
							if v.Field(i).Kind() != reflect.Struct {
								t.Fatalf("Statements.%s is a %T", name, f)
							}
							walk(v.Field(i), name+".")
						}
					}
				}
				walk(st, "")
				for _, ns := range all {
					s := ns.s
					if s.SQL == "" {
						continue
					}
					checked++
					where := fmt.Sprintf("%s %s (clock injected %v) %s: %s", d.Name(), name, clock != nil, ns.name, s.SQL)
					if named[d] {
						n := 0
						for strings.Contains(s.SQL, fmt.Sprintf("$%d", n+1)) {
							n++
						}
						if n != len(s.Args) || strings.Contains(s.SQL, "?") {
							t.Errorf("%s: placeholders $1..$%d for %d args", where, n, len(s.Args))
						}
						for k := 1; k <= n; k++ {
							if c := strings.Count(s.SQL, fmt.Sprintf("$%d", k)); c != 1 {
								t.Errorf("%s: $%d appears %d times", where, k, c)
							}
						}
					} else if c := strings.Count(s.SQL, "?"); c != len(s.Args) || strings.Contains(s.SQL, "$") {
						t.Errorf("%s: %d placeholders for %d args", where, c, len(s.Args))
					}
				}
			}
		}
	}
	if checked < 100 {
		t.Errorf("checked %d statements, want every statement of 3 dialects × 6 tables × 2 clocks", checked)
	}
	m.Met(t)
	if n := m.Sent(); n != 0 {
		t.Errorf("New sent %d calls", n)
	}
}

// The advisory form names its locks by the table's identity as the engine
// resolves it, read once per queue at its first claim: the mocks answer
// "public.jobs" on Postgres and "test.jobs" on MySQL, whichever way the
// description spells the table.
const (
	pgIdentity = `SELECT (SELECT ns.nspname || '.' || c.relname FROM pg_catalog.pg_class c ` +
		`JOIN pg_catalog.pg_namespace ns ON ns.oid = c.relnamespace WHERE c.oid = to_regclass($1))`
	myIdentity = "SELECT (SELECT CONCAT(table_schema, '.', table_name) FROM information_schema.tables " +
		"WHERE table_schema = COALESCE(NULLIF(?, ''), DATABASE()) AND table_name = ?)"
	sqIdentity = `SELECT (SELECT file FROM pragma_database_list WHERE name = ? COLLATE NOCASE)`
)

// pgIdent expects the Postgres identity query for the quoted name and
// answers public.jobs.
func pgIdent(m *mock, quoted string) {
	m.ExpectQuery(pgIdentity).WithArgs(quoted).WillReturnRows(rows("ident", row("public.jobs")))
}

// myIdent expects the MySQL identity query for schema (empty when the
// description names none) and table, and answers test.jobs.
func myIdent(m *mock, schema, table string) {
	m.ExpectQuery(myIdentity).WithArgs(schema, table).WillReturnRows(rows("ident", row("test.jobs")))
}

// sqIdent expects the SQLite identity query for the attached database
// schema and answers file. Keys in work are shared by the whole process
// per file and table, so each test names a file of its own.
func sqIdent(m *mock, schema, file string) {
	m.ExpectQuery(sqIdentity).WithArgs(schema).WillReturnRows(rows("file", row(file)))
}

// pgKey and myLock are the advisory lock keys of the table whose identity
// is public.jobs (Postgres) and test.jobs (MySQL), written out: SHA-256 over
// the identity, a zero byte and the key value; Postgres takes its first
// eight bytes as a big-endian int64, MySQL "inbox_" and its first sixteen
// in hex.
var (
	pgKey = map[string]int64{
		"1": 6207851036127350284, "2": 3420757446354996580, "3": -247041613757985234,
		"4": 7575065213089210996, "5": 2597646496906280042, "6": 2458969272534011207,
		"7": -3810514539938675838, "8": -8183546622969733770, "9": 5957141001136140563,
		"a": -1938551416556437680, "b": -8363858431503318932,
	}
	myLock = map[string]string{
		"1": "inbox_ae766a303de3c1795c6410302d497b65", "2": "inbox_0b012abbe91ea4daeb40c98554e49621",
		"3": "inbox_7d44c35b9b1a7636e09335c2dc20ad3d", "4": "inbox_8949d859c2ad01b5abb017e04d4beaf7",
		"5": "inbox_046f0c2ad5a3f346de04ad250409462f", "6": "inbox_754dc2a37d2fdbd6e0bf908a55fed819",
		"7": "inbox_aa49cf4e91a79686fdadb903880088d5", "8": "inbox_108e4ffd59d91e50db103a1f28bd982a",
		"9": "inbox_7ab518bf84d25788b8ae74ce453bc9d6", "a": "inbox_a0e3c258de25b2b0ed54ef854d6cf423",
		"b": "inbox_c586439481beb702cddf4d44348ad059",
	}
)

// The lock keys are part of the on-the-wire contract: two versions of the
// package must lock the same job with the same key.
func TestLockKeys(t *testing.T) {
	for k, want := range pgKey {
		if got := inbox.PostgresLockKey("public.jobs", k); got != want {
			t.Errorf("PostgresLockKey(public.jobs, %s) = %d, want %d", k, got, want)
		}
	}
	for k, want := range myLock {
		if got := inbox.MySQLLockName("test.jobs", k); got != want {
			t.Errorf("MySQLLockName(test.jobs, %s) = %s, want %s", k, got, want)
		}
	}
	long := inbox.MySQLLockName(strings.Repeat("t", 63)+"."+strings.Repeat("t", 63), strings.Repeat("k", 1000))
	if len(long) != 38 {
		t.Errorf("MySQLLockName of a long key has %d characters, want 38", len(long))
	}
	if inbox.PostgresLockKey("public.jobs", "1") == inbox.PostgresLockKey("public.jobs2", "1") {
		t.Error("PostgresLockKey does not tell tables apart")
	}
}

// editedDialect is a dialect from outside the package: d's statements with
// edit applied, and none of d's optional capabilities.
type editedDialect struct {
	inbox.Dialect
	edit func(*inbox.Statements)
}

func (d editedDialect) Statements(n *dialect.Names) (*inbox.Statements, error) {
	st, err := d.Dialect.Statements(n)
	if err == nil {
		d.edit(st)
	}
	return st, err
}
