package inbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/fakeclock"
)

// shallowTable is leaseTable described as a shallow queue: no claim index.
var shallowTable = inbox.Table{Name: "jobs", LockedUntil: "locked_until", DeadTable: "dead_jobs", Shallow: true}

// The shallow lease claim reads free and expired rows in one ordered read,
// through the primary key.
const (
	pgShallowClaim = `WITH picked AS MATERIALIZED (SELECT "id" FROM (SELECT "id" FROM "jobs" WHERE "locked_until" IS NULL OR "locked_until" <= statement_timestamp()` +
		` ORDER BY "id" LIMIT 2 FOR UPDATE SKIP LOCKED) AS bounded LIMIT $1) ` +
		`UPDATE "jobs" AS j SET "attempt" = j."attempt" + 1, "locked_until" = (statement_timestamp() + $2 * interval '1 microsecond') WHERE j."id" = ANY (ARRAY(SELECT "id" FROM picked)) ` +
		`RETURNING j."id", j."attempt" - 1, j."locked_until", j."payload"`
	pgShallowClaimPriority = `WITH picked AS MATERIALIZED (SELECT "id" FROM (SELECT "id" FROM "jobs" WHERE "locked_until" IS NULL OR "locked_until" <= $1` +
		` ORDER BY "priority" DESC, "id" LIMIT 4 FOR UPDATE SKIP LOCKED) AS bounded LIMIT $2) ` +
		`UPDATE "jobs" AS j SET "attempt" = j."attempt" + 1, "locked_until" = $3 WHERE j."id" = ANY (ARRAY(SELECT "id" FROM picked)) ` +
		`RETURNING j."id", j."attempt" - 1, j."locked_until", j."payload", j."priority"`
	myShallowClaim = "SELECT `id`, `attempt`, `payload`, UTC_TIMESTAMP(6) FROM `jobs` WHERE (`locked_until` IS NULL OR `locked_until` <= UTC_TIMESTAMP(6))" +
		" ORDER BY `id` LIMIT ? FOR UPDATE SKIP LOCKED"
	myShallowPick      = "SELECT `id`, `priority` FROM `jobs` WHERE (`locked_until` IS NULL OR `locked_until` <= ?) ORDER BY `priority` DESC, `id` LIMIT ?"
	sqShallowClaim     = "UPDATE `jobs` SET `attempt` = `attempt` + 1, `locked_until` = ? WHERE `id` IN (SELECT `id` FROM `jobs` WHERE `locked_until` IS NULL OR `locked_until` <= ? ORDER BY `id` LIMIT ?) RETURNING `id`, `attempt` - 1, `locked_until`, `payload`"
	sqShallowClaimOne  = "UPDATE `jobs` SET `attempt` = `attempt` + 1, `locked_until` = ? WHERE `id` = (SELECT `id` FROM `jobs` WHERE `locked_until` IS NULL OR `locked_until` <= ? ORDER BY `id` LIMIT ?) RETURNING `id`, `attempt` - 1, `locked_until`, `payload`"
	sqLeaseClaimOneRef = "UPDATE `jobs` SET `attempt` = `attempt` + 1, `locked_until` = ? WHERE `id` = (" +
		"SELECT `id` FROM (SELECT `id` FROM `jobs` WHERE `locked_until` <= ? ORDER BY `locked_until` LIMIT ?) UNION ALL " +
		"SELECT `id` FROM (SELECT `id` FROM `jobs` WHERE `locked_until` IS NULL ORDER BY `id` LIMIT ?) LIMIT ?) " +
		"RETURNING `id`, `attempt` - 1, `locked_until`, `payload`"
)

func TestPostgresShallow(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: shallowTable, Lease: time.Minute})
	exp := utc0.Add(time.Minute)
	m.ExpectQuery(pgShallowClaim).WithArgs(2, minute).WillReturnRows(rows("id,attempt,locked_until,payload",
		row(int64(7), int64(1), exp, []byte("p7")), row(int64(8), int64(3), exp, []byte("p8"))))
	ds := claim(t, q, 2, 7, 8)
	// The settlements are the lease's.
	m.ExpectExec(pgLeaseAck).WithArgs(int64(7), int64(2), at(exp)).WillReturnResult(affected(1))
	ok(t, "Ack", ds[0].Ack(context.Background()))
	// One job: the same statement, bounded by one.
	m.ExpectQuery(strings.Replace(pgShallowClaim, "LIMIT 2 ", "LIMIT 1 ", 1)).WithArgs(1, minute).WillReturnRows(rows("id,attempt,locked_until,payload"))
	claim(t, q, 1)
	m.Met(t)

	// With a priority and the caller's clock: the claim order, the times
	// as parameters.
	m = newMock(t)
	clk := fakeclock.New(t0)
	tb := shallowTable
	tb.Priority = "priority"
	q = newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: tb, Lease: time.Minute, Now: clk.Now})
	m.ExpectQuery(pgShallowClaimPriority).WithArgs(at(utc0), 3, at(utc0.Add(time.Minute))).WillReturnRows(rows("id,attempt,locked_until,payload,priority",
		row(int64(9), int64(1), t0.Add(time.Minute), []byte("p9"), int64(1)), row(int64(4), int64(1), t0.Add(time.Minute), []byte("p4"), int64(5))))
	ds = claim(t, q, 3, 4, 9)
	if ds[0].Priority() != 5 {
		t.Fatalf("the first delivery's priority is %d, want 5", ds[0].Priority())
	}
	m.Met(t)
}

func TestMySQLShallow(t *testing.T) {
	for _, d := range []inbox.Dialect{inbox.MySQL, inbox.MariaDB} {
		m := newMock(t)
		q := newQueue(t, m, inbox.Config{Dialect: d, Table: shallowTable, Lease: time.Minute})
		const exp = "2024-03-01 12:01:00.123456"
		const now = "2024-03-01 12:00:00.123456"
		// One locking read in id order, then the mark: no second read for
		// the places left.
		read := myShallowClaim
		if d == inbox.MariaDB {
			read = mariaRead(read)
		}
		m.ExpectBegin()
		m.ExpectQuery(read).WithArgs(4).WillReturnRows(atLevel(read, "id,attempt,payload,UTC_TIMESTAMP(6)",
			row(int64(7), int64(1), []byte("p7"), []byte(now)), row(int64(8), int64(3), []byte("p8"), []byte(now))))
		m.ExpectExec(myLeaseMark).WithArgs(markArgs(exp, 7, 1, 8, 3)...).WillReturnResult(affected(2))
		m.ExpectCommit()
		ds := claim(t, q, 4, 7, 8)
		m.ExpectExec(myLeaseAck).WithArgs(int64(7), int64(2), exp).WillReturnResult(affected(1))
		ok(t, "Ack", ds[0].Ack(context.Background()))
		m.Met(t)
	}

	// With a priority the candidates are picked without locks in claim
	// order, from one read of free and expired rows (a page of 12 for a
	// claim of 2).
	m := newMock(t)
	clk := fakeclock.New(t0)
	tb := shallowTable
	tb.Priority = "priority"
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: tb, Lease: time.Minute, Now: clk.Now})
	m.ExpectBegin()
	m.ExpectQuery(myShallowPick).WithArgs("2024-03-01 12:00:00.123456", 12).WillReturnRows(rows("id,priority"))
	m.ExpectCommit()
	claim(t, q, 2)
	m.Met(t)
}

// SQLite's times of a queue on a stopped clock at t0, lease a minute.
const (
	sqStoppedNow = "2024-03-01T12:00:00.123456Z"
	sqStoppedExp = "2024-03-01T12:01:00.123456Z"
)

// sqliteStopped is a SQLite queue on tb whose clock stands at t0.
func sqliteStopped(t *testing.T, tb inbox.Table) (*mock, *inbox.Queue) {
	m := newMock(t)
	clk := fakeclock.New(t0)
	return m, newQueue(t, m, inbox.Config{Dialect: inbox.SQLite, Table: tb, Lease: time.Minute, Now: clk.Now})
}

func TestSQLiteShallow(t *testing.T) {
	m, q := sqliteStopped(t, shallowTable)
	const exp, now = sqStoppedExp, sqStoppedNow
	m.ExpectQuery(sqShallowClaim).WithArgs(exp, now, 2).WillReturnRows(rows("id,attempt,locked_until,payload",
		row(int64(7), int64(1), exp, nil), row(int64(8), int64(1), exp, nil)))
	ds := claim(t, q, 2, 7, 8)
	m.ExpectExec(sqLeaseAck).WithArgs(int64(7), int64(2), exp).WillReturnResult(affected(1))
	ok(t, "Ack", ds[0].Ack(context.Background()))
	// A claim of one names its row with "=".
	m.ExpectQuery(sqShallowClaimOne).WithArgs(exp, now, 1).WillReturnRows(rows("id,attempt,locked_until,payload", row(int64(9), int64(1), exp, nil)))
	claim(t, q, 1, 9)
	m.Met(t)
}

// On the recommended indexes too, SQLite claims one job with "=", and
// several with IN.
func TestSQLiteClaimOne(t *testing.T) {
	m, q := sqliteStopped(t, leaseTable)
	const exp, now = sqStoppedExp, sqStoppedNow
	m.ExpectQuery(sqLeaseClaimOneRef).WithArgs(exp, now, 1, 1, 1).WillReturnRows(rows("id,attempt,locked_until,payload", row(int64(7), int64(1), exp, nil)))
	claim(t, q, 1, 7)
	m.ExpectQuery(sqLeaseClaim).WithArgs(exp, now, 2, 2, 2).WillReturnRows(rows("id,attempt,locked_until,payload"))
	claim(t, q, 2)
	m.Met(t)
}

// Shallow describes a lease table; the other forms refuse it, naming it,
// before anything reaches the database.
func TestShallowOtherForms(t *testing.T) {
	for _, tb := range []inbox.Table{
		{Name: "jobs", Shallow: true},
		{Name: "jobs", AdvisoryKey: "id", Shallow: true},
	} {
		m := newMock(t)
		_, err := inbox.New(m.DB, inbox.Config{Dialect: inbox.Postgres, Table: tb})
		if err == nil || !strings.Contains(err.Error(), "Table.Shallow") {
			t.Errorf("New(%+v): %v, want an error naming Table.Shallow", tb, err)
		}
		m.Met(t)
	}
}
