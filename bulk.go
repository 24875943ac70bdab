package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// ErrNotWaiting is returned by [Queue.RunNow] when the job is there but
// does not wait: it is ready already, or dead. Nothing was changed.
var ErrNotWaiting = errors.New("inbox: the job is not waiting")

// DeadFilter chooses the dead jobs of [Queue.CountDead] and
// [Queue.RequeueDeadAll]. Its zero value is every dead job.
type DeadFilter struct {
	// DiedBefore, when not zero, keeps the jobs that died before it (as
	// [Queue.PurgeDead]'s cutoff); it needs Table.DeadAt ([ErrNoDeadAt]).
	// A job whose DeadAt is NULL (dead before the column was added) is
	// not before any time.
	DiedBefore time.Time
	// Max, when above zero, is the most jobs chosen: an operator who
	// confirmed a count requeues no more than that many, however many
	// died since. Negative is an error.
	Max int64
}

// DeleteDead deletes the dead job id: it will not run. A job the dead
// table does not hold (never dead, requeued or purged already) is
// [ErrNotDead]; without Table.DeadTable it is [ErrNoDeadTable]. Nothing is
// changed on an error.
func (q *Queue) DeleteDead(ctx context.Context, id any) error {
	return q.DeleteDeadMany(ctx, []any{id})
}

// DeleteDeadMany deletes the dead jobs ids (1 to [MaxList] of them) in one
// transaction: all of them, or, when one is not in the dead table
// ([ErrNotDead], naming it), none.
func (q *Queue) DeleteDeadMany(ctx context.Context, ids []any) error {
	op := "delete dead"
	if err := q.checkIDs(ids); err != nil {
		return opErr(op, err)
	}
	err := q.atomic(ctx, func(tx Executor) error {
		for _, id := range ids {
			n, err := q.exec(ctx, tx, q.st.Dead.Delete, &values{id: id})
			switch {
			case err != nil:
				return err
			case n == 0:
				return fmt.Errorf("id %v: %w", id, ErrNotDead)
			}
		}
		return nil
	})
	if err != nil {
		return opErr(op, err)
	}
	return nil
}

// RequeueDeadMany requeues the dead jobs ids (1 to [MaxList] of them) as
// [Queue.RequeueDead] requeues one, in one transaction, and returns their
// new ids in the order of ids: all of them, or, when one is not in the
// dead table ([ErrNotDead], naming it), none.
func (q *Queue) RequeueDeadMany(ctx context.Context, ids []any) ([]any, error) {
	op := "requeue dead"
	if err := q.checkIDs(ids); err != nil {
		return nil, opErr(op, err)
	}
	newIDs := make([]any, 0, len(ids))
	err := q.atomic(ctx, func(tx Executor) error {
		newIDs = newIDs[:0]
		for _, id := range ids {
			newID, err := q.requeueIn(ctx, tx, id)
			if err != nil {
				return err
			}
			newIDs = append(newIDs, newID)
		}
		return nil
	})
	if err != nil {
		return nil, opErr(op, err)
	}
	q.bell.ring()
	return newIDs, nil
}

// CountDead returns how many dead jobs f chooses (at most f.Max): what
// [Queue.RequeueDeadAll] would requeue now, for an operator to confirm.
func (q *Queue) CountDead(ctx context.Context, f DeadFilter) (int64, error) {
	if err := q.checkDeadFilter(f); err != nil {
		return 0, opErr("count dead", err)
	}
	s := q.st.Dead.Count
	if !f.DiedBefore.IsZero() {
		s = q.st.Dead.CountOlder
	}
	var n int64
	if err := q.queryRow(ctx, q.db, s, &values{notBefore: f.DiedBefore}).Scan(&n); err != nil {
		return 0, opErr("count dead", err)
	}
	if f.Max > 0 {
		n = min(n, f.Max)
	}
	return n, nil
}

// RequeueDeadAll requeues the dead jobs f chooses, as [Queue.RequeueDead]
// requeues one, in transactions of at most batch jobs (1 to [MaxList])
// that each commit before the next begins, so that no transaction holds
// more than batch rows however many jobs there are, and returns how many
// it requeued. It walks the dead table once, by id, and stops at the
// count of jobs f chose when it began (at most f.Max), so that jobs dying again meanwhile
// (under new ids) are not requeued twice by one call. A job another
// requeue or a purge takes meanwhile is passed over. On an error the
// batches committed stay requeued: the count says how many, and the
// error's batch changed nothing.
func (q *Queue) RequeueDeadAll(ctx context.Context, f DeadFilter, batch int) (int64, error) {
	op := "requeue dead"
	if batch < 1 || batch > MaxList {
		return 0, opErr(op, fmt.Errorf("batch %d must be from 1 to %d", batch, MaxList))
	}
	left, err := q.CountDead(ctx, f)
	if err != nil {
		return 0, err
	}
	var done int64
	var after any
	for left > 0 {
		limit := int(min(left, int64(batch)))
		ids, err := q.deadBatch(ctx, f, after, limit)
		if err != nil {
			return done, opErr(op, err)
		}
		if len(ids) == 0 {
			break
		}
		n := int64(0)
		err = q.atomic(ctx, func(tx Executor) error {
			n = 0
			for _, id := range ids {
				_, err := q.requeueIn(ctx, tx, id)
				switch {
				case errors.Is(err, ErrNotDead):
					continue // another requeue or a purge took it meanwhile
				case err != nil:
					return err
				}
				n++
			}
			return nil
		})
		if err != nil {
			return done, opErr(op, err)
		}
		done, left, after = done+n, left-n, ids[len(ids)-1]
		if n > 0 {
			q.bell.ring()
		}
		if len(ids) < limit {
			break
		}
	}
	return done, nil
}

// deadBatch reads the ids of up to limit dead jobs of f past the id after,
// in id order. It reads outside the batch's transaction, whose first
// statement then takes a row (Dead.Take): a SQLite transaction that began
// with a read could not take the write lock once another connection had
// written, and every engine holds the batch's locks the shorter for it.
// The take decides: a job gone since the read is passed over.
func (q *Queue) deadBatch(ctx context.Context, f DeadFilter, after any, limit int) ([]any, error) {
	s := q.st.Dead.Batch
	switch {
	case f.DiedBefore.IsZero() && after != nil:
		s = q.st.Dead.BatchAfter
	case after == nil && !f.DiedBefore.IsZero():
		s = q.st.Dead.BatchOlder
	case after != nil:
		s = q.st.Dead.BatchOlderAfter
	}
	rows, err := q.query(ctx, q.db, s, &values{id: after, notBefore: f.DiedBefore, limit: limit})
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []any
	for rows.Next() {
		var id any
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, normID(id))
	}
	return ids, rows.Err()
}

// RunNow makes the waiting job id claimable now: one whose not-before
// time, or retry delay, lies ahead. Under the lease a job waits when its
// lease ends more than the queue's lease from now (a Retry's delay, as
// [Queue.ListJobs] tells it); a lease ending sooner is a holder's, or a
// delay shorter than a lease that reads the same, and is refused with
// [ErrInWork] so that no holder's token is touched. Under the row lock a
// job a claim holds is ErrInWork, found without waiting for its holder.
// Under the advisory form a held job's row reads ready, as it was when
// claimed, and RunNow leaves it alone as it does every ready job. A job
// that is ready already, or dead, is [ErrNotWaiting]; one in
// neither table [ErrNotFound]. Without Table.NotBefore no job of the row
// lock or advisory forms can wait, and RunNow refuses. Nothing is changed
// on an error.
func (q *Queue) RunNow(ctx context.Context, id any) error {
	if q.st.Jobs.RunNow.SQL == "" {
		return opErr("run now", fmt.Errorf("no job of table %s can wait: the %s form delays jobs with Table.NotBefore, which it does not name", q.cfg.Table.Name, q.names.Form))
	}
	if err := checkID(id); err != nil {
		return opErr("run now", err)
	}
	v := values{id: id, micros: q.lease.Microseconds()}
	if err := q.fillTimes(ctx, q.db, q.st.Jobs.RunNow, &v, q.lease); err != nil {
		return opErr("run now", err)
	}
	var n int64
	var err error
	if q.st.RowLock.CancelLock.SQL == "" {
		n, err = q.exec(ctx, q.db, q.st.Jobs.RunNow, &v)
	} else {
		err = q.atomicRC(ctx, func(tx Executor) error {
			// Held by a claim, or not there: nothing is sent, and
			// notWaiting tells which once the transaction has ended.
			var got any
			if err := q.queryRow(ctx, tx, q.st.RowLock.CancelLock, &v).Scan(&got); err != nil {
				if errors.Is(err, sql.ErrNoRows) {
					return nil
				}
				return err
			}
			var err error
			n, err = q.exec(ctx, tx, q.st.Jobs.RunNow, &v)
			return err
		})
	}
	if err == nil && n == 0 {
		err = q.notWaiting(ctx, id)
	}
	if err != nil {
		return opErr("run now", err)
	}
	q.bell.ring()
	return nil
}

// notWaiting says why RunNow changed nothing for id: the job as
// [Queue.Job] finds it.
func (q *Queue) notWaiting(ctx context.Context, id any) error {
	j, err := q.Job(ctx, id)
	switch {
	case errors.Is(err, ErrNotFound):
		return fmt.Errorf("id %v: %w", id, ErrNotFound)
	case err != nil:
		return err
	case j.State == StateInWork:
		return fmt.Errorf("id %v: %w", id, ErrInWork)
	}
	return fmt.Errorf("id %v is %s: %w", id, j.State, ErrNotWaiting)
}

// checkIDs refuses a list of ids a bulk dead-job operation cannot take.
func (q *Queue) checkIDs(ids []any) error {
	if err := q.deadOp(1); err != nil {
		return err
	}
	if q.st.Dead.Delete.SQL == "" {
		return fmt.Errorf("dialect %s has no Dead.Delete statement", q.dialect.Name())
	}
	if len(ids) == 0 || len(ids) > MaxList {
		return fmt.Errorf("%d ids: give 1 to %d", len(ids), MaxList)
	}
	for _, id := range ids {
		if err := checkID(id); err != nil {
			return err
		}
	}
	return nil
}

// checkDeadFilter refuses a filter the queue cannot count.
func (q *Queue) checkDeadFilter(f DeadFilter) error {
	if err := q.deadOp(1); err != nil {
		return err
	}
	switch {
	case q.st.Dead.Count.SQL == "" || q.st.Dead.Batch.SQL == "":
		return fmt.Errorf("dialect %s has no Dead.Count and Dead.Batch statements", q.dialect.Name())
	case f.Max < 0:
		return fmt.Errorf("DeadFilter.Max %d: zero for all, or the most jobs to choose", f.Max)
	case !f.DiedBefore.IsZero() && q.names.DeadAt == "":
		return ErrNoDeadAt
	case !f.DiedBefore.IsZero() && q.st.Dead.CountOlder.SQL == "":
		return fmt.Errorf("dialect %s has no Dead.CountOlder statement", q.dialect.Name())
	}
	return nil
}

// atomic runs fn in a transaction of the queue's database, committed when
// fn returns nil and rolled back otherwise.
func (q *Queue) atomic(ctx context.Context, fn func(tx Executor) error) error {
	return q.runTx(ctx, nil, fn)
}

// atomicRC is atomic at READ COMMITTED, where a row lock taken without waiting
// must see the latest committed row.
func (q *Queue) atomicRC(ctx context.Context, fn func(tx Executor) error) error {
	return q.runTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted}, fn)
}

func (q *Queue) runTx(ctx context.Context, opts *sql.TxOptions, fn func(tx Executor) error) error {
	tx, err := q.db.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	if err := fn(q.own(tx)); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}
