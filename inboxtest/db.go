package inboxtest

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqlinbox/inbox"
)

// NewDB returns a go-sqlmock database for the queue under test, matching
// exactly and in order as [New] needs, and its sqlmock, both closed when the
// test ends. It is sqlmock's own, with what the code under test sends
// recorded on its way, so that the first call the expectations do not match
// fails the test (t.Errorf) in the package's terms rather than in sqlmock's
// words about SQL:
//
//	inboxtest: expected Ack of job 7, got Retry(after 2s)
//
// followed by the calls sent and sqlmock's error; the call returns the
// first line as its error. Where that call only prepares the next (a begin,
// a prepare, a read of the engine's clock), the database answers it as the
// helper's stand-in would, so that the code under test goes on to the
// statement that tells what it does (the Retry and its delay). From then on
// every call fails, a rollback aside. The sqlmock's ExpectationsWereMet,
// and [Mock.ExpectationsWereMet], name an expectation left unmet the same
// way: "expected Ack of job 7, got no further call".
//
// The words come from the [Mock] made with New on this sqlmock; the test's
// own expectations (mock.ExpectExec for what the worker writes through
// Delivery.Tx) are named by their SQL. With MatchExpectationsInOrder(false)
// the database passes sqlmock's words on.
func NewDB(t testing.TB) (*sql.DB, sqlmock.Sqlmock) {
	t.Helper()
	dsn := fmt.Sprintf("inboxtest_db_%d", dbSeq.Add(1))
	raw, sm, err := sqlmock.NewWithDSN(dsn, sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
	if err != nil {
		t.Fatalf("inboxtest: new db: %v", err)
	}
	r := &tap{t: t, raw: sm}
	db := sql.OpenDB(&tapConnector{r: r, drv: raw.Driver(), dsn: dsn})
	t.Cleanup(func() {
		r.mu.Lock()
		r.closed = true // the test is over: t takes no more errors
		r.mu.Unlock()
		db.Close()
		raw.Close()
	})
	return db, &tapMock{Sqlmock: sm, r: r}
}

var dbSeq atomic.Int64

// tapMock is NewDB's sqlmock: each expectation set on it is noted, in the
// order sqlmock keeps them, with the expectation of the Mock it is part of.
type tapMock struct {
	sqlmock.Sqlmock
	r *tap
}

// noted sets an expectation by expect and notes it as what, under the
// tap's lock so that the note keeps sqlmock's order.
func noted[E fmt.Stringer](m *tapMock, what string, expect func() E) E {
	m.r.mu.Lock()
	defer m.r.mu.Unlock()
	e := expect()
	m.r.note(e, what)
	return e
}

func (m *tapMock) ExpectQuery(q string) *sqlmock.ExpectedQuery {
	return noted(m, "ExpectQuery("+q+")", func() *sqlmock.ExpectedQuery { return m.Sqlmock.ExpectQuery(q) })
}

func (m *tapMock) ExpectExec(q string) *sqlmock.ExpectedExec {
	return noted(m, "ExpectExec("+q+")", func() *sqlmock.ExpectedExec { return m.Sqlmock.ExpectExec(q) })
}

func (m *tapMock) ExpectPrepare(q string) *sqlmock.ExpectedPrepare {
	return noted(m, "ExpectPrepare("+q+")", func() *sqlmock.ExpectedPrepare { return m.Sqlmock.ExpectPrepare(q) })
}

func (m *tapMock) ExpectBegin() *sqlmock.ExpectedBegin {
	return noted(m, "ExpectBegin()", m.Sqlmock.ExpectBegin)
}

func (m *tapMock) ExpectCommit() *sqlmock.ExpectedCommit {
	return noted(m, "ExpectCommit()", m.Sqlmock.ExpectCommit)
}

func (m *tapMock) ExpectRollback() *sqlmock.ExpectedRollback {
	return noted(m, "ExpectRollback()", m.Sqlmock.ExpectRollback)
}

func (m *tapMock) ExpectClose() *sqlmock.ExpectedClose {
	m.r.mu.Lock()
	defer m.r.mu.Unlock()
	e := m.Sqlmock.ExpectClose()
	m.r.note(e, "ExpectClose()")
	m.r.entries[len(m.r.entries)-1].close = true
	return e
}

func (m *tapMock) MatchExpectationsInOrder(b bool) {
	m.r.mu.Lock()
	defer m.r.mu.Unlock()
	m.r.unordered = !b
	m.Sqlmock.MatchExpectationsInOrder(b)
}

func (m *tapMock) ExpectationsWereMet() error { return m.r.met() }

// entry is one expectation on the sqlmock, in sqlmock's order.
type entry struct {
	exp   fmt.Stringer
	g     *group // the Mock's expectation it is part of; nil: the test's own
	own   string // the test's own: "ExpectExec(INSERT …)"
	close bool
}

type tapState int

const (
	matching  tapState = iota // every call goes to the sqlmock
	diverging                 // a call missed; the tap answers what prepares the next
	failed                    // the mismatch is reported; every call fails
)

// tap passes the calls of NewDB's database to its sqlmock, and, at the
// first one its expectations do not match, says in the package's terms
// what was expected and what was sent.
type tap struct {
	t   testing.TB
	raw sqlmock.Sqlmock

	mu        sync.Mutex
	entries   []entry
	done      int // the entries met: sqlmock meets them in order
	group     *group
	mocks     []*Mock
	stand     *standIn // answers past the first mismatch
	unordered bool
	state     tapState
	first     *sent     // the first call off the expectations
	firstErr  error     // sqlmock's error for it
	next      *entry    // the expectation it missed, nil for none
	report    string    // what fail told t
	lastNow   time.Time // the engine's clock as last read
	closed    bool
}

// note adds an expectation just set on the sqlmock.
func (r *tap) note(e fmt.Stringer, own string) {
	en := entry{exp: e, g: r.group}
	if r.group == nil {
		en.own = own
	}
	r.entries = append(r.entries, en)
}

func (r *tap) setGroup(g *group) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.group = g
}

// attach takes the statements of a Mock made on the database's sqlmock.
func (r *tap) attach(m *Mock, cfg inbox.Config) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mocks = append(r.mocks, m)
	if r.stand != nil {
		return
	}
	s, err := newStandIn(cfg)
	if err != nil {
		return
	}
	s.learn(m.q)
	s.op, s.quiet = opSettle, true
	r.stand = s
}

// name finds what s is, from the statements of the Mocks on the database.
func (r *tap) name(s *sent) {
	for _, m := range r.mocks {
		switch {
		case m.db.identSQL[s.sql]:
			s.m, s.dialect = m, "identity"
		case m.db.lockSQL[s.sql]:
			s.m, s.dialect = m, "lock"
		case m.db.unlockSQL[s.sql]:
			s.m, s.dialect = m, "unlock"
		}
		if k := m.db.known[s.sql]; k != nil {
			s.m, s.k = m, k
		}
		if s.m != nil {
			return
		}
	}
}

// mismatch reports whether err is sqlmock's for a call its next
// expectation does not match (rather than an error it was told to return).
func mismatch(err error) bool {
	t := err.Error()
	for _, p := range []string{"call to ", "all expectations were already fulfilled", "Query: ", "ExecQuery: ", "Prepare: "} {
		if strings.HasPrefix(t, p) {
			return true
		}
	}
	return strings.Contains(t, ", arguments do not match: ")
}

const nextPrefix = "next expectation is: "

// missed returns the expectation sqlmock's error err says the call missed:
// the first not met, checked against sqlmock's words.
func (r *tap) missed(err error) *entry {
	t := err.Error()
	if strings.HasPrefix(t, "all expectations were already fulfilled") {
		return nil
	}
	want := ""
	if i := strings.Index(t, nextPrefix); i >= 0 {
		want = t[i+len(nextPrefix):]
	} else if i := strings.Index(t, unmetPrefix); i >= 0 {
		want = t[i+len(unmetPrefix):]
	}
	if r.done < len(r.entries) && (want == "" || r.entries[r.done].exp.String() == want) {
		return &r.entries[r.done]
	}
	// An expectation set on the sqlmock past NewDB's (ExpectPrepare's
	// ExpectQuery) moved the count: find it by sqlmock's words, after the
	// count, else before it.
	for i := r.done; i < len(r.entries); i++ {
		if r.entries[i].exp.String() == want {
			return &r.entries[i]
		}
	}
	for i := min(r.done, len(r.entries)) - 1; i >= 0; i-- {
		if r.entries[i].exp.String() == want {
			return &r.entries[i]
		}
	}
	return &entry{own: strings.SplitN(want, "\n", 2)[0]}
}

// call runs one call of the code under test: on the sqlmock while its
// expectations match, else as the state says. local answers it as the
// stand-in would, nil where it cannot.
func (r *tap) call(s *sent, forward func() (any, error), local func() (any, error)) (any, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.name(s)
	if r.unordered {
		return forward()
	}
	switch r.state {
	case diverging:
		return r.diverge(s, local)
	case failed:
		return nil, r.after(s)
	}
	v, err := forward()
	if err == nil || !mismatch(err) {
		if r.done < len(r.entries) {
			r.done++
		}
		return v, err
	}
	r.first, r.firstErr, r.next = s, err, r.missed(err)
	return r.diverge(s, local)
}

// diverge answers a call past the first mismatch: itself while the calls
// only prepare what comes next, else with the report.
func (r *tap) diverge(s *sent, local func() (any, error)) (any, error) {
	if s.preamble() && local != nil && r.stand != nil {
		r.state = diverging
		return local()
	}
	r.fail(s)
	return nil, r.short()
}

// short is the report's first line, as an error: what the calls return.
func (r *tap) short() error {
	return errors.New(strings.SplitN(r.report, "\n", 2)[0])
}

// fail reports the mismatch, s being the call that tells what the code
// under test did.
func (r *tap) fail(s *sent) {
	r.state = failed
	r.report = r.words(s)
	if r.t != nil && !r.closed {
		r.t.Errorf("%s", r.report)
	}
}

// words are the report: what was expected, what was done instead, then the
// calls and sqlmock's words.
func (r *tap) words(s *sent) string {
	expected, eid := "nothing more", any(nil)
	switch {
	case r.next == nil:
	case r.next.g != nil:
		expected, eid = r.next.g.what, r.next.g.id
	default:
		expected = "the test's own " + r.next.own
	}
	// The call that went off, with the details its last call tells.
	at := s
	if r.first.api != "" && s.api != r.first.api {
		at = r.first
	}
	got, id := r.what(at)
	if id != nil && !sameID(id, eid) {
		got += fmt.Sprintf(" of job %v", id)
	}
	b := fmt.Sprintf("inboxtest: expected %s, got %s", expected, got)
	if r.next != nil && r.next.g != nil && strings.HasPrefix(expected, got) {
		b += " with other arguments"
		if at.m != nil && at.m.now != nil {
			b += " (did the Config.Now clock move between the expectation and the call?)"
		}
	}
	b += "\n\tsent: " + s.line()
	if r.first != s {
		b += "\n\tfirst call off the expectations: " + r.first.line()
	}
	return b + "\n\tsqlmock: " + r.firstErr.Error()
}

// after is the error of a call past the reported mismatch: the report's
// first line, then the call.
func (r *tap) after(s *sent) error {
	r.name(s)
	call := s.kind
	switch {
	case s.k != nil:
		call += " " + s.k.names[0]
	case s.dialect != "":
		call += " " + s.dialect
	case s.sql != "":
		call += " " + s.sql
	}
	return fmt.Errorf("%s (no call is answered past it: %s)", strings.SplitN(r.report, "\n", 2)[0], call)
}

// met is ExpectationsWereMet in the package's terms.
func (r *tap) met() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state == diverging {
		// The call went no further than what it prepared.
		r.fail(r.first)
	}
	if r.state == failed {
		return r.short()
	}
	err := r.raw.ExpectationsWereMet()
	if err == nil || r.unordered || !strings.HasPrefix(err.Error(), unmetPrefix) {
		return err
	}
	e := r.missed(err)
	what := "the test's own " + e.own
	if e.g != nil {
		what = e.g.what
	}
	return fmt.Errorf("inboxtest: expected %s, got no further call\n\tsqlmock: %w", what, err)
}

// setNow notes a reading of the engine's clock the code under test got.
func (r *tap) setNow(s *sent, v driver.Value) {
	if s.m == nil {
		return
	}
	if t, err := s.m.db.d.ScanTime(v); err == nil {
		r.mu.Lock()
		r.lastNow = t
		r.mu.Unlock()
	}
}

type tapConnector struct {
	r   *tap
	drv driver.Driver
	dsn string
}

func (c *tapConnector) Connect(context.Context) (driver.Conn, error) {
	conn, err := c.drv.Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return &tapConn{r: c.r, c: conn}, nil
}

func (c *tapConnector) Driver() driver.Driver { return c.drv }

// tapConn is a connection of NewDB's database: sqlmock's, recorded.
type tapConn struct {
	r    *tap
	c    driver.Conn
	inTx bool
	held any // the job the last claim on the connection returned
}

func (c *tapConn) sent(kind, query string, args []driver.NamedValue) *sent {
	s := &sent{kind: kind, sql: query, api: apiCall(), held: c.held}
	for _, a := range args {
		s.args = append(s.args, a.Value)
	}
	return s
}

// standIn answers a call as the stand-in would.
func (c *tapConn) standIn(kind, query string, args []driver.NamedValue) (call, error) {
	a := c.r.stand.respond(&sconn{s: c.r.stand, inTx: c.inTx}, kind, query, args)
	return a, a.err
}

func (c *tapConn) CheckNamedValue(nv *driver.NamedValue) error {
	if ch, ok := c.c.(driver.NamedValueChecker); ok {
		return ch.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

func (c *tapConn) Close() error {
	err := c.c.Close()
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	if err == nil && c.r.state == matching && c.r.done < len(c.r.entries) && c.r.entries[c.r.done].close {
		c.r.done++
	}
	return err
}

func (c *tapConn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

func (c *tapConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	v, err := c.r.call(c.sent("prepare", query, nil),
		func() (any, error) { return ctxPrepare(ctx, c.c, query) },
		func() (any, error) { return &tapStmt{c: c, query: query}, nil })
	if err != nil {
		return nil, err
	}
	if st, ok := v.(*tapStmt); ok {
		return st, nil
	}
	return &tapStmt{c: c, query: query, st: v.(driver.Stmt)}, nil
}

func (c *tapConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *tapConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	v, err := c.r.call(c.sent("begin", "", nil),
		func() (any, error) {
			if b, ok := c.c.(driver.ConnBeginTx); ok {
				return b.BeginTx(ctx, opts)
			}
			return c.c.Begin() //nolint:staticcheck // the driver's only way
		},
		func() (any, error) { return nil, nil })
	if err != nil {
		return nil, err
	}
	c.inTx = true
	tx, _ := v.(driver.Tx) // nil: begun by the tap
	return &tapTx{c: c, tx: tx}, nil
}

func (c *tapConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	return c.query(ctx, nil, query, args)
}

func (c *tapConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	return c.exec(ctx, nil, query, args)
}

// query runs a query, through st when it was prepared on the sqlmock.
func (c *tapConn) query(ctx context.Context, st driver.Stmt, query string, args []driver.NamedValue) (driver.Rows, error) {
	s := c.sent("query", query, args)
	v, err := c.r.call(s,
		func() (any, error) {
			if st != nil {
				return ctxStmtQuery(ctx, st, args)
			}
			return c.c.(driver.QueryerContext).QueryContext(ctx, query, args)
		},
		func() (any, error) {
			a, err := c.standIn("query", query, args)
			if err != nil {
				return nil, err
			}
			return &rows{cols: a.cols, vals: a.rows}, nil
		})
	if err != nil {
		return nil, err
	}
	return &tapRows{Rows: v.(driver.Rows), c: c, s: s}, nil
}

func (c *tapConn) exec(ctx context.Context, st driver.Stmt, query string, args []driver.NamedValue) (driver.Result, error) {
	v, err := c.r.call(c.sent("exec", query, args),
		func() (any, error) {
			if st != nil {
				return ctxStmtExec(ctx, st, args)
			}
			return c.c.(driver.ExecerContext).ExecContext(ctx, query, args)
		},
		func() (any, error) {
			a, err := c.standIn("exec", query, args)
			if err != nil {
				return nil, err
			}
			return driver.RowsAffected(a.affected), nil
		})
	if err != nil {
		return nil, err
	}
	return v.(driver.Result), nil
}

type tapTx struct {
	c  *tapConn
	tx driver.Tx // nil: begun by the tap
}

func (t *tapTx) Commit() error   { return t.end("commit") }
func (t *tapTx) Rollback() error { return t.end("rollback") }

func (t *tapTx) end(kind string) error {
	c, r := t.c, t.c.r
	defer func() { c.inTx = false }()
	s := c.sent(kind, "", nil)
	if kind == "rollback" && (t.tx == nil || r.stateNow() != matching) {
		// Past the mismatch: nothing to undo that the test could see.
		return nil
	}
	if t.tx == nil {
		// A commit of a transaction the tap began.
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.state == diverging {
			r.fail(s)
			return r.short()
		}
		return r.after(s)
	}
	_, err := r.call(s, func() (any, error) {
		if kind == "commit" {
			return nil, t.tx.Commit()
		}
		return nil, t.tx.Rollback()
	}, nil)
	return err
}

func (r *tap) stateNow() tapState {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state
}

// tapStmt is a statement prepared on NewDB's database: on the sqlmock (st),
// or, past the first mismatch, by the tap.
type tapStmt struct {
	c     *tapConn
	query string
	st    driver.Stmt
}

func (s *tapStmt) Close() error {
	if s.st != nil {
		return s.st.Close()
	}
	return nil
}

func (s *tapStmt) NumInput() int { return -1 }

func (s *tapStmt) Exec(args []driver.Value) (driver.Result, error) {
	return s.ExecContext(context.Background(), named(args))
}

func (s *tapStmt) Query(args []driver.Value) (driver.Rows, error) {
	return s.QueryContext(context.Background(), named(args))
}

func (s *tapStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	if s.st == nil {
		return s.c.exec(ctx, nil, s.query, args)
	}
	return s.c.exec(ctx, s.st, s.query, args)
}

func (s *tapStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	if s.st == nil {
		return s.c.query(ctx, nil, s.query, args)
	}
	return s.c.query(ctx, s.st, s.query, args)
}

// tapRows notes, from the rows the code under test reads, the engine's
// clock and the job a claim gave the connection.
type tapRows struct {
	driver.Rows
	c    *tapConn
	s    *sent
	read bool
}

func (r *tapRows) Next(dest []driver.Value) error {
	if err := r.Rows.Next(dest); err != nil {
		return err
	}
	if !r.read && len(dest) > 0 {
		r.read = true
		switch {
		case r.s.is("Now"):
			r.c.r.setNow(r.s, dest[0])
		case r.s.is("Claim.Take", "Claim.TakeOne", "Claim.Select", "Claim.SelectFree", "Claim.SelectFreeOne", "Claim.PickLock", "Claim.PickFirst", "Claim.WalkFirst", "Claim.WalkTake"):
			if id, err := normID(dest[0]); err == nil {
				r.c.held = id
			}
		}
	}
	return nil
}

func (r *tapRows) HasNextResultSet() bool {
	n, ok := r.Rows.(driver.RowsNextResultSet)
	return ok && n.HasNextResultSet()
}

func (r *tapRows) NextResultSet() error {
	if n, ok := r.Rows.(driver.RowsNextResultSet); ok {
		return n.NextResultSet()
	}
	return io.EOF
}

func ctxPrepare(ctx context.Context, c driver.Conn, query string) (driver.Stmt, error) {
	if p, ok := c.(driver.ConnPrepareContext); ok {
		return p.PrepareContext(ctx, query)
	}
	return c.Prepare(query)
}

func ctxStmtQuery(ctx context.Context, st driver.Stmt, args []driver.NamedValue) (driver.Rows, error) {
	if q, ok := st.(driver.StmtQueryContext); ok {
		return q.QueryContext(ctx, args)
	}
	vals := make([]driver.Value, len(args))
	for i, a := range args {
		vals[i] = a.Value
	}
	return st.Query(vals) //nolint:staticcheck // the driver's only way
}

func ctxStmtExec(ctx context.Context, st driver.Stmt, args []driver.NamedValue) (driver.Result, error) {
	if e, ok := st.(driver.StmtExecContext); ok {
		return e.ExecContext(ctx, args)
	}
	vals := make([]driver.Value, len(args))
	for i, a := range args {
		vals[i] = a.Value
	}
	return st.Exec(vals) //nolint:staticcheck // the driver's only way
}
