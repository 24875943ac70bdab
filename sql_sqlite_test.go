package inbox_test

// The SQL the SQLite dialect sends, pinned with sqlmock's exact matcher.
// SQLite has the lease and advisory forms only, always runs on the caller's
// clock (time.Now unless Config.Now is set), and passes every time as
// fixed-width UTC text, 2006-01-02T15:04:05.000000Z.

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/fakeclock"
)

// Lease form.
const (
	sqLeaseClaim = "UPDATE `jobs` SET `attempt` = `attempt` + 1, `locked_until` = ? WHERE `id` IN (" +
		"SELECT `id` FROM (SELECT `id` FROM `jobs` WHERE `locked_until` <= ? ORDER BY `locked_until` LIMIT ?) UNION ALL " +
		"SELECT `id` FROM (SELECT `id` FROM `jobs` WHERE `locked_until` IS NULL ORDER BY `id` LIMIT ?) LIMIT ?) " +
		"RETURNING `id`, `attempt` - 1, `locked_until`, `payload`"
	sqLeaseExtend     = "UPDATE `jobs` SET `locked_until` = ? WHERE `id` = ? AND `attempt` = ? AND `locked_until` = ?" // also Retry
	sqLeaseAck        = "DELETE FROM `jobs` WHERE `id` = ? AND `attempt` = ? AND `locked_until` = ?"                   // also the dead move's delete
	sqLeaseRelease    = "UPDATE `jobs` SET `locked_until` = NULL, `attempt` = `attempt` - 1 WHERE `id` = ? AND `attempt` = ? AND `locked_until` = ?"
	sqLeaseDeadInsert = "INSERT INTO `dead_jobs` (`id`, `attempt`, `payload`) SELECT `id`, ?, `payload` FROM `jobs` WHERE `id` = ? AND `attempt` = ? AND `locked_until` = ?"
)

// Advisory form: the keys in work are held by the process, one set per
// database file for every pool on it, so no lock statement is sent.
const (
	sqAdvCandidates      = "SELECT `id`, `id`, `attempt` FROM `jobs` WHERE (`not_before` IS NULL OR `not_before` <= ?) ORDER BY `id` LIMIT ?"
	sqAdvCandidatesAfter = "SELECT `id`, `id`, `attempt` FROM `jobs` WHERE `id` > ? AND (`not_before` IS NULL OR `not_before` <= ?) ORDER BY `id` LIMIT ?"
	sqAdvClaim           = "UPDATE `jobs` SET `attempt` = `attempt` + 1 WHERE `id` = ? AND `attempt` = ? AND (`not_before` IS NULL OR `not_before` <= ?) RETURNING `id`, `attempt` - 1, `payload`"
	sqAdvAck             = "DELETE FROM `jobs` WHERE `id` = ? AND `attempt` = ?" // also the dead move's delete
	sqAdvRetry           = "UPDATE `jobs` SET `not_before` = ? WHERE `id` = ? AND `attempt` = ?"
	sqAdvRelease         = "UPDATE `jobs` SET `attempt` = `attempt` - 1 WHERE `id` = ? AND `attempt` = ?"
	sqAdvDeadInsert      = "INSERT INTO `dead_jobs` (`id`, `attempt`, `payload`) SELECT `id`, ?, `payload` FROM `jobs` WHERE `id` = ? AND `attempt` = ?"
)

// sqFile is a database file of the test's own: the keys in work are the
// process's, shared by every test on one file.
func sqFile(t *testing.T) string {
	return "/nonexistent/" + strings.ReplaceAll(t.Name(), "/", "_") + ".db"
}

// sqliteTime parses a captured time argument, failing the test unless it is
// the package's fixed-width UTC text.
func sqliteTime(t *testing.T, c *capture) time.Time {
	t.Helper()
	s, isText := c.v.(string)
	if !isText || len(s) != len("2006-01-02T15:04:05.000000Z") {
		t.Fatalf("time argument %#v is not fixed-width text", c.v)
	}
	v, err := time.Parse("2006-01-02T15:04:05.000000Z", s)
	if err != nil {
		t.Fatalf("time argument %q: %v", s, err)
	}
	return v
}

// Without Config.Now, SQLite runs on time.Now: the times are the real
// clock's, as text.
func TestSQLiteLease(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.SQLite, Table: leaseTable, Lease: time.Minute})
	var now, until capture
	before := time.Now().UTC().Truncate(time.Microsecond)
	m.ExpectQuery(sqLeaseClaim).WithArgs(&until, &now, 4, 4, 4).WillReturnRows(rows("id,attempt,locked_until,payload"))
	claim(t, q, 4)
	after := time.Now()
	n, u := sqliteTime(t, &now), sqliteTime(t, &until)
	if n.Before(before) || n.After(after) || u.Sub(n) != time.Minute {
		t.Fatalf("claim at %v until %v, between %v and %v", n, u, before, after)
	}
	// The expiry comes back as the driver returns TEXT: a string (mattn) or
	// bytes (modernc).
	exp := "2024-03-01T12:01:00.123456Z"
	m.ExpectQuery(sqLeaseClaim).WithArgs(&until, &now, 4, 4, 4).WillReturnRows(rows("id,attempt,locked_until,payload",
		row(int64(7), int64(1), exp, []byte("p7")), row(int64(8), int64(3), []byte(exp), []byte("p8")),
		row(int64(9), int64(1), exp, []byte("p9")), row(int64(10), int64(2), exp, []byte("p10"))))
	ds := claim(t, q, 4, 7, 8, 9, 10)
	if !ds[1].Expiry().Equal(utc0.Add(time.Minute)) {
		t.Fatalf("Expiry() = %v", ds[1].Expiry())
	}
	var ext capture
	m.ExpectExec(sqLeaseExtend).WithArgs(&ext, int64(7), int64(2), exp).WillReturnResult(affected(1))
	ok(t, "Extend", ds[0].Extend(context.Background()))
	if e := sqliteTime(t, &ext); !ds[0].Expiry().Equal(e) || e.Before(before.Add(time.Minute)) {
		t.Fatalf("Expiry() after Extend = %v, written %v", ds[0].Expiry(), e)
	}
	m.ExpectExec(sqLeaseAck).WithArgs(int64(7), int64(2), ext.v).WillReturnResult(affected(1))
	ok(t, "Ack", ds[0].Ack(context.Background()))
	var retry capture
	m.ExpectExec(sqLeaseExtend).WithArgs(&retry, int64(8), int64(4), exp).WillReturnResult(affected(1))
	ok(t, "Retry", ds[1].Retry(context.Background(), time.Hour))
	if r := sqliteTime(t, &retry); r.Before(before.Add(time.Hour)) || r.After(time.Now().Add(time.Hour)) {
		t.Fatalf("Retry wrote %v", r)
	}
	m.ExpectExec(sqLeaseRelease).WithArgs(int64(9), int64(2), exp).WillReturnResult(affected(1))
	ok(t, "Release", ds[2].Release(context.Background()))
	m.ExpectBegin()
	m.ExpectExec(sqLeaseDeadInsert).WithArgs(int64(2), int64(10), int64(3), exp).WillReturnResult(affected(1))
	m.ExpectExec(sqLeaseAck).WithArgs(int64(10), int64(3), exp).WillReturnResult(affected(1))
	m.ExpectCommit()
	ok(t, "Dead", ds[3].Dead(context.Background()))
	m.Met(t)
}

func TestSQLiteLeaseInjectedClock(t *testing.T) {
	m := newMock(t)
	clk := fakeclock.New(t0)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.SQLite, Table: leaseTable, Lease: time.Minute, Now: clk.Now})
	const exp = "2024-03-01T12:01:00.123456Z"
	m.ExpectQuery(sqLeaseClaim).WithArgs(exp, "2024-03-01T12:00:00.123456Z", 2, 2, 2).WillReturnRows(rows("id,attempt,locked_until,payload",
		row(int64(7), int64(1), exp, nil), row(int64(8), int64(1), exp, nil)))
	ds := claim(t, q, 2, 7, 8)
	clk.Advance(20 * time.Second)
	m.ExpectExec(sqLeaseExtend).WithArgs("2024-03-01T12:01:20.123456Z", int64(7), int64(2), exp).WillReturnResult(affected(1))
	ok(t, "Extend", ds[0].Extend(context.Background()))
	m.ExpectExec(sqLeaseExtend).WithArgs("2024-03-01T12:02:20.123456Z", int64(7), int64(2), "2024-03-01T12:01:20.123456Z").WillReturnResult(affected(1))
	ok(t, "Retry", ds[0].Retry(context.Background(), 2*time.Minute))
	m.ExpectExec(sqLeaseAck).WithArgs(int64(8), int64(2), exp).WillReturnResult(affected(1))
	ok(t, "Ack", ds[1].Ack(context.Background()))
	m.Met(t)
}

func TestSQLiteLeaseTx(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.SQLite, Table: leaseTable, Lease: time.Minute, Now: fakeclock.New(t0).Now})
	const exp = "2024-03-01T12:01:00.123456Z"
	r := rows("id,attempt,locked_until,payload")
	for id := int64(1); id <= 4; id++ {
		r.AddRow(id, int64(1), exp, nil)
	}
	m.ExpectQuery(sqLeaseClaim).WithArgs(exp, "2024-03-01T12:00:00.123456Z", 4, 4, 4).WillReturnRows(r)
	ds := claim(t, q, 4, 1, 2, 3, 4)
	ctx := context.Background()
	settleInTx(t, m, "AckTx", func() {
		m.ExpectExec(sqLeaseAck).WithArgs(int64(1), int64(2), exp).WillReturnResult(affected(1))
	}, func(tx *sql.Tx) error { return ds[0].AckTx(ctx, tx) })
	settleInTx(t, m, "RetryTx", func() {
		m.ExpectExec(sqLeaseExtend).WithArgs("2024-03-01T12:00:30.123456Z", int64(2), int64(2), exp).WillReturnResult(affected(1))
	}, func(tx *sql.Tx) error { return ds[1].RetryTx(ctx, tx, 30*time.Second) })
	settleInTx(t, m, "ReleaseTx", func() {
		m.ExpectExec(sqLeaseRelease).WithArgs(int64(3), int64(2), exp).WillReturnResult(affected(1))
	}, func(tx *sql.Tx) error { return ds[2].ReleaseTx(ctx, tx) })
	settleInTx(t, m, "DeadTx", func() {
		m.ExpectExec(sqLeaseDeadInsert).WithArgs(int64(1), int64(4), int64(2), exp).WillReturnResult(affected(1))
		m.ExpectExec(sqLeaseAck).WithArgs(int64(4), int64(2), exp).WillReturnResult(affected(1))
	}, func(tx *sql.Tx) error { return ds[3].DeadTx(ctx, tx) })
	m.Met(t)
}

// The SQLite advisory form holds its keys in the process, shared by every
// queue on the same database file and table: a key in work is passed over
// without a statement.
func TestSQLiteAdvisory(t *testing.T) {
	m := newMock(t)
	clk := fakeclock.New(t0)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.SQLite, Table: advisoryTable, Now: clk.Now})
	other := newQueue(t, m, inbox.Config{Dialect: inbox.SQLite, Table: advisoryTable, Now: clk.Now})
	file := sqFile(t)
	const now = "2024-03-01T12:00:00.123456Z"
	cols := "id,attempt,payload"
	sqIdent(m, "main", file)
	m.ExpectQuery(sqAdvCandidates).WithArgs(now, 10).WillReturnRows(rows("id,id,attempt", row(int64(1), int64(1), int64(1))))
	m.ExpectQuery(sqAdvClaim).WithArgs(int64(1), int64(1), now).WillReturnRows(rows(cols, row(int64(1), int64(1), nil)))
	d1 := claim(t, q, 1, 1)[0]
	// Key 1 is in work; job 2 was settled since the candidates were read.
	sqIdent(m, "main", file)
	m.ExpectQuery(sqAdvCandidates).WithArgs(now, 13).WillReturnRows(rows("id,id,attempt", row(int64(1), int64(1), int64(2)), row(int64(2), int64(2), int64(1))))
	m.ExpectQuery(sqAdvClaim).WithArgs(int64(2), int64(1), now).WillReturnRows(rows(cols))
	// The page is stale: read afresh, job 2 gone from it.
	m.ExpectQuery(sqAdvCandidates).WithArgs(now, 13).WillReturnRows(rows("id,id,attempt", row(int64(1), int64(1), int64(2))))
	claim(t, other, 2)

	m.ExpectQuery(sqAdvCandidates).WithArgs(now, 15).WillReturnRows(rows("id,id,attempt",
		row(int64(3), int64(3), int64(1)), row(int64(4), int64(4), int64(1)), row(int64(5), int64(5), int64(1))))
	for id := int64(3); id <= 5; id++ {
		m.ExpectQuery(sqAdvClaim).WithArgs(id, int64(1), now).WillReturnRows(rows(cols, row(id, int64(1), nil)))
	}
	ds := claim(t, q, 3, 3, 4, 5)
	m.ExpectExec(sqAdvAck).WithArgs(int64(1), int64(2)).WillReturnResult(affected(1))
	ok(t, "Ack", d1.Ack(context.Background()))
	m.ExpectExec(sqAdvRetry).WithArgs("2024-03-01T12:00:30.123456Z", int64(3), int64(2)).WillReturnResult(affected(1))
	ok(t, "Retry", ds[0].Retry(context.Background(), 30*time.Second))
	m.ExpectExec(sqAdvRelease).WithArgs(int64(4), int64(2)).WillReturnResult(affected(1))
	ok(t, "Release", ds[1].Release(context.Background()))
	m.ExpectBegin()
	m.ExpectExec(sqAdvDeadInsert).WithArgs(int64(1), int64(5), int64(2)).WillReturnResult(affected(1))
	m.ExpectExec(sqAdvAck).WithArgs(int64(5), int64(2)).WillReturnResult(affected(1))
	m.ExpectCommit()
	ok(t, "Dead", ds[2].Dead(context.Background()))

	// Settled keys are free again.
	m.ExpectQuery(sqAdvCandidates).WithArgs(now, 10).WillReturnRows(rows("id,id,attempt", row(int64(1), int64(1), int64(3))))
	m.ExpectQuery(sqAdvClaim).WithArgs(int64(1), int64(3), now).WillReturnRows(rows(cols))
	m.ExpectQuery(sqAdvCandidates).WithArgs(now, 10).WillReturnRows(rows("id,id,attempt")) // read afresh: empty
	claim(t, other, 1)
	m.Met(t)
}

// Two pools on one database file in one process share its keys in work,
// however each spells the table: "main.jobs" through the second pool waits
// for the job "jobs" through the first holds, and gets it once settled.
// A candidate whose attempt moved on is not claimed.
func TestSQLiteAdvisoryOneFileTwoPools(t *testing.T) {
	m1, m2 := newMock(t), newMock(t)
	clk := fakeclock.New(t0)
	q1 := newQueue(t, m1, inbox.Config{Dialect: inbox.SQLite, Table: inbox.Table{Name: "jobs", AdvisoryKey: "id"}, Now: clk.Now})
	q2 := newQueue(t, m2, inbox.Config{Dialect: inbox.SQLite, Table: inbox.Table{Name: "main.JOBS", AdvisoryKey: "id"}, Now: clk.Now})
	file := sqFile(t)
	const (
		plainCandidates = "SELECT `id`, `id`, `attempt` FROM `jobs` ORDER BY `id` LIMIT ?"
		plainClaim      = "UPDATE `jobs` SET `attempt` = `attempt` + 1 WHERE `id` = ? AND `attempt` = ? RETURNING `id`, `attempt` - 1, `payload`"
		plainAck        = "DELETE FROM `jobs` WHERE `id` = ? AND `attempt` = ?"
		mainCandidates  = "SELECT `id`, `id`, `attempt` FROM `main`.`JOBS` ORDER BY `id` LIMIT ?"
		mainAfter       = "SELECT `id`, `id`, `attempt` FROM `main`.`JOBS` WHERE `id` > ? ORDER BY `id` LIMIT ?"
		mainClaim       = "UPDATE `main`.`JOBS` SET `attempt` = `attempt` + 1 WHERE `id` = ? AND `attempt` = ? RETURNING `id`, `attempt` - 1, `payload`"
		mainAck         = "DELETE FROM `main`.`JOBS` WHERE `id` = ? AND `attempt` = ?"
	)
	cols := "id,attempt,payload"
	sqIdent(m1, "main", file)
	m1.ExpectQuery(plainCandidates).WithArgs(10).WillReturnRows(rows("id,id,attempt", row(int64(1), int64(1), int64(1))))
	m1.ExpectQuery(plainClaim).WithArgs(int64(1), int64(1)).WillReturnRows(rows(cols, row(int64(1), int64(1), nil)))
	d1 := claim(t, q1, 1, 1)[0]

	// The second pool: job 1's key is in work, so a first page of it
	// alone (full, for max 1 and one key held: 11 rows, the same job
	// listed as the mock pleases) is passed over without a statement. On
	// the next page job 2, read at attempt 4 but at 5 by the claim, is not
	// claimed; job 3 is.
	sqIdent(m2, "main", file)
	page := rows("id,id,attempt")
	for i := 0; i < 11; i++ {
		page.AddRow(int64(1), int64(1), int64(2))
	}
	m2.ExpectQuery(mainCandidates).WithArgs(11).WillReturnRows(page)
	m2.ExpectQuery(mainAfter).WithArgs(int64(1), 22).WillReturnRows(rows("id,id,attempt", row(int64(2), int64(2), int64(4)), row(int64(3), int64(3), int64(1))))
	m2.ExpectQuery(mainClaim).WithArgs(int64(2), int64(4)).WillReturnRows(rows(cols))
	// The page is stale: the walk starts again from a fresh first page,
	// as long as the one it needed.
	m2.ExpectQuery(mainCandidates).WithArgs(22).WillReturnRows(rows("id,id,attempt", row(int64(1), int64(1), int64(2)), row(int64(3), int64(3), int64(1))))
	m2.ExpectQuery(mainClaim).WithArgs(int64(3), int64(1)).WillReturnRows(rows(cols, row(int64(3), int64(1), nil)))
	d2 := claim(t, q2, 1, 3)[0]

	// Settled, job 1's key is free for either pool. The second pool's
	// claim needed a page of 22: its next claim starts there.
	m1.ExpectExec(plainAck).WithArgs(int64(1), int64(2)).WillReturnResult(affected(1))
	ok(t, "Ack", d1.Ack(context.Background()))
	m2.ExpectQuery(mainCandidates).WithArgs(22).WillReturnRows(rows("id,id,attempt", row(int64(1), int64(1), int64(2))))
	m2.ExpectQuery(mainClaim).WithArgs(int64(1), int64(2)).WillReturnRows(rows(cols, row(int64(1), int64(2), nil)))
	d3 := claim(t, q2, 1, 1)[0]
	for _, d := range []*inbox.Delivery{d2, d3} {
		m2.ExpectExec(mainAck).WithArgs(d.ID(), d.Attempt()+1).WillReturnResult(affected(1))
		ok(t, "Ack", d.Ack(context.Background()))
	}
	m1.Met(t)
	m2.Met(t)
}

// A database with no file (in memory) is its pool's alone: another pool's
// keys in work do not hold it back.
func TestSQLiteAdvisoryInMemory(t *testing.T) {
	m1, m2 := newMock(t), newMock(t)
	clk := fakeclock.New(t0)
	q1 := newQueue(t, m1, inbox.Config{Dialect: inbox.SQLite, Table: advisoryTable, Now: clk.Now})
	q2 := newQueue(t, m2, inbox.Config{Dialect: inbox.SQLite, Table: advisoryTable, Now: clk.Now})
	const now = "2024-03-01T12:00:00.123456Z"
	cols := "id,attempt,payload"
	var ds []*inbox.Delivery
	for i, m := range []*mock{m1, m2} {
		// The keys of a database in memory are its pool's: the second
		// pool's first page does not count the first pool's key.
		sqIdent(m, "main", "")
		m.ExpectQuery(sqAdvCandidates).WithArgs(now, 10).WillReturnRows(rows("id,id,attempt", row(int64(1), int64(1), int64(1))))
		m.ExpectQuery(sqAdvClaim).WithArgs(int64(1), int64(1), now).WillReturnRows(rows(cols, row(int64(1), int64(1), nil)))
		ds = append(ds, claim(t, []*inbox.Queue{q1, q2}[i], 1, 1)[0])
	}
	for i, m := range []*mock{m1, m2} {
		m.ExpectExec(sqAdvAck).WithArgs(int64(1), int64(2)).WillReturnResult(affected(1))
		ok(t, "Ack", ds[i].Ack(context.Background()))
		m.Met(t)
	}
}

// Without Config.Now the advisory statements compare with time.Now, as text.
func TestSQLiteAdvisoryRealClock(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.SQLite, Table: advisoryTable})
	var now1, now2, now3 capture
	before := time.Now().UTC().Truncate(time.Microsecond)
	sqIdent(m, "main", sqFile(t))
	page := func(from int64) *sqlmock.Rows {
		r := rows("id,id,attempt")
		for id := from; id < from+10; id++ {
			r.AddRow(id, id, int64(1))
		}
		return r
	}
	// Every row is gone under its lock: the first three misses each send
	// the walk back to a fresh first page (maxRereads), the page after
	// those misses goes on to the next page.
	for from := int64(1); from <= 4; from++ {
		m.ExpectQuery(sqAdvCandidates).WithArgs(&now1, 10).WillReturnRows(page(from))
		last := from
		if from == 4 {
			last = 13
		}
		for id := from; id <= last; id++ {
			m.ExpectQuery(sqAdvClaim).WithArgs(id, int64(1), &now2).WillReturnRows(rows("id,attempt,payload"))
		}
	}
	m.ExpectQuery(sqAdvCandidatesAfter).WithArgs(int64(13), &now3, 20).WillReturnRows(rows("id,id,attempt"))
	claim(t, q, 1)
	for _, c := range []*capture{&now1, &now2, &now3} {
		if n := sqliteTime(t, c); n.Before(before) || n.After(time.Now()) {
			t.Errorf("now %v not between %v and the end of the claim", n, before)
		}
	}
	if now1.v != now2.v || now2.v != now3.v {
		t.Errorf("one claim read the clock more than once: %v, %v, %v", now1.v, now2.v, now3.v)
	}
	m.Met(t)
}

// The schema check reports an id that is SQLite's rowid without
// AUTOINCREMENT: a new job would take the id of the job deleted last, and
// a stale holder's token (id, attempt) could match it.
func TestSQLiteCheckSchemaAutoincrement(t *testing.T) {
	const (
		version  = `SELECT sqlite_version()`
		columns  = `SELECT name, type FROM pragma_table_xinfo(?)`
		columns2 = `SELECT name, type FROM pragma_table_xinfo(?, ?)`
		idColumn = `SELECT type, pk, (SELECT COUNT(*) FROM pragma_table_info(?, ?) WHERE pk > 0) FROM pragma_table_info(?, ?) WHERE name = ? COLLATE NOCASE`
		ddl      = "SELECT sql FROM `main`.sqlite_master WHERE type = 'table' AND name = ? COLLATE NOCASE"
		auxDDL   = "SELECT sql FROM `aux`.sqlite_master WHERE type = 'table' AND name = ? COLLATE NOCASE"
	)
	leaseCols := func(idType string) *sqlmock.Rows {
		return rows("name,type", row("id", idType), row("attempt", "INTEGER"), row("payload", "BLOB"), row("locked_until", "TEXT"))
	}
	for _, tc := range []struct {
		name   string
		table  string
		expect func(m *mock)
		want   string // the problem reported, or "" for none
	}{
		{"rowid without AUTOINCREMENT", "jobs", func(m *mock) {
			m.ExpectQuery(columns).WithArgs("jobs").WillReturnRows(leaseCols("INTEGER"))
			m.ExpectQuery(idColumn).WithArgs("jobs", "main", "jobs", "main", "id").WillReturnRows(rows("type,pk,pks", row("INTEGER", int64(1), int64(1))))
			m.ExpectQuery(ddl).WithArgs("jobs").WillReturnRows(rows("sql",
				row("CREATE TABLE jobs (id INTEGER PRIMARY KEY, attempt INTEGER NOT NULL DEFAULT 1, payload BLOB, locked_until TEXT)")))
		}, "table jobs: its id is INTEGER PRIMARY KEY without AUTOINCREMENT"},
		{"AUTOINCREMENT", "jobs", func(m *mock) {
			m.ExpectQuery(columns).WithArgs("jobs").WillReturnRows(leaseCols("integer"))
			m.ExpectQuery(idColumn).WithArgs("jobs", "main", "jobs", "main", "id").WillReturnRows(rows("type,pk,pks", row("integer", int64(1), int64(1))))
			m.ExpectQuery(ddl).WithArgs("jobs").WillReturnRows(rows("sql",
				row("CREATE TABLE jobs (id integer primary key autoincrement, attempt INTEGER NOT NULL DEFAULT 1, payload BLOB, locked_until TEXT)")))
		}, ""},
		{"text id", "jobs", func(m *mock) {
			m.ExpectQuery(columns).WithArgs("jobs").WillReturnRows(leaseCols("TEXT"))
			m.ExpectQuery(idColumn).WithArgs("jobs", "main", "jobs", "main", "id").WillReturnRows(rows("type,pk,pks", row("TEXT", int64(1), int64(1))))
		}, ""},
		{"INT is no rowid", "jobs", func(m *mock) {
			m.ExpectQuery(columns).WithArgs("jobs").WillReturnRows(leaseCols("INT"))
			m.ExpectQuery(idColumn).WithArgs("jobs", "main", "jobs", "main", "id").WillReturnRows(rows("type,pk,pks", row("INT", int64(1), int64(1))))
		}, ""},
		{"attached schema", "aux.jobs", func(m *mock) {
			m.ExpectQuery(columns2).WithArgs("jobs", "aux").WillReturnRows(leaseCols("INTEGER"))
			m.ExpectQuery(idColumn).WithArgs("jobs", "aux", "jobs", "aux", "id").WillReturnRows(rows("type,pk,pks", row("INTEGER", int64(1), int64(1))))
			m.ExpectQuery(auxDDL).WithArgs("jobs").WillReturnRows(rows("sql",
				row("CREATE TABLE jobs (id INTEGER PRIMARY KEY, attempt INTEGER, payload BLOB, locked_until TEXT)")))
		}, "table aux.jobs: its id is INTEGER PRIMARY KEY without AUTOINCREMENT"},
		{"composite key is no rowid", "jobs", func(m *mock) {
			m.ExpectQuery(columns).WithArgs("jobs").WillReturnRows(leaseCols("INTEGER"))
			m.ExpectQuery(idColumn).WithArgs("jobs", "main", "jobs", "main", "id").WillReturnRows(rows("type,pk,pks", row("INTEGER", int64(1), int64(2))))
		}, ""},
		{"WITHOUT ROWID", "jobs", func(m *mock) {
			m.ExpectQuery(columns).WithArgs("jobs").WillReturnRows(leaseCols("INTEGER"))
			m.ExpectQuery(idColumn).WithArgs("jobs", "main", "jobs", "main", "id").WillReturnRows(rows("type,pk,pks", row("INTEGER", int64(1), int64(1))))
			m.ExpectQuery(ddl).WithArgs("jobs").WillReturnRows(rows("sql",
				row("CREATE TABLE jobs (id INTEGER PRIMARY KEY, attempt INTEGER, payload BLOB, locked_until TEXT) WITHOUT ROWID")))
		}, ""},
		{"missing id reported once", "jobs", func(m *mock) {
			m.ExpectQuery(columns).WithArgs("jobs").WillReturnRows(rows("name,type", row("attempt", "INTEGER"), row("payload", "BLOB"), row("locked_until", "TEXT")))
			m.ExpectQuery(idColumn).WithArgs("jobs", "main", "jobs", "main", "id").WillReturnRows(rows("type,pk,pks"))
		}, "table jobs has no column id (Table.ID)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMock(t)
			q := newQueue(t, m, inbox.Config{Dialect: inbox.SQLite, Table: inbox.Table{Name: tc.table, LockedUntil: "locked_until"}})
			m.ExpectQuery(version).WithoutArgs().WillReturnRows(rows("v", row("3.46.1")))
			tc.expect(m)
			err := q.CheckSchema(context.Background())
			var se *inbox.SchemaError
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("CheckSchema = %v, want nil", err)
			case tc.want != "" && (!errors.As(err, &se) || len(se.Problems) != 1 || !strings.HasPrefix(se.Problems[0], tc.want)):
				t.Errorf("CheckSchema = %v, want one problem starting %q", err, tc.want)
			case tc.want != "" && strings.Contains(tc.want, "AUTOINCREMENT") && !strings.Contains(se.Problems[0], "declare it INTEGER PRIMARY KEY AUTOINCREMENT"):
				t.Errorf("problem %q does not say how to fix it", se.Problems[0])
			}
			m.Met(t)
		})
	}
}

func TestSQLiteEnqueue(t *testing.T) {
	m := newMock(t)
	leaseQ := newQueue(t, m, inbox.Config{Dialect: inbox.SQLite, Table: leaseTable})
	advQ := newQueue(t, m, inbox.Config{Dialect: inbox.SQLite, Table: advisoryTable})
	ctx := context.Background()
	p := []byte("p")
	const later = "2024-03-01T13:00:00.123456Z"
	enqueue := func(q *inbox.Queue, job inbox.Job, want any) {
		t.Helper()
		id, err := q.Enqueue(ctx, m.DB, job)
		ok(t, "Enqueue", err)
		if id != want {
			t.Fatalf("Enqueue returned %#v, want %#v", id, want)
		}
	}
	m.ExpectQuery("INSERT INTO `jobs` (`payload`) VALUES (?) RETURNING `id`").WithArgs(p).WillReturnRows(rows("id", row(int64(41))))
	enqueue(leaseQ, inbox.Job{Data: []any{p}}, int64(41))
	m.ExpectQuery("SELECT 1 FROM `dead_jobs` WHERE `id` = ?").WithArgs("j42").WillReturnRows(rows("1"))
	m.ExpectQuery("INSERT INTO `jobs` (`id`, `payload`) VALUES (?, ?) RETURNING `id`").WithArgs("j42", p).WillReturnRows(rows("id", row("j42")))
	enqueue(leaseQ, inbox.Job{ID: "j42", Data: []any{p}}, "j42")
	m.ExpectQuery("INSERT INTO `jobs` (`payload`, `locked_until`) VALUES (?, ?) RETURNING `id`").WithArgs(p, later).WillReturnRows(rows("id", row(int64(43))))
	enqueue(leaseQ, inbox.Job{Data: []any{p}, NotBefore: t0.Add(time.Hour)}, int64(43))
	m.ExpectQuery("SELECT 1 FROM `dead_jobs` WHERE `id` = ?").WithArgs(int64(44)).WillReturnRows(rows("1"))
	m.ExpectQuery("INSERT INTO `jobs` (`id`, `payload`, `locked_until`) VALUES (?, ?, ?) RETURNING `id`").WithArgs(int64(44), p, later).WillReturnRows(rows("id", row(int64(44))))
	enqueue(leaseQ, inbox.Job{ID: int64(44), Data: []any{p}, NotBefore: t0.Add(time.Hour)}, int64(44))
	m.ExpectQuery("INSERT INTO `jobs` (`payload`, `not_before`) VALUES (?, ?) RETURNING `id`").WithArgs(p, later).WillReturnRows(rows("id", row(int64(45))))
	enqueue(advQ, inbox.Job{Data: []any{p}, NotBefore: t0.Add(time.Hour)}, int64(45))
	m.ExpectQuery("SELECT 1 FROM `dead_jobs` WHERE `id` = ?").WithArgs(int64(46)).WillReturnRows(rows("1"))
	m.ExpectQuery("INSERT INTO `jobs` (`id`, `payload`, `not_before`) VALUES (?, ?, ?) RETURNING `id`").WithArgs(int64(46), p, later).WillReturnRows(rows("id", row(int64(46))))
	enqueue(advQ, inbox.Job{ID: int64(46), Data: []any{p}, NotBefore: t0.Add(time.Hour)}, int64(46))
	m.Met(t)
}
