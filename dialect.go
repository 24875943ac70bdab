package inbox

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"time"
)

// A Dialect turns a validated table description into the SQL of one engine.
// [Postgres], [MySQL] (MySQL 8, and MariaDB too), [MariaDB] and [SQLite] ship
// with the package. [New] calls Statements once per queue; TimeArg and
// ScanTime run for every time a statement sends or a claim reads.
//
// The contract is open: another engine is added from outside the package by
// implementing this interface with the exported types alone, as
// examples/cockroach does for CockroachDB (the lease form, the only one its
// engine can hold a job by, with its batched statements and the optional
// columns). It is a contract
// that grows, as goose's Querier does: a new optional column or feature
// adds a field to [Names] and the statements that write it to
// [Statements]. A dialect that does not write what a description names
// refuses it in Statements with an error naming the field, and keeps
// serving the descriptions it can. Each form reads only its own fields
// (each field's doc names its form and what leaving it empty means), so a
// dialect of one form writes that form's alone.
//
// A Dialect may implement optional interfaces, each with its fallback:
//
//   - [Locker]: session locks for the advisory form. Without it the process
//     holds the advisory keys alone, as on SQLite: one process per database.
//   - [TableIdentifier]: the table's identity, however its name is spelled.
//     Without it the name as described is the identity.
//   - [DeadlockDetector]: which errors are a deadlock's victim. Without it
//     no statement is sent again after a deadlock.
//   - [BatchDialect]: batched lease settlements. Without it
//     [Queue.NewBatcher] returns an error.
//   - [BulkEnqueuer]: many jobs in one statement. Without it
//     [Queue.EnqueueMany] sends Enqueue's statement once per job.
//   - [SchemaChecker]: the schema check. Without it [Queue.CheckSchema]
//     returns an error.
//   - Unwrap() Dialect: a dialect wrapping another (to log its statements,
//     say) names it, and the optional interfaces it does not implement
//     itself are those of the dialect it wraps, so wrapping loses none.
type Dialect interface {
	// Name names the engine in errors.
	Name() string
	// QuoteIdent quotes one identifier (never schema-qualified). The core has
	// already checked it against the package's identifier rule; a dialect may
	// refuse more.
	QuoteIdent(ident string) (string, error)
	// Statements returns every statement a queue with these names runs, or an
	// error naming what the engine lacks (a form, a column kind).
	Statements(n *Names) (*Statements, error)
	// TimeArg converts an instant (UTC, truncated to microseconds) into the
	// value passed for a time parameter.
	TimeArg(t time.Time) any
	// ScanTime converts a value read from a time column back into an instant.
	ScanTime(src any) (time.Time, error)
}

// Locker is implemented by a [Dialect] whose engine has session-level locks; the
// advisory form uses it. Without it the advisory form holds its keys in the
// process alone (SQLite).
type Locker interface {
	// TryLock takes the session lock of key on conn without waiting, reporting
	// whether it was taken. table is the table's identity
	// ([TableIdentifier]), or its name as described.
	TryLock(ctx context.Context, conn *sql.Conn, table, key string) (bool, error)
	// Unlock lets the lock go. An error means the session's state is unknown:
	// the caller discards the connection.
	Unlock(ctx context.Context, conn *sql.Conn, table, key string) error
}

// TableIdentifier is implemented by a [Dialect] that can tell which table a
// description reaches, however its name is spelled and whichever pool
// reaches it. The advisory form names its locks and its in-process keys by
// this identity, so that "jobs" and "public.jobs" are one table. Without it
// the table's name as described is its identity.
type TableIdentifier interface {
	// TableIdentity returns the table's identity: the same text for every
	// spelling of one table on one server (or database file), different for
	// different tables. An error means the table could not be resolved.
	TableIdentity(ctx context.Context, db *sql.DB, n *Names) (string, error)
}

// DeadlockDetector is implemented by a [Dialect] that can tell a deadlock
// victim's error from others: the victim changed nothing, and the queue sends
// a single statement, a lease claim or a batch again, up to ten times.
type DeadlockDetector interface {
	IsDeadlock(err error) bool
}

// capability returns d's optional interface T, or that of the dialect d
// wraps (Unwrap), and so on down.
func capability[T any](d Dialect) (T, bool) {
	for d != nil {
		if c, ok := d.(T); ok {
			return c, true
		}
		w, ok := d.(interface{ Unwrap() Dialect })
		if !ok {
			break
		}
		d = w.Unwrap()
	}
	var none T
	return none, false
}

// The built-in dialects have every optional interface but SQLite's Locker.
var (
	_ Locker           = postgres{}
	_ Locker           = mysql{}
	_ Locker           = mariadb{}
	_ TableIdentifier  = postgres{}
	_ TableIdentifier  = mysql{}
	_ TableIdentifier  = mariadb{}
	_ TableIdentifier  = sqlite{}
	_ DeadlockDetector = postgres{}
	_ DeadlockDetector = mysql{}
	_ DeadlockDetector = mariadb{}
	_ BatchDialect     = postgres{}
	_ BatchDialect     = mysql{}
	_ BatchDialect     = mariadb{}
	_ BatchDialect     = sqlite{}
	_ SchemaChecker    = postgres{}
	_ SchemaChecker    = mysql{}
	_ SchemaChecker    = mariadb{}
	_ SchemaChecker    = sqlite{}
)

// BatchDialect is implemented by a [Dialect] that can settle many lease
// deliveries in one statement; [Queue.NewBatcher] needs it. Postgres, MySQL,
// MariaDB and SQLite implement it.
type BatchDialect interface {
	// BatchStatements returns the statements settling size lease tokens at
	// once. Called by NewBatcher only, for a few sizes, never per flush.
	BatchStatements(n *Names, size int) (*BatchStatements, error)
}

// BatchStatements settle Size lease tokens (id, stored attempt, expiry) at
// once, each a compare-and-set on its own token as the single-job
// settlements are. A statement takes each token's ArgID, ArgAttempt and
// ArgExpiry in turn: the n-th of each is the n-th token's, and the last
// token fills the places past the batch, so a statement's size need not
// match the batch's exactly. Or it takes the whole batch as ArgIDs,
// ArgAttempts and ArgExpiries, each once or more, whatever its size.
type BatchStatements struct {
	Size int
	// Ack deletes the rows; Release clears their leases and gives their
	// attempts back; Retry sets their expiry to ArgUntil, or to the engine's
	// clock plus ArgMicros.
	// Each returns the ids of the rows it settled (Rows) or, where the
	// engine cannot, relies on Lock.
	Ack, Release, Retry Stmt
	// Lock returns the ids of the rows still carrying their tokens and locks
	// them until the transaction ends. Engines whose statements cannot
	// return the rows they changed (MySQL; MariaDB's Release and Retry) set
	// it: when a statement affects fewer rows than the batch has tokens, the
	// batcher rolls back and runs Lock then the statement again in a new
	// transaction, so that each job learns its own result.
	Lock Stmt
}

// SchemaChecker is implemented by a [Dialect] that can verify a table against
// a queue's description; [Queue.CheckSchema] uses it.
type SchemaChecker interface {
	// CheckSchema returns every problem found, each a sentence naming what is
	// wrong. An error means the check itself could not run.
	CheckSchema(ctx context.Context, db *sql.DB, n *Names) ([]string, error)
}

// Form is how a claimed job is held while its handler runs.
type Form int

const (
	// RowLock holds a job by the claim's transaction (FOR UPDATE SKIP LOCKED),
	// open until the settlement commits it. It is the default.
	RowLock Form = iota
	// Lease holds a job by an expiry written into its row.
	Lease
	// Advisory holds a job by a session lock on its key, on a pinned connection.
	Advisory
)

func (f Form) String() string {
	switch f {
	case RowLock:
		return "row lock"
	case Lease:
		return "lease"
	case Advisory:
		return "advisory lock"
	}
	return "form(" + strconv.Itoa(int(f)) + ")"
}

// Names is a table description after validation, as a [Dialect] receives it:
// every identifier already quoted by that dialect, the optional ones empty when
// the description leaves them out.
type Names struct {
	Form Form
	// Table is the quoted, possibly schema-qualified table name; Schema and
	// TableName are its unquoted parts (Schema empty when not qualified).
	Table, Schema, TableName string
	ID, Attempt              string
	// Data are the quoted data columns, in the order deliveries scan them.
	Data []string
	// LockedUntil is the lease column (Lease form), Key the advisory key column
	// (Advisory form).
	LockedUntil, Key string
	// Shallow is [Table.Shallow]: the lease claim reads free and expired
	// rows in one ordered read, needing no index on the lease column.
	Shallow bool
	// NotBefore is the optional not-before column.
	NotBefore string
	// LastError, Priority and EnqueuedAt are the optional columns of the
	// last error text, the priority (higher first) and the enqueue time.
	LastError, Priority, EnqueuedAt string
	// Dead is the quoted dead-letter table, empty when none is named.
	Dead, DeadSchema, DeadName string
	// DeadAt is the dead table's quoted time of death column, empty when
	// none is named.
	DeadAt string
	// ClaimsTable is the quoted side table of the row-lock claims counter,
	// empty when none is named; its columns are ID and claims.
	ClaimsTable, ClaimsSchema, ClaimsName string
	// NotifyChannel is the channel Enqueue notifies ([Config.NotifyChannel]),
	// validated as an identifier; empty for none.
	NotifyChannel string
	// DBClock is true when the engine's clock decides: statements may read it
	// themselves. When false, they take [ArgNow] and [ArgUntil] instead.
	DBClock bool
	// Raw is the description as given.
	Raw Table
}

// Arg names a value a statement takes, so that a dialect places its
// parameters in whatever order and style its SQL needs and the core fills them.
type Arg int

const (
	ArgID        Arg = iota + 1 // the job's id
	ArgAttempt                  // the attempt as stored in the row: the delivered one plus one
	ArgDelivered                // the attempt delivered to the handler
	ArgExpiry                   // the lease's expiry as stored: the ownership token's third part
	ArgNow                      // now, by the caller's clock or the one [Statements.Now] read
	ArgUntil                    // a new time computed from now: now+lease, now+retry delay
	ArgMicros                   // the lease or retry delay in microseconds, for a statement reading the engine's clock
	ArgLimit                    // the most rows a statement may claim
	ArgNotBefore                // a time the caller gave: Enqueue's not-before, ListDead's cursor, PurgeDead's cutoff
	ArgError                    // the error text a Retry or Dead records (NULL for none: the row keeps its own)
	ArgPriority                 // a job's priority: Enqueue's, or the last candidate's for the next page
	ArgIDs                      // a batch's ids, one PostgreSQL array literal ("{1,2}"): a batch statement's per-row fence in three parameters
	ArgAttempts                 // a batch's stored attempts (ArgAttempt of each token), an array literal as ArgIDs
	ArgExpiries                 // a batch's expiries, an array literal as ArgIDs of timestamptz text in UTC to the microsecond
	ArgIdentity                 // the table's identity ([TableIdentifier]), which names its advisory locks
	ArgData                     // ArgData+i is the value of the i-th data column (Enqueue)
)

// Stmt is one statement: its text and the values of its parameters, in order.
type Stmt struct {
	SQL  string
	Args []Arg
	// Rows is true when the statement returns rows (RETURNING, SELECT).
	Rows bool
	// Clock is true when each row it returns ends with the engine's clock,
	// as Now returns it. A lease ClaimSelect and ClaimSelectMore under the
	// engine's clock may: they then compare with that clock in place, the
	// claim reads no clock apart, and the ArgNow and ArgUntil of its
	// ClaimMark come from the first reading that came with rows.
	Clock bool
}

// claimBounds is the length of Statements.ClaimBounded.
const claimBounds = 11

// ClaimFor returns the statement a lease claim of max jobs (1 to
// [MaxClaim]) sends: the first of ClaimBounded whose bound is at or above
// max, else ClaimOne for one job, else Claim (empty where the claim is
// ClaimSelect then ClaimMark). Tests that expect a claim's SQL take it
// from here.
func (s *Statements) ClaimFor(max int) Stmt {
	if len(s.ClaimBounded) > 0 {
		i, bound := 0, 1
		for bound < max && i < len(s.ClaimBounded)-1 {
			i, bound = i+1, bound*2
		}
		return s.ClaimBounded[i]
	}
	if max == 1 && s.ClaimOne.SQL != "" {
		return s.ClaimOne
	}
	return s.Claim
}

func (s Stmt) has(a Arg) bool {
	for _, x := range s.Args {
		if x == a {
			return true
		}
	}
	return false
}

// Statements is every statement one queue runs. Which fields are set depends on
// the form and the engine; each field says what it must return.
type Statements struct {
	// Now returns the engine's clock (one row, one column). Set by engines
	// whose UPDATE cannot return the times it writes (MySQL): their statements
	// then take ArgNow and ArgUntil, which the core computes from this reading.
	Now Stmt

	// Claim claims in one statement. Rows: id, delivered attempt, then (lease
	// form) the stored expiry, then the data columns. Lease: up to ArgLimit
	// rows, outside any transaction. Row lock: one row, inside the held
	// transaction. Advisory: the row ArgID, after its lock was taken, if it
	// still has the attempt ArgDelivered and is claimable.
	Claim Stmt
	// ClaimOne (lease, optional) is Claim for a claim of one job, with the
	// same arguments and rows, where the engine runs a statement that
	// names one row faster than one that names a set: SQLite updates
	// "id = (SELECT …)" in one pass, and "id IN (SELECT …)" through a
	// temporary table (a claim of one cost 4 to 6 times as much).
	ClaimOne Stmt
	// ClaimBounded (lease, optional) is Claim for claims of at most 1, 2,
	// 4, …, 512 and MaxClaim jobs, in that order, each with Claim's
	// arguments and rows: a claim sends the first whose bound is at or
	// above its limit ([Statements.ClaimFor]). An engine that plans a
	// prepared statement once only when the plan expects few rows
	// (PostgreSQL) learns the bound from the text, which a parameter
	// cannot tell it.
	ClaimBounded []Stmt
	// ClaimSelect and ClaimMark claim in two statements, for engines without
	// UPDATE … RETURNING; set instead of Claim. ClaimSelect returns id,
	// delivered attempt and the data columns, locking the rows in the
	// transaction (lease, row lock); ClaimMark counts the attempt of the row
	// ArgID (and, lease form, writes ArgUntil as its expiry). A lease
	// ClaimMark may take ArgID (and ArgDelivered) several times: it then
	// marks that many rows at once, the core filling the places in order
	// and repeating the last row when fewer rows were claimed. It should
	// mark a row only if the row still has the attempt ArgDelivered and is
	// still claimable at ArgNow, so that a lock the engine does not hold
	// cluster-wide (a Galera node's) cannot hand one job to two claims.
	ClaimSelect, ClaimMark Stmt
	// ClaimMarked (lease, with ClaimMark) returns the ids, among its ArgIDs,
	// of the rows carrying ArgUntil. When a lease ClaimMark changed fewer
	// rows than it named, the claim delivers those rows alone; without
	// ClaimMarked such a claim rolls back and returns an error.
	ClaimMarked Stmt
	// ClaimSelectMore (lease, optional) reads more rows, as ClaimSelect
	// does, for the places ClaimSelect left: ArgLimit is the number left.
	ClaimSelectMore Stmt

	// Pick, PickAfter and PickLock claim in two steps, for an engine whose
	// locking read keeps the lock of every row it read before a sort,
	// returned or not (InnoDB): a claim must lock only the rows it returns.
	// Pick returns the id (and, with Table.Priority, the priority) of up to
	// ArgLimit claimable rows in claim order, without locking them;
	// PickAfter the same past the row ArgID (and ArgPriority) in claim
	// order, for the next page. PickMore and PickMoreAfter (lease, optional)
	// read a second set of claimable rows the same way (free rows, where
	// Pick reads the expired ones); the core merges the two in claim order.
	// PickLock locks, among its ArgIDs, up to ArgLimit rows still claimable,
	// in id order, skipping rows others hold, and returns them as
	// ClaimSelect does; the core fills its ArgIDs with candidates of one
	// priority, in claim order, repeating the last, so that id order is
	// claim order. Set, they replace Claim (row lock) or ClaimSelect and
	// ClaimSelectMore (lease); a lease claim marks the rows with ClaimMark.
	Pick, PickAfter, PickMore, PickMoreAfter, PickLock Stmt

	// Candidates (advisory form) returns id, key and attempt of up to
	// ArgLimit claimable rows in id order, without locking them;
	// CandidatesAfter the same past the id ArgID, for the next page.
	Candidates, CandidatesAfter Stmt
	// LockFirst and LockFirstAfter (advisory form, engines whose lock
	// function SQL can call) read the candidates of Candidates and
	// CandidatesAfter and try each key's session lock in claim order,
	// stopping at the first taken. They return at most one row: the
	// columns of Candidates and a boolean, true for the candidate whose
	// lock the session on which they ran now holds; false for the page's
	// last candidate, when no key was free in a full page (no lock taken:
	// the next page starts past it). No row: no key free and the page
	// short. The key is locked as [Locker] locks it (ArgIdentity names the
	// table), so that [Locker.Unlock] lets it go.
	// Set, they replace a lock call from Go per candidate: keys held
	// elsewhere and rows settled since a page was read cost no round trip.
	LockFirst, LockFirstAfter Stmt

	// Extend (lease form) moves the expiry of the token's row. With Rows it
	// returns the new expiry; otherwise it wrote ArgUntil.
	Extend Stmt
	// Exists counts the rows matching a token (lease: id, attempt, expiry;
	// advisory: id and attempt). Set by engines that report only changed
	// rows as affected (MySQL): an extension or a Retry writing the value a
	// row already holds is confirmed with it instead of read as a lost lease.
	Exists Stmt

	// Verdict (lease and advisory forms) reads the row ArgID as it stands:
	// its stored attempt and (lease form) its expiry; no row when it is
	// gone. A plain read, which must not wait for a transaction still open
	// on the row: the package sends it once no statement of a settlement
	// can still be running, so that a settlement whose outcome is unknown
	// (its context ended, its connection broke mid-statement), or one in
	// the caller's transaction not yet known to have committed, learns what
	// the database holds. Empty: such a settlement returns
	// [ErrOutcomeUnknown].
	Verdict Stmt

	// Settlements. Ack deletes; Retry delays (lease form: always, the
	// expiry; other forms: the not-before column, only for a delay; empty
	// when there is none); Release gives the attempt back (lease: clears the
	// expiry too; row lock: empty, it rolls back).
	Ack, Retry, Release Stmt
	// DeadInsert copies the row into the dead table with ArgDelivered as its
	// attempt; DeadDelete, when set, deletes it after in the same
	// transaction. An engine that does both in one statement leaves
	// DeadDelete empty.
	DeadInsert, DeadDelete Stmt

	// The claims counter (row lock with Table.ClaimsTable). ClaimsCount adds
	// one delivery of the row ArgID to the side table, sent outside the held
	// transaction once it holds the row; with Rows it returns the count,
	// otherwise ClaimsRead does. ClaimsGiveBack subtracts one (Release),
	// outside the held transaction before it rolls back. ClaimsClear
	// removes the row's count inside the held transaction (Ack, Retry,
	// Dead).
	ClaimsCount, ClaimsRead, ClaimsGiveBack, ClaimsClear Stmt

	// The row lock's undo of a failed attempt. Savepoint marks the held
	// transaction when the handler first asks for it ([Delivery.Tx]), before
	// it can write; RollbackToSavepoint undoes what the handler wrote, before
	// a Retry or Dead records the attempt. Relock locks the row ArgID if it
	// still has the attempt ArgDelivered, skipping it when another
	// transaction holds it, and returns its id: a Retry or Dead whose held
	// transaction cannot be restored (a deadlock rolled it back, its session
	// was cut) runs in a new transaction that begins with it. [New] refuses
	// a row-lock dialect without the three.
	Savepoint, RollbackToSavepoint, Relock Stmt

	// Enqueue inserts a job; the variants take an explicit id and/or a
	// not-before time. With Rows they return the id; otherwise the core uses
	// the given id or LastInsertId.
	Enqueue, EnqueueID, EnqueueAt, EnqueueIDAt Stmt

	// Probe (optional) returns a row when a claim may find a job: one ready
	// by time, whether or not a claim holds it. It must return one whenever
	// the claim would deliver a job. An idle loop sends it (Queue.Probe) when
	// its fallback interval runs out and claims only when it returns a row,
	// so that an idle process costs one statement per interval where the
	// claim is a transaction of several (MySQL's lease, every row lock).
	// Empty: the loop claims.
	Probe Stmt

	// Dead jobs ([Queue.ListDead], [Queue.RequeueDead], [Queue.PurgeDead]),
	// set when the description names a dead table. DeadList returns id,
	// attempt, the data columns, then LastError and DeadAt where named, of
	// up to ArgLimit dead jobs, the most recent death first (DeadAt
	// descending, then id descending; id descending without DeadAt), those
	// whose DeadAt is NULL (dead before the column was added) last, by id
	// descending; DeadListAfter the same past the job ArgID (and
	// ArgNotBefore, its DeadAt) in that order. DeadListAfterNull (with
	// DeadAt) is the page after a job whose DeadAt is NULL: the dead jobs
	// with a NULL DeadAt and an id below ArgID, by id descending.
	// [Queue.ListDead] sends it for an after with a zero DeadAt; a dialect
	// that leaves it empty gets an error for such an after instead. Each of
	// the three may name ArgLimit more than once. DeadTake returns the data
	// columns and LastError of the dead job ArgID and, with DeadTakeDelete
	// empty, deletes it (DELETE … RETURNING); where the engine cannot
	// return deleted rows it locks the row, and DeadTakeDelete deletes it in
	// the same transaction. DeadPurge deletes every dead job,
	// DeadPurgeBefore those whose DeadAt is before ArgNotBefore.
	// RequeueError writes ArgError into the LastError of the job ArgID, for
	// a requeued job that keeps its text. DeadHas returns a row when the
	// dead table holds the job ArgID: an Enqueue given that id is refused
	// ([ErrDeadID]).
	DeadList, DeadListAfter, DeadListAfterNull, DeadTake, DeadTakeDelete, DeadPurge, DeadPurgeBefore, RequeueError, DeadHas Stmt
	// Cancelling a job that waits ([Queue.Cancel]). Cancel deletes the job
	// ArgID (lease: under any lease, the holder learns by its keeper).
	// CancelLock (row lock) locks the row ArgID without waiting, returning
	// its id when no claim holds it. JobExists returns a row when job ArgID
	// exists at all, to tell a job in work from a missing one.
	Cancel, CancelLock, JobExists Stmt

	// Stats ([Queue.Stats]) returns one row: jobs ready by time (claimable
	// now, held ones included where the engine cannot tell them apart),
	// waiting for a later time, in work (-1 where the engine cannot tell),
	// in the dead table (-1 without one), and the age in microseconds of
	// the oldest ready job (NULL without Table.EnqueuedAt or a ready job).
	// A lease in force counts as in work when it ends within a lease, as
	// waiting beyond.
	Stats Stmt
	// InWork (optional) returns one count: the jobs held, read from the
	// server's lock tables where Stats returns -1 for them and the server
	// can tell only through a view that may be missing or not granted (a
	// plugin, performance_schema). [Queue.Stats] sends it after Stats; its
	// error leaves InWork at -1 and is reported in Stats.InWorkErr.
	InWork Stmt
}

// sqlBuilder writes one statement, recording its parameters in order.
type sqlBuilder struct {
	b    strings.Builder
	args []Arg
	mark func(n int) string // the placeholder of the n-th parameter
}

func (s *sqlBuilder) write(parts ...string) *sqlBuilder {
	for _, p := range parts {
		s.b.WriteString(p)
	}
	return s
}

// param writes the placeholder of a.
func (s *sqlBuilder) param(a Arg) string {
	s.args = append(s.args, a)
	return s.mark(len(s.args))
}

// again writes the placeholder of a parameter already written, which
// only numbered placeholders can name twice; anything else is a mistake in
// the package's templates (at is the template, for the panic).
func (s *sqlBuilder) again(a Arg, at string) string {
	for i := len(s.args) - 1; i >= 0; i-- {
		if s.args[i] == a && s.mark(i+1) != s.mark(i+2) {
			return s.mark(i + 1)
		}
	}
	panic("inbox: template parameter named again before it is written, or with unnumbered placeholders, in " + at)
}

func (s *sqlBuilder) stmt(rows bool) Stmt {
	return Stmt{SQL: s.b.String(), Args: s.args, Rows: rows}
}

func dollar(n int) string { return "$" + strconv.Itoa(n) }
func question(int) string { return "?" }

// A sqlTemplate writes the statements of one description for one engine
// from templates that read as the statements they become: {name} is a
// fragment (a quoted identifier of the description, or a piece of SQL that
// is itself a template) and $name a parameter, numbered in the order it
// appears ($^name: the number of the $name written before, PostgreSQL's
// only). Fragments: {table} {id} {attempt} {lease} {key} {notBefore}
// {dead} {claims}; {data}, {, data} and {, j.data} the data columns (the
// latter two with a leading comma, empty when there are none); {now} and
// {until} the clock, the engine's or parameters; {where ready} and
// {and ready} the not-before condition, empty without the column.
// Optional columns: {lastError} {priority} {enqueuedAt}; {, extra} and
// {, j.extra} what a claim returns after the data (last error, priority);
// {order} and {pick} the claim order and the columns it needs; {, error}
// and {, set error} the error a Retry or Dead writes; all empty or plain
// without the columns.
// Parameters: $id $attempt $delivered $expiry $now $until $micros $limit
// $error $priority $ids $attempts $expiries $identity.
type sqlTemplate struct {
	mark  func(int) string
	frags map[string]string
}

var templateArgs = map[string]Arg{
	"id": ArgID, "attempt": ArgAttempt, "delivered": ArgDelivered, "expiry": ArgExpiry,
	"now": ArgNow, "until": ArgUntil, "micros": ArgMicros, "limit": ArgLimit,
	"error": ArgError, "priority": ArgPriority, "at": ArgNotBefore,
	"ids": ArgIDs, "attempts": ArgAttempts, "expiries": ArgExpiries, "identity": ArgIdentity,
}

// newTemplate returns the templates of n, with now and until the SQL of the
// clock (templates themselves: "$now" and "$until" for the caller's).
func newTemplate(n *Names, mark func(int) string, now, until string) *sqlTemplate {
	f := map[string]string{
		"table": n.Table, "id": n.ID, "attempt": n.Attempt, "lease": n.LockedUntil, "key": n.Key,
		"notBefore": n.NotBefore, "dead": n.Dead, "claims": n.ClaimsTable,
		"lastError": n.LastError, "priority": n.Priority, "enqueuedAt": n.EnqueuedAt,
		"data": joinCols("", n.Data), ", data": "", ", j.data": "",
		"now": now, "until": until, "where ready": "", "and ready": "",
		// Optional columns: what a claim returns after the data, how it
		// orders, what a Retry or Dead writes of the error.
		", extra": "", ", j.extra": "", ", priority": "", ", lastError": "", ", error": "", ", set error": "",
		"order": "{id}", "pick": "{id}",
		// The dead table's time of death: the column and what Dead writes.
		"deadAt": n.DeadAt, ", deadAt": "", ", deadAt now": "",
	}
	if n.DeadAt != "" {
		f[", deadAt"], f[", deadAt now"] = ", {deadAt}", ", {now}"
	}
	if len(n.Data) > 0 {
		f[", data"], f[", j.data"] = ", "+joinCols("", n.Data), ", "+joinCols("j.", n.Data)
	}
	if n.NotBefore != "" {
		f["where ready"] = " WHERE ({notBefore} IS NULL OR {notBefore} <= {now})"
		f["and ready"] = " AND ({notBefore} IS NULL OR {notBefore} <= {now})"
	}
	if n.LastError != "" {
		f[", extra"], f[", j.extra"] = ", {lastError}", ", j.{lastError}"
		f[", lastError"] = ", {lastError}"
		// A Retry or Dead without an error recorded keeps the row's.
		f[", error"] = ", COALESCE($error, {lastError})"
		f[", set error"] = ", {lastError} = COALESCE($error, {lastError})"
	}
	if n.Priority != "" {
		f[", extra"] += ", {priority}"
		f[", j.extra"] += ", j.{priority}"
		f[", priority"] = ", {priority}"
		f["order"], f["pick"] = "{priority} DESC, {id}", "{id}, {priority}"
	}
	return &sqlTemplate{mark: mark, frags: f}
}

// query is a statement returning rows; exec one that does not.
func (t *sqlTemplate) query(tmpl string) Stmt { return t.stmt(tmpl, true) }
func (t *sqlTemplate) exec(tmpl string) Stmt  { return t.stmt(tmpl, false) }

func (t *sqlTemplate) stmt(tmpl string, rows bool) Stmt {
	s := &sqlBuilder{mark: t.mark}
	t.expand(s, tmpl)
	return s.stmt(rows)
}

// expand writes tmpl into s. An unknown name is a mistake in the package's
// own templates, which every test of New would meet: it panics.
func (t *sqlTemplate) expand(s *sqlBuilder, tmpl string) {
	for i := 0; i < len(tmpl); {
		switch c := tmpl[i]; {
		case c == '{':
			end := strings.IndexByte(tmpl[i:], '}')
			frag, ok := "", false
			if end > 0 {
				frag, ok = t.frags[tmpl[i+1:i+end]]
			}
			if !ok {
				panic("inbox: unknown template fragment in " + tmpl[i:])
			}
			t.expand(s, frag)
			i += end + 1
		case c == '$':
			again := i+1 < len(tmpl) && tmpl[i+1] == '^'
			start := i + 1
			if again {
				start++
			}
			j := start
			for j < len(tmpl) && ('a' <= tmpl[j] && tmpl[j] <= 'z' || 'A' <= tmpl[j] && tmpl[j] <= 'Z') {
				j++
			}
			a, ok := templateArgs[tmpl[start:j]]
			if !ok {
				panic("inbox: unknown template parameter in " + tmpl[i:])
			}
			if again {
				s.write(s.again(a, tmpl[i:]))
			} else {
				s.write(s.param(a))
			}
			i = j
		default:
			s.b.WriteByte(c)
			i++
		}
	}
}

// joinCols joins the columns, each prefixed when prefix is not empty.
func joinCols(prefix string, cols []string) string {
	var b strings.Builder
	for i, c := range cols {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(prefix)
		b.WriteString(c)
	}
	return b.String()
}
