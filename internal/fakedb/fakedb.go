// Package fakedb is the one fake database/sql driver of the root module's
// tests: a thin driver that notes every call arriving at it and answers
// either from go-sqlmock with exact SQL matching (New), what users test
// with and what the SQL pins are written in, or from a function of the
// test's (NewAnswering), for benchmarks and stress runs that send more
// statements than expectations could be written for (Lease answers the
// Postgres lease form's). It is test support, imported by test files only.
package fakedb

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/DATA-DOG/go-sqlmock"
)

// DB is a database on the fake driver. Under New, sqlmock alone cannot
// tell that nothing was sent (an unexpected call only fails the caller,
// who may ignore it), nor which isolation level or context a transaction
// began with: the log of calls says.
type DB struct {
	sqlmock.Sqlmock // nil under NewAnswering
	DB              *sql.DB

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

// New returns a database answered by sqlmock, matching SQL exactly and in
// order, closed at the test's end.
func New(t testing.TB) *DB {
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
	m := &DB{Sqlmock: sm}
	m.DB = sql.OpenDB(connector{m: m, open: func() driver.Conn { return raw }})
	t.Cleanup(func() {
		m.DB.Close()
		mdb.Close()
	})
	return m
}

// Answerer answers the statements of one connection. It may keep state
// between them: database/sql runs one statement at a time on a
// connection, and closes its rows before the next.
type Answerer interface {
	driver.QueryerContext
	driver.ExecerContext
}

// NewAnswering returns a database whose connections are each answered by
// an Answerer from open, closed at the test's end. It logs nothing, so that
// a benchmark counts its statements' cost and little else; it prepares
// nothing and begins no transaction.
func NewAnswering(t testing.TB, open func() Answerer) *DB {
	m := &DB{}
	m.DB = sql.OpenDB(connector{m: m, answer: open})
	t.Cleanup(func() { m.DB.Close() })
	return m
}

// Sent returns how many calls reached the driver so far.
func (m *DB) Sent() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.calls)
}

// Log returns the calls that reached the driver, from the n-th on.
func (m *DB) Log(n int) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.calls[n:]...)
}

// Isolations returns the isolation level of every transaction begun.
func (m *DB) Isolations() []sql.IsolationLevel {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []sql.IsolationLevel
	for _, o := range m.begins {
		out = append(out, sql.IsolationLevel(o.Isolation))
	}
	return out
}

// BeginContexts returns the context of every transaction begun.
func (m *DB) BeginContexts() []context.Context {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]context.Context(nil), m.beginCtx...)
}

func (m *DB) add(c *conn, call string) {
	m.mu.Lock()
	m.calls = append(m.calls, call)
	m.on = append(m.on, c.n)
	m.mu.Unlock()
}

// ClosedConns returns the connections closed so far: while the database is
// open, database/sql closes only a connection it discards.
func (m *DB) ClosedConns() []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]int(nil), m.closed...)
}

// ClosedStmts returns the texts of the prepared statements closed so far.
func (m *DB) ClosedStmts() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.stmtsClosed...)
}

// ConnsOf returns the connection of every call of the statement q (a query
// or an exec), in order.
func (m *DB) ConnsOf(q string) []int {
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

// Met fails the test if an expectation is left.
func (m *DB) Met(t testing.TB) {
	t.Helper()
	if err := m.ExpectationsWereMet(); err != nil {
		t.Error(err)
	}
}

// Quiet runs f and fails the test if any call reached the driver meanwhile.
func (m *DB) Quiet(t testing.TB, what string, f func()) {
	t.Helper()
	n := m.Sent()
	f()
	if got := m.Log(n); len(got) > 0 {
		t.Errorf("%s sent %q, want nothing", what, got)
	}
}

// After runs f once the driver has answered the next call ("query " or
// "exec " and the statement) without an error, before database/sql hands
// the answer to the caller: a test can end a context at that very point.
func (m *DB) After(call string, f func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.hooks == nil {
		m.hooks = map[string]func(){}
	}
	m.hooks[call] = f
}

func (m *DB) hook(call string, err error) {
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

// Since fails the test unless the calls from the n-th on are want, in
// order ("begin", "commit", "rollback", or "query " or "exec " and the
// statement), and returns the connection of each.
func (m *DB) Since(t testing.TB, n int, want ...string) []int {
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

// SameConn fails the test unless every call of the statements qs ran on
// one connection.
func (m *DB) SameConn(t testing.TB, qs ...string) {
	t.Helper()
	var all []int
	for _, q := range qs {
		c := m.ConnsOf(q)
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
