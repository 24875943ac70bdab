// Package dialect is the contract between package inbox and a database
// engine, as database/sql/driver is between database/sql and a driver: what
// a dialect implements, and nothing a queue's user calls.
//
// A [Dialect] turns a validated table description ([Names]) into the SQL of
// one engine ([Statements]). Package inbox ships PostgreSQL, MySQL,
// MariaDB and SQLite; another engine is added from outside by implementing
// Dialect with this package alone, as examples/cockroach does for
// CockroachDB. [Template] writes statements from templates that read as
// the SQL they become, with the parameters recorded in order.
//
// The contract grows as goose's Querier does: a new optional column or
// feature adds a field to [Names] and the statements that serve it to one
// part of [Statements]. A dialect that cannot serve what a description
// names refuses it in Statements with an error naming the field, and keeps
// serving the descriptions it can. Each form reads its own statements
// (each field names its form), so a dialect of one form writes that form's
// alone.
//
// One rule covers every optional piece, as driver.go states its own: an
// optional interface a dialect does not implement, or a statement it
// leaves empty (a [Stmt] whose SQL is ""), falls back to the behaviour the
// interface or field documents under "Without it" or "Empty". The core
// tests nothing else.
package dialect

import (
	"context"
	"database/sql"
	"time"
)

// A Dialect turns a validated table description into the SQL of one engine.
// Package inbox calls Statements once per queue; TimeArg and ScanTime run
// for every time a statement sends or a claim reads.
//
// A Dialect may implement the optional interfaces of this package, each
// with its fallback: [Locker], [LockWaiter], [TableIdentifier],
// [DeadlockDetector], [DuplicateDetector], [BatchDialect], [BulkEnqueuer],
// [SchemaChecker], [InMemory]. A
// dialect wrapping another (to log its statements, say) has an Unwrap()
// Dialect method naming it: the optional interfaces it does not implement
// itself are those of the dialect it wraps, so wrapping loses none.
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

// Locker is implemented by a [Dialect] whose engine has session-level
// locks; the advisory form uses it. Without it the process holds the
// advisory keys alone, as on SQLite: one process per database.
type Locker interface {
	// TryLock takes the session lock of key on conn without waiting, reporting
	// whether it was taken. table is the table's identity
	// ([TableIdentifier]), or its name as described.
	TryLock(ctx context.Context, conn *sql.Conn, table, key string) (bool, error)
	// Unlock lets the lock go. An error means the session's state is unknown:
	// the caller discards the connection.
	Unlock(ctx context.Context, conn *sql.Conn, table, key string) error
}

// LockWaiter is implemented by a [Locker] that can wait for a session
// lock. An advisory settlement whose outcome is unknown takes its key's
// lock, waiting for a holder still running its statement, before it reads
// the row back. Without it that read-back waits for nothing, and a
// settlement still running on a cut session may not be seen yet.
type LockWaiter interface {
	// WaitLock takes the lock of key on conn as [Locker.TryLock] does,
	// waiting as long as ctx allows; the server must end the wait by ctx's
	// deadline, as a client giving up may not stop a waiting session.
	WaitLock(ctx context.Context, conn *sql.Conn, table, key string) error
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

// InMemory is implemented by a [TableIdentifier] whose engine can keep a
// database in memory, private to one pool (SQLite's ":memory:"). Without a
// [Locker] the advisory form holds its keys in the process; a table in
// memory has them held by its pool instead, as no other pool reaches its
// rows. Without it the keys are the process's.
type InMemory interface {
	// IsInMemory reports whether identity, as TableIdentity returned it,
	// names a table in memory.
	IsInMemory(identity string) bool
}

// DeadlockDetector is implemented by a [Dialect] that can tell a deadlock
// victim's error from others: the victim changed nothing, and the queue
// sends a single statement, a lease claim or a batch again, up to ten
// times. Without it no statement is sent again after a deadlock.
type DeadlockDetector interface {
	IsDeadlock(err error) bool
}

// DuplicateDetector is implemented by a [Dialect] whose enqueue of a job
// with a unique key (UniqueStatements) fails when the key is held, rather
// than returning no row: IsDuplicate tells a unique violation from other
// failures, so that a holder gone between the failed insert and
// Unique.Find (acknowledged meanwhile) has the insert sent again rather
// than the violation returned. Without it such a failure is returned.
type DuplicateDetector interface {
	IsDuplicate(err error) bool
}

// BatchDialect is implemented by a [Dialect] that can settle many lease
// deliveries in one statement. Without it inbox's Queue.NewBatcher returns
// an error.
type BatchDialect interface {
	// BatchStatements returns the statements settling size lease tokens at
	// once. Called by NewBatcher only, for a few sizes, never per flush.
	BatchStatements(n *Names, size int) (*BatchStatements, error)
}

// BulkEnqueuer is implemented by a [Dialect] that inserts many jobs in one
// statement. Without it inbox's Queue.EnqueueMany sends the Enqueue
// statement once per job, in one transaction all the same.
type BulkEnqueuer interface {
	// EnqueueMany returns the statements inserting rows jobs at once, each
	// with an id given (withID) and a not-before time (withAt) or not.
	// Called per EnqueueMany statement, for sizes up to MaxEnqueueParams.
	EnqueueMany(n *Names, rows int, withID, withAt bool) ManyStatements
	// MaxEnqueueParams is the most parameters one statement may take.
	MaxEnqueueParams() int
}

// SchemaChecker is implemented by a [Dialect] that can verify a table
// against a queue's description. Without it inbox's Queue.CheckSchema
// returns an error.
type SchemaChecker interface {
	// CheckSchema returns every problem found, each a sentence naming what is
	// wrong. An error means the check itself could not run.
	CheckSchema(ctx context.Context, db *sql.DB, n *Names) ([]string, error)
}
