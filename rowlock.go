package inbox

import (
	"context"
	"database/sql"
	"errors"
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
	now, err := q.claimNow(ctx, q.st.Claim, q.st.ClaimSelect, q.st.ClaimsCount)
	if err != nil {
		return ds, err
	}
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
		var counted any
		if q.st.ClaimsCount.SQL != "" {
			// The counter is committed before the row is locked, outside the
			// held transaction, so that a crash cannot roll it back.
			var claims int64
			var err error
			if counted, claims, err = q.countClaim(ctx, now); err != nil || counted == nil {
				return nil, err
			}
			if claims > int64(q.names.Raw.MaxClaims) {
				if err := q.deadPoison(ctx, counted, now); err != nil {
					return nil, err
				}
				continue
			}
		}
		// The transaction outlives Claim's context: database/sql rolls a
		// transaction back when the context it began with ends.
		tx, err := q.db.BeginTx(context.WithoutCancel(ctx), &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			return nil, err
		}
		d, err := q.claimInTx(ctx, tx, counted, now)
		if err != nil || d == nil {
			_ = tx.Rollback()
			if err == nil && counted != nil {
				// Another worker locked the counted row first: look again.
				continue
			}
			return nil, err
		}
		d.tx = tx
		q.track(d)
		return d, nil
	}
}

// countClaim counts a claim of the first claimable row and commits it,
// returning the row's id and its claims, or a nil id when none is claimable.
func (q *Queue) countClaim(ctx context.Context, now time.Time) (any, int64, error) {
	var id any
	var claims int64
	v := values{now: now}
	if q.st.ClaimsMark.SQL == "" {
		err := q.queryRow(ctx, q.db, q.st.ClaimsCount, &v).Scan(&id, &claims)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, 0, nil
		}
		return normID(id), claims, err
	}
	tx, err := q.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, 0, err
	}
	defer tx.Rollback()
	err = q.queryRow(ctx, tx, q.st.ClaimsCount, &v).Scan(&id, &claims)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	v.id = normID(id)
	if _, err := q.exec(ctx, tx, q.st.ClaimsMark, &v); err != nil {
		return nil, 0, err
	}
	return v.id, claims, tx.Commit()
}

// claimInTx claims one row inside tx: the row id when id is not nil (a row
// counted by ClaimsCount), else the first claimable one.
func (q *Queue) claimInTx(ctx context.Context, tx *sql.Tx, id any, now time.Time) (*Delivery, error) {
	return q.claimOne(ctx, tx, &values{id: id, limit: 1, now: now})
}

// claimOne claims one row through ex with Claim, or with ClaimSelect and
// ClaimMark; nil when there is none, or when the mark found the row gone.
func (q *Queue) claimOne(ctx context.Context, ex Executor, v *values) (*Delivery, error) {
	s := q.st.Claim
	if s.SQL == "" {
		s = q.st.ClaimSelect
	}
	rows, err := q.query(ctx, ex, s, v)
	if err != nil {
		return nil, err
	}
	ds, err := q.scanClaimed(rows, false, nil)
	if err != nil || len(ds) == 0 {
		return nil, err
	}
	if q.st.Claim.SQL == "" {
		mv := values{id: ds[0].id, attempt: ds[0].attempt}
		n, err := q.exec(ctx, ex, q.st.ClaimMark, &mv)
		if err != nil || n == 0 {
			return nil, err
		}
	}
	return ds[0], nil
}

// deadPoison moves a job past MaxClaims to the dead table, if no other
// worker holds it now.
func (q *Queue) deadPoison(ctx context.Context, id any, now time.Time) error {
	tx, err := q.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return err
	}
	defer tx.Rollback()
	d, err := q.claimInTx(ctx, tx, id, now)
	if err != nil || d == nil {
		return err
	}
	v := values{id: d.id, attempt: d.attempt}
	if _, err := q.moveDead(ctx, tx, &v); err != nil {
		return err
	}
	return tx.Commit()
}

// settleRowLock ends the held transaction: commit for Ack, Retry and Dead,
// rollback for Release. The delivery is finished either way: a transaction
// whose commit failed is gone, and its job is back in the queue.
func (d *Delivery) settleRowLock(ctx context.Context, o outcome, after time.Duration) error {
	q := d.q
	tx := d.tx
	v := values{id: d.id, attempt: d.attempt, micros: after.Microseconds()}
	var err error
	switch o {
	case outAck:
		var n int64
		if n, err = q.exec(ctx, tx, q.st.Ack, &v); err == nil && n != 1 {
			err = fmt.Errorf("deleted %d rows for id %v", n, d.id)
		}
	case outRetry:
		if after > 0 {
			if clockNeeded(q.st.Retry) {
				var now time.Time
				if now, err = q.readNow(ctx, tx); err != nil {
					break
				}
				v.now, v.until = now, now.Add(after)
			}
			_, err = q.exec(ctx, tx, q.st.Retry, &v)
		}
		if err == nil && q.st.ClaimsReset.SQL != "" {
			_, err = q.exec(ctx, tx, q.st.ClaimsReset, &v)
		}
	case outDead:
		_, err = q.moveDead(ctx, tx, &v)
	case outRelease:
		err = tx.Rollback()
		if err == nil && q.st.Release.SQL != "" {
			// Release is not a crash: take back the claim counted for it.
			// The statement skips a row another worker locked meanwhile.
			_, err = q.exec(ctx, q.db, q.st.Release, &v)
		}
		d.finishRowLock()
		return err
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
