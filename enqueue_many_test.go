package inbox_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/fakeclock"
)

// enqueueMany calls EnqueueMany and fails the test unless it returns want.
func enqueueMany(t *testing.T, q *inbox.Queue, ex inbox.Executor, jobs []inbox.Job, want ...any) {
	t.Helper()
	ids, err := q.EnqueueMany(context.Background(), ex, jobs)
	ok(t, "EnqueueMany", err)
	if !reflect.DeepEqual(ids, want) {
		t.Fatalf("EnqueueMany returned %#v, want %#v", ids, want)
	}
}

// Jobs alike go in one statement, outside a transaction; integer ids
// RETURNING lists in another order come back in job order; a job given an
// id, or a not-before time, starts a statement of its own kind, and
// several statements run in one transaction.
func TestEnqueueManyPostgres(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable})
	a, b, c := []byte("a"), []byte("b"), []byte("c")
	n := m.Sent()
	m.ExpectQuery(`INSERT INTO "jobs" ("payload") VALUES ($1), ($2), ($3) RETURNING "id"`).WithArgs(a, b, c).
		WillReturnRows(rows("id", row(int64(43)), row(int64(41)), row(int64(42))))
	enqueueMany(t, q, m.DB, []inbox.Job{{Data: []any{a}}, {Data: []any{b}}, {Data: []any{c}}}, int64(41), int64(42), int64(43))
	m.Since(t, n, `query INSERT INTO "jobs" ("payload") VALUES ($1), ($2), ($3) RETURNING "id"`)

	later := t0.Add(time.Hour)
	// The ids given are first looked for among the dead jobs.
	m.ExpectQuery(`SELECT 1 FROM "dead_jobs" WHERE "id" = $1`).WithArgs("x").WillReturnRows(rows("1"))
	m.ExpectQuery(`SELECT 1 FROM "dead_jobs" WHERE "id" = $1`).WithArgs("y").WillReturnRows(rows("1"))
	m.ExpectBegin()
	m.ExpectQuery(`INSERT INTO "jobs" ("id", "payload") VALUES ($1, $2), ($3, $4) RETURNING "id"`).WithArgs("x", a, "y", b).
		WillReturnRows(rows("id", row([]byte("x")), row([]byte("y"))))
	m.ExpectQuery(`INSERT INTO "jobs" ("payload", "locked_until") VALUES ($1, $2), ($3, $4) RETURNING "id"`).
		WithArgs(a, later.UTC().Truncate(time.Microsecond), c, later.UTC().Truncate(time.Microsecond)).
		WillReturnRows(rows("id", row(int64(7)), row(int64(8))))
	m.ExpectQuery(`INSERT INTO "jobs" ("payload") VALUES ($1) RETURNING "id"`).WithArgs(b).WillReturnRows(rows("id", row(int64(9))))
	m.ExpectCommit()
	enqueueMany(t, q, m.DB, []inbox.Job{{ID: "x", Data: []any{a}}, {ID: "y", Data: []any{b}},
		{Data: []any{a}, NotBefore: later}, {Data: []any{c}, NotBefore: later}, {Data: []any{b}}},
		"x", "y", int64(7), int64(8), int64(9))
	m.Met(t)
}

// With a notification channel each statement notifies once, whatever its
// rows.
func TestEnqueueManyPostgresNotify(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable, NotifyChannel: "jobs_ready"})
	a, b := []byte("a"), []byte("b")
	m.ExpectQuery(`WITH j AS (INSERT INTO "jobs" ("payload") VALUES ($1), ($2) RETURNING "id") SELECT j."id" FROM j CROSS JOIN pg_notify('jobs_ready', '') AS n`).
		WithArgs(a, b).WillReturnRows(rows("id", row(int64(1)), row(int64(2))))
	enqueueMany(t, q, m.DB, []inbox.Job{{Data: []any{a}}, {Data: []any{b}}}, int64(1), int64(2))
	m.Met(t)
}

// MySQL: the first id is LastInsertId, the next ones @@auto_increment_increment
// apart, read on the connection that inserted (in the caller's transaction
// here); ids given are returned as given.
func TestEnqueueManyMySQL(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: rowLockTable})
	a, b, c := []byte("a"), []byte("b"), []byte("c")
	m.ExpectBegin()
	tx, err := m.DB.Begin()
	ok(t, "Begin", err)
	// The ids given are first looked for among the dead jobs.
	m.ExpectQuery("SELECT 1 FROM `dead_jobs` WHERE `id` = ?").WithArgs(int64(100)).WillReturnRows(rows("1"))
	m.ExpectQuery("SELECT 1 FROM `dead_jobs` WHERE `id` = ?").WithArgs(int64(101)).WillReturnRows(rows("1"))
	m.ExpectExec("INSERT INTO `jobs` (`payload`) VALUES (?), (?), (?)").WithArgs(a, b, c).WillReturnResult(sqlmock.NewResult(41, 3))
	m.ExpectQuery("SELECT @@auto_increment_increment").WillReturnRows(rows("step", row(int64(2))))
	m.ExpectExec("INSERT INTO `jobs` (`id`, `payload`, `not_before`) VALUES (?, ?, ?), (?, ?, ?)").
		WithArgs(int64(100), a, "2024-03-01 13:00:00.123456", int64(101), b, "2024-03-01 13:00:00.123456").WillReturnResult(sqlmock.NewResult(0, 2))
	later := t0.Add(time.Hour)
	enqueueMany(t, q, tx, []inbox.Job{{Data: []any{a}}, {Data: []any{b}}, {Data: []any{c}},
		{ID: int64(100), Data: []any{a}, NotBefore: later}, {ID: int64(101), Data: []any{b}, NotBefore: later}},
		int64(41), int64(43), int64(45), int64(100), int64(101))
	m.ExpectCommit()
	ok(t, "Commit", tx.Commit())
	m.Met(t)
}

// SQLite returns the ids; a priority and the caller's clock for the enqueue
// time are parameters of each row.
func TestEnqueueManySQLite(t *testing.T) {
	m := newMock(t)
	clk := fakeclock.New(t0)
	tbl := leaseTable
	tbl.Priority, tbl.EnqueuedAt = "priority", "enqueued_at"
	q := newQueue(t, m, inbox.Config{Dialect: inbox.SQLite, Table: tbl, Now: clk.Now})
	a, b := []byte("a"), []byte("b")
	const now = "2024-03-01T12:00:00.123456Z"
	m.ExpectQuery("INSERT INTO `jobs` (`payload`, `priority`, `enqueued_at`) VALUES (?, ?, ?), (?, ?, ?) RETURNING `id`").
		WithArgs(a, int64(5), now, b, int64(0), now).WillReturnRows(rows("id", row(int64(2)), row(int64(1))))
	enqueueMany(t, q, m.DB, []inbox.Job{{Data: []any{a}, Priority: 5}, {Data: []any{b}}}, int64(1), int64(2))
	m.Met(t)
}

// More jobs than one statement takes are inserted by several, in one
// transaction of the call's own; a statement that fails rolls all back.
func TestEnqueueManyChunks(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.SQLite, Table: leaseTable})
	jobs := make([]inbox.Job, 1001)
	for i := range jobs {
		jobs[i] = inbox.Job{Data: []any{[]byte("p")}}
	}
	full := "INSERT INTO `jobs` (`payload`) VALUES " + strings.TrimSuffix(strings.Repeat("(?), ", 1000), ", ") + " RETURNING `id`"
	ids := rows("id")
	for i := 1; i <= 1000; i++ {
		ids.AddRow(int64(i))
	}
	m.ExpectBegin()
	m.ExpectQuery(full).WillReturnRows(ids)
	m.ExpectQuery("INSERT INTO `jobs` (`payload`) VALUES (?) RETURNING `id`").WillReturnError(errors.New("disk full"))
	m.ExpectRollback()
	got, err := q.EnqueueMany(context.Background(), m.DB, jobs)
	if err == nil || !strings.Contains(err.Error(), "disk full") || got != nil {
		t.Fatalf("EnqueueMany = %v, %v; want the insert's error and no ids", got, err)
	}
	m.Met(t)
}

// A bad job is named by its index, and nothing is sent.
func TestEnqueueManyRefuses(t *testing.T) {
	m := newMock(t)
	leaseQ := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable})
	plain := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "jobs", AdvisoryKey: "id"}})
	good := inbox.Job{Data: []any{[]byte("p")}}
	for _, tc := range []struct {
		q    *inbox.Queue
		jobs []inbox.Job
		want string
	}{
		{leaseQ, []inbox.Job{good, good, {Data: []any{1, 2}}}, "inbox: enqueue many: job 2: 2 data values for the 1 data columns [payload]"},
		{leaseQ, []inbox.Job{{}}, "inbox: enqueue many: job 0: 0 data values for the 1 data columns [payload]"},
		{plain, []inbox.Job{good, {Data: []any{1}, NotBefore: t0}}, "inbox: enqueue many: job 1: a not-before time needs Table.NotBefore under the advisory lock form"},
	} {
		m.Quiet(t, "a refused EnqueueMany", func() {
			ids, err := tc.q.EnqueueMany(context.Background(), m.DB, tc.jobs)
			if err == nil || err.Error() != tc.want || ids != nil {
				t.Errorf("EnqueueMany = %v, %v; want %q", ids, err, tc.want)
			}
		})
	}
	m.Quiet(t, "EnqueueMany of no jobs", func() {
		ids, err := leaseQ.EnqueueMany(context.Background(), m.DB, nil)
		if err != nil || len(ids) != 0 {
			t.Errorf("EnqueueMany(nil) = %v, %v; want no ids", ids, err)
		}
	})
}

// The loops of the table are woken once the jobs are committed: at once
// through the pool, not through the caller's transaction.
func TestEnqueueManyWakes(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.SQLite, Table: inbox.Table{Name: "wake_many", LockedUntil: "locked_until"}})
	p := []byte("p")
	jobs := []inbox.Job{{Data: []any{p}}, {Data: []any{p}}}
	const ins = "INSERT INTO `wake_many` (`payload`) VALUES (?), (?) RETURNING `id`"
	m.ExpectBegin()
	tx, err := m.DB.Begin()
	ok(t, "Begin", err)
	wake := q.NextWake()
	m.ExpectQuery(ins).WillReturnRows(rows("id", row(int64(1)), row(int64(2))))
	enqueueMany(t, q, tx, jobs, int64(1), int64(2))
	select {
	case <-wake:
		t.Fatal("woken before the caller's transaction committed")
	default:
	}
	m.ExpectCommit()
	ok(t, "Commit", tx.Commit())
	m.ExpectQuery(ins).WillReturnRows(rows("id", row(int64(3)), row(int64(4))))
	enqueueMany(t, q, m.DB, jobs, int64(3), int64(4))
	select {
	case <-wake:
	default:
		t.Fatal("not woken after EnqueueMany through the pool")
	}
	m.Met(t)
}
