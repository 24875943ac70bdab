package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/sqlinbox/inbox/dialect"
)

// JobState is a job's state as an operator browses it ([Queue.ListJobs],
// [Queue.Job]).
type JobState int

const (
	// StateAll, in a [JobFilter], lists jobs in any state of the queue
	// table.
	StateAll JobState = iota
	// StateReady: claimable now by its times. Under the row lock and
	// advisory forms a job held by a claim is ready too, unless
	// [Queue.Job] could tell it is held (row lock).
	StateReady
	// StateWaiting: not claimable before a later time, its not-before
	// time or a retry delay (under the lease, a lease that ends more than
	// a lease from now, or any lease in force on a job never claimed: at
	// its first attempt).
	StateWaiting
	// StateInWork: held by a claim (under the lease, a lease in force that
	// ends within a lease, past the first attempt; a retry delay shorter
	// than a lease reads as in work too).
	StateInWork
	// StateDead: in the dead table ([Queue.Job] only; [Queue.ListDead]
	// lists them).
	StateDead
)

// String returns the state as the dashboard writes it: "all", "ready",
// "waiting", "in work" or "dead".
func (s JobState) String() string {
	switch s {
	case StateAll:
		return "all"
	case StateReady:
		return "ready"
	case StateWaiting:
		return "waiting"
	case StateInWork:
		return "in work"
	case StateDead:
		return "dead"
	}
	return fmt.Sprintf("JobState(%d)", int(s))
}

// ErrNoInWorkList is returned by [Queue.ListJobs] for [StateInWork] under
// the row lock and advisory forms, whose rows do not say whether a claim
// holds them (the row lock's lock is the claim's transaction; an advisory
// lock names no row). [Queue.Stats] counts them where the server can tell,
// and [Queue.Job] asks the row lock's lock of one job.
var ErrNoInWorkList = errors.New("inbox: this form cannot list the jobs in work: its rows do not say which are held")

// DefaultListLimit is the page size of a [JobFilter] without a Limit.
const DefaultListLimit = 20

// JobFilter chooses a page of [Queue.ListJobs]. Its zero value is the
// newest [DefaultListLimit] jobs of the queue table, in any state.
type JobFilter struct {
	// State chooses the jobs of one state; StateAll (zero) any.
	State JobState
	// After lists the jobs whose id is below this one (the next, older
	// page: pass the last id of a page); Before those above it (the
	// newer page: pass the first id). At most one of the two.
	After, Before any
	// Limit is the page size, 1 to [MaxList]; zero means
	// [DefaultListLimit].
	Limit int
	// ID, when set, looks for the one job with this id (in the queue
	// table, in the filter's state): a page of one job or none.
	ID any
}

// JobPage is one page of [Queue.ListJobs].
type JobPage struct {
	// Jobs are the page's jobs, the highest id first.
	Jobs []JobView
	// Newer tells that jobs of the filter may come before the page's first
	// (a page asked with After: the jobs before it, which may have gone
	// since); Older that more come after its last.
	Newer, Older bool
	// Stats are the queue's counts per state, read by [Queue.Stats] with
	// the page; StatsErr is its error (ErrNoEnqueuedAt without
	// Table.EnqueuedAt), which leaves every count -1 and is not
	// ListJobs' error.
	Stats    Stats
	StatsErr error
}

// JobView is one job as an operator sees it: a row of the queue table or,
// from [Queue.Job], of the dead table.
type JobView struct {
	// ID is the job's id: an int64 or a string.
	ID any
	// State is the job's state as its row tells it (see [JobState]).
	State JobState
	// Attempt is the attempt column as stored: the attempt the next
	// delivery gets. Under the lease and advisory forms a claim counts it
	// as it takes the job, so a job in work shows the one after its own.
	// For a dead job, the attempt it died on.
	Attempt int
	// Due is the row's time: its lease's expiry under the lease form,
	// else its Table.NotBefore; zero when NULL or without the column.
	Due time.Time
	// LastError is the last error recorded (Table.LastError).
	LastError string
	// Priority is the job's Table.Priority (zero without it, and for a
	// dead job).
	Priority int64
	// EnqueuedAt is when it was enqueued (Table.EnqueuedAt; zero without
	// it, for rows from before the column was added, and for a dead job).
	EnqueuedAt time.Time
	// DeadAt is when a dead job died (Table.DeadAt; zero otherwise).
	DeadAt time.Time
	// Data are the data columns as the driver returned them.
	Data []any
}

// ListJobs returns a page of the queue table's jobs chosen by f, the
// highest id first, with the queue's counts per state. Each page is one
// seek of the primary key from its cursor, whatever its depth; a state few
// jobs have is found by reading past the others (see docs/operations.md).
// None is an empty page; so is [StateWaiting] where no job can wait (the
// row lock and advisory forms without Table.NotBefore). [StateInWork]
// under the row lock and advisory forms is [ErrNoInWorkList]; a bad state,
// limit or id, or both After and Before, is an error. The dead jobs are
// [Queue.ListDead]'s.
func (q *Queue) ListJobs(ctx context.Context, f JobFilter) (JobPage, error) {
	var page JobPage
	list, limit, err := q.checkFilter(f)
	if err != nil {
		return page, opErr("list jobs", err)
	}
	page.Stats, page.StatsErr = q.Stats(ctx)
	if page.StatsErr != nil {
		if ctx.Err() != nil {
			return page, page.StatsErr
		}
		page.Stats = Stats{Ready: -1, Waiting: -1, InWork: -1, Dead: -1}
	}
	if f.ID != nil {
		j, err := q.job(ctx, f.ID)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return page, nil
		case err != nil:
			return page, opErr("list jobs", err)
		}
		if f.State == StateAll || j.State == f.State {
			page.Jobs = []JobView{j}
		}
		return page, nil
	}
	if list.First.SQL == "" {
		return page, nil // no job can be in this state
	}
	if err := q.readPage(ctx, &page, list, f, limit); err != nil {
		return page, opErr("list jobs", err)
	}
	return page, nil
}

// checkFilter returns the statements of f's state and its limit, or what
// is wrong with f.
func (q *Queue) checkFilter(f JobFilter) (dialect.BrowseList, int, error) {
	limit := f.Limit
	if limit == 0 {
		limit = DefaultListLimit
	}
	var list dialect.BrowseList
	switch f.State {
	case StateAll:
		list = q.st.Browse.All
	case StateReady:
		list = q.st.Browse.Ready
	case StateWaiting:
		list = q.st.Browse.Waiting
	case StateInWork:
		list = q.st.Browse.InWork
		if list.First.SQL == "" && q.st.Browse.All.First.SQL != "" {
			return list, 0, ErrNoInWorkList
		}
	default:
		return list, 0, fmt.Errorf("state %v: StateAll, StateReady, StateWaiting or StateInWork (ListDead lists the dead jobs)", f.State)
	}
	switch {
	case q.st.Browse.All.First.SQL == "":
		return list, 0, fmt.Errorf("dialect %s has no Browse statements", q.dialect.Name())
	case limit < 1 || limit > MaxList:
		return list, 0, fmt.Errorf("limit %d must be from 1 to %d", limit, MaxList)
	case f.After != nil && f.Before != nil:
		return list, 0, errors.New("both After and Before: one page at a time")
	}
	for _, id := range []any{f.After, f.Before, f.ID} {
		if id != nil {
			if err := checkID(id); err != nil {
				return list, 0, err
			}
		}
	}
	return list, limit, nil
}

// readPage reads the page of list that f asks for into page: one row more
// than limit tells whether more follow.
func (q *Queue) readPage(ctx context.Context, page *JobPage, list dialect.BrowseList, f JobFilter, limit int) error {
	s, v := list.First, values{limit: limit + 1, micros: q.lease.Microseconds()}
	switch {
	case f.After != nil:
		s, v.id, page.Newer = list.After, f.After, true
	case f.Before != nil:
		s, v.id, page.Older = list.Before, f.Before, true
	}
	if err := q.fillTimes(ctx, q.db, s, &v, q.lease); err != nil {
		return err
	}
	rows, err := q.query(ctx, q.db, s, &v)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		j, err := q.scanJob(rows)
		if err != nil {
			return err
		}
		page.Jobs = append(page.Jobs, j)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	more := len(page.Jobs) > limit
	if more {
		page.Jobs = page.Jobs[:limit]
	}
	if f.Before != nil {
		slices.Reverse(page.Jobs)
		page.Newer = more
	} else {
		page.Older = more
	}
	return nil
}

// Job returns the job id as it stands: its row in the queue table or,
// failing that, in the dead table (StateDead). Under the row lock a job
// ready by its time is asked whether a claim holds it, by a lock taken
// without waiting and let go at once (RowLock.CancelLock): held, it is
// StateInWork. A job in neither table is [ErrNotFound].
func (q *Queue) Job(ctx context.Context, id any) (JobView, error) {
	if q.st.Browse.Job.SQL == "" {
		return JobView{}, opErr("job", fmt.Errorf("dialect %s has no Browse statements", q.dialect.Name()))
	}
	if err := checkID(id); err != nil {
		return JobView{}, opErr("job", err)
	}
	j, err := q.job(ctx, id)
	if errors.Is(err, sql.ErrNoRows) && q.st.Browse.Dead.SQL != "" {
		j, err = q.deadJob(ctx, id)
	}
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return j, opErr("job", fmt.Errorf("id %v: %w", id, ErrNotFound))
	case err != nil:
		return j, opErr("job", err)
	}
	if j.State == StateReady && q.st.RowLock.CancelLock.SQL != "" {
		held, err := q.held(ctx, id)
		if err != nil {
			return j, opErr("job", err)
		}
		if held {
			j.State = StateInWork
		}
	}
	return j, nil
}

// job reads the queue table's row of id; sql.ErrNoRows when there is none.
func (q *Queue) job(ctx context.Context, id any) (JobView, error) {
	v := values{id: id, micros: q.lease.Microseconds()}
	s := q.st.Browse.Job
	if err := q.fillTimes(ctx, q.db, s, &v, q.lease); err != nil {
		return JobView{}, err
	}
	rows, err := q.query(ctx, q.db, s, &v)
	if err != nil {
		return JobView{}, err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return JobView{}, err
		}
		return JobView{}, sql.ErrNoRows
	}
	j, err := q.scanJob(rows)
	if err != nil {
		return j, err
	}
	return j, rows.Close()
}

// deadJob reads the dead table's row of id; sql.ErrNoRows when there is
// none.
func (q *Queue) deadJob(ctx context.Context, id any) (JobView, error) {
	rows, err := q.query(ctx, q.db, q.st.Browse.Dead, &values{id: id})
	if err != nil {
		return JobView{}, err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return JobView{}, err
		}
		return JobView{}, sql.ErrNoRows
	}
	d, err := q.scanDeadJob(rows)
	if err != nil {
		return JobView{}, err
	}
	return JobView{ID: d.ID, State: StateDead, Attempt: d.Attempt, LastError: d.LastError, DeadAt: d.DeadAt, Data: d.Data}, rows.Close()
}

// held tells whether a claim holds the row-lock job id: its row cannot be
// locked without waiting. The lock is let go at once (the transaction
// rolls back), so a claim meanwhile skips the row for that instant.
func (q *Queue) held(ctx context.Context, id any) (bool, error) {
	tx, err := q.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	var got any
	err = q.queryRow(ctx, q.own(tx), q.st.RowLock.CancelLock, &values{id: id}).Scan(&got)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return true, nil // held (or gone since the read: it was there)
	case err != nil:
		return false, err
	}
	return false, nil
}

// scanJob reads one row of the Browse statements.
func (q *Queue) scanJob(rows *sql.Rows) (JobView, error) {
	var (
		j        JobView
		id       any
		attempt  int64
		state    int64
		due, enq rawValue
		lastErr  sql.NullString
		priority sql.NullInt64
		err      error
	)
	j.Data = make([]any, len(q.names.Data))
	dest := []any{&id, &attempt, &state, &due}
	for i := range j.Data {
		dest = append(dest, &j.Data[i])
	}
	if q.names.LastError != "" {
		dest = append(dest, &lastErr)
	}
	if q.names.Priority != "" {
		dest = append(dest, &priority)
	}
	if q.names.EnqueuedAt != "" {
		dest = append(dest, &enq)
	}
	if err := rows.Scan(dest...); err != nil {
		return j, err
	}
	j.ID, j.Attempt, j.State = normID(id), int(attempt), JobState(state)
	j.LastError, j.Priority = lastErr.String, priority.Int64
	if due.v != nil {
		if j.Due, err = q.dialect.ScanTime(due.v); err != nil {
			return j, fmt.Errorf("the job's time: %w", err)
		}
		j.Due = micro(j.Due)
	}
	if enq.v != nil {
		if j.EnqueuedAt, err = q.dialect.ScanTime(enq.v); err != nil {
			return j, fmt.Errorf("Table.EnqueuedAt: %w", err)
		}
		j.EnqueuedAt = micro(j.EnqueuedAt)
	}
	for i, d := range j.Data {
		if b, ok := d.([]byte); ok {
			// The driver may reuse the bytes at the next row.
			j.Data[i] = append([]byte(nil), b...)
		}
	}
	return j, nil
}
