package inbox

import (
	"context"
	"database/sql"
	"time"
)

// form is what the claim forms do differently, chosen once by [New]: each
// concern a form changes is one method here, and a new form is one more
// implementation beside leaseForm (lease.go), rowLockForm (rowlock.go) and
// advisoryForm (advisory.go), in place of a switch on the form per concern.
type form interface {
	// claim claims up to max jobs, max already checked.
	claim(ctx context.Context, q *Queue, max int) ([]*Delivery, error)
	// refuse returns why outcome o cannot run under the form, before
	// anything is sent or paused; the checks every form shares ran first.
	refuse(q *Queue, tx *sql.Tx, o outcome, after time.Duration) error
	// settle runs outcome o of d, inside tx when not nil; d.mu is held.
	// It finishes d (d.settled) when it reaches a verdict.
	settle(ctx context.Context, d *Delivery, tx *sql.Tx, o outcome, after time.Duration) error
	// shutdown gives d back for Queue.Shutdown.
	shutdown(ctx context.Context, d *Delivery) error
	// leased reports a job held by an expiry in its row, which a keeper
	// extends, a Batcher settles, and a read back compares with the
	// delivery's token; other forms hold a job by a session, so that
	// neither the job nor a delivery's outcome can move while it lives.
	leased() bool
	// holdsConn reports that each job in work holds a connection of q's
	// pool until it settles (the pool rule: Claim never takes the last).
	holdsConn(q *Queue) bool
	// held reports that no other claim can have taken d's job by now, so
	// that a row gone is a job cancelled, not a lease lost.
	held(d *Delivery) bool
	// unconfirmed is told of d, settled in a caller's transaction not yet
	// known to have committed; d.mu is held.
	unconfirmed(d *Delivery)
	// finished lets go of what the form still holds for d once d is
	// settled by a verdict learnt later; d.mu is held.
	finished(ctx context.Context, d *Delivery)
	// watch starts watching what holds d, where the form holds it by
	// something that can end under the handler (an advisory session), to
	// call lost when it does; ok is false when there is nothing to watch.
	// d.mu is held.
	watch(d *Delivery, lost context.CancelCauseFunc) (stop func(), ok bool)
}

func formOf(f Form) form {
	switch f {
	case Lease:
		return leaseForm{}
	case Advisory:
		return advisoryForm{}
	}
	return rowLockForm{}
}

// refuseDelay refuses a Retry with a delay under a form that writes it in
// the not-before column, when the description names none.
func refuseDelay(q *Queue, o outcome, after time.Duration) error {
	if o == outRetry && after > 0 && q.names.NotBefore == "" {
		return ErrNoNotBefore
	}
	return nil
}
