package inboxtest

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"io"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/sqlinbox/inbox"

	"github.com/DATA-DOG/go-sqlmock"
)

// The stand-in is a database/sql driver that answers the statements of one
// queue as its database would: a claim returns the jobs of the expectation
// being set, a write affects its row (none when the lease is to be lost),
// the clock reads dbNow, a lock call takes the lock. It records every call,
// which the Mock then expects on the sqlmock. It knows a statement by its
// text, from the queue's Statements, and the dialect's own calls (the
// table's identity, the advisory locks) by the text a probe of the dialect's
// methods sent.

// op is what the stand-in is recording.
type op int

const (
	opNone        op = iota
	opClaim          // a claim of the jobs given
	opSettle         // a settlement that finds its row
	opLost           // a settlement whose token finds no row
	opSessionLost    // a row-lock settlement whose held transaction's session is gone
	opCancelled      // a settlement whose token finds no row, the row deleted (Queue.Cancel)
)

// call is one call that reached the stand-in, with its answer.
type call struct {
	op       string // begin, commit, rollback, query, exec
	sql      string
	args     []driver.Value
	cols     []string
	rows     [][]driver.Value
	affected int64
	err      error
	inTx     bool
	stmt     *dialect.Stmt // the queue's statement, nil for the dialect's own calls
	names    []string      // the Statements fields with this text
	dialect  string        // "identity", "lock" or "unlock" for the dialect's own calls
}

// job is a Job as the stand-in returns it.
type job struct {
	id        any // int64 or string
	attempt   int64
	key       driver.Value
	data      []driver.Value
	lastError string
	priority  int64
}

type known struct {
	stmt  dialect.Stmt
	names []string
}

type standIn struct {
	d       inbox.Dialect
	table   inbox.Table // defaults applied
	nowFunc bool        // Config.Now is set

	// Set by learn, from the shadow queue.
	form      inbox.Form
	lease     time.Duration
	realClock bool // times come from time.Now: no Config.Now, no engine clock to read
	known     map[string]*known

	// The dialect's own calls, found by probing its methods.
	identSQL, lockSQL, unlockSQL          map[string]bool
	identAnswer, lockAnswer, unlockAnswer driver.Value

	mu    sync.Mutex
	ticks int // the engine's clock: dbNow, one second later at each reading
	conns int
	op    op
	jobs  []job
	next  int  // row lock: the next job a claim statement returns
	hit   bool // a statement answered as the lost hold
	log   []call
	// expects counts the expectations recorded: a transaction begun
	// during the current one is not the held transaction whose session is
	// lost (a row-lock settlement's give-back, or its new transaction).
	expects int
	// loose are the times from time.Now a write stored where they became a
	// token's expiry (an extension's, a mark's): the queue under test
	// stores its own, which later tokens carry.
	loose map[driver.Value]bool
	// quiet: the stand-in answers without recording (NewDB's, past a call
	// the expectations did not match).
	quiet bool
}

// newStandIn makes the stand-in engine of cfg's table, having found the
// answers its dialect's lock and identity calls want.
func newStandIn(cfg inbox.Config) (*standIn, error) {
	t := cfg.Table
	if t.ID == "" {
		t.ID = "id"
	}
	if t.Attempt == "" {
		t.Attempt = "attempt"
	}
	if t.Data == nil {
		t.Data = []string{"payload"}
	}
	s := &standIn{d: cfg.Dialect, table: t, nowFunc: cfg.Now != nil}
	if t.AdvisoryKey == "" || t.LockedUntil != "" {
		return s, nil
	}
	identity, err := s.probeIdentity(t)
	if err != nil {
		return nil, err
	}
	if err := s.probeLocker(identity); err != nil {
		return nil, err
	}
	return s, nil
}

// probeIdentity finds the answer the dialect's TableIdentity wants, and
// returns the table's identity, which names its locks.
func (s *standIn) probeIdentity(t inbox.Table) (string, error) {
	identity := t.Name
	if ti, ok := capability[dialect.TableIdentifier](s.d); ok {
		quoted, schema, name, err := quoteTable(s.d, t.Name)
		if err != nil {
			return "", err
		}
		n := &dialect.Names{Form: inbox.Advisory, Table: quoted, Schema: schema, TableName: name, Raw: dialect.Table(t)}
		// An empty answer names an in-memory database on SQLite, whose
		// identity is then its pool's alone; other engines' identity is
		// the answer itself, which must not be empty.
		for _, ans := range []driver.Value{"", t.Name} {
			var ident string
			sent, err := probe(ans, func(ctx context.Context, db *sql.DB) (err error) {
				ident, err = ti.TableIdentity(ctx, db, n)
				return err
			})
			if err == nil && ident != "" {
				s.identSQL, s.identAnswer, identity = sent, ans, ident
				break
			}
		}
		if s.identSQL == nil {
			return "", fmt.Errorf("no answer found for dialect %s's TableIdentity", s.d.Name())
		}
	}
	return identity, nil
}

// probeLocker finds the answers the dialect's TryLock and Unlock want.
func (s *standIn) probeLocker(identity string) error {
	if l, ok := capability[dialect.Locker](s.d); ok {
		for _, ans := range []driver.Value{true, int64(1)} {
			var got bool
			sent, err := probe(ans, func(ctx context.Context, db *sql.DB) error {
				return onConn(ctx, db, func(conn *sql.Conn) (err error) {
					got, err = l.TryLock(ctx, conn, identity, "1")
					return err
				})
			})
			if err == nil && got {
				s.lockSQL, s.lockAnswer = sent, ans
				break
			}
		}
		for _, ans := range []driver.Value{true, int64(1)} {
			sent, err := probe(ans, func(ctx context.Context, db *sql.DB) error {
				return onConn(ctx, db, func(conn *sql.Conn) error { return l.Unlock(ctx, conn, identity, "1") })
			})
			if err == nil {
				s.unlockSQL, s.unlockAnswer = sent, ans
				break
			}
		}
		if s.lockSQL == nil || s.unlockSQL == nil {
			return fmt.Errorf("no answer found for dialect %s's TryLock and Unlock", s.d.Name())
		}
	}
	return nil
}

// learn takes the statements of the shadow queue.
func (s *standIn) learn(q *inbox.Queue) {
	s.form, s.lease = q.Form(), q.Lease()
	st := reflect.ValueOf(*q.Statements())
	s.known = map[string]*known{}
	add := func(stmt dialect.Stmt, name string) {
		if stmt.SQL == "" {
			return
		}
		k := s.known[stmt.SQL]
		if k == nil {
			k = &known{stmt: stmt}
			s.known[stmt.SQL] = k
		}
		k.names = append(k.names, name)
	}
	var walk func(v reflect.Value, path string)
	walk = func(v reflect.Value, path string) {
		for i := 0; i < v.NumField(); i++ {
			name := path + v.Type().Field(i).Name
			switch f := v.Field(i).Interface().(type) {
			case dialect.Stmt:
				add(f, name)
			case []dialect.Stmt:
				// Claim.TakeBounded: each is the claim, for its bound.
				for _, stmt := range f {
					add(stmt, "Claim.Take")
				}
			case bool: // Advisory.LockFirstContended: when the core sends them
			default:
				walk(v.Field(i), name+".") // a part of Statements
			}
		}
	}
	walk(st, "")
	// As the queue reads now: Config.Now, else the engine's clock
	// statement, else time.Now.
	s.realClock = !s.nowFunc && q.Statements().Now.SQL == ""
}

// normalize checks a Job against the description.
func (s *standIn) normalize(j Job) (job, error) {
	id, err := normID(j.ID)
	if err != nil {
		return job{}, err
	}
	out := job{id: id, attempt: int64(j.Attempt), lastError: j.LastError, priority: int64(j.Priority)}
	if out.attempt == 0 {
		out.attempt = 1
	}
	if out.attempt < 0 {
		return job{}, fmt.Errorf("attempt %d is negative", j.Attempt)
	}
	if len(j.Data) != len(s.table.Data) {
		return job{}, fmt.Errorf("%d data values for the %d data columns %v", len(j.Data), len(s.table.Data), s.table.Data)
	}
	for _, v := range j.Data {
		out.data = append(out.data, v)
	}
	if s.form == inbox.Advisory {
		switch {
		case j.Key != nil:
			if k, err := normID(j.Key); err == nil {
				out.key = k
			} else {
				out.key = j.Key
			}
		case strings.EqualFold(s.table.AdvisoryKey, s.table.ID):
			out.key = id
		default:
			return job{}, fmt.Errorf("Job.Key is needed: the advisory key column %q is not the id", s.table.AdvisoryKey)
		}
	}
	return out, nil
}

// begin starts recording op, with the jobs of a claim.
func (s *standIn) begin(o op, jobs []job) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.op, s.jobs, s.next, s.hit, s.log = o, jobs, 0, false, nil
	s.expects++
}

// end stops recording and returns the calls recorded, and whether one was
// answered as the lost hold.
func (s *standIn) end() ([]call, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	calls, hit := s.log, s.hit
	s.op, s.jobs, s.log = opNone, nil, nil
	return calls, hit
}

func (s *standIn) add(c call) {
	if s.op != opNone && !s.quiet {
		s.log = append(s.log, c)
	}
}

// sessionGone answers a call on a held transaction, one begun before the
// current expectation, while its session is to be lost: the first such
// call fails.
func (s *standIn) sessionGone(c *call, conn *sconn) bool {
	if s.op != opSessionLost || !c.inTx || conn.began == s.expects || s.hit {
		return false
	}
	s.hit = true
	c.err = ErrSessionLost
	return true
}

func (s *standIn) respond(conn *sconn, kind, query string, nv []driver.NamedValue) call {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := call{op: kind, sql: query, inTx: conn.inTx}
	for _, v := range nv {
		c.args = append(c.args, v.Value)
	}
	defer func() { s.add(c) }()
	k := s.known[query]
	switch {
	case s.identSQL[query]:
		c.dialect = "identity"
	case s.lockSQL[query]:
		c.dialect = "lock"
	case s.unlockSQL[query]:
		c.dialect = "unlock"
	case k != nil:
		c.stmt, c.names = &k.stmt, k.names
	}
	if s.sessionGone(&c, conn) {
		return c
	}
	switch c.dialect {
	case "identity":
		c.cols, c.rows = []string{"identity"}, [][]driver.Value{{s.identAnswer}}
	case "lock":
		c.cols, c.rows = []string{"locked"}, [][]driver.Value{{s.lockAnswer}}
	case "unlock":
		c.cols, c.rows = []string{"unlocked"}, [][]driver.Value{{s.unlockAnswer}}
	default:
		if k == nil {
			c.err = fmt.Errorf("inboxtest: the queue sent a statement the helper does not know: %s", query)
			return c
		}
		if v := c.arg(dialect.ArgUntil); s.realClock && kind == "exec" && v != nil {
			if s.loose == nil {
				s.loose = map[driver.Value]bool{}
			}
			s.loose[v] = true
		}
		if kind == "query" {
			s.answerQuery(&c)
		} else {
			s.answerExec(&c)
		}
	}
	return c
}

func (c *call) is(names ...string) bool {
	for _, n := range c.names {
		for _, m := range names {
			if n == m {
				return true
			}
		}
	}
	return false
}

// arg returns the value of the statement's first parameter a, nil when it
// takes none.
func (c *call) arg(a dialect.Arg) driver.Value {
	for i, x := range c.stmt.Args {
		if x == a && i < len(c.args) {
			return c.args[i]
		}
	}
	return nil
}

// answerQuery answers a query the way the engine would in the scene
// being played.
func (s *standIn) answerQuery(c *call) {
	if s.answerClaim(c) || s.answerAdvisory(c) || s.answerSettle(c) {
		return
	}
	switch {
	case c.is("Now"):
		c.cols, c.rows = []string{"now"}, [][]driver.Value{{s.d.TimeArg(s.engineNow())}}
	case c.is("RowLock.ClaimsCount", "RowLock.ClaimsRead"):
		c.cols, c.rows = []string{"claims"}, [][]driver.Value{{int64(1)}}
	case c.is("Jobs.Probe"):
		// Whether a job is ready: the expectation answers (ExpectProbe).
		c.cols = []string{"1"}
	case c.is("RowLock.Relock"):
		// A settlement whose held session was lost locks the row again
		// in a transaction of its own: another claim has the job.
		c.cols = []string{s.table.ID}
		if s.op != opSessionLost {
			c.rows = [][]driver.Value{{c.arg(dialect.ArgID)}}
		}
	default:
		c.err = fmt.Errorf("inboxtest: the helper has no answer for %v", c.names)
	}
}

// withPriority appends the priority column's name, or a job's priority,
// where the table has one.
func (s *standIn) withPriority(cols []string) []string {
	if s.table.Priority != "" {
		cols = append(cols, s.table.Priority)
	}
	return cols
}

// rowOf is vals, then j's priority where the table has one.
func (s *standIn) rowOf(j job, vals ...driver.Value) []driver.Value {
	if s.table.Priority != "" {
		vals = append(vals, j.priority)
	}
	return vals
}

// answerClaim answers the claim's reads, reporting whether c was one.
func (s *standIn) answerClaim(c *call) bool {
	switch {
	case c.is("Claim.Take", "Claim.TakeOne", "Claim.Select", "Claim.SelectFree", "Claim.SelectFreeOne", "Claim.PickLock", "Claim.PickFirst", "Claim.WalkFirst", "Claim.WalkTake"):
		s.claimRows(c)
	case c.is("Claim.SelectMore", "Claim.SelectMoreOne"):
		// The claim's jobs all came with the first read.
		s.claimRows(c)
		c.rows = nil
	case c.is("Claim.Pick", "Claim.PickMore"):
		// The candidates of a pick: the next job (row lock), or every
		// job, all free (lease).
		c.cols = s.withPriority([]string{s.table.ID})
		var cands []job
		switch {
		case s.form == inbox.RowLock && s.next < len(s.jobs):
			cands = s.jobs[s.next : s.next+1]
		case s.form == inbox.Lease && c.is("Claim.PickMore"):
			cands = s.jobs
		}
		for _, j := range cands {
			c.rows = append(c.rows, s.rowOf(j, j.id))
		}
	case c.is("Claim.PickAfter", "Claim.PickMoreAfter"):
		c.cols = s.withPriority([]string{s.table.ID})
	default:
		return false
	}
	return true
}

// answerAdvisory answers the advisory form's reads, reporting whether c
// was one.
func (s *standIn) answerAdvisory(c *call) bool {
	switch {
	case c.is("Advisory.Candidates"):
		c.cols = s.withPriority([]string{s.table.ID, s.table.AdvisoryKey, s.table.Attempt})
		for _, j := range s.jobs {
			c.rows = append(c.rows, s.rowOf(j, j.id, j.key, j.attempt))
		}
	case c.is("Advisory.LockFirst", "Advisory.LockFirstAfter"):
		// The server's walk locks the next job's key: one job a call (the
		// jobs after the first past the one before); then none, and the
		// page short.
		c.cols = []string{"id", "k", "a"}
		if s.table.Priority != "" {
			c.cols = append(c.cols, "p")
		}
		c.cols = append(c.cols, "locked")
		if s.next < len(s.jobs) {
			j := s.jobs[s.next]
			s.next++
			c.rows = append(c.rows, append(s.rowOf(j, j.id, j.key, j.attempt), true))
		}
	case c.is("Advisory.CandidatesAfter"):
		c.cols = s.withPriority([]string{s.table.ID, s.table.AdvisoryKey, s.table.Attempt})
	default:
		return false
	}
	return true
}

// answerSettle answers the settlements' reads, reporting whether c was
// one.
func (s *standIn) answerSettle(c *call) bool {
	lost := s.op == opLost || s.op == opCancelled
	switch {
	case c.is("Settle.Extend"):
		c.cols = []string{s.table.LockedUntil}
		if lost {
			s.hit = true
			return true
		}
		c.rows = [][]driver.Value{{s.until(c)}}
	case c.is("Settle.Exists"):
		n := int64(1)
		if lost {
			s.hit, n = true, 0
		}
		c.cols, c.rows = []string{"count"}, [][]driver.Value{{n}}
	case c.is("Settle.Verdict") && lost:
		// A hold found gone within the lease (or the advisory lock) is
		// read back: the row is there, another claim's (a later attempt),
		// so the call returns ErrLeaseLost; or gone, a cancel.
		c.cols = []string{s.table.Attempt}
		if s.form == inbox.Lease {
			c.cols = append(c.cols, s.table.LockedUntil)
		}
		if s.op == opCancelled {
			return true
		}
		c.rows = [][]driver.Value{{int64(1 << 20)}}
		if s.form == inbox.Lease {
			c.rows[0] = append(c.rows[0], s.d.TimeArg(dbNow.Add(time.Hour)))
		}
	default:
		return false
	}
	return true
}

func (s *standIn) answerExec(c *call) {
	switch {
	case c.is("Claim.Mark", "Claim.MarkOne"):
		c.affected = 1
		if s.form == inbox.Lease {
			// One statement marks several rows, its last id repeated.
			ids := map[any]bool{}
			for i, a := range c.stmt.Args {
				if a == dialect.ArgID && i < len(c.args) {
					ids[c.args[i]] = true
				}
			}
			c.affected = int64(len(ids))
		}
	case c.is("Settle.Ack", "Settle.Retry", "Settle.Release", "Settle.Dead", "Settle.DeadDelete", "Settle.Extend"):
		c.affected = 1
		if s.op == opLost || s.op == opCancelled {
			s.hit, c.affected = true, 0
		}
	case c.is("RowLock.ClaimsCount", "RowLock.ClaimsGiveBack", "RowLock.ClaimsClear"):
		c.affected = 1
	case c.is("RowLock.Savepoint", "RowLock.RollbackToSavepoint"):
	default:
		c.err = fmt.Errorf("inboxtest: the helper has no answer for %v", c.names)
	}
}

// until is the expiry a lease statement wrote: the time it was given, or
// the engine's clock plus the lease.
func (s *standIn) until(c *call) driver.Value {
	if v := c.arg(dialect.ArgUntil); v != nil {
		return v
	}
	return s.d.TimeArg(s.engineNow().Add(s.lease))
}

// engineNow reads the engine's clock: dbNow at first, a second later at
// each further reading, as time passes between a worker's statements.
func (s *standIn) engineNow() time.Time {
	t := dbNow.Add(time.Duration(s.ticks) * time.Second)
	s.ticks++
	return t
}

// claimRows answers a claim statement: every job at once (lease), the next
// one (row lock), or the one whose id it names (advisory).
func (s *standIn) claimRows(c *call) {
	expiry := c.is("Claim.Take", "Claim.TakeOne", "Claim.WalkTake") && s.form == inbox.Lease
	clock := s.claimCols(c, expiry)
	row := func(j job) []driver.Value { return s.claimRow(c, j, expiry, clock) }
	// A pick's lock takes the jobs among the ids it names.
	named := func(j job) bool {
		if !c.is("Claim.PickLock") {
			return true
		}
		for i, a := range c.stmt.Args {
			if a == dialect.ArgID && i < len(c.args) && c.args[i] == j.id {
				return true
			}
		}
		return false
	}
	switch s.form {
	case inbox.Lease:
		for _, j := range s.jobs {
			if named(j) {
				c.rows = append(c.rows, row(j))
			}
		}
	case inbox.RowLock:
		if s.next < len(s.jobs) && named(s.jobs[s.next]) {
			c.rows = append(c.rows, row(s.jobs[s.next]))
			s.next++
		}
	case inbox.Advisory:
		id := c.arg(dialect.ArgID)
		for _, j := range s.jobs {
			if j.id == id {
				c.rows = append(c.rows, row(j))
			}
		}
	}
}

// claimCols sets the columns of a claim's rows, and returns the engine's
// clock its rows carry, if the statement reads it: one reading per
// statement, as the engine's.
func (s *standIn) claimCols(c *call, expiry bool) (clock driver.Value) {
	c.cols = []string{s.table.ID, s.table.Attempt}
	if expiry {
		c.cols = append(c.cols, s.table.LockedUntil)
	}
	c.cols = append(c.cols, s.table.Data...)
	if s.table.LastError != "" {
		c.cols = append(c.cols, s.table.LastError)
	}
	c.cols = s.withPriority(c.cols)
	if c.stmt.Clock {
		c.cols = append(c.cols, "now")
		clock = s.d.TimeArg(s.engineNow())
	}
	if c.stmt.Level {
		// The session runs at READ COMMITTED, as the claim asks.
		c.cols = append(c.cols, "read_committed")
	}
	return clock
}

// claimRow is job j as claimCols' columns.
func (s *standIn) claimRow(c *call, j job, expiry bool, clock driver.Value) []driver.Value {
	r := []driver.Value{j.id, j.attempt}
	if expiry {
		r = append(r, s.until(c))
	}
	r = append(r, j.data...)
	if s.table.LastError != "" {
		r = append(r, j.lastError)
	}
	if s.table.Priority != "" {
		r = append(r, j.priority)
	}
	if c.stmt.Clock {
		r = append(r, clock)
	}
	if c.stmt.Level {
		r = append(r, int64(1))
	}
	return r
}

// matchers are the arguments a call is expected with.
func (s *standIn) matchers(c call) []driver.Value {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]driver.Value, len(c.args))
	for i, a := range c.args {
		out[i] = a
		if t, ok := a.(time.Time); ok {
			out[i] = timeEqual(t)
		}
		if c.stmt == nil || i >= len(c.stmt.Args) {
			continue
		}
		switch c.stmt.Args[i] {
		case dialect.ArgNow, dialect.ArgUntil:
			if s.realClock {
				out[i] = anyTime{s.d}
			}
		case dialect.ArgExpiry:
			if s.loose[a] {
				out[i] = anyTime{s.d}
			}
		case dialect.ArgLimit:
			if c.is("Advisory.Candidates", "Advisory.CandidatesAfter", "Advisory.LockFirst", "Advisory.LockFirstAfter") {
				out[i] = above(len(c.rows))
			}
		case dialect.ArgError:
			// The text the worker recorded with SetError, or none.
			out[i] = sqlmock.AnyArg()
		}
	}
	return out
}

// Connect makes the stand-in a driver.Connector.
func (s *standIn) Connect(context.Context) (driver.Conn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conns++
	return &sconn{s: s}, nil
}

func (s *standIn) Driver() driver.Driver { return noOpen{} }

type noOpen struct{}

func (noOpen) Open(string) (driver.Conn, error) {
	return nil, errors.New("inboxtest: open through the connector")
}

type sconn struct {
	s     *standIn
	inTx  bool
	began int // the expectation during which its transaction began
}

// Prepare accepts any statement, as a database prepares the text it is
// given, and records the prepare (a queue with Config.Prepare sends one at
// the first use of each statement on a connection); the statement answers
// as its text would (sstmt).
func (c *sconn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

func (c *sconn) PrepareContext(_ context.Context, query string) (driver.Stmt, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	p := call{op: "prepare", sql: query, inTx: c.inTx}
	if k := s.known[query]; k != nil {
		p.stmt, p.names = &k.stmt, k.names
	}
	s.add(p)
	return &sstmt{c: c, query: query}, nil
}

// sstmt is a statement the stand-in prepared: each run is answered, and
// recorded, as the same text sent unprepared.
type sstmt struct {
	c     *sconn
	query string
}

func (st *sstmt) Close() error  { return nil }
func (st *sstmt) NumInput() int { return -1 }

func (st *sstmt) Exec(args []driver.Value) (driver.Result, error) {
	return st.c.ExecContext(context.Background(), st.query, named(args))
}

func (st *sstmt) Query(args []driver.Value) (driver.Rows, error) {
	return st.c.QueryContext(context.Background(), st.query, named(args))
}

func (st *sstmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	return st.c.ExecContext(ctx, st.query, args)
}

func (st *sstmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	return st.c.QueryContext(ctx, st.query, args)
}

func named(args []driver.Value) []driver.NamedValue {
	nv := make([]driver.NamedValue, len(args))
	for i, v := range args {
		nv[i] = driver.NamedValue{Ordinal: i + 1, Value: v}
	}
	return nv
}
func (c *sconn) Close() error { return nil }
func (c *sconn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *sconn) BeginTx(context.Context, driver.TxOptions) (driver.Tx, error) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	c.s.add(call{op: "begin"})
	c.inTx, c.began = true, c.s.expects
	return stx{c}, nil
}

func (c *sconn) QueryContext(_ context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	r := c.s.respond(c, "query", q, args)
	if r.err != nil {
		return nil, r.err
	}
	return &rows{cols: r.cols, vals: r.rows}, nil
}

func (c *sconn) ExecContext(_ context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	r := c.s.respond(c, "exec", q, args)
	if r.err != nil {
		return nil, r.err
	}
	return driver.RowsAffected(r.affected), nil
}

type stx struct{ c *sconn }

func (t stx) Commit() error   { return t.end("commit") }
func (t stx) Rollback() error { return t.end("rollback") }

func (t stx) end(kind string) error {
	s := t.c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	c := call{op: kind, inTx: true}
	s.sessionGone(&c, t.c)
	s.add(c)
	t.c.inTx = false
	return c.err
}

type rows struct {
	cols []string
	vals [][]driver.Value
	i    int
}

func (r *rows) Columns() []string { return r.cols }
func (r *rows) Close() error      { return nil }

func (r *rows) Next(dest []driver.Value) error {
	if r.i >= len(r.vals) {
		return io.EOF
	}
	copy(dest, r.vals[r.i])
	r.i++
	return nil
}

// probe runs f on a database that answers every query with one row of one
// value, answer, and returns the text of every statement f sent.
func probe(answer driver.Value, f func(ctx context.Context, db *sql.DB) error) (map[string]bool, error) {
	p := &prober{answer: answer, sent: map[string]bool{}}
	db := sql.OpenDB(p)
	defer db.Close()
	err := f(context.Background(), db)
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sent, err
}

func onConn(ctx context.Context, db *sql.DB, f func(*sql.Conn) error) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return f(conn)
}

type prober struct {
	answer driver.Value
	mu     sync.Mutex
	sent   map[string]bool
}

func (p *prober) Connect(context.Context) (driver.Conn, error) { return pconn{p}, nil }
func (p *prober) Driver() driver.Driver                        { return noOpen{} }

type pconn struct{ p *prober }

func (c pconn) Prepare(string) (driver.Stmt, error) { return nil, errors.New("inboxtest: no prepare") }
func (c pconn) Close() error                        { return nil }
func (c pconn) Begin() (driver.Tx, error)           { return nil, errors.New("inboxtest: no transactions") }

func (c pconn) QueryContext(_ context.Context, q string, _ []driver.NamedValue) (driver.Rows, error) {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	c.p.sent[q] = true
	return &rows{cols: []string{"v"}, vals: [][]driver.Value{{c.p.answer}}}, nil
}

func (c pconn) ExecContext(_ context.Context, q string, _ []driver.NamedValue) (driver.Result, error) {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	c.p.sent[q] = true
	return driver.RowsAffected(1), nil
}

// capability returns d's optional interface T, or that of the dialect d
// wraps (Unwrap), as the queue finds it.
func capability[T any](d inbox.Dialect) (T, bool) {
	for d != nil {
		if c, ok := d.(T); ok {
			return c, true
		}
		w, ok := d.(interface{ Unwrap() inbox.Dialect })
		if !ok {
			break
		}
		d = w.Unwrap()
	}
	var none T
	return none, false
}
