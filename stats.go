package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Stats is one queue's state as [Queue.Stats] read it.
type Stats struct {
	// Ready counts the jobs claimable now by their times. Under the row
	// lock and advisory forms it includes the jobs held, less those the
	// engine can tell are (InWork).
	Ready int64
	// Waiting counts the jobs not claimable before a later time: a
	// not-before time or a retry delay. Under the lease form, a lease that
	// ends more than a lease from now (a retry delay) counts here, and one
	// ending sooner on a job never claimed (its first attempt: a
	// not-before time); one ending sooner past the first attempt counts as
	// in work.
	Waiting int64
	// InWork counts the jobs held. Lease: leases in force ending within a
	// lease, past the first attempt. Row lock: the
	// transactions holding a write lock on the table, which includes a
	// settlement or enqueue in progress (PostgreSQL: pg_locks; MySQL 8:
	// performance_schema.data_locks; MariaDB: the metadata_lock_info
	// plugin's view). Advisory on SQLite: the keys in work in this process.
	// -1 where the server cannot tell: the advisory form on PostgreSQL and
	// MySQL (a lock's key is a hash of table and key value, see
	// docs/operations.md), and a lock view missing or not granted
	// (InWorkErr says which). [Queue.InWork] counts this process's.
	InWork int64
	// InWorkErr is the server's refusal to list its locks when InWork is -1
	// for that reason (MariaDB without the metadata_lock_info plugin,
	// MySQL with performance_schema off or not granted); nil otherwise.
	InWorkErr error
	// Dead counts the dead table's rows; -1 without Table.DeadTable.
	Dead int64
	// OldestReady is the age of the oldest ready job, by Table.EnqueuedAt
	// and the clock; zero when none is ready. Rows whose enqueued-at is
	// NULL (enqueued before the column was added) have no age and are
	// left out: zero too when only they are ready.
	OldestReady time.Duration
	// Paused is whether the queue is paused ([Queue.Pause]), since
	// PausedSince; false without Table.ControlTable.
	Paused      bool
	PausedSince time.Time
}

// ErrNoEnqueuedAt is returned by [Queue.Stats] when the description names
// no Table.EnqueuedAt, which the age of the oldest ready job needs.
var ErrNoEnqueuedAt = errors.New("inbox: the age of the oldest ready job needs Table.EnqueuedAt")

// Stats reads the queue's state in one statement (Statements.Jobs.Stats) of
// indexed counts: with the recommended indexes it reads no table row (see
// docs/schema.md). Where the jobs in work are listed by a lock view that may
// be missing (Statements.Jobs.InWork), a second statement reads them; its
// failure is reported in Stats.InWorkErr, not as Stats' error. It needs
// Table.EnqueuedAt ([ErrNoEnqueuedAt]). With Table.ControlTable, one more
// statement reads whether the queue is paused ([Queue.Paused]).
func (q *Queue) Stats(ctx context.Context) (Stats, error) {
	var st Stats
	if q.names.EnqueuedAt == "" {
		return st, opErr("stats", ErrNoEnqueuedAt)
	}
	v := values{micros: q.lease.Microseconds()}
	if err := q.fillTimes(ctx, q.db, q.st.Jobs.Stats, &v, q.lease); err != nil {
		return st, opErr("stats", err)
	}
	var age sql.NullInt64
	if err := q.queryRow(ctx, q.db, q.st.Jobs.Stats, &v).Scan(&st.Ready, &st.Waiting, &st.InWork, &st.Dead, &age); err != nil {
		return st, opErr("stats", err)
	}
	if st.InWork < 0 && q.st.Jobs.InWork.SQL != "" {
		if err := q.queryRow(ctx, q.db, q.st.Jobs.InWork, &v).Scan(&st.InWork); err != nil {
			if ctx.Err() != nil {
				return st, opErr("stats", err)
			}
			st.InWork, st.InWorkErr = -1, fmt.Errorf("inbox: stats: the server's locks: %w", err)
		} else if st.InWork < 0 {
			st.InWorkErr = errors.New("inbox: stats: the server's locks: performance_schema is off")
		}
	}
	if q.names.Form == Advisory && q.locker == nil {
		ident, err := q.identity(ctx)
		if err != nil {
			return st, opErr("stats", err)
		}
		st.InWork = int64(q.keys.count(ident + "\x00"))
	}
	if !q.form.leased() && st.InWork > 0 {
		st.Ready = max(st.Ready-st.InWork, 0)
	}
	if age.Valid && age.Int64 > 0 {
		st.OldestReady = time.Duration(age.Int64) * time.Microsecond
	}
	ps, err := q.Paused(ctx)
	if err != nil {
		return st, opErr("stats", err)
	}
	st.Paused, st.PausedSince = ps.Paused, ps.Since
	return st, nil
}
