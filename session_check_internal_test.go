package inbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
)

// The session check (checkSessions) against a fake pooler that hands out
// server sessions as PgBouncer does: per client connection (a direct
// connection, or session pooling), or per transaction, taking the idle
// server session used last first (PgBouncer's default) or the oldest
// (server_round_robin), keeping prepared statements with the session (before
// PgBouncer 1.21) or with the client (max_prepared_statements). dbtest/pgbouncer
// runs the check through a real PgBouncer 1.18.

type poolMode int

func (m poolMode) String() string {
	return [...]string{"a session per connection", "a session per transaction"}[m]
}

const (
	perConnection poolMode = iota
	perTransaction
)

// pooler is the fake server side: its sessions and the pooler's rules.
type pooler struct {
	mode       poolMode
	roundRobin bool // idle sessions oldest first
	keeps      bool // prepared statements follow the client (1.21+)
	version    string
	failFirst  bool // the first statement of the check fails (a look-alike)

	mu      sync.Mutex
	idle    []*backend
	nextPid int64
	sent    []string
}

type backend struct {
	pid      int64
	prepared map[string]bool
}

// take hands a session to a client: an idle one in the pooler's order, or a
// new one.
func (p *pooler) take() *backend {
	if len(p.idle) > 0 {
		b := p.idle[0]
		p.idle = p.idle[1:]
		return b
	}
	p.nextPid++
	return &backend{pid: 100 + p.nextPid, prepared: map[string]bool{}}
}

// give returns a session to the idle list: first unless round robin.
func (p *pooler) give(b *backend) {
	if p.roundRobin {
		p.idle = append(p.idle, b)
	} else {
		p.idle = append([]*backend{b}, p.idle...)
	}
}

// warm opens n idle sessions, as a pooler that served others has.
func (p *pooler) warm(n int) {
	for i := 0; i < n; i++ {
		p.nextPid++
		p.idle = append(p.idle, &backend{pid: 100 + p.nextPid, prepared: map[string]bool{}})
	}
}

func (p *pooler) Connect(context.Context) (driver.Conn, error) { return &poolConn{p: p}, nil }
func (p *pooler) Driver() driver.Driver                        { return nil }

// poolConn is one client connection.
type poolConn struct {
	p      *pooler
	own    *backend // per connection: its session, once used
	pinned *backend // in a transaction
	names  int
}

type pgError string

func (e pgError) Error() string {
	return "ERROR: " + string(e)[6:] + " (SQLSTATE " + string(e)[:5] + ")"
}
func (e pgError) SQLState() string { return string(e)[:5] }

// use runs f in the session the statement gets, under the pooler's lock.
func (c *poolConn) use(f func(b *backend) error) error {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	switch {
	case c.pinned != nil:
		return f(c.pinned)
	case c.p.mode == perConnection:
		if c.own == nil {
			c.own = c.p.take()
		}
		return f(c.own)
	}
	b := c.p.take()
	defer c.p.give(b)
	return f(b)
}

func (c *poolConn) QueryContext(_ context.Context, query string, _ []driver.NamedValue) (driver.Rows, error) {
	c.p.mu.Lock()
	c.p.sent = append(c.p.sent, query)
	fail := c.p.failFirst && query == pgSessionFirst
	c.p.mu.Unlock()
	if fail {
		return nil, pgError("42883 function pg_catalog.pg_backend_pid() does not exist")
	}
	var r *fakeRows
	err := c.use(func(b *backend) error {
		switch query {
		case pgProbe: // the dialect's own check
			r = result([]driver.Value{c.p.version})
		case pgColumns:
			r = result([]driver.Value{"id", "bigint"}, []driver.Value{"attempt", "integer"},
				[]driver.Value{"payload", "bytea"}, []driver.Value{"locked_until", "timestamp with time zone"})
		case pgSessionFirst:
			r = result([]driver.Value{c.p.version, b.pid, "2026-12-01 00:00:00+00"})
		case pgSession:
			r = result([]driver.Value{b.pid, "2026-12-01 00:00:00+00"})
		default:
			return fmt.Errorf("unexpected query %q", query)
		}
		return nil
	})
	return r, err
}

func (c *poolConn) PrepareContext(_ context.Context, query string) (driver.Stmt, error) {
	c.names++
	s := &poolStmt{c: c, name: fmt.Sprint(c.names), query: query}
	err := c.use(func(b *backend) error {
		if b.prepared[s.name] {
			return pgError(`42P05 prepared statement "` + s.name + `" already exists`)
		}
		b.prepared[s.name] = true
		return nil
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (c *poolConn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

func (c *poolConn) BeginTx(context.Context, driver.TxOptions) (driver.Tx, error) {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	c.p.sent = append(c.p.sent, "BEGIN")
	if c.p.mode == perTransaction {
		c.pinned = c.p.take()
	}
	return poolTx{c}, nil
}

func (c *poolConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *poolConn) Close() error {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	if c.own != nil {
		c.p.give(c.own)
	}
	return nil
}

type poolTx struct{ c *poolConn }

func (t poolTx) end() error {
	t.c.p.mu.Lock()
	defer t.c.p.mu.Unlock()
	if t.c.pinned != nil {
		t.c.p.give(t.c.pinned)
		t.c.pinned = nil
	}
	return nil
}
func (t poolTx) Commit() error   { return t.end() }
func (t poolTx) Rollback() error { return t.end() }

// poolStmt is a statement prepared on a client connection under a name.
type poolStmt struct {
	c           *poolConn
	name, query string
}

func (s *poolStmt) NumInput() int { return 0 }
func (s *poolStmt) Close() error {
	return s.c.use(func(b *backend) error { delete(b.prepared, s.name); return nil })
}
func (s *poolStmt) Exec([]driver.Value) (driver.Result, error) { return nil, errors.New("not used") }
func (s *poolStmt) Query([]driver.Value) (driver.Rows, error) {
	return s.QueryContext(context.Background(), nil)
}

func (s *poolStmt) QueryContext(context.Context, []driver.NamedValue) (driver.Rows, error) {
	var r *fakeRows
	err := s.c.use(func(b *backend) error {
		if !b.prepared[s.name] {
			if !s.c.p.keeps {
				return pgError(`26000 prepared statement "` + s.name + `" does not exist`)
			}
			b.prepared[s.name] = true // the pooler prepares it where it runs
		}
		r = result([]driver.Value{b.pid, "2026-12-01 00:00:00+00"})
		return nil
	})
	return r, err
}

// fakeRows is a result.
type fakeRows struct{ rows [][]driver.Value }

func result(rows ...[]driver.Value) *fakeRows { return &fakeRows{rows} }

func (r *fakeRows) Columns() []string { return make([]string, len(r.rows[0])) }
func (r *fakeRows) Close() error      { return nil }
func (r *fakeRows) Next(dest []driver.Value) error {
	if len(r.rows) == 0 {
		return io.EOF
	}
	copy(dest, r.rows[0])
	r.rows = r.rows[1:]
	return nil
}

const pg15Version = "PostgreSQL 15.20 (Debian 15.20-0+deb12u1) on x86_64-pc-linux-gnu"

// sessionQueue returns a queue of form on a pool of conns connections
// through p.
func sessionQueue(t *testing.T, p *pooler, tb Table, prepare bool, conns int) *Queue {
	t.Helper()
	if p.version == "" {
		p.version = pg15Version
	}
	db := sql.OpenDB(p)
	db.SetMaxOpenConns(conns)
	t.Cleanup(func() { db.Close() })
	q, err := New(db, Config{Dialect: Postgres, Table: tb, Prepare: prepare})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

var (
	advisoryJobs = Table{Name: "jobs", AdvisoryKey: "id"}
	leaseJobs    = Table{Name: "jobs", LockedUntil: "locked_until"}
	rowLockJobs  = Table{Name: "jobs"}
)

func hasAll(t *testing.T, problem string, words ...string) {
	t.Helper()
	for _, w := range words {
		if !strings.Contains(problem, w) {
			t.Errorf("problem %q does not name %q", problem, w)
		}
	}
}

// A session per connection (directly, or through session pooling with
// sessions other clients left idle) is never refused, whichever order the
// pooler keeps: two live connections never share a session, nor does one
// connection's statements run in two.
func TestSessionCheckPerConnection(t *testing.T) {
	for _, rr := range []bool{false, true} {
		for _, warm := range []int{0, 1, 3} {
			for _, tb := range []Table{advisoryJobs, leaseJobs} {
				p := &pooler{mode: perConnection, roundRobin: rr}
				p.warm(warm)
				q := sessionQueue(t, p, tb, true, 4)
				found, err := q.checkSessions(context.Background(), postgres{})
				if err != nil || len(found) > 0 {
					t.Errorf("round robin %v, %d idle, %s form: %q, %v; want no problem", rr, warm, q.Form(), found, err)
				}
			}
		}
	}
}

// Through transaction pooling the advisory form is refused, and so is
// Config.Prepare where prepared statements stay with the server session
// (PgBouncer before 1.21), in either order and however many sessions are
// idle, when no other client interleaves; the lease and the row lock are
// not probed at all without Config.Prepare.
func TestSessionCheckPerTransaction(t *testing.T) {
	for _, rr := range []bool{false, true} {
		for _, warm := range []int{0, 1, 2, 5} {
			name := fmt.Sprintf("roundrobin=%v/idle=%d", rr, warm)
			t.Run(name+"/advisory", func(t *testing.T) {
				p := &pooler{mode: perTransaction, roundRobin: rr}
				p.warm(warm)
				found, err := sessionQueue(t, p, advisoryJobs, false, 4).checkSessions(context.Background(), postgres{})
				if err != nil || len(found) != 1 {
					t.Fatalf("%q, %v; want one problem", found, err)
				}
				hasAll(t, found[0], "do not each keep one server session", "transaction pooler", "pool_mode = session",
					"lease form (Table.LockedUntil)", "row lock")
			})
			t.Run(name+"/prepare", func(t *testing.T) {
				for _, tb := range []Table{leaseJobs, rowLockJobs, advisoryJobs} {
					p := &pooler{mode: perTransaction, roundRobin: rr}
					p.warm(warm)
					found, err := sessionQueue(t, p, tb, true, 4).checkSessions(context.Background(), postgres{})
					want := 1
					if tb.AdvisoryKey != "" {
						want = 2
					}
					if err != nil || len(found) != want {
						t.Fatalf("%s: %q, %v; want %d problems", tb.Name, found, err, want)
					}
					hasAll(t, found[want-1], "Config.Prepare", "failed when it ran again", "SQLSTATE 26000",
						"set Config.Prepare to false", "max_prepared_statements")
				}
			})
			t.Run(name+"/keeps-prepared", func(t *testing.T) {
				p := &pooler{mode: perTransaction, roundRobin: rr, keeps: true}
				p.warm(warm)
				found, err := sessionQueue(t, p, leaseJobs, true, 4).checkSessions(context.Background(), postgres{})
				if err != nil || len(found) != 0 {
					t.Fatalf("%q, %v; want Config.Prepare to pass where the pooler keeps prepared statements", found, err)
				}
			})
		}
	}
}

// Through Queue.CheckSchema: the lease and the row lock pass transaction
// pooling without a statement of the session check, as does the advisory
// form through a session per connection; the advisory form through
// transaction pooling is refused in a *SchemaError.
func TestSessionCheckSchema(t *testing.T) {
	for _, tc := range []struct {
		mode   poolMode
		tb     Table
		probed bool
		refuse bool
	}{
		{perTransaction, leaseJobs, false, false},
		{perTransaction, rowLockJobs, false, false},
		{perTransaction, advisoryJobs, true, true},
		{perConnection, advisoryJobs, true, false},
	} {
		p := &pooler{mode: tc.mode}
		q := sessionQueue(t, p, tc.tb, false, 4)
		err := q.CheckSchema(context.Background())
		var se *SchemaError
		switch {
		case tc.refuse && (!errors.As(err, &se) || len(se.Problems) != 1):
			t.Errorf("%s form, %v: CheckSchema = %v, want one problem", q.Form(), tc.mode, err)
		case !tc.refuse && err != nil:
			t.Errorf("%s form, %v: CheckSchema = %v, want nil", q.Form(), tc.mode, err)
		}
		probed := false
		for _, s := range p.sent {
			probed = probed || s == pgSessionFirst
		}
		if probed != tc.probed {
			t.Errorf("%s form, %v: session check ran: %v, want %v (sent %q)", q.Form(), tc.mode, probed, tc.probed, p.sent)
		}
	}
}

// An engine that does not answer the check's first statement while the pool
// answers, or that names itself CockroachDB, is not probed further.
func TestSessionCheckNotProbed(t *testing.T) {
	for _, p := range []*pooler{
		{mode: perTransaction, failFirst: true},
		{mode: perTransaction, version: "CockroachDB CCL v24.1.0 (x86_64-pc-linux-gnu)"},
	} {
		found, err := sessionQueue(t, p, advisoryJobs, true, 4).checkSessions(context.Background(), postgres{})
		if err != nil || len(found) != 0 {
			t.Errorf("%+v: %q, %v; want nothing", p, found, err)
		}
		if len(p.sent) != 1 {
			t.Errorf("sent %q, want the first statement alone", p.sent)
		}
	}
}
