package inbox

// The MariaDB dialect: MySQL's statements, but a batched Ack is one
// DELETE … RETURNING outside any transaction, whose returned ids are the
// verdicts. sqlmock pins the SQL; the Batcher helpers are batch_test.go's.

import (
	"context"
	"database/sql/driver"
	"errors"
	"github.com/sqlinbox/inbox/dialect"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
)

const (
	mdbAck2   = "DELETE FROM `jobs` WHERE (`id`, `attempt`, COALESCE(`locked_until`)) IN ((?, ?, ?), (?, ?, ?)) RETURNING `id`"
	mdbAckOne = "DELETE FROM `jobs` WHERE (`id` = ? AND `attempt` = ? AND COALESCE(`locked_until`) = ?) RETURNING `id`"
	mdbExp    = "2024-03-01 12:00:30.123456"
)

func TestMariaDBName(t *testing.T) {
	if MariaDB.Name() != "mariadb" || MySQL.Name() != "mysql" {
		t.Fatalf("names %q and %q, want mariadb and mysql", MariaDB.Name(), MySQL.Name())
	}
}

// One statement, no transaction: the ids returned were acknowledged, the
// others lost their leases.
func TestBatchAckMariaDB(t *testing.T) {
	db, sm := btMock(t)
	q := btNew(t, db, MariaDB, false)
	b := btBatcher(t, q, BatchConfig{MaxBatch: 2, MaxWait: time.Hour})
	sm.ExpectQuery(mdbAck2).
		WithArgs(int64(1), int64(2), mdbExp, int64(2), int64(2), mdbExp).
		WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(2)))
	r1 := btStart(t, b, func() error { return b.Ack(context.Background(), btDel(q, int64(1), 1, btExp)) })
	r2 := btStart(t, b, func() error { return b.Ack(context.Background(), btDel(q, int64(2), 1, btExp)) })
	btWant(t, "ack 1 (stale)", btWait(t, r1), ErrLeaseLost)
	btWant(t, "ack 2", btWait(t, r2), nil)
	btMet(t, sm)
}

// AckAll, as a worker with a claim of several jobs calls it: the same one
// statement, each delivery its own verdict.
func TestBatchAckAllMariaDB(t *testing.T) {
	db, sm := btMock(t)
	q := btNew(t, db, MariaDB, false)
	b := btBatcher(t, q, BatchConfig{MaxBatch: 2, MaxWait: time.Hour})
	sm.ExpectQuery(mdbAck2).
		WithArgs(int64(7), int64(2), mdbExp, int64(8), int64(3), mdbExp).
		WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(7)).AddRow(int64(8)))
	errs := b.AckAll(context.Background(), []*Delivery{btDel(q, int64(7), 1, btExp), btDel(q, int64(8), 2, btExp)})
	for i, err := range errs {
		btWant(t, "ack "+string(rune('7'+i)), err, nil)
	}
	btMet(t, sm)
}

// A lone Ack: plain conditions (MariaDB scans for a one-row IN in a
// prepared statement), RETURNING all the same.
func TestBatchAckMariaDBAlone(t *testing.T) {
	db, sm := btMock(t)
	q := btNew(t, db, MariaDB, false)
	b := btBatcher(t, q, BatchConfig{MaxBatch: 1})
	sm.ExpectQuery(mdbAckOne).WithArgs(int64(1), int64(2), mdbExp).WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(1)))
	sm.ExpectQuery(mdbAckOne).WithArgs(int64(2), int64(2), mdbExp).WillReturnRows(sqlmock.NewRows([]string{"id"}))
	btWant(t, "ack 1", b.Ack(context.Background(), btDel(q, int64(1), 1, btExp)), nil)
	btWant(t, "ack 2 (stale)", b.Ack(context.Background(), btDel(q, int64(2), 1, btExp)), ErrLeaseLost)
	btMet(t, sm)
}

// A deadlock's victim deleted nothing and is sent again; an error after
// some rows came back (the statement's commit failing) is every token's
// verdict, never an acknowledgement.
func TestBatchAckMariaDBErrors(t *testing.T) {
	db, sm := btMock(t)
	q := btNew(t, db, MariaDB, false)
	b := btBatcher(t, q, BatchConfig{MaxBatch: 2, MaxWait: time.Hour})
	args := []driver.Value{int64(1), int64(2), mdbExp, int64(2), int64(2), mdbExp}
	sm.ExpectQuery(mdbAck2).WithArgs(args...).WillReturnError(errors.New("Error 1213 (40001): Deadlock found when trying to get lock; try restarting transaction"))
	sm.ExpectQuery(mdbAck2).WithArgs(args...).WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(1)).AddRow(int64(2)))
	errs := b.AckAll(context.Background(), []*Delivery{btDel(q, int64(1), 1, btExp), btDel(q, int64(2), 1, btExp)})
	btWant(t, "ack 1 after a deadlock", errs[0], nil)
	btWant(t, "ack 2 after a deadlock", errs[1], nil)

	broken := errors.New("connection lost")
	sm.ExpectQuery(mdbAck2).WithArgs(args...).
		WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(1)).AddRow(int64(2)).RowError(1, broken))
	errs = b.AckAll(context.Background(), []*Delivery{btDel(q, int64(1), 1, btExp), btDel(q, int64(2), 1, btExp)})
	for i, err := range errs {
		if !errors.Is(err, broken) {
			t.Errorf("ack %d, rows cut short: got %v, want the statement's error", i+1, err)
		}
	}
	btMet(t, sm)
}

// Retry and Release: UPDATE has no RETURNING on MariaDB, so they are
// MySQL's, in a transaction whose rows affected is checked.
func TestBatchOutcomesMariaDB(t *testing.T) {
	db, sm := btMock(t)
	q := btNew(t, db, MariaDB, false)
	b := btBatcher(t, q, BatchConfig{MaxBatch: 2, MaxWait: time.Hour})
	const retry2 = "UPDATE `jobs` SET `locked_until` = DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND) WHERE (`id`, `attempt`, COALESCE(`locked_until`)) IN ((?, ?, ?), (?, ?, ?))"
	sm.ExpectBegin()
	sm.ExpectExec(retry2).WithArgs(int64(2000000), int64(1), int64(2), mdbExp, int64(2), int64(2), mdbExp).WillReturnResult(sqlmock.NewResult(0, 2))
	sm.ExpectCommit()
	sm.ExpectExec("UPDATE `jobs` SET `locked_until` = NULL, `attempt` = `attempt` - 1 WHERE (`id` = ? AND `attempt` = ? AND COALESCE(`locked_until`) = ?)").
		WithArgs(int64(3), int64(2), mdbExp).WillReturnResult(sqlmock.NewResult(0, 1))
	ctx := context.Background()
	r1 := btStart(t, b, func() error { return b.Retry(ctx, btDel(q, int64(1), 1, btExp), 2*time.Second) })
	r2 := btStart(t, b, func() error { return b.Retry(ctx, btDel(q, int64(2), 1, btExp), 2*time.Second) })
	btWant(t, "retry 1", btWait(t, r1), nil)
	btWant(t, "retry 2", btWait(t, r2), nil)
	// A lone Release needs no transaction: its rows affected decide.
	one := btBatcher(t, q, BatchConfig{MaxBatch: 1})
	btWant(t, "release", one.Release(ctx, btDel(q, int64(3), 1, btExp)), nil)
	btMet(t, sm)
}

// The schema check refuses a server that is not MariaDB, naming the
// dialect to use; on MariaDB it is MySQL's.
func TestCheckSchemaMariaDB(t *testing.T) {
	const (
		probe   = "SELECT version(), @@version_comment"
		columns = "SELECT column_name, column_type FROM information_schema.columns WHERE table_schema = COALESCE(NULLIF(?, ''), DATABASE()) AND table_name = ?"
		fill    = "SELECT column_name, column_default, extra, COALESCE(generation_expression, '') FROM information_schema.columns " +
			"WHERE table_schema = COALESCE(NULLIF(?, ''), DATABASE()) AND table_name = ? AND column_name IN (?, ?)"
		engine = "SELECT COALESCE(engine, '') FROM information_schema.tables WHERE table_schema = COALESCE(NULLIF(?, ''), DATABASE()) AND table_name = ?"
	)
	for _, tc := range []struct {
		version string
		want    []string
	}{
		{"10.11.19-MariaDB-0+deb12u1", nil},
		{"8.0.36", []string{"8.0.36", "not MariaDB", "RETURNING", "inbox.MySQL"}},
		{"10.5.27-MariaDB", []string{"10.6", "SKIP LOCKED"}},
	} {
		t.Run(tc.version, func(t *testing.T) {
			db, sm := btMock(t)
			q := btNew(t, db, MariaDB, false)
			sm.ExpectQuery(probe).WithoutArgs().WillReturnRows(sqlmock.NewRows([]string{"version", "version_comment"}).
				AddRow(tc.version, "Debian 12"))
			sm.ExpectQuery(columns).WithArgs("", "jobs").WillReturnRows(sqlmock.NewRows([]string{"column_name", "column_type"}).
				AddRow("id", "bigint").AddRow("attempt", "int").AddRow("payload", "blob").AddRow("locked_until", "datetime(6)"))
			sm.ExpectQuery(fill).WithArgs("", "jobs", "id", "id").WillReturnRows(sqlmock.NewRows([]string{"column_name", "column_default", "extra", "generation_expression"}).
				AddRow("id", nil, "auto_increment", ""))
			sm.ExpectQuery(engine).WithArgs("", "jobs").WillReturnRows(sqlmock.NewRows([]string{"engine"}).AddRow("InnoDB"))
			expectIDPrimary(sm)
			if tc.want == nil {
				expectClockReads(sm, 0, 0, 0, 0)
			}
			err := q.CheckSchema(context.Background())
			btMet(t, sm)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("CheckSchema = %v, want nil", err)
				}
				return
			}
			var se *SchemaError
			if !errors.As(err, &se) || len(se.Problems) != 1 {
				t.Fatalf("CheckSchema = %v, want one problem", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(se.Problems[0], w) {
					t.Errorf("problem %q does not name %q", se.Problems[0], w)
				}
			}
		})
	}
}

// MariaDB claims as MySQL does: the row lock with a not-before column and
// the lease with a priority pick (sql_mysql_test.go pins their SQL). Its
// claim reads alone end with the session's level (maLevel).
func TestMariaDBClaimsAreMySQLs(t *testing.T) {
	db, _ := btMock(t)
	for _, tb := range []Table{
		{Name: "jobs", NotBefore: "not_before", Priority: "priority"},
		{Name: "jobs", NotBefore: "not_before"},
		{Name: "jobs"},
		{Name: "jobs", LockedUntil: "locked_until", Priority: "priority"},
		{Name: "jobs", LockedUntil: "locked_until"},
		{Name: "jobs", LockedUntil: "locked_until", Shallow: true},
		{Name: "jobs", LockedUntil: "locked_until", Shallow: true, Priority: "priority"},
	} {
		var st [2]*Statements
		for i, d := range []Dialect{MySQL, MariaDB} {
			q, err := New(db, Config{Dialect: d, Table: tb})
			if err != nil {
				t.Fatal(err)
			}
			st[i] = q.Statements()
		}
		my, mdb := st[0], st[1]
		for _, f := range []struct {
			name   string
			my, md dialect.Stmt
			read   bool // a claim read: MariaDB's ends with maLevel
		}{
			{"Claim", my.Claim.Take, mdb.Claim.Take, true}, {"Claim.Select", my.Claim.Select, mdb.Claim.Select, true},
			{"Claim.SelectMore", my.Claim.SelectMore, mdb.Claim.SelectMore, true}, {"Claim.SelectMoreOne", my.Claim.SelectMoreOne, mdb.Claim.SelectMoreOne, true},
			{"Claim.SelectFree", my.Claim.SelectFree, mdb.Claim.SelectFree, true}, {"Claim.SelectFreeOne", my.Claim.SelectFreeOne, mdb.Claim.SelectFreeOne, true},
			{"Claim.Mark", my.Claim.Mark, mdb.Claim.Mark, false}, {"Claim.MarkOne", my.Claim.MarkOne, mdb.Claim.MarkOne, false},
			{"Pick", my.Claim.Pick, mdb.Claim.Pick, false}, {"PickAfter", my.Claim.PickAfter, mdb.Claim.PickAfter, false}, {"PickMore", my.Claim.PickMore, mdb.Claim.PickMore, false},
			{"PickMoreAfter", my.Claim.PickMoreAfter, mdb.Claim.PickMoreAfter, false}, {"PickLock", my.Claim.PickLock, mdb.Claim.PickLock, true},
		} {
			md := f.md.SQL
			if f.read {
				md = strings.Replace(md, maLevel, "", 1)
			}
			if f.my.SQL != md || f.my.Clock != f.md.Clock || len(f.my.Args) != len(f.md.Args) || f.my.Level {
				t.Errorf("%+v: %s differs:\n mysql   %s\n mariadb %s", tb, f.name, f.my.SQL, f.md.SQL)
			}
			if want := f.read && f.md.SQL != ""; f.md.Level != want || strings.Contains(f.md.SQL, maLevel) != want {
				t.Errorf("%+v: %s: Level %v, want %v: %s", tb, f.name, f.md.Level, want, f.md.SQL)
			}
		}
		if mdb.Claim.PickFirst.SQL != "" && !mdb.Claim.PickFirst.Level {
			t.Errorf("%+v: PickFirst has no level: %s", tb, mdb.Claim.PickFirst.SQL)
		}
		if mdb.Claim.WalkFirst.SQL != "" && !mdb.Claim.WalkFirst.Level {
			t.Errorf("%+v: WalkFirst has no level: %s", tb, mdb.Claim.WalkFirst.SQL)
		}
		// MariaDB alone walks a row lock with a not-before column, or the
		// indexed lease, without a priority (the primary key is then the
		// claim order).
		walks := tb.Priority == "" && ((tb.NotBefore != "" && tb.LockedUntil == "") || (tb.LockedUntil != "" && !tb.Shallow))
		if my.Claim.WalkFirst.SQL != "" || (mdb.Claim.WalkFirst.SQL != "") != walks {
			t.Errorf("%+v: WalkFirst %q (mysql), %q (mariadb)", tb, my.Claim.WalkFirst.SQL, mdb.Claim.WalkFirst.SQL)
		}
		if (tb.NotBefore != "" || tb.Priority != "") != (my.Claim.PickLock.SQL != "") {
			t.Errorf("%+v: PickLock %q", tb, my.Claim.PickLock.SQL)
		}
		// MariaDB alone picks the row lock's first page in one statement.
		if my.Claim.PickFirst.SQL != "" || (mdb.Claim.PickFirst.SQL != "") != (tb.NotBefore != "") {
			t.Errorf("%+v: PickFirst %q (mysql), %q (mariadb)", tb, my.Claim.PickFirst.SQL, mdb.Claim.PickFirst.SQL)
		}
	}
}
