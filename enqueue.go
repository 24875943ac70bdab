package inbox

// Enqueue: one job inserted through the caller's executor, so that it
// commits with the caller's transaction (EnqueueMany, in enqueue_many.go,
// inserts many).

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"strings"
	"time"
)

// Job is a job to enqueue.
type Job struct {
	// ID, when not nil, is the new row's id; otherwise the database assigns it.
	ID any
	// Data are the values of the table's data columns, in their order.
	Data []any
	// NotBefore, when not zero, keeps the job from claims until then. The
	// lease form writes it into the lease column; other forms need
	// Table.NotBefore.
	NotBefore time.Time
	// Priority is the job's priority, written when Table.Priority is named:
	// higher is claimed first.
	Priority int
	// UniqueKey, when not empty, is the job's key in Table.UniqueKey: a job
	// holding it already is not joined by this one ([ErrDuplicate], with
	// its id), unless Replace.
	UniqueKey string
	// Replace (with UniqueKey) has a job holding the key take this job's
	// Data and NotBefore when it is not in work, for debouncing: Enqueue
	// then returns its id. A job in work is left alone ([ErrDuplicate]).
	Replace bool
}

// Enqueue inserts job through ex (a *sql.DB, *sql.Tx or *sql.Conn, so that it
// commits with the caller's own writes) and returns its id: an int64 or a
// string. A Job.ID must be one no job has had: where Table.DeadTable is
// named, the dead table is probed for it first (one primary-key read) and
// a dead job's id is refused ([ErrDeadID]); an id in the queue table is
// the database's duplicate-key error. A job given no ID whose id the
// database does not report is [ErrIDNotReturned], the job inserted. A job
// whose [Job.UniqueKey] another job holds is not inserted: the error
// matches [ErrDuplicate] and names that job (docs/unique.md).
func (q *Queue) Enqueue(ctx context.Context, ex Executor, job Job) (any, error) {
	if len(job.Data) != len(q.names.Data) {
		return nil, fmt.Errorf("inbox: enqueue: %d data values for the %d data columns %v", len(job.Data), len(q.names.Data), q.names.Raw.Data)
	}
	s := q.st.Jobs.Enqueue
	switch {
	case job.ID != nil && !job.NotBefore.IsZero():
		s = q.st.Jobs.EnqueueIDAt
	case job.ID != nil:
		s = q.st.Jobs.EnqueueID
	case !job.NotBefore.IsZero():
		s = q.st.Jobs.EnqueueAt
	}
	if !job.NotBefore.IsZero() && s.SQL == "" {
		return nil, fmt.Errorf("inbox: enqueue: a not-before time needs Table.NotBefore under the %s form", q.names.Form)
	}
	if err := q.checkUnique(job); err != nil {
		return nil, opErr("enqueue", err)
	}
	if err := q.checkNotDead(ctx, ex, []Job{job}); err != nil {
		return nil, opErr("enqueue", err)
	}
	insert := q.insert
	if job.UniqueKey != "" {
		insert = q.insertUnique
	}
	var id any
	err := q.retryOnPool(ex, func() (err error) {
		id, err = insert(ctx, ex, s, job)
		return err
	})
	if err != nil {
		return nil, err
	}
	if _, inTx := ex.(*sql.Tx); !inTx {
		// Committed already (unless the caller began a transaction on a
		// *sql.Conn in SQL, where the wake-up comes early and costs a claim).
		q.bell.ring()
	}
	return id, nil
}

// retryOnPool runs f, sent on ex, again while it fails as a deadlock's
// victim when ex is a pool: there f's statements commit alone or in
// transactions of the queue's own, and the victim's was rolled back whole.
// In the caller's transaction the victim is that whole transaction, which
// only the caller can send again.
func (q *Queue) retryOnPool(ex Executor, f func() error) error {
	if _, pool := ex.(*sql.DB); pool {
		return q.retryDeadlock(f)
	}
	return f()
}

// insert runs the enqueue statement s and returns the new job's id.
func (q *Queue) insert(ctx context.Context, ex Executor, s dialect.Stmt, job Job) (any, error) {
	v := values{id: job.ID, data: job.Data, notBefore: job.NotBefore, priority: int64(job.Priority)}
	if job.UniqueKey != "" {
		v.uniqueKey = job.UniqueKey
	}
	if err := q.fillTimes(ctx, ex, s, &v, 0); err != nil {
		return nil, opErr("enqueue", err)
	}
	if s.Rows {
		var id any
		err := q.queryRow(ctx, ex, s, &v).Scan(&id)
		if errors.Is(err, sql.ErrNoRows) && job.UniqueKey != "" {
			return nil, errKeyTaken // ON CONFLICT DO NOTHING
		}
		if err != nil {
			return nil, opErr("enqueue", err)
		}
		if id == nil {
			// SQLite's primary key other than INTEGER takes NULL: a job no
			// settlement could name.
			return nil, opErr("enqueue", nullID())
		}
		return normID(id), nil
	}
	res, err := q.run(ctx, ex, s, &v)
	if err != nil {
		return nil, opErr("enqueue", err)
	}
	if job.ID != nil {
		return job.ID, nil
	}
	if i := q.idInData(); i >= 0 {
		return job.Data[i], nil
	}
	id, err := res.LastInsertId()
	if err != nil {
		return nil, opErr("enqueue: reading the new id", err)
	}
	if id == 0 {
		// AUTO_INCREMENT never assigns 0: the id came from elsewhere.
		return nil, opErr("enqueue", zeroID())
	}
	return id, nil
}

// idInData returns the index of the data column that is the id column (a
// job's id may be data too), -1 when none: a job's id is then the value
// given for it, as LastInsertId reports only what AUTO_INCREMENT assigns.
func (q *Queue) idInData() int {
	for i, c := range q.names.Data {
		if strings.EqualFold(c, q.names.ID) {
			return i
		}
	}
	return -1
}
