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
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqlinbox/inbox"
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

// mock is a sqlmock database with exact SQL matching, reached through a thin
// driver wrapper that logs every call arriving at the driver. sqlmock alone
// cannot tell that nothing was sent (an unexpected call only fails the
// caller, who may ignore it), nor which isolation level or context a
// transaction began with.
type mock struct {
	sqlmock.Sqlmock
	DB *sql.DB

	mu     sync.Mutex
	calls  []string
	on     []int // the connection of each call, numbered from 1
	nconns int
	closed []int // the connections database/sql closed, in order
	// stmtsClosed are the prepared statements closed, by text.
	stmtsClosed []string
	hooks       map[string]func()
	begins      []driver.TxOptions
	beginCtx    []context.Context
}

// newMock returns a mock whose database the test closes at its end.
func newMock(t testing.TB) *mock {
	t.Helper()
	mdb, sm, err := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
	if err != nil {
		t.Fatal(err)
	}
	// sqlmock's connection object serves every connection of the wrapped
	// pool; sqlmock's own *sql.DB only keeps it alive.
	conn, err := mdb.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var raw driver.Conn
	if err := conn.Raw(func(dc any) error { raw = dc.(driver.Conn); return nil }); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	m := &mock{Sqlmock: sm}
	m.DB = sql.OpenDB(connector{m: m, c: raw})
	t.Cleanup(func() {
		m.DB.Close()
		mdb.Close()
	})
	return m
}

// sent returns how many calls reached the driver so far.
func (m *mock) sent() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.calls)
}

// log returns the calls that reached the driver, from the n-th on.
func (m *mock) log(n int) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.calls[n:]...)
}

// isolations returns the isolation level of every transaction begun.
func (m *mock) isolations() []sql.IsolationLevel {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []sql.IsolationLevel
	for _, o := range m.begins {
		out = append(out, sql.IsolationLevel(o.Isolation))
	}
	return out
}

func (m *mock) add(c *conn, call string) {
	m.mu.Lock()
	m.calls = append(m.calls, call)
	m.on = append(m.on, c.n)
	m.mu.Unlock()
}

// closedConns returns the connections closed so far: while the mock's
// database is open, database/sql closes only a connection it discards.
func (m *mock) closedConns() []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]int(nil), m.closed...)
}

// connsOf returns the connection of every call of the statement q (a query
// or an exec), in order.
func (m *mock) connsOf(q string) []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []int
	for i, c := range m.calls {
		if c == "query "+q || c == "exec "+q {
			out = append(out, m.on[i])
		}
	}
	return out
}

// met fails the test if an expectation is left.
func (m *mock) met(t testing.TB) {
	t.Helper()
	if err := m.ExpectationsWereMet(); err != nil {
		t.Error(err)
	}
}

// quiet runs f and fails the test if any call reached the driver meanwhile.
func (m *mock) quiet(t testing.TB, what string, f func()) {
	t.Helper()
	n := m.sent()
	f()
	if got := m.log(n); len(got) > 0 {
		t.Errorf("%s sent %q, want nothing", what, got)
	}
}

type connector struct {
	m *mock
	c driver.Conn
}

func (c connector) Connect(context.Context) (driver.Conn, error) {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	c.m.nconns++
	return &conn{m: c.m, c: c.c, n: c.m.nconns}, nil
}
func (c connector) Driver() driver.Driver { return wrapDriver{} }

type wrapDriver struct{}

func (wrapDriver) Open(string) (driver.Conn, error) {
	return nil, fmt.Errorf("open the mock through its connector")
}

// conn passes every call on to sqlmock, logging it first. Closing it does
// not close sqlmock's connection, which the other pooled conns share; it is
// only noted, so that a test can tell a discarded connection from one
// returned to the pool.
type conn struct {
	m *mock
	c driver.Conn
	n int
}

func (c *conn) Prepare(q string) (driver.Stmt, error) {
	c.m.add(c, "prepare "+q)
	st, err := c.c.Prepare(q)
	if err != nil {
		return nil, err
	}
	return &stmt{c: c, st: st, q: q}, nil
}

// stmt logs the runs of a prepared statement as "stmt query " or "stmt
// exec " and its text, on its connection.
type stmt struct {
	c  *conn
	st driver.Stmt
	q  string
}

// Close notes the statement closed, after sqlmock has: a test polls for it
// from another goroutine than the finalizer's that closes.
func (s *stmt) Close() error {
	err := s.st.Close()
	s.c.m.mu.Lock()
	s.c.m.stmtsClosed = append(s.c.m.stmtsClosed, s.q)
	s.c.m.mu.Unlock()
	return err
}

// closedStmts returns the texts of the prepared statements closed so far.
func (m *mock) closedStmts() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.stmtsClosed...)
}

func (s *stmt) NumInput() int { return s.st.NumInput() }

func (s *stmt) Exec(args []driver.Value) (driver.Result, error) {
	return nil, fmt.Errorf("stmt: Exec without a context")
}

func (s *stmt) Query(args []driver.Value) (driver.Rows, error) {
	return nil, fmt.Errorf("stmt: Query without a context")
}

func (s *stmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	s.c.m.add(s.c, "stmt query "+s.q)
	return s.st.(driver.StmtQueryContext).QueryContext(ctx, args)
}

func (s *stmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	s.c.m.add(s.c, "stmt exec "+s.q)
	return s.st.(driver.StmtExecContext).ExecContext(ctx, args)
}

func (s *stmt) CheckNamedValue(nv *driver.NamedValue) error {
	return s.c.CheckNamedValue(nv)
}

func (c *conn) Close() error {
	c.m.mu.Lock()
	c.m.closed = append(c.m.closed, c.n)
	c.m.mu.Unlock()
	return nil
}

func (c *conn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	c.m.mu.Lock()
	c.m.calls = append(c.m.calls, "begin")
	c.m.on = append(c.m.on, c.n)
	c.m.begins = append(c.m.begins, opts)
	c.m.beginCtx = append(c.m.beginCtx, ctx)
	c.m.mu.Unlock()
	tx, err := c.c.(driver.ConnBeginTx).BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return wrapTx{c: c, tx: tx}, nil
}

func (c *conn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	c.m.add(c, "query "+q)
	r, err := c.c.(driver.QueryerContext).QueryContext(ctx, q, args)
	c.m.hook("query "+q, err)
	return r, err
}

func (c *conn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	c.m.add(c, "exec "+q)
	r, err := c.c.(driver.ExecerContext).ExecContext(ctx, q, args)
	c.m.hook("exec "+q, err)
	return r, err
}

// after runs f once the driver has answered the next call ("query " or
// "exec " and the statement) without an error, before database/sql hands
// the answer to the caller: a test can end a context at that very point.
func (m *mock) after(call string, f func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.hooks == nil {
		m.hooks = map[string]func(){}
	}
	m.hooks[call] = f
}

func (m *mock) hook(call string, err error) {
	if err != nil {
		return
	}
	m.mu.Lock()
	f := m.hooks[call]
	delete(m.hooks, call)
	m.mu.Unlock()
	if f != nil {
		f()
	}
}

func (c *conn) CheckNamedValue(nv *driver.NamedValue) error {
	return c.c.(driver.NamedValueChecker).CheckNamedValue(nv)
}

type wrapTx struct {
	c  *conn
	tx driver.Tx
}

func (t wrapTx) Commit() error   { t.c.m.add(t.c, "commit"); return t.tx.Commit() }
func (t wrapTx) Rollback() error { t.c.m.add(t.c, "rollback"); return t.tx.Rollback() }

// since fails the test unless the calls from the n-th on are want, in
// order ("begin", "commit", "rollback", or "query " or "exec " and the
// statement), and returns the connection of each.
func (m *mock) since(t testing.TB, n int, want ...string) []int {
	t.Helper()
	m.mu.Lock()
	got := append([]string(nil), m.calls[n:]...)
	on := append([]int(nil), m.on[n:]...)
	m.mu.Unlock()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("calls:\n\t%s\nwant:\n\t%s", strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
	}
	return on
}

// sameConn fails the test unless every call of the statements qs ran on
// one connection.
func (m *mock) sameConn(t testing.TB, qs ...string) {
	t.Helper()
	var all []int
	for _, q := range qs {
		c := m.connsOf(q)
		if len(c) == 0 {
			t.Errorf("no call of %s", q)
		}
		all = append(all, c...)
	}
	for _, c := range all {
		if c != all[0] {
			t.Errorf("calls of %q ran on connections %v, want one", qs, all)
			return
		}
	}
}

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
	ds, err := q.Claim(context.Background(), max)
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
				for i := 0; i < st.NumField(); i++ {
					s := st.Field(i).Interface().(inbox.Stmt)
					if s.SQL == "" {
						continue
					}
					checked++
					where := fmt.Sprintf("%s %s (clock injected %v) %s: %s", d.Name(), name, clock != nil, st.Type().Field(i).Name, s.SQL)
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
	m.met(t)
	if n := m.sent(); n != 0 {
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
