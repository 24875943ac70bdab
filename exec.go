package inbox

import (
	"context"
	"database/sql"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"sync"
	"time"
)

// normID turns an id as a driver returned it into an int64 or a string.
func normID(v any) any {
	switch x := v.(type) {
	case []byte:
		return string(x)
	case int32:
		return int64(x)
	case int:
		return int64(x)
	case uint64:
		return int64(x)
	}
	return v
}

// values are what a statement's parameters are filled from.
type values struct {
	id         any
	attempt    int64 // delivered
	expiry     time.Time
	now, until time.Time
	micros     int64
	limit      int
	notBefore  time.Time
	errText    any // the error text a settlement records: a string, or nil
	priority   int64
	identity   string // the table's, for statements that name its locks
	uniqueKey  any    // a job's unique key, nil for none
	by         any    // who pauses the queue: a string, or nil
	data       []any
	// tokens are several rows', for a statement that takes the token's
	// parameters once per row: the n-th ArgID, ArgAttempt (or ArgDelivered)
	// and ArgExpiry are the n-th token's, the last token standing in for the
	// places past it.
	// Without tokens, every place is the single row's above.
	tokens []token
}

// token is one row's ownership token: its id, the attempt delivered and, under
// the lease, the expiry as stored.
type token struct {
	id      any
	attempt int64
	expiry  time.Time
}

// argLists recycles the argument lists of statements: database/sql has
// converted them by the time a call returns, and one list fewer per
// statement is a tenth of a claim's allocations.
var argLists = sync.Pool{New: func() any { return new([]any) }}

// args fills the parameters of s from v, in the order s takes them, into a
// list from argLists that the caller hands back with freeArgs.
func (q *Queue) args(s dialect.Stmt, v *values) *[]any {
	list, out := argList(len(s.Args))
	single := token{v.id, v.attempt, v.expiry}
	var nth [3]int    // occurrences so far of ArgID, ArgAttempt or ArgDelivered, ArgExpiry
	var arrays [3]any // ArgIDs, ArgAttempts, ArgExpiries, each built once
	tok := func(k int) token {
		if len(v.tokens) == 0 {
			return single
		}
		t := v.tokens[min(nth[k], len(v.tokens)-1)]
		nth[k]++
		return t
	}
	for i, a := range s.Args {
		switch a {
		case dialect.ArgID:
			out[i] = tok(0).id
		case dialect.ArgAttempt:
			out[i] = tok(1).attempt + 1
		case dialect.ArgExpiry:
			out[i] = q.dialect.TimeArg(tok(2).expiry)
		case dialect.ArgDelivered:
			out[i] = tok(1).attempt
		case dialect.ArgNow:
			out[i] = q.dialect.TimeArg(v.now)
		case dialect.ArgUntil:
			out[i] = q.dialect.TimeArg(v.until)
		case dialect.ArgMicros:
			out[i] = q.microsArg(v.micros)
		case dialect.ArgLimit:
			out[i] = v.limit
		case dialect.ArgNotBefore:
			out[i] = q.timeOrNull(v.notBefore)
		case dialect.ArgUniqueKey:
			out[i] = v.uniqueKey
		case dialect.ArgError:
			out[i] = v.errText
		case dialect.ArgPriority:
			out[i] = v.priority
		case dialect.ArgIdentity:
			out[i] = v.identity
		case dialect.ArgQueue:
			out[i] = q.names.TableName
		case dialect.ArgBy:
			out[i] = v.by
		case dialect.ArgIDs, dialect.ArgAttempts, dialect.ArgExpiries:
			if arrays[a-dialect.ArgIDs] == nil {
				arrays[a-dialect.ArgIDs] = pgTokenArray(a, v.tokens, single)
			}
			out[i] = arrays[a-dialect.ArgIDs]
		default:
			out[i] = v.data[a-dialect.ArgData]
		}
	}
	return list
}

// argList takes a list of n arguments from argLists.
func argList(n int) (*[]any, []any) {
	list := argLists.Get().(*[]any)
	if cap(*list) < n {
		*list = make([]any, n)
	}
	out := (*list)[:n]
	*list = out
	return list, out
}

// microsArg is micros as a parameter: the lease's boxed once, as every
// claim takes it.
func (q *Queue) microsArg(micros int64) any {
	if micros == q.lease.Microseconds() {
		return q.leaseMicros
	}
	return micros
}

// timeOrNull is t as a parameter, NULL for the zero time (a Replace's
// "none").
func (q *Queue) timeOrNull(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return q.dialect.TimeArg(micro(t))
}

// freeArgs hands an argument list back, dropping its values.
func freeArgs(list *[]any) {
	clear(*list)
	argLists.Put(list)
}

// micro is t in UTC truncated to the columns' precision, a microsecond, as
// every time becomes before it is written or compared.
func micro(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }

// fillTimes reads now for s, when s takes a time computed from it, into
// v.now, and now plus after into v.until.
func (q *Queue) fillTimes(ctx context.Context, ex Executor, s dialect.Stmt, v *values, after time.Duration) error {
	if !clockNeeded(s) {
		return nil
	}
	now, err := q.readNow(ctx, ex)
	if err != nil {
		return err
	}
	v.now, v.until = now, now.Add(after)
	return nil
}

// clockNeeded reports whether any of the statements takes a time computed
// from now.
func clockNeeded(ss ...dialect.Stmt) bool {
	for _, s := range ss {
		if s.Takes(dialect.ArgNow) || s.Takes(dialect.ArgUntil) {
			return true
		}
	}
	return false
}

// readNow returns now for statements that take it: the caller's clock, the
// engine's read with Statements.Now through ex, or (SQLite) time.Now.
func (q *Queue) readNow(ctx context.Context, ex Executor) (time.Time, error) {
	if q.now != nil {
		return micro(q.now()), nil
	}
	if q.st.Now.SQL == "" {
		return micro(time.Now()), nil
	}
	var raw any
	if err := q.queryRow(ctx, ex, q.st.Now, &values{}).Scan(&raw); err != nil {
		return time.Time{}, err
	}
	t, err := q.dialect.ScanTime(raw)
	return micro(t), err
}

// claimNow returns now for a claim whose statements ss compare with the
// caller's clock (ArgNow), read once per claim; zero when none does, as
// under the engine's clock, where they read it in place.
func (q *Queue) claimNow(ctx context.Context, ss ...dialect.Stmt) (time.Time, error) {
	if !clockNeeded(ss...) {
		return time.Time{}, nil
	}
	return q.readNow(ctx, q.db)
}

// monoNow is the clock keepers measure with: the caller's, or time.Now with
// its monotonic reading.
func (q *Queue) monoNow() time.Time {
	if q.now != nil {
		return q.now()
	}
	return time.Now()
}

// exec runs s with v through ex and returns the rows it affected.
// A statement outside a transaction that the server chose as a deadlock's
// victim changed nothing and is sent again, up to deadlockRetries times:
// settlements are compare-and-set, so a second try is safe. Inside a
// transaction the whole transaction is gone, and the error is returned.
func (q *Queue) exec(ctx context.Context, ex Executor, s dialect.Stmt, v *values) (int64, error) {
	var n int64
	once := func() error {
		res, err := q.run(ctx, ex, s, v)
		if err == nil {
			n, err = res.RowsAffected()
		}
		return err
	}
	if _, inTx := txOf(ex); inTx {
		return n, once()
	}
	err := q.retryDeadlock(once)
	return n, err
}

// deadlockRetries is how many times a deadlock's victim is sent again.
const deadlockRetries = 10

// retryDeadlock runs f, and again while it fails as a deadlock's victim,
// up to deadlockRetries more times. f must be one statement or one whole
// transaction: the victim's is rolled back whole, so it changed nothing.
func (q *Queue) retryDeadlock(f func() error) error {
	for try := 0; ; try++ {
		err := f()
		if err == nil || try == deadlockRetries || !q.deadlock(err) {
			return err
		}
	}
}

func (q *Queue) deadlock(err error) bool {
	d, ok := capability[dialect.DeadlockDetector](q.dialect)
	return ok && d.IsDeadlock(err)
}

// run, query and queryRow are the only places statements are sent: one place
// to observe, and to change how they are sent.
func (q *Queue) run(ctx context.Context, ex Executor, s dialect.Stmt, v *values) (sql.Result, error) {
	args := q.args(s, v)
	defer freeArgs(args)
	st, err := q.prepared(ctx, ex, s)
	switch {
	case err != nil:
		return nil, err
	case st != nil:
		return st.ExecContext(ctx, *args...)
	}
	return ex.ExecContext(ctx, s.SQL, *args...)
}

func (q *Queue) query(ctx context.Context, ex Executor, s dialect.Stmt, v *values) (*sql.Rows, error) {
	args := q.args(s, v)
	defer freeArgs(args)
	st, err := q.prepared(ctx, ex, s)
	switch {
	case err != nil:
		return nil, err
	case st != nil:
		return st.QueryContext(ctx, *args...)
	}
	return ex.QueryContext(ctx, s.SQL, *args...)
}

// queryRow's errors, a failed prepare's included, come from the row's Scan.
func (q *Queue) queryRow(ctx context.Context, ex Executor, s dialect.Stmt, v *values) scanner {
	args := q.args(s, v)
	defer freeArgs(args)
	st, err := q.prepared(ctx, ex, s)
	switch {
	case err != nil:
		return failedRow{err}
	case st != nil:
		return st.QueryRowContext(ctx, *args...)
	}
	return ex.QueryRowContext(ctx, s.SQL, *args...)
}

// scanner is a *sql.Row, or a row that failed before it was sent.
type scanner interface{ Scan(dest ...any) error }

type failedRow struct{ err error }

func (r failedRow) Scan(...any) error { return r.err }

// ownTx is a transaction the queue began on its own pool. Under
// [Config.Prepare] its statements run prepared; a caller's *sql.Tx may come
// from another pool, where the queue's statements cannot run, so it gets
// the text.
type ownTx struct{ *sql.Tx }

// own returns tx as the Executor of a transaction the queue began on q.db.
func (q *Queue) own(tx *sql.Tx) Executor {
	if q.stmts == nil {
		return tx
	}
	return ownTx{tx}
}

// txOf returns the transaction ex is, the queue's own or a caller's.
func txOf(ex Executor) (*sql.Tx, bool) {
	switch t := ex.(type) {
	case *sql.Tx:
		return t, true
	case ownTx:
		return t.Tx, true
	}
	return nil, false
}

// prepared returns the prepared statement to run s through ex, or nil to
// send s as text: without [Config.Prepare], through a caller's *sql.Tx or
// *sql.Conn or a connection the queue pinned (database/sql has no statement
// of the pool's for a *sql.Conn), and in the queue's own transaction when
// s was not prepared before it began (warm).
func (q *Queue) prepared(ctx context.Context, ex Executor, s dialect.Stmt) (*sql.Stmt, error) {
	if q.stmts == nil {
		return nil, nil
	}
	switch e := ex.(type) {
	case *sql.DB:
		if e == q.db {
			return q.stmts.get(ctx, s.SQL)
		}
	case ownTx:
		// Preparing for the pool now would take a second connection
		// while the transaction holds one: with a pool of one, forever.
		if st := q.stmts.lookup(s.SQL); st != nil {
			// Prepared on the transaction's connection the first
			// time, reused after: database/sql keeps one per
			// connection.
			return e.StmtContext(ctx, st), nil
		}
	}
	return nil, nil
}

// warm prepares, under [Config.Prepare], the statements a transaction the
// queue is about to begin will run, while it holds no connection. A prepare
// that fails leaves its statement to be sent as text.
func (q *Queue) warm(ctx context.Context, ss ...dialect.Stmt) {
	if q.stmts == nil {
		return
	}
	for _, s := range ss {
		if s.SQL != "" {
			_, _ = q.stmts.get(ctx, s.SQL)
		}
	}
}

// stmtCache holds the statements of a queue with [Config.Prepare], by their
// text, prepared at their first use. database/sql prepares each once on
// every connection it then runs on, and keeps each until it is closed: the
// last of the queues sharing the cache to close closes them.
type stmtCache struct {
	db     *sql.DB
	mu     sync.Mutex
	m      map[string]*sql.Stmt
	users  int  // queues sharing the cache and not closed
	closed bool // the statements are closed: send text
}

func newStmtCache(db *sql.DB) *stmtCache {
	return &stmtCache{db: db, m: map[string]*sql.Stmt{}, users: 1}
}

// share adds a queue to the cache's users.
func (c *stmtCache) share() *stmtCache {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.users++
	return c
}

func (c *stmtCache) lookup(text string) *sql.Stmt {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[text]
}

// get returns text's statement, preparing it the first time, or nil once
// the cache is closed. A prepare that fails (a cancelled context, a broken
// connection) is tried again at the next use.
func (c *stmtCache) get(ctx context.Context, text string) (*sql.Stmt, error) {
	c.mu.Lock()
	st, closed := c.m[text], c.closed
	c.mu.Unlock()
	if st != nil || closed {
		return st, nil
	}
	st, err := c.db.PrepareContext(ctx, text)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if first := c.m[text]; first != nil || c.closed {
		// Another call prepared it meanwhile, or the cache closed.
		_ = st.Close()
		return first, nil
	}
	c.m[text] = st
	return st, nil
}

// release takes one user away, closing the statements with the last.
func (c *stmtCache) release() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.users--; c.users > 0 {
		return nil
	}
	c.closed = true
	var first error
	for text, st := range c.m {
		if err := st.Close(); err != nil && first == nil {
			first = err
		}
		delete(c.m, text)
	}
	return first
}

// moveDead moves the row v names to the dead table and returns the rows
// moved. A move in one statement (Postgres) is atomic alone; one in two
// runs inside ex when ex is a transaction, else in a transaction of its own
// begun on ex (a *sql.DB or *sql.Conn).
func (q *Queue) moveDead(ctx context.Context, ex Executor, v *values) (int64, error) {
	if v.now.IsZero() && q.st.Settle.Dead.Takes(dialect.ArgNow) {
		// The time of death (Table.DeadAt) by the caller's clock.
		now, err := q.readNow(ctx, ex)
		if err != nil {
			return 0, err
		}
		v.now = now
	}
	if q.st.Settle.DeadDelete.SQL == "" {
		return q.exec(ctx, ex, q.st.Settle.Dead, v)
	}
	if _, ok := txOf(ex); ok {
		return q.copyDead(ctx, ex, v)
	}
	b, ok := ex.(interface {
		BeginTx(context.Context, *sql.TxOptions) (*sql.Tx, error)
	})
	if !ok {
		return 0, fmt.Errorf("moving to the dead table: %T cannot begin a transaction", ex)
	}
	if ex == Executor(q.db) {
		q.warm(ctx, q.st.Settle.Dead, q.st.Settle.DeadDelete)
	}
	// The transaction ends where this function ends it, never behind its
	// back: one begun with ctx would be rolled back by database/sql, from a
	// goroutine of its own, when ctx ends, and a settlement that then reads
	// back its outcome on the same session (an advisory delivery's pinned
	// connection) could read inside it. The statements still take ctx.
	tx, err := b.BeginTx(context.WithoutCancel(ctx), nil)
	if err != nil {
		return 0, err
	}
	// Begun on q.db or on a connection the queue pinned from it.
	n, err := q.copyDead(ctx, q.own(tx), v)
	if err != nil || n == 0 {
		_ = tx.Rollback()
		return n, err
	}
	return n, tx.Commit()
}

// copyDead copies the row into the dead table, then deletes it, in the
// transaction tx.
func (q *Queue) copyDead(ctx context.Context, tx Executor, v *values) (int64, error) {
	n, err := q.exec(ctx, tx, q.st.Settle.Dead, v)
	if err != nil || n == 0 {
		return n, err
	}
	m, err := q.exec(ctx, tx, q.st.Settle.DeadDelete, v)
	if err == nil && m != n {
		err = fmt.Errorf("moved %d rows to the dead table but deleted %d", n, m)
	}
	return n, err
}
