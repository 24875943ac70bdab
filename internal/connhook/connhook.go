// Package connhook wraps a database/sql/driver.Connector so that a test or
// a benchmark sees every call its pool sends to the driver, to count, time
// or pause it. It is test and benchmark support, standard library only.
package connhook

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"reflect"
	"time"
)

// Kind is the kind of a call that reaches the driver.
type Kind uint8

const (
	Query     Kind = iota + 1 // a connection's QueryContext
	Exec                      // a connection's ExecContext
	Prepare                   // a connection's PrepareContext
	StmtQuery                 // a prepared statement's QueryContext
	StmtExec                  // a prepared statement's ExecContext
	StmtClose                 // a prepared statement's Close
	Begin                     // a connection's BeginTx
	Commit                    // a transaction's Commit
	Rollback                  // a transaction's Rollback
)

var kindNames = [...]string{"", "Query", "Exec", "Prepare", "StmtQuery", "StmtExec", "StmtClose", "Begin", "Commit", "Rollback"}

func (k Kind) String() string {
	if int(k) < len(kindNames) && k != 0 {
		return kindNames[k]
	}
	return "Kind(?)"
}

// Runs reports whether k runs a statement: Query, Exec, StmtQuery or
// StmtExec.
func (k Kind) Runs() bool {
	return k == Query || k == Exec || k == StmtQuery || k == StmtExec
}

// Call is what a hook is told of a call.
type Call struct {
	Kind Kind
	// SQL is the statement's text; for the calls of a prepared statement,
	// the text it was prepared from; "" for Begin, Commit and Rollback.
	SQL string
	// TxOptions are the options of a Begin.
	TxOptions driver.TxOptions
}

// Hooks are called around the calls of a wrapped connector's connections.
// A nil hook is not called. A pool calls from many goroutines at once, so
// hooks must be safe for concurrent use. ctx is the call's context, or
// context.Background() for StmtClose, Commit and Rollback, which have none.
type Hooks struct {
	// Before is called before the call is passed on to the driver.
	Before func(ctx context.Context, c Call)
	// After is called when the driver has returned, with its error and the
	// time the driver took. A Query or Exec that the driver answers with
	// driver.ErrSkip comes here with that error: database/sql then prepares
	// the statement and runs it, calls of their own. A driver's connection
	// without QueryerContext (ExecerContext) gets no Query (Exec) call at
	// all: database/sql prepares at once.
	After func(ctx context.Context, c Call, err error, elapsed time.Duration)
	// RowsClosed, when set, is called as the rows of a Query or StmtQuery
	// without error are closed, with the time the driver spent on them:
	// the query call, each Next and the Close (drivers that stream their
	// results wait for the server there too). Without it, rows are the
	// driver's own.
	RowsClosed func(ctx context.Context, c Call, spent time.Duration)
}

// Wrap returns a connector whose connections call h around every call to
// inner's. Everything else a connection, statement, transaction or rows
// may offer database/sql is passed on as it is (ResetSession, IsValid,
// Ping, CheckNamedValue, column types, further result sets, and the
// connector's Close), with database/sql's own answer where inner offers
// none; only a statement's deprecated ColumnConverter is not.
func Wrap(inner driver.Connector, h Hooks) driver.Connector {
	return &connector{inner: inner, h: h}
}

// Connector returns the connector of the driver registered as driverName
// for dsn: the driver's own when it is a driver.DriverContext, else one
// that opens dsn.
func Connector(driverName, dsn string) (driver.Connector, error) {
	// sql.Open is the only way to the registered driver; it connects to
	// nothing.
	db, err := sql.Open(driverName, dsn)
	if err != nil {
		return nil, err
	}
	drv := db.Driver()
	db.Close()
	if dc, ok := drv.(driver.DriverContext); ok {
		return dc.OpenConnector(dsn)
	}
	return dsnConnector{drv, dsn}, nil
}

type dsnConnector struct {
	drv driver.Driver
	dsn string
}

func (c dsnConnector) Connect(context.Context) (driver.Conn, error) { return c.drv.Open(c.dsn) }
func (c dsnConnector) Driver() driver.Driver                        { return c.drv }

type connector struct {
	inner driver.Connector
	h     Hooks
}

func (c *connector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &hookedConn{Conn: conn, h: &c.h}, nil
}

func (c *connector) Driver() driver.Driver { return c.inner.Driver() }

// Close closes inner if it has a Close: database/sql closes a connector
// that has, with its DB.
func (c *connector) Close() error {
	if cl, ok := c.inner.(io.Closer); ok {
		return cl.Close()
	}
	return nil
}

func (h *Hooks) before(ctx context.Context, c Call) time.Time {
	if h.Before != nil {
		h.Before(ctx, c)
	}
	return time.Now()
}

func (h *Hooks) after(ctx context.Context, c Call, err error, start time.Time) {
	if h.After != nil {
		h.After(ctx, c, err, time.Since(start))
	}
}

// rows wraps rows for RowsClosed, if set.
func (h *Hooks) rows(ctx context.Context, c Call, rows driver.Rows, start time.Time) driver.Rows {
	if h.RowsClosed == nil {
		return rows
	}
	return &hookedRows{Rows: rows, ctx: ctx, c: c, h: h, spent: time.Since(start)}
}

// hookedConn embeds the driver's connection for Close and the legacy
// Prepare and Begin, which database/sql does not call while the context
// variants are here.
type hookedConn struct {
	driver.Conn
	h *Hooks
}

func (c *hookedConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	qc, ok := c.Conn.(driver.QueryerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	call := Call{Kind: Query, SQL: query}
	start := c.h.before(ctx, call)
	rows, err := qc.QueryContext(ctx, query, args)
	c.h.after(ctx, call, err, start)
	if err != nil {
		return nil, err
	}
	return c.h.rows(ctx, call, rows, start), nil
}

func (c *hookedConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	ec, ok := c.Conn.(driver.ExecerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	call := Call{Kind: Exec, SQL: query}
	start := c.h.before(ctx, call)
	res, err := ec.ExecContext(ctx, query, args)
	c.h.after(ctx, call, err, start)
	return res, err
}

func (c *hookedConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	call := Call{Kind: Prepare, SQL: query}
	start := c.h.before(ctx, call)
	var st driver.Stmt
	var err error
	if pc, ok := c.Conn.(driver.ConnPrepareContext); ok {
		st, err = pc.PrepareContext(ctx, query)
	} else {
		st, err = c.Conn.Prepare(query)
	}
	c.h.after(ctx, call, err, start)
	if err != nil {
		return nil, err
	}
	return &hookedStmt{Stmt: st, query: query, conn: c.Conn, h: c.h}, nil
}

func (c *hookedConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	call := Call{Kind: Begin, TxOptions: opts}
	start := c.h.before(ctx, call)
	tx, err := c.beginTx(ctx, opts)
	c.h.after(ctx, call, err, start)
	if err != nil {
		return nil, err
	}
	return &hookedTx{tx: tx, h: c.h}, nil
}

// beginTx is database/sql's own way to a transaction.
func (c *hookedConn) beginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if bt, ok := c.Conn.(driver.ConnBeginTx); ok {
		return bt.BeginTx(ctx, opts)
	}
	if opts.ReadOnly {
		return nil, errors.New("connhook: the driver does not support read-only transactions")
	}
	if opts.Isolation != driver.IsolationLevel(sql.LevelDefault) {
		return nil, errors.New("connhook: the driver does not support non-default isolation levels")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return c.Conn.Begin()
}

func (c *hookedConn) CheckNamedValue(nv *driver.NamedValue) error {
	if nc, ok := c.Conn.(driver.NamedValueChecker); ok {
		return nc.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

func (c *hookedConn) ResetSession(ctx context.Context) error {
	if sr, ok := c.Conn.(driver.SessionResetter); ok {
		return sr.ResetSession(ctx)
	}
	return nil
}

func (c *hookedConn) IsValid() bool {
	if v, ok := c.Conn.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

func (c *hookedConn) Ping(ctx context.Context) error {
	if p, ok := c.Conn.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

type hookedTx struct {
	tx driver.Tx
	h  *Hooks
}

func (t *hookedTx) Commit() error   { return t.end(Commit, t.tx.Commit) }
func (t *hookedTx) Rollback() error { return t.end(Rollback, t.tx.Rollback) }

func (t *hookedTx) end(k Kind, f func() error) error {
	ctx, call := context.Background(), Call{Kind: k}
	start := t.h.before(ctx, call)
	err := f()
	t.h.after(ctx, call, err, start)
	return err
}

// hookedStmt embeds the driver's statement for NumInput and the legacy
// Exec and Query.
type hookedStmt struct {
	driver.Stmt
	query string
	conn  driver.Conn
	h     *Hooks
}

func (s *hookedStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	call := Call{Kind: StmtQuery, SQL: s.query}
	start := s.h.before(ctx, call)
	rows, err := s.queryContext(ctx, args)
	s.h.after(ctx, call, err, start)
	if err != nil {
		return nil, err
	}
	return s.h.rows(ctx, call, rows, start), nil
}

func (s *hookedStmt) queryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	if sq, ok := s.Stmt.(driver.StmtQueryContext); ok {
		return sq.QueryContext(ctx, args)
	}
	values, err := legacyValues(ctx, args)
	if err != nil {
		return nil, err
	}
	return s.Stmt.Query(values)
}

func (s *hookedStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	call := Call{Kind: StmtExec, SQL: s.query}
	start := s.h.before(ctx, call)
	res, err := s.execContext(ctx, args)
	s.h.after(ctx, call, err, start)
	return res, err
}

func (s *hookedStmt) execContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	if se, ok := s.Stmt.(driver.StmtExecContext); ok {
		return se.ExecContext(ctx, args)
	}
	values, err := legacyValues(ctx, args)
	if err != nil {
		return nil, err
	}
	return s.Stmt.Exec(values)
}

// legacyValues turns args into the values of a statement without the
// context variants, as database/sql does.
func legacyValues(ctx context.Context, args []driver.NamedValue) ([]driver.Value, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	values := make([]driver.Value, len(args))
	for i, a := range args {
		if a.Name != "" {
			return nil, errors.New("connhook: the driver does not support the use of Named Parameters")
		}
		values[i] = a.Value
	}
	return values, nil
}

func (s *hookedStmt) Close() error {
	ctx, call := context.Background(), Call{Kind: StmtClose, SQL: s.query}
	start := s.h.before(ctx, call)
	err := s.Stmt.Close()
	s.h.after(ctx, call, err, start)
	return err
}

// CheckNamedValue asks the statement, then its connection: database/sql
// asks only the statement once the statement has a checker, as this one
// always has.
func (s *hookedStmt) CheckNamedValue(nv *driver.NamedValue) error {
	if nc, ok := s.Stmt.(driver.NamedValueChecker); ok {
		return nc.CheckNamedValue(nv)
	}
	if nc, ok := s.conn.(driver.NamedValueChecker); ok {
		return nc.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

// hookedRows sums the time the driver spends on rows for RowsClosed.
type hookedRows struct {
	driver.Rows
	ctx   context.Context
	c     Call
	h     *Hooks
	spent time.Duration
}

func (r *hookedRows) Next(dest []driver.Value) error {
	start := time.Now()
	err := r.Rows.Next(dest)
	r.spent += time.Since(start)
	return err
}

func (r *hookedRows) Close() error {
	start := time.Now()
	err := r.Rows.Close()
	r.spent += time.Since(start)
	r.h.RowsClosed(r.ctx, r.c, r.spent)
	return err
}

// The optional interfaces of rows answer as database/sql does for rows
// without them.

func (r *hookedRows) HasNextResultSet() bool {
	if nr, ok := r.Rows.(driver.RowsNextResultSet); ok {
		return nr.HasNextResultSet()
	}
	return false
}

func (r *hookedRows) NextResultSet() error {
	nr, ok := r.Rows.(driver.RowsNextResultSet)
	if !ok {
		return io.EOF
	}
	start := time.Now()
	err := nr.NextResultSet()
	r.spent += time.Since(start)
	return err
}

func (r *hookedRows) ColumnTypeScanType(i int) reflect.Type {
	if ct, ok := r.Rows.(driver.RowsColumnTypeScanType); ok {
		return ct.ColumnTypeScanType(i)
	}
	return anyType
}

var anyType = reflect.TypeOf((*any)(nil)).Elem()

func (r *hookedRows) ColumnTypeDatabaseTypeName(i int) string {
	if ct, ok := r.Rows.(driver.RowsColumnTypeDatabaseTypeName); ok {
		return ct.ColumnTypeDatabaseTypeName(i)
	}
	return ""
}

func (r *hookedRows) ColumnTypeLength(i int) (int64, bool) {
	if ct, ok := r.Rows.(driver.RowsColumnTypeLength); ok {
		return ct.ColumnTypeLength(i)
	}
	return 0, false
}

func (r *hookedRows) ColumnTypeNullable(i int) (nullable, ok bool) {
	if ct, ok := r.Rows.(driver.RowsColumnTypeNullable); ok {
		return ct.ColumnTypeNullable(i)
	}
	return false, false
}

func (r *hookedRows) ColumnTypePrecisionScale(i int) (precision, scale int64, ok bool) {
	if ct, ok := r.Rows.(driver.RowsColumnTypePrecisionScale); ok {
		return ct.ColumnTypePrecisionScale(i)
	}
	return 0, 0, false
}
