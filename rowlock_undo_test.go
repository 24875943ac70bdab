package inbox_test

// The row lock's undo of a failed attempt (issue 21, items 1 to 3): the
// savepoint Delivery.Tx takes, the rollback to it before a Retry or Dead,
// a refused error text sent again without it, and the settlement in a
// transaction of its own when the held one cannot be restored.

import (
	"context"
	"database/sql"
	"errors"
	"github.com/sqlinbox/inbox/dialect"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
)

const (
	rowLockSavepoint  = "SAVEPOINT inbox_attempt"
	rowLockRollbackTo = "ROLLBACK TO SAVEPOINT inbox_attempt"

	pgUndoClaim  = `SELECT "id", "attempt", "payload", "last_error" FROM "jobs" WHERE ("not_before" IS NULL OR "not_before" <= statement_timestamp()) ORDER BY "id" LIMIT 1 FOR UPDATE SKIP LOCKED`
	pgUndoRetry  = `UPDATE "jobs" SET "attempt" = "attempt" + 1, "not_before" = (statement_timestamp() + $1 * interval '1 microsecond'), "last_error" = COALESCE($2, "last_error") WHERE "id" = $3`
	pgUndoDead   = `WITH gone AS (DELETE FROM "jobs" WHERE "id" = $1 RETURNING "id", "payload", "last_error") INSERT INTO "dead_jobs" ("id", "attempt", "payload", "last_error") SELECT "id", $2, "payload", COALESCE($3, "last_error") FROM gone`
	pgUndoRelock = `SELECT j."id" FROM (SELECT set_config('lock_timeout', '30s', true) OFFSET 0) AS bounded, "jobs" AS j WHERE j."id" = $1 AND j."attempt" = $2 FOR UPDATE OF j`
	pgUndoAck    = `DELETE FROM "jobs" WHERE "id" = $1`

	myUndoClaim  = "SELECT `id`, `attempt`, `payload`, `last_error` FROM `jobs` ORDER BY `id` LIMIT 1 FOR UPDATE SKIP LOCKED"
	myUndoRetry  = "UPDATE `jobs` SET `attempt` = `attempt` + 1, `last_error` = COALESCE(?, `last_error`) WHERE `id` = ?"
	myUndoDead   = "INSERT INTO `dead_jobs` (`id`, `attempt`, `payload`, `last_error`) SELECT `id`, ?, `payload`, COALESCE(?, `last_error`) FROM `jobs` WHERE `id` = ?"
	myUndoDelete = "DELETE FROM `jobs` WHERE `id` = ?"
	myUndoRelock = "SELECT `id` FROM `jobs` WHERE `id` = ? AND `attempt` = ? FOR UPDATE"
)

// undoTable is the row lock with a last error column; myUndoTable the same
// without a not-before column, whose MySQL claim is one statement.
var (
	undoTable   = inbox.Table{Name: "jobs", NotBefore: "not_before", DeadTable: "dead_jobs", LastError: "last_error"}
	myUndoTable = inbox.Table{Name: "jobs", DeadTable: "dead_jobs", LastError: "last_error"}
)

// sqlStateError is a driver's error carrying a SQLSTATE, as pq's and pgx's do.
type sqlStateError struct{ code, msg string }

func (e sqlStateError) Error() string    { return e.msg + " (SQLSTATE " + e.code + ")" }
func (e sqlStateError) SQLState() string { return e.code }

var (
	errTooLong = sqlStateError{"22001", "value too long for type character varying(100)"}
	errAborted = sqlStateError{"25P02", "current transaction is aborted, commands ignored until end of transaction block"}
)

// undoClaim expects the claim of job id at attempt by the statement
// claimSQL and claims it.
func undoClaim(t *testing.T, m *mock, q *inbox.Queue, claimSQL string, id, attempt int64) *inbox.Delivery {
	t.Helper()
	m.ExpectBegin()
	m.ExpectQuery(claimSQL).WithoutArgs().WillReturnRows(atLevel(claimSQL, "id,attempt,payload,last_error", row(id, attempt, []byte("p"), nil)))
	return claim(t, q, 1, id)[0]
}

// TestPostgresRowLockUndo pins the undo on PostgreSQL: Tx takes the
// savepoint once; Retry and Dead roll back to it before they record the
// attempt and the error, also after a statement of the handler aborted
// the transaction; a refused text is sent again without it, after the
// savepoint or, with none, in a transaction of its own that locks the row
// again; a savepoint that is gone sends the verdict there too, and a row
// another claim holds is ErrLeaseLost with nothing changed.
func TestPostgresRowLockUndo(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: undoTable})
	ctx := context.Background()
	const write = `INSERT INTO shipments (job) VALUES ($1)`

	// The handler writes, then fails: Retry rolls its write back.
	d := undoClaim(t, m, q, pgUndoClaim, 7, 1)
	m.ExpectExec(rowLockSavepoint).WithoutArgs().WillReturnResult(affected(0))
	m.ExpectExec(write).WithArgs(int64(7)).WillReturnResult(affected(1))
	tx := d.Tx()
	if d.Tx() != tx {
		t.Fatal("Tx returned another transaction")
	}
	_, err := tx.ExecContext(ctx, write, int64(7))
	ok(t, "write", err)
	m.ExpectExec(rowLockRollbackTo).WithoutArgs().WillReturnResult(affected(0))
	m.ExpectExec(pgUndoRetry).WithArgs(int64(0), "carrier down", int64(7)).WillReturnResult(affected(1))
	m.ExpectCommit()
	d.SetError(errors.New("carrier down"))
	ok(t, "Retry", d.Retry(ctx, 0))
	m.SameConn(t, rowLockSavepoint, write, rowLockRollbackTo, pgUndoRetry)

	// A statement of the handler aborted the transaction: the rollback
	// to the savepoint recovers it, and Dead moves the job.
	d = undoClaim(t, m, q, pgUndoClaim, 8, 3)
	m.ExpectExec(rowLockSavepoint).WithoutArgs().WillReturnResult(affected(0))
	m.ExpectExec(write).WithArgs(int64(8)).WillReturnError(errors.New("duplicate key value violates unique constraint"))
	if _, err := d.Tx().ExecContext(ctx, write, int64(8)); err == nil {
		t.Fatal("the failing write succeeded")
	}
	m.ExpectExec(rowLockRollbackTo).WithoutArgs().WillReturnResult(affected(0))
	m.ExpectExec(pgUndoDead).WithArgs(int64(8), int64(3), "duplicate").WillReturnResult(affected(1))
	m.ExpectCommit()
	d.SetError(errors.New("duplicate"))
	ok(t, "Dead", d.Dead(ctx))

	// A text the column refuses, after the handler's savepoint: back to
	// it, and the Retry again without the text.
	long := strings.Repeat("x", 300)
	d = undoClaim(t, m, q, pgUndoClaim, 9, 1)
	m.ExpectExec(rowLockSavepoint).WithoutArgs().WillReturnResult(affected(0))
	d.Tx()
	m.ExpectExec(rowLockRollbackTo).WithoutArgs().WillReturnResult(affected(0))
	m.ExpectExec(pgUndoRetry).WithArgs(int64(0), long, int64(9)).WillReturnError(errTooLong)
	m.ExpectExec(rowLockRollbackTo).WithoutArgs().WillReturnResult(affected(0))
	m.ExpectExec(pgUndoRetry).WithArgs(int64(0), nil, int64(9)).WillReturnResult(affected(1))
	m.ExpectCommit()
	d.SetError(errors.New(long))
	ok(t, "Retry with a refused text", d.Retry(ctx, 0))

	// Without a savepoint the refused text aborted the transaction: the
	// Retry without it runs in a transaction of its own.
	d = undoClaim(t, m, q, pgUndoClaim, 10, 2)
	m.ExpectExec(pgUndoRetry).WithArgs(int64(1_000_000), long, int64(10)).WillReturnError(errTooLong)
	m.ExpectExec(pgUndoRetry).WithArgs(int64(1_000_000), nil, int64(10)).WillReturnError(errAborted)
	m.ExpectRollback()
	m.ExpectBegin()
	m.ExpectQuery(pgUndoRelock).WithArgs(int64(10), int64(2)).WillReturnRows(rows("id", row(int64(10))))
	m.ExpectExec(pgUndoRetry).WithArgs(int64(1_000_000), nil, int64(10)).WillReturnResult(affected(1))
	m.ExpectCommit()
	d.SetError(errors.New(long))
	ok(t, "Retry with a refused text, no savepoint", d.Retry(ctx, time.Second))

	// The savepoint is gone (the handler rolled back; on MySQL, a
	// deadlock), and another claim holds the job: nothing changes.
	d = undoClaim(t, m, q, pgUndoClaim, 11, 1)
	m.ExpectExec(rowLockSavepoint).WithoutArgs().WillReturnResult(affected(0))
	d.Tx()
	m.ExpectExec(rowLockRollbackTo).WithoutArgs().WillReturnError(sqlStateError{"3B001", `savepoint "inbox_attempt" does not exist`})
	m.ExpectRollback()
	m.ExpectBegin()
	m.ExpectQuery(pgUndoRelock).WithArgs(int64(11), int64(1)).WillReturnRows(rows("id"))
	m.ExpectRollback()
	err = d.Retry(ctx, 0)
	if !errors.Is(err, inbox.ErrLeaseLost) {
		t.Fatalf("Retry of a job held elsewhere: %v, want ErrLeaseLost", err)
	}
	if err := d.Dead(ctx); !errors.Is(err, inbox.ErrSettled) || !errors.Is(err, inbox.ErrLeaseLost) {
		t.Fatalf("Dead after the lost Retry: %v, want ErrSettled and ErrLeaseLost", err)
	}

	// A savepoint that could not be taken: nothing can be undone apart,
	// so the verdict goes to a transaction of its own at once.
	d = undoClaim(t, m, q, pgUndoClaim, 12, 1)
	m.ExpectExec(rowLockSavepoint).WithoutArgs().WillReturnError(errors.New("driver: bad connection"))
	// The transaction is ended at once: on MySQL the handler's statements
	// would otherwise each commit on their own.
	m.ExpectRollback()
	if _, err := d.Tx().ExecContext(ctx, "INSERT INTO effects VALUES (1)"); !errors.Is(err, sql.ErrTxDone) {
		t.Fatalf("a statement through Tx after its savepoint failed: %v, want sql.ErrTxDone", err)
	}
	m.ExpectBegin()
	m.ExpectQuery(pgUndoRelock).WithArgs(int64(12), int64(1)).WillReturnRows(rows("id", row(int64(12))))
	m.ExpectExec(pgUndoDead).WithArgs(int64(12), int64(1), nil).WillReturnResult(affected(1))
	m.ExpectCommit()
	ok(t, "Dead without a savepoint", d.Dead(ctx))

	// Ack after a failed savepoint sends nothing and says why.
	d = undoClaim(t, m, q, pgUndoClaim, 14, 1)
	errDeadlock := errors.New("Error 1213 (40001): Deadlock found when trying to get lock")
	m.ExpectExec(rowLockSavepoint).WithoutArgs().WillReturnError(errDeadlock)
	m.ExpectRollback()
	d.Tx()
	if err := d.Ack(ctx); !errors.Is(err, errDeadlock) {
		t.Fatalf("Ack after a failed savepoint: %v, want the savepoint's error", err)
	}

	// The relock's wait for a row another claim holds ends on the server
	// (lock_timeout): a lost lease, nothing changed.
	d = undoClaim(t, m, q, pgUndoClaim, 15, 1)
	m.ExpectExec(rowLockSavepoint).WithoutArgs().WillReturnResult(affected(0))
	d.Tx()
	m.ExpectExec(rowLockRollbackTo).WithoutArgs().WillReturnError(errors.New("driver: bad connection"))
	m.ExpectRollback()
	m.ExpectBegin()
	m.ExpectQuery(pgUndoRelock).WithArgs(int64(15), int64(1)).WillReturnError(sqlStateError{"55P03", "canceling statement due to lock timeout"})
	m.ExpectRollback()
	if err := d.Retry(ctx, 0); !errors.Is(err, inbox.ErrLeaseLost) {
		t.Fatalf("Retry whose relock timed out: %v, want ErrLeaseLost", err)
	}

	// Drop undoes the handler's writes and deletes the row; with the held
	// transaction lost, it does so in one of its own.
	d = undoClaim(t, m, q, pgUndoClaim, 16, 1)
	m.ExpectExec(rowLockSavepoint).WithoutArgs().WillReturnResult(affected(0))
	d.Tx()
	m.ExpectExec(rowLockRollbackTo).WithoutArgs().WillReturnResult(affected(0))
	m.ExpectExec(pgUndoAck).WithArgs(int64(16)).WillReturnResult(affected(1))
	m.ExpectCommit()
	ok(t, "Drop", d.Drop(ctx))
	m.SameConn(t, rowLockSavepoint, rowLockRollbackTo, pgUndoAck)
	d = undoClaim(t, m, q, pgUndoClaim, 17, 2)
	m.ExpectExec(rowLockSavepoint).WithoutArgs().WillReturnResult(affected(0))
	d.Tx()
	m.ExpectExec(rowLockRollbackTo).WithoutArgs().WillReturnError(errors.New("driver: bad connection"))
	m.ExpectRollback()
	m.ExpectBegin()
	m.ExpectQuery(pgUndoRelock).WithArgs(int64(17), int64(2)).WillReturnRows(rows("id", row(int64(17))))
	m.ExpectExec(pgUndoAck).WithArgs(int64(17)).WillReturnResult(affected(1))
	m.ExpectCommit()
	ok(t, "Drop in a transaction of its own", d.Drop(ctx))

	// Ack keeps the writes, and Tx after a settlement takes no savepoint.
	d = undoClaim(t, m, q, pgUndoClaim, 13, 1)
	m.ExpectExec(pgUndoAck).WithArgs(int64(13)).WillReturnResult(affected(1))
	m.ExpectCommit()
	ok(t, "Ack", d.Ack(ctx))
	n := m.Sent()
	d.Tx()
	if calls := m.Log(n); len(calls) != 0 {
		t.Errorf("Tx after the settlement sent %q", calls)
	}
	if q.InWork() != 0 {
		t.Errorf("InWork() = %d after settling all", q.InWork())
	}
	m.Met(t)
}

// TestMySQLRowLockUndo pins the undo on MySQL and MariaDB, where a refused
// statement alone rolls back: the text is sent again without it in the
// held transaction even without a savepoint; the two-statement Dead runs
// after the rollback to the savepoint.
func TestMySQLRowLockUndo(t *testing.T) {
	for _, dialect := range []inbox.Dialect{inbox.MySQL, inbox.MariaDB} {
		t.Run(dialect.Name(), func(t *testing.T) {
			m := newMock(t)
			q := newQueue(t, m, inbox.Config{Dialect: dialect, Table: myUndoTable})
			ctx := context.Background()
			const write = "INSERT INTO shipments (job) VALUES (?)"
			read := myUndoClaim
			if dialect == inbox.MariaDB {
				read = mariaRead(read)
			}
			claimOne := func(id, attempt int64) *inbox.Delivery {
				t.Helper()
				return undoClaim(t, m, q, read, id, attempt)
			}

			d := claimOne(7, 1)
			m.ExpectExec(rowLockSavepoint).WithoutArgs().WillReturnResult(affected(0))
			m.ExpectExec(write).WithArgs(int64(7)).WillReturnResult(affected(1))
			_, err := d.Tx().ExecContext(ctx, write, int64(7))
			ok(t, "write", err)
			m.ExpectExec(rowLockRollbackTo).WithoutArgs().WillReturnResult(affected(0))
			m.ExpectExec(myUndoRetry).WithArgs("carrier down", int64(7)).WillReturnResult(affected(1))
			m.ExpectCommit()
			d.SetError(errors.New("carrier down"))
			ok(t, "Retry", d.Retry(ctx, 0))
			m.SameConn(t, rowLockSavepoint, write, rowLockRollbackTo, myUndoRetry)

			d = claimOne(8, 3)
			m.ExpectExec(rowLockSavepoint).WithoutArgs().WillReturnResult(affected(0))
			d.Tx()
			m.ExpectExec(rowLockRollbackTo).WithoutArgs().WillReturnResult(affected(0))
			m.ExpectExec(myUndoDead).WithArgs(int64(3), "buried", int64(8)).WillReturnResult(affected(1))
			m.ExpectExec(myUndoDelete).WithArgs(int64(8)).WillReturnResult(affected(1))
			m.ExpectCommit()
			d.SetError(errors.New("buried"))
			ok(t, "Dead", d.Dead(ctx))

			// A refused text without a savepoint: the statement alone
			// rolled back, so the held transaction sends it again.
			long := strings.Repeat("x", 300)
			errLong := errors.New("Error 1406 (22001): Data too long for column 'last_error' at row 1")
			d = claimOne(9, 1)
			m.ExpectExec(myUndoDead).WithArgs(int64(1), long, int64(9)).WillReturnError(errLong)
			m.ExpectExec(myUndoDead).WithArgs(int64(1), nil, int64(9)).WillReturnResult(affected(1))
			m.ExpectExec(myUndoDelete).WithArgs(int64(9)).WillReturnResult(affected(1))
			m.ExpectCommit()
			d.SetError(errors.New(long))
			ok(t, "Dead with a refused text", d.Dead(ctx))

			// A deadlock rolled the handler's whole transaction back, its
			// savepoint with it: the Retry locks the row again in a
			// transaction of its own.
			d = claimOne(10, 2)
			m.ExpectExec(rowLockSavepoint).WithoutArgs().WillReturnResult(affected(0))
			d.Tx()
			m.ExpectExec(rowLockRollbackTo).WithoutArgs().WillReturnError(errors.New("Error 1305 (42000): SAVEPOINT inbox_attempt does not exist"))
			m.ExpectRollback()
			m.ExpectBegin()
			m.ExpectQuery(myUndoRelock).WithArgs(int64(10), int64(2)).WillReturnRows(rows("id", row(int64(10))))
			m.ExpectExec(myUndoRetry).WithArgs("deadlocked", int64(10)).WillReturnResult(affected(1))
			m.ExpectCommit()
			d.SetError(errors.New("deadlocked"))
			ok(t, "Retry after a deadlock", d.Retry(ctx, 0))

			// InnoDB ends the relock's wait (innodb_lock_wait_timeout):
			// a lost lease.
			d = claimOne(11, 1)
			m.ExpectExec(rowLockSavepoint).WithoutArgs().WillReturnResult(affected(0))
			d.Tx()
			m.ExpectExec(rowLockRollbackTo).WithoutArgs().WillReturnError(errors.New("invalid connection"))
			m.ExpectRollback()
			m.ExpectBegin()
			m.ExpectQuery(myUndoRelock).WithArgs(int64(11), int64(1)).WillReturnError(errors.New("Error 1205 (HY000): Lock wait timeout exceeded; try restarting transaction"))
			m.ExpectRollback()
			if err := d.Retry(ctx, 0); !errors.Is(err, inbox.ErrLeaseLost) {
				t.Fatalf("Retry whose relock timed out: %v, want ErrLeaseLost", err)
			}

			// Drop undoes the handler's writes, then deletes the row.
			d = claimOne(12, 1)
			m.ExpectExec(rowLockSavepoint).WithoutArgs().WillReturnResult(affected(0))
			m.ExpectExec(write).WithArgs(int64(12)).WillReturnResult(affected(1))
			_, err = d.Tx().ExecContext(ctx, write, int64(12))
			ok(t, "write", err)
			m.ExpectExec(rowLockRollbackTo).WithoutArgs().WillReturnResult(affected(0))
			m.ExpectExec(myUndoDelete).WithArgs(int64(12)).WillReturnResult(affected(1))
			m.ExpectCommit()
			ok(t, "Drop", d.Drop(ctx))
			if q.InWork() != 0 {
				t.Errorf("InWork() = %d after settling all", q.InWork())
			}
			m.Met(t)
		})
	}
}

// noUndo is a row-lock dialect without the undo's statements.
var noUndo = editedDialect{inbox.Postgres, func(st *inbox.Statements) { st.RowLock.Savepoint = dialect.Stmt{} }}

// TestRowLockUndoRequired: a dialect that cannot undo a failed attempt's
// writes is refused for the row lock at construction, naming what it
// lacks; the lease form does not need it.
func TestRowLockUndoRequired(t *testing.T) {
	m := newMock(t)
	_, err := inbox.New(m.DB, inbox.Config{Dialect: noUndo, Table: rowLockTable})
	if err == nil || !strings.Contains(err.Error(), "Statements.RowLock.Savepoint") {
		t.Fatalf("New with a row-lock dialect without Savepoint: %v", err)
	}
	if _, err := inbox.New(m.DB, inbox.Config{Dialect: noUndo, Table: leaseTable}); err != nil {
		t.Fatalf("New of a lease queue: %v", err)
	}
	m.Met(t)
}
