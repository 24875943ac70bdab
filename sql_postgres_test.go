package inbox_test

// The SQL the Postgres dialect sends, pinned with sqlmock's exact matcher,
// for every form and both clocks. "Engine clock" is Config.Now nil:
// statement_timestamp() in the SQL and lengths as microseconds; "injected"
// passes the caller's times as timestamptz parameters.

import (
	"context"
	"database/sql"
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

// Lease form. The claims are those of one job: pgClaimUpTo gives the others.
var (
	pgLeaseClaim         = pgClaimUpTo(1, false)
	pgLeaseClaimInjected = pgClaimUpTo(1, true)
)

// pgClaimUpTo is the lease claim a claim of up to bound jobs sends (bound a
// power of two, or MaxClaim), under the engine's clock or an injected one.
func pgClaimUpTo(bound int, injected bool) string {
	b := strconv.Itoa(bound)
	if injected {
		return `WITH picked AS MATERIALIZED (SELECT "id" FROM (` +
			`(SELECT "id" FROM (SELECT "id" FROM "jobs" WHERE "locked_until" IS NULL ORDER BY "id" LIMIT ` + b + ` FOR UPDATE SKIP LOCKED) AS free LIMIT $1) UNION ALL ` +
			`(SELECT "id" FROM (SELECT "id" FROM "jobs" WHERE "locked_until" <= $2 ORDER BY "locked_until" LIMIT ` + b + ` FOR UPDATE SKIP LOCKED) AS expired LIMIT $3)` +
			`) AS c ORDER BY "id" LIMIT $4) ` +
			`UPDATE "jobs" AS j SET "attempt" = j."attempt" + 1, "locked_until" = $5 WHERE j."id" = ANY (ARRAY(SELECT "id" FROM picked)) ` +
			`RETURNING j."id", j."attempt" - 1, j."locked_until", j."payload"`
	}
	return `WITH picked AS MATERIALIZED (SELECT "id" FROM (` +
		`(SELECT "id" FROM (SELECT "id" FROM "jobs" WHERE "locked_until" IS NULL ORDER BY "id" LIMIT ` + b + ` FOR UPDATE SKIP LOCKED) AS free LIMIT $1) UNION ALL ` +
		`(SELECT "id" FROM (SELECT "id" FROM "jobs" WHERE "locked_until" <= statement_timestamp() ORDER BY "locked_until" LIMIT ` + b + ` FOR UPDATE SKIP LOCKED) AS expired LIMIT $2)` +
		`) AS c ORDER BY "id" LIMIT $3) ` +
		`UPDATE "jobs" AS j SET "attempt" = j."attempt" + 1, "locked_until" = (statement_timestamp() + $4 * interval '1 microsecond') WHERE j."id" = ANY (ARRAY(SELECT "id" FROM picked)) ` +
		`RETURNING j."id", j."attempt" - 1, j."locked_until", j."payload"`
}

const (
	pgLeaseExtend         = `UPDATE "jobs" SET "locked_until" = (statement_timestamp() + $1 * interval '1 microsecond') WHERE "id" = $2 AND "attempt" = $3 AND "locked_until" = $4 RETURNING "locked_until"`
	pgLeaseExtendInjected = `UPDATE "jobs" SET "locked_until" = $1 WHERE "id" = $2 AND "attempt" = $3 AND "locked_until" = $4`
	pgLeaseAck            = `DELETE FROM "jobs" WHERE "id" = $1 AND "attempt" = $2 AND "locked_until" = $3`
	pgLeaseRetry          = `UPDATE "jobs" SET "locked_until" = (statement_timestamp() + $1 * interval '1 microsecond') WHERE "id" = $2 AND "attempt" = $3 AND "locked_until" = $4`
	pgLeaseRetryInjected  = `UPDATE "jobs" SET "locked_until" = $1 WHERE "id" = $2 AND "attempt" = $3 AND "locked_until" = $4`
	pgLeaseRelease        = `UPDATE "jobs" SET "locked_until" = NULL, "attempt" = "attempt" - 1 WHERE "id" = $1 AND "attempt" = $2 AND "locked_until" = $3`
	pgLeaseDead           = `WITH gone AS (DELETE FROM "jobs" WHERE "id" = $1 AND "attempt" = $2 AND "locked_until" = $3 RETURNING "id", "payload") ` +
		`INSERT INTO "dead_jobs" ("id", "attempt", "payload") SELECT "id", $4, "payload" FROM gone`
)

// Row-lock form, and its claims counter: a side table whose count is
// written from a second session once the held transaction has the row.
const (
	pgRowLockClaim         = `SELECT "id", "attempt", "payload" FROM "jobs" WHERE ("not_before" IS NULL OR "not_before" <= statement_timestamp()) ORDER BY "id" LIMIT 1 FOR UPDATE SKIP LOCKED`
	pgRowLockClaimInjected = `SELECT "id", "attempt", "payload" FROM "jobs" WHERE ("not_before" IS NULL OR "not_before" <= $1) ORDER BY "id" LIMIT 1 FOR UPDATE SKIP LOCKED`
	pgRowLockAck           = `DELETE FROM "jobs" WHERE "id" = $1`
	pgRowLockRetry         = `UPDATE "jobs" SET "attempt" = "attempt" + 1, "not_before" = (statement_timestamp() + $1 * interval '1 microsecond') WHERE "id" = $2`
	pgRowLockRetryInjected = `UPDATE "jobs" SET "attempt" = "attempt" + 1, "not_before" = $1 WHERE "id" = $2`
	pgRowLockDead          = `WITH gone AS (DELETE FROM "jobs" WHERE "id" = $1 RETURNING "id", "payload") INSERT INTO "dead_jobs" ("id", "attempt", "payload") SELECT "id", $2, "payload" FROM gone`

	pgClaimsCount    = `INSERT INTO "job_claims" AS c ("id", claims) VALUES ($1, 1) ON CONFLICT ("id") DO UPDATE SET claims = c.claims + 1 RETURNING claims`
	pgClaimsGiveBack = `UPDATE "job_claims" SET claims = claims - 1 WHERE "id" = $1 AND claims > 0`
	pgClaimsClear    = `DELETE FROM "job_claims" WHERE "id" = $1`
)

// Advisory form. Candidates come a page at a time with their attempt, which
// the claim under the lock requires unchanged.
const (
	pgAdvCandidates              = `SELECT "id", "id", "attempt" FROM "jobs" WHERE ("not_before" IS NULL OR "not_before" <= statement_timestamp()) ORDER BY "id" LIMIT $1`
	pgAdvCandidatesInjected      = `SELECT "id", "id", "attempt" FROM "jobs" WHERE ("not_before" IS NULL OR "not_before" <= $1) ORDER BY "id" LIMIT $2`
	pgAdvCandidatesAfterInjected = `SELECT "id", "id", "attempt" FROM "jobs" WHERE "id" > $1 AND ("not_before" IS NULL OR "not_before" <= $2) ORDER BY "id" LIMIT $3`
	pgAdvClaim                   = `UPDATE "jobs" SET "attempt" = "attempt" + 1 WHERE "id" = $1 AND "attempt" = $2 AND ("not_before" IS NULL OR "not_before" <= statement_timestamp()) RETURNING "id", "attempt" - 1, "payload"`
	pgAdvClaimInjected           = `UPDATE "jobs" SET "attempt" = "attempt" + 1 WHERE "id" = $1 AND "attempt" = $2 AND ("not_before" IS NULL OR "not_before" <= $3) RETURNING "id", "attempt" - 1, "payload"`
	pgAdvAck                     = `DELETE FROM "jobs" WHERE "id" = $1 AND "attempt" = $2`
	pgAdvRetry                   = `UPDATE "jobs" SET "not_before" = (statement_timestamp() + $1 * interval '1 microsecond') WHERE "id" = $2 AND "attempt" = $3`
	pgAdvRetryInjected           = `UPDATE "jobs" SET "not_before" = $1 WHERE "id" = $2 AND "attempt" = $3`
	pgAdvRelease                 = `UPDATE "jobs" SET "attempt" = "attempt" - 1 WHERE "id" = $1 AND "attempt" = $2`
	pgAdvDead                    = `WITH gone AS (DELETE FROM "jobs" WHERE "id" = $1 AND "attempt" = $2 RETURNING "id", "payload") INSERT INTO "dead_jobs" ("id", "attempt", "payload") SELECT "id", $3, "payload" FROM gone`
	pgTryLock                    = `SELECT pg_try_advisory_lock($1)`
	pgUnlock                     = `SELECT pg_advisory_unlock($1)`

	// A key on another column, without a not-before column.
	pgTenantCandidates      = `SELECT "id", "tenant", "attempt" FROM "jobs" ORDER BY "id" LIMIT $1`
	pgTenantCandidatesAfter = `SELECT "id", "tenant", "attempt" FROM "jobs" WHERE "id" > $1 ORDER BY "id" LIMIT $2`
	pgPlainAdvClaim         = `UPDATE "jobs" SET "attempt" = "attempt" + 1 WHERE "id" = $1 AND "attempt" = $2 RETURNING "id", "attempt" - 1, "payload"`
)

// pgLocked and pgUnlocked expect the lock call of key k, answering got, and
// its unlock.
// LockFirst: the candidates' page inside, each key's lock tried in claim
// order on the server and the first taken returned (true); else a full
// page's last row (false), or nothing.
func pgLockFirstOf(cols, page, identity, samePage, limit string) string {
	return `(SELECT ` + cols + `, true FROM (` + page + `) AS c (` + cols + `) WHERE pg_try_advisory_lock(CAST(CAST('x' || encode(substring(sha256(convert_to(` + identity +
		`, 'UTF8') || decode('00', 'hex') || convert_to(COALESCE(CAST(k AS text), ''), 'UTF8')) FROM 1 FOR 8), 'hex') AS bit(64)) AS bigint)) LIMIT 1)` +
		` UNION ALL (SELECT ` + cols + `, false FROM (` + samePage + `) AS c (` + cols + `) OFFSET CAST(` + limit + ` AS bigint) - 1) LIMIT 1`
}

var (
	pgAdvLockFirst = pgLockFirstOf("id, k, a", pgAdvCandidates, "$2",
		`SELECT "id", "id", "attempt" FROM "jobs" WHERE ("not_before" IS NULL OR "not_before" <= statement_timestamp()) ORDER BY "id" LIMIT $3`, "$4")
	pgAdvLockFirstAfter = pgLockFirstOf("id, k, a",
		`SELECT "id", "id", "attempt" FROM "jobs" WHERE "id" > $1 AND ("not_before" IS NULL OR "not_before" <= statement_timestamp()) ORDER BY "id" LIMIT $2`, "$3",
		`SELECT "id", "id", "attempt" FROM "jobs" WHERE "id" > $4 AND ("not_before" IS NULL OR "not_before" <= statement_timestamp()) ORDER BY "id" LIMIT $5`, "$6")
	pgTenantLockFirst   = pgLockFirstOf("id, k, a", pgTenantCandidates, "$2", `SELECT "id", "tenant", "attempt" FROM "jobs" ORDER BY "id" LIMIT $3`, "$4")
	pgTenantLockAfter   = pgLockFirstOf("id, k, a", pgTenantCandidatesAfter, "$3", `SELECT "id", "tenant", "attempt" FROM "jobs" WHERE "id" > $4 ORDER BY "id" LIMIT $5`, "$6")
	pgPriorityLockFirst = pgLockFirstOf("id, k, a, p", `SELECT "id", "id", "attempt", "priority" FROM "jobs" ORDER BY "priority" DESC, "id" LIMIT $1`, "$2",
		`SELECT "id", "id", "attempt", "priority" FROM "jobs" ORDER BY "priority" DESC, "id" LIMIT $3`, "$4")
)

// walkingPostgres is the PostgreSQL dialect without LockFirst: its advisory
// claim walks the candidates from Go, one lock call a key, as MySQL's and a
// dialect without LockFirst do. The walk's tests pin it on PostgreSQL's SQL.
type walkingPostgres struct{ inbox.Dialect }

func (w walkingPostgres) Unwrap() inbox.Dialect { return w.Dialect }

func (w walkingPostgres) Statements(n *dialect.Names) (*inbox.Statements, error) {
	st, err := w.Dialect.Statements(n)
	if err == nil {
		st.Advisory.LockFirst, st.Advisory.LockFirstAfter = dialect.Stmt{}, dialect.Stmt{}
	}
	return st, err
}

var walkPostgres = walkingPostgres{inbox.Postgres}

func pgLocked(m *mock, k string, got bool) {
	m.ExpectQuery(pgTryLock).WithArgs(pgKey[k]).WillReturnRows(rows("pg_try_advisory_lock", row(got)))
}

func pgUnlocked(m *mock, k string) {
	m.ExpectQuery(pgUnlock).WithArgs(pgKey[k]).WillReturnRows(rows("pg_advisory_unlock", row(true)))
}

const minute = int64(time.Minute / time.Microsecond)

func TestPostgresLease(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable, Lease: time.Minute})
	exp := utc0.Add(time.Minute)
	// The driver returns timestamptz in the session's zone; the token is the
	// same instant, in UTC.
	zoned := exp.In(time.FixedZone("EST", -5*3600))
	m.ExpectQuery(pgClaimUpTo(4, false)).WithArgs(4, 4, 4, minute).WillReturnRows(rows("id,attempt,locked_until,payload",
		row(int64(7), int64(1), zoned, []byte("p7")), row(int64(8), int64(3), zoned, []byte("p8")),
		row(int64(9), int64(1), zoned, []byte("p9")), row(int64(10), int64(2), zoned, []byte("p10"))))
	ds := claim(t, q, 4, 7, 8, 9, 10)
	if ds[1].Attempt() != 3 || !ds[1].Expiry().Equal(exp) || ds[1].Expiry().Location() != time.UTC {
		t.Fatalf("delivery 8: attempt %d, expiry %v", ds[1].Attempt(), ds[1].Expiry())
	}
	var p []byte
	ok(t, "Scan", ds[1].Scan(&p))
	if string(p) != "p8" {
		t.Fatalf("payload %q", p)
	}

	// Extend: the engine chooses the new expiry and returns it as the token.
	ext := exp.Add(30 * time.Second)
	m.ExpectQuery(pgLeaseExtend).WithArgs(minute, int64(7), int64(2), at(exp)).WillReturnRows(rows("locked_until", row(ext)))
	ok(t, "Extend", ds[0].Extend(context.Background()))
	if !ds[0].Expiry().Equal(ext) {
		t.Fatalf("Expiry() after Extend = %v, want %v", ds[0].Expiry(), ext)
	}
	m.ExpectExec(pgLeaseAck).WithArgs(int64(7), int64(2), at(ext)).WillReturnResult(affected(1))
	ok(t, "Ack", ds[0].Ack(context.Background()))
	m.ExpectExec(pgLeaseRetry).WithArgs(int64(90_000_000), int64(8), int64(4), at(exp)).WillReturnResult(affected(1))
	ok(t, "Retry", ds[1].Retry(context.Background(), 90*time.Second))
	m.ExpectExec(pgLeaseRelease).WithArgs(int64(9), int64(2), at(exp)).WillReturnResult(affected(1))
	ok(t, "Release", ds[2].Release(context.Background()))
	// Dead is one statement: no transaction around it.
	m.ExpectExec(pgLeaseDead).WithArgs(int64(10), int64(3), at(exp), int64(2)).WillReturnResult(affected(1))
	ok(t, "Dead", ds[3].Dead(context.Background()))
	m.Met(t)
}

func TestPostgresLeaseInjectedClock(t *testing.T) {
	m := newMock(t)
	clk := fakeclock.New(t0)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable, Lease: time.Minute, Now: clk.Now})
	exp := utc0.Add(time.Minute)
	m.ExpectQuery(pgClaimUpTo(2, true)).WithArgs(2, at(utc0), 2, 2, at(exp)).WillReturnRows(rows("id,attempt,locked_until,payload",
		row(int64(7), int64(1), exp, []byte("p7")), row(int64(8), int64(1), exp, []byte("p8"))))
	ds := claim(t, q, 2, 7, 8)

	clk.Advance(20 * time.Second)
	ext := utc0.Add(80 * time.Second)
	m.ExpectExec(pgLeaseExtendInjected).WithArgs(at(ext), int64(7), int64(2), at(exp)).WillReturnResult(affected(1))
	ok(t, "Extend", ds[0].Extend(context.Background()))
	if !ds[0].Expiry().Equal(ext) {
		t.Fatalf("Expiry() after Extend = %v, want %v", ds[0].Expiry(), ext)
	}
	m.ExpectExec(pgLeaseRetryInjected).WithArgs(at(utc0.Add(20*time.Second+2*time.Minute)), int64(7), int64(2), at(ext)).WillReturnResult(affected(1))
	ok(t, "Retry", ds[0].Retry(context.Background(), 2*time.Minute))
	m.ExpectExec(pgLeaseAck).WithArgs(int64(8), int64(2), at(exp)).WillReturnResult(affected(1))
	ok(t, "Ack", ds[1].Ack(context.Background()))
	m.Met(t)
}

// The Tx settlements run their statement in the caller's transaction and
// leave its commit to the caller.
func TestPostgresLeaseTx(t *testing.T) {
	m := newMock(t)
	clk := fakeclock.New(t0)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable, Lease: time.Minute, Now: clk.Now})
	exp := utc0.Add(time.Minute)
	r := rows("id,attempt,locked_until,payload")
	for id := int64(1); id <= 4; id++ {
		r.AddRow(id, int64(1), exp, []byte("p"))
	}
	m.ExpectQuery(pgClaimUpTo(4, true)).WithArgs(4, at(utc0), 4, 4, at(exp)).WillReturnRows(r)
	ds := claim(t, q, 4, 1, 2, 3, 4)
	ctx := context.Background()
	for i, step := range []struct {
		name   string
		expect func()
		settle func(tx *inbox.Delivery, sqlTx func() error) error
	}{
		{"AckTx", func() {
			m.ExpectExec(pgLeaseAck).WithArgs(int64(1), int64(2), at(exp)).WillReturnResult(affected(1))
		}, nil},
		{"RetryTx", func() {
			m.ExpectExec(pgLeaseRetryInjected).WithArgs(at(utc0.Add(time.Hour)), int64(2), int64(2), at(exp)).WillReturnResult(affected(1))
		}, nil},
		{"ReleaseTx", func() {
			m.ExpectExec(pgLeaseRelease).WithArgs(int64(3), int64(2), at(exp)).WillReturnResult(affected(1))
		}, nil},
		{"DeadTx", func() {
			m.ExpectExec(pgLeaseDead).WithArgs(int64(4), int64(2), at(exp), int64(1)).WillReturnResult(affected(1))
		}, nil},
	} {
		m.ExpectBegin()
		tx, err := m.DB.Begin()
		ok(t, "Begin", err)
		step.expect()
		m.ExpectCommit()
		d := ds[i]
		switch step.name {
		case "AckTx":
			err = d.AckTx(ctx, tx)
		case "RetryTx":
			err = d.RetryTx(ctx, tx, time.Hour)
		case "ReleaseTx":
			err = d.ReleaseTx(ctx, tx)
		case "DeadTx":
			err = d.DeadTx(ctx, tx)
		}
		ok(t, step.name, err)
		ok(t, step.name+" commit", tx.Commit())
	}
	m.Met(t)
}

func TestPostgresRowLock(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: rowLockTable})
	cols := "id,attempt,payload"
	m.ExpectBegin()
	m.ExpectQuery(pgRowLockClaim).WithoutArgs().WillReturnRows(rows(cols, row(int64(7), int64(1), []byte("p7"))))
	m.ExpectBegin()
	m.ExpectQuery(pgRowLockClaim).WithoutArgs().WillReturnRows(rows(cols, row(int64(8), int64(2), []byte("p8"))))
	m.ExpectBegin()
	m.ExpectQuery(pgRowLockClaim).WithoutArgs().WillReturnRows(rows(cols))
	m.ExpectRollback()
	ctx, cancel := context.WithCancel(context.Background())
	ds, err := q.Claim(ctx, 5)
	ok(t, "Claim", err)
	cancel()
	if len(ds) != 2 || ds[0].ID() != int64(7) || ds[1].ID() != int64(8) || ds[1].Attempt() != 2 {
		t.Fatalf("Claim returned %d deliveries", len(ds))
	}
	checkHeldTx(t, m, ds, 3)

	// The handler writes through the held transaction; its write commits
	// with the acknowledgement.
	// Tx takes the savepoint that a Retry or Dead would return to first.
	const audit = `INSERT INTO audit (job) VALUES ($1)`
	m.ExpectExec(rowLockSavepoint).WithoutArgs().WillReturnResult(affected(0))
	m.ExpectExec(audit).WithArgs(int64(7)).WillReturnResult(affected(1))
	_, err = ds[0].Tx().ExecContext(context.Background(), audit, int64(7))
	ok(t, "write through Tx", err)
	m.ExpectExec(pgRowLockAck).WithArgs(int64(7)).WillReturnResult(affected(1))
	m.ExpectCommit()
	ok(t, "Ack", ds[0].Ack(context.Background()))
	m.SameConn(t, rowLockSavepoint, audit, pgRowLockAck)
	m.ExpectExec(pgRowLockRetry).WithArgs(int64(30_000_000), int64(8)).WillReturnResult(affected(1))
	m.ExpectCommit()
	ok(t, "Retry", ds[1].Retry(context.Background(), 30*time.Second))

	m.ExpectBegin()
	m.ExpectQuery(pgRowLockClaim).WithoutArgs().WillReturnRows(rows(cols, row(int64(9), int64(1), []byte("p9"))))
	m.ExpectBegin()
	m.ExpectQuery(pgRowLockClaim).WithoutArgs().WillReturnRows(rows(cols, row(int64(10), int64(1), []byte("p10"))))
	m.ExpectBegin()
	m.ExpectQuery(pgRowLockClaim).WithoutArgs().WillReturnRows(rows(cols, row(int64(11), int64(4), []byte("p11"))))
	ds = claim(t, q, 3, 9, 10, 11)
	// The claim wrote nothing: Retry without a delay counts the attempt.
	m.ExpectExec(pgRowLockRetry).WithArgs(int64(0), int64(9)).WillReturnResult(affected(1))
	m.ExpectCommit()
	ok(t, "Retry(0)", ds[0].Retry(context.Background(), 0))
	m.ExpectRollback()
	ok(t, "Release", ds[1].Release(context.Background()))
	m.ExpectExec(pgRowLockDead).WithArgs(int64(11), int64(4)).WillReturnResult(affected(1))
	m.ExpectCommit()
	ok(t, "Dead", ds[2].Dead(context.Background()))
	if q.InWork() != 0 {
		t.Errorf("InWork() = %d after settling all", q.InWork())
	}
	m.Met(t)
}

// checkHeldTx checks the row-lock claim's transactions: READ COMMITTED, and
// still open once Claim has returned and its context has been cancelled,
// which makes database/sql roll back a transaction begun with it.
func checkHeldTx(t *testing.T, m *mock, ds []*inbox.Delivery, begins int) {
	t.Helper()
	iso := m.Isolations()
	if len(iso) != begins {
		t.Fatalf("%d transactions begun, want %d", len(iso), begins)
	}
	for i, l := range iso {
		if l != 2 { // sql.LevelReadCommitted
			t.Errorf("transaction %d begun with isolation %v, want READ COMMITTED", i, l)
		}
	}
	ctxs := m.BeginContexts()
	for i, c := range ctxs {
		if c.Err() != nil {
			t.Errorf("transaction %d began with a context that ended with Claim's: %v", i, c.Err())
		}
	}
	// The transactions are not asked of the deliveries here: Tx takes the
	// handler's savepoint, which the tests that write through it expect.
	if len(ds) > begins {
		t.Fatalf("%d deliveries from %d transactions", len(ds), begins)
	}
}

func TestPostgresRowLockInjectedClock(t *testing.T) {
	m := newMock(t)
	clk := fakeclock.New(t0)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: rowLockTable, Now: clk.Now})
	m.ExpectBegin()
	m.ExpectQuery(pgRowLockClaimInjected).WithArgs(at(utc0)).WillReturnRows(rows("id,attempt,payload", row(int64(7), int64(1), []byte("p"))))
	d := claim(t, q, 1, 7)[0]
	clk.Advance(time.Second)
	m.ExpectExec(pgRowLockRetryInjected).WithArgs(at(utc0.Add(31*time.Second)), int64(7)).WillReturnResult(affected(1))
	m.ExpectCommit()
	ok(t, "Retry", d.Retry(context.Background(), 30*time.Second))
	m.Met(t)
}

// The claims counter: the held transaction takes the row first, then the
// delivery is counted in the side table from a second session, so that the
// count commits whatever becomes of the held transaction and only the row's
// holder can count it. The count includes the delivery being made: when
// more than MaxClaims deliveries before it ended without a settlement, the
// job goes to the dead table through the held transaction, which clears the
// count and commits, and the claim looks for the next job.
func TestPostgresClaimsCounter(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: claimsTable})
	cols := "id,attempt,payload"
	m.ExpectBegin()
	m.ExpectQuery(pgRowLockClaim).WithoutArgs().WillReturnRows(rows(cols, row(int64(7), int64(1), []byte("p7"))))
	m.ExpectQuery(pgClaimsCount).WithArgs(int64(7)).WillReturnRows(rows("claims", row(int64(1))))
	// Job 8's fifth delivery: four before it ended unsettled, more than
	// MaxClaims 3.
	m.ExpectBegin()
	m.ExpectQuery(pgRowLockClaim).WithoutArgs().WillReturnRows(rows(cols, row(int64(8), int64(5), []byte("p8"))))
	m.ExpectQuery(pgClaimsCount).WithArgs(int64(8)).WillReturnRows(rows("claims", row(int64(5))))
	m.ExpectExec(pgRowLockDead).WithArgs(int64(8), int64(5)).WillReturnResult(affected(1))
	m.ExpectExec(pgClaimsClear).WithArgs(int64(8)).WillReturnResult(affected(1))
	m.ExpectCommit()
	// Job 9's fourth: three before it ended unsettled, MaxClaims itself,
	// so it is delivered.
	m.ExpectBegin()
	m.ExpectQuery(pgRowLockClaim).WithoutArgs().WillReturnRows(rows(cols, row(int64(9), int64(4), []byte("p9"))))
	m.ExpectQuery(pgClaimsCount).WithArgs(int64(9)).WillReturnRows(rows("claims", row(int64(4))))
	ds := claim(t, q, 2, 7, 9)
	on := m.Since(t, 0,
		"begin", "query "+pgRowLockClaim, "query "+pgClaimsCount,
		"begin", "query "+pgRowLockClaim, "query "+pgClaimsCount, "exec "+pgRowLockDead, "exec "+pgClaimsClear, "commit",
		"begin", "query "+pgRowLockClaim, "query "+pgClaimsCount)
	for _, c := range [][2]int{{0, 2}, {3, 5}, {9, 11}} {
		if on[c[0]] == on[c[1]] {
			t.Errorf("the count ran on the held transaction's connection %d: calls %v", on[c[0]], on)
		}
	}
	for _, i := range []int{4, 6, 7, 8} {
		if on[i] != on[3] {
			t.Errorf("the dead move ran on connections %v, want the held transaction's alone", on[3:9])
		}
	}
	checkHeldTx(t, m, ds, 3)

	// Every settlement with a verdict clears the count in the held
	// transaction: Retry starts it anew, Ack and Dead remove the job.
	m.ExpectExec(pgRowLockRetry).WithArgs(int64(0), int64(7)).WillReturnResult(affected(1))
	m.ExpectExec(pgClaimsClear).WithArgs(int64(7)).WillReturnResult(affected(1))
	m.ExpectCommit()
	ok(t, "Retry", ds[0].Retry(context.Background(), 0))
	m.ExpectExec(pgRowLockAck).WithArgs(int64(9)).WillReturnResult(affected(1))
	m.ExpectExec(pgClaimsClear).WithArgs(int64(9)).WillReturnResult(affected(1))
	m.ExpectCommit()
	ok(t, "Ack", ds[1].Ack(context.Background()))

	for id := int64(10); id <= 11; id++ {
		m.ExpectBegin()
		m.ExpectQuery(pgRowLockClaim).WithoutArgs().WillReturnRows(rows(cols, row(id, int64(1), []byte("p"))))
		m.ExpectQuery(pgClaimsCount).WithArgs(id).WillReturnRows(rows("claims", row(int64(1))))
	}
	ds = claim(t, q, 2, 10, 11)
	m.ExpectExec(pgRowLockRetry).WithArgs(int64(1_000_000), int64(10)).WillReturnResult(affected(1))
	m.ExpectExec(pgClaimsClear).WithArgs(int64(10)).WillReturnResult(affected(1))
	m.ExpectCommit()
	ok(t, "Retry(1s)", ds[0].Retry(context.Background(), time.Second))
	m.ExpectExec(pgRowLockDead).WithArgs(int64(11), int64(1)).WillReturnResult(affected(1))
	m.ExpectExec(pgClaimsClear).WithArgs(int64(11)).WillReturnResult(affected(1))
	m.ExpectCommit()
	ok(t, "Dead", ds[1].Dead(context.Background()))
	if q.InWork() != 0 {
		t.Errorf("InWork() = %d after settling all", q.InWork())
	}
	m.Met(t)
}

// Release is not a crash: it takes its count back from a second session
// while the held transaction still has the row, so that no other worker
// can count the row in between, and only then rolls back.
func TestPostgresClaimsRelease(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: claimsTable})
	m.ExpectBegin()
	m.ExpectQuery(pgRowLockClaim).WithoutArgs().WillReturnRows(rows("id,attempt,payload", row(int64(7), int64(2), []byte("p7"))))
	m.ExpectQuery(pgClaimsCount).WithArgs(int64(7)).WillReturnRows(rows("claims", row(int64(2))))
	d := claim(t, q, 1, 7)[0]
	held := m.Since(t, 0, "begin", "query "+pgRowLockClaim, "query "+pgClaimsCount)[0]
	n := m.Sent()
	m.ExpectBegin()
	m.ExpectExec(pgClaimsGiveBack).WithArgs(int64(7)).WillReturnResult(affected(1))
	m.ExpectRollback()
	m.ExpectCommit()
	ok(t, "Release", d.Release(context.Background()))
	on := m.Since(t, n, "begin", "exec "+pgClaimsGiveBack, "rollback", "commit")
	if on[1] == held || on[2] != held || on[3] != on[1] {
		t.Errorf("give-back on connection %d (committed on %d) and rollback on %d; want the give-back apart from the held transaction's %d, the rollback on it",
			on[1], on[3], on[2], held)
	}
	// A give-back that fails leaves the count one ahead, the safe side:
	// the rollback still happens and Release succeeds.
	m.ExpectBegin()
	m.ExpectQuery(pgRowLockClaim).WithoutArgs().WillReturnRows(rows("id,attempt,payload", row(int64(7), int64(2), []byte("p7"))))
	m.ExpectQuery(pgClaimsCount).WithArgs(int64(7)).WillReturnRows(rows("claims", row(int64(2))))
	d = claim(t, q, 1, 7)[0]
	m.ExpectBegin()
	m.ExpectExec(pgClaimsGiveBack).WithArgs(int64(7)).WillReturnError(errors.New("connection reset by peer"))
	m.ExpectRollback()
	m.ExpectRollback()
	ok(t, "Release with a failed give-back", d.Release(context.Background()))
	// A holder whose session was cut ended without settling, as a crash
	// does: its rollback fails, and so does Release, and the give-back
	// rolls back, so the count stands.
	m.ExpectBegin()
	m.ExpectQuery(pgRowLockClaim).WithoutArgs().WillReturnRows(rows("id,attempt,payload", row(int64(7), int64(2), []byte("p7"))))
	m.ExpectQuery(pgClaimsCount).WithArgs(int64(7)).WillReturnRows(rows("claims", row(int64(3))))
	d = claim(t, q, 1, 7)[0]
	errCut := errors.New("FATAL: terminating connection due to administrator command (SQLSTATE 57P01)")
	m.ExpectBegin()
	m.ExpectExec(pgClaimsGiveBack).WithArgs(int64(7)).WillReturnResult(affected(1))
	m.ExpectRollback().WillReturnError(errCut)
	m.ExpectRollback()
	if err := d.Release(context.Background()); !errors.Is(err, errCut) {
		t.Errorf("Release of a cut holder: %v, want the driver's error", err)
	}
	if q.InWork() != 0 {
		t.Errorf("InWork() = %d after Release", q.InWork())
	}
	m.Met(t)
}

// A count that fails may still have committed: it is given back (best
// effort), the job's transaction rolls back, and the claim fails as a
// whole, giving back the job it had already counted as Release would.
func TestPostgresClaimsCountError(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: claimsTable})
	errDown := errors.New("connection reset by peer")
	m.ExpectBegin()
	m.ExpectQuery(pgRowLockClaim).WithoutArgs().WillReturnRows(rows("id,attempt,payload", row(int64(6), int64(1), nil)))
	m.ExpectQuery(pgClaimsCount).WithArgs(int64(6)).WillReturnRows(rows("claims", row(int64(1))))
	m.ExpectBegin()
	m.ExpectQuery(pgRowLockClaim).WithoutArgs().WillReturnRows(rows("id,attempt,payload", row(int64(7), int64(1), nil)))
	m.ExpectQuery(pgClaimsCount).WithArgs(int64(7)).WillReturnError(errDown)
	m.ExpectExec(pgClaimsGiveBack).WithArgs(int64(7)).WillReturnResult(affected(1))
	m.ExpectRollback()
	m.ExpectBegin()
	m.ExpectExec(pgClaimsGiveBack).WithArgs(int64(6)).WillReturnResult(affected(1))
	m.ExpectRollback()
	m.ExpectCommit()
	ds, err := q.Claim(context.Background(), 2)
	if !errors.Is(err, errDown) || ds != nil {
		t.Fatalf("Claim = %v, %v; want the driver's error and nothing", ds, err)
	}
	on := m.Since(t, 0,
		"begin", "query "+pgRowLockClaim, "query "+pgClaimsCount,
		"begin", "query "+pgRowLockClaim, "query "+pgClaimsCount, "exec "+pgClaimsGiveBack, "rollback",
		"begin", "exec "+pgClaimsGiveBack, "rollback", "commit")
	if on[7] != on[3] || on[6] == on[3] || on[10] != on[0] || on[9] == on[0] || on[11] != on[9] {
		t.Errorf("connections %v: each give-back must run apart from its held transaction, each rollback on it", on)
	}
	if q.InWork() != 0 {
		t.Errorf("InWork() = %d after a failed claim", q.InWork())
	}
	m.Met(t)
}

func TestPostgresClaimsCounterInjectedClock(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: claimsTable, Now: fakeclock.New(t0).Now})
	m.ExpectBegin()
	m.ExpectQuery(pgRowLockClaimInjected).WithArgs(at(utc0)).WillReturnRows(rows("id,attempt,payload", row(int64(7), int64(1), []byte("p"))))
	m.ExpectQuery(pgClaimsCount).WithArgs(int64(7)).WillReturnRows(rows("claims", row(int64(1))))
	d := claim(t, q, 1, 7)[0]
	m.ExpectExec(pgRowLockAck).WithArgs(int64(7)).WillReturnResult(affected(1))
	m.ExpectExec(pgClaimsClear).WithArgs(int64(7)).WillReturnResult(affected(1))
	m.ExpectCommit()
	ok(t, "Ack", d.Ack(context.Background()))
	m.Met(t)
}

func TestPostgresAdvisory(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: walkPostgres, Table: advisoryTable})
	cols := "id,attempt,payload"
	// The first claim resolves the table's identity, which names the locks.
	pgIdent(m, `"jobs"`)
	// Enough candidates for max 2: twice max, the keys held here, and 8.
	m.ExpectQuery(pgAdvCandidates).WithArgs(12).WillReturnRows(rows("id,id,attempt",
		row(int64(1), int64(1), int64(1)), row(int64(2), int64(2), int64(1)), row(int64(3), int64(3), int64(1))))
	pgLocked(m, "1", false) // another session holds it
	pgLocked(m, "2", true)
	m.ExpectQuery(pgAdvClaim).WithArgs(int64(2), int64(1)).WillReturnRows(rows(cols)) // settled since the candidates were read
	pgUnlocked(m, "2")
	// The page is stale: read afresh, key 1 passed over (found held
	// elsewhere on this very row).
	m.ExpectQuery(pgAdvCandidates).WithArgs(12).WillReturnRows(rows("id,id,attempt",
		row(int64(1), int64(1), int64(1)), row(int64(3), int64(3), int64(1))))
	pgLocked(m, "3", true)
	m.ExpectQuery(pgAdvClaim).WithArgs(int64(3), int64(1)).WillReturnRows(rows(cols, row(int64(3), int64(1), []byte("p3"))))
	// A short page is the table's end: no page after it.
	ds := claim(t, q, 2, 3)
	if ds[0].Key() != "3" || ds[0].Attempt() != 1 {
		t.Fatalf("key %q attempt %d", ds[0].Key(), ds[0].Attempt())
	}
	m.ExpectExec(pgAdvAck).WithArgs(int64(3), int64(2)).WillReturnResult(affected(1))
	pgUnlocked(m, "3")
	ok(t, "Ack", ds[0].Ack(context.Background()))

	// The identity is read once per queue.
	m.ExpectQuery(pgAdvCandidates).WithArgs(16).WillReturnRows(rows("id,id,attempt",
		row(int64(4), int64(4), int64(1)), row(int64(5), int64(5), int64(1)), row(int64(6), int64(6), int64(1)), row(int64(7), int64(7), int64(1))))
	for id := int64(4); id <= 7; id++ {
		pgLocked(m, fmt.Sprint(id), true)
		m.ExpectQuery(pgAdvClaim).WithArgs(id, int64(1)).WillReturnRows(rows(cols, row(id, int64(1), []byte("p"))))
	}
	ds = claim(t, q, 4, 4, 5, 6, 7)
	if q.InWork() != 4 {
		t.Errorf("InWork() = %d, want 4", q.InWork())
	}
	m.ExpectExec(pgAdvRetry).WithArgs(int64(30_000_000), int64(4), int64(2)).WillReturnResult(affected(1))
	pgUnlocked(m, "4")
	ok(t, "Retry", ds[0].Retry(context.Background(), 30*time.Second))
	pgUnlocked(m, "5") // the attempt was committed at claim: nothing to write
	ok(t, "Retry(0)", ds[1].Retry(context.Background(), 0))
	m.ExpectExec(pgAdvRelease).WithArgs(int64(6), int64(2)).WillReturnResult(affected(1))
	pgUnlocked(m, "6")
	ok(t, "Release", ds[2].Release(context.Background()))
	m.ExpectExec(pgAdvDead).WithArgs(int64(7), int64(2), int64(1)).WillReturnResult(affected(1))
	pgUnlocked(m, "7")
	ok(t, "Dead", ds[3].Dead(context.Background()))
	if q.InWork() != 0 {
		t.Errorf("InWork() = %d after settling all", q.InWork())
	}
	m.Met(t)
}

func TestPostgresAdvisoryInjectedClock(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: walkPostgres, Table: advisoryTable, Now: fakeclock.New(t0).Now})
	pgIdent(m, `"jobs"`)
	m.ExpectQuery(pgAdvCandidatesInjected).WithArgs(at(utc0), 10).WillReturnRows(rows("id,id,attempt",
		row(int64(1), int64(1), int64(1)), row(int64(2), int64(2), int64(1)), row(int64(3), int64(3), int64(1)),
		row(int64(4), int64(4), int64(1)), row(int64(5), int64(5), int64(1)), row(int64(6), int64(6), int64(1)),
		row(int64(7), int64(7), int64(1)), row(int64(8), int64(8), int64(1)), row(int64(9), int64(9), int64(1)),
		row(int64(10), int64(10), int64(1))))
	for id := 1; id <= 9; id++ {
		pgLocked(m, fmt.Sprint(id), false)
	}
	m.ExpectQuery(pgTryLock).WithArgs(inbox.PostgresLockKey("public.jobs", "10")).WillReturnRows(rows("pg_try_advisory_lock", row(false)))
	// The page was full: the next one starts past its last id, twice as long.
	m.ExpectQuery(pgAdvCandidatesAfterInjected).WithArgs(int64(10), at(utc0), 20).WillReturnRows(rows("id,id,attempt", row(int64(12), int64(12), int64(3))))
	m.ExpectQuery(pgTryLock).WithArgs(inbox.PostgresLockKey("public.jobs", "12")).WillReturnRows(rows("pg_try_advisory_lock", row(true)))
	m.ExpectQuery(pgAdvClaimInjected).WithArgs(int64(12), int64(3), at(utc0)).WillReturnRows(rows("id,attempt,payload", row(int64(12), int64(3), []byte("p"))))
	d := claim(t, q, 1, 12)[0]
	m.ExpectExec(pgAdvRetryInjected).WithArgs(at(utc0.Add(30*time.Second)), int64(12), int64(4)).WillReturnResult(affected(1))
	m.ExpectQuery(pgUnlock).WithArgs(inbox.PostgresLockKey("public.jobs", "12")).WillReturnRows(rows("pg_advisory_unlock", row(true)))
	ok(t, "Retry", d.Retry(context.Background(), 30*time.Second))
	// The lock, the claim, the settlement and the unlock share the pinned
	// connection: the session that holds the lock.
	m.SameConn(t, pgAdvClaimInjected, pgAdvRetryInjected, pgUnlock)
	m.Met(t)
}

// Candidates are read a page at a time, each twice as long as the last,
// until a claimable job turns up or a page comes back short: jobs of a key
// held elsewhere never hide another key's job however many wait ahead of it,
// and a key found busy costs one lock call per claim, not one per job.
func TestPostgresAdvisoryPages(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: walkPostgres, Table: inbox.Table{Name: "jobs", AdvisoryKey: "tenant"}})
	clock := time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC)
	inbox.SetHeldClock(q, func() time.Time { return clock })
	tenantA := func(from, to int64) *sqlmock.Rows {
		r := rows("id,tenant,attempt")
		for id := from; id <= to; id++ {
			r.AddRow(id, []byte("a"), int64(1))
		}
		return r
	}
	pgIdent(m, `"jobs"`)
	m.ExpectQuery(pgTenantCandidates).WithArgs(10).WillReturnRows(tenantA(1, 10))
	pgLocked(m, "a", false) // another session works on tenant a
	m.ExpectQuery(pgTenantCandidatesAfter).WithArgs(int64(10), 20).WillReturnRows(tenantA(11, 30))
	m.ExpectQuery(pgTenantCandidatesAfter).WithArgs(int64(30), 40).WillReturnRows(tenantA(31, 31).AddRow(int64(32), []byte("b"), int64(2)))
	pgLocked(m, "b", true)
	m.ExpectQuery(pgPlainAdvClaim).WithArgs(int64(32), int64(2)).WillReturnRows(rows("id,attempt,payload", row(int64(32), int64(2), []byte("p"))))
	d := claim(t, q, 1, 32)[0]
	if d.Key() != "b" || d.Attempt() != 2 {
		t.Fatalf("Key() %q Attempt() %d, want b 2", d.Key(), d.Attempt())
	}
	if n := len(m.ConnsOf(pgTryLock)); n != 2 {
		t.Errorf("%d lock calls for 31 jobs of one busy key and one free, want 2", n)
	}

	// Tenant b is in work here, and tenant a was found held by another
	// session just now: both passed over without a lock call. The claim
	// starts at the page of 40 the last one needed; it comes back short,
	// so nothing follows it, and the next claim starts at half of it.
	m.ExpectQuery(pgTenantCandidates).WithArgs(40).WillReturnRows(tenantA(1, 1).AddRow(int64(32), []byte("b"), int64(3)))
	claim(t, q, 1)
	// Tenant a's row 1 is gone (its holder acked it): the key's next row
	// is tried at once, and found held again.
	m.ExpectQuery(pgTenantCandidates).WithArgs(20).WillReturnRows(tenantA(2, 3))
	pgLocked(m, "a", false)
	claim(t, q, 1)
	// Row 2 stays (its holder released it, say): passed over until
	// HeldFor has passed, then tried again.
	clock = clock.Add(inbox.HeldFor - time.Nanosecond)
	m.ExpectQuery(pgTenantCandidates).WithArgs(11).WillReturnRows(tenantA(2, 3))
	claim(t, q, 1)
	clock = clock.Add(time.Nanosecond)
	m.ExpectQuery(pgTenantCandidates).WithArgs(11).WillReturnRows(tenantA(2, 3))
	pgLocked(m, "a", false)
	claim(t, q, 1)
	m.ExpectExec(pgAdvAck).WithArgs(int64(32), int64(3)).WillReturnResult(affected(1))
	pgUnlocked(m, "b")
	ok(t, "Ack", d.Ack(context.Background()))
	m.Met(t)
}

// The claim under the lock requires the attempt the candidate read saw: a
// row settled and claimed again since (by a holder that let its lock go
// before the read) belongs to another delivery. It is passed over and its
// lock let go, and the walk reads its page afresh.
func TestPostgresAdvisoryAttemptCheck(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: walkPostgres, Table: advisoryTable})
	pgIdent(m, `"jobs"`)
	m.ExpectQuery(pgAdvCandidates).WithArgs(10).WillReturnRows(rows("id,id,attempt",
		row(int64(3), int64(3), int64(5)), row(int64(4), int64(4), int64(1))))
	pgLocked(m, "3", true)
	m.ExpectQuery(pgAdvClaim).WithArgs(int64(3), int64(5)).WillReturnRows(rows("id,attempt,payload")) // now at attempt 6
	pgUnlocked(m, "3")
	// The page is stale: read afresh.
	m.ExpectQuery(pgAdvCandidates).WithArgs(10).WillReturnRows(rows("id,id,attempt",
		row(int64(3), int64(3), int64(6)), row(int64(4), int64(4), int64(1))))
	pgLocked(m, "3", false) // the new claim holds it
	pgLocked(m, "4", true)
	m.ExpectQuery(pgAdvClaim).WithArgs(int64(4), int64(1)).WillReturnRows(rows("id,attempt,payload", row(int64(4), int64(1), nil)))
	d := claim(t, q, 1, 4)[0]
	m.ExpectExec(pgAdvAck).WithArgs(int64(4), int64(2)).WillReturnResult(affected(1))
	pgUnlocked(m, "4")
	ok(t, "Ack", d.Ack(context.Background()))
	m.Met(t)
}

// A job's lock depends on the table it lives in, not on how a description
// spells it nor on the pool that reaches it: "jobs" and "public.jobs" both
// resolve to public.jobs. On one pool the key set in work passes the job
// over without a lock call; from another pool the server's lock, named by
// the same key, refuses it.
func TestPostgresAdvisoryIdentity(t *testing.T) {
	m := newMock(t)
	plain := newQueue(t, m, inbox.Config{Dialect: walkPostgres, Table: inbox.Table{Name: "jobs", AdvisoryKey: "id"}})
	qualified := newQueue(t, m, inbox.Config{Dialect: walkPostgres, Table: inbox.Table{Name: "public.jobs", AdvisoryKey: "id"}})
	m2 := newMock(t)
	otherPool := newQueue(t, m2, inbox.Config{Dialect: walkPostgres, Table: inbox.Table{Name: "public.jobs", AdvisoryKey: "id"}})
	const (
		qualCandidates = `SELECT "id", "id", "attempt" FROM "public"."jobs" ORDER BY "id" LIMIT $1`
		qualClaim      = `UPDATE "public"."jobs" SET "attempt" = "attempt" + 1 WHERE "id" = $1 AND "attempt" = $2 RETURNING "id", "attempt" - 1, "payload"`
	)
	pgIdent(m, `"jobs"`)
	m.ExpectQuery(`SELECT "id", "id", "attempt" FROM "jobs" ORDER BY "id" LIMIT $1`).WithArgs(10).WillReturnRows(rows("id,id,attempt", row(int64(3), int64(3), int64(1))))
	pgLocked(m, "3", true)
	m.ExpectQuery(pgPlainAdvClaim).WithArgs(int64(3), int64(1)).WillReturnRows(rows("id,attempt,payload", row(int64(3), int64(1), nil)))
	d := claim(t, plain, 1, 3)[0]

	pgIdent(m, `"public"."jobs"`)
	m.ExpectQuery(qualCandidates).WithArgs(11).WillReturnRows(rows("id,id,attempt", row(int64(3), int64(3), int64(2))))
	claim(t, qualified, 1)

	pgIdent(m2, `"public"."jobs"`)
	m2.ExpectQuery(qualCandidates).WithArgs(10).WillReturnRows(rows("id,id,attempt", row(int64(3), int64(3), int64(2)), row(int64(4), int64(4), int64(1))))
	pgLocked(m2, "3", false) // the same key as the plain queue's
	pgLocked(m2, "4", true)
	m2.ExpectQuery(qualClaim).WithArgs(int64(4), int64(1)).WillReturnRows(rows("id,attempt,payload", row(int64(4), int64(1), nil)))
	d2 := claim(t, otherPool, 1, 4)[0]

	m.ExpectExec(pgAdvAck).WithArgs(int64(3), int64(2)).WillReturnResult(affected(1))
	pgUnlocked(m, "3")
	ok(t, "Ack", d.Ack(context.Background()))
	m2.ExpectExec(`DELETE FROM "public"."jobs" WHERE "id" = $1 AND "attempt" = $2`).WithArgs(int64(4), int64(2)).WillReturnResult(affected(1))
	pgUnlocked(m2, "4")
	ok(t, "Ack", d2.Ack(context.Background()))
	m.Met(t)
	m2.Met(t)
}

// A table the server cannot resolve fails the claim, with nothing claimed
// and nothing kept: the next claim asks again.
func TestPostgresAdvisoryIdentityUnresolved(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: walkPostgres, Table: advisoryTable})
	m.ExpectQuery(pgIdentity).WithArgs(`"jobs"`).WillReturnRows(rows("ident", row(nil)))
	ds, err := q.Claim(context.Background(), 1)
	if err == nil || ds != nil || !strings.Contains(err.Error(), `no table "jobs"`) {
		t.Fatalf("Claim of a table that does not resolve = %v, %v", ds, err)
	}
	errDown := errors.New("connection refused")
	m.ExpectQuery(pgIdentity).WithArgs(`"jobs"`).WillReturnError(errDown)
	if ds, err := q.Claim(context.Background(), 1); !errors.Is(err, errDown) || ds != nil {
		t.Fatalf("Claim = %v, %v; want the driver's error", ds, err)
	}
	pgIdent(m, `"jobs"`)
	m.ExpectQuery(pgAdvCandidates).WithArgs(10).WillReturnRows(rows("id,id,attempt"))
	claim(t, q, 1)
	m.Met(t)
}

// A key on another column keeps the jobs sharing a value in work one at a
// time: the second job of tenant "a" is passed over without a lock call.
func TestPostgresAdvisorySharedKey(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: walkPostgres, Table: inbox.Table{Name: "jobs", AdvisoryKey: "tenant"}})
	pgIdent(m, `"jobs"`)
	m.ExpectQuery(pgTenantCandidates).WithArgs(12).
		WillReturnRows(rows("id,tenant,attempt", row(int64(1), []byte("a"), int64(1)), row(int64(2), []byte("a"), int64(1))))
	pgLocked(m, "a", true)
	m.ExpectQuery(pgPlainAdvClaim).WithArgs(int64(1), int64(1)).WillReturnRows(rows("id,attempt,payload", row(int64(1), int64(1), []byte("p"))))
	d := claim(t, q, 2, 1)[0]
	if d.Key() != "a" {
		t.Fatalf("Key() = %q, want a", d.Key())
	}
	m.ExpectExec(pgAdvAck).WithArgs(int64(1), int64(2)).WillReturnResult(affected(1))
	pgUnlocked(m, "a")
	ok(t, "Ack", d.Ack(context.Background()))
	m.Met(t)
}

// Advisory Tx settlements write in the caller's transaction, and let the
// lock go on the pinned connection once Committed confirms the commit.
func TestPostgresAdvisoryTx(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: walkPostgres, Table: advisoryTable})
	pgIdent(m, `"jobs"`)
	m.ExpectQuery(pgAdvCandidates).WithArgs(16).WillReturnRows(rows("id,id,attempt",
		row(int64(1), int64(1), int64(1)), row(int64(2), int64(2), int64(1)), row(int64(3), int64(3), int64(1)), row(int64(4), int64(4), int64(1))))
	for id := int64(1); id <= 4; id++ {
		pgLocked(m, fmt.Sprint(id), true)
		m.ExpectQuery(pgAdvClaim).WithArgs(id, int64(1)).WillReturnRows(rows("id,attempt,payload", row(id, int64(1), []byte("p"))))
	}
	ds := claim(t, q, 4, 1, 2, 3, 4)
	ctx := context.Background()
	settle := []func(d *inbox.Delivery, tx *sql.Tx) error{
		func(d *inbox.Delivery, tx *sql.Tx) error { return d.AckTx(ctx, tx) },
		func(d *inbox.Delivery, tx *sql.Tx) error { return d.RetryTx(ctx, tx, 30*time.Second) },
		func(d *inbox.Delivery, tx *sql.Tx) error { return d.ReleaseTx(ctx, tx) },
		func(d *inbox.Delivery, tx *sql.Tx) error { return d.DeadTx(ctx, tx) },
	}
	expect := []func(){
		func() { m.ExpectExec(pgAdvAck).WithArgs(int64(1), int64(2)).WillReturnResult(affected(1)) },
		func() {
			m.ExpectExec(pgAdvRetry).WithArgs(int64(30_000_000), int64(2), int64(2)).WillReturnResult(affected(1))
		},
		func() { m.ExpectExec(pgAdvRelease).WithArgs(int64(3), int64(2)).WillReturnResult(affected(1)) },
		func() { m.ExpectExec(pgAdvDead).WithArgs(int64(4), int64(2), int64(1)).WillReturnResult(affected(1)) },
	}
	for i, d := range ds {
		m.ExpectBegin()
		tx, err := m.DB.Begin()
		ok(t, "Begin", err)
		expect[i]()
		ok(t, "settle in tx", settle[i](d, tx))
		m.ExpectCommit()
		ok(t, "commit", tx.Commit())
		// The lock is let go once the commit is confirmed.
		pgUnlocked(m, fmt.Sprint(i+1))
		ok(t, "Committed", d.Committed(tx))
	}
	m.Met(t)
}

func TestPostgresEnqueue(t *testing.T) {
	m := newMock(t)
	leaseQ := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable})
	rowQ := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: rowLockTable})
	ctx := context.Background()
	p := []byte("p")
	later := utc0.Add(time.Hour)
	enqueue := func(q *inbox.Queue, ex inbox.Executor, job inbox.Job, want any) {
		t.Helper()
		id, err := q.Enqueue(ctx, ex, job)
		ok(t, "Enqueue", err)
		if id != want {
			t.Fatalf("Enqueue returned %#v, want %#v", id, want)
		}
	}

	m.ExpectQuery(`INSERT INTO "jobs" ("payload") VALUES ($1) RETURNING "id"`).WithArgs(p).
		WillReturnRows(rows("id", row(int64(41))))
	enqueue(leaseQ, m.DB, inbox.Job{Data: []any{p}}, int64(41))

	// Through the caller's transaction, with a text id: it comes back as a
	// string whatever the driver returns.
	m.ExpectBegin()
	tx, err := m.DB.Begin()
	ok(t, "Begin", err)
	const uuid = "0190c0de-0000-7000-8000-000000000001"
	// A given id is first looked for among the dead jobs: ids are never
	// reused.
	m.ExpectQuery(`SELECT 1 FROM "dead_jobs" WHERE "id" = $1`).WithArgs(uuid).WillReturnRows(rows("1"))
	m.ExpectQuery(`INSERT INTO "jobs" ("id", "payload") VALUES ($1, $2) RETURNING "id"`).WithArgs(uuid, p).
		WillReturnRows(rows("id", row([]byte(uuid))))
	enqueue(leaseQ, tx, inbox.Job{ID: uuid, Data: []any{p}}, uuid)
	m.ExpectCommit()
	ok(t, "Commit", tx.Commit())

	// Through a pinned connection, not before a time: the lease form writes
	// it into its lease column.
	conn, err := m.DB.Conn(ctx)
	ok(t, "Conn", err)
	m.ExpectQuery(`INSERT INTO "jobs" ("payload", "locked_until") VALUES ($1, $2) RETURNING "id"`).WithArgs(p, at(later)).
		WillReturnRows(rows("id", row(int64(43))))
	enqueue(leaseQ, conn, inbox.Job{Data: []any{p}, NotBefore: t0.Add(time.Hour)}, int64(43))
	m.ExpectQuery(`SELECT 1 FROM "dead_jobs" WHERE "id" = $1`).WithArgs(int64(44)).WillReturnRows(rows("1"))
	m.ExpectQuery(`INSERT INTO "jobs" ("id", "payload", "locked_until") VALUES ($1, $2, $3) RETURNING "id"`).WithArgs(int64(44), p, at(later)).
		WillReturnRows(rows("id", row(int64(44))))
	enqueue(leaseQ, conn, inbox.Job{ID: int64(44), Data: []any{p}, NotBefore: t0.Add(time.Hour)}, int64(44))
	conn.Close()

	// The other forms write it into the not-before column.
	m.ExpectQuery(`INSERT INTO "jobs" ("payload", "not_before") VALUES ($1, $2) RETURNING "id"`).WithArgs(p, at(later)).
		WillReturnRows(rows("id", row(int64(45))))
	enqueue(rowQ, m.DB, inbox.Job{Data: []any{p}, NotBefore: t0.Add(time.Hour)}, int64(45))
	m.ExpectQuery(`SELECT 1 FROM "dead_jobs" WHERE "id" = $1`).WithArgs(int64(46)).WillReturnRows(rows("1"))
	m.ExpectQuery(`INSERT INTO "jobs" ("id", "payload", "not_before") VALUES ($1, $2, $3) RETURNING "id"`).WithArgs(int64(46), p, at(later)).
		WillReturnRows(rows("id", row(int64(46))))
	enqueue(rowQ, m.DB, inbox.Job{ID: int64(46), Data: []any{p}, NotBefore: t0.Add(time.Hour)}, int64(46))
	m.Met(t)
}

// deadlockErr is a driver error carrying PostgreSQL's deadlock SQLSTATE.
type deadlockErr struct{}

func (deadlockErr) Error() string    { return "ERROR: deadlock detected (SQLSTATE 40P01)" }
func (deadlockErr) SQLState() string { return "40P01" }

// A settlement outside a transaction that lost a deadlock changed nothing
// and is sent again; one inside the caller's transaction is not.
func TestPostgresDeadlockRetried(t *testing.T) {
	m := newMock(t)
	clk := fakeclock.New(t0)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable, Lease: time.Minute, Now: clk.Now})
	exp := utc0.Add(time.Minute)
	m.ExpectQuery(pgClaimUpTo(2, true)).WithArgs(2, at(utc0), 2, 2, at(exp)).WillReturnRows(rows("id,attempt,locked_until,payload",
		row(int64(7), int64(1), exp, []byte("p7")), row(int64(8), int64(1), exp, []byte("p8"))))
	ds := claim(t, q, 2, 7, 8)
	m.ExpectExec(pgLeaseAck).WithArgs(int64(7), int64(2), at(exp)).WillReturnError(deadlockErr{})
	m.ExpectExec(pgLeaseAck).WithArgs(int64(7), int64(2), at(exp)).WillReturnResult(affected(1))
	ok(t, "Ack after a deadlock", ds[0].Ack(context.Background()))

	m.ExpectBegin()
	tx, err := m.DB.Begin()
	ok(t, "Begin", err)
	m.ExpectExec(pgLeaseAck).WithArgs(int64(8), int64(2), at(exp)).WillReturnError(deadlockErr{})
	if err := ds[1].AckTx(context.Background(), tx); !errors.As(err, new(deadlockErr)) {
		t.Fatalf("AckTx in a transaction that lost a deadlock = %v, want the deadlock error", err)
	}
	m.ExpectRollback()
	ok(t, "Rollback", tx.Rollback())
	m.Met(t)
}

// PostgreSQL's advisory claim locks in SQL: LockFirst walks a page of
// candidates on the server and returns the first whose key it locked; the
// claim re-reads that row under the lock on the same connection. No lock
// call from Go. Each next job is looked for past the last one claimed; a
// row gone before its lock is let go and the next looked for; a short page
// with no free key ends the claim in that one statement.
func TestPostgresAdvisoryLockFirst(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: advisoryTable})
	cols := "id,attempt,payload"
	pgIdent(m, `"jobs"`)
	// Max 2: twice max, the keys held here, and 8.
	m.ExpectQuery(pgAdvLockFirst).WithArgs(12, "public.jobs", 12, 12).WillReturnRows(rows("id,k,a,locked", row(int64(2), int64(2), int64(1), true)))
	m.ExpectQuery(pgAdvClaim).WithArgs(int64(2), int64(1)).WillReturnRows(rows(cols, row(int64(2), int64(1), []byte("p2"))))
	// The next job is looked for past the one claimed.
	m.ExpectQuery(pgAdvLockFirstAfter).WithArgs(int64(2), 12, "public.jobs", int64(2), 12, 12).WillReturnRows(rows("id,k,a,locked", row(int64(3), int64(3), int64(1), true)))
	m.ExpectQuery(pgAdvClaim).WithArgs(int64(3), int64(1)).WillReturnRows(rows(cols)) // acked since the statement read it
	pgUnlocked(m, "3")
	// No key free and the page short (no last row): the table's end.
	m.ExpectQuery(pgAdvLockFirstAfter).WithArgs(int64(2), 12, "public.jobs", int64(2), 12, 12).WillReturnRows(rows("id,k,a,locked"))
	ds := claim(t, q, 2, 2)
	if ds[0].Key() != "2" || ds[0].Attempt() != 1 {
		t.Fatalf("key %q attempt %d", ds[0].Key(), ds[0].Attempt())
	}
	if lock, claimed := append(m.ConnsOf(pgAdvLockFirst), m.ConnsOf(pgAdvLockFirstAfter)...), m.ConnsOf(pgAdvClaim); lock[0] != claimed[0] || lock[1] != claimed[1] {
		t.Errorf("locked on connections %v, claimed on %v: the claim must run in the session holding the lock", lock[:2], claimed)
	}
	if n := len(m.ConnsOf(pgTryLock)); n != 0 {
		t.Errorf("%d lock calls from Go, want none", n)
	}
	m.ExpectExec(pgAdvAck).WithArgs(int64(2), int64(2)).WillReturnResult(affected(1))
	pgUnlocked(m, "2")
	ok(t, "Ack", ds[0].Ack(context.Background()))
	m.Met(t)
}

// A full page whose keys are all held elsewhere: the statement returns its
// last row, unlocked, which starts the next page, twice as long, which the
// server walks too.
func TestPostgresAdvisoryLockFirstPages(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "jobs", AdvisoryKey: "tenant"}})
	pgIdent(m, `"jobs"`)
	m.ExpectQuery(pgTenantLockFirst).WithArgs(10, "public.jobs", 10, 10).WillReturnRows(rows("id,k,a,locked", row(int64(10), []byte("a"), int64(1), false)))
	m.ExpectQuery(pgTenantLockAfter).WithArgs(int64(10), 20, "public.jobs", int64(10), 20, 20).
		WillReturnRows(rows("id,k,a,locked", row(int64(32), []byte("b"), int64(2), true)))
	m.ExpectQuery(pgPlainAdvClaim).WithArgs(int64(32), int64(2)).WillReturnRows(rows("id,attempt,payload", row(int64(32), int64(2), []byte("p"))))
	d := claim(t, q, 1, 32)[0]
	if d.Key() != "b" || d.Attempt() != 2 {
		t.Fatalf("Key() %q Attempt() %d, want b 2", d.Key(), d.Attempt())
	}
	if lock, claimed := m.ConnsOf(pgTenantLockAfter), m.ConnsOf(pgPlainAdvClaim); lock[0] != claimed[0] {
		t.Errorf("locked on connection %d, claimed on %d: the claim must run in the session holding the lock", lock[0], claimed[0])
	}
	m.ExpectExec(pgAdvAck).WithArgs(int64(32), int64(3)).WillReturnResult(affected(1))
	pgUnlocked(m, "b")
	ok(t, "Ack", d.Ack(context.Background()))

	// The next claim starts with the page that found the key; found in
	// that first page, the one after starts at half of it (no less than
	// the claim's own size: twice max plus 8).
	for _, limit := range []int{20, 10} {
		m.ExpectQuery(pgTenantLockFirst).WithArgs(limit, "public.jobs", limit, limit).
			WillReturnRows(rows("id,k,a,locked", row(int64(33), []byte("c"), int64(0), true)))
		m.ExpectQuery(pgPlainAdvClaim).WithArgs(int64(33), int64(0)).WillReturnRows(rows("id,attempt,payload", row(int64(33), int64(0), []byte("p"))))
		d := claim(t, q, 1, 33)[0]
		m.ExpectExec(pgAdvAck).WithArgs(int64(33), int64(1)).WillReturnResult(affected(1))
		m.ExpectQuery(pgUnlock).WillReturnRows(rows("pg_advisory_unlock", row(true)))
		ok(t, "Ack", d.Ack(context.Background()))
	}
	m.Met(t)
}

// The server locked, twice running, a key this process holds without its
// session lock (a delivery whose session ended under it): each lock is let
// go and the claim walks from Go, which passes the key over without a call.
func TestPostgresAdvisoryLockFirstHeldHere(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: advisoryTable})
	cols := "id,attempt,payload"
	pgIdent(m, `"jobs"`)
	m.ExpectQuery(pgAdvLockFirst).WithArgs(10, "public.jobs", 10, 10).WillReturnRows(rows("id,k,a,locked", row(int64(1), int64(1), int64(1), true)))
	m.ExpectQuery(pgAdvClaim).WithArgs(int64(1), int64(1)).WillReturnRows(rows(cols, row(int64(1), int64(1), []byte("p1"))))
	first := claim(t, q, 1, 1)[0]

	// Twice the same key: not a race with a delivery letting it go.
	for i := 0; i < 2; i++ {
		m.ExpectQuery(pgAdvLockFirst).WithArgs(11, "public.jobs", 11, 11).WillReturnRows(rows("id,k,a,locked", row(int64(1), int64(1), int64(2), true)))
		pgUnlocked(m, "1")
	}
	m.ExpectQuery(pgAdvCandidates).WithArgs(11).WillReturnRows(rows("id,id,attempt", row(int64(1), int64(1), int64(2)), row(int64(2), int64(2), int64(1))))
	pgLocked(m, "2", true)
	m.ExpectQuery(pgAdvClaim).WithArgs(int64(2), int64(1)).WillReturnRows(rows(cols, row(int64(2), int64(1), []byte("p2"))))
	second := claim(t, q, 1, 2)[0]
	for _, d := range []*inbox.Delivery{first, second} {
		m.ExpectExec(pgAdvAck).WithArgs(d.ID(), int64(2)).WillReturnResult(affected(1))
		pgUnlocked(m, d.Key())
		ok(t, "Ack", d.Ack(context.Background()))
	}
	m.Met(t)
}

// With priorities the page is in claim order, highest first; the outer
// statement adds no ORDER BY, which would sort after the locks were tried.
func TestPostgresAdvisoryLockFirstPriority(t *testing.T) {
	q := newQueue(t, newMock(t), inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "jobs", AdvisoryKey: "id", Priority: "priority"}})
	st := q.Statements()
	if st.Advisory.LockFirst.SQL != pgPriorityLockFirst {
		t.Fatalf("LockFirst:\n%s\nwant\n%s", st.Advisory.LockFirst.SQL, pgPriorityLockFirst)
	}
	if want := []dialect.Arg{dialect.ArgLimit, dialect.ArgIdentity, dialect.ArgLimit, dialect.ArgLimit}; fmt.Sprint(st.Advisory.LockFirst.Args) != fmt.Sprint(want) {
		t.Fatalf("LockFirst args %v, want %v", st.Advisory.LockFirst.Args, want)
	}
}

// A claim of n jobs sends the statement bounded by the smallest of 1, 2, 4,
// …, 512 and MaxClaim at or above n, its bound written in the text and n a
// parameter; on other engines Claim.For is Claim, or Claim.TakeOne for one job.
func TestClaimFor(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable, Lease: time.Minute})
	st := q.Statements()
	for n, bound := range map[int]int{1: 1, 2: 2, 3: 4, 4: 4, 16: 16, 17: 32, 256: 256, 512: 512, 513: inbox.MaxClaim, inbox.MaxClaim: inbox.MaxClaim} {
		if got, want := st.Claim.For(n).SQL, pgClaimUpTo(bound, false); got != want {
			t.Errorf("Claim.For(%d):\n got %s\nwant %s", n, got, want)
		}
	}
	if st.Claim.Take.SQL != pgClaimUpTo(inbox.MaxClaim, false) {
		t.Errorf("Claim is not bounded by MaxClaim: %s", st.Claim.Take.SQL)
	}
	sq := newQueue(t, m, inbox.Config{Dialect: inbox.SQLite, Table: leaseTable, Lease: time.Minute}).Statements()
	if sq.Claim.For(1).SQL != sq.Claim.TakeOne.SQL || sq.Claim.For(2).SQL != sq.Claim.Take.SQL || len(sq.Claim.TakeBounded) != 0 {
		t.Errorf("SQLite: Claim.For(1) %q, Claim.For(2) %q", sq.Claim.For(1).SQL, sq.Claim.For(2).SQL)
	}
	m.Met(t)
}

// A dialect whose Claim.TakeBounded does not hold the eleven bounds is refused
// by New, naming the field, before any I/O.
func TestNewRefusesClaimBounded(t *testing.T) {
	m := newMock(t)
	_, err := inbox.New(m.DB, inbox.Config{Dialect: editedDialect{inbox.Postgres, func(st *inbox.Statements) { st.Claim.TakeBounded = st.Claim.TakeBounded[:3] }}, Table: leaseTable})
	if err == nil || !strings.Contains(err.Error(), "Statements.Claim.TakeBounded has 3 statements, want 11") {
		t.Fatalf("New: %v, want the Claim.TakeBounded refused", err)
	}
	m.Met(t)
	if n := m.Sent(); n != 0 {
		t.Errorf("New sent %d calls", n)
	}
}
