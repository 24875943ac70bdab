package inbox_test

import (
	"context"
	"database/sql/driver"
	"errors"
	"github.com/sqlinbox/inbox/dialect"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/fakeclock"
)

// TestVerdictStatements pins the read a settlement whose outcome is
// unknown sends, per engine and form: a plain read by id.
func TestVerdictStatements(t *testing.T) {
	for _, c := range []struct {
		d     inbox.Dialect
		tb    inbox.Table
		want  string
		empty bool
	}{
		{d: inbox.Postgres, tb: leaseTable, want: `SELECT "attempt", "locked_until" FROM "jobs" WHERE "id" = $1`},
		{d: inbox.Postgres, tb: advisoryTable, want: `SELECT "attempt" FROM "jobs" WHERE "id" = $1`},
		{d: inbox.Postgres, tb: rowLockTable, empty: true},
		{d: inbox.MySQL, tb: leaseTable, want: "SELECT `attempt`, `locked_until` FROM `jobs` WHERE `id` = ?"},
		{d: inbox.MySQL, tb: advisoryTable, want: "SELECT `attempt` FROM `jobs` WHERE `id` = ?"},
		{d: inbox.MySQL, tb: rowLockTable, empty: true},
		{d: inbox.MariaDB, tb: leaseTable, want: "SELECT `attempt`, `locked_until` FROM `jobs` WHERE `id` = ?"},
		{d: inbox.MariaDB, tb: advisoryTable, want: "SELECT `attempt` FROM `jobs` WHERE `id` = ?"},
		{d: inbox.SQLite, tb: leaseTable, want: "SELECT `attempt`, `locked_until` FROM `jobs` WHERE `id` = ?"},
		{d: inbox.SQLite, tb: advisoryTable, want: "SELECT `attempt` FROM `jobs` WHERE `id` = ?"},
	} {
		m := newMock(t)
		q := newQueue(t, m, inbox.Config{Dialect: c.d, Table: c.tb})
		s := q.Statements().Settle.Verdict
		if c.empty {
			if s.SQL != "" {
				t.Errorf("%s %s: Verdict %q, want none", c.d.Name(), q.Form(), s.SQL)
			}
			continue
		}
		if s.SQL != c.want || !s.Rows || len(s.Args) != 1 || s.Args[0] != dialect.ArgID {
			t.Errorf("%s %s: Verdict %q %v rows=%v, want %q [ArgID]", c.d.Name(), q.Form(), s.SQL, s.Args, s.Rows, c.want)
		}
	}
}

const (
	pgLeaseVerdict = `SELECT "attempt", "locked_until" FROM "jobs" WHERE "id" = $1`
	pgAdvVerdict   = `SELECT "attempt" FROM "jobs" WHERE "id" = $1`
)

// TestLeaseReadBack: a lease settlement whose statement fails learns what
// the database holds by extending the lease on its token, which also fences
// the statement should it still run: the token found means the settlement
// did not take effect (its error, the delivery still held); the token gone,
// the row read back tells (gone: the Ack took effect; there with another
// attempt: the lease was lost); both failing is ErrOutcomeUnknown.
func TestLeaseReadBack(t *testing.T) {
	errCut := errors.New("driver: bad connection")
	exp := utc0.Add(time.Minute)
	setup := func(t *testing.T) (*mock, *inbox.Delivery) {
		m := newMock(t)
		q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable, Lease: time.Minute, Now: fakeclock.New(t0).Now})
		m.ExpectQuery(pgLeaseClaimInjected).WithArgs(1, at(utc0), 1, 1, at(exp)).
			WillReturnRows(rows("id,attempt,locked_until,payload", row(int64(7), int64(1), exp, []byte("p"))))
		return m, claim(t, q, 1, 7)[0]
	}
	ctx := context.Background()
	t.Run("not-applied", func(t *testing.T) {
		m, d := setup(t)
		m.ExpectExec(pgLeaseAck).WithArgs(int64(7), int64(2), at(exp)).WillReturnError(errCut)
		m.ExpectExec(pgLeaseExtendInjected).WithArgs(at(exp), int64(7), int64(2), at(exp)).WillReturnResult(affected(1))
		if err := d.Ack(ctx); !errors.Is(err, errCut) || errors.Is(err, inbox.ErrOutcomeUnknown) {
			t.Fatalf("Ack = %v, want the driver's error", err)
		}
		// Still held: it may be settled again.
		m.ExpectExec(pgLeaseAck).WithArgs(int64(7), int64(2), at(exp)).WillReturnResult(affected(1))
		ok(t, "Ack again", d.Ack(ctx))
		m.Met(t)
	})
	t.Run("applied", func(t *testing.T) {
		m, d := setup(t)
		m.ExpectExec(pgLeaseAck).WithArgs(int64(7), int64(2), at(exp)).WillReturnError(errCut)
		m.ExpectExec(pgLeaseExtendInjected).WithArgs(at(exp), int64(7), int64(2), at(exp)).WillReturnResult(affected(0))
		m.ExpectQuery(pgLeaseVerdict).WithArgs(int64(7)).WillReturnRows(rows("attempt,locked_until"))
		ok(t, "Ack whose statement took effect", d.Ack(ctx))
		m.Quiet(t, "a settled delivery", func() {
			if err := d.Ack(ctx); !errors.Is(err, inbox.ErrSettled) || errors.Is(err, inbox.ErrLeaseLost) {
				t.Fatalf("Ack again = %v, want ErrSettled", err)
			}
		})
		m.Met(t)
	})
	t.Run("lost", func(t *testing.T) {
		m, d := setup(t)
		m.ExpectExec(pgLeaseAck).WithArgs(int64(7), int64(2), at(exp)).WillReturnError(errCut)
		m.ExpectExec(pgLeaseExtendInjected).WithArgs(at(exp), int64(7), int64(2), at(exp)).WillReturnResult(affected(0))
		m.ExpectQuery(pgLeaseVerdict).WithArgs(int64(7)).WillReturnRows(rows("attempt,locked_until", row(int64(3), exp.Add(time.Minute))))
		if err := d.Ack(ctx); !errors.Is(err, inbox.ErrLeaseLost) {
			t.Fatalf("Ack = %v, want ErrLeaseLost", err)
		}
		m.Met(t)
	})
	t.Run("unknown", func(t *testing.T) {
		m, d := setup(t)
		m.ExpectExec(pgLeaseAck).WithArgs(int64(7), int64(2), at(exp)).WillReturnError(errCut)
		m.ExpectExec(pgLeaseExtendInjected).WithArgs(at(exp), int64(7), int64(2), at(exp)).WillReturnError(errCut)
		err := d.Ack(ctx)
		if !errors.Is(err, inbox.ErrOutcomeUnknown) || !errors.Is(err, errCut) {
			t.Fatalf("Ack = %v, want ErrOutcomeUnknown and the driver's error", err)
		}
		// The next touch learns: the token gone and the row with it, the
		// first Ack took effect.
		m.ExpectExec(pgLeaseAck).WithArgs(int64(7), int64(2), at(exp)).WillReturnResult(affected(0))
		m.ExpectQuery(pgLeaseVerdict).WithArgs(int64(7)).WillReturnRows(rows("attempt,locked_until"))
		if err := d.Ack(ctx); !errors.Is(err, inbox.ErrSettled) || errors.Is(err, inbox.ErrLeaseLost) {
			t.Fatalf("Ack after an unknown outcome = %v, want ErrSettled", err)
		}
		m.Met(t)
	})
}

// sqlStateErr is a driver error carrying an SQLSTATE, as pq's and pgx's do.
type sqlStateErr string

func (e sqlStateErr) Error() string    { return "ERROR: value too long (SQLSTATE " + string(e) + ")" }
func (e sqlStateErr) SQLState() string { return string(e) }

// TestSettleTextRejected: a lease Retry or Dead, and an advisory Retry,
// whose error text the database refuses go again without it.
func TestSettleTextRejected(t *testing.T) {
	exp := utc0.Add(time.Minute)
	tb := leaseTable
	tb.LastError = "last_error"
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: tb, Lease: time.Minute, Now: fakeclock.New(t0).Now})
	m.ExpectQuery(`WITH picked AS MATERIALIZED (SELECT "id" FROM ((SELECT "id" FROM (SELECT "id" FROM "jobs" WHERE "locked_until" IS NULL ORDER BY "id" LIMIT 2 FOR UPDATE SKIP LOCKED) AS free LIMIT $1) UNION ALL (SELECT "id" FROM (SELECT "id" FROM "jobs" WHERE "locked_until" <= $2 ORDER BY "locked_until" LIMIT 2 FOR UPDATE SKIP LOCKED) AS expired LIMIT $3)) AS c ORDER BY "id" LIMIT $4) UPDATE "jobs" AS j SET "attempt" = j."attempt" + 1, "locked_until" = $5 WHERE j."id" = ANY (ARRAY(SELECT "id" FROM picked)) RETURNING j."id", j."attempt" - 1, j."locked_until", j."payload", j."last_error"`).
		WithArgs(2, at(utc0), 2, 2, at(exp)).
		WillReturnRows(rows("id,attempt,locked_until,payload,last_error",
			row(int64(7), int64(1), exp, []byte("p"), nil), row(int64(8), int64(1), exp, []byte("p"), nil)))
	ds := claim(t, q, 2, 7, 8)
	ctx := context.Background()
	const retry = `UPDATE "jobs" SET "locked_until" = $1, "last_error" = COALESCE($2, "last_error") WHERE "id" = $3 AND "attempt" = $4 AND "locked_until" = $5`
	const dead = `WITH gone AS (DELETE FROM "jobs" WHERE "id" = $1 AND "attempt" = $2 AND "locked_until" = $3 RETURNING "id", "payload", "last_error") INSERT INTO "dead_jobs" ("id", "attempt", "payload", "last_error") SELECT "id", $4, "payload", COALESCE($5, "last_error") FROM gone`
	long := string(make([]byte, 300))
	ds[0].SetError(errors.New(long))
	m.ExpectExec(retry).WithArgs(at(utc0.Add(time.Hour)), anyText{}, int64(7), int64(2), at(exp)).WillReturnError(sqlStateErr("22001"))
	m.ExpectExec(retry).WithArgs(at(utc0.Add(time.Hour)), nil, int64(7), int64(2), at(exp)).WillReturnResult(affected(1))
	ok(t, "Retry with a refused text", ds[0].Retry(ctx, time.Hour))
	ds[1].SetError(errors.New(long))
	m.ExpectExec(dead).WithArgs(int64(8), int64(2), at(exp), int64(1), anyText{}).WillReturnError(sqlStateErr("22001"))
	m.ExpectExec(dead).WithArgs(int64(8), int64(2), at(exp), int64(1), nil).WillReturnResult(affected(1))
	ok(t, "Dead with a refused text", ds[1].Dead(ctx))
	m.Met(t)
}

// anyText matches any string argument.
type anyText struct{}

func (anyText) Match(v driver.Value) bool { _, ok := v.(string); return ok }

// TestAdvisoryReadBack: an advisory settlement whose statement fails reads
// the row on its pinned session, which runs one statement at a time, before
// its lock goes.
func TestAdvisoryReadBack(t *testing.T) {
	errCut := errors.New("driver: bad connection")
	ctx := context.Background()
	for _, c := range []struct {
		name string
		row  [][]any
		want func(err error) bool
	}{
		{"not-applied", [][]any{{int64(2)}}, func(err error) bool { return errors.Is(err, errCut) && !errors.Is(err, inbox.ErrOutcomeUnknown) }},
		{"applied", nil, func(err error) bool { return err == nil }},
		{"lost", [][]any{{int64(3)}}, func(err error) bool { return errors.Is(err, inbox.ErrLeaseLost) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newMock(t)
			q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: advisoryTable})
			pgIdent(m, `"jobs"`)
			m.ExpectQuery(pgAdvLockFirst).WithArgs(10, "public.jobs", 10, 10).WillReturnRows(rows("id,k,a,locked", row(int64(1), int64(1), int64(1), true)))
			m.ExpectQuery(pgAdvClaim).WithArgs(int64(1), int64(1)).WillReturnRows(rows("id,attempt,payload", row(int64(1), int64(1), []byte("p"))))
			d := claim(t, q, 1, 1)[0]
			m.ExpectExec(pgAdvAck).WithArgs(int64(1), int64(2)).WillReturnError(errCut)
			r := rows("attempt")
			for _, v := range c.row {
				r.AddRow(v[0])
			}
			m.ExpectQuery(pgAdvVerdict).WithArgs(int64(1)).WillReturnRows(r)
			pgUnlocked(m, "1")
			if err := d.Ack(ctx); !c.want(err) {
				t.Fatalf("Ack = %v", err)
			}
			m.SameConn(t, pgAdvAck, pgAdvVerdict)
			m.Met(t)
		})
	}
}

// TestAdvisorySweep: an advisory AckTx committed but never confirmed is
// found by the queue's next claim, which reads the row and lets the lock
// and the connection go.
func TestAdvisorySweep(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: advisoryTable})
	pgIdent(m, `"jobs"`)
	m.ExpectQuery(pgAdvLockFirst).WithArgs(10, "public.jobs", 10, 10).WillReturnRows(rows("id,k,a,locked", row(int64(1), int64(1), int64(1), true)))
	m.ExpectQuery(pgAdvClaim).WithArgs(int64(1), int64(1)).WillReturnRows(rows("id,attempt,payload", row(int64(1), int64(1), []byte("p"))))
	d := claim(t, q, 1, 1)[0]
	ctx := context.Background()
	m.ExpectBegin()
	tx, err := m.DB.Begin()
	ok(t, "Begin", err)
	m.ExpectExec(pgAdvAck).WithArgs(int64(1), int64(2)).WillReturnResult(affected(1))
	ok(t, "AckTx", d.AckTx(ctx, tx))
	m.ExpectCommit()
	ok(t, "commit", tx.Commit())
	if n := q.InWork(); n != 1 {
		t.Fatalf("InWork %d before the next claim, want 1: the delivery holds its lock", n)
	}
	// The next claim reads the row: gone, the Ack committed.
	m.ExpectQuery(pgAdvVerdict).WithArgs(int64(1)).WillReturnRows(rows("attempt"))
	pgUnlocked(m, "1")
	m.ExpectQuery(pgAdvLockFirst).WithArgs(10, "public.jobs", 10, 10).WillReturnRows(rows("id,k,a,locked"))
	claim(t, q, 1)
	if n := q.InWork(); n != 0 {
		t.Fatalf("InWork %d after the claim, want 0", n)
	}
	m.Met(t)
}
