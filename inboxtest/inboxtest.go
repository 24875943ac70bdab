// Package inboxtest expects, on a go-sqlmock, what an [inbox.Queue] sends: one
// line per thing a worker does, for every form, engine and clock.
//
//	db, mock, _ := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
//	q, _ := inbox.New(db, cfg)
//	m := inboxtest.New(mock, q, cfg)
//	m.ExpectClaim(1, inboxtest.Job{ID: 7, Data: []any{[]byte("report")}})
//	m.ExpectAck(7)
//	// run the worker on q, then check mock.ExpectationsWereMet()
//
// A test written with it keeps passing when the package changes its SQL: each
// expectation is recorded from a second queue with the same configuration,
// run against an in-memory stand-in of the database, so the statements, their
// arguments and their order are the package's own. Arguments are matched
// exactly, but for a time taken from time.Now (SQLite without
// [inbox.Config.Now]), which matches any time, and the advisory candidate
// page's size, which depends on the pool. docs/testing.md in the module says
// more, and lists the statements for those who write expectations by hand.
//
// The sqlmock must match exactly ([sqlmock.QueryMatcherEqual]) and in order
// (its default); the queue goes to [New] before its first claim; its pool
// leaves room for the largest claim under the row lock and advisory forms
// (and, for a queue with [inbox.Config.Prepare], keeps database/sql's
// defaults otherwise: the helper expects a prepare where a connection runs
// a statement for the first time); a Config.Now clock stands still between
// an expectation and the call it stands for. A Mock is for the test's
// goroutine. Its methods panic on a mistake in the test itself (an id never
// claimed, a claim of more jobs than max, a configuration other than the
// queue's), saying which.
//
// A database made with [NewDB] instead of sqlmock.New records what the
// code under test sends, and a call the expectations do not match fails
// the test in the package's terms: "expected Ack of job 7, got
// Retry(after 2s)", the SQL after it. [Mock.ExpectationsWereMet] names an
// expectation left unmet the same way.
package inboxtest

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"math"
	"reflect"
	"runtime"
	"strings"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqlinbox/inbox"
)

// ErrSessionLost is what a row-lock settlement returns after
// [Mock.ExpectLeaseLost]: the row lock holds a job by its transaction, which
// no one else can take from it, so the way its hold ends early is with the
// session (a server's idle-in-transaction timeout, a cut connection). The
// first statement on the held transaction fails with this error.
var ErrSessionLost = errors.New("inboxtest: the session holding the job was lost")

// dbNow is the first reading of the engine's clock in the stand-in.
var dbNow = time.Date(2024, 1, 1, 12, 0, 0, 0, time.UTC)

// Job is a row a claim returns.
type Job struct {
	// ID is the job's id: an integer or a string.
	ID any
	// Attempt is the attempt the claim delivers; zero means 1, a new job's.
	Attempt int
	// Key is the advisory key's value (advisory form), when the key column
	// is not the id; with the id as key it may stay nil.
	Key any
	// Data are the values of the table's data columns, in their order, as
	// the driver returns them ([]byte("…") for text, say).
	Data []any
	// LastError and Priority are the values of Table.LastError and
	// Table.Priority, when the description names them.
	LastError string
	Priority  int
}

// Call names one call on a delivery that a lease can be lost in, for
// [Mock.ExpectLeaseLost]: [Ack], [Release], [Dead], [Extend], or [Retry]
// with its delay.
type Call struct {
	kind     callKind
	after    time.Duration
	withText bool // the worker recorded an error (Delivery.SetError)
}

type callKind int

const (
	callAck callKind = iota + 1
	callRetry
	callRelease
	callDead
	callExtend
)

// The calls on a delivery, for [Mock.ExpectLeaseLost].
var (
	Ack     = Call{kind: callAck}
	Release = Call{kind: callRelease}
	Dead    = Call{kind: callDead}
	Extend  = Call{kind: callExtend}
)

// Retry is the call Retry(ctx, after), for [Mock.ExpectLeaseLost]; after
// may be [AnyDelay].
func Retry(after time.Duration) Call { return Call{kind: callRetry, after: after} }

// AnyDelay, as the delay of [Mock.ExpectRetry] (or of [Retry], or the Delay
// of the Result given to [Result.Expect]), matches a retry after any delay
// above zero: the delay worker.DefaultBackoff gives is jittered, so a test
// of a worker that keeps that default cannot name it. A delay of zero still
// means Retry(ctx, 0), which is a call of its own (under the row lock and
// advisory forms it sends other statements than a delay does), so that a
// worker that retries at once where it should back off fails. Only the
// SQLite lease without Config.Now, whose retry time comes from time.Now,
// cannot tell a zero delay from another: there AnyDelay matches it too.
const AnyDelay time.Duration = math.MinInt64

// anyDelayRecorded is the delay the shadow queue retries after when any
// delay is expected; the statements' delay arguments are then matched
// loosely.
const anyDelayRecorded = time.Minute

// String names the call as the worker would write it: "Ack", "Retry(1m0s)",
// "Retry(any delay)".
func (c Call) String() string {
	switch c.kind {
	case callAck:
		return "Ack"
	case callRetry:
		if c.after == AnyDelay {
			return "Retry(any delay)"
		}
		return fmt.Sprintf("Retry(%v)", c.after)
	case callRelease:
		return "Release"
	case callDead:
		return "Dead"
	case callExtend:
		return "Extend"
	}
	return "Call(?)"
}

// Mock sets the expectations of one queue on a sqlmock. Make one with [New].
type Mock struct {
	sm    sqlmock.Sqlmock // nil: record only (the package's own doc tests)
	db    *standIn
	sdb   *sql.DB
	q     *inbox.Queue // the shadow
	table inbox.Table  // with the defaults applied
	held  map[any]*inbox.Delivery
	last  []call           // the calls of the last expectation, for the package's tests
	now   func() time.Time // Config.Now
	rec   *tap             // the database is NewDB's: what the code under test sends is recorded
	// own are the sqlmock expectations the Mock set, with what each stands
	// for, for ExpectationsWereMet.
	own []owned
}

// owned is one sqlmock expectation the Mock set, and the expectation of
// the Mock it is part of.
type owned struct {
	exp fmt.Stringer
	g   *group
}

// group is what one expectation of the Mock stands for, in the package's
// terms, for the messages of a test that fails: "Ack of job 7".
type group struct {
	what string
	id   any // the job's, nil for a claim or a probe
	// anyDelay: a retry after any delay, recorded after anyDelayRecorded.
	anyDelay bool
}

// New returns a Mock that sets expectations on mock for q, a queue on
// mock's database made with cfg, before q's first claim. It panics when cfg
// is not the configuration q was made with. On a database of [NewDB], a
// call the expectations do not match fails the test in the package's
// terms; on one of sqlmock.New, [Mock.ExpectationsWereMet] names at least
// the expectation left unmet.
func New(mock sqlmock.Sqlmock, q *inbox.Queue, cfg inbox.Config) *Mock {
	if mock == nil || q == nil {
		panic("inboxtest: new: mock and q must not be nil")
	}
	return newMock(mock, q, cfg)
}

func newMock(mock sqlmock.Sqlmock, q *inbox.Queue, cfg inbox.Config) *Mock {
	if cfg.Dialect == nil {
		panic("inboxtest: new: Config.Dialect is nil")
	}
	// Under Config.Prepare the shadow prepares too: its pool meets its
	// statements as the pool of the queue under test does (the same calls
	// in the same order), so that it prepares where that one does.
	db, err := newStandIn(cfg)
	if err != nil {
		panic("inboxtest: new: " + err.Error())
	}
	sdb := sql.OpenDB(db)
	shadow, err := inbox.New(sdb, cfg)
	if err != nil {
		sdb.Close()
		panic(fmt.Sprintf("inboxtest: new: the configuration makes no queue: %v", err))
	}
	if q != nil && (q.Form() != shadow.Form() || q.Lease() != shadow.Lease() ||
		!reflect.DeepEqual(*q.Statements(), *shadow.Statements())) {
		sdb.Close()
		panic("inboxtest: new: cfg is not the configuration q was made with: their statements differ")
	}
	db.learn(shadow)
	m := &Mock{sm: mock, db: db, sdb: sdb, q: shadow, table: db.table, held: map[any]*inbox.Delivery{}, now: cfg.Now}
	if r, ok := mock.(*tapMock); ok {
		m.rec = r.r
		r.r.attach(m, cfg)
	}
	// The shadow holds jobs as the queue does (advisory keys in this
	// process, row-lock transactions); they are given back, and its pool
	// closed, once the Mock is gone.
	runtime.SetFinalizer(m, func(m *Mock) { m.close() })
	return m
}

func (m *Mock) close() {
	runtime.SetFinalizer(m, nil)
	for _, d := range m.held {
		_ = d.Release(context.Background())
	}
	m.held = nil
	m.sdb.Close()
}

// ExpectClaim expects a call Claim(ctx, max) that returns jobs, in order:
// every statement the claim sends, answered with these rows. Under the row
// lock a claim of fewer jobs than max ends with an attempt that finds
// none, expected too. It panics when jobs are more than max, repeat an id,
// or name one still held.
func (m *Mock) ExpectClaim(max int, jobs ...Job) {
	js := make([]job, len(jobs))
	seen := map[any]bool{}
	for i, j := range jobs {
		nj, err := m.db.normalize(j)
		if err != nil {
			panic(fmt.Sprintf("inboxtest: expect claim: job %d: %v", i, err))
		}
		if seen[nj.id] || m.held[nj.id] != nil {
			panic(fmt.Sprintf("inboxtest: expect claim: job %v is listed twice or still held", nj.id))
		}
		seen[nj.id] = true
		js[i] = nj
	}
	if len(js) > max {
		panic(fmt.Sprintf("inboxtest: expect claim: %d jobs for a claim of at most %d", len(js), max))
	}
	m.db.begin(opClaim, js)
	ds, err := m.q.Claim(context.Background(), max)
	calls, _ := m.db.end()
	if err != nil {
		panic(fmt.Sprintf("inboxtest: expect claim: the queue's claim fails: %v", err))
	}
	if len(ds) != len(js) {
		panic(fmt.Sprintf("inboxtest: expect claim: the queue claims %d of the %d jobs (under the advisory form, jobs sharing a key, or a key still held, are not claimed together)", len(ds), len(js)))
	}
	for i, d := range ds {
		if d.ID() != js[i].id {
			panic(fmt.Sprintf("inboxtest: expect claim: the queue claims job %v where job %v is listed", d.ID(), js[i].id))
		}
		m.held[js[i].id] = d
	}
	m.replay(calls, &group{what: claimWhat(max, js)})
}

// ExpectEmptyClaim expects a call Claim(ctx, max) that finds no job.
func (m *Mock) ExpectEmptyClaim(max int) { m.ExpectClaim(max) }

// ExpectProbe expects [inbox.Queue.Probe], what an idle worker loop sends when its
// fallback interval runs out where the claim is a transaction of several
// statements (the MySQL and MariaDB lease, every row lock): one query asking
// whether any job is ready, answered with a row when found is true and with
// none otherwise. The loop claims only after a probe that found a row
// (expect that claim next), and waits another interval after one that found
// none. It panics for a queue whose idle loop claims at once, its claim
// being one statement (the lease on PostgreSQL and SQLite, the advisory
// lock).
func (m *Mock) ExpectProbe(found bool) {
	p := m.q.Statements().Jobs.Probe
	if p.SQL == "" {
		panic("inboxtest: expect probe: this queue's idle loop claims at once, without a probe; expect the claim")
	}
	// The shadow probes too, for the prepare a queue with Config.Prepare
	// sends where its pool first runs the probe on a connection.
	m.db.begin(opSettle, nil)
	_, _ = m.q.Probe(context.Background())
	calls, _ := m.db.end()
	m.last = calls
	if m.sm == nil {
		return
	}
	what := "Probe finding no job"
	if found {
		what = "Probe finding a job"
	}
	g := &group{what: what}
	defer m.grouped(g)()
	for _, c := range calls {
		if c.op == "prepare" {
			m.own = append(m.own, owned{m.sm.ExpectPrepare(c.sql), g})
		}
	}
	e := m.sm.ExpectQuery(p.SQL)
	m.own = append(m.own, owned{e, g})
	var args []driver.Value
	for range p.Args {
		// The only argument a probe takes is now, under Config.Now: the
		// instant the loop's interval ran out, whichever it was.
		args = append(args, anyTime{m.db.d})
	}
	expectArgs(e, args)
	rows := sqlmock.NewRows([]string{"1"})
	if found {
		rows.AddRow(int64(1))
	}
	e.WillReturnRows(rows)
}

// ExpectAck expects Ack of the job claimed with id id.
func (m *Mock) ExpectAck(id any) { m.expect(id, Ack, false) }

// ExpectRetry expects Retry(ctx, after) of the job id. Under the row lock
// and advisory forms a delay needs Table.NotBefore. With after [AnyDelay]
// it matches a retry after any delay above zero, such as the jittered one
// of worker.DefaultBackoff: a worker run with its default Backoff is
// expected with AnyDelay, or given a fixed Backoff.
func (m *Mock) ExpectRetry(id any, after time.Duration) { m.expect(id, Retry(after), false) }

// ExpectRetryWithError expects Retry of the job id after after (or
// [AnyDelay]), by a worker that recorded the handler's error first
// (Delivery.SetError): with Table.LastError a Retry then always writes, a
// delay or not. The error's text itself is matched by any value.
func (m *Mock) ExpectRetryWithError(id any, after time.Duration) {
	c := Retry(after)
	c.withText = true
	m.expect(id, c, false)
}

// ExpectTx expects the first [inbox.Delivery.Tx] of the row-lock job id: it
// takes the savepoint that the job's Retry or Dead rolls back to, undoing
// the handler's writes, before they record the attempt; the Retry or Dead
// expected after it include that rollback. Expect it before the handler's
// own statements through the transaction. It panics under another form.
func (m *Mock) ExpectTx(id any) {
	key, err := normID(id)
	if err != nil {
		panic(fmt.Sprintf("inboxtest: expect Tx: %v", err))
	}
	d := m.held[key]
	switch {
	case m.q.Form() != inbox.RowLock:
		panic(fmt.Sprintf("inboxtest: expect Tx: the %s form has no claim transaction", m.q.Form()))
	case d == nil:
		panic(fmt.Sprintf("inboxtest: expect Tx: job %v is not held: expect its claim first", id))
	}
	m.db.begin(opSettle, nil)
	d.Tx()
	calls, _ := m.db.end()
	m.replay(calls, &group{what: fmt.Sprintf("Tx() of job %v", key), id: key})
}

// ExpectRelease expects Release of the job id.
func (m *Mock) ExpectRelease(id any) { m.expect(id, Release, false) }

// ExpectDead expects Dead of the job id: the move to Table.DeadTable.
func (m *Mock) ExpectDead(id any) { m.expect(id, Dead, false) }

// ExpectExtend expects Extend of the job id (lease form), and moves the
// expiry the helper expects in the job's later token. Under the other forms
// Extend sends nothing and neither does this.
func (m *Mock) ExpectExtend(id any) { m.expect(id, Extend, false) }

// ExpectLeaseLost expects call on the job id to find its hold gone. Lease
// and advisory: the statement that checks the delivery's token finds no row,
// the row is read back (Statements.Settle.Verdict; the lease only while it is in
// force) and found another claim's, and the call returns
// [inbox.ErrLeaseLost]. Row lock: the first statement
// on the held transaction fails with [ErrSessionLost], which the call
// returns. It panics for a call that sends nothing that could find the hold
// gone: Extend under the row lock and advisory forms, Retry without a delay
// under the advisory form.
func (m *Mock) ExpectLeaseLost(id any, call Call) { m.expect(id, call, true) }

// ExpectCancelled expects call on the job id to find the job deleted while
// held ([inbox.Queue.Cancel]), lease and advisory forms: the statement that
// checks the delivery's token finds no row, the row read back is gone, and
// the call returns [inbox.ErrCancelled]. It panics under the row lock,
// whose held jobs Cancel refuses, and where ExpectLeaseLost panics.
func (m *Mock) ExpectCancelled(id any, call Call) {
	if m.q.Form() == inbox.RowLock {
		panic(fmt.Sprintf("inboxtest: expect cancelled: %v: Queue.Cancel refuses a job a row-lock claim holds (inbox.ErrInWork)", call))
	}
	m.expectOp(id, call, opCancelled)
}

func (m *Mock) expect(id any, c Call, lost bool) {
	op := opSettle
	if lost {
		op = opLost
		if m.q.Form() == inbox.RowLock {
			op = opSessionLost
		}
	}
	m.expectOp(id, c, op)
}

// expectOp runs call c on the job id as op says, records its calls and
// expects them on the sqlmock.
func (m *Mock) expectOp(id any, c Call, op op) {
	lost := op != opSettle
	key, err := normID(id)
	if err != nil {
		panic(fmt.Sprintf("inboxtest: expect %v: %v", c, err))
	}
	d := m.held[key]
	if d == nil {
		panic(fmt.Sprintf("inboxtest: expect %v: job %v is not held: expect its claim first", c, id))
	}
	g := &group{what: c.what(key, op), id: key}
	after := c.after
	if c.kind == callRetry && after == AnyDelay {
		g.anyDelay, after = true, anyDelayRecorded
	}
	m.db.begin(op, nil)
	ctx := context.Background()
	switch c.kind {
	case callAck:
		err = d.Ack(ctx)
	case callRetry:
		if c.withText {
			d.SetError(errors.New("inboxtest: the worker's error"))
		}
		err = d.Retry(ctx, after)
	case callRelease:
		err = d.Release(ctx)
	case callDead:
		err = d.Dead(ctx)
	case callExtend:
		err = d.Extend(ctx)
	}
	calls, hit := m.db.end()
	switch {
	case lost && !hit:
		panic(fmt.Sprintf("inboxtest: expect lease lost: %v under the %s form sends nothing that could find the hold gone", c, m.q.Form()))
	case lost && op == opSessionLost && !errors.Is(err, ErrSessionLost),
		lost && op == opLost && !errors.Is(err, inbox.ErrLeaseLost):
		panic(fmt.Sprintf("inboxtest: expect lease lost: %v returns %v", c, err))
	case op == opCancelled && !errors.Is(err, inbox.ErrCancelled):
		panic(fmt.Sprintf("inboxtest: expect cancelled: %v returns %v (a lease past its expiry by Config.Now is lost, not cancelled)", c, err))
	case !lost && err != nil:
		panic(fmt.Sprintf("inboxtest: expect %v: the queue's %v fails: %v", c, c, err))
	}
	if lost || c.kind != callExtend {
		delete(m.held, key)
	}
	m.replay(calls, g)
}

// grouped tells the tap of NewDB's database that the expectations set
// until the function it returns runs stand for g.
func (m *Mock) grouped(g *group) func() {
	if m.rec == nil {
		return func() {}
	}
	m.rec.setGroup(g)
	return func() { m.rec.setGroup(nil) }
}

// replay turns recorded calls into expectations on the sqlmock, standing
// for g.
func (m *Mock) replay(calls []call, g *group) {
	m.last = calls
	if m.sm == nil {
		return
	}
	defer m.grouped(g)()
	for _, c := range calls {
		switch c.op {
		case "prepare":
			e := m.sm.ExpectPrepare(c.sql)
			m.own = append(m.own, owned{e, g})
			if c.err != nil {
				e.WillReturnError(c.err)
			}
		case "begin":
			e := m.sm.ExpectBegin()
			m.own = append(m.own, owned{e, g})
			if c.err != nil {
				e.WillReturnError(c.err)
			}
		case "commit":
			e := m.sm.ExpectCommit()
			m.own = append(m.own, owned{e, g})
			if c.err != nil {
				e.WillReturnError(c.err)
			}
		case "rollback":
			e := m.sm.ExpectRollback()
			m.own = append(m.own, owned{e, g})
			if c.err != nil {
				e.WillReturnError(c.err)
			}
		case "query":
			e := m.sm.ExpectQuery(c.sql)
			m.own = append(m.own, owned{e, g})
			expectArgs(e, m.args(c, g))
			if c.err != nil {
				e.WillReturnError(c.err)
				continue
			}
			rows := sqlmock.NewRows(c.cols)
			for _, r := range c.rows {
				rows.AddRow(r...)
			}
			e.WillReturnRows(rows)
		case "exec":
			e := m.sm.ExpectExec(c.sql)
			m.own = append(m.own, owned{e, g})
			expectArgs(e, m.args(c, g))
			if c.err != nil {
				e.WillReturnError(c.err)
				continue
			}
			e.WillReturnResult(sqlmock.NewResult(0, c.affected))
		}
	}
}

// args are the arguments c is expected with, as part of g: under a retry
// after any delay, its delay (a number of microseconds, or a time) matches
// any delay above zero.
func (m *Mock) args(c call, g *group) []driver.Value {
	args := m.db.matchers(c)
	if !g.anyDelay || c.stmt == nil {
		return args
	}
	for i, a := range c.stmt.Args {
		if i >= len(args) {
			break
		}
		switch a {
		case dialect.ArgMicros:
			args[i] = positive{}
		case dialect.ArgUntil:
			if _, loose := args[i].(anyTime); loose {
				continue // a time from time.Now: any
			}
			t, err := m.db.d.ScanTime(c.args[i])
			if err != nil {
				args[i] = anyTime{m.db.d}
				continue
			}
			args[i] = laterThan{d: m.db.d, t: t.Add(-anyDelayRecorded)}
		}
	}
	return args
}

// ExpectationsWereMet returns nil when every expectation set on the
// sqlmock was met, and otherwise an error that names the first one unmet
// as the expectation of the Mock it is part of ("expected Ack of job 7"),
// then sqlmock's own words. On a database made with [NewDB] it also says
// what the code under test did instead, as its sqlmock's
// ExpectationsWereMet does.
func (m *Mock) ExpectationsWereMet() error {
	if m.rec != nil {
		return m.rec.met()
	}
	if m.sm == nil {
		return nil
	}
	err := m.sm.ExpectationsWereMet()
	if err == nil {
		return nil
	}
	text := strings.TrimPrefix(err.Error(), unmetPrefix)
	var g *group
	for _, o := range m.own {
		if o.exp.String() != text {
			continue
		}
		if g != nil && g != o.g {
			// Two expectations alike (a begin, a commit): which one is
			// unmet cannot be told from sqlmock's words.
			return err
		}
		g = o.g
	}
	if g == nil {
		return err
	}
	return fmt.Errorf("inboxtest: expected %s, which was not done (a database made with inboxtest.NewDB would say what was done instead)\n\tsqlmock: %w", g.what, err)
}

// unmetPrefix begins sqlmock's error for an expectation left unmet.
const unmetPrefix = "there is a remaining expectation which was not matched: "

// expectArgs makes e match exactly args: none at all when args is empty.
func expectArgs[E interface {
	WithArgs(...driver.Value) E
	WithoutArgs() E
}](e E, args []driver.Value) {
	if len(args) == 0 {
		e.WithoutArgs()
	} else {
		e.WithArgs(args...)
	}
}

// normID returns an id as a claim delivers it: an int64 or a string.
func normID(v any) (any, error) {
	switch x := v.(type) {
	case int:
		return int64(x), nil
	case int8:
		return int64(x), nil
	case int16:
		return int64(x), nil
	case int32:
		return int64(x), nil
	case int64:
		return x, nil
	case uint:
		return int64(x), nil
	case uint8:
		return int64(x), nil
	case uint16:
		return int64(x), nil
	case uint32:
		return int64(x), nil
	case uint64:
		return int64(x), nil
	case string:
		return x, nil
	case []byte:
		return string(x), nil
	case nil:
		return nil, errors.New("the id is nil")
	}
	return nil, fmt.Errorf("id %v is a %T, want an integer or a string", v, v)
}

// timeEqual matches a time.Time argument at the same instant.
type timeEqual time.Time

func (t timeEqual) Match(v driver.Value) bool {
	got, ok := v.(time.Time)
	return ok && got.Equal(time.Time(t))
}

// anyTime matches any time argument in the dialect's form: a value of the
// type TimeArg gives that ScanTime reads back.
type anyTime struct{ d inbox.Dialect }

func (a anyTime) Match(v driver.Value) bool {
	if reflect.TypeOf(v) != reflect.TypeOf(a.d.TimeArg(dbNow)) {
		return false
	}
	_, err := a.d.ScanTime(v)
	return err == nil
}

// positive matches a number of microseconds above zero: the delay of a
// retry after any delay.
type positive struct{}

func (positive) Match(v driver.Value) bool {
	n, ok := v.(int64)
	return ok && n > 0
}

func (positive) String() string { return "any delay above zero, in µs" }

// laterThan matches a time in the dialect's form later than t: the
// not-before time or expiry of a retry after any delay above zero.
type laterThan struct {
	d inbox.Dialect
	t time.Time
}

func (l laterThan) Match(v driver.Value) bool {
	if reflect.TypeOf(v) != reflect.TypeOf(l.d.TimeArg(dbNow)) {
		return false
	}
	got, err := l.d.ScanTime(v)
	return err == nil && got.After(l.t)
}

func (l laterThan) String() string {
	return "any time after " + l.t.UTC().Format("2006-01-02 15:04:05.000000")
}

// above matches an integer larger than n: the advisory candidate page's
// size, which depends on the pool's state, and which must exceed the rows
// returned for the claim to read no further page.
type above int64

func (a above) Match(v driver.Value) bool {
	n, ok := v.(int64)
	return ok && n > int64(a)
}

// quoteTable quotes a possibly schema-qualified table name as the queue
// does, for the dialect's TableIdentity.
func quoteTable(d inbox.Dialect, name string) (quoted, schema, table string, err error) {
	parts := strings.Split(name, ".")
	q := make([]string, len(parts))
	for i, p := range parts {
		if q[i], err = d.QuoteIdent(p); err != nil {
			return "", "", "", err
		}
	}
	if len(parts) == 2 {
		schema = parts[0]
	}
	return strings.Join(q, "."), schema, parts[len(parts)-1], nil
}
