package connhook

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// The fake driver: a full connection that has every optional interface,
// and a bare one that has none. Both note what reaches them.

var (
	errFail  = errors.New("fake: fail")
	errPing  = errors.New("fake: ping")
	errReset = errors.New("fake: reset")
)

// point is no driver.Value: only the fake's CheckNamedValue takes it.
type point struct{ x, y int }

func checkPoint(nv *driver.NamedValue) error {
	if p, ok := nv.Value.(point); ok {
		nv.Value = fmt.Sprintf("(%d,%d)", p.x, p.y)
		return nil
	}
	return driver.ErrSkip
}

type fakeLog struct {
	mu    sync.Mutex
	calls []string
}

func (l *fakeLog) add(format string, a ...any) {
	l.mu.Lock()
	l.calls = append(l.calls, fmt.Sprintf(format, a...))
	l.mu.Unlock()
}

func (l *fakeLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.calls
	l.calls = nil
	return out
}

// fakeConnector opens full connections, or bare ones.
type fakeConnector struct {
	log    *fakeLog
	bare   bool
	closed bool
	drv    driver.Driver // fakeDriver{} if nil
}

func (c *fakeConnector) Connect(context.Context) (driver.Conn, error) {
	if c.bare {
		return &bareConn{log: c.log}, nil
	}
	return &fullConn{bareConn: bareConn{log: c.log}, valid: true}, nil
}

func (c *fakeConnector) Driver() driver.Driver {
	if c.drv != nil {
		return c.drv
	}
	return fakeDriver{}
}
func (c *fakeConnector) Close() error { c.closed = true; return nil }

type fakeDriver struct{}

func (fakeDriver) Open(dsn string) (driver.Conn, error) {
	return &bareConn{log: &fakeLog{}, dsn: dsn}, nil
}

// fakeContextDriver is a driver.DriverContext.
type fakeContextDriver struct{ fakeDriver }

func (fakeContextDriver) OpenConnector(dsn string) (driver.Connector, error) {
	return &fakeConnector{log: &fakeLog{}, drv: fakeContextDriver{}}, nil
}

func init() {
	sql.Register("connhook-fake", fakeDriver{})
	sql.Register("connhook-fake-context", fakeContextDriver{})
}

// bareConn has a driver.Conn's methods only.
type bareConn struct {
	log *fakeLog
	dsn string
}

func (c *bareConn) Prepare(q string) (driver.Stmt, error) {
	c.log.add("prepare %s", q)
	return &bareStmt{log: c.log, q: q}, nil
}

func (c *bareConn) Close() error { return nil }

func (c *bareConn) Begin() (driver.Tx, error) {
	c.log.add("begin")
	return fakeTx{c.log}, nil
}

// fullConn has every optional interface. A statement "skip" is answered
// with driver.ErrSkip, a statement "fail" with errFail.
type fullConn struct {
	bareConn
	valid bool
	reset int
}

func (c *fullConn) answer(q string) error {
	switch q {
	case "skip":
		return driver.ErrSkip
	case "fail":
		return errFail
	}
	return nil
}

func (c *fullConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	c.log.add("query %s %v", q, values(args))
	if err := c.answer(q); err != nil {
		return nil, err
	}
	return &fullRows{bareRows: bareRows{n: 2}}, nil
}

func (c *fullConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	c.log.add("exec %s %v", q, values(args))
	if err := c.answer(q); err != nil {
		return nil, err
	}
	return driver.RowsAffected(1), nil
}

func (c *fullConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	c.log.add("prepare %s", q)
	return &fullStmt{bareStmt{log: c.log, q: q}}, nil
}

func (c *fullConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	c.log.add("begin %v", sql.IsolationLevel(opts.Isolation))
	return fakeTx{c.log}, nil
}

func (c *fullConn) CheckNamedValue(nv *driver.NamedValue) error { return checkPoint(nv) }
func (c *fullConn) ResetSession(context.Context) error          { c.reset++; return errReset }
func (c *fullConn) IsValid() bool                               { return c.valid }
func (c *fullConn) Ping(context.Context) error                  { return errPing }

func values(args []driver.NamedValue) []driver.Value {
	out := make([]driver.Value, len(args))
	for i, a := range args {
		out[i] = a.Value
	}
	return out
}

type fakeTx struct{ log *fakeLog }

func (t fakeTx) Commit() error   { t.log.add("commit"); return nil }
func (t fakeTx) Rollback() error { t.log.add("rollback"); return nil }

// bareStmt has a driver.Stmt's methods only.
type bareStmt struct {
	log *fakeLog
	q   string
}

func (s *bareStmt) Close() error  { s.log.add("close %s", s.q); return nil }
func (s *bareStmt) NumInput() int { return -1 }

func (s *bareStmt) Exec(args []driver.Value) (driver.Result, error) {
	s.log.add("stmt exec %s %v", s.q, args)
	return driver.RowsAffected(1), nil
}

func (s *bareStmt) Query(args []driver.Value) (driver.Rows, error) {
	s.log.add("stmt query %s %v", s.q, args)
	return &bareRows{n: 1}, nil
}

type fullStmt struct{ bareStmt }

func (s *fullStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	s.log.add("stmt exec %s %v", s.q, values(args))
	return driver.RowsAffected(1), nil
}

func (s *fullStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	s.log.add("stmt query %s %v", s.q, values(args))
	return &fullRows{bareRows: bareRows{n: 1}, second: true}, nil
}

// bareRows are n rows of one column.
type bareRows struct{ n int }

func (r *bareRows) Columns() []string { return []string{"v"} }
func (r *bareRows) Close() error      { return nil }

func (r *bareRows) Next(dest []driver.Value) error {
	if r.n == 0 {
		return io.EOF
	}
	r.n--
	dest[0] = int64(r.n)
	return nil
}

// fullRows have a second result set of one row, and column types.
type fullRows struct {
	bareRows
	second bool
}

func (r *fullRows) HasNextResultSet() bool { return !r.second }

func (r *fullRows) NextResultSet() error {
	if r.second {
		return io.EOF
	}
	r.second, r.n = true, 1
	return nil
}

func (r *fullRows) ColumnTypeScanType(int) reflect.Type               { return reflect.TypeOf(int64(0)) }
func (r *fullRows) ColumnTypeDatabaseTypeName(int) string             { return "POINT" }
func (r *fullRows) ColumnTypeLength(int) (int64, bool)                { return 7, true }
func (r *fullRows) ColumnTypeNullable(int) (bool, bool)               { return true, true }
func (r *fullRows) ColumnTypePrecisionScale(int) (int64, int64, bool) { return 5, 2, true }

// hookLog notes every hook call, and that each was given the call's ctx.
type hookLog struct {
	fakeLog
	key any
}

type ctxKey struct{}

func (l *hookLog) hooks(t *testing.T) Hooks {
	ctxOf := func(ctx context.Context, c Call) {
		// Calls without a context of their own get Background.
		want := c.Kind != StmtClose && c.Kind != Commit && c.Kind != Rollback
		if got := ctx.Value(ctxKey{}) != nil; got != want {
			t.Errorf("%v got the call's context: %v, want %v", c.Kind, got, want)
		}
	}
	return Hooks{
		Before: func(ctx context.Context, c Call) {
			ctxOf(ctx, c)
			l.add("before %v %s%s", c.Kind, c.SQL, isolation(c))
		},
		After: func(ctx context.Context, c Call, err error, elapsed time.Duration) {
			ctxOf(ctx, c)
			if elapsed < 0 {
				t.Errorf("%v took %v", c.Kind, elapsed)
			}
			l.add("after %v %s%s: %v", c.Kind, c.SQL, isolation(c), err)
		},
		RowsClosed: func(ctx context.Context, c Call, spent time.Duration) {
			ctxOf(ctx, c)
			l.add("rows closed %v %s", c.Kind, c.SQL)
		},
	}
}

func isolation(c Call) string {
	if c.Kind != Begin {
		return ""
	}
	return fmt.Sprintf("%v read-only=%v", sql.IsolationLevel(c.TxOptions.Isolation), c.TxOptions.ReadOnly)
}

func expect(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("%s:\n got %q\nwant %q", what, got, want)
	}
}

func openFake(t *testing.T, inner *fakeConnector, h Hooks) *sql.DB {
	t.Helper()
	db := sql.OpenDB(Wrap(inner, h))
	// One connection, so that the driver sees no second one's setup.
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	return db
}

func readAll(t *testing.T, rows *sql.Rows, err error) []int64 {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []int64
	for {
		for rows.Next() {
			var v int64
			if err := rows.Scan(&v); err != nil {
				t.Fatal(err)
			}
			out = append(out, v)
		}
		if !rows.NextResultSet() {
			break
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestHooksSeeEveryCall: each call through database/sql reaches the driver
// and calls Before, After and, for rows, RowsClosed, in that order, with
// the statement's text, the transaction's options and the driver's error.
func TestHooksSeeEveryCall(t *testing.T) {
	log := &fakeLog{}
	hooks := &hookLog{}
	db := openFake(t, &fakeConnector{log: log}, hooks.hooks(t))
	ctx := context.WithValue(context.Background(), ctxKey{}, true)

	// Two rows, then the fake's second result set of one.
	rows, err := db.QueryContext(ctx, "SELECT v", point{1, 2})
	if got := readAll(t, rows, err); !reflect.DeepEqual(got, []int64{1, 0, 0}) {
		t.Errorf("rows %v, want [1 0 0]", got)
	}
	expect(t, "driver", log.take(), "query SELECT v [(1,2)]")
	expect(t, "hooks", hooks.take(),
		"before Query SELECT v", "after Query SELECT v: <nil>", "rows closed Query SELECT v")

	if _, err := db.ExecContext(ctx, "UPDATE", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "fail"); !errors.Is(err, errFail) {
		t.Fatalf("exec fail: %v", err)
	}
	if _, err := db.QueryContext(ctx, "fail"); !errors.Is(err, errFail) {
		t.Fatalf("query fail: %v", err)
	}
	expect(t, "driver", log.take(), "exec UPDATE [1]", "exec fail []", "query fail []")
	expect(t, "hooks", hooks.take(),
		"before Exec UPDATE", "after Exec UPDATE: <nil>",
		"before Exec fail", "after Exec fail: "+errFail.Error(),
		"before Query fail", "after Query fail: "+errFail.Error())

	// The driver's ErrSkip reaches After; database/sql then prepares.
	if _, err := db.ExecContext(ctx, "skip", 2); err != nil {
		t.Fatal(err)
	}
	expect(t, "driver", log.take(), "exec skip [2]", "prepare skip", "stmt exec skip [2]", "close skip")
	expect(t, "hooks", hooks.take(),
		"before Exec skip", "after Exec skip: "+driver.ErrSkip.Error(),
		"before Prepare skip", "after Prepare skip: <nil>",
		"before StmtExec skip", "after StmtExec skip: <nil>",
		"before StmtClose skip", "after StmtClose skip: <nil>")

	st, err := db.PrepareContext(ctx, "SELECT ?")
	if err != nil {
		t.Fatal(err)
	}
	rows, err = st.QueryContext(ctx, point{3, 4})
	readAll(t, rows, err)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	expect(t, "driver", log.take(), "prepare SELECT ?", "stmt query SELECT ? [(3,4)]", "close SELECT ?")
	expect(t, "hooks", hooks.take(),
		"before Prepare SELECT ?", "after Prepare SELECT ?: <nil>",
		"before StmtQuery SELECT ?", "after StmtQuery SELECT ?: <nil>", "rows closed StmtQuery SELECT ?",
		"before StmtClose SELECT ?", "after StmtClose SELECT ?: <nil>")

	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelSerializable, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	expect(t, "driver", log.take(), "begin Serializable", "commit", "begin Default", "rollback")
	expect(t, "hooks", hooks.take(),
		"before Begin Serializable read-only=true", "after Begin Serializable read-only=true: <nil>",
		"before Commit ", "after Commit : <nil>",
		"before Begin Default read-only=false", "after Begin Default read-only=false: <nil>",
		"before Rollback ", "after Rollback : <nil>")
}

// TestPassThrough: what a connection, statement, rows and connector offer
// beside the hooked calls is the driver's.
func TestPassThrough(t *testing.T) {
	ctx := context.Background()
	inner := &fakeConnector{log: &fakeLog{}}
	c := Wrap(inner, Hooks{})
	if _, ok := c.Driver().(fakeDriver); !ok {
		t.Errorf("Driver() = %T, want the inner connector's", c.Driver())
	}
	dc, err := c.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	full := dc.(*hookedConn).Conn.(*fullConn)
	if err := dc.(driver.Pinger).Ping(ctx); !errors.Is(err, errPing) {
		t.Errorf("Ping: %v, want the driver's %v", err, errPing)
	}
	if err := dc.(driver.SessionResetter).ResetSession(ctx); !errors.Is(err, errReset) || full.reset != 1 {
		t.Errorf("ResetSession: %v after %d resets, want the driver's %v after 1", err, full.reset, errReset)
	}
	full.valid = false
	if dc.(driver.Validator).IsValid() {
		t.Error("IsValid: true, want the driver's false")
	}
	nv := driver.NamedValue{Ordinal: 1, Value: point{5, 6}}
	if err := dc.(driver.NamedValueChecker).CheckNamedValue(&nv); err != nil || nv.Value != "(5,6)" {
		t.Errorf("CheckNamedValue: %v, %v; want the driver's (5,6)", nv.Value, err)
	}
	// A statement without a checker of its own asks its connection's.
	st, err := dc.(driver.ConnPrepareContext).PrepareContext(ctx, "SELECT ?")
	if err != nil {
		t.Fatal(err)
	}
	nv = driver.NamedValue{Ordinal: 1, Value: point{7, 8}}
	if err := st.(driver.NamedValueChecker).CheckNamedValue(&nv); err != nil || nv.Value != "(7,8)" {
		t.Errorf("the statement's CheckNamedValue: %v, %v; want the connection's (7,8)", nv.Value, err)
	}
	if st.NumInput() != -1 {
		t.Errorf("NumInput: %d, want the driver's -1", st.NumInput())
	}

	// Column types through rows that RowsClosed wraps.
	db := openFake(t, &fakeConnector{log: &fakeLog{}}, Hooks{RowsClosed: func(context.Context, Call, time.Duration) {}})
	rows, err := db.QueryContext(ctx, "SELECT v")
	if err != nil {
		t.Fatal(err)
	}
	cts, err := rows.ColumnTypes()
	rows.Close()
	if err != nil {
		t.Fatal(err)
	}
	ct := cts[0]
	length, lok := ct.Length()
	nullable, nok := ct.Nullable()
	precision, scale, pok := ct.DecimalSize()
	got := fmt.Sprintln(ct.DatabaseTypeName(), ct.ScanType(), length, lok, nullable, nok, precision, scale, pok)
	if want := "POINT int64 7 true true true 5 2 true\n"; got != want {
		t.Errorf("column type: %s, want the driver's %s", got, want)
	}

	if err := c.(io.Closer).Close(); err != nil || !inner.closed {
		t.Errorf("Close: %v, inner closed %v; want the inner connector closed", err, inner.closed)
	}
}

// TestBareDriver: a driver without the optional interfaces is answered as
// database/sql would answer it, and its calls are still seen.
func TestBareDriver(t *testing.T) {
	ctx := context.Background()
	log := &fakeLog{}
	hooks := &hookLog{}
	db := openFake(t, &fakeConnector{log: log, bare: true}, hooks.hooks(t))
	ctx = context.WithValue(ctx, ctxKey{}, true)

	// No QueryerContext: database/sql prepares at once.
	rows, err := db.QueryContext(ctx, "SELECT ?", 9)
	if got := readAll(t, rows, err); !reflect.DeepEqual(got, []int64{0}) {
		t.Errorf("rows %v, want [0]", got)
	}
	if _, err := db.ExecContext(ctx, "UPDATE"); err != nil {
		t.Fatal(err)
	}
	expect(t, "driver", log.take(), "prepare SELECT ?", "stmt query SELECT ? [9]", "close SELECT ?",
		"prepare UPDATE", "stmt exec UPDATE []", "close UPDATE")
	expect(t, "hooks", hooks.take(),
		"before Prepare SELECT ?", "after Prepare SELECT ?: <nil>",
		"before StmtQuery SELECT ?", "after StmtQuery SELECT ?: <nil>", "rows closed StmtQuery SELECT ?",
		"before StmtClose SELECT ?", "after StmtClose SELECT ?: <nil>",
		"before Prepare UPDATE", "after Prepare UPDATE: <nil>",
		"before StmtExec UPDATE", "after StmtExec UPDATE: <nil>",
		"before StmtClose UPDATE", "after StmtClose UPDATE: <nil>")

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if _, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelSerializable}); err == nil {
		t.Error("BeginTx(Serializable) on a driver without BeginTx: no error")
	}
	expect(t, "driver", log.take(), "begin", "commit")
	expect(t, "hooks", hooks.take(),
		"before Begin Default read-only=false", "after Begin Default read-only=false: <nil>",
		"before Commit ", "after Commit : <nil>",
		"before Begin Serializable read-only=false",
		"after Begin Serializable read-only=false: connhook: the driver does not support non-default isolation levels")

	dc, err := Wrap(&fakeConnector{log: log, bare: true}, Hooks{}).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nv := driver.NamedValue{Ordinal: 1, Value: point{1, 1}}
	if err := dc.(driver.Pinger).Ping(ctx); err != nil {
		t.Errorf("Ping: %v, want nil", err)
	}
	if err := dc.(driver.SessionResetter).ResetSession(ctx); err != nil {
		t.Errorf("ResetSession: %v, want nil", err)
	}
	if !dc.(driver.Validator).IsValid() {
		t.Error("IsValid: false, want true")
	}
	if err := dc.(driver.NamedValueChecker).CheckNamedValue(&nv); err != driver.ErrSkip {
		t.Errorf("CheckNamedValue: %v, want driver.ErrSkip", err)
	}
}

// TestConnector: a driver's own connector where it has one, else one that
// opens the DSN.
func TestConnector(t *testing.T) {
	c, err := Connector("connhook-fake", "the-dsn")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := c.Connect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if dsn := conn.(*bareConn).dsn; dsn != "the-dsn" {
		t.Errorf("opened %q, want the-dsn", dsn)
	}
	if _, ok := c.Driver().(fakeDriver); !ok {
		t.Errorf("Driver() = %T, want fakeDriver", c.Driver())
	}
	if c, err = Connector("connhook-fake-context", "the-dsn"); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.(*fakeConnector); !ok {
		t.Errorf("Connector of a DriverContext = %T, want the driver's own", c)
	}
	if _, err := Connector("connhook-none", ""); err == nil {
		t.Error("Connector of an unregistered driver: no error")
	}
}
