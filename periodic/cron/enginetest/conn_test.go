package enginetest

import (
	"context"
	"database/sql/driver"
	"errors"
	"sync"
)

// hookFunc is told of each call of a pool before it reaches the driver:
// "begin", "commit", "rollback", "exec" or "query", with the statement's
// text for the last two. An error it returns is the call's, and the call
// does not reach the driver (a commit's transaction is rolled back instead,
// as a process dying before its COMMIT would leave it); it may block.
type hookFunc func(call, query string) error

// counter records the calls of one pool: the statements it sent, whether
// as text or prepared (a prepare and its close are not counted: with
// go-sql-driver/mysql they wrap every statement with parameters).
type counter struct {
	hook  hookFunc
	mu    sync.Mutex
	calls []string
}

func (c *counter) add(call, query string) error {
	if c.hook != nil {
		if err := c.hook(call, query); err != nil {
			return err
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if query != "" {
		call += " " + query
	}
	c.calls = append(c.calls, call)
	return nil
}

// sent returns how many calls were counted.
func (c *counter) sent() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.calls)
}

// since returns the calls from the n-th on.
func (c *counter) since(n int) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.calls[n:]...)
}

// connector opens connections of a driver through wrappers that count.
type connector struct {
	d   driver.Driver
	dsn string
	c   *counter
}

func (k *connector) Connect(context.Context) (driver.Conn, error) {
	conn, err := k.d.Open(k.dsn)
	if err != nil {
		return nil, err
	}
	return &wconn{Conn: conn, c: k.c}, nil
}

func (k *connector) Driver() driver.Driver { return k.d }

// wconn passes every call on to the driver's connection, counting the
// statements.
type wconn struct {
	driver.Conn
	c *counter
}

var (
	_ driver.ConnBeginTx        = (*wconn)(nil)
	_ driver.ExecerContext      = (*wconn)(nil)
	_ driver.QueryerContext     = (*wconn)(nil)
	_ driver.ConnPrepareContext = (*wconn)(nil)
	_ driver.NamedValueChecker  = (*wconn)(nil)
	_ driver.SessionResetter    = (*wconn)(nil)
	_ driver.Validator          = (*wconn)(nil)
)

func (w *wconn) Prepare(q string) (driver.Stmt, error) {
	return w.PrepareContext(context.Background(), q)
}

func (w *wconn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	var st driver.Stmt
	var err error
	if p, ok := w.Conn.(driver.ConnPrepareContext); ok {
		st, err = p.PrepareContext(ctx, q)
	} else {
		st, err = w.Conn.Prepare(q)
	}
	if err != nil {
		return nil, err
	}
	return &wstmt{Stmt: st, c: w.c, q: q}, nil
}

func (w *wconn) Begin() (driver.Tx, error) {
	return w.BeginTx(context.Background(), driver.TxOptions{})
}

func (w *wconn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if err := w.c.add("begin", ""); err != nil {
		return nil, err
	}
	var tx driver.Tx
	var err error
	if b, ok := w.Conn.(driver.ConnBeginTx); ok {
		tx, err = b.BeginTx(ctx, opts)
	} else {
		tx, err = w.Conn.Begin()
	}
	if err != nil {
		return nil, err
	}
	return &wtx{Tx: tx, c: w.c}, nil
}

func (w *wconn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	e, ok := w.Conn.(driver.ExecerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	if err := w.c.hookOnly("exec", q); err != nil {
		return nil, err
	}
	res, err := e.ExecContext(ctx, q, args)
	if !errors.Is(err, driver.ErrSkip) {
		w.c.record("exec", q)
	}
	return res, err
}

func (w *wconn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	e, ok := w.Conn.(driver.QueryerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	if err := w.c.hookOnly("query", q); err != nil {
		return nil, err
	}
	rows, err := e.QueryContext(ctx, q, args)
	if !errors.Is(err, driver.ErrSkip) {
		w.c.record("query", q)
	}
	return rows, err
}

func (w *wconn) CheckNamedValue(nv *driver.NamedValue) error {
	if c, ok := w.Conn.(driver.NamedValueChecker); ok {
		return c.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

func (w *wconn) ResetSession(ctx context.Context) error {
	if r, ok := w.Conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (w *wconn) IsValid() bool {
	if v, ok := w.Conn.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

// hookOnly runs the hook of a statement that may yet be skipped by the
// driver (driver.ErrSkip), which then comes back prepared: the hook sees
// it once, and it is counted where it runs.
func (c *counter) hookOnly(call, query string) error {
	if c.hook != nil {
		return c.hook(call, query)
	}
	return nil
}

func (c *counter) record(call, query string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, call+" "+query)
}

// wstmt counts the runs of a prepared statement.
type wstmt struct {
	driver.Stmt
	c *counter
	q string
}

func (s *wstmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	s.c.record("exec", s.q)
	if e, ok := s.Stmt.(driver.StmtExecContext); ok {
		return e.ExecContext(ctx, args)
	}
	return nil, errors.New("enginetest: the driver's statement has no ExecContext")
}

func (s *wstmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	s.c.record("query", s.q)
	if e, ok := s.Stmt.(driver.StmtQueryContext); ok {
		return e.QueryContext(ctx, args)
	}
	return nil, errors.New("enginetest: the driver's statement has no QueryContext")
}

func (s *wstmt) CheckNamedValue(nv *driver.NamedValue) error {
	if c, ok := s.Stmt.(driver.NamedValueChecker); ok {
		return c.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

// wtx counts a transaction's end; a hook's error on commit rolls it back.
type wtx struct {
	driver.Tx
	c *counter
}

func (t *wtx) Commit() error {
	if err := t.c.add("commit", ""); err != nil {
		_ = t.Tx.Rollback()
		return err
	}
	return t.Tx.Commit()
}

func (t *wtx) Rollback() error {
	_ = t.c.add("rollback", "")
	return t.Tx.Rollback()
}
