package inbox

import (
	"errors"
	"fmt"
	"strings"
)

var (
	// ErrLeaseLost means the job is no longer held by this delivery: under a
	// lease, the row no longer carries the delivery's token (id, attempt,
	// expiry), because the lease ran out and another claim took the job or the
	// job was settled elsewhere; under an advisory lock, the row changed
	// attempt or went away; under the row lock, Ack found the row gone
	// (only where locks are not shared, as across Galera nodes). Nothing
	// was changed. A keeper cancels its handler's context with this cause.
	// A job deleted while held ([Queue.Cancel]) is [ErrCancelled], which
	// matches this error too.
	ErrLeaseLost = errors.New("inbox: lease lost")
	// ErrSettled is returned by a settlement or an extension of a delivery
	// that was already settled; nothing was changed. When the verdict that
	// finished the delivery was a lost lease, the error matches
	// [ErrLeaseLost] too, so a late settlement reads as one.
	ErrSettled = errors.New("inbox: delivery already settled")
	// ErrNoDeadTable is returned by [Delivery.Dead] when the description names
	// no dead table; nothing was changed.
	ErrNoDeadTable = errors.New("inbox: no dead table named in Table.DeadTable")
	// ErrNoNotBefore is returned by [Delivery.Retry] with a delay under the
	// row lock or advisory form when the description names no not-before
	// column; nothing was changed.
	ErrNoNotBefore = errors.New("inbox: a retry delay needs Table.NotBefore")
	// ErrOwnTx is returned by the Tx settlements of a row-lock delivery: its
	// writes belong in [Delivery.Tx], which the settlement commits.
	ErrOwnTx = errors.New("inbox: a row-lock delivery settles in its own transaction, Delivery.Tx")
	// ErrPoolTooSmall is returned by Claim under the row lock and advisory
	// forms when the pool allows a single connection: a job in work would
	// take it, leaving none for its settlement.
	ErrPoolTooSmall = errors.New("inbox: the pool allows one connection; the row lock and advisory forms need SetMaxOpenConns(n) with n >= 2")
	// ErrIDNotReturned is returned by [Queue.Enqueue], [Queue.EnqueueMany]
	// and [Queue.RequeueDead] when a job inserted without a Job.ID got an id
	// the database does not report: MySQL and MariaDB report only what
	// AUTO_INCREMENT assigns (LastInsertId is 0 for a DEFAULT (uuid()) or a
	// trigger's id), and SQLite lets a primary key other than INTEGER be
	// NULL. RequeueDead then changes nothing; Enqueue and EnqueueMany have
	// inserted the jobs, which a *sql.Tx given still rolls back, and which
	// are committed when given a *sql.DB or *sql.Conn outside a transaction
	// (unless EnqueueMany ran a transaction of its own). [Queue.CheckSchema]
	// refuses a MySQL or MariaDB id with a default.
	ErrIDNotReturned = errors.New("inbox: the database returned no id for the new job")
)

// ErrCancelled means the job was deleted while this delivery held it, by
// [Queue.Cancel] or any other DELETE of its row: under the lease, the row
// was found gone before the delivery's lease could have run out (so no
// other claim took it); under an advisory lock, while the lock was held. A
// keeper cancels its handler's context with this cause, and the
// extension or settlement that found the row gone returns it. It matches
// [ErrLeaseLost] too: code written for a lost lease, which stops the
// handler and settles nothing, reads a cancel as one. Batched settlements
// ([Batcher]) report a cancelled job as ErrLeaseLost only.
var ErrCancelled error = cancelled{}

type cancelled struct{}

func (cancelled) Error() string { return "inbox: job cancelled" }

func (cancelled) Is(target error) bool { return target == ErrLeaseLost }

// errSettledLost is what a delivery finished by a lost lease answers: one
// error, on one line, matching both ErrSettled and ErrLeaseLost;
// errSettledCancelled one finished by a cancel, matching ErrCancelled too.
var (
	errSettledLost      error = settledLost{}
	errSettledCancelled error = settledLost{cancelled: true}
)

type settledLost struct{ cancelled bool }

func (s settledLost) Error() string {
	if s.cancelled {
		return "inbox: delivery already settled: its job was cancelled"
	}
	return "inbox: delivery already settled: its lease was lost"
}

func (s settledLost) Is(target error) bool {
	return target == ErrSettled || target == ErrLeaseLost || s.cancelled && target == ErrCancelled
}

// zeroID and nullID are ErrIDNotReturned with its cause and fix: a
// LastInsertId of 0 (MySQL, MariaDB), an id RETURNING gave as NULL (SQLite).
func zeroID() error {
	return fmt.Errorf("%w: LastInsertId is 0, as MySQL and MariaDB report only the ids AUTO_INCREMENT assigns; "+
		"make the key an AUTO_INCREMENT integer, or give every Job an ID", ErrIDNotReturned)
}

func nullID() error {
	return fmt.Errorf("%w: its id is NULL, which SQLite lets a primary key other than INTEGER hold; "+
		"declare the key NOT NULL with a default, or give every Job an ID", ErrIDNotReturned)
}

// opError is the error of one operation: "inbox: <op>: <cause>", the
// cause's own "inbox: " dropped, so that every message reads on one line
// with one prefix while errors.Is and errors.As still see the cause.
type opError struct {
	op  string
	err error
}

func opErr(op string, err error) error { return &opError{op: op, err: err} }

func (e *opError) Error() string {
	return "inbox: " + e.op + ": " + strings.TrimPrefix(e.err.Error(), "inbox: ")
}

func (e *opError) Unwrap() error { return e.err }
