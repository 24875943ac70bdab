package inbox_test

// The SQL the MySQL/MariaDB dialect sends, pinned with sqlmock's exact
// matcher, for every form and both clocks. MySQL has no UPDATE … RETURNING:
// under the engine's clock the queue reads SELECT UTC_TIMESTAMP(6) first and
// passes the times it computes; every time goes as DATETIME(6) text in UTC.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/fakeclock"
)

const myNow = "SELECT UTC_TIMESTAMP(6)"

// Lease form.
const (
	myLeaseDue  = "SELECT `id`, `attempt`, `payload` FROM `jobs` WHERE `locked_until` <= ? ORDER BY `locked_until` DESC, `id` DESC LIMIT ? FOR UPDATE SKIP LOCKED"
	myLeaseFree = "SELECT `id`, `attempt`, `payload` FROM `jobs` WHERE `locked_until` IS NULL ORDER BY `id` LIMIT ? FOR UPDATE SKIP LOCKED"
	// Under the engine's clock each read returns the clock too.
	myLeaseDueClock  = "SELECT `id`, `attempt`, `payload`, UTC_TIMESTAMP(6) FROM `jobs` WHERE `locked_until` <= UTC_TIMESTAMP(6) ORDER BY `locked_until` DESC, `id` DESC LIMIT ? FOR UPDATE SKIP LOCKED"
	myLeaseFreeClock = "SELECT `id`, `attempt`, `payload`, UTC_TIMESTAMP(6) FROM `jobs` WHERE `locked_until` IS NULL ORDER BY `id` LIMIT ? FOR UPDATE SKIP LOCKED"
	// A claim of several locks its free rows through the primary key.
	myLeaseFreeMany      = "SELECT `id`, `attempt`, `payload` FROM `jobs` FORCE INDEX (PRIMARY) WHERE `id` >= (SELECT MIN(`id`) FROM `jobs` WHERE `locked_until` IS NULL) AND `locked_until` IS NULL ORDER BY `id` LIMIT ? FOR UPDATE SKIP LOCKED"
	myLeaseFreeManyClock = "SELECT `id`, `attempt`, `payload`, UTC_TIMESTAMP(6) FROM `jobs` FORCE INDEX (PRIMARY) WHERE `id` >= (SELECT MIN(`id`) FROM `jobs` WHERE `locked_until` IS NULL) AND `locked_until` IS NULL ORDER BY `id` LIMIT ? FOR UPDATE SKIP LOCKED"
	// The first read: free rows alone, none while any lease has run out.
	myLeaseFirst          = "SELECT `id`, `attempt`, `payload` FROM `jobs` WHERE `locked_until` IS NULL AND (SELECT MAX(`locked_until`) FROM `jobs` WHERE `locked_until` <= ?) IS NULL ORDER BY `id` LIMIT ? FOR UPDATE SKIP LOCKED"
	myLeaseFirstMany      = "SELECT `id`, `attempt`, `payload` FROM `jobs` FORCE INDEX (PRIMARY) WHERE `id` >= (SELECT MIN(`id`) FROM `jobs` WHERE `locked_until` IS NULL) AND `locked_until` IS NULL AND (SELECT MAX(`locked_until`) FROM `jobs` WHERE `locked_until` <= ?) IS NULL ORDER BY `id` LIMIT ? FOR UPDATE SKIP LOCKED"
	myLeaseFirstManyClock = "SELECT `id`, `attempt`, `payload`, UTC_TIMESTAMP(6) FROM `jobs` FORCE INDEX (PRIMARY) WHERE `id` >= (SELECT MIN(`id`) FROM `jobs` WHERE `locked_until` IS NULL) AND `locked_until` IS NULL AND (SELECT MAX(`locked_until`) FROM `jobs` WHERE `locked_until` <= UTC_TIMESTAMP(6)) IS NULL ORDER BY `id` LIMIT ? FOR UPDATE SKIP LOCKED"
	myLeaseMark           = "UPDATE `jobs` SET `attempt` = `attempt` + 1, `locked_until` = ? WHERE (`id`, `attempt`) IN ((?, ?), (?, ?), (?, ?), (?, ?), (?, ?), (?, ?), (?, ?), (?, ?), (?, ?), (?, ?), (?, ?), (?, ?), (?, ?), (?, ?), (?, ?), (?, ?)) AND (`locked_until` <= ? OR `locked_until` IS NULL)"
	// A claim of one marks its row by equality (Claim.MarkOne).
	myLeaseMarkOne    = "UPDATE `jobs` SET `attempt` = `attempt` + 1, `locked_until` = ? WHERE `id` = ? AND `attempt` = ? AND (`locked_until` <= ? OR `locked_until` IS NULL)"
	myLeaseMarked     = "SELECT `id` FROM `jobs` WHERE `id` IN (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) AND `locked_until` = ?"
	myLeaseExtend     = "UPDATE `jobs` SET `locked_until` = ? WHERE `id` = ? AND `attempt` = ? AND COALESCE(`locked_until`) = ?" // also Retry
	myLeaseExists     = "SELECT COUNT(*) FROM `jobs` WHERE `id` = ? AND `attempt` = ? AND COALESCE(`locked_until`) = ?"
	myLeaseAck        = "DELETE FROM `jobs` WHERE `id` = ? AND `attempt` = ? AND COALESCE(`locked_until`) = ?" // also the dead move's delete
	myLeaseRelease    = "UPDATE `jobs` SET `locked_until` = NULL, `attempt` = `attempt` - 1 WHERE `id` = ? AND `attempt` = ? AND COALESCE(`locked_until`) = ?"
	myLeaseDeadInsert = "INSERT INTO `dead_jobs` (`id`, `attempt`, `payload`) SELECT `id`, ?, `payload` FROM `jobs` WHERE `id` = ? AND `attempt` = ? AND COALESCE(`locked_until`) = ?"
)

// Row-lock form, and its claims counter: a side table, counted from a
// second session and read back, MySQL having no RETURNING.
const (
	// A row-lock claim with a not-before column picks: candidates read
	// without locks, then the first free one locked by primary key.
	myRowLockPick             = "SELECT `id` FROM `jobs` WHERE (`not_before` IS NULL OR `not_before` <= UTC_TIMESTAMP(6)) ORDER BY `id` LIMIT ?"
	myRowLockPickInjected     = "SELECT `id` FROM `jobs` WHERE (`not_before` IS NULL OR `not_before` <= ?) ORDER BY `id` LIMIT ?"
	myRowLockPickLock         = "SELECT `id`, `attempt`, `payload` FROM `jobs` WHERE `id` IN (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) AND (COALESCE(`not_before`) IS NULL OR COALESCE(`not_before`) <= UTC_TIMESTAMP(6)) ORDER BY `id` LIMIT ? FOR UPDATE SKIP LOCKED"
	myRowLockPickLockInjected = "SELECT `id`, `attempt`, `payload` FROM `jobs` WHERE `id` IN (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) AND (COALESCE(`not_before`) IS NULL OR COALESCE(`not_before`) <= ?) ORDER BY `id` LIMIT ? FOR UPDATE SKIP LOCKED"
	myRowLockAck              = "DELETE FROM `jobs` WHERE `id` = ?" // also the dead move's delete
	myRowLockRetry            = "UPDATE `jobs` SET `attempt` = `attempt` + 1, `not_before` = ? WHERE `id` = ?"
	myRowLockDeadInsert       = "INSERT INTO `dead_jobs` (`id`, `attempt`, `payload`) SELECT `id`, ?, `payload` FROM `jobs` WHERE `id` = ?"

	myClaimsCount    = "INSERT INTO `job_claims` (`id`, claims) VALUES (?, 1) ON DUPLICATE KEY UPDATE claims = claims + 1"
	myClaimsRead     = "SELECT claims FROM `job_claims` WHERE `id` = ?"
	myClaimsGiveBack = "UPDATE `job_claims` SET claims = claims - 1 WHERE `id` = ? AND claims > 0"
	myClaimsClear    = "DELETE FROM `job_claims` WHERE `id` = ?"
)

// Advisory form. The claim under the lock checks the candidate's attempt and
// the row's readiness in both its statements.
const (
	myAdvCandidates         = "SELECT `id`, `id`, `attempt` FROM `jobs` WHERE (`not_before` IS NULL OR `not_before` <= UTC_TIMESTAMP(6)) ORDER BY `id` LIMIT ?"
	myAdvCandidatesInjected = "SELECT `id`, `id`, `attempt` FROM `jobs` WHERE (`not_before` IS NULL OR `not_before` <= ?) ORDER BY `id` LIMIT ?"
	myAdvSelect             = "SELECT `id`, `attempt`, `payload` FROM `jobs` WHERE `id` = ? AND `attempt` = ? AND (`not_before` IS NULL OR `not_before` <= UTC_TIMESTAMP(6))"
	myAdvSelectInjected     = "SELECT `id`, `attempt`, `payload` FROM `jobs` WHERE `id` = ? AND `attempt` = ? AND (`not_before` IS NULL OR `not_before` <= ?)"
	myAdvMark               = "UPDATE `jobs` SET `attempt` = `attempt` + 1 WHERE `id` = ? AND `attempt` = ? AND (`not_before` IS NULL OR `not_before` <= UTC_TIMESTAMP(6))"
	myAdvMarkInjected       = "UPDATE `jobs` SET `attempt` = `attempt` + 1 WHERE `id` = ? AND `attempt` = ? AND (`not_before` IS NULL OR `not_before` <= ?)"
	myAdvAck                = "DELETE FROM `jobs` WHERE `id` = ? AND `attempt` = ?" // also the dead move's delete
	myAdvRetry              = "UPDATE `jobs` SET `not_before` = ? WHERE `id` = ? AND `attempt` = ?"
	myAdvRelease            = "UPDATE `jobs` SET `attempt` = `attempt` - 1 WHERE `id` = ? AND `attempt` = ?"
	myAdvDeadInsert         = "INSERT INTO `dead_jobs` (`id`, `attempt`, `payload`) SELECT `id`, ?, `payload` FROM `jobs` WHERE `id` = ? AND `attempt` = ?"
	myGetLock               = "SELECT GET_LOCK(?, 0)"
	myReleaseLock           = "SELECT RELEASE_LOCK(?)"

	// Without a not-before column.
	myPlainCandidates = "SELECT `id`, `id`, `attempt` FROM `jobs` ORDER BY `id` LIMIT ?"
	myPlainSelect     = "SELECT `id`, `attempt`, `payload` FROM `jobs` WHERE `id` = ? AND `attempt` = ?"
	myPlainMark       = "UPDATE `jobs` SET `attempt` = `attempt` + 1 WHERE `id` = ? AND `attempt` = ?"
)

// myLocked and myUnlocked expect the lock call of key k, answering got, and
// its unlock.
func myLocked(m *mock, k string, got int64) {
	m.ExpectQuery(myGetLock).WithArgs(myLock[k]).WillReturnRows(rows("got", row(got)))
}

func myUnlocked(m *mock, k string) {
	m.ExpectQuery(myReleaseLock).WithArgs(myLock[k]).WillReturnRows(rows("RELEASE_LOCK(?)", row(int64(1))))
}

// markArgs is the arguments of one myLeaseMark: the expiry; the 16 (id,
// attempt) places, the claimed rows' ids and attempts as read, given in
// pairs, in order, the last one repeated to fill them; then the reading of
// the clock the rows were found claimable at.
func markArgs(until string, idAttempt ...int64) []driver.Value {
	out := []driver.Value{until}
	last := len(idAttempt)/2 - 1
	for i := 0; i < 16; i++ {
		k := min(i, last)
		out = append(out, idAttempt[2*k], idAttempt[2*k+1])
	}
	return append(out, "2024-03-01 12:00:00.123456")
}

// markOneArgs is the arguments of one myLeaseMarkOne: the expiry, the
// row's id and attempt as read, the clock reading.
func markOneArgs(until string, id, attempt int64) []driver.Value {
	return []driver.Value{until, id, attempt, "2024-03-01 12:00:00.123456"}
}

// myClock answers the read of the engine's clock.
func myClock(m *mock, v any) {
	m.ExpectQuery(myNow).WithoutArgs().WillReturnRows(rows("UTC_TIMESTAMP(6)", row(v)))
}

func TestMySQLLease(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: leaseTable, Lease: time.Minute})
	const exp = "2024-03-01 12:01:00.123456"
	// Without parseTime the driver returns DATETIME text.
	m.ExpectBegin()
	// Rows whose lease ran out come first; free rows fill the places left.
	// Each read returns the engine's clock: the first that came with rows
	// is the claim's now.
	const now, later = "2024-03-01 12:00:00.123456", "2024-03-01 12:00:00.200000"
	// The first read, of free rows alone, finds none: a lease ran out.
	m.ExpectQuery(myLeaseFirstManyClock).WithArgs(4).WillReturnRows(rows("id,attempt,payload,UTC_TIMESTAMP(6)"))
	m.ExpectQuery(myLeaseDueClock).WithArgs(4).WillReturnRows(rows("id,attempt,payload,UTC_TIMESTAMP(6)",
		row(int64(8), int64(3), []byte("p8"), []byte(now))))
	m.ExpectQuery(myLeaseFreeManyClock).WithArgs(3).WillReturnRows(rows("id,attempt,payload,UTC_TIMESTAMP(6)",
		row(int64(7), int64(1), []byte("p7"), []byte(later)), row(int64(9), int64(1), []byte("p9"), []byte(later)),
		row(int64(10), int64(2), []byte("p10"), []byte(later))))
	m.ExpectExec(myLeaseMark).WithArgs(markArgs(exp, 8, 3, 7, 1, 9, 1, 10, 2)...).WillReturnResult(affected(4))
	m.ExpectCommit()
	ds := claim(t, q, 4, 8, 7, 9, 10)
	ds[0], ds[1] = ds[1], ds[0] // in id order for what follows
	if iso := m.Isolations(); len(iso) != 1 || iso[0] != sql.LevelReadCommitted {
		t.Errorf("claim transaction isolation %v, want READ COMMITTED", iso)
	}
	if !ds[1].Expiry().Equal(utc0.Add(time.Minute)) || ds[1].Attempt() != 3 {
		t.Fatalf("delivery 8: expiry %v attempt %d", ds[1].Expiry(), ds[1].Attempt())
	}

	// With parseTime the driver returns the UTC wall clock in its own
	// location: the wall clock is what counts.
	myClock(m, time.Date(2024, 3, 1, 12, 0, 30, 500000000, time.FixedZone("driver", 3600)))
	m.ExpectExec(myLeaseExtend).WithArgs("2024-03-01 12:01:30.500000", int64(7), int64(2), exp).WillReturnResult(affected(1))
	ok(t, "Extend", ds[0].Extend(context.Background()))
	if want := time.Date(2024, 3, 1, 12, 1, 30, 500000000, time.UTC); !ds[0].Expiry().Equal(want) {
		t.Fatalf("Expiry() after Extend = %v, want %v", ds[0].Expiry(), want)
	}
	m.ExpectExec(myLeaseAck).WithArgs(int64(7), int64(2), "2024-03-01 12:01:30.500000").WillReturnResult(affected(1))
	ok(t, "Ack", ds[0].Ack(context.Background()))
	myClock(m, []byte("2024-03-01 12:00:40"))
	m.ExpectExec(myLeaseExtend).WithArgs("2024-03-01 12:02:10.000000", int64(8), int64(4), exp).WillReturnResult(affected(1))
	ok(t, "Retry", ds[1].Retry(context.Background(), 90*time.Second))
	m.ExpectExec(myLeaseRelease).WithArgs(int64(9), int64(2), exp).WillReturnResult(affected(1))
	ok(t, "Release", ds[2].Release(context.Background()))
	m.ExpectBegin()
	m.ExpectExec(myLeaseDeadInsert).WithArgs(int64(2), int64(10), int64(3), exp).WillReturnResult(affected(1))
	m.ExpectExec(myLeaseAck).WithArgs(int64(10), int64(3), exp).WillReturnResult(affected(1))
	m.ExpectCommit()
	ok(t, "Dead", ds[3].Dead(context.Background()))
	m.Met(t)
}

func TestMySQLLeaseInjectedClock(t *testing.T) {
	m := newMock(t)
	clk := fakeclock.New(t0)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: leaseTable, Lease: time.Minute, Now: clk.Now})
	const exp = "2024-03-01 12:01:00.123456"
	m.ExpectBegin()
	m.ExpectQuery(myLeaseFirstMany).WithArgs("2024-03-01 12:00:00.123456", 2).WillReturnRows(rows("id,attempt,payload",
		row(int64(7), int64(1), []byte("p7")), row(int64(8), int64(1), []byte("p8"))))
	m.ExpectExec(myLeaseMark).WithArgs(markArgs(exp, 7, 1, 8, 1)...).WillReturnResult(affected(2))
	m.ExpectCommit()
	ds := claim(t, q, 2, 7, 8)

	clk.Advance(20 * time.Second)
	m.ExpectExec(myLeaseExtend).WithArgs("2024-03-01 12:01:20.123456", int64(7), int64(2), exp).WillReturnResult(affected(1))
	ok(t, "Extend", ds[0].Extend(context.Background()))
	m.ExpectExec(myLeaseExtend).WithArgs("2024-03-01 12:02:20.123456", int64(7), int64(2), "2024-03-01 12:01:20.123456").WillReturnResult(affected(1))
	ok(t, "Retry", ds[0].Retry(context.Background(), 2*time.Minute))
	m.ExpectExec(myLeaseAck).WithArgs(int64(8), int64(2), exp).WillReturnResult(affected(1))
	ok(t, "Ack", ds[1].Ack(context.Background()))
	m.Met(t)
}

// A claim of more rows than one Claim.Mark takes writes its leases in chunks
// of 16 ids, in claim order; the last chunk repeats its last id.
func TestMySQLLeaseClaimMarkChunks(t *testing.T) {
	m := newMock(t)
	clk := fakeclock.New(t0)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: leaseTable, Lease: time.Minute, Now: clk.Now})
	const exp = "2024-03-01 12:01:00.123456"
	r := rows("id,attempt,payload")
	var want []int64
	for id := int64(1); id <= 18; id++ {
		r.AddRow(id, int64(1), nil)
		want = append(want, id)
	}
	m.ExpectBegin()
	m.ExpectQuery(myLeaseFirstMany).WithArgs("2024-03-01 12:00:00.123456", 20).WillReturnRows(r)
	first := []int64{}
	for id := int64(1); id <= 16; id++ {
		first = append(first, id, 1)
	}
	m.ExpectExec(myLeaseMark).WithArgs(markArgs(exp, first...)...).WillReturnResult(affected(16))
	m.ExpectExec(myLeaseMark).WithArgs(markArgs(exp, 17, 1, 18, 1)...).WillReturnResult(affected(2))
	m.ExpectCommit()
	ds := claim(t, q, 20, want...)
	for _, d := range ds {
		if !d.Expiry().Equal(utc0.Add(time.Minute)) || d.Attempt() != 1 {
			t.Fatalf("delivery %v: expiry %v attempt %d", d.ID(), d.Expiry(), d.Attempt())
		}
	}
	m.Met(t)
}

// A mark that changes fewer rows than it names (a Galera node's SELECT lock
// is local: another node may have claimed a row since) delivers only the
// rows carrying the claim's own expiry, with the attempt they were read at;
// a mark that changes none delivers nothing, and the claim still commits.
func TestMySQLLeaseMarkShortfall(t *testing.T) {
	m := newMock(t)
	clk := fakeclock.New(t0)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: leaseTable, Lease: time.Minute, Now: clk.Now})
	const exp = "2024-03-01 12:01:00.123456"
	markedArgs := func(ids ...int64) []driver.Value {
		var out []driver.Value
		for i := 0; i < 16; i++ {
			out = append(out, ids[min(i, len(ids)-1)])
		}
		return append(out, exp)
	}
	m.ExpectBegin()
	m.ExpectQuery(myLeaseFirstMany).WithArgs("2024-03-01 12:00:00.123456", 3).WillReturnRows(rows("id,attempt,payload",
		row(int64(7), int64(1), nil), row(int64(8), int64(4), nil), row(int64(9), int64(1), nil)))
	m.ExpectExec(myLeaseMark).WithArgs(markArgs(exp, 7, 1, 8, 4, 9, 1)...).WillReturnResult(affected(2))
	m.ExpectQuery(myLeaseMarked).WithArgs(markedArgs(7, 8, 9)...).WillReturnRows(rows("id", row(int64(9)), row(int64(8))))
	m.ExpectCommit()
	ds := claim(t, q, 3, 8, 9)
	if ds[0].Attempt() != 4 || ds[1].Attempt() != 1 || !ds[0].Expiry().Equal(utc0.Add(time.Minute)) {
		t.Fatalf("deliveries: attempts %d, %d, expiry %v", ds[0].Attempt(), ds[1].Attempt(), ds[0].Expiry())
	}

	m.ExpectBegin()
	m.ExpectQuery(myLeaseFirst).WithArgs("2024-03-01 12:00:00.123456", 1).WillReturnRows(rows("id,attempt,payload"))
	m.ExpectQuery(myLeaseDue).WithArgs("2024-03-01 12:00:00.123456", 1).WillReturnRows(rows("id,attempt,payload",
		row(int64(7), int64(2), nil)))
	m.ExpectExec(myLeaseMarkOne).WithArgs(markOneArgs(exp, 7, 2)...).WillReturnResult(affected(0))
	m.ExpectQuery(myLeaseMarked).WithArgs(markedArgs(7)...).WillReturnRows(rows("id"))
	m.ExpectCommit()
	claim(t, q, 1)
	m.Met(t)
}

// A dialect with a lease Claim.Mark and no Claim.Marked cannot tell which rows
// a short mark wrote: the claim rolls back and says so.
func TestLeaseMarkShortfallWithoutClaimMarked(t *testing.T) {
	m := newMock(t)
	clk := fakeclock.New(t0)
	q := newQueue(t, m, inbox.Config{Dialect: noClaimMarked, Table: leaseTable, Lease: time.Minute, Now: clk.Now})
	const exp = "2024-03-01 12:01:00.123456"
	m.ExpectBegin()
	m.ExpectQuery(myLeaseFirstMany).WithArgs("2024-03-01 12:00:00.123456", 2).WillReturnRows(rows("id,attempt,payload",
		row(int64(7), int64(1), nil), row(int64(8), int64(1), nil)))
	m.ExpectExec(myLeaseMark).WithArgs(markArgs(exp, 7, 1, 8, 1)...).WillReturnResult(affected(1))
	m.ExpectRollback()
	ds, err := q.Claim(context.Background(), 2)
	if err == nil || len(ds) != 0 || !strings.Contains(err.Error(), "Claim.Marked") {
		t.Fatalf("Claim = %d jobs, %v; want none and an error naming Claim.Marked", len(ds), err)
	}
	m.Met(t)
}

// noClaimMarked is a dialect from outside the package that marks lease rows
// but cannot read back which it marked.
var noClaimMarked = editedDialect{inbox.MySQL, func(st *inbox.Statements) { st.Claim.Marked = dialect.Stmt{} }}

// MySQL counts changed rows: an extension or retry writing the expiry the
// row already holds affects none. The token's count confirms it; only a
// count of zero is a lost lease.
func TestMySQLSameExpiryIsNotLost(t *testing.T) {
	m := newMock(t)
	clk := fakeclock.New(t0) // frozen: every new expiry equals the old one
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: leaseTable, Lease: time.Minute, Now: clk.Now})
	const exp = "2024-03-01 12:01:00.123456"
	m.ExpectBegin()
	m.ExpectQuery(myLeaseFirstMany).WithArgs("2024-03-01 12:00:00.123456", 3).WillReturnRows(rows("id,attempt,payload",
		row(int64(7), int64(1), nil), row(int64(8), int64(1), nil), row(int64(9), int64(1), nil)))
	m.ExpectExec(myLeaseMark).WithArgs(markArgs(exp, 7, 1, 8, 1, 9, 1)...).WillReturnResult(affected(3))
	m.ExpectCommit()
	ds := claim(t, q, 3, 7, 8, 9)
	ctx := context.Background()

	m.ExpectExec(myLeaseExtend).WithArgs(exp, int64(7), int64(2), exp).WillReturnResult(affected(0))
	m.ExpectQuery(myLeaseExists).WithArgs(int64(7), int64(2), exp).WillReturnRows(rows("COUNT(*)", row(int64(1))))
	ok(t, "Extend to the same expiry", ds[0].Extend(ctx))
	m.ExpectExec(myLeaseExtend).WithArgs(exp, int64(7), int64(2), exp).WillReturnResult(affected(0))
	m.ExpectQuery(myLeaseExists).WithArgs(int64(7), int64(2), exp).WillReturnRows(rows("COUNT(*)", row(int64(1))))
	ok(t, "Retry to the same expiry", ds[0].Retry(ctx, time.Minute))

	// The token is gone: lost, and the delivery is finished.
	m.ExpectExec(myLeaseExtend).WithArgs(exp, int64(8), int64(2), exp).WillReturnResult(affected(0))
	m.ExpectQuery(myLeaseExists).WithArgs(int64(8), int64(2), exp).WillReturnRows(rows("COUNT(*)", row(int64(0))))
	if err := ds[1].Extend(ctx); !errors.Is(err, inbox.ErrLeaseLost) {
		t.Fatalf("Extend of a gone token = %v, want ErrLeaseLost", err)
	}
	m.Quiet(t, "Ack after a lost lease", func() {
		if err := ds[1].Ack(ctx); !errors.Is(err, inbox.ErrSettled) {
			t.Errorf("Ack after a lost lease = %v, want ErrSettled", err)
		}
	})

	// A new expiry that changed nothing needs no count: the token is gone.
	clk.Advance(time.Second)
	m.ExpectExec(myLeaseExtend).WithArgs("2024-03-01 12:01:01.123456", int64(9), int64(2), exp).WillReturnResult(affected(0))
	if err := ds[2].Extend(ctx); !errors.Is(err, inbox.ErrLeaseLost) {
		t.Fatalf("Extend = %v, want ErrLeaseLost", err)
	}
	m.Met(t)
}

func TestMySQLLeaseTx(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: leaseTable, Lease: time.Minute})
	const exp = "2024-03-01 12:01:00.123456"
	m.ExpectBegin()
	// No row's lease ran out: the free rows bring the clock, parsed as the
	// driver returns it with parseTime.
	now := time.Date(2024, 3, 1, 12, 0, 0, 123456000, time.FixedZone("driver", 3600))
	m.ExpectQuery(myLeaseFirstManyClock).WithArgs(4).WillReturnRows(rows("id,attempt,payload,UTC_TIMESTAMP(6)",
		row(int64(1), int64(1), nil, now), row(int64(2), int64(1), nil, now), row(int64(3), int64(1), nil, now), row(int64(4), int64(1), nil, now)))
	m.ExpectExec(myLeaseMark).WithArgs(markArgs(exp, 1, 1, 2, 1, 3, 1, 4, 1)...).WillReturnResult(affected(4))
	m.ExpectCommit()
	ds := claim(t, q, 4, 1, 2, 3, 4)
	ctx := context.Background()
	settleInTx(t, m, "AckTx", func() {
		m.ExpectExec(myLeaseAck).WithArgs(int64(1), int64(2), exp).WillReturnResult(affected(1))
	}, func(tx *sql.Tx) error { return ds[0].AckTx(ctx, tx) })
	// The clock is read inside the caller's transaction.
	settleInTx(t, m, "RetryTx", func() {
		myClock(m, []byte("2024-03-01 12:00:10.000000"))
		m.ExpectExec(myLeaseExtend).WithArgs("2024-03-01 12:00:40.000000", int64(2), int64(2), exp).WillReturnResult(affected(1))
	}, func(tx *sql.Tx) error { return ds[1].RetryTx(ctx, tx, 30*time.Second) })
	settleInTx(t, m, "ReleaseTx", func() {
		m.ExpectExec(myLeaseRelease).WithArgs(int64(3), int64(2), exp).WillReturnResult(affected(1))
	}, func(tx *sql.Tx) error { return ds[2].ReleaseTx(ctx, tx) })
	settleInTx(t, m, "DeadTx", func() {
		m.ExpectExec(myLeaseDeadInsert).WithArgs(int64(1), int64(4), int64(2), exp).WillReturnResult(affected(1))
		m.ExpectExec(myLeaseAck).WithArgs(int64(4), int64(2), exp).WillReturnResult(affected(1))
	}, func(tx *sql.Tx) error { return ds[3].DeadTx(ctx, tx) })
	m.Met(t)
}

func TestMySQLRowLock(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: rowLockTable})
	cols := "id,attempt,payload"
	m.ExpectBegin()
	myRowLockPicks(m, "", 10, []int64{7, 8}, rows(cols, row(int64(7), int64(1), []byte("p7"))))
	m.ExpectBegin()
	myRowLockPicks(m, "", 11, []int64{8}, rows(cols, row(int64(8), int64(2), []byte("p8"))))
	m.ExpectBegin()
	// A candidate another claim took meanwhile: the lock finds none.
	myRowLockPicks(m, "", 12, []int64{9}, rows(cols))
	m.ExpectRollback()
	ctx, cancel := context.WithCancel(context.Background())
	ds, err := q.Claim(ctx, 5)
	ok(t, "Claim", err)
	cancel()
	if len(ds) != 2 || ds[0].ID() != int64(7) || ds[1].Attempt() != 2 {
		t.Fatalf("Claim returned %d deliveries", len(ds))
	}
	checkHeldTx(t, m, ds, 3)

	m.ExpectExec(myRowLockAck).WithArgs(int64(7)).WillReturnResult(affected(1))
	m.ExpectCommit()
	ok(t, "Ack", ds[0].Ack(context.Background()))
	// The clock is read inside the held transaction.
	myClock(m, []byte("2024-03-01 12:00:00.123456"))
	m.ExpectExec(myRowLockRetry).WithArgs("2024-03-01 12:00:30.123456", int64(8)).WillReturnResult(affected(1))
	m.ExpectCommit()
	ok(t, "Retry", ds[1].Retry(context.Background(), 30*time.Second))

	for id := int64(9); id <= 11; id++ {
		m.ExpectBegin()
		myRowLockPicks(m, "", int(id)+1, []int64{id, id + 1}, rows(cols, row(id, int64(4), []byte("p"))))
	}
	ds = claim(t, q, 3, 9, 10, 11)
	// The claim wrote nothing: Retry without a delay counts the attempt.
	myClock(m, "2024-03-01 12:00:31.000000")
	m.ExpectExec(myRowLockRetry).WithArgs("2024-03-01 12:00:31.000000", int64(9)).WillReturnResult(affected(1))
	m.ExpectCommit()
	ok(t, "Retry(0)", ds[0].Retry(context.Background(), 0))
	m.ExpectRollback()
	ok(t, "Release", ds[1].Release(context.Background()))
	m.ExpectExec(myRowLockDeadInsert).WithArgs(int64(4), int64(11)).WillReturnResult(affected(1))
	m.ExpectExec(myRowLockAck).WithArgs(int64(11)).WillReturnResult(affected(1))
	m.ExpectCommit()
	ok(t, "Dead", ds[2].Dead(context.Background()))
	m.Met(t)
}

// A row-lock claim whose first page of candidates is all held by other
// claims locks none of them and reads the next page, twice as long, past
// the last candidate.
func TestMySQLRowLockPickPages(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: rowLockTable})
	const after = "SELECT `id` FROM `jobs` WHERE `id` > ? AND (`not_before` IS NULL OR `not_before` <= UTC_TIMESTAMP(6)) ORDER BY `id` LIMIT ?"
	m.ExpectBegin()
	held := rows("id")
	var lockArgs []driver.Value
	for id := int64(1); id <= 10; id++ {
		held.AddRow(id)
	}
	for k := int64(1); k <= 32; k++ {
		lockArgs = append(lockArgs, min(k, 10))
	}
	m.ExpectQuery(myRowLockPick).WithArgs(10).WillReturnRows(held)
	m.ExpectQuery(myRowLockPickLock).WithArgs(append(lockArgs, 1)...).WillReturnRows(rows("id,attempt,payload"))
	m.ExpectQuery(after).WithArgs(int64(10), 20).WillReturnRows(rows("id", row(int64(11))))
	lockArgs = lockArgs[:0]
	for k := 0; k < 32; k++ {
		lockArgs = append(lockArgs, int64(11))
	}
	m.ExpectQuery(myRowLockPickLock).WithArgs(append(lockArgs, 1)...).WillReturnRows(rows("id,attempt,payload", row(int64(11), int64(1), nil)))
	claim(t, q, 1, 11)
	m.Met(t)
}

// inbox.MariaDB's row-lock claim of one walks the primary key
// (Claim.WalkFirst), a locking read as a table without a not-before column
// has, bounded by the rows it reads and cannot claim. A walk that returns
// no row may leave the last of those locked: the claim rolls back and
// claims again in a new transaction without the walk (Claim.PickFirst),
// as do the 64 claims after it; then the walk again. A table with a
// priority, and inbox.MySQL, have no walk.
func TestMariaDBRowLockWalkFirst(t *testing.T) {
	const walkFirst = "SELECT `id`, `attempt`, `payload`" + mariaLevel + " FROM `jobs` FORCE INDEX (PRIMARY)" +
		" WHERE (`not_before` IS NULL OR `not_before` <= UTC_TIMESTAMP(6)) ORDER BY `id` LIMIT 1 ROWS EXAMINED 32 FOR UPDATE SKIP LOCKED"
	prio := rowLockTable
	prio.Priority = "priority"
	if got := newQueue(t, newMock(t), inbox.Config{Dialect: inbox.MariaDB, Table: prio}).Statements().Claim.WalkFirst.SQL; got != "" {
		t.Errorf("Claim.WalkFirst with a priority: %s", got)
	}
	if got := newQueue(t, newMock(t), inbox.Config{Dialect: inbox.MySQL, Table: rowLockTable}).Statements().Claim.WalkFirst.SQL; got != "" {
		t.Errorf("inbox.MySQL's Claim.WalkFirst: %s", got)
	}
	// With Config.Now the walk takes the time as its one argument.
	clk := fakeclock.New(t0)
	timed := newQueue(t, newMock(t), inbox.Config{Dialect: inbox.MariaDB, Table: rowLockTable, Now: clk.Now}).Statements().Claim.WalkFirst
	if want := strings.ReplaceAll(walkFirst, "UTC_TIMESTAMP(6)", "?"); timed.SQL != want {
		t.Errorf("Claim.WalkFirst with Config.Now:\n got %s\nwant %s", timed.SQL, want)
	}

	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MariaDB, Table: rowLockTable})
	st := q.Statements().Claim
	if st.WalkFirst.SQL != walkFirst {
		t.Fatalf("Claim.WalkFirst:\n got %s\nwant %s", st.WalkFirst.SQL, walkFirst)
	}
	pickFirst := st.PickFirst.SQL
	m.ExpectBegin()
	m.ExpectQuery(walkFirst).WithoutArgs().WillReturnRows(atLevel(walkFirst, "id,attempt,payload", row(int64(11), int64(1), []byte("a"))))
	first := claim(t, q, 1, 11)
	m.Met(t)
	// A claim of two: one walk each, in a transaction each.
	m.ExpectBegin()
	m.ExpectQuery(walkFirst).WithoutArgs().WillReturnRows(atLevel(walkFirst, "id,attempt,payload", row(int64(12), int64(1), nil)))
	m.ExpectBegin()
	m.ExpectQuery(walkFirst).WithoutArgs().WillReturnRows(atLevel(walkFirst, "id,attempt,payload", row(int64(13), int64(2), nil)))
	two := claim(t, q, 2, 12, 13)
	m.Met(t)
	for _, d := range append(first, two...) {
		m.ExpectRollback()
		ok(t, "Release", d.Release(context.Background()))
	}
	// The walk ends with no row: rolled back, and the claim begins again
	// by PickFirst.
	m.ExpectBegin()
	m.ExpectQuery(walkFirst).WithoutArgs().WillReturnRows(atLevel(walkFirst, "id,attempt,payload"))
	m.ExpectRollback()
	m.ExpectBegin()
	m.ExpectQuery(pickFirst).WithArgs(10).WillReturnRows(atLevel(pickFirst, "id,attempt,payload", row(int64(500), int64(1), nil)))
	ds := claim(t, q, 1, 500)
	m.ExpectRollback()
	ok(t, "Release", ds[0].Release(context.Background()))
	m.Met(t)
	// 63 more claims go without the walk; one finds nothing at all.
	for k := int64(0); k < 63; k++ {
		m.ExpectBegin()
		if k == 30 {
			m.ExpectQuery(pickFirst).WithArgs(10).WillReturnRows(atLevel(pickFirst, "id,attempt,payload"))
			m.ExpectQuery(myRowLockPick).WithArgs(10).WillReturnRows(rows("id"))
			m.ExpectRollback()
			claim(t, q, 1)
			continue
		}
		m.ExpectQuery(pickFirst).WithArgs(10).WillReturnRows(atLevel(pickFirst, "id,attempt,payload", row(600+k, int64(1), nil)))
		ds := claim(t, q, 1, 600+k)
		m.ExpectRollback()
		ok(t, "Release", ds[0].Release(context.Background()))
	}
	m.ExpectBegin()
	m.ExpectQuery(walkFirst).WithoutArgs().WillReturnRows(atLevel(walkFirst, "id,attempt,payload", row(int64(700), int64(1), nil)))
	claim(t, q, 1, 700)
	m.Met(t)
}

// inbox.MariaDB's lease claim of one on the indexed table is one compound
// statement (Claim.WalkTake) that walks the primary key as Claim.WalkFirst
// does, marks the row it found, commits and returns it with the expiry it
// wrote. When it returns no row (its bound, a lease run out, an empty
// queue) the claim goes on in a transaction with Claim.SelectFreeOne and
// the reads after it, without Claim.WalkFirst; when those found a job, the
// 64 claims of one after it leave the walk out; then the walk again. A
// claim whose context ends within a second walks from the client
// (Claim.WalkFirst in its transaction). Claims of several, a shallow
// table, a priority and inbox.MySQL have no walk.
func TestMariaDBLeaseWalkFirst(t *testing.T) {
	const walkFirst = "SELECT `id`, `attempt`, `payload`, UTC_TIMESTAMP(6)" + mariaLevel + " FROM `jobs` FORCE INDEX (PRIMARY)" +
		" WHERE `locked_until` IS NULL AND (SELECT MAX(`locked_until`) FROM `jobs` WHERE `locked_until` <= UTC_TIMESTAMP(6)) IS NULL" +
		" ORDER BY `id` LIMIT 1 ROWS EXAMINED 32 FOR UPDATE SKIP LOCKED"
	const walkTake = "BEGIN NOT ATOMIC DECLARE inbox_id TYPE OF `jobs`.`id`; DECLARE inbox_attempt TYPE OF `jobs`.`attempt`;" +
		" DECLARE inbox_c0 TYPE OF `jobs`.`payload`;" +
		" DECLARE inbox_now DATETIME(6) DEFAULT UTC_TIMESTAMP(6); DECLARE inbox_until DATETIME(6) DEFAULT inbox_now + INTERVAL ? MICROSECOND;" +
		" DECLARE CONTINUE HANDLER FOR NOT FOUND SET inbox_id = NULL;" +
		" DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;" +
		" SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION;" +
		" SELECT j.`id`, j.`attempt`, j.`payload` INTO inbox_id, inbox_attempt, inbox_c0" +
		" FROM `jobs` j FORCE INDEX (PRIMARY) WHERE j.`locked_until` IS NULL" +
		" AND (SELECT MAX(k.`locked_until`) FROM `jobs` k WHERE k.`locked_until` <= inbox_now) IS NULL" +
		" ORDER BY j.`id` LIMIT 1 ROWS EXAMINED 32 FOR UPDATE SKIP LOCKED;" +
		" IF inbox_id IS NOT NULL THEN UPDATE `jobs` j SET j.`attempt` = j.`attempt` + 1, j.`locked_until` = inbox_until" +
		" WHERE j.`id` = inbox_id AND j.`attempt` = inbox_attempt AND j.`locked_until` IS NULL;" +
		" IF ROW_COUNT() <> 1 THEN SET inbox_id = NULL; END IF; END IF;" +
		" COMMIT; SELECT inbox_id, inbox_attempt, inbox_until, inbox_c0 FROM DUAL WHERE inbox_id IS NOT NULL; END"
	for _, c := range []struct {
		name string
		d    inbox.Dialect
		tb   inbox.Table
	}{
		{"a priority", inbox.MariaDB, inbox.Table{Name: "jobs", LockedUntil: "locked_until", Priority: "priority"}},
		{"a shallow table", inbox.MariaDB, inbox.Table{Name: "jobs", LockedUntil: "locked_until", Shallow: true}},
		{"inbox.MySQL", inbox.MySQL, leaseTable},
	} {
		st := newQueue(t, newMock(t), inbox.Config{Dialect: c.d, Table: c.tb}).Statements().Claim
		if st.WalkFirst.SQL != "" || st.WalkTake.SQL != "" {
			t.Errorf("Claim.WalkFirst or WalkTake with %s: %q, %q", c.name, st.WalkFirst.SQL, st.WalkTake.SQL)
		}
	}
	// With Config.Now the walk takes the time as its one argument and
	// returns no clock; the compound statement takes now and the expiry.
	timed := newQueue(t, newMock(t), inbox.Config{Dialect: inbox.MariaDB, Table: leaseTable, Now: fakeclock.New(t0).Now}).Statements().Claim
	if want := strings.ReplaceAll(strings.Replace(walkFirst, ", UTC_TIMESTAMP(6)", "", 1), "UTC_TIMESTAMP(6)", "?"); timed.WalkFirst.SQL != want || timed.WalkFirst.Clock {
		t.Errorf("Claim.WalkFirst with Config.Now (Clock %v):\n got %s\nwant %s", timed.WalkFirst.Clock, timed.WalkFirst.SQL, want)
	}
	if want := strings.Replace(strings.Replace(walkTake, "DEFAULT UTC_TIMESTAMP(6)", "DEFAULT ?", 1), "DEFAULT inbox_now + INTERVAL ? MICROSECOND", "DEFAULT ?", 1); timed.WalkTake.SQL != want ||
		fmt.Sprint(timed.WalkTake.Args) != fmt.Sprint([]dialect.Arg{dialect.ArgNow, dialect.ArgUntil}) {
		t.Errorf("Claim.WalkTake with Config.Now (%v):\n got %s\nwant %s", timed.WalkTake.Args, timed.WalkTake.SQL, want)
	}
	// Every data column and the last error come back through a variable.
	errTable := leaseTable
	errTable.Data, errTable.LastError = []string{"payload", "kind"}, "last_error"
	withErr := newQueue(t, newMock(t), inbox.Config{Dialect: inbox.MariaDB, Table: errTable}).Statements().Claim.WalkTake.SQL
	for _, part := range []string{" DECLARE inbox_c1 TYPE OF `jobs`.`kind`; DECLARE inbox_c2 TYPE OF `jobs`.`last_error`;",
		"SELECT j.`id`, j.`attempt`, j.`payload`, j.`kind`, j.`last_error` INTO inbox_id, inbox_attempt, inbox_c0, inbox_c1, inbox_c2 FROM",
		"SELECT inbox_id, inbox_attempt, inbox_until, inbox_c0, inbox_c1, inbox_c2 FROM DUAL"} {
		if !strings.Contains(withErr, part) {
			t.Errorf("Claim.WalkTake with two data columns and a last error lacks %q:\n%s", part, withErr)
		}
	}

	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MariaDB, Table: leaseTable, Lease: time.Minute})
	st := q.Statements().Claim
	if st.WalkFirst.SQL != walkFirst || !st.WalkFirst.Clock {
		t.Fatalf("Claim.WalkFirst (Clock %v):\n got %s\nwant %s", st.WalkFirst.Clock, st.WalkFirst.SQL, walkFirst)
	}
	if st.WalkTake.SQL != walkTake || st.WalkTake.Clock || st.WalkTake.Level {
		t.Fatalf("Claim.WalkTake (Clock %v, Level %v):\n got %s\nwant %s", st.WalkTake.Clock, st.WalkTake.Level, st.WalkTake.SQL, walkTake)
	}
	const now, exp = "2024-03-01 12:00:00.123456", "2024-03-01 12:01:00.123456"
	const micros = int64(60000000)
	takeCols := "inbox_id,inbox_attempt,inbox_until,inbox_c0"
	// took expects the compound statement to claim id.
	took := func(id int64) {
		t.Helper()
		m.ExpectQuery(walkTake).WithArgs(micros).WillReturnRows(rows(takeCols, row(id, int64(1), []byte(exp), []byte("p"))))
		ds := claim(t, q, 1, id)
		if got := ds[0].Expiry().UTC().Format("2006-01-02 15:04:05.000000"); got != exp || ds[0].Attempt() != 1 {
			t.Errorf("job %d: expiry %s attempt %d, want %s and 1", id, got, ds[0].Attempt(), exp)
		}
	}
	cols := "id,attempt,payload,UTC_TIMESTAMP(6),level"
	at := func(id int64) []driver.Value { return row(id, int64(1), nil, []byte(now), int64(1)) }
	// claimed expects read (the walk, no arguments, where limit is 0) to
	// return ids, their mark and the commit, after whatever the caller
	// expected of the claim's transaction, and claims them.
	claimed := func(ctx context.Context, read string, limit int, ids ...int64) {
		t.Helper()
		var vals [][]driver.Value
		var pairs []int64
		for _, id := range ids {
			vals = append(vals, at(id))
			pairs = append(pairs, id, 1)
		}
		e := m.ExpectQuery(read)
		if limit == 0 {
			e.WithoutArgs()
		} else {
			e.WithArgs(limit)
		}
		e.WillReturnRows(rows(cols, vals...))
		if len(ids) == 1 {
			m.ExpectExec(myLeaseMarkOne).WithArgs(markOneArgs(exp, ids[0], 1)...).WillReturnResult(affected(1))
		} else {
			m.ExpectExec(myLeaseMark).WithArgs(markArgs(exp, pairs...)...).WillReturnResult(affected(int64(len(ids))))
		}
		m.ExpectCommit()
		claimCtx(t, ctx, q, len(ids), ids...)
	}
	bg := context.Background()
	took(7)
	// A claim of two reads through SelectFree, as inbox.MySQL's does.
	m.ExpectBegin()
	claimed(bg, st.SelectFree.SQL, 2, 8, 9)
	m.Met(t)
	// The compound statement claims nothing and the queue is empty: the
	// claim reads in a transaction, without the walk, and the next claim
	// is the compound statement again.
	m.ExpectQuery(walkTake).WithArgs(micros).WillReturnRows(rows(takeCols))
	m.ExpectBegin()
	m.ExpectQuery(st.SelectFreeOne.SQL).WithArgs(1).WillReturnRows(rows(cols))
	m.ExpectQuery(st.Select.SQL).WithArgs(1).WillReturnRows(rows(cols))
	m.ExpectQuery(st.SelectMoreOne.SQL).WithArgs(1).WillReturnRows(rows(cols))
	m.ExpectCommit()
	claim(t, q, 1)
	took(10)
	m.Met(t)
	// missed expects the compound statement to claim nothing and the
	// reads after it to find id.
	missed := func(id int64) {
		t.Helper()
		m.ExpectQuery(walkTake).WithArgs(micros).WillReturnRows(rows(takeCols))
		m.ExpectBegin()
		m.ExpectQuery(st.SelectFreeOne.SQL).WithArgs(1).WillReturnRows(rows(cols))
		m.ExpectQuery(st.Select.SQL).WithArgs(1).WillReturnRows(rows(cols))
		claimed(bg, st.SelectMoreOne.SQL, 1, id)
	}
	// It claims nothing where the reads find a job. Once may be a job
	// enqueued between the two: the next claim walks again, and a walk
	// that claims starts the count again.
	missed(497)
	took(498)
	missed(499)
	m.Met(t)
	// Twice running (its bound, a lease run out): the 64 claims of one
	// after it go without the walk; one finds nothing. A claim of
	// several spends none of the span.
	missed(500)
	m.Met(t)
	for k := int64(0); k < 64; k++ {
		if k == 30 {
			m.ExpectBegin()
			m.ExpectQuery(st.SelectFreeOne.SQL).WithArgs(1).WillReturnRows(rows(cols))
			m.ExpectQuery(st.Select.SQL).WithArgs(1).WillReturnRows(rows(cols))
			m.ExpectQuery(st.SelectMoreOne.SQL).WithArgs(1).WillReturnRows(rows(cols))
			m.ExpectCommit()
			claim(t, q, 1)
			continue
		}
		if k == 40 {
			m.ExpectBegin()
			claimed(bg, st.SelectFree.SQL, 2, 650, 651)
		}
		m.ExpectBegin()
		claimed(bg, st.SelectFreeOne.SQL, 1, 600+k)
	}
	took(700)
	m.Met(t)
	// A claim whose context ends within a second walks from the client.
	soon, cancel := context.WithTimeout(bg, 999*time.Millisecond)
	defer cancel()
	m.ExpectBegin()
	claimed(soon, walkFirst, 0, 701)
	// An error of the compound statement is the claim's: nothing else is
	// sent.
	m.ExpectQuery(walkTake).WithArgs(micros).WillReturnError(errors.New("boom"))
	if ds, err := q.Claim(bg, 1); err == nil || !strings.Contains(err.Error(), "boom") || len(ds) != 0 {
		t.Errorf("Claim(1) with the statement failing = %d jobs, %v; want its error", len(ds), err)
	}
	m.Met(t)
}

// inbox.MariaDB's row-lock claim sends Claim.PickFirst, one statement
// where inbox.MySQL sends Pick then PickLock, when the walk is left out
// (here: for the 64 claims after one that found nothing); when its page
// holds no free row the claim picks as inbox.MySQL's does. The page passes
// the rows this queue holds: 10 candidates, then 11 with one delivery
// held. A pick that found a job past a page PickFirst found held (other
// processes' jobs at the head) leaves PickFirst out for the next 64
// claims.
func TestMariaDBRowLockPickFirst(t *testing.T) {
	pickLock := mariaRead(myRowLockPickLock)
	const pickFirst = "SELECT `id`, `attempt`, `payload`" + mariaLevel + " FROM (SELECT `id` AS inbox_pick FROM `jobs` WHERE (`not_before` IS NULL OR `not_before` <= UTC_TIMESTAMP(6)) ORDER BY `id` LIMIT ?) AS pg" +
		" STRAIGHT_JOIN `jobs` FORCE INDEX (PRIMARY) ON `id` = pg.inbox_pick WHERE (COALESCE(`not_before`) IS NULL OR COALESCE(`not_before`) <= UTC_TIMESTAMP(6))" +
		" ORDER BY pg.inbox_pick LIMIT 1 FOR UPDATE SKIP LOCKED"
	// With a priority the page carries it, and is sorted by it first.
	const pickFirstPriority = "SELECT `id`, `attempt`, `payload`, `priority`" + mariaLevel + " FROM (SELECT `id` AS inbox_pick, `priority` AS inbox_priority FROM `jobs` WHERE (`not_before` IS NULL OR `not_before` <= UTC_TIMESTAMP(6)) ORDER BY `priority` DESC, `id` LIMIT ?) AS pg" +
		" STRAIGHT_JOIN `jobs` FORCE INDEX (PRIMARY) ON `id` = pg.inbox_pick WHERE (COALESCE(`not_before`) IS NULL OR COALESCE(`not_before`) <= UTC_TIMESTAMP(6))" +
		" ORDER BY pg.inbox_priority DESC, pg.inbox_pick LIMIT 1 FOR UPDATE SKIP LOCKED"
	prio := rowLockTable
	prio.Priority = "priority"
	if got := newQueue(t, newMock(t), inbox.Config{Dialect: inbox.MariaDB, Table: prio}).Statements().Claim.PickFirst.SQL; got != pickFirstPriority {
		t.Errorf("Claim.PickFirst with a priority:\n got %s\nwant %s", got, pickFirstPriority)
	}
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MariaDB, Table: rowLockTable})
	if got := q.Statements().Claim.PickFirst.SQL; got != pickFirst {
		t.Fatalf("Claim.PickFirst:\n got %s\nwant %s", got, pickFirst)
	}
	walkFirst := q.Statements().Claim.WalkFirst.SQL
	m.ExpectBegin()
	m.ExpectQuery(walkFirst).WithoutArgs().WillReturnRows(atLevel(walkFirst, "id,attempt,payload"))
	m.ExpectRollback()
	m.ExpectBegin()
	m.ExpectQuery(pickFirst).WithArgs(10).WillReturnRows(atLevel(pickFirst, "id,attempt,payload", row(int64(11), int64(1), []byte("a"))))
	claim(t, q, 1, 11)
	m.Met(t)
	// The page's rows all held: the claim picks, from the first page on.
	m.ExpectBegin()
	m.ExpectQuery(pickFirst).WithArgs(11).WillReturnRows(atLevel(pickFirst, "id,attempt,payload"))
	m.ExpectQuery(myRowLockPick).WithArgs(11).WillReturnRows(rows("id", row(int64(12))))
	var lockArgs []driver.Value
	for k := 0; k < 32; k++ {
		lockArgs = append(lockArgs, int64(12))
	}
	m.ExpectQuery(pickLock).WithArgs(append(lockArgs, 1)...).WillReturnRows(atLevel(pickFirst, "id,attempt,payload", row(int64(12), int64(1), nil)))
	second := claim(t, q, 1, 12)
	m.Met(t)
	m.ExpectRollback()
	ok(t, "Release", second[0].Release(context.Background()))
	// 64 claims pick (one delivery held: pages of 11), then PickFirst
	// again. The walk's span, from its miss two claims ago, ends first:
	// the last two of the 64 walk, and count nothing against the pick's.
	pickClaim := func(id int64) {
		t.Helper()
		m.ExpectQuery(myRowLockPick).WithArgs(11).WillReturnRows(rows("id", row(id)))
		lockArgs = lockArgs[:0]
		for i := 0; i < 32; i++ {
			lockArgs = append(lockArgs, id)
		}
		m.ExpectQuery(pickLock).WithArgs(append(lockArgs, 1)...).WillReturnRows(atLevel(pickFirst, "id,attempt,payload", row(id, int64(1), nil)))
	}
	for k := int64(0); k < 64; k++ {
		m.ExpectBegin()
		if k < 62 {
			pickClaim(100 + k)
		} else {
			m.ExpectQuery(walkFirst).WithoutArgs().WillReturnRows(atLevel(walkFirst, "id,attempt,payload", row(100+k, int64(1), nil)))
		}
		ds := claim(t, q, 1, 100+k)
		m.ExpectRollback()
		ok(t, "Release", ds[0].Release(context.Background()))
	}
	m.Met(t)
	m.ExpectBegin()
	m.ExpectQuery(walkFirst).WithoutArgs().WillReturnRows(atLevel(walkFirst, "id,attempt,payload"))
	m.ExpectRollback()
	for k := int64(0); k < 2; k++ {
		m.ExpectBegin()
		pickClaim(300 + k)
		ds := claim(t, q, 1, 300+k)
		m.ExpectRollback()
		ok(t, "Release", ds[0].Release(context.Background()))
	}
	m.ExpectBegin()
	m.ExpectQuery(pickFirst).WithArgs(11).WillReturnRows(atLevel(pickFirst, "id,attempt,payload", row(int64(200), int64(1), nil)))
	claim(t, q, 1, 200)
	m.Met(t)
}

// With a priority, a MySQL lease claim picks: the due and the free
// candidates, read without locks, merged in claim order (priority, then
// id), locked a priority at a time in id order, so that each lock stops at
// the rows it returns; the deliveries come in claim order.
func TestMySQLLeasePick(t *testing.T) {
	m := newMock(t)
	clk := fakeclock.New(t0)
	tb := leaseTable
	tb.Priority = "priority"
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: tb, Lease: time.Minute, Now: clk.Now})
	const (
		now  = "2024-03-01 12:00:00.123456"
		exp  = "2024-03-01 12:01:00.123456"
		due  = "SELECT `id`, `priority` FROM `jobs` WHERE `locked_until` <= ? ORDER BY `priority` DESC, `id` LIMIT ?"
		free = "SELECT `id`, `priority` FROM `jobs` WHERE `locked_until` IS NULL ORDER BY `priority` DESC, `id` LIMIT ?"
		lock = "SELECT `id`, `attempt`, `payload`, `priority` FROM `jobs` WHERE `id` IN (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) AND (COALESCE(`locked_until`) IS NULL OR COALESCE(`locked_until`) <= ?) ORDER BY `id` LIMIT ? FOR UPDATE SKIP LOCKED"
	)
	lockArgs := func(limit int, ids ...int64) []driver.Value {
		var out []driver.Value
		for k := 0; k < 32; k++ {
			out = append(out, ids[min(k, len(ids)-1)])
		}
		return append(out, now, limit)
	}
	m.ExpectBegin()
	m.ExpectQuery(due).WithArgs(now, 14).WillReturnRows(rows("id,priority", row(int64(5), int64(10)), row(int64(9), int64(0))))
	m.ExpectQuery(free).WithArgs(14).WillReturnRows(rows("id,priority", row(int64(2), int64(10)), row(int64(3), int64(5)), row(int64(4), int64(5))))
	// Job 2 is another claim's by now.
	m.ExpectQuery(lock).WithArgs(lockArgs(3, 2, 5)...).WillReturnRows(rows("id,attempt,payload,priority", row(int64(5), int64(1), nil, int64(10))))
	m.ExpectQuery(lock).WithArgs(lockArgs(2, 3, 4)...).WillReturnRows(rows("id,attempt,payload,priority",
		row(int64(3), int64(1), nil, int64(5)), row(int64(4), int64(2), nil, int64(5))))
	m.ExpectExec(myLeaseMark).WithArgs(markArgs(exp, 5, 1, 3, 1, 4, 2)...).WillReturnResult(affected(3))
	m.ExpectCommit()
	claim(t, q, 3, 5, 3, 4)
	m.Met(t)
}

func TestMySQLRowLockInjectedClock(t *testing.T) {
	m := newMock(t)
	clk := fakeclock.New(t0)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: rowLockTable, Now: clk.Now})
	m.ExpectBegin()
	myRowLockPicks(m, "2024-03-01 12:00:00.123456", 10, []int64{7}, rows("id,attempt,payload", row(int64(7), int64(1), nil)))
	d := claim(t, q, 1, 7)[0]
	clk.Advance(time.Second)
	m.ExpectExec(myRowLockRetry).WithArgs("2024-03-01 12:00:31.123456", int64(7)).WillReturnResult(affected(1))
	m.ExpectCommit()
	ok(t, "Retry", d.Retry(context.Background(), 30*time.Second))
	m.Met(t)
}

// The claims counter: the held transaction takes the row (SELECT … FOR
// UPDATE SKIP LOCKED, then the attempt), then a second session counts the
// delivery in the side table and reads the count back. When more than
// MaxClaims deliveries before this one ended unsettled, the job goes to the
// dead table through the held transaction, which clears the count and
// commits.
func TestMySQLClaimsCounter(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: claimsTable})
	cols := "id,attempt,payload"
	count := func(id, claims int64) {
		// A first count inserts (1 row); later ones update (2 rows).
		n := int64(2)
		if claims == 1 {
			n = 1
		}
		m.ExpectExec(myClaimsCount).WithArgs(id).WillReturnResult(affected(n))
		m.ExpectQuery(myClaimsRead).WithArgs(id).WillReturnRows(rows("claims", row(claims)))
	}
	m.ExpectBegin()
	myRowLockPicks(m, "", 10, []int64{7, 8}, rows(cols, row(int64(7), int64(1), []byte("p7"))))
	count(7, 1)
	// Job 8's fifth delivery: four before it ended unsettled, more than
	// MaxClaims 3.
	m.ExpectBegin()
	myRowLockPicks(m, "", 11, []int64{8}, rows(cols, row(int64(8), int64(5), []byte("p8"))))
	count(8, 5)
	m.ExpectExec(myRowLockDeadInsert).WithArgs(int64(5), int64(8)).WillReturnResult(affected(1))
	m.ExpectExec(myRowLockAck).WithArgs(int64(8)).WillReturnResult(affected(1))
	m.ExpectExec(myClaimsClear).WithArgs(int64(8)).WillReturnResult(affected(1))
	m.ExpectCommit()
	m.ExpectBegin()
	myRowLockPicks(m, "", 11, nil, nil)
	m.ExpectRollback()
	ds := claim(t, q, 2, 7)
	for i, l := range m.Isolations() {
		if l != sql.LevelReadCommitted {
			t.Errorf("transaction %d: isolation %v, want READ COMMITTED", i, l)
		}
	}
	on := m.Since(t, 0,
		"begin", "query "+myRowLockPick, "query "+myRowLockPickLock, "exec "+myClaimsCount, "query "+myClaimsRead,
		"begin", "query "+myRowLockPick, "query "+myRowLockPickLock, "exec "+myClaimsCount, "query "+myClaimsRead,
		"exec "+myRowLockDeadInsert, "exec "+myRowLockAck, "exec "+myClaimsClear, "commit",
		"begin", "query "+myRowLockPick, "rollback")
	for _, c := range [][2]int{{0, 3}, {0, 4}, {5, 8}, {5, 9}} {
		if on[c[0]] == on[c[1]] {
			t.Errorf("connections %v: the count ran on the held transaction's connection", on)
		}
	}
	for _, i := range []int{6, 7, 10, 11, 12, 13} {
		if on[i] != on[5] {
			t.Errorf("connections %v: job 8's claim and dead move ran apart from its transaction", on)
		}
	}
	// The claim wrote nothing: the Retry counts the attempt.
	myClock(m, "2024-03-01 12:00:00.123456")
	m.ExpectExec(myRowLockRetry).WithArgs("2024-03-01 12:00:00.123456", int64(7)).WillReturnResult(affected(1))
	m.ExpectExec(myClaimsClear).WithArgs(int64(7)).WillReturnResult(affected(1))
	m.ExpectCommit()
	ok(t, "Retry", ds[0].Retry(context.Background(), 0))
	m.Met(t)
}

// Release gives the count back from a second session before it rolls back;
// a count whose read-back fails is given back and its transaction rolled
// back, and the claim fails.
func TestMySQLClaimsCounterInjectedClock(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: claimsTable, Now: fakeclock.New(t0).Now})
	const now = "2024-03-01 12:00:00.123456"
	m.ExpectBegin()
	myRowLockPicks(m, now, 10, []int64{7}, rows("id,attempt,payload", row(int64(7), int64(1), nil)))
	m.ExpectExec(myClaimsCount).WithArgs(int64(7)).WillReturnResult(affected(2))
	m.ExpectQuery(myClaimsRead).WithArgs(int64(7)).WillReturnRows(rows("claims", row(int64(2))))
	d := claim(t, q, 1, 7)[0]
	held := m.Since(t, 0, "begin", "query "+myRowLockPickInjected, "query "+myRowLockPickLockInjected, "exec "+myClaimsCount, "query "+myClaimsRead)[0]
	n := m.Sent()
	m.ExpectBegin()
	m.ExpectExec(myClaimsGiveBack).WithArgs(int64(7)).WillReturnResult(affected(1))
	m.ExpectRollback()
	m.ExpectCommit()
	ok(t, "Release", d.Release(context.Background()))
	if on := m.Since(t, n, "begin", "exec "+myClaimsGiveBack, "rollback", "commit"); on[1] == held || on[2] != held || on[3] != on[1] {
		t.Errorf("give-back on connection %d (committed on %d), rollback on %d; want the give-back apart from the held transaction's %d", on[1], on[3], on[2], held)
	}

	errDown := errors.New("invalid connection")
	m.ExpectBegin()
	myRowLockPicks(m, now, 10, []int64{7}, rows("id,attempt,payload", row(int64(7), int64(1), nil)))
	m.ExpectExec(myClaimsCount).WithArgs(int64(7)).WillReturnResult(affected(2))
	m.ExpectQuery(myClaimsRead).WithArgs(int64(7)).WillReturnError(errDown)
	m.ExpectExec(myClaimsGiveBack).WithArgs(int64(7)).WillReturnResult(affected(1))
	m.ExpectRollback()
	if ds, err := q.Claim(context.Background(), 1); !errors.Is(err, errDown) || ds != nil {
		t.Fatalf("Claim with a failed count = %v, %v; want the driver's error", ds, err)
	}
	if q.InWork() != 0 {
		t.Errorf("InWork() = %d", q.InWork())
	}
	m.Met(t)
}

func TestMySQLAdvisory(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: advisoryTable})
	cols := "id,attempt,payload"
	myIdent(m, "", "jobs")
	m.ExpectQuery(myAdvCandidates).WithArgs(12).WillReturnRows(rows("id,id,attempt",
		row(int64(1), int64(1), int64(1)), row(int64(2), int64(2), int64(1)), row(int64(3), int64(3), int64(1)), row(int64(4), int64(4), int64(1))))
	myLocked(m, "1", 0) // another session holds it
	myLocked(m, "2", 1)
	m.ExpectQuery(myAdvSelect).WithArgs(int64(2), int64(1)).WillReturnRows(rows(cols, row(int64(2), int64(1), nil)))
	m.ExpectExec(myAdvMark).WithArgs(int64(2), int64(1)).WillReturnResult(affected(0)) // its attempt moved on
	myUnlocked(m, "2")
	// A row gone under its lock: the page is stale, and read afresh (key 1
	// passed over now, found held elsewhere on the same row).
	m.ExpectQuery(myAdvCandidates).WithArgs(12).WillReturnRows(rows("id,id,attempt",
		row(int64(1), int64(1), int64(1)), row(int64(3), int64(3), int64(1)), row(int64(4), int64(4), int64(1))))
	myLocked(m, "3", 1)
	m.ExpectQuery(myAdvSelect).WithArgs(int64(3), int64(1)).WillReturnRows(rows(cols)) // settled meanwhile
	myUnlocked(m, "3")
	m.ExpectQuery(myAdvCandidates).WithArgs(12).WillReturnRows(rows("id,id,attempt",
		row(int64(1), int64(1), int64(1)), row(int64(4), int64(4), int64(1))))
	myLocked(m, "4", 1)
	m.ExpectQuery(myAdvSelect).WithArgs(int64(4), int64(1)).WillReturnRows(rows(cols, row(int64(4), int64(1), []byte("p4"))))
	m.ExpectExec(myAdvMark).WithArgs(int64(4), int64(1)).WillReturnResult(affected(1))
	ds := claim(t, q, 2, 4)
	m.ExpectExec(myAdvAck).WithArgs(int64(4), int64(2)).WillReturnResult(affected(1))
	myUnlocked(m, "4")
	ok(t, "Ack", ds[0].Ack(context.Background()))

	m.ExpectQuery(myAdvCandidates).WithArgs(16).WillReturnRows(rows("id,id,attempt",
		row(int64(5), int64(5), int64(1)), row(int64(6), int64(6), int64(1)), row(int64(7), int64(7), int64(1)), row(int64(8), int64(8), int64(1))))
	for id := int64(5); id <= 8; id++ {
		myLocked(m, fmt.Sprint(id), 1)
		m.ExpectQuery(myAdvSelect).WithArgs(id, int64(1)).WillReturnRows(rows(cols, row(id, int64(1), nil)))
		m.ExpectExec(myAdvMark).WithArgs(id, int64(1)).WillReturnResult(affected(1))
	}
	ds = claim(t, q, 4, 5, 6, 7, 8)
	// The clock is read on the pinned connection.
	myClock(m, []byte("2024-03-01 12:00:00.123456"))
	m.ExpectExec(myAdvRetry).WithArgs("2024-03-01 12:00:30.123456", int64(5), int64(2)).WillReturnResult(affected(1))
	myUnlocked(m, "5")
	ok(t, "Retry", ds[0].Retry(context.Background(), 30*time.Second))
	myUnlocked(m, "6")
	ok(t, "Retry(0)", ds[1].Retry(context.Background(), 0))
	m.ExpectExec(myAdvRelease).WithArgs(int64(7), int64(2)).WillReturnResult(affected(1))
	myUnlocked(m, "7")
	ok(t, "Release", ds[2].Release(context.Background()))
	m.ExpectBegin()
	m.ExpectExec(myAdvDeadInsert).WithArgs(int64(1), int64(8), int64(2)).WillReturnResult(affected(1))
	m.ExpectExec(myAdvAck).WithArgs(int64(8), int64(2)).WillReturnResult(affected(1))
	m.ExpectCommit()
	myUnlocked(m, "8")
	ok(t, "Dead", ds[3].Dead(context.Background()))
	m.Met(t)
}

func TestMySQLAdvisoryInjectedClock(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: advisoryTable, Now: fakeclock.New(t0).Now})
	const now = "2024-03-01 12:00:00.123456"
	myIdent(m, "", "jobs")
	m.ExpectQuery(myAdvCandidatesInjected).WithArgs(now, 10).WillReturnRows(rows("id,id,attempt", row(int64(3), int64(3), int64(1))))
	myLocked(m, "3", 1)
	m.ExpectQuery(myAdvSelectInjected).WithArgs(int64(3), int64(1), now).WillReturnRows(rows("id,attempt,payload", row(int64(3), int64(1), nil)))
	m.ExpectExec(myAdvMarkInjected).WithArgs(int64(3), int64(1), now).WillReturnResult(affected(1))
	d := claim(t, q, 1, 3)[0]
	m.ExpectExec(myAdvRetry).WithArgs("2024-03-01 12:00:30.123456", int64(3), int64(2)).WillReturnResult(affected(1))
	myUnlocked(m, "3")
	ok(t, "Retry", d.Retry(context.Background(), 30*time.Second))
	m.SameConn(t, myGetLock, myAdvSelectInjected, myAdvMarkInjected, myAdvRetry, myReleaseLock)
	m.Met(t)
}

// A Retry writing the not-before time the row already holds (a stopped
// clock) changes no row, which MySQL reports as none affected: the token is
// counted before the settlement is read as lost, and only a count of zero
// is one.
func TestMySQLAdvisoryRetrySameTime(t *testing.T) {
	const exists = "SELECT COUNT(*) FROM `jobs` WHERE `id` = ? AND `attempt` = ?"
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: advisoryTable, Now: fakeclock.New(t0).Now})
	const now = "2024-03-01 12:00:00.123456"
	myIdent(m, "", "jobs")
	m.ExpectQuery(myAdvCandidatesInjected).WithArgs(now, 12).WillReturnRows(rows("id,id,attempt",
		row(int64(3), int64(3), int64(1)), row(int64(4), int64(4), int64(1))))
	for _, id := range []int64{3, 4} {
		myLocked(m, strconv.FormatInt(id, 10), 1)
		m.ExpectQuery(myAdvSelectInjected).WithArgs(id, int64(1), now).WillReturnRows(rows("id,attempt,payload", row(id, int64(1), nil)))
		m.ExpectExec(myAdvMarkInjected).WithArgs(id, int64(1), now).WillReturnResult(affected(1))
	}
	ds := claim(t, q, 2, 3, 4)
	m.ExpectExec(myAdvRetry).WithArgs("2024-03-01 12:00:30.123456", int64(3), int64(2)).WillReturnResult(affected(0))
	m.ExpectQuery(exists).WithArgs(int64(3), int64(2)).WillReturnRows(rows("n", row(int64(1))))
	myUnlocked(m, "3")
	ok(t, "Retry writing the time the row holds", ds[0].Retry(context.Background(), 30*time.Second))
	m.ExpectExec(myAdvRetry).WithArgs("2024-03-01 12:00:30.123456", int64(4), int64(2)).WillReturnResult(affected(0))
	m.ExpectQuery(exists).WithArgs(int64(4), int64(2)).WillReturnRows(rows("n", row(int64(0))))
	myUnlocked(m, "4")
	if err := ds[1].Retry(context.Background(), 30*time.Second); !errors.Is(err, inbox.ErrLeaseLost) {
		t.Fatalf("Retry of a row gone: %v, want ErrLeaseLost", err)
	}
	m.Met(t)
}

// A first page whose keys other sessions all hold does not end the claim:
// the next page, past its last id and twice as long, finds the job.
// "jobs" and "test.jobs" resolve to one table, whose identity names the
// locks.
func TestMySQLAdvisoryPages(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: inbox.Table{Name: "test.jobs", AdvisoryKey: "id", NotBefore: "not_before"}, Now: fakeclock.New(t0).Now})
	const (
		now        = "2024-03-01 12:00:00.123456"
		candidates = "SELECT `id`, `id`, `attempt` FROM `test`.`jobs` WHERE (`not_before` IS NULL OR `not_before` <= ?) ORDER BY `id` LIMIT ?"
		after      = "SELECT `id`, `id`, `attempt` FROM `test`.`jobs` WHERE `id` > ? AND (`not_before` IS NULL OR `not_before` <= ?) ORDER BY `id` LIMIT ?"
		sel        = "SELECT `id`, `attempt`, `payload` FROM `test`.`jobs` WHERE `id` = ? AND `attempt` = ? AND (`not_before` IS NULL OR `not_before` <= ?)"
		mark       = "UPDATE `test`.`jobs` SET `attempt` = `attempt` + 1 WHERE `id` = ? AND `attempt` = ? AND (`not_before` IS NULL OR `not_before` <= ?)"
	)
	myIdent(m, "test", "jobs")
	page := rows("id,id,attempt")
	for id := int64(1); id <= 9; id++ {
		page.AddRow(id, id, int64(1))
	}
	page.AddRow(int64(10), int64(9), int64(1)) // key 9 again: not tried twice
	m.ExpectQuery(candidates).WithArgs(now, 10).WillReturnRows(page)
	for id := 1; id <= 9; id++ {
		myLocked(m, fmt.Sprint(id), 0)
	}
	m.ExpectQuery(after).WithArgs(int64(10), now, 20).WillReturnRows(rows("id,id,attempt", row(int64(11), int64(11), int64(2))))
	m.ExpectQuery(myGetLock).WithArgs(inbox.MySQLLockName("test.jobs", "11")).WillReturnRows(rows("got", row(int64(1))))
	m.ExpectQuery(sel).WithArgs(int64(11), int64(2), now).WillReturnRows(rows("id,attempt,payload", row(int64(11), int64(2), nil)))
	m.ExpectExec(mark).WithArgs(int64(11), int64(2), now).WillReturnResult(affected(1))
	d := claim(t, q, 1, 11)[0]
	m.ExpectExec("DELETE FROM `test`.`jobs` WHERE `id` = ? AND `attempt` = ?").WithArgs(int64(11), int64(3)).WillReturnResult(affected(1))
	m.ExpectQuery(myReleaseLock).WithArgs(inbox.MySQLLockName("test.jobs", "11")).WillReturnRows(rows("released", row(int64(1))))
	ok(t, "Ack", d.Ack(context.Background()))
	m.Met(t)
}

// A candidate whose row this queue deleted after the page was read (its
// Ack ran meanwhile) is passed over without a lock call: its lock would be
// free and its re-read empty. A page read after the Ack tries the id again,
// as a later row may carry it (SQLite reuses the highest).
func TestMySQLAdvisoryPassesOverAcked(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: advisoryTable})
	myIdent(m, "", "jobs")
	m.ExpectQuery(myAdvCandidates).WithArgs(10).WillReturnRows(rows("id,id,attempt", row(int64(4), int64(4), int64(1))))
	myAdvClaimed(m, 4)
	d4 := claim(t, q, 1, 4)[0]

	// The page is read with job 4 still in it; job 4 is acked before the
	// walk reaches it.
	m.ExpectQuery(myAdvCandidates).WithArgs(11).WillReturnRows(rows("id,id,attempt",
		row(int64(4), int64(4), int64(1)), row(int64(5), int64(5), int64(1))))
	m.ExpectExec(myAdvAck).WithArgs(int64(4), int64(2)).WillReturnResult(affected(1))
	myUnlocked(m, "4")
	m.After("query "+myAdvCandidates, func() { ok(t, "Ack", d4.Ack(context.Background())) })
	myAdvClaimed(m, 5) // the mock takes no GET_LOCK of key 4 before this one
	claim(t, q, 1, 5)

	// A page read after the Ack: id 4 is tried again.
	m.ExpectQuery(myAdvCandidates).WithArgs(11).WillReturnRows(rows("id,id,attempt", row(int64(4), int64(4), int64(1))))
	myAdvClaimed(m, 4)
	claim(t, q, 1, 4)
	m.Met(t)
}

// myAdvClaimed expects the claim of candidate id at attempt 1: its key
// locked, the row read under the lock, its attempt counted.
func myAdvClaimed(m *mock, id int64) {
	myLocked(m, fmt.Sprint(id), 1)
	m.ExpectQuery(myAdvSelect).WithArgs(id, int64(1)).WillReturnRows(rows("id,attempt,payload", row(id, int64(1), nil)))
	m.ExpectExec(myAdvMark).WithArgs(id, int64(1)).WillReturnResult(affected(1))
}

// myAdvPage is a page of advisory candidates keyed by their ids, each at
// attempt 1.
func myAdvPage(ids ...int64) *sqlmock.Rows {
	r := rows("id,id,attempt")
	for _, id := range ids {
		r.AddRow(id, id, int64(1))
	}
	return r
}

// A key found locked by another session (another process's worker) is
// passed over by this queue's claims for HeldFor without a lock call, then
// tried again: with workers in several processes, the head of each page is
// mostly keys the others hold.
func TestMySQLAdvisoryPassesOverHeldElsewhere(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: advisoryTable})
	clock := time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC)
	inbox.SetHeldClock(q, func() time.Time { return clock })
	myIdent(m, "", "jobs")
	m.ExpectQuery(myAdvCandidates).WithArgs(10).WillReturnRows(myAdvPage(1, 2, 3))
	myLocked(m, "1", 0)
	myLocked(m, "2", 0)
	myAdvClaimed(m, 3)
	claim(t, q, 1, 3)

	// Keys 1 and 2 are still held elsewhere as far as this queue knows.
	m.ExpectQuery(myAdvCandidates).WithArgs(11).WillReturnRows(myAdvPage(1, 2, 4))
	myAdvClaimed(m, 4)
	claim(t, q, 1, 4)
	clock = clock.Add(inbox.HeldFor - time.Nanosecond)
	m.ExpectQuery(myAdvCandidates).WithArgs(12).WillReturnRows(myAdvPage(1, 2))
	claim(t, q, 1)

	// HeldFor after the failed lock, key 1 is tried again (and taken).
	clock = clock.Add(time.Nanosecond)
	m.ExpectQuery(myAdvCandidates).WithArgs(12).WillReturnRows(myAdvPage(1))
	myAdvClaimed(m, 1)
	claim(t, q, 1, 1)
	m.Met(t)
}

// A key whose lock this process is letting go of (the set dropped it, the
// session's unlock still on its way) fails a lock call of another of its
// workers: that is no holder elsewhere, and the next claim tries it again
// at once. Passing it over would leave a loop that waits for wake-ups
// without the job its own settlement just woke it for.
func TestMySQLAdvisoryTriesAgainKeyLetGoHere(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: advisoryTable})
	inbox.SetHeldClock(q, func() time.Time { return time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC) })
	myIdent(m, "", "jobs")
	m.ExpectQuery(myAdvCandidates).WithArgs(10).WillReturnRows(myAdvPage(2))
	myAdvClaimed(m, 2)
	claim(t, q, 1, 2)

	unlinger := inbox.Linger(q, "1")
	m.ExpectQuery(myAdvCandidates).WithArgs(11).WillReturnRows(myAdvPage(1))
	myLocked(m, "1", 0)
	claim(t, q, 1)
	unlinger()
	m.ExpectQuery(myAdvCandidates).WithArgs(11).WillReturnRows(myAdvPage(1))
	myAdvClaimed(m, 1)
	claim(t, q, 1, 1)
	m.Met(t)

	// A key another pool of this process holds (a second *sql.DB on the
	// database) fails the lock call as well: its own loops are woken when
	// it is let go, and this queue's next claim tries it too.
	m2 := newMock(t)
	q2 := newQueue(t, m2, inbox.Config{Dialect: inbox.MySQL, Table: advisoryTable})
	myIdent(m2, "", "jobs")
	m2.ExpectQuery(myAdvCandidates).WithArgs(10).WillReturnRows(myAdvPage(3))
	myAdvClaimed(m2, 3)
	claim(t, q2, 1, 3)
	for i := 0; i < 2; i++ {
		m.ExpectQuery(myAdvCandidates).WithArgs(12).WillReturnRows(myAdvPage(3))
		myLocked(m, "3", 0)
		claim(t, q, 1)
	}
	m.Met(t)
	m2.Met(t)
}

// Both statements of the claim under the lock require the candidate's
// attempt and the row's readiness. A RetryTx(1h) whose transaction commits
// between the candidate read and the claim is honoured: the locking UPDATE
// waits for that commit and then finds the row not ready, so the job is
// passed over and its lock let go. So is a row whose attempt moved on.
func TestMySQLAdvisoryAttemptCheck(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: advisoryTable})
	myIdent(m, "", "jobs")
	m.ExpectQuery(myAdvCandidates).WithArgs(10).WillReturnRows(rows("id,id,attempt",
		row(int64(1), int64(1), int64(3)), row(int64(2), int64(2), int64(1)), row(int64(3), int64(3), int64(1))))
	myLocked(m, "1", 1)
	m.ExpectQuery(myAdvSelect).WithArgs(int64(1), int64(3)).WillReturnRows(rows("id,attempt,payload")) // at attempt 4 by now
	myUnlocked(m, "1")
	// Each miss sends the walk back to a fresh first page.
	m.ExpectQuery(myAdvCandidates).WithArgs(10).WillReturnRows(rows("id,id,attempt",
		row(int64(2), int64(2), int64(1)), row(int64(3), int64(3), int64(1))))
	myLocked(m, "2", 1)
	m.ExpectQuery(myAdvSelect).WithArgs(int64(2), int64(1)).WillReturnRows(rows("id,attempt,payload", row(int64(2), int64(1), nil)))
	m.ExpectExec(myAdvMark).WithArgs(int64(2), int64(1)).WillReturnResult(affected(0)) // delayed an hour meanwhile
	myUnlocked(m, "2")
	m.ExpectQuery(myAdvCandidates).WithArgs(10).WillReturnRows(rows("id,id,attempt", row(int64(3), int64(3), int64(1))))
	myLocked(m, "3", 1)
	m.ExpectQuery(myAdvSelect).WithArgs(int64(3), int64(1)).WillReturnRows(rows("id,attempt,payload", row(int64(3), int64(1), nil)))
	m.ExpectExec(myAdvMark).WithArgs(int64(3), int64(1)).WillReturnResult(affected(1))
	d := claim(t, q, 1, 3)[0]
	myUnlocked(m, "3")
	ok(t, "Retry(0)", d.Retry(context.Background(), 0))
	m.Met(t)
}

// MySQL has no INSERT … RETURNING: the id is LastInsertId, or the one given.
func TestMySQLEnqueue(t *testing.T) {
	m := newMock(t)
	leaseQ := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: leaseTable})
	rowQ := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: rowLockTable})
	ctx := context.Background()
	p := []byte("p")
	const later = "2024-03-01 13:00:00.123456"
	enqueue := func(q *inbox.Queue, ex inbox.Executor, job inbox.Job, want any) {
		t.Helper()
		id, err := q.Enqueue(ctx, ex, job)
		ok(t, "Enqueue", err)
		if id != want {
			t.Fatalf("Enqueue returned %#v, want %#v", id, want)
		}
	}
	m.ExpectExec("INSERT INTO `jobs` (`payload`) VALUES (?)").WithArgs(p).WillReturnResult(sqlmock.NewResult(41, 1))
	enqueue(leaseQ, m.DB, inbox.Job{Data: []any{p}}, int64(41))
	const uuid = "0190c0de-0000-7000-8000-000000000001"
	m.ExpectBegin()
	tx, err := m.DB.Begin()
	ok(t, "Begin", err)
	m.ExpectQuery("SELECT 1 FROM `dead_jobs` WHERE `id` = ?").WithArgs(uuid).WillReturnRows(rows("1"))
	m.ExpectExec("INSERT INTO `jobs` (`id`, `payload`) VALUES (?, ?)").WithArgs(uuid, p).WillReturnResult(sqlmock.NewResult(0, 1))
	enqueue(leaseQ, tx, inbox.Job{ID: uuid, Data: []any{p}}, uuid)
	m.ExpectCommit()
	ok(t, "Commit", tx.Commit())
	m.ExpectExec("INSERT INTO `jobs` (`payload`, `locked_until`) VALUES (?, ?)").WithArgs(p, later).WillReturnResult(sqlmock.NewResult(43, 1))
	enqueue(leaseQ, m.DB, inbox.Job{Data: []any{p}, NotBefore: t0.Add(time.Hour)}, int64(43))
	m.ExpectQuery("SELECT 1 FROM `dead_jobs` WHERE `id` = ?").WithArgs(int64(44)).WillReturnRows(rows("1"))
	m.ExpectExec("INSERT INTO `jobs` (`id`, `payload`, `locked_until`) VALUES (?, ?, ?)").WithArgs(int64(44), p, later).WillReturnResult(sqlmock.NewResult(44, 1))
	enqueue(leaseQ, m.DB, inbox.Job{ID: int64(44), Data: []any{p}, NotBefore: t0.Add(time.Hour)}, int64(44))
	m.ExpectExec("INSERT INTO `jobs` (`payload`, `not_before`) VALUES (?, ?)").WithArgs(p, later).WillReturnResult(sqlmock.NewResult(45, 1))
	enqueue(rowQ, m.DB, inbox.Job{Data: []any{p}, NotBefore: t0.Add(time.Hour)}, int64(45))
	m.ExpectQuery("SELECT 1 FROM `dead_jobs` WHERE `id` = ?").WithArgs(int64(46)).WillReturnRows(rows("1"))
	m.ExpectExec("INSERT INTO `jobs` (`id`, `payload`, `not_before`) VALUES (?, ?, ?)").WithArgs(int64(46), p, later).WillReturnResult(sqlmock.NewResult(0, 1))
	enqueue(rowQ, m.DB, inbox.Job{ID: int64(46), Data: []any{p}, NotBefore: t0.Add(time.Hour)}, int64(46))
	m.Met(t)
}

// myRowLockPicks expects a row-lock claim's pick: the candidates ids, read
// without locks (a page of 10 for a claim of one, and one more for each
// job the queue holds), then, when there are any, the lock of the first
// free one among them, which returns got. now is the caller's clock, or ""
// for the engine's.
func myRowLockPicks(m *mock, now string, page int, ids []int64, got *sqlmock.Rows) {
	pick, lock := myRowLockPick, myRowLockPickLock
	var pickArgs, lockArgs []driver.Value
	if now != "" {
		pick, lock = myRowLockPickInjected, myRowLockPickLockInjected
		pickArgs = append(pickArgs, now)
	}
	cands := rows("id")
	for _, id := range ids {
		cands.AddRow(id)
	}
	m.ExpectQuery(pick).WithArgs(append(pickArgs, page)...).WillReturnRows(cands)
	if len(ids) == 0 {
		return
	}
	for k := 0; k < 32; k++ {
		lockArgs = append(lockArgs, ids[min(k, len(ids)-1)])
	}
	if now != "" {
		lockArgs = append(lockArgs, now)
	}
	m.ExpectQuery(lock).WithArgs(append(lockArgs, 1)...).WillReturnRows(got)
}

// maAdvLockFirst is inbox.MariaDB's LockFirst on advisoryTable: the page
// numbered in claim order, each key's GET_LOCK tried in that order, the
// first taken or the full page's last row returned.
const maAdvLockFirst = "SELECT i, k, a, COALESCE(IS_USED_LOCK(n) = CONNECTION_ID(), 0) FROM (SELECT i, k, a, " +
	"CONCAT('inbox_', LEFT(SHA2(CONCAT(?, CHAR(0), COALESCE(CAST(k AS CHAR), '')), 256), 32)) AS n, ROW_NUMBER() OVER (ORDER BY i) AS r " +
	"FROM (SELECT `id` AS i, `id` AS k, `attempt` AS a FROM `jobs` WHERE (`not_before` IS NULL OR `not_before` <= UTC_TIMESTAMP(6)) " +
	"ORDER BY `id` LIMIT ?) AS pg) AS c WHERE GET_LOCK(n, 0) = 1 OR r = ? LIMIT 1"

// MariaDB's advisory claim walks from Go while no other session holds a
// key it meets: in one process that is cheaper (its own keys are passed
// over without a call). A lock call lost to another session turns the next
// claims to LockFirst, one statement each, for a span of claims; then a
// walk looks again, and stays the way when it meets no one.
func TestMariaDBAdvisoryLocksInSQLWhenContended(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MariaDB, Table: advisoryTable})
	inbox.SetHeldClock(q, func() time.Time { return time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC) })
	if q.Statements().Advisory.LockFirst.SQL != maAdvLockFirst || !q.Statements().Advisory.LockFirstContended {
		t.Fatalf("LockFirst (contended %v):\n%s\nwant\n%s", q.Statements().Advisory.LockFirstContended, q.Statements().Advisory.LockFirst.SQL, maAdvLockFirst)
	}
	// A key some pool of this process holds is no contention, and earlier
	// tests leave deliveries unsettled on their closed pools until those
	// are collected: ids no other test claims keep this test's keys its own.
	myIdent(m, "", "jobs")
	m.ExpectQuery(myAdvCandidates).WithArgs(10).WillReturnRows(myAdvPage(801))
	maAdvClaimed(m, 801)
	var held []*inbox.Delivery
	held = append(held, claim(t, q, 1, 801)...)

	// Key 802 held by another session: the walk passes it over.
	m.ExpectQuery(myAdvCandidates).WithArgs(11).WillReturnRows(myAdvPage(802, 803))
	m.ExpectQuery(myGetLock).WithArgs(inbox.MySQLLockName("test.jobs", "802")).WillReturnRows(rows("got", row(int64(0))))
	maAdvClaimed(m, 803)
	held = append(held, claim(t, q, 1, 803)...)

	// The claims after lock in SQL, each past nothing: one statement, the
	// row re-read and its attempt counted on the session holding the lock.
	const span = 64
	for i := 0; i < span; i++ {
		id := int64(810 + i)
		limit := 2 + len(held) + 8
		m.ExpectQuery(maAdvLockFirst).WithArgs("test.jobs", limit, limit).WillReturnRows(rows("i,k,a,locked", row(id, id, int64(1), int64(1))))
		m.ExpectQuery(myAdvSelect).WithArgs(id, int64(1)).WillReturnRows(rows("id,attempt,payload", row(id, int64(1), nil)))
		m.ExpectExec(myAdvMark).WithArgs(id, int64(1)).WillReturnResult(affected(1))
		ds := claim(t, q, 1, id)
		if lock, claimed := m.ConnsOf(maAdvLockFirst), m.ConnsOf(myAdvSelect); lock[len(lock)-1] != claimed[len(claimed)-1] {
			t.Fatalf("claim %d: locked on connection %d, re-read on %d", i, lock[len(lock)-1], claimed[len(claimed)-1])
		}
		held = append(held, ds...)
	}
	if n := len(m.ConnsOf(myGetLock)); n != 3 {
		t.Errorf("%d lock calls from Go, want the 3 of the two walks", n)
	}
	if n := len(m.ConnsOf(maAdvLockFirst)); n != span {
		t.Errorf("%d LockFirst statements, want %d", n, span)
	}

	// The span spent, the walk looks again: no one else holds a key now.
	limit := 2 + len(held) + 8
	m.ExpectQuery(myAdvCandidates).WithArgs(limit).WillReturnRows(myAdvPage(900))
	maAdvClaimed(m, 900)
	held = append(held, claim(t, q, 1, 900)...)
	m.ExpectQuery(myAdvCandidates).WithArgs(limit + 1).WillReturnRows(myAdvPage(901))
	maAdvClaimed(m, 901)
	held = append(held, claim(t, q, 1, 901)...)
	for _, d := range held {
		m.ExpectExec(myAdvAck).WithArgs(d.ID(), int64(2)).WillReturnResult(affected(1))
		m.ExpectQuery(myReleaseLock).WithArgs(inbox.MySQLLockName("test.jobs", d.Key())).WillReturnRows(rows("RELEASE_LOCK(?)", row(int64(1))))
		ok(t, "Ack", d.Ack(context.Background()))
	}
	m.Met(t)
}

// maAdvClaimed expects a walk's lock call on key id, taken, and the claim
// of its row.
func maAdvClaimed(m *mock, id int64) {
	m.ExpectQuery(myGetLock).WithArgs(inbox.MySQLLockName("test.jobs", fmt.Sprint(id))).WillReturnRows(rows("got", row(int64(1))))
	m.ExpectQuery(myAdvSelect).WithArgs(id, int64(1)).WillReturnRows(rows("id,attempt,payload", row(id, int64(1), nil)))
	m.ExpectExec(myAdvMark).WithArgs(id, int64(1)).WillReturnResult(affected(1))
}

// inbox.MariaDB's lease and row-lock claims begin at the session's own
// isolation level, no SET TRANSACTION, while each claim read finds the
// session at READ COMMITTED (a DSN's tx_isolation, the server's default).
// A read that finds another level rolls its claim back, and the claim is
// made again at READ COMMITTED, as every claim of the queue is from then
// on; a claim that read no row learned nothing and changes nothing.
// inbox.MySQL always sets the level.
func TestMariaDBClaimAtSessionLevel(t *testing.T) {
	const now, exp = "2024-03-01 12:00:00.123456", "2024-03-01 12:01:00.123456"
	wantLevels := func(t *testing.T, m *mock, want ...sql.IsolationLevel) {
		t.Helper()
		if got := m.Isolations(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("claim transactions began at %v, want %v", got, want)
		}
	}
	const def, rc = sql.LevelDefault, sql.LevelReadCommitted

	t.Run("lease", func(t *testing.T) {
		// Claims whose context ends within a second: from the client,
		// without Claim.WalkTake.
		soon, cancel := context.WithTimeout(context.Background(), 999*time.Millisecond)
		defer cancel()
		claim := func(t *testing.T, q *inbox.Queue, max int, want ...int64) {
			t.Helper()
			claimCtx(t, soon, q, max, want...)
		}
		m := newMock(t)
		q := newQueue(t, m, inbox.Config{Dialect: inbox.MariaDB, Table: leaseTable, Lease: time.Minute, Now: fakeclock.New(t0).Now})
		first, due, free := mariaRead(myLeaseFirst), mariaRead(myLeaseDue), mariaRead(myLeaseFree)
		walk := q.Statements().Claim.WalkFirst.SQL
		if !strings.Contains(walk, mariaLevel) {
			t.Fatalf("Claim.WalkFirst reads no level: %s", walk)
		}
		cols := "id,attempt,payload,level"
		// The walk finds the job at the session's level.
		m.ExpectBegin()
		m.ExpectQuery(walk).WithArgs(now).WillReturnRows(rows(cols, row(int64(6), int64(1), nil, int64(1))))
		m.ExpectExec(myLeaseMarkOne).WithArgs(markOneArgs(exp, 6, 1)...).WillReturnResult(affected(1))
		m.ExpectCommit()
		claim(t, q, 1, 6)
		wantLevels(t, m, def)
		// Nothing to claim: no row says the level; the next claim still
		// begins at the session's (and, for a span, without the walk).
		m.ExpectBegin()
		m.ExpectQuery(walk).WithArgs(now).WillReturnRows(rows(cols))
		m.ExpectQuery(first).WithArgs(now, 1).WillReturnRows(rows(cols))
		m.ExpectQuery(due).WithArgs(now, 1).WillReturnRows(rows(cols))
		m.ExpectQuery(free).WithArgs(1).WillReturnRows(rows(cols))
		m.ExpectCommit()
		claim(t, q, 1)
		m.ExpectBegin()
		m.ExpectQuery(first).WithArgs(now, 1).WillReturnRows(rows(cols, row(int64(7), int64(1), nil, int64(1))))
		m.ExpectExec(myLeaseMarkOne).WithArgs(markOneArgs(exp, 7, 1)...).WillReturnResult(affected(1))
		m.ExpectCommit()
		claim(t, q, 1, 7)
		wantLevels(t, m, def, def, def)
		// A session at REPEATABLE READ: rolled back before the mark, and
		// claimed again at READ COMMITTED, where the column, the
		// session's level still, is not read.
		m.ExpectBegin()
		m.ExpectQuery(first).WithArgs(now, 1).WillReturnRows(rows(cols, row(int64(8), int64(1), nil, int64(0))))
		m.ExpectRollback()
		m.ExpectBegin()
		m.ExpectQuery(first).WithArgs(now, 1).WillReturnRows(rows(cols, row(int64(8), int64(1), nil, int64(0))))
		m.ExpectExec(myLeaseMarkOne).WithArgs(markOneArgs(exp, 8, 1)...).WillReturnResult(affected(1))
		m.ExpectCommit()
		claim(t, q, 1, 8)
		m.ExpectBegin()
		m.ExpectQuery(first).WithArgs(now, 1).WillReturnRows(rows(cols, row(int64(9), int64(1), nil, int64(1))))
		m.ExpectExec(myLeaseMarkOne).WithArgs(markOneArgs(exp, 9, 1)...).WillReturnResult(affected(1))
		m.ExpectCommit()
		claim(t, q, 1, 9)
		wantLevels(t, m, def, def, def, def, rc, rc)
		m.Met(t)
	})

	t.Run("row lock", func(t *testing.T) {
		m := newMock(t)
		q := newQueue(t, m, inbox.Config{Dialect: inbox.MariaDB, Table: rowLockTable})
		walkFirst := q.Statements().Claim.WalkFirst.SQL
		if !strings.Contains(walkFirst, mariaLevel) {
			t.Fatalf("Claim.WalkFirst reads no level: %s", walkFirst)
		}
		cols := "id,attempt,payload,level"
		m.ExpectBegin()
		m.ExpectQuery(walkFirst).WithoutArgs().WillReturnRows(rows(cols, row(int64(11), int64(1), nil, int64(1))))
		ds := claim(t, q, 1, 11)
		m.ExpectRollback()
		ok(t, "Release", ds[0].Release(context.Background()))
		// At another level the held transaction is rolled back before the
		// handler has it, and the job claimed again.
		m.ExpectBegin()
		m.ExpectQuery(walkFirst).WithoutArgs().WillReturnRows(rows(cols, row(int64(12), int64(1), nil, int64(0))))
		m.ExpectRollback()
		m.ExpectBegin()
		m.ExpectQuery(walkFirst).WithoutArgs().WillReturnRows(rows(cols, row(int64(12), int64(1), nil, int64(0))))
		ds = claim(t, q, 1, 12)
		wantLevels(t, m, def, def, rc)
		m.ExpectRollback()
		ok(t, "Release", ds[0].Release(context.Background()))
		m.Met(t)
	})

	t.Run("mysql", func(t *testing.T) {
		m := newMock(t)
		q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: rowLockTable})
		if q.Statements().Claim.PickLock.Level {
			t.Fatal("inbox.MySQL's PickLock reads the level")
		}
		m.ExpectBegin()
		m.ExpectQuery(myRowLockPick).WithArgs(10).WillReturnRows(rows("id", row(int64(11))))
		var lockArgs []driver.Value
		for k := 0; k < 32; k++ {
			lockArgs = append(lockArgs, int64(11))
		}
		m.ExpectQuery(myRowLockPickLock).WithArgs(append(lockArgs, 1)...).WillReturnRows(rows("id,attempt,payload", row(int64(11), int64(1), nil)))
		ds := claim(t, q, 1, 11)
		wantLevels(t, m, rc)
		m.ExpectRollback()
		ok(t, "Release", ds[0].Release(context.Background()))
		m.Met(t)
	})
}
