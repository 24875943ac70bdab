package inbox_test

// The bulk tools of operators, pinned per dialect: deleting a dead job,
// counting and requeueing dead jobs in batches, requeueing or deleting a
// chosen few at once, and running a waiting job now.

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqlinbox/inbox"
)

func TestBulkStatements(t *testing.T) {
	type pins struct{ runNow, del, count, countOlder, batch, batchAfter, batchOlder, batchOlderAfter string }
	pg := pins{
		del: `DELETE FROM "dead_jobs" WHERE "id" = $1`, count: `SELECT COUNT(*) FROM "dead_jobs"`,
		countOlder:      `SELECT COUNT(*) FROM "dead_jobs" WHERE "dead_at" < $1`,
		batch:           `SELECT "id" FROM "dead_jobs" ORDER BY "id" LIMIT $1`,
		batchAfter:      `SELECT "id" FROM "dead_jobs" WHERE "id" > $1 ORDER BY "id" LIMIT $2`,
		batchOlder:      `SELECT "id" FROM "dead_jobs" WHERE "dead_at" < $1 ORDER BY "id" LIMIT $2`,
		batchOlderAfter: `SELECT "id" FROM "dead_jobs" WHERE "dead_at" < $1 AND "id" > $2 ORDER BY "id" LIMIT $3`,
	}
	my := pins{
		del: "DELETE FROM `dead_jobs` WHERE `id` = ?", count: "SELECT COUNT(*) FROM `dead_jobs`",
		countOlder:      "SELECT COUNT(*) FROM `dead_jobs` WHERE `dead_at` < ?",
		batch:           "SELECT `id` FROM `dead_jobs` ORDER BY `id` LIMIT ?",
		batchAfter:      "SELECT `id` FROM `dead_jobs` WHERE `id` > ? ORDER BY `id` LIMIT ?",
		batchOlder:      "SELECT `id` FROM `dead_jobs` WHERE `dead_at` < ? ORDER BY `id` LIMIT ?",
		batchOlderAfter: "SELECT `id` FROM `dead_jobs` WHERE `dead_at` < ? AND `id` > ? ORDER BY `id` LIMIT ?",
	}
	with := func(p pins, runNow string) pins { p.runNow = runNow; return p }
	rowLock := deadDesc("rowlock")
	rowLock.NotBefore = "not_before"
	advisory := deadDesc("advisory")
	advisory.NotBefore = "not_before"
	cases := []struct {
		name    string
		dialect inbox.Dialect
		table   inbox.Table
		now     func() time.Time
		want    pins
	}{
		{"postgres lease", inbox.Postgres, deadDesc("lease"), nil,
			with(pg, `UPDATE "jobs" SET "locked_until" = NULL WHERE "id" = $1 AND "locked_until" > (statement_timestamp() + $2 * interval '1 microsecond')`)},
		{"postgres row lock", inbox.Postgres, rowLock, nil,
			with(pg, `UPDATE "jobs" SET "not_before" = NULL WHERE "id" = $1 AND "not_before" > statement_timestamp()`)},
		{"postgres row lock, injected clock", inbox.Postgres, rowLock, time.Now,
			with(pg, `UPDATE "jobs" SET "not_before" = NULL WHERE "id" = $1 AND "not_before" > $2`)},
		{"mysql lease", inbox.MySQL, deadDesc("lease"), nil,
			with(my, "UPDATE `jobs` SET `locked_until` = NULL WHERE `id` = ? AND `locked_until` > ?")},
		{"mysql row lock", inbox.MySQL, rowLock, nil,
			with(my, "UPDATE `jobs` SET `not_before` = NULL WHERE `id` = ? AND `not_before` > UTC_TIMESTAMP(6)")},
		{"mariadb advisory", inbox.MariaDB, advisory, nil,
			with(my, "UPDATE `jobs` SET `not_before` = NULL WHERE `id` = ? AND `not_before` > UTC_TIMESTAMP(6)")},
		{"sqlite lease", inbox.SQLite, deadDesc("lease"), nil,
			with(my, "UPDATE `jobs` SET `locked_until` = NULL WHERE `id` = ? AND `locked_until` > ?")},
		{"sqlite advisory", inbox.SQLite, advisory, nil,
			with(my, "UPDATE `jobs` SET `not_before` = NULL WHERE `id` = ? AND `not_before` > ?")},
		{"postgres row lock without not-before", inbox.Postgres, deadDesc("rowlock"), nil, pg},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			q := newQueue(t, newMock(t), inbox.Config{Dialect: c.dialect, Table: c.table, Now: c.now})
			st := q.Statements()
			got := pins{st.Jobs.RunNow.SQL, st.Dead.Delete.SQL, st.Dead.Count.SQL, st.Dead.CountOlder.SQL,
				st.Dead.Batch.SQL, st.Dead.BatchAfter.SQL, st.Dead.BatchOlder.SQL, st.Dead.BatchOlderAfter.SQL}
			if got != c.want {
				t.Errorf("statements\n got %#v\nwant %#v", got, c.want)
			}
		})
	}
}

// Deleting dead jobs: one statement each, in one transaction; a job the
// dead table lacks rolls back every delete.
func TestDeleteDead(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: deadDesc("lease")})
	del := q.Statements().Dead.Delete.SQL
	ctx := context.Background()
	m.ExpectBegin()
	m.ExpectExec(del).WithArgs(int64(7)).WillReturnResult(sqlmock.NewResult(0, 1))
	m.ExpectCommit()
	if err := q.DeleteDead(ctx, int64(7)); err != nil {
		t.Fatalf("DeleteDead(7) = %v", err)
	}
	m.ExpectBegin()
	m.ExpectExec(del).WithArgs(int64(7)).WillReturnResult(sqlmock.NewResult(0, 0))
	m.ExpectRollback()
	if err := q.DeleteDead(ctx, int64(7)); !errors.Is(err, inbox.ErrNotDead) {
		t.Fatalf("DeleteDead of a gone job = %v, want ErrNotDead", err)
	}
	m.ExpectBegin()
	m.ExpectExec(del).WithArgs(int64(8)).WillReturnResult(sqlmock.NewResult(0, 1))
	m.ExpectExec(del).WithArgs(int64(9)).WillReturnResult(sqlmock.NewResult(0, 0))
	m.ExpectRollback()
	err := q.DeleteDeadMany(ctx, []any{int64(8), int64(9)})
	if !errors.Is(err, inbox.ErrNotDead) || err.Error() != "inbox: delete dead: id 9: inbox: no dead job with this id" {
		t.Fatalf("DeleteDeadMany with a gone job = %v, want ErrNotDead naming id 9", err)
	}
	m.Met(t)
}

// Requeueing a chosen few: each as RequeueDead requeues one, all in one
// transaction; the new ids come back in order.
func TestRequeueDeadMany(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: deadDesc("lease")})
	st := q.Statements()
	cols := []string{"id", "payload", "last_error"}
	m.ExpectBegin()
	m.ExpectQuery(st.Dead.Take.SQL).WithArgs(int64(7)).WillReturnRows(sqlmock.NewRows(cols).AddRow(int64(7), []byte("p"), nil))
	m.ExpectQuery(st.Jobs.Enqueue.SQL).WithArgs([]byte("p")).WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(20)))
	m.ExpectQuery(st.Dead.Take.SQL).WithArgs(int64(5)).WillReturnRows(sqlmock.NewRows(cols).AddRow(int64(5), []byte("q"), "boom"))
	m.ExpectQuery(st.Jobs.Enqueue.SQL).WithArgs([]byte("q")).WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(21)))
	m.ExpectExec(st.Dead.RequeueError.SQL).WithArgs("boom", int64(21)).WillReturnResult(sqlmock.NewResult(0, 1))
	m.ExpectCommit()
	ids, err := q.RequeueDeadMany(context.Background(), []any{int64(7), int64(5)})
	if err != nil || len(ids) != 2 || ids[0] != int64(20) || ids[1] != int64(21) {
		t.Fatalf("RequeueDeadMany = %v, %v; want [20 21]", ids, err)
	}
	m.ExpectBegin()
	m.ExpectQuery(st.Dead.Take.SQL).WithArgs(int64(7)).WillReturnRows(sqlmock.NewRows(cols))
	m.ExpectRollback()
	if _, err := q.RequeueDeadMany(context.Background(), []any{int64(7), int64(5)}); !errors.Is(err, inbox.ErrNotDead) {
		t.Fatalf("RequeueDeadMany with a gone job = %v, want ErrNotDead", err)
	}
	m.Met(t)
}

// deadMock expects the requeue statements of deadDesc("lease") on
// PostgreSQL.
type deadMock struct {
	m  *mock
	st *inbox.Statements
}

// take expects the dead job id taken and, when found, enqueued anew as
// id+100.
func (d deadMock) take(id int64, found bool) {
	rows := sqlmock.NewRows([]string{"id", "payload", "last_error"})
	if !found {
		d.m.ExpectQuery(d.st.Dead.Take.SQL).WithArgs(id).WillReturnRows(rows)
		return
	}
	d.m.ExpectQuery(d.st.Dead.Take.SQL).WithArgs(id).WillReturnRows(rows.AddRow(id, []byte("p"), nil))
	d.m.ExpectQuery(d.st.Jobs.Enqueue.SQL).WithArgs([]byte("p")).WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(id + 100))
}

// ids are the rows of a batch's ids, or of a count.
func ids(v ...int64) *sqlmock.Rows {
	r := sqlmock.NewRows([]string{"id"})
	for _, id := range v {
		r.AddRow(id)
	}
	return r
}

// Requeueing every dead job older than a time: counted first, then batches
// each read outside and requeued in a transaction of its own, the next
// past the last id of the one before, cut at the count; a job taken
// meanwhile is passed over.
func TestRequeueDeadAllBatches(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: deadDesc("lease")})
	st := q.Statements()
	d := deadMock{m, st}
	cutoff := utc0
	m.ExpectQuery(st.Dead.CountOlder.SQL).WithArgs(at(cutoff)).WillReturnRows(ids(5))
	m.ExpectQuery(st.Dead.BatchOlder.SQL).WithArgs(at(cutoff), 2).WillReturnRows(ids(3, 4))
	m.ExpectBegin()
	d.take(3, true)
	d.take(4, false) // taken by another requeue since the read
	m.ExpectCommit()
	m.ExpectQuery(st.Dead.BatchOlderAfter.SQL).WithArgs(at(cutoff), int64(4), 2).WillReturnRows(ids(6, 9))
	m.ExpectBegin()
	d.take(6, true)
	d.take(9, true)
	m.ExpectCommit()
	m.ExpectQuery(st.Dead.BatchOlderAfter.SQL).WithArgs(at(cutoff), int64(9), 2).WillReturnRows(ids(12))
	m.ExpectBegin()
	d.take(12, true)
	m.ExpectCommit()
	n, err := q.RequeueDeadAll(context.Background(), inbox.DeadFilter{DiedBefore: cutoff}, 2)
	if err != nil || n != 4 {
		t.Fatalf("RequeueDeadAll = %d, %v; want 4", n, err)
	}
	m.Met(t)
}

// Requeueing every dead job: the count caps the walk, so the last batch
// asks for the jobs left; with Max, no more than it.
func TestRequeueDeadAllCapped(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: deadDesc("lease")})
	st := q.Statements()
	d := deadMock{m, st}
	m.ExpectQuery(st.Dead.Count.SQL).WillReturnRows(ids(3))
	m.ExpectQuery(st.Dead.Batch.SQL).WithArgs(2).WillReturnRows(ids(1, 2))
	m.ExpectBegin()
	d.take(1, true)
	d.take(2, true)
	m.ExpectCommit()
	m.ExpectQuery(st.Dead.BatchAfter.SQL).WithArgs(int64(2), 1).WillReturnRows(ids(5))
	m.ExpectBegin()
	d.take(5, true)
	m.ExpectCommit()
	if n, err := q.RequeueDeadAll(context.Background(), inbox.DeadFilter{}, 2); err != nil || n != 3 {
		t.Fatalf("RequeueDeadAll of all = %d, %v; want 3", n, err)
	}
	m.ExpectQuery(st.Dead.Count.SQL).WillReturnRows(ids(9))
	m.ExpectQuery(st.Dead.Batch.SQL).WithArgs(1).WillReturnRows(ids(4))
	m.ExpectBegin()
	d.take(4, true)
	m.ExpectCommit()
	if n, err := q.RequeueDeadAll(context.Background(), inbox.DeadFilter{Max: 1}, 2); err != nil || n != 1 {
		t.Fatalf("RequeueDeadAll with Max 1 = %d, %v; want 1", n, err)
	}
	m.Met(t)
}

// Run now under the lease clears a lease ending beyond a lease from now;
// a job it leaves is told apart by reading it: a holder's lease is in
// work, a ready job is not waiting.
func TestRunNowLease(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable})
	st := q.Statements()
	ctx := context.Background()
	micros := (30 * time.Second).Microseconds()
	m.ExpectExec(st.Jobs.RunNow.SQL).WithArgs(int64(7), micros).WillReturnResult(sqlmock.NewResult(0, 1))
	if err := q.RunNow(ctx, int64(7)); err != nil {
		t.Fatalf("RunNow of a waiting job = %v", err)
	}
	jobCols := []string{"id", "attempt", "state", "due", "payload"}
	for _, c := range []struct {
		state int64
		want  error
	}{{3, inbox.ErrInWork}, {1, inbox.ErrNotWaiting}} {
		m.ExpectExec(st.Jobs.RunNow.SQL).WithArgs(int64(7), micros).WillReturnResult(sqlmock.NewResult(0, 0))
		m.ExpectQuery(st.Browse.Job.SQL).WithArgs(micros, int64(7)).
			WillReturnRows(sqlmock.NewRows(jobCols).AddRow(int64(7), int64(2), c.state, utc0, []byte("p")))
		if err := q.RunNow(ctx, int64(7)); !errors.Is(err, c.want) {
			t.Fatalf("RunNow of a job in state %d = %v, want %v", c.state, err, c.want)
		}
	}
	m.Met(t)
}

// Run now under the row lock locks the row without waiting first: a row a
// claim holds is in work, and nothing is written.
func TestRunNowRowLock(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: rowLockTable})
	st := q.Statements()
	ctx := context.Background()
	m.ExpectBegin()
	m.ExpectQuery(st.RowLock.CancelLock.SQL).WithArgs(int64(7)).WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(7)))
	m.ExpectExec(st.Jobs.RunNow.SQL).WithArgs(int64(7)).WillReturnResult(sqlmock.NewResult(0, 1))
	m.ExpectCommit()
	if err := q.RunNow(ctx, int64(7)); err != nil {
		t.Fatalf("RunNow of a waiting job = %v", err)
	}
	m.ExpectBegin()
	m.ExpectQuery(st.RowLock.CancelLock.SQL).WithArgs(int64(7)).WillReturnRows(sqlmock.NewRows([]string{"id"}))
	m.ExpectCommit()
	m.ExpectQuery(st.Browse.Job.SQL).WithArgs(int64(7)).
		WillReturnRows(sqlmock.NewRows([]string{"id", "attempt", "state", "due", "payload"}).AddRow(int64(7), int64(1), int64(1), nil, []byte("p")))
	m.ExpectBegin()
	m.ExpectQuery(st.RowLock.CancelLock.SQL).WithArgs(int64(7)).WillReturnRows(sqlmock.NewRows([]string{"id"}))
	m.ExpectRollback()
	if err := q.RunNow(ctx, int64(7)); !errors.Is(err, inbox.ErrInWork) {
		t.Fatalf("RunNow of a held job = %v, want ErrInWork", err)
	}
	if got := m.Isolations(); len(got) < 2 || got[0] != sql.LevelReadCommitted || got[1] != sql.LevelReadCommitted {
		t.Fatalf("isolations %v: want READ COMMITTED, where a lock taken without waiting sees the latest row", got)
	}
	m.Met(t)
}

// Bad input is refused before anything is sent.
func TestBulkRefuse(t *testing.T) {
	m := newMock(t)
	ctx := context.Background()
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "jobs", DeadTable: "dead_jobs"}})
	noDead := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "jobs", NotBefore: "not_before"}})
	for _, c := range []struct {
		name, want string
		err        error
	}{
		{"no ids", "inbox: delete dead: 0 ids: give 1 to 1000", q.DeleteDeadMany(ctx, nil)},
		{"too many ids", "inbox: requeue dead: 1001 ids: give 1 to 1000", second(q.RequeueDeadMany(ctx, make([]any, 1001)))},
		{"nil id", "inbox: delete dead: the id is nil", q.DeleteDead(ctx, nil)},
		{"float id", "inbox: requeue dead: id 1.5 is a float64: want an integer or a string", second(q.RequeueDeadMany(ctx, []any{1.5}))},
		{"batch 0", "inbox: requeue dead: batch 0 must be from 1 to 1000", second(q.RequeueDeadAll(ctx, inbox.DeadFilter{}, 0))},
		{"batch 1001", "inbox: requeue dead: batch 1001 must be from 1 to 1000", second(q.RequeueDeadAll(ctx, inbox.DeadFilter{}, 1001))},
		{"negative max", "inbox: count dead: DeadFilter.Max -1: zero for all, or the most jobs to choose", second(q.CountDead(ctx, inbox.DeadFilter{Max: -1}))},
		{"cutoff without dead_at", "inbox: count dead: purging by age needs Table.DeadAt", second(q.CountDead(ctx, inbox.DeadFilter{DiedBefore: utc0}))},
		{"no dead table", "inbox: delete dead: no dead table named in Table.DeadTable", noDead.DeleteDead(ctx, int64(1))},
		{"run now without not-before", "inbox: run now: no job of table jobs can wait: the row lock form delays jobs with Table.NotBefore, which it does not name", q.RunNow(ctx, int64(1))},
		{"run now of nil", "inbox: run now: the id is nil", noDead.RunNow(ctx, nil)},
	} {
		if c.err == nil || c.err.Error() != c.want {
			t.Errorf("%s: %v, want %q", c.name, c.err, c.want)
		}
	}
	if n := m.Sent(); n != 0 {
		t.Fatalf("%d calls sent for bad input", n)
	}
}

func second[T any](_ T, err error) error { return err }
