package inbox

import (
	"errors"
	"strings"
)

var (
	// ErrLeaseLost means the job is no longer held by this delivery: under a
	// lease, the row no longer carries the delivery's token (id, attempt,
	// expiry), because the lease ran out and another claim took the job or the
	// job was settled elsewhere; under an advisory lock, the row changed
	// attempt or went away; under the row lock, Ack found the row gone
	// (only where locks are not shared, as across Galera nodes). Nothing
	// was changed. A keeper cancels its
	// handler's context with this cause.
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
)

// errSettledLost is what a delivery finished by a lost lease answers: one
// error, on one line, matching both ErrSettled and ErrLeaseLost.
var errSettledLost error = settledLost{}

type settledLost struct{}

func (settledLost) Error() string { return "inbox: delivery already settled: its lease was lost" }

func (settledLost) Is(target error) bool { return target == ErrSettled || target == ErrLeaseLost }

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
