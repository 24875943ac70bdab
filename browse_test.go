package inbox_test

// The job browser's statements (Statements.Browse), pinned per dialect and
// form, and what ListJobs and Job send and make of the rows.

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqlinbox/inbox"
)

// browseLease is a lease table naming every column the browser reads.
var browseLease = inbox.Table{Name: "jobs", LockedUntil: "locked_until", DeadTable: "dead_jobs",
	LastError: "last_error", DeadAt: "dead_at", Priority: "priority"}

const (
	pgBrowseCols = `SELECT "id", "attempt", (CASE WHEN "locked_until" IS NULL OR "locked_until" <= CAST(statement_timestamp() AS timestamptz) THEN 1 ` +
		`WHEN "locked_until" > (statement_timestamp() + $1 * interval '1 microsecond') OR "attempt" = 1 THEN 2 ELSE 3 END), "locked_until", "payload", "last_error", "priority" FROM "jobs"`
	myBrowseCols = "SELECT `id`, `attempt`, (CASE WHEN `locked_until` IS NULL OR `locked_until` <= ? THEN 1 WHEN `locked_until` > ? OR `attempt` = 1 THEN 2 ELSE 3 END), " +
		"`locked_until`, `payload`, `last_error`, `priority` FROM `jobs`"
	pgRowLockCols = `SELECT "id", "attempt", (CASE WHEN "not_before" IS NULL OR "not_before" <= CAST(statement_timestamp() AS timestamptz) THEN 1 ELSE 2 END), "not_before", "payload" FROM "jobs"`
)

// TestBrowseStatements pins the browser's statements: each page a seek of
// the primary key from its cursor, the state told as Stats tells it; none
// for the jobs in work where the row cannot tell (row lock, advisory) nor
// for the waiting ones without a not-before column.
func TestBrowseStatements(t *testing.T) {
	type pins struct{ allFirst, readyAfter, waitingBefore, inWorkFirst, job, dead string }
	for _, c := range []struct {
		name    string
		dialect inbox.Dialect
		table   inbox.Table
		want    pins
	}{
		{"postgres lease", inbox.Postgres, browseLease, pins{
			allFirst:      pgBrowseCols + ` ORDER BY "id" DESC LIMIT $2`,
			readyAfter:    pgBrowseCols + ` WHERE "id" < $2 AND ("locked_until" IS NULL OR "locked_until" <= CAST(statement_timestamp() AS timestamptz)) ORDER BY "id" DESC LIMIT $3`,
			waitingBefore: pgBrowseCols + ` WHERE "id" > $2 AND ("locked_until" > (statement_timestamp() + $3 * interval '1 microsecond') OR "locked_until" > CAST(statement_timestamp() AS timestamptz) AND "attempt" = 1) ORDER BY "id" LIMIT $4`,
			inWorkFirst:   pgBrowseCols + ` WHERE "locked_until" > CAST(statement_timestamp() AS timestamptz) AND "locked_until" <= (statement_timestamp() + $2 * interval '1 microsecond') AND "attempt" <> 1 ORDER BY "id" DESC LIMIT $3`,
			job:           pgBrowseCols + ` WHERE "id" = $2`,
			dead:          `SELECT "id", "attempt", "payload", "last_error", "dead_at" FROM "dead_jobs" WHERE "id" = $1`,
		}},
		{"mysql lease", inbox.MySQL, browseLease, pins{
			allFirst:      myBrowseCols + " ORDER BY `id` DESC LIMIT ?",
			readyAfter:    myBrowseCols + " WHERE `id` < ? AND (`locked_until` IS NULL OR `locked_until` <= ?) ORDER BY `id` DESC LIMIT ?",
			waitingBefore: myBrowseCols + " WHERE `id` > ? AND (`locked_until` > ? OR `locked_until` > ? AND `attempt` = 1) ORDER BY `id` LIMIT ?",
			inWorkFirst:   myBrowseCols + " WHERE `locked_until` > ? AND `locked_until` <= ? AND `attempt` <> 1 ORDER BY `id` DESC LIMIT ?",
			job:           myBrowseCols + " WHERE `id` = ?",
			dead:          "SELECT `id`, `attempt`, `payload`, `last_error`, `dead_at` FROM `dead_jobs` WHERE `id` = ?",
		}},
		{"sqlite lease", inbox.SQLite, browseLease, pins{
			allFirst:      myBrowseCols + " ORDER BY `id` DESC LIMIT ?",
			readyAfter:    myBrowseCols + " WHERE `id` < ? AND (`locked_until` IS NULL OR `locked_until` <= ?) ORDER BY `id` DESC LIMIT ?",
			waitingBefore: myBrowseCols + " WHERE `id` > ? AND (`locked_until` > ? OR `locked_until` > ? AND `attempt` = 1) ORDER BY `id` LIMIT ?",
			inWorkFirst:   myBrowseCols + " WHERE `locked_until` > ? AND `locked_until` <= ? AND `attempt` <> 1 ORDER BY `id` DESC LIMIT ?",
			job:           myBrowseCols + " WHERE `id` = ?",
			dead:          "SELECT `id`, `attempt`, `payload`, `last_error`, `dead_at` FROM `dead_jobs` WHERE `id` = ?",
		}},
		{"postgres row lock", inbox.Postgres, inbox.Table{Name: "jobs", NotBefore: "not_before"}, pins{
			allFirst:      pgRowLockCols + ` ORDER BY "id" DESC LIMIT $1`,
			readyAfter:    pgRowLockCols + ` WHERE "id" < $1 AND ("not_before" IS NULL OR "not_before" <= CAST(statement_timestamp() AS timestamptz)) ORDER BY "id" DESC LIMIT $2`,
			waitingBefore: pgRowLockCols + ` WHERE "id" > $1 AND "not_before" > CAST(statement_timestamp() AS timestamptz) ORDER BY "id" LIMIT $2`,
			job:           pgRowLockCols + ` WHERE "id" = $1`,
		}},
		{"mysql row lock without not-before", inbox.MySQL, inbox.Table{Name: "jobs"}, pins{
			allFirst:   "SELECT `id`, `attempt`, 1, NULL, `payload` FROM `jobs` ORDER BY `id` DESC LIMIT ?",
			readyAfter: "SELECT `id`, `attempt`, 1, NULL, `payload` FROM `jobs` WHERE `id` < ? ORDER BY `id` DESC LIMIT ?",
			job:        "SELECT `id`, `attempt`, 1, NULL, `payload` FROM `jobs` WHERE `id` = ?",
		}},
		{"sqlite advisory", inbox.SQLite, inbox.Table{Name: "jobs", AdvisoryKey: "id", NotBefore: "not_before", DeadTable: "dead_jobs"}, pins{
			allFirst:      "SELECT `id`, `attempt`, (CASE WHEN `not_before` IS NULL OR `not_before` <= ? THEN 1 ELSE 2 END), `not_before`, `payload` FROM `jobs` ORDER BY `id` DESC LIMIT ?",
			readyAfter:    "SELECT `id`, `attempt`, (CASE WHEN `not_before` IS NULL OR `not_before` <= ? THEN 1 ELSE 2 END), `not_before`, `payload` FROM `jobs` WHERE `id` < ? AND (`not_before` IS NULL OR `not_before` <= ?) ORDER BY `id` DESC LIMIT ?",
			waitingBefore: "SELECT `id`, `attempt`, (CASE WHEN `not_before` IS NULL OR `not_before` <= ? THEN 1 ELSE 2 END), `not_before`, `payload` FROM `jobs` WHERE `id` > ? AND `not_before` > ? ORDER BY `id` LIMIT ?",
			job:           "SELECT `id`, `attempt`, (CASE WHEN `not_before` IS NULL OR `not_before` <= ? THEN 1 ELSE 2 END), `not_before`, `payload` FROM `jobs` WHERE `id` = ?",
			dead:          "SELECT `id`, `attempt`, `payload` FROM `dead_jobs` WHERE `id` = ?",
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			q := newQueue(t, newMock(t), inbox.Config{Dialect: c.dialect, Table: c.table})
			b := q.Statements().Browse
			got := pins{b.All.First.SQL, b.Ready.After.SQL, b.Waiting.Before.SQL, b.InWork.First.SQL, b.Job.SQL, b.Dead.SQL}
			if got != c.want {
				t.Errorf("statements:\n got %+v\nwant %+v", got, c.want)
			}
			for _, s := range []string{b.All.After.SQL, b.Ready.First.SQL, b.Waiting.First.SQL, b.InWork.Before.SQL} {
				if strings.Contains(s, "OFFSET") {
					t.Errorf("a page by OFFSET: %s", s)
				}
			}
		})
	}
	// MariaDB's are MySQL's.
	my := newQueue(t, newMock(t), inbox.Config{Dialect: inbox.MySQL, Table: browseLease}).Statements().Browse
	maria := newQueue(t, newMock(t), inbox.Config{Dialect: inbox.MariaDB, Table: browseLease}).Statements().Browse
	if !reflect.DeepEqual(my, maria) {
		t.Errorf("MariaDB's browser statements differ from MySQL's")
	}
}

// TestListJobsPages: a page asks for one row more than its limit to tell
// whether more follow; After and Before seek from the cursor (Before's rows
// come lowest first and are turned round); the clock is one reading (MySQL:
// now and now plus the lease); the counts come from Stats, whose refusal
// (no Table.EnqueuedAt) is the page's StatsErr, not its error.
func TestListJobsPages(t *testing.T) {
	now := time.Date(2026, 12, 3, 8, 0, 0, 123456000, time.UTC)
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Lease: time.Minute, Table: browseLease, Now: func() time.Time { return now }})
	b := q.Statements().Browse
	nowArg, untilArg := "2026-12-03 08:00:00.123456", "2026-12-03 08:01:00.123456"
	cols := []string{"id", "attempt", "state", "locked_until", "payload", "last_error", "priority"}
	ctx := context.Background()

	m.ExpectQuery(b.Ready.After.SQL).WithArgs(nowArg, untilArg, int64(10), nowArg, 3).WillReturnRows(sqlmock.NewRows(cols).
		AddRow(int64(9), int64(1), int64(1), nil, []byte(`{"a":1}`), nil, nil).
		AddRow(int64(7), int64(3), int64(1), "2026-12-03 07:59:00.000000", []byte("p"), "boom", int64(5)).
		AddRow(int64(4), int64(1), int64(1), nil, []byte("q"), nil, int64(0)))
	page, err := q.ListJobs(ctx, inbox.JobFilter{State: inbox.StateReady, After: int64(10), Limit: 2})
	ok(t, "ListJobs after", err)
	if len(page.Jobs) != 2 || page.Jobs[0].ID != int64(9) || page.Jobs[1].ID != int64(7) || !page.Newer || !page.Older {
		t.Fatalf("page after 10 = %+v", page)
	}
	j := page.Jobs[1]
	if j.State != inbox.StateReady || j.Attempt != 3 || j.LastError != "boom" || j.Priority != 5 ||
		!j.Due.Equal(time.Date(2026, 12, 3, 7, 59, 0, 0, time.UTC)) || string(j.Data[0].([]byte)) != "p" {
		t.Errorf("job 7 = %+v", j)
	}
	if !errors.Is(page.StatsErr, inbox.ErrNoEnqueuedAt) || page.Stats.Ready != -1 {
		t.Errorf("counts without Table.EnqueuedAt: %+v, %v", page.Stats, page.StatsErr)
	}

	m.ExpectQuery(b.All.Before.SQL).WithArgs(nowArg, untilArg, int64(4), 3).WillReturnRows(sqlmock.NewRows(cols).
		AddRow(int64(5), int64(2), int64(3), "2026-12-03 08:00:30.000000", []byte("a"), nil, nil).
		AddRow(int64(6), int64(1), int64(2), "2026-12-03 09:00:00.000000", []byte("b"), nil, nil))
	page, err = q.ListJobs(ctx, inbox.JobFilter{Before: int64(4), Limit: 2})
	ok(t, "ListJobs before", err)
	if len(page.Jobs) != 2 || page.Jobs[0].ID != int64(6) || page.Jobs[0].State != inbox.StateWaiting ||
		page.Jobs[1].State != inbox.StateInWork || page.Newer || !page.Older {
		t.Fatalf("page before 4 = %+v", page)
	}

	m.ExpectQuery(b.InWork.First.SQL).WithArgs(nowArg, untilArg, nowArg, untilArg, 21).WillReturnRows(sqlmock.NewRows(cols))
	page, err = q.ListJobs(ctx, inbox.JobFilter{State: inbox.StateInWork})
	ok(t, "ListJobs in work", err)
	if len(page.Jobs) != 0 || page.Newer || page.Older {
		t.Errorf("an empty page = %+v", page)
	}

	for _, w := range []struct {
		name string
		f    inbox.JobFilter
		says string
	}{
		{"both cursors", inbox.JobFilter{After: int64(1), Before: int64(2)}, "both After and Before"},
		{"limit", inbox.JobFilter{Limit: inbox.MaxList + 1}, "limit 1001"},
		{"dead", inbox.JobFilter{State: inbox.StateDead}, "ListDead lists the dead jobs"},
		{"bad id", inbox.JobFilter{After: 1.5}, "want an integer or a string"},
	} {
		if _, err := q.ListJobs(ctx, w.f); err == nil || !strings.Contains(err.Error(), w.says) {
			t.Errorf("%s: err %v, want %q", w.name, err, w.says)
		}
	}
	ok(t, "expectations", m.ExpectationsWereMet())
}

// TestListJobsForms: the row lock refuses a list of the jobs in work
// (ErrNoInWorkList) and lists no waiting job without a not-before column,
// sending nothing either way.
func TestListJobsForms(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "jobs"}})
	if _, err := q.ListJobs(context.Background(), inbox.JobFilter{State: inbox.StateInWork}); !errors.Is(err, inbox.ErrNoInWorkList) {
		t.Errorf("in work under the row lock: %v, want ErrNoInWorkList", err)
	}
	page, err := q.ListJobs(context.Background(), inbox.JobFilter{State: inbox.StateWaiting})
	if err != nil || len(page.Jobs) != 0 {
		t.Errorf("waiting without a not-before column: %+v, %v, want an empty page", page, err)
	}
	ok(t, "expectations", m.ExpectationsWereMet())
}

// TestJobDetail: Job reads the queue table, then the dead table; a job in
// neither is ErrNotFound; a row-lock job ready by its time is asked
// whether a claim holds it, by a lock taken without waiting and rolled
// back; ListJobs with an ID is that job, in the filter's state.
func TestJobDetail(t *testing.T) {
	ctx := context.Background()
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Lease: time.Minute, Table: browseLease})
	st := q.Statements()
	cols := []string{"id", "attempt", "state", "locked_until", "payload", "last_error", "priority"}
	m.ExpectQuery(st.Browse.Job.SQL).WithArgs(int64(60_000_000), "a-uuid").WillReturnRows(sqlmock.NewRows(cols))
	m.ExpectQuery(st.Browse.Dead.SQL).WithArgs("a-uuid").WillReturnRows(sqlmock.NewRows([]string{"id", "attempt", "payload", "last_error", "dead_at"}).
		AddRow("a-uuid", int64(5), []byte{0, 1}, "gave up", time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)))
	j, err := q.Job(ctx, "a-uuid")
	ok(t, "Job dead", err)
	if j.State != inbox.StateDead || j.ID != "a-uuid" || j.Attempt != 5 || j.LastError != "gave up" || j.DeadAt.IsZero() {
		t.Errorf("dead job = %+v", j)
	}
	m.ExpectQuery(st.Browse.Job.SQL).WithArgs(int64(60_000_000), int64(3)).WillReturnRows(sqlmock.NewRows(cols))
	m.ExpectQuery(st.Browse.Dead.SQL).WithArgs(int64(3)).WillReturnRows(sqlmock.NewRows([]string{"id"}))
	if _, err := q.Job(ctx, int64(3)); !errors.Is(err, inbox.ErrNotFound) {
		t.Errorf("a missing job: %v, want ErrNotFound", err)
	}
	m.ExpectQuery(st.Browse.Job.SQL).WithArgs(int64(60_000_000), int64(4)).WillReturnRows(sqlmock.NewRows(cols).
		AddRow(int64(4), int64(2), int64(3), time.Now(), []byte("x"), nil, int64(0)))
	page, err := q.ListJobs(ctx, inbox.JobFilter{State: inbox.StateWaiting, ID: int64(4)})
	ok(t, "ListJobs by id", err)
	if len(page.Jobs) != 0 {
		t.Errorf("job 4 is in work, listed as waiting: %+v", page.Jobs)
	}
	ok(t, "expectations", m.ExpectationsWereMet())

	r := newMock(t)
	q = newQueue(t, r, inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "jobs", NotBefore: "not_before"}})
	st = q.Statements()
	rlCols := []string{"id", "attempt", "state", "not_before", "payload"}
	for _, held := range []bool{true, false} {
		r.ExpectQuery(st.Browse.Job.SQL).WithArgs(int64(8)).WillReturnRows(sqlmock.NewRows(rlCols).AddRow(int64(8), int64(1), int64(1), nil, []byte("x")))
		r.ExpectBegin()
		lock := sqlmock.NewRows([]string{"id"})
		if !held {
			lock.AddRow(int64(8))
		}
		r.ExpectQuery(st.RowLock.CancelLock.SQL).WithArgs(int64(8)).WillReturnRows(lock)
		r.ExpectRollback()
		j, err := q.Job(ctx, int64(8))
		ok(t, "Job row lock", err)
		if want := map[bool]inbox.JobState{true: inbox.StateInWork, false: inbox.StateReady}[held]; j.State != want {
			t.Errorf("held %v: state %v, want %v", held, j.State, want)
		}
	}
	ok(t, "expectations", r.ExpectationsWereMet())
}
