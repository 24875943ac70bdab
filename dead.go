package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

var (
	// ErrNotDead is returned by [Queue.RequeueDead] when the dead table
	// holds no job with the id: it never died, it was purged, or another
	// requeue took it first. Nothing was changed.
	ErrNotDead = errors.New("inbox: no dead job with this id")
	// ErrNotFound is returned by [Queue.Cancel] when the table holds no job
	// with the id (nothing was changed), and by [Queue.Job] when neither
	// the table nor the dead table does.
	ErrNotFound = errors.New("inbox: no job with this id")
	// ErrInWork is returned by [Queue.Cancel] under the row lock when a
	// claim holds the job: its holder settles it. Nothing was changed.
	ErrInWork = errors.New("inbox: the job is in work")
	// ErrNoDeadAt is returned by [Queue.PurgeDead] with a cutoff when the
	// description names no Table.DeadAt. Nothing was changed.
	ErrNoDeadAt = errors.New("inbox: purging by age needs Table.DeadAt")
	// ErrDeadID is returned by [Queue.Enqueue] and [Queue.EnqueueMany] for
	// a Job.ID that a job of the dead table has: ids are never reused (a
	// stale holder's token, or the caller's own rows keyed on the id, could
	// match the new job). [Queue.RequeueDead] brings a dead job back under
	// a new id. Nothing was inserted.
	ErrDeadID = errors.New("inbox: the id is a dead job's: ids are never reused (RequeueDead gives a dead job a new id)")
	// ErrRequeueNeedsID is returned by [Queue.RequeueDead] and
	// [Queue.RequeueDeadAll] on a table that assigns no ids (its id
	// column has no default: Enqueue needs a Job.ID there): the requeued
	// job has none. [Queue.RequeueDeadAs] requeues it under an id the
	// caller gives. Nothing was changed.
	ErrRequeueNeedsID = errors.New("inbox: the table assigns no ids: requeue the dead job with RequeueDeadAs and a new id")
)

// idMissing reports whether err is the database refusing a row without an
// id: NOT NULL on the id column with no default (PostgreSQL's 23502,
// MySQL's 1364 and 1048, SQLite's NOT NULL constraint), or a NULL id a
// SQLite key let in ([ErrIDNotReturned]). The error must name the id
// column, so that another column's NULL is not taken for it.
func (q *Queue) idMissing(err error) bool {
	if errors.Is(err, ErrIDNotReturned) {
		return true
	}
	msg := err.Error()
	var st interface{ SQLState() string }
	notNull := errors.As(err, &st) && st.SQLState() == "23502" ||
		strings.Contains(msg, "Error 1364") || strings.Contains(msg, "Error 1048") ||
		strings.Contains(msg, "NOT NULL constraint failed") || strings.Contains(msg, "SQLSTATE 23502")
	return notNull && strings.Contains(strings.ToLower(msg), strings.ToLower(q.names.Raw.ID))
}

// DeadJob is one row of the dead table as [Queue.ListDead] read it.
type DeadJob struct {
	// ID is the job's id: an int64 or a string.
	ID any
	// Attempt is the attempt the job died on.
	Attempt int
	// LastError is the last error recorded (Table.LastError; empty without
	// it).
	LastError string
	// DeadAt is when the job died (Table.DeadAt; zero without it).
	DeadAt time.Time
	// Data are the data columns as the driver returned them.
	Data []any
}

// MaxList is the most dead jobs one [Queue.ListDead] returns.
const MaxList = 1000

// ListDead returns up to limit dead jobs (1 to [MaxList]), the most recent
// death first: by Table.DeadAt, then by id, both descending; by id
// descending without DeadAt. Jobs whose DeadAt is NULL died before the
// column was added: they come last, by id descending, with a zero DeadAt.
// With after, the listing continues past that job, so that the last job of
// one page asks for the next; an after with a zero DeadAt is past such a
// job. None is an empty result. Without Table.DeadTable it is an error
// ([ErrNoDeadTable]).
func (q *Queue) ListDead(ctx context.Context, limit int, after *DeadJob) ([]DeadJob, error) {
	if err := q.deadOp(limit); err != nil {
		return nil, opErr("list dead", err)
	}
	s, v := q.st.Dead.List, values{limit: limit}
	if after != nil {
		if err := checkID(after.ID); err != nil {
			return nil, opErr("list dead", err)
		}
		s, v.id, v.notBefore = q.st.Dead.ListAfter, after.ID, after.DeadAt
		if q.names.DeadAt != "" && after.DeadAt.IsZero() {
			s = q.st.Dead.ListAfterNull
			if s.SQL == "" {
				return nil, opErr("list dead", fmt.Errorf("dialect %s has no Dead.ListAfterNull statement: it cannot list past a job whose DeadAt is zero", q.dialect.Name()))
			}
		}
	}
	rows, err := q.query(ctx, q.db, s, &v)
	if err != nil {
		return nil, opErr("list dead", err)
	}
	defer rows.Close()
	var jobs []DeadJob
	for rows.Next() {
		j, err := q.scanDeadJob(rows)
		if err != nil {
			return nil, err
		}
		jobs = append(jobs, j)
	}
	if err := rows.Err(); err != nil {
		return nil, opErr("list dead", err)
	}
	return jobs, nil
}

// scanDeadJob reads one row of Dead.List.
func (q *Queue) scanDeadJob(rows *sql.Rows) (DeadJob, error) {
	var (
		j       DeadJob
		id      any
		attempt int64
		lastErr sql.NullString
		deadAt  rawValue
		err     error
	)
	j.Data = make([]any, len(q.names.Data))
	dest := []any{&id, &attempt}
	for i := range j.Data {
		dest = append(dest, &j.Data[i])
	}
	if q.names.LastError != "" {
		dest = append(dest, &lastErr)
	}
	if q.names.DeadAt != "" {
		dest = append(dest, &deadAt)
	}
	if err := rows.Scan(dest...); err != nil {
		return j, opErr("list dead", err)
	}
	j.ID, j.Attempt, j.LastError = normID(id), int(attempt), lastErr.String
	if q.names.DeadAt != "" && deadAt.v != nil {
		if j.DeadAt, err = q.dialect.ScanTime(deadAt.v); err != nil {
			return j, opErr("list dead: Table.DeadAt", err)
		}
		j.DeadAt = micro(j.DeadAt)
	}
	for i, d := range j.Data {
		if b, ok := d.([]byte); ok {
			// The driver may reuse the bytes at the next row.
			j.Data[i] = append([]byte(nil), b...)
		}
	}
	return j, nil
}

// RequeueDead puts the dead job id back into the queue and returns its new
// id: a new row, as [Queue.Enqueue] writes one, with the dead job's data,
// attempt 1 and, where Table.LastError is named, the error it died with (a
// handler can tell a requeued job by it). The dead row goes in the same
// transaction, so that of two operators requeueing one job at once, one
// requeues it and the other gets [ErrNotDead]. Its priority and delay are
// not kept. An id of the wrong kind is the driver's error, a new id the
// database does not report [ErrIDNotReturned]; either way, nothing is
// changed on an error.
func (q *Queue) RequeueDead(ctx context.Context, id any) (any, error) {
	if err := q.deadOp(1); err != nil {
		return nil, opErr("requeue dead", err)
	}
	if err := checkID(id); err != nil {
		return nil, opErr("requeue dead", err)
	}
	tx, err := q.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, opErr("requeue dead", err)
	}
	newID, err := q.requeueIn(ctx, q.own(tx), id)
	if err == nil {
		err = tx.Commit()
	} else {
		_ = tx.Rollback()
	}
	if err != nil {
		return nil, opErr("requeue dead", err)
	}
	q.bell.ring()
	return newID, nil
}

// RequeueDeadAs puts the dead job id back into the queue under newID, as
// [Queue.RequeueDead] does under an id the table assigns: for a table
// whose ids the caller gives (Enqueue needs a Job.ID there). newID must be
// one no job has had: a dead job's is [ErrDeadID], one in the queue table
// the database's duplicate-key error. Nothing is changed on an error.
func (q *Queue) RequeueDeadAs(ctx context.Context, id, newID any) error {
	if err := q.deadOp(1); err != nil {
		return opErr("requeue dead", err)
	}
	if err := checkID(id); err != nil {
		return opErr("requeue dead", err)
	}
	if err := checkID(newID); err != nil {
		return opErr("requeue dead", fmt.Errorf("new id: %w", err))
	}
	tx, err := q.db.BeginTx(ctx, nil)
	if err != nil {
		return opErr("requeue dead", err)
	}
	_, err = q.requeueAs(ctx, q.own(tx), id, newID)
	if err == nil {
		err = tx.Commit()
	} else {
		_ = tx.Rollback()
	}
	if err != nil {
		return opErr("requeue dead", err)
	}
	q.bell.ring()
	return nil
}

// requeueIn moves the dead job id back through the transaction tx, under
// an id the table assigns.
func (q *Queue) requeueIn(ctx context.Context, tx Executor, id any) (any, error) {
	return q.requeueAs(ctx, tx, id, nil)
}

// requeueAs moves the dead job id back through the transaction tx, under
// newID, or an id the table assigns when newID is nil.
func (q *Queue) requeueAs(ctx context.Context, tx Executor, id, newID any) (any, error) {
	if newID != nil {
		// Probed before the take removes the dead row, so that newID equal
		// to id is refused as any dead job's is.
		if err := q.checkNotDead(ctx, tx, []Job{{ID: newID}}); err != nil {
			return nil, fmt.Errorf("new id: %w", err)
		}
	}
	data := make([]any, len(q.names.Data))
	var took any
	var lastErr sql.NullString
	dest := []any{&took}
	for i := range data {
		dest = append(dest, &data[i])
	}
	if q.names.LastError != "" {
		dest = append(dest, &lastErr)
	}
	v := values{id: id}
	if err := q.queryRow(ctx, tx, q.st.Dead.Take, &v).Scan(dest...); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, fmt.Errorf("id %v: %w", id, ErrNotDead)
		}
		return nil, err
	}
	if q.st.Dead.TakeDelete.SQL != "" {
		if n, err := q.exec(ctx, tx, q.st.Dead.TakeDelete, &v); err != nil || n != 1 {
			if err == nil {
				err = fmt.Errorf("id %v: %w", id, ErrNotDead)
			}
			return nil, err
		}
	}
	job, enqueue := Job{Data: data}, q.st.Jobs.Enqueue
	if newID != nil {
		job.ID, enqueue = newID, q.st.Jobs.EnqueueID
	}
	newID, err := q.insert(ctx, tx, enqueue, job)
	if err != nil {
		if job.ID == nil && q.idMissing(err) {
			return nil, fmt.Errorf("%w (%w)", ErrRequeueNeedsID, err)
		}
		return nil, err
	}
	if q.st.Dead.RequeueError.SQL != "" && lastErr.Valid {
		ev := values{id: newID, errText: lastErr.String}
		if _, err := q.exec(ctx, tx, q.st.Dead.RequeueError, &ev); err != nil {
			return nil, err
		}
	}
	return newID, nil
}

// PurgeDead deletes the dead jobs that died before olderThan, or every dead
// job when olderThan is zero, and returns how many it deleted. A cutoff
// needs Table.DeadAt ([ErrNoDeadAt]).
func (q *Queue) PurgeDead(ctx context.Context, olderThan time.Time) (int64, error) {
	if err := q.deadOp(1); err != nil {
		return 0, opErr("purge dead", err)
	}
	s := q.st.Dead.Purge
	if !olderThan.IsZero() {
		if q.names.DeadAt == "" {
			return 0, opErr("purge dead", ErrNoDeadAt)
		}
		s = q.st.Dead.PurgeBefore
	}
	n, err := q.exec(ctx, q.db, s, &values{notBefore: olderThan})
	if err != nil {
		return 0, opErr("purge dead", err)
	}
	return n, nil
}

// Cancel deletes the job id from the queue before it runs. Under the row
// lock a job a claim holds is left to its holder ([ErrInWork]): the
// claim's transaction holds the row, and deleting it would wait for the
// handler. Under the lease a job in work is deleted too: its holder's
// keeper finds the row gone at its next extension, within the lease, and
// cancels the handler's context with cause [ErrCancelled], and the
// holder's extension or settlement returns it. Under the advisory form a
// job in work is deleted too: the holder has no keeper and learns at its
// settlement, which returns ErrCancelled. ErrCancelled matches
// [ErrLeaseLost]. A missing job is [ErrNotFound]. Nothing is changed on
// an error.
func (q *Queue) Cancel(ctx context.Context, id any) error {
	if q.st.Jobs.Cancel.SQL == "" {
		return opErr("cancel", fmt.Errorf("dialect %s has no Cancel statement", q.dialect.Name()))
	}
	if err := checkID(id); err != nil {
		return opErr("cancel", err)
	}
	v := values{id: id}
	if q.st.RowLock.CancelLock.SQL == "" {
		n, err := q.exec(ctx, q.db, q.st.Jobs.Cancel, &v)
		switch {
		case err != nil:
			return opErr("cancel", err)
		case n == 0:
			return opErr("cancel", fmt.Errorf("id %v: %w", id, ErrNotFound))
		}
		return nil
	}
	tx, err := q.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return opErr("cancel", err)
	}
	err = q.cancelHeld(ctx, q.own(tx), &v)
	if err == nil {
		err = tx.Commit()
	} else {
		_ = tx.Rollback()
	}
	if err != nil {
		return opErr("cancel", err)
	}
	return nil
}

// cancelHeld deletes the row-lock job v.id through tx unless a claim holds it.
func (q *Queue) cancelHeld(ctx context.Context, tx Executor, v *values) error {
	var got any
	err := q.queryRow(ctx, tx, q.st.RowLock.CancelLock, v).Scan(&got)
	if errors.Is(err, sql.ErrNoRows) {
		// Held by a claim, or not there: a plain read tells which.
		var one int
		err = q.queryRow(ctx, q.db, q.st.Jobs.Exists, v).Scan(&one)
		switch {
		case err == nil:
			return fmt.Errorf("id %v: %w", v.id, ErrInWork)
		case errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("id %v: %w", v.id, ErrNotFound)
		}
		return err
	}
	if err != nil {
		return err
	}
	_, err = q.exec(ctx, tx, q.st.Jobs.Cancel, v)
	return err
}

// checkNotDead refuses the ids of jobs that the dead table holds, looked up
// through ex before anything is inserted: one primary-key probe per job
// given an id, where a dead table is named. A job that dies between the
// probe and the insert is not seen (the probe locks nothing).
func (q *Queue) checkNotDead(ctx context.Context, ex Executor, jobs []Job) error {
	if q.st.Dead.Has.SQL == "" {
		return nil
	}
	for i, job := range jobs {
		if job.ID == nil {
			continue
		}
		var one int
		err := q.queryRow(ctx, ex, q.st.Dead.Has, &values{id: job.ID}).Scan(&one)
		switch {
		case err == nil && len(jobs) > 1:
			return fmt.Errorf("job %d: id %v: %w", i, job.ID, ErrDeadID)
		case err == nil:
			return fmt.Errorf("id %v: %w", job.ID, ErrDeadID)
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
	}
	return nil
}

// deadOp refuses a dead-job operation the queue cannot run.
func (q *Queue) deadOp(limit int) error {
	switch {
	case q.names.Dead == "":
		return ErrNoDeadTable
	case q.st.Dead.List.SQL == "":
		return fmt.Errorf("dialect %s has no dead-job statements", q.dialect.Name())
	case limit < 1 || limit > MaxList:
		return fmt.Errorf("limit %d must be from 1 to %d", limit, MaxList)
	}
	return nil
}

// checkID refuses an id no table's key can hold: nil, or a kind of value
// that is neither an integer nor text.
func checkID(id any) error {
	switch id.(type) {
	case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64, string, []byte:
		return nil
	case nil:
		return errors.New("the id is nil")
	}
	return fmt.Errorf("id %v is a %T: want an integer or a string", id, id)
}
