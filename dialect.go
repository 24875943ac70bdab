package inbox

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"time"
)

// A Dialect turns a validated table description into the SQL of one engine.
// Postgres, MySQL (also MariaDB) and SQLite ship with the package; another engine
// is added from outside it by implementing this interface, and optionally
// [Locker] (advisory locks) and [SchemaChecker] (the schema check).
//
// A Dialect is called only by [New], never on the claim path: the statements it
// returns are built once per queue.
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
	// NotBefore is the optional not-before column.
	NotBefore string
	// Dead is the quoted dead-letter table, empty when none is named.
	Dead, DeadSchema, DeadName string
	// ClaimsTable is the quoted side table of the row-lock claims counter,
	// empty when none is named; its columns are ID and claims.
	ClaimsTable, ClaimsSchema, ClaimsName string
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
	ArgNotBefore                // the not-before time given to Enqueue
	ArgData                     // ArgData+i is the value of the i-th data column (Enqueue)
)

// Stmt is one statement: its text and the values of its parameters, in order.
type Stmt struct {
	SQL  string
	Args []Arg
	// Rows is true when the statement returns rows (RETURNING, SELECT).
	Rows bool
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
	// ClaimSelect and ClaimMark claim in two statements, for engines without
	// UPDATE … RETURNING; set instead of Claim. ClaimSelect returns id,
	// delivered attempt and the data columns, locking the rows in the
	// transaction (lease, row lock); ClaimMark counts the attempt of the row
	// ArgID (and, lease form, writes ArgUntil as its expiry). A lease
	// ClaimMark may take ArgID several times: it then marks that many rows
	// at once, the core filling the places in order and repeating the last
	// id when fewer rows were claimed.
	ClaimSelect, ClaimMark Stmt

	// Candidates (advisory form) returns id, key and attempt of up to
	// ArgLimit claimable rows in id order, without locking them;
	// CandidatesAfter the same past the id ArgID, for the next page.
	Candidates, CandidatesAfter Stmt

	// Extend (lease form) moves the expiry of the token's row. With Rows it
	// returns the new expiry; otherwise it wrote ArgUntil.
	Extend Stmt
	// Exists counts the rows matching a token. Set by engines that report
	// only changed rows as affected (MySQL): a write of the value a row
	// already holds is confirmed with it instead of read as a lost lease.
	Exists Stmt

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

	// Enqueue inserts a job; the variants take an explicit id and/or a
	// not-before time. With Rows they return the id; otherwise the core uses
	// the given id or LastInsertId.
	Enqueue, EnqueueID, EnqueueAt, EnqueueIDAt Stmt
}

// sqlBuilder writes one statement, recording the parameters in order.
type sqlBuilder struct {
	b    strings.Builder
	args []Arg
	mark func(n int) string
}

func (s *sqlBuilder) w(parts ...string) *sqlBuilder {
	for _, p := range parts {
		s.b.WriteString(p)
	}
	return s
}

// p writes a placeholder for a.
func (s *sqlBuilder) p(a Arg) string {
	s.args = append(s.args, a)
	return s.mark(len(s.args))
}

func (s *sqlBuilder) stmt(rows bool) Stmt {
	return Stmt{SQL: s.b.String(), Args: s.args, Rows: rows}
}

func dollar(n int) string { return "$" + strconv.Itoa(n) }
func question(int) string { return "?" }

// joinData writes the data columns, each prefixed when prefix is not empty.
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
