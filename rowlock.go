package inbox

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// claimRowLock claims up to max jobs, each in a transaction of its own that
// stays open, holding the row's lock and a connection, until the settlement.
func (q *Queue) claimRowLock(ctx context.Context, max int) ([]*Delivery, error) {
	got, err := q.holds.reserve(max)
	if err != nil {
		return nil, err
	}
	ds := make([]*Delivery, 0, got)
	defer func() { q.holds.unreserve(got - len(ds)) }()
	now, err := q.claimNow(ctx, q.st.Claim, q.st.ClaimSelect, q.st.Pick, q.st.PickLock)
	if err != nil {
		return ds, err
	}
	// What the held transactions will run: the reserve left a connection
	// to prepare on.
	st := q.st
	q.warm(ctx, st.Claim, st.ClaimSelect, st.ClaimMark, st.Pick, st.PickAfter, st.PickLock, st.Ack, st.Retry, st.DeadInsert, st.DeadDelete, st.ClaimsClear)
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
		// The transaction outlives Claim's context: database/sql rolls a
		// transaction back when the context it began with ends.
		tx, err := q.db.BeginTx(context.WithoutCancel(ctx), &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			return nil, err
		}
		d, err := q.claimOne(ctx, q.own(tx), &values{limit: 1, now: now})
		if err != nil || d == nil {
			_ = tx.Rollback()
			return nil, err
		}
		if q.st.ClaimsCount.SQL != "" {
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
		d.tx = tx
		q.track(d)
		return d, nil
	}
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
		_, _ = q.exec(context.WithoutCancel(ctx), q.db, q.st.ClaimsGiveBack, &v)
		return false, err
	}
	if ended := claims - 1; ended <= int64(q.names.Raw.MaxClaims) {
		return false, nil
	}
	if _, err := q.moveDead(ctx, q.own(tx), &v); err != nil {
		return false, err
	}
	if _, err := q.exec(ctx, q.own(tx), q.st.ClaimsClear, &v); err != nil {
		return false, err
	}
	return true, tx.Commit()
}

// addClaim runs ClaimsCount (and ClaimsRead where the count does not return
// rows) and returns the claims counted so far, this one included.
func (q *Queue) addClaim(ctx context.Context, v *values) (int64, error) {
	var claims int64
	if q.st.ClaimsCount.Rows {
		err := q.queryRow(ctx, q.db, q.st.ClaimsCount, v).Scan(&claims)
		return claims, err
	}
	if _, err := q.exec(ctx, q.db, q.st.ClaimsCount, v); err != nil {
		return 0, err
	}
	err := q.queryRow(ctx, q.db, q.st.ClaimsRead, v).Scan(&claims)
	return claims, err
}

// claimOne claims one row through ex with Claim, with ClaimSelect, or by a
// pick (row lock), then ClaimMark where there is one; nil when there is
// none, or when the mark found the row gone or changed.
func (q *Queue) claimOne(ctx context.Context, ex Executor, v *values) (*Delivery, error) {
	var ds []*Delivery
	var err error
	if q.st.PickLock.SQL != "" && q.names.Form == RowLock {
		ds, err = q.pick(ctx, ex, 1, v.now, nil)
	} else {
		s := q.st.Claim
		if s.SQL == "" {
			s = q.st.ClaimSelect
		}
		rows, qerr := q.query(ctx, ex, s, v)
		if qerr != nil {
			return nil, qerr
		}
		ds, err = q.scanClaimed(rows, false, nil, 1, nil)
	}
	if err != nil || len(ds) == 0 {
		return nil, err
	}
	if q.st.Claim.SQL == "" && q.st.ClaimMark.SQL != "" {
		mv := values{id: ds[0].id, attempt: ds[0].attempt, now: v.now}
		n, err := q.exec(ctx, ex, q.st.ClaimMark, &mv)
		if err != nil || n == 0 {
			return nil, err
		}
	}
	return ds[0], nil
}

// settleRowLock ends the held transaction: commit for Ack, Retry and Dead,
// rollback for Release. The delivery is finished either way: a transaction
// whose commit failed is gone, and its job is back in the queue.
func (d *Delivery) settleRowLock(ctx context.Context, o outcome, after time.Duration) error {
	q := d.q
	tx := d.tx
	ex := q.own(tx)
	v := values{id: d.id, attempt: d.attempt, micros: after.Microseconds(), errText: d.errText}
	var err error
	switch o {
	case outAck:
		var n int64
		if n, err = q.exec(ctx, ex, q.st.Ack, &v); err == nil && n != 1 {
			err = fmt.Errorf("deleted %d rows for id %v", n, d.id)
		}
	case outRetry:
		// The claim wrote nothing: the Retry counts the attempt spent.
		if err = q.fillTimes(ctx, ex, q.st.Retry, &v, after); err == nil {
			_, err = q.exec(ctx, ex, q.st.Retry, &v)
		}
	case outDead:
		_, err = q.moveDead(ctx, ex, &v)
	case outRelease:
		if q.st.ClaimsGiveBack.SQL != "" {
			// Release is not a crash: its count is taken back while the
			// row is still held, before anyone else can count it. Should
			// that fail, the count runs ahead by one.
			_, _ = q.exec(context.WithoutCancel(ctx), q.db, q.st.ClaimsGiveBack, &v)
		}
		err = tx.Rollback()
		d.finishRowLock()
		return err
	}
	if err == nil && q.st.ClaimsClear.SQL != "" {
		// A settled delivery leaves no count behind: Ack and Dead remove
		// the job, and a Retry is a verdict, so it starts the count anew.
		_, err = q.exec(ctx, ex, q.st.ClaimsClear, &v)
	}
	if err != nil {
		// Nothing of a failed settlement may commit: the statements before
		// the failure roll back with the transaction.
		_ = tx.Rollback()
		d.finishRowLock()
		return err
	}
	err = tx.Commit()
	d.finishRowLock()
	return err
}

func (d *Delivery) finishRowLock() {
	d.settled = true
	d.q.holds.unreserve(1)
	d.q.untrack(d)
}
