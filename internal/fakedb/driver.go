package fakedb

import (
	"context"
	"database/sql/driver"
	"errors"
)

// connector opens a conn on sqlmock's one connection (open), or on an
// Answerer of its own (answer).
type connector struct {
	m      *DB
	open   func() driver.Conn
	answer func() Answerer
}

func (c connector) Connect(context.Context) (driver.Conn, error) {
	if c.answer != nil {
		return &conn{m: c.m, a: c.answer()}, nil
	}
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	c.m.nconns++
	return &conn{m: c.m, c: c.open(), n: c.m.nconns}, nil
}

func (c connector) Driver() driver.Driver { return noOpen{} }

type noOpen struct{}

func (noOpen) Open(string) (driver.Conn, error) {
	return nil, errors.New("fakedb: open the database through its connector")
}

var (
	errNoPrepare = errors.New("fakedb: an answering database prepares no statements")
	errNoTx      = errors.New("fakedb: an answering database begins no transactions")
)

// conn passes every call on to sqlmock, logging it first, or to its
// Answerer. Closing it does not close sqlmock's connection, which the other
// pooled conns share; it is only noted, so that a test can tell a discarded
// connection from one returned to the pool.
type conn struct {
	m *DB
	c driver.Conn // sqlmock's, nil when answering
	a Answerer
	n int
}

func (c *conn) Prepare(q string) (driver.Stmt, error) {
	if c.a != nil {
		return nil, errNoPrepare
	}
	c.m.add(c, "prepare "+q)
	st, err := c.c.Prepare(q)
	if err != nil {
		return nil, err
	}
	return &stmt{c: c, st: st, q: q}, nil
}

func (c *conn) Close() error {
	if c.a != nil {
		return nil
	}
	c.m.mu.Lock()
	c.m.closed = append(c.m.closed, c.n)
	c.m.mu.Unlock()
	return nil
}

func (c *conn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if c.a != nil {
		return nil, errNoTx
	}
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
	if c.a != nil {
		return c.a.QueryContext(ctx, q, args)
	}
	c.m.add(c, "query "+q)
	r, err := c.c.(driver.QueryerContext).QueryContext(ctx, q, args)
	c.m.hook("query "+q, err)
	return r, err
}

func (c *conn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	if c.a != nil {
		return c.a.ExecContext(ctx, q, args)
	}
	c.m.add(c, "exec "+q)
	r, err := c.c.(driver.ExecerContext).ExecContext(ctx, q, args)
	c.m.hook("exec "+q, err)
	return r, err
}

// CheckNamedValue lets sqlmock's converter (or database/sql's default,
// when answering) decide what an argument becomes.
func (c *conn) CheckNamedValue(nv *driver.NamedValue) error {
	if c.a != nil {
		return driver.ErrSkip
	}
	return c.c.(driver.NamedValueChecker).CheckNamedValue(nv)
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

func (s *stmt) NumInput() int { return s.st.NumInput() }

func (s *stmt) Exec([]driver.Value) (driver.Result, error) {
	return nil, errors.New("fakedb: stmt Exec without a context")
}

func (s *stmt) Query([]driver.Value) (driver.Rows, error) {
	return nil, errors.New("fakedb: stmt Query without a context")
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

type wrapTx struct {
	c  *conn
	tx driver.Tx
}

func (t wrapTx) Commit() error   { t.c.m.add(t.c, "commit"); return t.tx.Commit() }
func (t wrapTx) Rollback() error { t.c.m.add(t.c, "rollback"); return t.tx.Rollback() }
