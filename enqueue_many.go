package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"slices"
)

// manyRows is the most jobs one EnqueueMany statement inserts, below the
// engine's parameter limit: statements of 5,000 rows inserted 5,000 jobs no
// faster than five of 1,000 in one transaction on PostgreSQL, MariaDB and
// SQLite (bench/README.md, bulk enqueue), and a longer text costs a parse.
const manyRows = 1000

// EnqueueMany inserts jobs through ex (a *sql.DB, *sql.Tx or *sql.Conn) in
// multi-row statements and returns their ids in the order of jobs, each an
// int64 or a string. Either every job is inserted or none is: through a
// *sql.DB or *sql.Conn the statements run in a transaction of their own
// when there are several (more than a thousand jobs, or jobs that differ in
// having an id or a not-before time); through a *sql.Tx they commit with
// the caller's transaction. Through another Executor each statement
// commits by itself.
//
// An error leaves none of the jobs inserted, but for an error of the
// COMMIT of its own transaction (its context ended during it, the
// connection broke), whose outcome the driver cannot tell: the jobs are
// then all inserted or none; and for [ErrIDNotReturned] outside a
// transaction, when a statement had inserted its jobs before their ids
// were found missing.
//
// Each job is checked as [Queue.Enqueue] checks one; an error names the
// first bad job by its index, and then nothing is sent. Loops of this
// process waiting on [Queue.NextWake] are woken once, after the jobs are
// committed (through a *sql.Tx, call [Queue.Wake] after the commit); with
// [Config.NotifyChannel] each statement sends one notification.
//
// Ids the database assigns come back in job order on every engine: on
// PostgreSQL and SQLite from RETURNING; on MySQL and MariaDB from
// LastInsertId, the id of a statement's first row, and
// @@auto_increment_increment: InnoDB reserves the ids of a multi-row
// INSERT … VALUES at once, consecutive in every innodb_autoinc_lock_mode.
// A job given an id keeps it; ids of dead jobs are refused as
// [Queue.Enqueue] refuses them ([ErrDeadID], the job named by its index),
// one probe per job given an id, before anything is inserted.
func (q *Queue) EnqueueMany(ctx context.Context, ex Executor, jobs []Job) ([]any, error) {
	for i, job := range jobs {
		if len(job.Data) != len(q.names.Data) {
			return nil, fmt.Errorf("inbox: enqueue many: job %d: %d data values for the %d data columns %v", i, len(job.Data), len(q.names.Data), q.names.Raw.Data)
		}
		if !job.NotBefore.IsZero() && q.st.Jobs.EnqueueAt.SQL == "" {
			return nil, fmt.Errorf("inbox: enqueue many: job %d: a not-before time needs Table.NotBefore under the %s form", i, q.names.Form)
		}
		if err := q.checkUnique(job); err != nil {
			return nil, fmt.Errorf("inbox: enqueue many: job %d: %v", i, err)
		}
	}
	if len(jobs) == 0 {
		return []any{}, nil
	}
	if err := q.checkNotDead(ctx, ex, jobs); err != nil {
		return nil, opErr("enqueue many", err)
	}
	ids := make([]any, len(jobs))
	if keyed(jobs) {
		return q.insertKeyed(ctx, ex, jobs, ids)
	}
	chunks := q.manyChunks(jobs)
	err := q.inOneTx(ctx, ex, len(chunks) > 1, func(ex Executor) error {
		for _, c := range chunks {
			if err := q.insertMany(ctx, ex, jobs[c.from:c.to], ids[c.from:c.to]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if _, inTx := ex.(*sql.Tx); !inTx {
		q.bell.ring()
	}
	return ids, nil
}

// chunk is jobs[from:to], inserted by one statement.
type chunk struct{ from, to int }

// manyChunks cuts jobs into runs that one statement inserts: jobs alike in
// having an id and a not-before time (one column list), at most manyRows
// of them and within the engine's parameter limit. Without a bulk insert
// (the dialect has none, or a table with no column to name) each job is a
// run of its own.
func (q *Queue) manyChunks(jobs []Job) []chunk {
	limit := 1
	if b, ok := capability[dialect.BulkEnqueuer](q.dialect); ok && q.hasManyColumns() {
		// The parameters of one row: the most a job can take.
		perRow := len(q.names.Data) + 4
		limit = max(1, min(manyRows, b.MaxEnqueueParams()/perRow))
	}
	var out []chunk
	for i := 0; i < len(jobs); {
		j := i + 1
		for j < len(jobs) && j-i < limit && alike(jobs[i], jobs[j]) {
			j++
		}
		out = append(out, chunk{i, j})
		i = j
	}
	return out
}

// hasManyColumns reports whether an insert names a column whatever the
// job, so that rows can be listed after VALUES.
func (q *Queue) hasManyColumns() bool {
	return len(q.names.Data) > 0 || q.names.Priority != "" || q.names.EnqueuedAt != ""
}

func alike(a, b Job) bool {
	return (a.ID == nil) == (b.ID == nil) && a.NotBefore.IsZero() == b.NotBefore.IsZero()
}

// inOneTx runs f through ex, in a transaction of its own when ex is a
// *sql.DB or *sql.Conn and atomic asks for one.
func (q *Queue) inOneTx(ctx context.Context, ex Executor, atomic bool, f func(Executor) error) error {
	var tx *sql.Tx
	var err error
	switch e := ex.(type) {
	case *sql.DB:
		if atomic {
			tx, err = e.BeginTx(ctx, nil)
		}
	case *sql.Conn:
		if atomic {
			tx, err = e.BeginTx(ctx, nil)
		}
	}
	if err != nil {
		return opErr("enqueue many", err)
	}
	if tx == nil {
		return f(ex)
	}
	if err := f(tx); err != nil {
		return errors.Join(err, ignoreDone(tx.Rollback()))
	}
	if err := tx.Commit(); err != nil {
		return opErr("enqueue many: commit", err)
	}
	return nil
}

// ignoreDone drops the error of a rollback that found its transaction
// gone already (its context ended): the rollback happened.
func ignoreDone(err error) error {
	if errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	return err
}

// insertMany inserts jobs, alike, in one statement, and writes their ids
// into ids.
func (q *Queue) insertMany(ctx context.Context, ex Executor, jobs []Job, ids []any) error {
	withID, withAt := jobs[0].ID != nil, !jobs[0].NotBefore.IsZero()
	b, ok := capability[dialect.BulkEnqueuer](q.dialect)
	if !ok || len(jobs) == 1 || !q.hasManyColumns() {
		for i, j := range jobs {
			id, err := q.insert(ctx, ex, q.enqueueStmt(withID, withAt), j)
			if err != nil {
				return err
			}
			ids[i] = id
		}
		return nil
	}
	ms := b.EnqueueMany(&q.names, len(jobs), withID, withAt)
	args, err := q.manyArgs(ctx, ex, ms.Insert, jobs)
	if err != nil {
		return opErr("enqueue many", err)
	}
	if ms.Insert.Rows {
		return q.readMany(ctx, ex, ms.Insert, args, jobs, ids)
	}
	res, err := ex.ExecContext(ctx, ms.Insert.SQL, args...)
	if err != nil {
		return opErr("enqueue many", err)
	}
	if withID {
		for i, j := range jobs {
			ids[i] = j.ID
		}
		return nil
	}
	if d := q.idInData(); d >= 0 {
		for i, j := range jobs {
			ids[i] = j.Data[d]
		}
		return nil
	}
	first, err := res.LastInsertId()
	if err != nil {
		return opErr("enqueue many: reading the new ids", err)
	}
	if first == 0 {
		// AUTO_INCREMENT never assigns 0: the ids came from elsewhere.
		return opErr("enqueue many", zeroID())
	}
	step := int64(1)
	if ms.Step.SQL != "" {
		if err := ex.QueryRowContext(ctx, ms.Step.SQL).Scan(&step); err != nil {
			return opErr("enqueue many: reading the id step", err)
		}
	}
	for i := range jobs {
		ids[i] = first + int64(i)*step
	}
	return nil
}

// readMany runs an insert that returns the new ids and puts them in job
// order: integers sorted, as each row an insert adds takes a larger id than
// the row before it, other ids in the order they came.
func (q *Queue) readMany(ctx context.Context, ex Executor, s dialect.Stmt, args []any, jobs []Job, ids []any) error {
	rows, err := ex.QueryContext(ctx, s.SQL, args...)
	if err != nil {
		return opErr("enqueue many", err)
	}
	defer rows.Close()
	got := ids[:0]
	for rows.Next() {
		var id any
		if err := rows.Scan(&id); err != nil {
			return opErr("enqueue many", err)
		}
		if id == nil {
			return opErr("enqueue many", nullID())
		}
		got = append(got, normID(id))
	}
	if err := rows.Err(); err != nil {
		return opErr("enqueue many", err)
	}
	if len(got) != len(jobs) {
		return fmt.Errorf("inbox: enqueue many: %d ids returned for %d jobs", len(got), len(jobs))
	}
	if jobs[0].ID != nil {
		for i, j := range jobs {
			ids[i] = j.ID
		}
		return nil
	}
	if ints, ok := allInts(got); ok {
		slices.Sort(ints)
		for i, v := range ints {
			ids[i] = v
		}
	}
	return nil
}

func allInts(ids []any) ([]int64, bool) {
	out := make([]int64, len(ids))
	for i, id := range ids {
		v, ok := id.(int64)
		if !ok {
			return nil, false
		}
		out[i] = v
	}
	return out, true
}

// enqueueStmt is Enqueue's statement for a job with an id and a not-before
// time or not.
func (q *Queue) enqueueStmt(withID, withAt bool) dialect.Stmt {
	switch {
	case withID && withAt:
		return q.st.Jobs.EnqueueIDAt
	case withID:
		return q.st.Jobs.EnqueueID
	case withAt:
		return q.st.Jobs.EnqueueAt
	}
	return q.st.Jobs.Enqueue
}

// manyArgs fills the parameters of s, the insert of jobs, row after row:
// each row takes the same number of parameters.
func (q *Queue) manyArgs(ctx context.Context, ex Executor, s dialect.Stmt, jobs []Job) ([]any, error) {
	var v values
	if err := q.fillTimes(ctx, ex, s, &v, 0); err != nil {
		return nil, err
	}
	perRow := len(s.Args) / len(jobs)
	out := make([]any, len(s.Args))
	for i, a := range s.Args {
		j := &jobs[i/perRow]
		switch a {
		case dialect.ArgID:
			out[i] = j.ID
		case dialect.ArgNotBefore:
			out[i] = q.dialect.TimeArg(micro(j.NotBefore))
		case dialect.ArgPriority:
			out[i] = int64(j.Priority)
		case dialect.ArgNow:
			out[i] = q.dialect.TimeArg(v.now)
		case dialect.ArgUniqueKey:
			out[i] = nil // keyed jobs go one by one (insertKeyed)
		default:
			out[i] = j.Data[a-dialect.ArgData]
		}
	}
	return out, nil
}
