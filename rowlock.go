package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"strings"
	"time"
)

// rowHold is what holds a row-lock delivery: the claim's transaction, the
// release of its context, and the handler's savepoint (spNone, spTaken,
// spFailed) with why it failed.
type rowHold struct {
	tx    *sql.Tx
	endTx func()
	sp    int
	spErr error
}

// rowLockForm holds a job by the claim's transaction ([form]).
type rowLockForm struct{}

func (rowLockForm) claim(ctx context.Context, q *Queue, max int) ([]*Delivery, error) {
	return q.claimRowLock(ctx, max)
}

// refuse: a delay needs the not-before column, and the held transaction is
// the delivery's own, so a settlement cannot run in the caller's.
func (rowLockForm) refuse(q *Queue, tx *sql.Tx, o outcome, after time.Duration) error {
	if err := refuseDelay(q, o, after); err != nil {
		return err
	}
	if tx != nil {
		return ErrOwnTx
	}
	return nil
}

func (rowLockForm) settle(ctx context.Context, d *Delivery, _ *sql.Tx, o outcome, after time.Duration) error {
	return d.settleRowLock(ctx, o, after)
}

func (rowLockForm) leased() bool { return false }

// watch: nothing; the held transaction dies with its session, and the
// handler's writes with it.
func (rowLockForm) watch(*Delivery, context.CancelCauseFunc) (func(), bool) { return nil, false }

// holdsConn: the held transaction's.
func (rowLockForm) holdsConn(*Queue) bool { return true }

// held: a row-lock settlement learns nothing later; it ends the
// transaction that held the row.
func (rowLockForm) held(*Delivery) bool { return false }

func (rowLockForm) finished(context.Context, *Delivery) {}

// unconfirmed: never told, a settlement in the caller's transaction being
// refused (ErrOwnTx).
func (rowLockForm) unconfirmed(*Delivery) {}

// shutdown rolls the held transaction back, as Release does.
func (rowLockForm) shutdown(ctx context.Context, d *Delivery) error { return d.Release(ctx) }

// claimRowLock claims up to max jobs, each in a transaction of its own that
// stays open, holding the row's lock and a connection, until the settlement.
func (q *Queue) claimRowLock(ctx context.Context, max int) ([]*Delivery, error) {
	got, err := q.holds.reserve(max)
	if err != nil {
		return nil, err
	}
	ds := make([]*Delivery, 0, got)
	defer func() { q.holds.unreserve(got - len(ds)) }()
	q.picking.Add(1)
	defer q.picking.Add(-1)
	now, err := q.claimNow(ctx, q.st.Claim.Take, q.st.Claim.Select, q.st.Claim.Pick, q.st.Claim.PickLock, q.st.Claim.PickFirst, q.st.Claim.WalkFirst)
	if err != nil {
		return ds, err
	}
	// What the held transactions will run: the reserve left a connection
	// to prepare on.
	st := q.st
	q.warm(ctx, st.Claim.Take, st.Claim.Select, st.Claim.Mark, st.Claim.Pick, st.Claim.PickAfter, st.Claim.PickLock, st.Claim.PickFirst, st.Claim.WalkFirst, st.Settle.Ack, st.Settle.Retry, st.Settle.Dead, st.Settle.DeadDelete, st.RowLock.ClaimsClear)
	for len(ds) < got {
		d, err := q.claimOneRowLock(ctx, now)
		if err != nil {
			return ds, err
		}
		if d == nil {
			break
		}
		ds = append(ds, d)
	}
	return ds, nil
}

// claimOneRowLock returns one job in its held transaction, or nil when none
// is claimable.
func (q *Queue) claimOneRowLock(ctx context.Context, now time.Time) (*Delivery, error) {
	for {
		opts, atSession := q.claimTxOptions()
		tx, end, err := q.beginHeld(ctx, opts)
		if err != nil {
			return nil, err
		}
		// A transaction that ends here leaves its context uncancelled:
		// derived from no cancellable parent, it holds nothing.
		d, err := q.claimOne(ctx, q.own(tx), &values{limit: 1, now: now})
		if err == errWalkEnded {
			_ = tx.Rollback()
			continue
		}
		if err != nil || d == nil {
			_ = tx.Rollback()
			return nil, err
		}
		if atSession && q.readAtOtherLevel(d) {
			// Claimed at the session's level, which is another: again,
			// the level set, as every claim of q now sets it.
			_ = tx.Rollback()
			continue
		}
		if q.st.RowLock.ClaimsCount.SQL != "" {
			poison, err := q.countClaim(ctx, tx, d)
			if err != nil {
				_ = tx.Rollback()
				return nil, err
			}
			if poison {
				// Moved to the dead table: look for another job.
				continue
			}
		}
		d.row.tx, d.row.endTx = tx, end
		q.track(d)
		return d, nil
	}
}

// beginHeld begins a held transaction. The transaction outlives Claim's
// context, as database/sql rolls a transaction back when the context it
// began with ends; but the wait for a pool connection is Claim's and ends
// with ctx, so the transaction's context is one that ctx cancels only
// until BeginTx has returned. end lets that context go once the
// transaction is over.
func (q *Queue) beginHeld(ctx context.Context, opts *sql.TxOptions) (tx *sql.Tx, end func(), err error) {
	txCtx, end := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, end)
	tx, err = q.db.BeginTx(txCtx, opts)
	if !stop() {
		// ctx ended while BeginTx waited or just after: the transaction,
		// if any, is rolled back.
		if err == nil {
			_ = tx.Rollback()
		}
		end()
		return nil, nil, ctx.Err()
	}
	if err != nil {
		end()
		return nil, nil, err
	}
	return tx, end, nil
}

// countClaim counts the delivery d in the claims table, from a second
// session while tx holds d's row, so that the count commits whatever becomes
// of tx and no other worker can count the same delivery. When more than
// MaxClaims deliveries before this one ended without settling, the job is
// moved to the dead table through tx, which is committed, and countClaim
// reports true.
func (q *Queue) countClaim(ctx context.Context, tx *sql.Tx, d *Delivery) (bool, error) {
	v := values{id: d.id, attempt: d.attempt}
	claims, err := q.addClaim(ctx, &v)
	if err != nil {
		// The count may have committed: give it back, so that a failed
		// claim never counts. Should that fail too, the count runs ahead
		// by one for a claim that never delivered.
		_, _ = q.exec(context.WithoutCancel(ctx), q.db, q.st.RowLock.ClaimsGiveBack, &v)
		return false, err
	}
	if ended := claims - 1; ended <= int64(q.names.Raw.MaxClaims) {
		return false, nil
	}
	if _, err := q.moveDead(ctx, q.own(tx), &v); err != nil {
		return false, err
	}
	if _, err := q.exec(ctx, q.own(tx), q.st.RowLock.ClaimsClear, &v); err != nil {
		return false, err
	}
	return true, tx.Commit()
}

// addClaim runs ClaimsCount (and ClaimsRead where the count does not return
// rows) and returns the claims counted so far, this one included.
func (q *Queue) addClaim(ctx context.Context, v *values) (int64, error) {
	var claims int64
	if q.st.RowLock.ClaimsCount.Rows {
		err := q.queryRow(ctx, q.db, q.st.RowLock.ClaimsCount, v).Scan(&claims)
		return claims, err
	}
	if _, err := q.exec(ctx, q.db, q.st.RowLock.ClaimsCount, v); err != nil {
		return 0, err
	}
	err := q.queryRow(ctx, q.db, q.st.RowLock.ClaimsRead, v).Scan(&claims)
	return claims, err
}

// claimOne claims one row through ex with Claim, with Claim.Select, or by a
// pick (row lock), then Claim.Mark where there is one; nil when there is
// none, or when the mark found the row gone or changed.
func (q *Queue) claimOne(ctx context.Context, ex Executor, v *values) (*Delivery, error) {
	var ds []*Delivery
	var err error
	if q.st.Claim.PickLock.SQL != "" && q.names.Form == RowLock {
		ds, err = q.pickOne(ctx, ex, v.now)
	} else {
		s := q.st.Claim.Take
		if s.SQL == "" {
			s = q.st.Claim.Select
		}
		rows, qerr := q.query(ctx, ex, s, v)
		if qerr != nil {
			return nil, qerr
		}
		ds, err = q.scanClaimed(rows, false, nil, 1, nil, s.Level)
	}
	if err != nil || len(ds) == 0 {
		return nil, err
	}
	if q.st.Claim.Take.SQL == "" && q.st.Claim.Mark.SQL != "" {
		mv := values{id: ds[0].id, attempt: ds[0].attempt, now: v.now}
		n, err := q.exec(ctx, ex, q.st.Claim.Mark, &mv)
		if err != nil || n == 0 {
			return nil, err
		}
	}
	return ds[0], nil
}

// The handler's savepoint under the row lock ([Delivery.Tx]).
//
// It is taken lazily, when the handler first asks for the transaction,
// rather than by every claim: a handler can write through the held
// transaction only once Tx has returned it, so a savepoint taken before
// that return precedes every write of the handler, and handlers that never
// write pay no round trip (a claim stays BEGIN and one SELECT). Rejected:
// a savepoint in every claim, a statement more for every job to spare one
// for the jobs whose handlers write and then fail.
const (
	spNone   = iota // Tx not called: the handler wrote nothing
	spTaken         // Tx took the savepoint before it returned
	spFailed        // Tx was called but the savepoint failed: nothing can be undone apart
)

// Tx returns the claim's transaction under the row lock, nil under the
// other forms. The handler's writes through it commit with [Delivery.Ack]
// alone: [Delivery.Release], [Delivery.Retry] and [Delivery.Dead] undo
// them, the latter two rolling back to a savepoint that Tx takes before it
// first returns (one round trip, once per delivery), then recording the
// attempt and the error. A statement that failed in the handler
// (PostgreSQL then refuses every other statement of the transaction) or a
// transaction the handler ended itself does not keep the attempt from
// being recorded. When the savepoint cannot be taken, the transaction is
// gone (MySQL rolls it back on a deadlock, and would then commit each
// statement on its own): Tx ends it, statements through it fail with
// [sql.ErrTxDone], and Ack returns the savepoint's error. Tx may be called
// from several goroutines; a call during a settlement waits for it.
func (d *Delivery) Tx() *sql.Tx {
	if d.row.tx == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.row.sp == spNone && !d.settled {
		d.row.sp = spTaken
		// No context to end it: the statement is the transaction's own,
		// on the connection it holds.
		if _, err := d.q.exec(context.Background(), d.q.own(d.row.tx), d.q.st.RowLock.Savepoint, &values{}); err != nil {
			// The transaction is gone: on MySQL a deadlock (a Galera
			// brute-force abort) rolled it back, and the handler's
			// statements would each commit on their own. Ending it here
			// makes them fail (sql.ErrTxDone); Ack reports this error,
			// and Retry and Dead record the attempt in a transaction of
			// their own.
			d.row.sp, d.row.spErr = spFailed, err
			_ = d.row.tx.Rollback()
		}
	}
	return d.row.tx
}

// checkRowLock refuses a row-lock dialect that cannot undo a failed
// attempt's writes.
func checkRowLock(n *dialect.Names, st *Statements) error {
	if n.Form == RowLock && (st.RowLock.Savepoint.SQL == "" || st.RowLock.RollbackToSavepoint.SQL == "" || st.RowLock.Relock.SQL == "") {
		return fmt.Errorf("the row lock needs Statements.RowLock.Savepoint, RollbackToSavepoint and Relock")
	}
	return nil
}

// settleRowLock ends the held transaction: Ack deletes the row and commits
// the handler's writes with it; Retry and Dead record the attempt without
// them (recordRowLock); Release rolls back. The delivery is finished
// either way: a transaction whose commit failed is gone, and its job is
// back in the queue.
func (d *Delivery) settleRowLock(ctx context.Context, o outcome, after time.Duration) error {
	q := d.q
	tx := d.row.tx
	v := values{id: d.id, attempt: d.attempt, micros: after.Microseconds(), errText: d.errText}
	defer d.finishRowLock()
	switch o {
	case outRetry, outDead, outDrop:
		return d.recordRowLock(ctx, o, &v, after)
	case outRelease:
		return d.releaseRowLock(ctx, &v)
	}
	if d.row.sp == spFailed {
		_ = tx.Rollback()
		return fmt.Errorf("the claim's transaction failed before the handler wrote: %w", d.row.spErr)
	}
	ex := q.own(tx)
	n, err := q.exec(ctx, ex, q.st.Settle.Ack, &v)
	if err == nil && n != 1 {
		// The lock held the row, so only a server that does not share
		// locks (a Galera node) can have let another claim settle it.
		err = fmt.Errorf("%w: deleted %d rows for id %v", ErrLeaseLost, n, d.id)
	}
	if err == nil && q.st.RowLock.ClaimsClear.SQL != "" {
		// A settled delivery leaves no count behind.
		_, err = q.exec(ctx, ex, q.st.RowLock.ClaimsClear, &v)
	}
	if err != nil {
		// Nothing of a failed settlement may commit: the statements before
		// the failure roll back with the transaction.
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// recordRowLock records a Retry, Dead or Drop: the attempt spent, the
// error, the row moved to the dead table or deleted, and nothing the
// handler wrote. In the held
// transaction when it can be restored: rolled back to the handler's
// savepoint when Tx took one. A text the database refuses (a last_error
// narrower than it) is sent again without it. Otherwise (a deadlock rolled
// the transaction back, its session was cut, the handler ended it, or on
// PostgreSQL a refused text aborted it with no savepoint to return to) the
// held transaction is rolled back and the verdict recorded in a new one
// (recordAnew): a job can always be retried and always die.
func (d *Delivery) recordRowLock(ctx context.Context, o outcome, v *values, after time.Duration) error {
	q := d.q
	ex := q.own(d.row.tx)
	undo := func() error {
		switch d.row.sp {
		case spTaken:
			_, err := q.exec(ctx, ex, q.st.RowLock.RollbackToSavepoint, &values{})
			return err
		case spFailed:
			return fmt.Errorf("the handler's savepoint could not be taken: %w", d.row.spErr)
		}
		return nil
	}
	err := undo()
	if err == nil {
		err = d.verdict(ctx, ex, o, v, after)
		if err != nil && v.errText != nil && textRejected(err) {
			// On MySQL the refused statement alone rolled back; on
			// PostgreSQL the savepoint, when there is one, recovers
			// the aborted transaction.
			v.errText = nil
			if err = undo(); err == nil {
				err = d.verdict(ctx, ex, o, v, after)
			}
		}
	}
	if err == nil {
		return d.row.tx.Commit()
	}
	_ = d.row.tx.Rollback()
	if err2 := d.recordAnew(ctx, o, v, after); err2 != nil {
		return fmt.Errorf("%w (in the held transaction: %w)", err2, err)
	}
	return nil
}

// recordAnew records a Retry, Dead or Drop in a transaction of its own,
// once the held one is gone: it locks the row again if it still has the
// delivered attempt, so that a job another claim took and settled
// meanwhile is left alone ([ErrLeaseLost]). A text the database refuses is
// sent again without it.
//
// Relock waits for the row's lock, up to a bound the server enforces:
// the transaction holding it may be the held one itself. A driver that
// gives up on a statement by closing its socket (go-sql-driver/mysql, pgx)
// leaves the server session running it, holding the row, until it finds
// its client gone; skipping that row would leave the attempt unrecorded
// and the job delivered again at the same attempt forever. Queued behind
// that session, the relock takes the row before any claim can. A wait
// that times out (another claim holds the row that long) is a lost lease.
func (d *Delivery) recordAnew(ctx context.Context, o outcome, v *values, after time.Duration) error {
	q := d.q
	for {
		tx, err := q.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			return err
		}
		ex := q.own(tx)
		var id any
		err = q.queryRow(ctx, ex, q.st.RowLock.Relock, v).Scan(&id)
		if errors.Is(err, sql.ErrNoRows) || lockTimedOut(err) {
			_ = tx.Rollback()
			d.lost = true
			if err != sql.ErrNoRows {
				return fmt.Errorf("%w: its transaction ended, and another claim holds the job: %w", ErrLeaseLost, err)
			}
			return fmt.Errorf("%w: its transaction ended, and the job was settled by another claim", ErrLeaseLost)
		}
		if err == nil {
			err = d.verdict(ctx, ex, o, v, after)
		}
		if err == nil {
			return tx.Commit()
		}
		_ = tx.Rollback()
		if v.errText == nil || !textRejected(err) {
			return err
		}
		v.errText = nil
	}
}

// lockTimedOut reports a wait for a row lock that the server ended:
// PostgreSQL's lock_timeout (SQLSTATE 55P03), InnoDB's
// innodb_lock_wait_timeout (error 1205).
func lockTimedOut(err error) bool {
	if err == nil {
		return false
	}
	var st interface{ SQLState() string }
	if errors.As(err, &st) && st.SQLState() == "55P03" {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "55P03") || strings.Contains(msg, "Error 1205")
}

// verdict runs the statements of a Retry, Dead or Drop through ex.
func (d *Delivery) verdict(ctx context.Context, ex Executor, o outcome, v *values, after time.Duration) error {
	q := d.q
	var err error
	switch o {
	case outRetry:
		// The claim wrote nothing: the Retry counts the attempt spent.
		if err = q.fillTimes(ctx, ex, q.st.Settle.Retry, v, after); err == nil {
			_, err = q.exec(ctx, ex, q.st.Settle.Retry, v)
		}
	case outDrop:
		var n int64
		if n, err = q.exec(ctx, ex, q.st.Settle.Ack, v); err == nil && n != 1 {
			err = fmt.Errorf("%w: deleted %d rows for id %v", ErrLeaseLost, n, d.id)
		}
	default:
		_, err = q.moveDead(ctx, ex, v)
	}
	if err == nil && q.st.RowLock.ClaimsClear.SQL != "" {
		// A settled delivery leaves no count behind: Dead removes the
		// job, and a Retry is a verdict, so it starts the count anew.
		_, err = q.exec(ctx, ex, q.st.RowLock.ClaimsClear, v)
	}
	return err
}

// releaseRowLock rolls the held transaction back. With a claims table the
// delivery's count is given back, in a transaction of a second session
// that commits only once the rollback succeeded: a holder whose session
// was cut (its rollback fails) ended without settling, as a crash does,
// and its count must stand. The give-back is sent while the row is still
// held, and its lock on the count keeps the next claim's count of the job
// waiting until it commits, so no claim reads a count that still includes
// this delivery. Should the give-back fail, the count runs ahead by one.
func (d *Delivery) releaseRowLock(ctx context.Context, v *values) error {
	q := d.q
	if q.st.RowLock.ClaimsGiveBack.SQL == "" {
		return d.row.tx.Rollback()
	}
	bctx := context.WithoutCancel(ctx)
	back, err := q.db.BeginTx(bctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err == nil {
		if _, err = q.exec(bctx, q.own(back), q.st.RowLock.ClaimsGiveBack, v); err != nil {
			_ = back.Rollback()
		}
	}
	rerr := d.row.tx.Rollback()
	if err == nil {
		// A transaction the handler ended itself (ErrTxDone) was no
		// crash either.
		if rerr == nil || errors.Is(rerr, sql.ErrTxDone) {
			_ = back.Commit()
		} else {
			_ = back.Rollback()
		}
	}
	return rerr
}

func (d *Delivery) finishRowLock() {
	d.settled = true
	if d.row.endTx != nil {
		d.row.endTx()
	}
	d.q.holds.unreserve(1)
	d.q.untrack(d)
}
