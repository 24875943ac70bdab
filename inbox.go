// Package inbox turns a table of your own SQL database into a job queue.
//
// A [Queue] claims rows of the table as deliveries, keeps them out of every
// other claim while a handler works, and settles them: [Delivery.Ack],
// [Delivery.Retry], [Delivery.Release] or [Delivery.Dead]. The table's
// description chooses how a claimed job is held: by the claim's transaction
// (row lock, the default), by an expiry written into the row (lease, when
// [Table.LockedUntil] is named) or by a session lock on a key (advisory, when
// [Table.AdvisoryKey] is named). The package starts no goroutine unless
// asked for a lease keeper ([Delivery.Keep]), never polls or logs, and waits
// only where asked to: a [Batcher] holds a settlement up to its MaxWait to
// gather others. Nothing it holds is let go by the garbage collector:
// [Queue.Close] closes what [Config.Prepare] prepared, and its process-wide
// state lasts only while something uses it: the connections and advisory
// keys of jobs in work until they settle, a table's [Queue.NextWake]
// channel from a wait to the next wake-up. The worker loop that polls and
// sleeps is package github.com/sqlinbox/inbox/worker, written on this
// package's exported API.
package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultLease is the lease when [Config.Lease] is zero.
const DefaultLease = 30 * time.Second

// Table describes the caller's queue table. Only Name is required; the column
// names default to the reference schema's id, attempt and payload.
type Table struct {
	// Name is the table, optionally schema-qualified ("jobs.report_jobs").
	Name string
	// ID is the primary key: an integer or text (a UUID, say). Default "id".
	// An id the database assigns must be one it reports to Enqueue:
	// RETURNING reads any default on PostgreSQL and SQLite, but MySQL and
	// MariaDB report only AUTO_INCREMENT's ([ErrIDNotReturned]); a text key
	// there has no default, and every Job gives its ID.
	ID string
	// Attempt holds the number of the attempt the next claim delivers (1 for
	// a new row). Default "attempt".
	Attempt string
	// Data are the columns delivered with each job, scanned by
	// [Delivery.Scan] in this order. Default ["payload"].
	Data []string

	// LockedUntil names the lease column and selects the lease form.
	LockedUntil string
	// Shallow declares a lease table that stays short: drained about as
	// fast as it fills, with few jobs delayed or under lease at a time.
	// The claim then reads free and expired rows together, in claim order
	// through the primary key (or the priority's index), and the table
	// needs no claim index (docs/schema.md): writing a lease touches no
	// index, so each job costs less to claim and settle. Each claim steps
	// over the rows under lease and the delayed ones ahead of the first it
	// takes, so a table holding many of them wants the claim indexes and
	// Shallow false. Lease form only.
	Shallow bool
	// AdvisoryKey names the key column and selects the advisory form: "id"
	// holds each job alone; another column keeps the jobs sharing a value in
	// work one at a time. Enqueue writes another column only when Data
	// lists it (each Job gives its key); one it does not write must be
	// filled by the database (a default, a generated column), which
	// [Queue.CheckSchema] checks, as New cannot see the table.
	AdvisoryKey string

	// NotBefore names an optional column: a job is not claimed before the
	// time it holds. It carries Retry delays under the row lock and advisory
	// forms. The lease form needs none: its delays are leases.
	NotBefore string
	// ClaimsTable names an optional side table (optionally
	// schema-qualified) counting the row-lock deliveries of each job whose
	// holder ended without settling, so that a job that keeps killing its
	// process is noticed: after more than MaxClaims such deliveries, its next
	// claim moves it to DeadTable instead of delivering it. Its columns are the job id (named as
	// Table.ID, the primary key) and claims, an integer. The count is written
	// from a second session once the claim holds the row's lock, so it is
	// committed whatever becomes of the claim's transaction, and only the
	// holder writes it; every settlement takes its delivery's count back
	// (Ack, Retry and Dead clear it, Release subtracts one). A crash between
	// the lock and the count leaves the delivery uncounted, the safe side.
	ClaimsTable string
	// MaxClaims is the limit for ClaimsTable; required with it.
	MaxClaims int
	// DeadTable names the dead-letter table (optionally schema-qualified),
	// with the columns ID, Attempt and Data of this table (and LastError,
	// when named). Dead needs it.
	DeadTable string
	// DeadAt names an optional time column of the dead table (same type as
	// the lease column would have: timestamptz, DATETIME(6), or TEXT on
	// SQLite) that Dead writes with the clock's time, so that
	// [Queue.ListDead] lists the most recent deaths first (the jobs dead
	// before the column was added, NULL, last) and [Queue.PurgeDead] can
	// keep the recent ones. Needs DeadTable.
	DeadAt string

	// LastError names an optional text column: Retry and Dead write the
	// error recorded with [Delivery.SetError] (its first [MaxErrorText]
	// bytes) and the dead table keeps it; a claim delivers it
	// ([Delivery.LastError]).
	LastError string
	// Priority names an optional integer column: claims take the highest
	// priority first, then the oldest id. [Job.Priority] sets it.
	Priority string
	// EnqueuedAt names an optional time column that Enqueue writes with the
	// clock's time, for [Queue.Stats]' age of the oldest ready job.
	EnqueuedAt string
	// UniqueKey names an optional text column, covered alone by a unique
	// index, that holds [Job.UniqueKey]: while a job with a key is in the
	// table (waiting, retrying or in work), another with that key is not
	// inserted ([ErrDuplicate]). Acknowledged or dead, the job frees its
	// key. docs/unique.md has the schema.
	UniqueKey string
	// ControlTable names an optional table (optionally schema-qualified)
	// holding whether the queue is paused ([Queue.Pause]): one row per
	// queue table, keyed by the table's name without its schema, so that
	// "jobs" and "public.jobs" pause alike. docs/operations.md has the schema.
	ControlTable string
}

// MaxErrorText is the most bytes of an error's text that Table.LastError
// keeps: longer texts are cut at a character boundary.
const MaxErrorText = 2000

// Config configures a [Queue]. Its zero value, but for Table.Name and
// Dialect, means the documented defaults. New takes it by value.
type Config struct {
	// Dialect is the engine: [Postgres], [MySQL] or [SQLite], or your own.
	Dialect Dialect
	// Table describes the queue table.
	Table Table
	// Lease is the lease form's lease: zero means [DefaultLease]. A negative
	// lease, or one under a microsecond, is refused. Other forms refuse a
	// lease.
	Lease time.Duration
	// Now replaces the database's clock with the caller's, passed to SQL as a
	// parameter, so tests can stop time. Every worker of a table must share
	// one clock. SQLite always uses the caller's clock: time.Now by default.
	// A clock that stands still gives a job released and claimed again the
	// lease token it had (id, attempt, expiry), so a stale holder's late
	// settlement would match the new delivery: move a stopped clock on
	// between a Release and the next claim.
	Now func() time.Time
	// After replaces time.After in keepers, with Now, so that a test clock
	// drives them too.
	After func(time.Duration) <-chan time.Time
	// NotifyChannel, on PostgreSQL, makes Enqueue send a notification on
	// this channel in the same statement, delivered when the job commits,
	// so that idle loops of other processes wake through a listener that
	// calls [Queue.Wake] (package worker's Listen). An identifier: letters,
	// digits and underscores.
	NotifyChannel string
	// KeepMargin is how long before the last expiry it knows of a keeper
	// whose extensions keep failing cancels its handler. Zero means a tenth
	// of the lease. It is also the skew the lease tolerates between the
	// clocks that write and compare expiries: see [Queue.CheckSchema].
	KeepMargin time.Duration
	// Prepare makes the queue prepare each statement at its first use and
	// run it prepared from then on, through its pool and the transactions
	// it begins (database/sql prepares it once on each connection it runs
	// on). Statements through the caller's *sql.Tx or *sql.Conn, and the
	// advisory form's pinned connections, are sent as text. It is for
	// drivers that otherwise send and plan every statement anew: lib/pq
	// (two round trips and a plan each), go-sql-driver/mysql without
	// interpolateParams (a prepare, a run and a close each), and both
	// SQLite drivers, where compiling a statement can cost more than
	// running it; pgx caches statements itself. Not behind PgBouncer in
	// transaction pooling before 1.21 (max_prepared_statements), which
	// loses prepared statements between transactions. The SQL is the same text either way. The
	// statements stay prepared until [Queue.Close].
	Prepare bool
	// ClaimsAtOnce bounds how many [Queue.Claim] calls of this queue send
	// their statements at once; the others wait their turn in Go, or until
	// their context ends. Zero: no bound. Claims side by side contend at
	// the server (rows locked and stepped over, advisory locks refused,
	// sessions sharing its cores): on two cores, 64 workers in one process
	// claiming freely ran at 0.48 (lease) and 0.73 (advisory) of 16 on
	// MariaDB, and at 0.98 and 0.99 with 8 at once (docs/scaling.md). Set
	// it to about what the server serves at once, shared among the
	// processes that claim from it; a bound too low for a distant server
	// caps the rate at it over a claim's round trips.
	ClaimsAtOnce int
}

// Queue claims and settles the jobs of one table. It is safe for concurrent
// use. Its configuration is fixed by [New]; what it holds is the jobs in
// work, which settle or [Queue.Shutdown] give back, and under
// [Config.Prepare] the prepared statements, which [Queue.Close] lets go of.
type Queue struct {
	db      *sql.DB
	cfg     Config
	dialect Dialect
	names   dialect.Names
	st      *Statements
	form    form // what the claim form does differently
	locker  dialect.Locker
	lease   time.Duration
	// leaseMicros is the lease in microseconds, boxed once for the
	// statements that take it.
	leaseMicros any
	now         func() time.Time // nil: the database's clock
	after       func(time.Duration) <-chan time.Time
	margin      time.Duration
	stmts       *stmtCache // Config.Prepare: the prepared statements; nil: text
	closed      atomic.Bool
	holds       poolHolds     // the connections held by jobs in work
	keys        keySet        // advisory keys in work in this process
	gone        goneSet       // advisory: rows this queue deleted lately, which a walk passes over
	elsewhere   heldSet       // advisory: keys found locked by other sessions lately, which a walk passes over
	claiming    chan struct{} // Config.ClaimsAtOnce: a place for each claim under way; nil: no bound

	identMu sync.Mutex
	ident   string // advisory: the table's identity, resolved at the first claim
	// lockPage (advisory) is the page a claim last needed to find a free
	// key: held keys of other processes stand ahead of it, which the keys
	// this process holds do not count.
	lockPage atomic.Int64
	// contended (advisory, LockFirstContended) counts the claims left that
	// lock in SQL since a walk found a key held by another session.
	contended atomic.Int64
	// pickPast (row lock, Claim.PickFirst) counts the claims left that
	// pick without PickFirst since one found its page held and the pick
	// after it found a job past: other processes' jobs hold the head.
	pickPast atomic.Int64
	// walkPast (row lock, Claim.WalkFirst) counts the claims left that
	// claim without WalkFirst since one gave up on jobs not yet ready.
	walkPast atomic.Int64
	// takeMissed (lease, Claim.WalkTake) counts the claims in a row
	// (none claimed by WalkTake between) whose WalkTake found nothing
	// where the reads after it found a job: the second starts walkPast's
	// span.
	takeMissed atomic.Int64
	// picking (row lock) counts the claims under way: each may hold a row
	// it locked and has not yet tracked, which a claim's first page passes
	// too.
	picking atomic.Int64
	// levelled (lease, row lock): every claim read carries the session's
	// isolation level (dialect.Stmt.Level), so claims begin at the
	// session's own level until one finds it is not READ COMMITTED; then
	// levelSet, and every claim sets the level first, as without levelled.
	levelled bool
	levelSet atomic.Bool

	bell      bell // wakes the idle loops of the table in this process (NextWake)
	pauseBell bell // tells them of a Pause or Resume in this process (PauseChanged)

	mu   sync.Mutex
	live map[*Delivery]struct{} // held jobs (row lock, advisory), for Shutdown
	// unconfirmed are advisory deliveries settled in a caller's
	// transaction not yet known to have committed: the next claim looks.
	unconfirmed map[*Delivery]struct{}
}

// New returns a queue on db for the table cfg describes. It validates the
// description and quotes every identifier for the dialect, and does no I/O.
// An error names the field and the value that is wrong.
func New(db *sql.DB, cfg Config) (*Queue, error) {
	if db == nil {
		return nil, errors.New("inbox: new: db is nil")
	}
	if cfg.Dialect == nil {
		return nil, errors.New("inbox: new: Config.Dialect is nil (use inbox.Postgres, inbox.MySQL, inbox.MariaDB or inbox.SQLite)")
	}
	cfg.Table = cfg.Table.withDefaults()
	n, err := describe(cfg.Dialect, cfg.Table)
	if err != nil {
		return nil, err
	}
	if cfg.NotifyChannel != "" {
		if err := checkIdent(cfg.NotifyChannel); err != nil {
			return nil, fmt.Errorf("inbox: new: Config.NotifyChannel %q: %v", cfg.NotifyChannel, err)
		}
		n.NotifyChannel = cfg.NotifyChannel
	}
	q := &Queue{db: db, cfg: cfg, dialect: cfg.Dialect, after: cfg.After, margin: cfg.KeepMargin,
		live: map[*Delivery]struct{}{}, bell: bellOf(n.TableName), pauseBell: bellOf("\x00pause\x00" + n.TableName)}
	if err := q.setLease(n.Form); err != nil {
		return nil, err
	}
	if cfg.ClaimsAtOnce < 0 {
		return nil, fmt.Errorf("inbox: new: Config.ClaimsAtOnce %d is negative (0 for no bound)", cfg.ClaimsAtOnce)
	}
	if cfg.ClaimsAtOnce > 0 {
		q.claiming = make(chan struct{}, cfg.ClaimsAtOnce)
	}
	q.now = cfg.Now
	n.DBClock = cfg.Now == nil
	if cfg.Prepare {
		q.stmts = newStmtCache(db)
	}
	if q.st, err = cfg.Dialect.Statements(&n); err == nil {
		err = checkRowLock(&n, q.st)
	}
	if err == nil {
		err = checkControl(&n, q.st)
	}
	if err == nil && len(q.st.Claim.TakeBounded) > 0 && len(q.st.Claim.TakeBounded) != dialect.ClaimBounds {
		err = fmt.Errorf("Statements.Claim.TakeBounded has %d statements, want %d (1, 2, 4, …, 512 and %d)", len(q.st.Claim.TakeBounded), dialect.ClaimBounds, MaxClaim)
	}
	if err != nil {
		return nil, opErr("new: "+cfg.Dialect.Name(), err)
	}
	q.names, q.form = n, formOf(n.Form)
	q.levelled = claimReadsLevelled(n.Form, q.st)
	if l, ok := capability[dialect.Locker](cfg.Dialect); ok && n.Form == Advisory {
		q.locker = l
	}
	q.holds, q.keys = poolHolds{db}, processKeys
	if q.locker != nil {
		q.keys = keySet{scope: db}
	}
	return q, nil
}

// setLease checks Config.Lease and Config.KeepMargin and sets q's lease
// and keeper margin, defaults filled in.
func (q *Queue) setLease(f Form) error {
	cfg := q.cfg
	switch {
	case f != Lease && cfg.Lease != 0:
		return fmt.Errorf("inbox: new: Config.Lease %v is for the lease form; name Table.LockedUntil to select it", cfg.Lease)
	case cfg.Lease < 0:
		return fmt.Errorf("inbox: new: Config.Lease %v is negative", cfg.Lease)
	case cfg.Lease > 0 && cfg.Lease < time.Microsecond:
		return fmt.Errorf("inbox: new: Config.Lease %v is under a microsecond, the columns' precision", cfg.Lease)
	case cfg.Lease == 0:
		q.lease = DefaultLease
	default:
		q.lease = cfg.Lease
	}
	q.leaseMicros = q.lease.Microseconds()
	if cfg.KeepMargin < 0 || (f == Lease && cfg.KeepMargin >= q.lease/2) {
		return fmt.Errorf("inbox: new: Config.KeepMargin %v must be at least zero and under half the lease", cfg.KeepMargin)
	}
	if q.margin == 0 {
		q.margin = q.lease / 10
	}
	return nil
}

// WithLease returns a queue like q with lease d, for a table whose jobs need
// another lease than the configuration's. Unlike [Config.Lease], where zero
// means the default, a zero lease is an error here, as is a negative one or
// one under a microsecond; so is any lease under a form other than the lease.
func (q *Queue) WithLease(d time.Duration) (*Queue, error) {
	if d == 0 {
		return nil, errors.New("inbox: with lease: the lease is zero")
	}
	cfg := q.cfg
	cfg.Lease = d
	wl, err := New(q.db, cfg)
	if err == nil && q.stmts != nil {
		// The same statements: prepared once for both.
		wl.stmts = q.stmts.share()
	}
	return wl, err
}

// Form reports the queue's claim form.
func (q *Queue) Form() Form { return q.names.Form }

// Lease reports the lease of the lease form.
func (q *Queue) Lease() time.Duration { return q.lease }

// Statements returns the SQL the queue runs, for documentation and for
// sqlmock expectations in the caller's own tests. The result must not be
// changed.
func (q *Queue) Statements() *Statements { return q.st }

// Config returns the configuration q was made with, the Table's defaults
// filled in: a loop reads there whether a dead table or a not-before column
// is named, and the notification channel.
func (q *Queue) Config() Config {
	c := q.cfg
	c.Table.Data = slices.Clone(c.Table.Data)
	return c
}

// Executor runs statements: *sql.DB, *sql.Tx and *sql.Conn all are one.
type Executor interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// MaxClaim is the most jobs one [Queue.Claim] takes: a claim holds them all
// until the caller has them, and a larger one would only lengthen the
// statement and the time its rows stay locked.
const MaxClaim = 1000

// Claim claims up to max jobs and returns them; none claimable is an empty
// result. A max outside 1 to [MaxClaim] is an error, before any I/O. On an error no job is handed over: jobs claimed before the error
// are given back as by Release, and a context that ends during the call is
// such an error. One case cannot be undone from here: a context that ends
// after a lease or advisory claim committed but before its rows were read
// leaves those jobs as a crash would, their attempt spent, back when the
// lease runs out (lease) or at once (advisory). On [MariaDB] a lease claim
// of one whose context has no deadline within a second commits at the
// server in one statement (Claim.WalkTake): cut, it may still lease the
// job it found, which then waits for its lease to run out. Under the row lock and advisory forms each job holds a connection
// until it settles, and Claim never takes the pool's last one: it returns
// fewer jobs instead.
func (q *Queue) Claim(ctx context.Context, max int) ([]*Delivery, error) {
	if max <= 0 || max > MaxClaim {
		return nil, fmt.Errorf("inbox: claim: max %d must be from 1 to %d", max, MaxClaim)
	}
	if err := ctx.Err(); err != nil {
		return nil, opErr("claim", err)
	}
	if q.claiming != nil {
		if err := q.waitClaimTurn(ctx); err != nil {
			return nil, opErr("claim", err)
		}
		defer func() { <-q.claiming }()
	}
	ds, err := q.form.claim(ctx, q, max)
	if err == nil && len(ds) > 0 {
		// A context cancelled while a statement ran can break the
		// connection a delivery holds even though the statement succeeded
		// (lib/pq closes it): such a claim counts as cancelled.
		err = ctx.Err()
	}
	if err != nil {
		// A claim that failed part way gives back what it took, so that an
		// error means nothing was claimed.
		for _, d := range ds {
			_ = d.Release(context.WithoutCancel(ctx))
		}
		return nil, opErr("claim", err)
	}
	return ds, nil
}

// waitClaimTurn takes a place among the claims under way
// (Config.ClaimsAtOnce), waiting for one to end; it returns ctx's error,
// holding no place, when ctx ends first.
func (q *Queue) waitClaimTurn(ctx context.Context) error {
	select {
	case q.claiming <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := ctx.Err(); err != nil {
		// Both were ready, and select chose the place.
		<-q.claiming
		return err
	}
	return nil
}

// Shutdown gives back every job this queue holds by a transaction or an
// advisory lock, at once, as Release would (their connections go back to the
// pool), and stops the extensions of lease deliveries, which keep their
// leases and may still settle: their keepers still cancel the handlers by
// the leases' end. It returns the first error met; the rest are still
// released.
func (q *Queue) Shutdown(ctx context.Context) error {
	q.mu.Lock()
	held := make([]*Delivery, 0, len(q.live))
	for d := range q.live {
		held = append(held, d)
	}
	q.mu.Unlock()
	var first error
	for _, d := range held {
		if err := q.form.shutdown(ctx, d); err != nil && !errors.Is(err, ErrSettled) && first == nil {
			first = err
		}
	}
	return first
}

// Close lets go of the statements the queue prepared under
// [Config.Prepare], which database/sql keeps until they are closed: those
// shared with queues [Queue.WithLease] made are closed with the last of
// them. A queue without Config.Prepare holds nothing Close lets go of.
// Call it once no call of the queue is running: a statement in flight may
// fail with database/sql's "statement is closed". Close neither settles nor
// gives back jobs in work ([Queue.Shutdown] does); a queue used after it
// sends its statements as text. Closing twice does nothing more.
func (q *Queue) Close() error {
	if q.stmts == nil || q.closed.Swap(true) {
		return nil
	}
	if err := q.stmts.release(); err != nil {
		return opErr("close", err)
	}
	return nil
}

func (q *Queue) track(d *Delivery) {
	q.mu.Lock()
	q.live[d] = struct{}{}
	q.mu.Unlock()
}

func (q *Queue) untrack(d *Delivery) {
	q.mu.Lock()
	delete(q.live, d)
	q.mu.Unlock()
}

// InWork reports how many jobs this queue holds by transaction, advisory lock
// or a running keeper.
func (q *Queue) InWork() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.live)
}
