package worker_test

// The sqlmock harness of the loop's tests (worker_test.go, fate_run_test.go)
// and the SQL they pin, written out as the root's sql_postgres_test.go,
// sql_mysql_test.go and batch_test.go write it: a change of the SQL fails a
// test here too. The root package exports nothing for them; what the loop
// sends is pinned from outside, as a caller's own tests would pin it.

import (
	"database/sql/driver"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/fakedb"
)

// utc0 is the instant the mocks answer times from, in UTC truncated to the
// microsecond, as the driver hands them back.
var utc0 = time.Date(2024, 3, 1, 12, 0, 0, 123456000, time.UTC)

// The descriptions the pins use: one per form, each with a dead table, the
// row-lock and advisory ones with a not-before column.
var (
	leaseTable    = inbox.Table{Name: "jobs", LockedUntil: "locked_until", DeadTable: "dead_jobs"}
	rowLockTable  = inbox.Table{Name: "jobs", NotBefore: "not_before", DeadTable: "dead_jobs"}
	advisoryTable = inbox.Table{Name: "jobs", AdvisoryKey: "id", NotBefore: "not_before", DeadTable: "dead_jobs"}
)

// mock is a database on the fake driver (internal/fakedb): sqlmock with
// exact SQL matching, behind a driver that logs every call arriving at it.
type mock = fakedb.DB

// newMock returns a mock whose database the test closes at its end.
func newMock(t testing.TB) *mock { t.Helper(); return fakedb.New(t) }

// newQueue returns a queue on m, failing the test on an error.
func newQueue(t testing.TB, m *mock, cfg inbox.Config) *inbox.Queue {
	t.Helper()
	q, err := inbox.New(m.DB, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// at matches a time.Time argument at the instant, in UTC: how the Postgres
// dialect passes times.
type at time.Time

func (a at) Match(v driver.Value) bool {
	t, ok := v.(time.Time)
	return ok && t.Equal(time.Time(a)) && t.Location() == time.UTC
}

// ok fails the test if err is not nil.
func ok(t testing.TB, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// affected is an Exec result of n rows.
func affected(n int64) driver.Result { return sqlmock.NewResult(0, n) }

// rows is a result set with columns cols.
func rows(cols string, vals ...[]driver.Value) *sqlmock.Rows {
	r := sqlmock.NewRows(strings.Split(cols, ","))
	for _, v := range vals {
		r.AddRow(v...)
	}
	return r
}

// row is one row of values.
func row(vals ...driver.Value) []driver.Value { return vals }

// minute is the lease of the pins in microseconds, as the Postgres dialect
// passes lengths under the engine's clock.
const minute = int64(time.Minute / time.Microsecond)

// The schema check's first statements, which the loop runs after an error
// to tell one that may heal from one that cannot.
const (
	pgProbe     = "SELECT pg_catalog.version()"
	myProbe     = "SELECT version(), @@version_comment"
	sqliteProbe = "SELECT sqlite_version()"
)

// PostgreSQL, lease form, under the engine's clock. The claim is that of one
// job: pgClaimUpTo gives the others.
var pgLeaseClaim = pgClaimUpTo(1)

// pgClaimUpTo is the lease claim a claim of up to bound jobs sends (bound a
// power of two, or MaxClaim).
func pgClaimUpTo(bound int) string {
	b := strconv.Itoa(bound)
	return `WITH picked AS MATERIALIZED (SELECT "id" FROM (` +
		`(SELECT "id" FROM (SELECT "id" FROM "jobs" WHERE "locked_until" IS NULL ORDER BY "id" LIMIT ` + b + ` FOR UPDATE SKIP LOCKED) AS free LIMIT $1) UNION ALL ` +
		`(SELECT "id" FROM (SELECT "id" FROM "jobs" WHERE "locked_until" <= statement_timestamp() ORDER BY "locked_until" LIMIT ` + b + ` FOR UPDATE SKIP LOCKED) AS expired LIMIT $2)` +
		`) AS c ORDER BY "id" LIMIT $3) ` +
		`UPDATE "jobs" AS j SET "attempt" = j."attempt" + 1, "locked_until" = (statement_timestamp() + $4 * interval '1 microsecond') WHERE j."id" = ANY (ARRAY(SELECT "id" FROM picked)) ` +
		`RETURNING j."id", j."attempt" - 1, j."locked_until", j."payload"`
}

const (
	pgLeaseAck     = `DELETE FROM "jobs" WHERE "id" = $1 AND "attempt" = $2 AND "locked_until" = $3`
	pgLeaseRetry   = `UPDATE "jobs" SET "locked_until" = (statement_timestamp() + $1 * interval '1 microsecond') WHERE "id" = $2 AND "attempt" = $3 AND "locked_until" = $4`
	pgLeaseRelease = `UPDATE "jobs" SET "locked_until" = NULL, "attempt" = "attempt" - 1 WHERE "id" = $1 AND "attempt" = $2 AND "locked_until" = $3`
	pgLeaseDead    = `WITH gone AS (DELETE FROM "jobs" WHERE "id" = $1 AND "attempt" = $2 AND "locked_until" = $3 RETURNING "id", "payload") ` +
		`INSERT INTO "dead_jobs" ("id", "attempt", "payload") SELECT "id", $4, "payload" FROM gone`
)

// pgBatchWhere is the condition of the Postgres lease batch statements (a
// Batcher's): the tokens as three arrays, the ids named twice by one
// parameter (the $n after it counting on).
func pgBatchWhere(n int) string {
	p := func(k int) string { return fmt.Sprintf("$%d", n+k) }
	return `"id" = ANY (` + p(0) + `) AND ("id", "attempt", "locked_until") IN (SELECT * FROM unnest(` + p(0) +
		`, CAST(` + p(1) + ` AS bigint[]), CAST(` + p(2) + ` AS timestamptz[])))`
}

// pgBatchArgs are the arrays of pgBatchWhere: ids, stored attempts,
// expiries (UTC, microseconds).
func pgBatchArgs(ids, attempts, expiries string) []driver.Value {
	return []driver.Value{ids, attempts, expiries}
}

// PostgreSQL, row-lock form, under the engine's clock.
const (
	pgRowLockClaim = `SELECT "id", "attempt", "payload" FROM "jobs" WHERE ("not_before" IS NULL OR "not_before" <= statement_timestamp()) ORDER BY "id" LIMIT 1 FOR UPDATE SKIP LOCKED`
	pgRowLockAck   = `DELETE FROM "jobs" WHERE "id" = $1`
	pgRowLockRetry = `UPDATE "jobs" SET "attempt" = "attempt" + 1, "not_before" = (statement_timestamp() + $1 * interval '1 microsecond') WHERE "id" = $2`
	pgRowLockDead  = `WITH gone AS (DELETE FROM "jobs" WHERE "id" = $1 RETURNING "id", "payload") INSERT INTO "dead_jobs" ("id", "attempt", "payload") SELECT "id", $2, "payload" FROM gone`
)

// PostgreSQL, advisory form, under the engine's clock. The locks are named
// by the table's identity as the engine resolves it, read once per queue at
// its first claim (the mock answers public.jobs); candidates come a page at
// a time with their attempt, which the claim under the lock requires
// unchanged.
const (
	pgIdentity = `SELECT (SELECT ns.nspname || '.' || c.relname FROM pg_catalog.pg_class c ` +
		`JOIN pg_catalog.pg_namespace ns ON ns.oid = c.relnamespace WHERE c.oid = to_regclass($1))`
	pgAdvCandidates = `SELECT "id", "id", "attempt" FROM "jobs" WHERE ("not_before" IS NULL OR "not_before" <= statement_timestamp()) ORDER BY "id" LIMIT $1`
	pgAdvClaim      = `UPDATE "jobs" SET "attempt" = "attempt" + 1 WHERE "id" = $1 AND "attempt" = $2 AND ("not_before" IS NULL OR "not_before" <= statement_timestamp()) RETURNING "id", "attempt" - 1, "payload"`
	pgAdvAck        = `DELETE FROM "jobs" WHERE "id" = $1 AND "attempt" = $2`
	pgAdvRetry      = `UPDATE "jobs" SET "not_before" = (statement_timestamp() + $1 * interval '1 microsecond') WHERE "id" = $2 AND "attempt" = $3`
	pgAdvRelease    = `UPDATE "jobs" SET "attempt" = "attempt" - 1 WHERE "id" = $1 AND "attempt" = $2`
	pgAdvDead       = `WITH gone AS (DELETE FROM "jobs" WHERE "id" = $1 AND "attempt" = $2 RETURNING "id", "payload") INSERT INTO "dead_jobs" ("id", "attempt", "payload") SELECT "id", $3, "payload" FROM gone`
	pgUnlock        = `SELECT pg_advisory_unlock($1)`
)

// pgLockFirstOf is LockFirst: the candidates' page inside, each key's lock
// tried in claim order on the server and the first taken returned (true);
// else a full page's last row (false), or nothing.
func pgLockFirstOf(cols, page, identity, samePage, limit string) string {
	return `(SELECT ` + cols + `, true FROM (` + page + `) AS c (` + cols + `) WHERE pg_try_advisory_lock(CAST(CAST('x' || encode(substring(sha256(convert_to(` + identity +
		`, 'UTF8') || decode('00', 'hex') || convert_to(COALESCE(CAST(k AS text), ''), 'UTF8')) FROM 1 FOR 8), 'hex') AS bit(64)) AS bigint)) LIMIT 1)` +
		` UNION ALL (SELECT ` + cols + `, false FROM (` + samePage + `) AS c (` + cols + `) OFFSET CAST(` + limit + ` AS bigint) - 1) LIMIT 1`
}

var pgAdvLockFirst = pgLockFirstOf("id, k, a", pgAdvCandidates, "$2",
	`SELECT "id", "id", "attempt" FROM "jobs" WHERE ("not_before" IS NULL OR "not_before" <= statement_timestamp()) ORDER BY "id" LIMIT $3`, "$4")

// pgKey is the advisory lock key of the table whose identity is
// public.jobs, written out: the first eight bytes, as a big-endian int64,
// of SHA-256 over the identity, a zero byte and the key value.
var pgKey = map[string]int64{
	"1": 6207851036127350284, "2": 3420757446354996580, "3": -247041613757985234,
	"4": 7575065213089210996,
}

// pgIdent expects the Postgres identity query for the quoted name and
// answers public.jobs.
func pgIdent(m *mock, quoted string) {
	m.ExpectQuery(pgIdentity).WithArgs(quoted).WillReturnRows(rows("ident", row("public.jobs")))
}

// pgUnlocked expects the unlock of key k.
func pgUnlocked(m *mock, k string) {
	m.ExpectQuery(pgUnlock).WithArgs(pgKey[k]).WillReturnRows(rows("pg_advisory_unlock", row(true)))
}

// MySQL, lease form, under the engine's clock: MySQL has no UPDATE …
// RETURNING, so each read returns the clock too and the queue passes the
// times it computes, as DATETIME(6) text in UTC.
const (
	myLeaseDueClock  = "SELECT `id`, `attempt`, `payload`, UTC_TIMESTAMP(6) FROM `jobs` WHERE `locked_until` <= UTC_TIMESTAMP(6) ORDER BY `locked_until` DESC, `id` DESC LIMIT ? FOR UPDATE SKIP LOCKED"
	myLeaseFreeClock = "SELECT `id`, `attempt`, `payload`, UTC_TIMESTAMP(6) FROM `jobs` WHERE `locked_until` IS NULL ORDER BY `id` LIMIT ? FOR UPDATE SKIP LOCKED"
	// The first read: free rows alone, none while any lease has run out.
	myLeaseFirstClock = "SELECT `id`, `attempt`, `payload`, UTC_TIMESTAMP(6) FROM `jobs` WHERE `locked_until` IS NULL AND (SELECT MAX(`locked_until`) FROM `jobs` WHERE `locked_until` <= UTC_TIMESTAMP(6)) IS NULL ORDER BY `id` LIMIT ? FOR UPDATE SKIP LOCKED"
	// A claim of one marks its row by equality.
	myLeaseMarkOne = "UPDATE `jobs` SET `attempt` = `attempt` + 1, `locked_until` = ? WHERE `id` = ? AND `attempt` = ? AND (`locked_until` <= ? OR `locked_until` IS NULL)"
	myLeaseAck     = "DELETE FROM `jobs` WHERE `id` = ? AND `attempt` = ? AND COALESCE(`locked_until`) = ?"
)
