package inbox

// Unique jobs: a job enqueued with a key (Table.UniqueKey) is inserted
// only while no job holds that key, or replaces the waiting job that does.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"

	"github.com/sqlinbox/inbox/dialect"
)

// ErrDuplicate is matched (errors.Is) by the error of [Queue.Enqueue] for a
// job whose [Job.UniqueKey] another job in the table holds, and of
// [Queue.EnqueueMany] when some jobs were skipped for theirs: a
// [*DuplicateError] tells which job holds each key. Nothing was inserted
// for those jobs.
var ErrDuplicate = errors.New("inbox: a job with this unique key is in the queue")

// DuplicateError tells the jobs of an Enqueue or EnqueueMany that were not
// inserted because another job held their key.
type DuplicateError struct {
	// Keys are the keys found taken, Held the ids of the jobs holding them
	// (an int64 or a string), and Index the position of each skipped job
	// in the jobs given (0 for Enqueue).
	Keys  []string
	Held  []any
	Index []int
}

func (e *DuplicateError) Error() string {
	if len(e.Keys) == 1 {
		return fmt.Sprintf("inbox: enqueue: unique key %q is held by job %v", e.Keys[0], e.Held[0])
	}
	return "inbox: enqueue many: " + strconv.Itoa(len(e.Keys)) + " jobs skipped, their unique keys held (the first, " +
		strconv.Quote(e.Keys[0]) + ", by job " + fmt.Sprint(e.Held[0]) + ")"
}

func (e *DuplicateError) Is(target error) bool { return target == ErrDuplicate }

// errKeyTaken is an insert that found its unique key held: no row.
var errKeyTaken = errors.New("unique key taken")

// checkUnique refuses a job whose key the description cannot hold.
func (q *Queue) checkUnique(job Job) error {
	switch {
	case job.UniqueKey != "" && q.names.UniqueKey == "":
		return errors.New("Job.UniqueKey needs Table.UniqueKey, the column that holds it")
	case job.Replace && job.UniqueKey == "":
		return errors.New("Job.Replace needs Job.UniqueKey: it replaces the job holding that key")
	}
	return nil
}

// heldBy is the job holding a unique key, as Unique.Find read it.
type heldBy struct {
	id      any
	attempt int64 // stored
	key     string
}

// insertUnique inserts job, whose key is set, through s: its id; or, the
// key held, the holder replaced (Replace) or a DuplicateError. A holder
// that leaves between the insert and the read (acknowledged meanwhile)
// frees the key: the insert is tried again, a few times.
func (q *Queue) insertUnique(ctx context.Context, ex Executor, s dialect.Stmt, job Job) (any, error) {
	for try := 0; ; try++ {
		id, err := q.insert(ctx, ex, s, job)
		if err == nil {
			return id, nil
		}
		h, found, ferr := q.findKey(ctx, ex, job.UniqueKey)
		switch {
		case ferr != nil:
			return nil, opErr("enqueue", ferr)
		case !found && (errors.Is(err, errKeyTaken) || q.duplicate(err)) && try < 3:
			continue
		case !found && errors.Is(err, errKeyTaken):
			return nil, opErr("enqueue", errors.New("unique key "+strconv.Quote(job.UniqueKey)+" taken and freed again and again"))
		case !found && q.duplicate(err):
			// MySQL's violation, the holder gone at every read: the same
			// answer, the driver's error kept in the chain.
			return nil, opErr("enqueue", fmt.Errorf("unique key %s taken and freed again and again: %w", strconv.Quote(job.UniqueKey), err))
		case !found:
			return nil, err // not the key: the database's error
		}
		if job.Replace {
			ok, rerr := q.replaceHeld(ctx, ex, h, job)
			if rerr != nil {
				return nil, opErr("enqueue: replace", rerr)
			}
			if ok {
				return h.id, nil
			}
		}
		return nil, &DuplicateError{Keys: []string{job.UniqueKey}, Held: []any{h.id}, Index: []int{0}}
	}
}

// duplicate reports an insert the engine failed for a held unique key
// ([dialect.DuplicateDetector]).
func (q *Queue) duplicate(err error) bool {
	d, ok := capability[dialect.DuplicateDetector](q.dialect)
	return ok && d.IsDuplicate(err)
}

// findKey reads the job holding key.
func (q *Queue) findKey(ctx context.Context, ex Executor, key string) (heldBy, bool, error) {
	var h heldBy
	var raw, adv any
	dest := []any{&raw, &h.attempt}
	if q.names.Form == Advisory {
		dest = append(dest, &adv)
	}
	err := q.queryRow(ctx, ex, q.st.Unique.Find, &values{uniqueKey: key}).Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return h, false, nil
	}
	if err != nil {
		return h, false, err
	}
	h.id, h.key = normID(raw), keyString(adv)
	return h, true, nil
}

// replaceHeld writes job's data and not-before time into h's job if it is
// not in work, reporting whether it did.
func (q *Queue) replaceHeld(ctx context.Context, ex Executor, h heldBy, job Job) (bool, error) {
	v := &values{id: h.id, attempt: h.attempt - 1, data: job.Data, notBefore: job.NotBefore}
	timed := q.st.Unique.Replace // or the lock, where the condition is
	if q.st.Unique.ReplaceLock.SQL != "" {
		timed = q.st.Unique.ReplaceLock
	}
	if err := q.fillTimes(ctx, ex, timed, v, 0); err != nil {
		return false, err
	}
	if q.names.Form == Advisory {
		return q.replaceAdvisory(ctx, ex, h, v)
	}
	return q.replaceRow(ctx, ex, v)
}

// replaceRow sends Replace, after ReplaceLock where the dialect has one.
func (q *Queue) replaceRow(ctx context.Context, ex Executor, v *values) (bool, error) {
	if q.st.Unique.ReplaceLock.SQL != "" {
		return q.replaceLocked(ctx, ex, v)
	}
	n, err := q.exec(ctx, ex, q.st.Unique.Replace, v)
	return n == 1, err
}

// replaceLocked locks the row without waiting, then replaces it, in one
// transaction: the caller's, or one of its own.
func (q *Queue) replaceLocked(ctx context.Context, ex Executor, v *values) (bool, error) {
	replaced := false
	err := q.withinTx(ctx, ex, func(tx Executor) (bool, error) {
		var id any
		err := q.queryRow(ctx, tx, q.st.Unique.ReplaceLock, v).Scan(&id)
		if errors.Is(err, sql.ErrNoRows) {
			return false, nil // in work: another transaction holds it
		}
		if err != nil {
			return false, err
		}
		// Locked, the row matched: an UPDATE writing what it holds
		// already may count no row changed.
		_, err = q.exec(ctx, tx, q.st.Unique.Replace, v)
		replaced = err == nil
		return replaced, err
	})
	return replaced, err
}

// withinTx runs f in ex's transaction when ex is one, else in a
// transaction of its own on ex, committed when f says so; an Executor of
// another kind runs f outside any.
func (q *Queue) withinTx(ctx context.Context, ex Executor, f func(tx Executor) (commit bool, err error)) error {
	var tx *sql.Tx
	var err error
	switch x := ex.(type) {
	case *sql.Tx:
		_, err := f(x)
		return err
	case *sql.DB:
		tx, err = x.BeginTx(ctx, nil)
	case *sql.Conn:
		tx, err = x.BeginTx(ctx, nil)
	default:
		_, err := f(ex)
		return err
	}
	if err != nil {
		return err
	}
	commit, err := f(q.own(tx))
	if err != nil || !commit {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// replaceAdvisory takes the job's key as a claim would (in the process,
// then the session lock where the engine has one): held elsewhere, the job
// is in work. Under the key, Replace's attempt fence finds a claim that
// came between the read and the lock.
func (q *Queue) replaceAdvisory(ctx context.Context, ex Executor, h heldBy, v *values) (bool, error) {
	ident, err := q.identity(ctx)
	if err != nil {
		return false, err
	}
	inProcess := ident + "\x00" + h.key
	if !q.keys.take(inProcess) {
		return false, nil
	}
	defer q.keys.drop(inProcess)
	if q.locker != nil {
		conn, err := q.db.Conn(ctx)
		if err != nil {
			return false, err
		}
		ok, err := q.locker.TryLock(ctx, conn, ident, h.key)
		if err != nil || !ok {
			if err != nil {
				discard(conn)
			} else {
				conn.Close()
			}
			return false, err
		}
		defer q.letGo(context.WithoutCancel(ctx), conn, ident, h.key)
	}
	return q.replaceRow(ctx, ex, v)
}

// keyed reports whether any of jobs has a unique key.
func keyed(jobs []Job) bool {
	for _, j := range jobs {
		if j.UniqueKey != "" {
			return true
		}
	}
	return false
}

// insertKeyed is EnqueueMany of jobs some of which have keys: each goes
// as Enqueue sends it, all in one transaction (the caller's, or one of
// its own), so that a job whose key is held is skipped and the others go
// in. ids gets each job's id, the holder's for one skipped; the error, a
// DuplicateError, names the skipped.
func (q *Queue) insertKeyed(ctx context.Context, ex Executor, jobs []Job, ids []any) ([]any, error) {
	var dup *DuplicateError
	err := q.retryOnPool(ex, func() error {
		dup = nil
		return q.withinTx(ctx, ex, func(tx Executor) (bool, error) { return q.insertEach(ctx, tx, jobs, ids, &dup) })
	})
	if err != nil {
		return nil, opErr("enqueue many", err)
	}
	if _, inTx := ex.(*sql.Tx); !inTx {
		q.bell.ring()
	}
	if dup != nil {
		return ids, dup
	}
	return ids, nil
}

// insertEach is insertKeyed's transaction: each job sent as Enqueue sends
// it, the skipped named in *dup.
func (q *Queue) insertEach(ctx context.Context, tx Executor, jobs []Job, ids []any, dup **DuplicateError) (bool, error) {
	for i, job := range jobs {
		insert := q.insert
		if job.UniqueKey != "" {
			insert = q.insertUnique
		}
		id, err := insert(ctx, tx, q.enqueueStmt(job.ID != nil, !job.NotBefore.IsZero()), job)
		var d *DuplicateError
		switch {
		case errors.As(err, &d):
			if *dup == nil {
				*dup = &DuplicateError{}
			}
			all := *dup
			all.Keys, all.Held, all.Index = append(all.Keys, job.UniqueKey), append(all.Held, d.Held[0]), append(all.Index, i)
			ids[i] = d.Held[0]
		case err != nil:
			return false, fmt.Errorf("job %d: %w", i, err)
		default:
			ids[i] = id
		}
	}
	return true, nil
}
