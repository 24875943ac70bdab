package inbox_test

// Config.Prepare: each statement prepared once, at its first use, and run
// prepared after, through the pool and the queue's own transactions; the
// caller's transactions and connections get the text. The pins are the
// same statements as without it (sql_postgres_test.go, sql_mysql_test.go).

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/fakeclock"
)

// wantLog checks the calls that reached the driver from the n-th on.
func wantLog(t *testing.T, m *mock, n int, want ...string) {
	t.Helper()
	if got := m.Log(n); !reflect.DeepEqual(got, want) {
		t.Errorf("calls sent:\n%q\nwant:\n%q", got, want)
	}
}

func TestPreparePostgresLease(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable, Lease: time.Minute, Prepare: true})
	ctx := context.Background()
	exp := utc0.Add(time.Minute)
	claimRows := func(id int64) {
		m.ExpectQuery(pgLeaseClaim).WithArgs(1, 1, 1, minute).WillReturnRows(rows("id,attempt,locked_until,payload",
			row(id, int64(1), exp, []byte("p"))))
	}

	// The first claim prepares the statement, the second only runs it.
	m.ExpectPrepare(pgLeaseClaim)
	claimRows(7)
	claimRows(8)
	n := m.Sent()
	d7 := claim(t, q, 1, 7)[0]
	d8 := claim(t, q, 1, 8)[0]
	wantLog(t, m, n, "prepare "+pgLeaseClaim, "stmt query "+pgLeaseClaim, "stmt query "+pgLeaseClaim)

	m.ExpectPrepare(pgLeaseAck)
	m.ExpectExec(pgLeaseAck).WithArgs(int64(7), int64(2), at(exp)).WillReturnResult(affected(1))
	n = m.Sent()
	ok(t, "Ack", d7.Ack(ctx))
	wantLog(t, m, n, "prepare "+pgLeaseAck, "stmt exec "+pgLeaseAck)

	// In the caller's transaction, which may be another pool's: the text.
	m.ExpectBegin()
	m.ExpectExec(pgLeaseAck).WithArgs(int64(8), int64(2), at(exp)).WillReturnResult(affected(1))
	m.ExpectCommit()
	tx, err := m.DB.BeginTx(ctx, nil)
	ok(t, "Begin", err)
	n = m.Sent()
	ok(t, "AckTx", d8.AckTx(ctx, tx))
	wantLog(t, m, n, "exec "+pgLeaseAck)
	ok(t, "Commit", tx.Commit())

	// A queue made from it by WithLease shares its statements.
	q2, err := q.WithLease(time.Minute)
	ok(t, "WithLease", err)
	claimRows(9)
	n = m.Sent()
	claim(t, q2, 1, 9)
	wantLog(t, m, n, "stmt query "+pgLeaseClaim)
	m.Met(t)
}

// Without Prepare nothing is prepared: the same statements go as text.
func TestPrepareOffSendsText(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable, Lease: time.Minute})
	m.ExpectQuery(pgLeaseClaim).WithArgs(1, 1, 1, minute).WillReturnRows(rows("id,attempt,locked_until,payload",
		row(int64(7), int64(1), utc0.Add(time.Minute), []byte("p"))))
	n := m.Sent()
	claim(t, q, 1, 7)
	wantLog(t, m, n, "query "+pgLeaseClaim)
	m.Met(t)
}

// The MySQL lease claim's transaction runs its statements prepared: they
// are prepared before it begins, while the claim holds no connection, so
// that a pool of one never waits for a second.
func TestPrepareMySQLLeaseClaim(t *testing.T) {
	m := newMock(t)
	m.DB.SetMaxOpenConns(1)
	clk := fakeclock.New(t0)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: leaseTable, Lease: time.Minute, Now: clk.Now, Prepare: true})
	const exp = "2024-03-01 12:01:00.123456"
	claimOnce := func() {
		m.ExpectBegin()
		m.ExpectQuery(myLeaseFirst).WithArgs("2024-03-01 12:00:00.123456", 1).WillReturnRows(rows("id,attempt,payload", row(int64(7), int64(1), []byte("p7"))))
		m.ExpectExec(myLeaseMarkOne).WithArgs(markOneArgs(exp, 7, 1)...).WillReturnResult(affected(1))
		m.ExpectCommit()
	}
	// The statements a claim of one may send, and no others.
	m.ExpectPrepare(myLeaseDue)
	m.ExpectPrepare(myLeaseFree)
	m.ExpectPrepare(myLeaseFirst)
	m.ExpectPrepare(myLeaseMarkOne)
	claimOnce()
	n := m.Sent()
	d := claim(t, q, 1, 7)[0]
	run := []string{"begin", "stmt query " + myLeaseFirst, "stmt exec " + myLeaseMarkOne, "commit"}
	wantLog(t, m, n, append([]string{"prepare " + myLeaseDue, "prepare " + myLeaseFree, "prepare " + myLeaseFirst, "prepare " + myLeaseMarkOne}, run...)...)

	m.ExpectPrepare(myLeaseRelease)
	m.ExpectExec(myLeaseRelease).WithArgs(int64(7), int64(2), exp).WillReturnResult(affected(1))
	ok(t, "Release", d.Release(context.Background()))
	claimOnce()
	n = m.Sent()
	claim(t, q, 1, 7)
	wantLog(t, m, n, run...)
	m.Met(t)
}

// The row lock's held transaction runs the claim and the settlement
// prepared, on its own connection.
func TestPrepareRowLock(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: rowLockTable, Prepare: true})
	cols := "id,attempt,payload"
	// What a held transaction may run is prepared before the first begins.
	for _, s := range []string{pgRowLockClaim, pgRowLockAck, pgRowLockRetry, pgRowLockDead} {
		m.ExpectPrepare(s)
	}
	m.ExpectBegin()
	m.ExpectQuery(pgRowLockClaim).WithoutArgs().WillReturnRows(rows(cols, row(int64(7), int64(1), []byte("p7"))))
	n := m.Sent()
	d := claim(t, q, 1, 7)[0]
	wantLog(t, m, n, "prepare "+pgRowLockClaim, "prepare "+pgRowLockAck, "prepare "+pgRowLockRetry, "prepare "+pgRowLockDead,
		"begin", "stmt query "+pgRowLockClaim)

	m.ExpectExec(pgRowLockAck).WithArgs(int64(7)).WillReturnResult(affected(1))
	m.ExpectCommit()
	n = m.Sent()
	ok(t, "Ack", d.Ack(context.Background()))
	wantLog(t, m, n, "stmt exec "+pgRowLockAck, "commit")
	m.Met(t)
}

// A prepare that fails fails the call and changes nothing; the next call
// prepares again.
func TestPrepareFails(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable, Lease: time.Minute, Prepare: true})
	broken := errors.New("connection reset")
	m.ExpectPrepare(pgLeaseClaim).WillReturnError(broken)
	if _, err := q.Claim(context.Background(), 1); !errors.Is(err, broken) {
		t.Fatalf("Claim with a failing prepare: %v, want %v", err, broken)
	}
	m.ExpectPrepare(pgLeaseClaim)
	m.ExpectQuery(pgLeaseClaim).WithArgs(1, 1, 1, minute).WillReturnRows(rows("id,attempt,locked_until,payload"))
	claim(t, q, 1)
	m.Met(t)
}

// A cancelled context prepares nothing and sends nothing.
func TestPrepareCancelled(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable, Lease: time.Minute, Prepare: true})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	m.Quiet(t, "a claim with a cancelled context", func() {
		if _, err := q.Claim(ctx, 1); !errors.Is(err, context.Canceled) {
			t.Errorf("Claim: %v, want context.Canceled", err)
		}
	})
	m.Met(t)
}

// Close closes the prepared statements, once every queue sharing them
// (WithLease) is closed; a closed queue sends its statements as text.
func TestPrepareClosedWithQueue(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable, Lease: time.Minute, Prepare: true})
	m.ExpectPrepare(pgLeaseClaim).WillBeClosed()
	m.ExpectQuery(pgLeaseClaim).WithArgs(1, 1, 1, minute).WillReturnRows(rows("id,attempt,locked_until,payload"))
	claim(t, q, 1)
	sibling, err := q.WithLease(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if got := m.ClosedStmts(); len(got) != 0 {
		t.Fatalf("closed %q while the WithLease queue shares them", got)
	}
	if err := sibling.Close(); err != nil {
		t.Fatal(err)
	}
	if err := sibling.Close(); err != nil {
		t.Fatalf("a second Close: %v", err)
	}
	if got := m.ClosedStmts(); !reflect.DeepEqual(got, []string{pgLeaseClaim}) {
		t.Errorf("closed %q, want the claim", got)
	}
	// Sent as text from now on: nothing prepared again.
	m.ExpectQuery(pgLeaseClaim).WithArgs(1, 1, 1, minute).WillReturnRows(rows("id,attempt,locked_until,payload"))
	n := len(m.Log(0))
	claim(t, q, 1)
	wantLog(t, m, n, "query "+pgLeaseClaim)
	m.Met(t)
}

// inbox.MariaDB's lease claim of one, its one compound statement
// (Claim.WalkTake), is prepared at its first use and run prepared from
// then on: MariaDB parses a compound statement sent as text at every call.
func TestPrepareMariaDBLeaseWalkTake(t *testing.T) {
	m := newMock(t)
	m.DB.SetMaxOpenConns(1)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MariaDB, Table: leaseTable, Lease: time.Minute, Prepare: true})
	take := q.Statements().Claim.WalkTake.SQL
	const exp = "2024-03-01 12:01:00.123456"
	claimOnce := func(id int64) {
		t.Helper()
		m.ExpectQuery(take).WithArgs(int64(60000000)).WillReturnRows(rows("inbox_id,inbox_attempt,inbox_until,inbox_c0", row(id, int64(1), []byte(exp), []byte("p"))))
		n := m.Sent()
		claim(t, q, 1, id)
		wantLog(t, m, n, "stmt query "+take)
	}
	m.ExpectPrepare(take)
	n := m.Sent()
	m.ExpectQuery(take).WithArgs(int64(60000000)).WillReturnRows(rows("inbox_id,inbox_attempt,inbox_until,inbox_c0", row(int64(7), int64(1), []byte(exp), []byte("p"))))
	claim(t, q, 1, 7)
	wantLog(t, m, n, "prepare "+take, "stmt query "+take)
	claimOnce(8)
	claimOnce(9)
	m.Met(t)
}
