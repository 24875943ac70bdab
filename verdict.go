package inbox

import (
	"context"
	"database/sql"
	"errors"
	"github.com/sqlinbox/inbox/dialect"
	"time"
)

// ErrOutcomeUnknown is returned by a lease or advisory settlement whose
// statement failed without a known outcome (its context ended, or its
// connection broke, mid-statement) when reading the row back failed too:
// the settlement may or may not have taken effect. The error also matches
// the statement's own error.
//
// What to do: nothing is lost either way. A lease delivery is not finished:
// its keeper's deadline stays armed, and settling it again tells the
// outcome (ErrSettled when the first settlement took effect, ErrLeaseLost
// when the job went to another holder). An advisory delivery is finished
// (its lock is let go): the job was settled, or it is back in the queue
// with its attempt spent, as after a crash.
var ErrOutcomeUnknown = errors.New("inbox: the settlement's outcome is unknown")

// verdictTimeout bounds the read that follows a settlement whose outcome is
// unknown: it runs on a context of its own, detached from the settlement's,
// which has usually ended.
const verdictTimeout = 5 * time.Second

// outcomeUnknownError is ErrOutcomeUnknown with the settlement's error and
// the read's.
type outcomeUnknownError struct{ err, read error }

func (e *outcomeUnknownError) Error() string {
	return "the settlement's outcome is unknown: " + e.err.Error() + "; reading it back: " + e.read.Error()
}

func (e *outcomeUnknownError) Is(target error) bool { return target == ErrOutcomeUnknown }

func (e *outcomeUnknownError) Unwrap() error { return e.err }

// pendingSettlement is a settlement sent but not known to have taken
// effect: one in the caller's transaction (tx) until that transaction is
// known to have committed, or one whose outcome was unknown (tx nil).
type pendingSettlement struct {
	o     outcome
	tx    *sql.Tx
	until time.Time // lease Retry: the expiry it wrote, when the package computed it
}

// rowState is a row as Statements.Settle.Verdict read it.
type rowState struct {
	found   bool
	attempt int64     // as stored
	expiry  time.Time // lease form; zero for NULL
}

// readRow reads d's row through ex with Statements.Settle.Verdict.
func (d *Delivery) readRow(ctx context.Context, ex Executor) (rowState, error) {
	q := d.q
	var r rowState
	if q.st.Settle.Verdict.SQL == "" {
		return r, errors.New("the dialect has no Verdict statement")
	}
	var raw any
	dest := []any{&r.attempt, &raw}
	if !q.form.leased() {
		dest = dest[:1]
	}
	err := q.queryRow(ctx, ex, q.st.Settle.Verdict, &values{id: d.id}).Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return r, nil
	}
	if err != nil {
		return r, err
	}
	r.found = true
	if raw != nil {
		t, err := q.dialect.ScanTime(raw)
		if err != nil {
			return r, err
		}
		r.expiry = micro(t)
	}
	return r, nil
}

// verdictKind is what a row read back says of a settlement sent with d's
// token.
type verdictKind int

const (
	notApplied verdictKind = iota // the row still carries the token: the settlement did not take effect
	applied                       // the row shows the settlement's effect
	lost                          // the row went to another holder, or away
	unclear                       // advisory Retry: the row looks the same either way
)

// judge tells what row r says of outcome o sent with d's token; until is
// the expiry a lease Retry wrote, when the package computed it (zero when
// the engine's clock chose it).
func (d *Delivery) judge(o outcome, r rowState, until time.Time) verdictKind {
	lease := d.q.form.leased()
	stored := d.attempt + 1
	switch {
	case !r.found:
		// Only the holder of the token can delete the row before another
		// claim has taken it.
		if o == outAck || o == outDead {
			return applied
		}
		return lost
	case r.attempt == stored && (!lease || r.expiry.Equal(d.lease.expiry)):
		switch {
		case o != outRetry:
			return notApplied
		case !lease:
			// An advisory Retry writes no part of the token.
			return unclear
		case !until.IsZero() && until.Equal(d.lease.expiry):
			// It wrote the expiry the row held.
			return applied
		}
		return notApplied
	case lease && r.attempt == stored && o == outRetry && (until.IsZero() || r.expiry.Equal(until)):
		// Only the holder of the token moves its expiry without counting
		// an attempt.
		return applied
	case r.attempt == d.attempt && o == outRelease && (!lease || r.expiry.IsZero()):
		return applied
	}
	return lost
}

// setPending records a settlement sent whose effect is not known yet. d.mu
// is held.
func (d *Delivery) setPending(o outcome, tx *sql.Tx, until time.Time) {
	d.pending = &pendingSettlement{o: o, tx: tx, until: until}
	if tx != nil {
		d.q.form.unconfirmed(d)
	}
}

// awaitCommit records d, settled in a caller's transaction not yet known
// to have committed, for the queue's next claim to look (sweepUnconfirmed).
func (d *Delivery) awaitCommit() {
	q := d.q
	q.mu.Lock()
	if q.unconfirmed == nil {
		q.unconfirmed = map[*Delivery]struct{}{}
	}
	q.unconfirmed[d] = struct{}{}
	q.mu.Unlock()
}

// sweepUnconfirmed finishes the advisory deliveries whose settlement in a
// caller's transaction has committed without [Delivery.Committed] being
// called: each holds a lock and a pooled connection until something tells
// it. It reads their rows (a plain read: a transaction still open is
// passed, not waited for); a delivery busy in another call is left for the
// next claim, as is one whose row tells nothing yet (still held, or an
// advisory Retry, which leaves the row looking the same).
func (q *Queue) sweepUnconfirmed(ctx context.Context) {
	q.mu.Lock()
	if len(q.unconfirmed) == 0 {
		q.mu.Unlock()
		return
	}
	ds := make([]*Delivery, 0, len(q.unconfirmed))
	for d := range q.unconfirmed {
		ds = append(ds, d)
	}
	q.mu.Unlock()
	for _, d := range ds {
		if !d.mu.TryLock() {
			continue
		}
		p := d.pending
		switch {
		case d.settled || p == nil || p.tx == nil:
			q.forgetUnconfirmed(d)
		default:
			if r, err := d.readRow(ctx, q.db); err == nil && d.judge(p.o, r, p.until) == applied {
				d.pending = nil
				d.finish(ctx)
				q.forgetUnconfirmed(d)
			}
		}
		d.mu.Unlock()
	}
}

func (q *Queue) forgetUnconfirmed(d *Delivery) {
	q.mu.Lock()
	delete(q.unconfirmed, d)
	q.mu.Unlock()
}

// learn is called, d.mu held, when a token statement of d found no row:
// when a settlement of d was pending, it reads the row through ex and, if
// the row shows that settlement's effect, finishes d as settled by it and
// returns ErrSettled. Otherwise the lease is lost: d is finished so and
// ErrLeaseLost returned, or ErrCancelled when the row is gone while no
// other claim could have taken it: under the lease before d's lease could
// have run out (the deadline measured from when its expiry was sent, and
// learnt now, later than the statement that found the token gone), under
// an advisory lock always (d holds the key).
func (d *Delivery) learn(ctx context.Context, ex Executor) error {
	q := d.q
	held := q.form.held(d)
	var r rowState
	var err error
	if p := d.pending; p != nil || held {
		r, err = d.readRow(ctx, ex)
		if p != nil && err == nil && d.judge(p.o, r, p.until) == applied {
			d.settled, d.pending = true, nil
			return ErrSettled
		}
	}
	d.settled, d.lost, d.pending = true, true, nil
	if held && err == nil && !r.found {
		d.gone = true
		return ErrCancelled
	}
	return ErrLeaseLost
}

// readBack is called, d.mu held, when settlement o of d failed with err
// outside the caller's transaction: on a short context of its own, detached
// from ctx, it learns what the database holds and returns it: nil when the
// settlement took effect, ErrLeaseLost when the job is another's (either
// finishes d), err when the row still carries d's token. When that fails
// too, it returns an error matching ErrOutcomeUnknown and err, and records
// o as pending: the next touch learns. again, when not nil, sends an
// advisory Retry once more, for a row that looks the same whether or not
// the first took effect.
//
// A statement whose connection the driver closed may still run on the
// server after the error came back (go-sql-driver/mysql and pgx close the
// socket at once), so a read alone could see the row before it does. The
// lease is fenced instead: an extension by the token either finds it (the
// settlement has not run, and now never will: the token moved) or not
// (then the row as read tells which). An advisory row is read on the pinned
// session when it still answers (it runs one statement at a time), else
// under the key's lock taken from a new session, which waits until the old
// session, and its statement, have ended.
func (d *Delivery) readBack(ctx context.Context, o outcome, until time.Time, err error,
	again func(ctx context.Context) (int64, error)) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), verdictTimeout)
	defer cancel()
	d.setPending(o, nil, until)
	if d.q.form.leased() {
		switch xerr := d.extendLocked(rctx); {
		case xerr == nil:
			// The token was in place: the settlement did not take effect.
			return err
		case errors.Is(xerr, ErrSettled):
			return nil
		case errors.Is(xerr, ErrLeaseLost):
			return ErrLeaseLost
		default:
			return &outcomeUnknownError{err: err, read: xerr}
		}
	}
	r, rerr := d.readAdvisory(rctx)
	if rerr != nil {
		return &outcomeUnknownError{err: err, read: rerr}
	}
	switch d.judge(o, r, until) {
	case applied:
		d.settled, d.pending = true, nil
		return nil
	case lost:
		d.settled, d.lost, d.pending = true, true, nil
		return ErrLeaseLost
	case unclear:
		if again == nil {
			break
		}
		// The Retry is fenced by the attempt and writes the same again:
		// sending it once more makes its outcome known.
		n, aerr := again(rctx)
		switch {
		case aerr != nil:
			return &outcomeUnknownError{err: err, read: aerr}
		case n == 0:
			d.settled, d.lost, d.pending = true, true, nil
			return ErrLeaseLost
		}
		d.settled, d.pending = true, nil
		return nil
	}
	d.pending = nil
	return err
}

// readAdvisory reads an advisory delivery's row once no statement of its
// settlement can still be running: on the pinned session if it answers,
// else under the key's lock from a new session (discarding the pinned one,
// whose lock then ends with it), else (SQLite, whose drivers return only
// once a statement is over) through the pool.
func (d *Delivery) readAdvisory(ctx context.Context) (rowState, error) {
	q := d.q
	if d.adv.conn != nil {
		if r, err := d.readRow(ctx, d.adv.conn); err == nil {
			return r, nil
		}
		discard(d.adv.conn)
		d.adv.conn = nil
		q.holds.unreserve(1)
	}
	w, ok := capability[dialect.LockWaiter](q.dialect)
	if q.locker == nil || !ok {
		return d.readRow(ctx, q.db)
	}
	conn, err := q.db.Conn(ctx)
	if err != nil {
		return rowState{}, err
	}
	// The key's lock is this process's meanwhile, the set's entry perhaps
	// not (the delivery let it go).
	q.keys.linger(d.adv.inProcess)
	defer q.keys.unlinger(d.adv.inProcess)
	if err := w.WaitLock(ctx, conn, d.adv.ident, d.adv.key); err != nil {
		discard(conn)
		return rowState{}, err
	}
	r, err := d.readRow(ctx, conn)
	q.letGo(ctx, conn, d.adv.ident, d.adv.key)
	return r, err
}

// Committed tells d that tx, in which a settlement of d ran (AckTx,
// RetryTx, ReleaseTx or DeadTx), has committed: d is settled from then on,
// its keeper ended and (advisory form) its lock let go. Call it after a
// successful tx.Commit. Until it is called, or a later settlement or
// Extend of d learns the outcome from the row, d counts as not settled.
// It returns an error matching [ErrSettled] when d was settled already,
// and an error when no settlement of d is pending in tx; either way nothing
// changes.
func (d *Delivery) Committed(tx *sql.Tx) error {
	d.pauseKeeper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.settled {
		return opErr("committed", d.finishedErr())
	}
	if tx == nil || d.pending == nil || d.pending.tx != tx {
		return errors.New("inbox: committed: no settlement of this delivery ran in the transaction")
	}
	d.pending = nil
	d.finish(context.Background())
	return nil
}

// finish ends d once it is settled, d.mu held: the keeper ends and an
// advisory delivery lets its lock go.
func (d *Delivery) finish(ctx context.Context) {
	d.settled = true
	d.q.form.finished(ctx, d)
	d.endKeeper()
}
