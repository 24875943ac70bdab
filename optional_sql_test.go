package inbox_test

import (
	"github.com/sqlinbox/inbox/dialect"
	"reflect"
	"strings"
	"testing"

	"github.com/sqlinbox/inbox"
)

// TestOptionalColumnsSQL pins, per engine and form, the statements that the
// optional columns change (Table.LastError, Table.Priority,
// Table.EnqueuedAt): the claims return the last error and the priority and
// order by priority, Retry and Dead write the error (COALESCE keeps the
// row's when none is recorded), Enqueue writes the priority and the enqueue
// time, Stats counts by indexed reads.
func TestOptionalColumnsSQL(t *testing.T) {
	tables := map[string]inbox.Table{
		"lease":         {Name: "jobs", LockedUntil: "locked_until", DeadTable: "dead", LastError: "last_error", Priority: "priority", EnqueuedAt: "enqueued_at"},
		"row lock":      {Name: "jobs", NotBefore: "not_before", DeadTable: "dead", LastError: "last_error", Priority: "priority", EnqueuedAt: "enqueued_at"},
		"advisory lock": {Name: "jobs", AdvisoryKey: "id", NotBefore: "not_before", DeadTable: "dead", LastError: "last_error", Priority: "priority", EnqueuedAt: "enqueued_at"},
	}
	dialects := map[string]inbox.Dialect{"postgres": inbox.Postgres, "mysql": inbox.MySQL, "sqlite": inbox.SQLite}
	for _, w := range []struct{ engine, form, field, sql string }{
		{"postgres", "lease", "Claim.Take", `WITH picked AS MATERIALIZED (SELECT "id" FROM ((SELECT "id", "priority" FROM (SELECT "id", "priority" FROM "jobs" WHERE "locked_until" IS NULL ORDER BY "priority" DESC, "id" LIMIT 1000 FOR UPDATE SKIP LOCKED) AS free LIMIT $1) UNION ALL (SELECT "id", "priority" FROM (SELECT "id", "priority" FROM "jobs" WHERE "locked_until" <= statement_timestamp() ORDER BY "priority" DESC, "id" LIMIT 1000 FOR UPDATE SKIP LOCKED) AS expired LIMIT $2)) AS c ORDER BY "priority" DESC, "id" LIMIT $3) UPDATE "jobs" AS j SET "attempt" = j."attempt" + 1, "locked_until" = (statement_timestamp() + $4 * interval '1 microsecond') WHERE j."id" = ANY (ARRAY(SELECT "id" FROM picked)) RETURNING j."id", j."attempt" - 1, j."locked_until", j."payload", j."last_error", j."priority"`},
		{"postgres", "lease", "Settle.Retry", `UPDATE "jobs" SET "locked_until" = (statement_timestamp() + $1 * interval '1 microsecond'), "last_error" = COALESCE($2, "last_error") WHERE "id" = $3 AND "attempt" = $4 AND "locked_until" = $5`},
		{"postgres", "lease", "Settle.Dead", `WITH gone AS (DELETE FROM "jobs" WHERE "id" = $1 AND "attempt" = $2 AND "locked_until" = $3 RETURNING "id", "payload", "last_error") INSERT INTO "dead" ("id", "attempt", "payload", "last_error") SELECT "id", $4, "payload", COALESCE($5, "last_error") FROM gone`},
		{"postgres", "lease", "Jobs.Enqueue", `INSERT INTO "jobs" ("payload", "priority", "enqueued_at") VALUES ($1, $2, statement_timestamp()) RETURNING "id"`},
		{"postgres", "lease", "Jobs.Stats", `SELECT (SELECT COUNT(*) FROM "jobs" WHERE "locked_until" IS NULL) + (SELECT COUNT(*) FROM "jobs" WHERE "locked_until" <= CAST(statement_timestamp() AS timestamptz)), (SELECT COUNT(*) FROM "jobs" WHERE "locked_until" > (statement_timestamp() + $1 * interval '1 microsecond')) + (SELECT COUNT(*) FROM "jobs" WHERE "locked_until" > CAST(statement_timestamp() AS timestamptz) AND "locked_until" <= (statement_timestamp() + $2 * interval '1 microsecond') AND "attempt" = 1), (SELECT COUNT(*) FROM "jobs" WHERE "locked_until" > CAST(statement_timestamp() AS timestamptz) AND "locked_until" <= (statement_timestamp() + $3 * interval '1 microsecond') AND "attempt" <> 1), (SELECT COUNT(*) FROM "dead"), CAST(EXTRACT(EPOCH FROM (CAST(statement_timestamp() AS timestamptz) - LEAST((SELECT MIN("enqueued_at") FROM "jobs" WHERE "locked_until" IS NULL), (SELECT MIN("enqueued_at") FROM "jobs" WHERE "locked_until" <= CAST(statement_timestamp() AS timestamptz))))) * 1000000 AS bigint)`},
		{"postgres", "row lock", "Claim.Take", `SELECT "id", "attempt", "payload", "last_error", "priority" FROM "jobs" WHERE ("not_before" IS NULL OR "not_before" <= statement_timestamp()) ORDER BY "priority" DESC, "id" LIMIT 1 FOR UPDATE SKIP LOCKED`},
		{"postgres", "row lock", "Settle.Retry", `UPDATE "jobs" SET "attempt" = "attempt" + 1, "not_before" = (statement_timestamp() + $1 * interval '1 microsecond'), "last_error" = COALESCE($2, "last_error") WHERE "id" = $3`},
		{"postgres", "row lock", "Settle.Dead", `WITH gone AS (DELETE FROM "jobs" WHERE "id" = $1 RETURNING "id", "payload", "last_error") INSERT INTO "dead" ("id", "attempt", "payload", "last_error") SELECT "id", $2, "payload", COALESCE($3, "last_error") FROM gone`},
		{"postgres", "row lock", "Jobs.Enqueue", `INSERT INTO "jobs" ("payload", "priority", "enqueued_at") VALUES ($1, $2, statement_timestamp()) RETURNING "id"`},
		{"postgres", "row lock", "Jobs.Stats", `SELECT (SELECT COUNT(*) FROM "jobs" WHERE "not_before" IS NULL) + (SELECT COUNT(*) FROM "jobs" WHERE "not_before" <= CAST(statement_timestamp() AS timestamptz)), (SELECT COUNT(*) FROM "jobs" WHERE "not_before" > CAST(statement_timestamp() AS timestamptz)), (SELECT COUNT(DISTINCT pid) FROM pg_catalog.pg_locks WHERE relation = '"jobs"'::regclass AND mode IN ('RowShareLock', 'RowExclusiveLock') AND granted), (SELECT COUNT(*) FROM "dead"), CAST(EXTRACT(EPOCH FROM (CAST(statement_timestamp() AS timestamptz) - LEAST((SELECT MIN("enqueued_at") FROM "jobs" WHERE "not_before" IS NULL), (SELECT MIN("enqueued_at") FROM "jobs" WHERE "not_before" <= CAST(statement_timestamp() AS timestamptz))))) * 1000000 AS bigint)`},
		{"postgres", "advisory lock", "Claim.Take", `UPDATE "jobs" SET "attempt" = "attempt" + 1 WHERE "id" = $1 AND "attempt" = $2 AND ("not_before" IS NULL OR "not_before" <= statement_timestamp()) RETURNING "id", "attempt" - 1, "payload", "last_error", "priority"`},
		{"postgres", "advisory lock", "Advisory.Candidates", `SELECT "id", "id", "attempt", "priority" FROM "jobs" WHERE ("not_before" IS NULL OR "not_before" <= statement_timestamp()) ORDER BY "priority" DESC, "id" LIMIT $1`},
		{"postgres", "advisory lock", "Advisory.CandidatesAfter", `SELECT "id", "id", "attempt", "priority" FROM "jobs" WHERE ("priority" < $1 OR "priority" = $2 AND "id" > $3) AND ("not_before" IS NULL OR "not_before" <= statement_timestamp()) ORDER BY "priority" DESC, "id" LIMIT $4`},
		{"postgres", "advisory lock", "Settle.Retry", `UPDATE "jobs" SET "not_before" = (statement_timestamp() + $1 * interval '1 microsecond'), "last_error" = COALESCE($2, "last_error") WHERE "id" = $3 AND "attempt" = $4`},
		{"postgres", "advisory lock", "Settle.Dead", `WITH gone AS (DELETE FROM "jobs" WHERE "id" = $1 AND "attempt" = $2 RETURNING "id", "payload", "last_error") INSERT INTO "dead" ("id", "attempt", "payload", "last_error") SELECT "id", $3, "payload", COALESCE($4, "last_error") FROM gone`},
		{"postgres", "advisory lock", "Jobs.Enqueue", `INSERT INTO "jobs" ("payload", "priority", "enqueued_at") VALUES ($1, $2, statement_timestamp()) RETURNING "id"`},
		{"postgres", "advisory lock", "Jobs.Stats", `SELECT (SELECT COUNT(*) FROM "jobs" WHERE "not_before" IS NULL) + (SELECT COUNT(*) FROM "jobs" WHERE "not_before" <= CAST(statement_timestamp() AS timestamptz)), (SELECT COUNT(*) FROM "jobs" WHERE "not_before" > CAST(statement_timestamp() AS timestamptz)), -1, (SELECT COUNT(*) FROM "dead"), CAST(EXTRACT(EPOCH FROM (CAST(statement_timestamp() AS timestamptz) - LEAST((SELECT MIN("enqueued_at") FROM "jobs" WHERE "not_before" IS NULL), (SELECT MIN("enqueued_at") FROM "jobs" WHERE "not_before" <= CAST(statement_timestamp() AS timestamptz))))) * 1000000 AS bigint)`},
		{"mysql", "lease", "Claim.Pick", "SELECT `id`, `priority` FROM `jobs` WHERE `locked_until` <= UTC_TIMESTAMP(6) ORDER BY `priority` DESC, `id` LIMIT ?"},
		{"mysql", "lease", "Claim.PickAfter", "SELECT `id`, `priority` FROM `jobs` WHERE `locked_until` <= UTC_TIMESTAMP(6) AND (`priority` < ? OR `priority` = ? AND `id` > ?) ORDER BY `priority` DESC, `id` LIMIT ?"},
		{"mysql", "lease", "Claim.PickMore", "SELECT `id`, `priority` FROM `jobs` WHERE `locked_until` IS NULL ORDER BY `priority` DESC, `id` LIMIT ?"},
		{"mysql", "lease", "Claim.PickMoreAfter", "SELECT `id`, `priority` FROM `jobs` WHERE `locked_until` IS NULL AND (`priority` < ? OR `priority` = ? AND `id` > ?) ORDER BY `priority` DESC, `id` LIMIT ?"},
		{"mysql", "lease", "Claim.PickLock", "SELECT `id`, `attempt`, `payload`, `last_error`, `priority`, UTC_TIMESTAMP(6) FROM `jobs` WHERE `id` IN (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) AND (COALESCE(`locked_until`) IS NULL OR COALESCE(`locked_until`) <= UTC_TIMESTAMP(6)) ORDER BY `id` LIMIT ? FOR UPDATE SKIP LOCKED"},
		{"mysql", "lease", "Claim.Select", ""},
		{"mysql", "lease", "Claim.SelectMore", ""},
		{"mysql", "lease", "Settle.Retry", "UPDATE `jobs` SET `locked_until` = ?, `last_error` = COALESCE(?, `last_error`) WHERE `id` = ? AND `attempt` = ? AND COALESCE(`locked_until`) = ?"},
		{"mysql", "lease", "Settle.Dead", "INSERT INTO `dead` (`id`, `attempt`, `payload`, `last_error`) SELECT `id`, ?, `payload`, COALESCE(?, `last_error`) FROM `jobs` WHERE `id` = ? AND `attempt` = ? AND COALESCE(`locked_until`) = ?"},
		{"mysql", "lease", "Jobs.Enqueue", "INSERT INTO `jobs` (`payload`, `priority`, `enqueued_at`) VALUES (?, ?, UTC_TIMESTAMP(6))"},
		{"mysql", "lease", "Jobs.Stats", "SELECT (SELECT COUNT(*) FROM `jobs` WHERE `locked_until` IS NULL) + (SELECT COUNT(*) FROM `jobs` WHERE `locked_until` <= ?), (SELECT COUNT(*) FROM `jobs` WHERE `locked_until` > ?) + (SELECT COUNT(*) FROM `jobs` WHERE `locked_until` > ? AND `locked_until` <= ? AND `attempt` = 1), (SELECT COUNT(*) FROM `jobs` WHERE `locked_until` > ? AND `locked_until` <= ? AND `attempt` <> 1), (SELECT COUNT(*) FROM `dead`), TIMESTAMPDIFF(MICROSECOND, COALESCE(LEAST((SELECT MIN(`enqueued_at`) FROM `jobs` WHERE `locked_until` IS NULL), (SELECT MIN(`enqueued_at`) FROM `jobs` WHERE `locked_until` <= ?)), (SELECT MIN(`enqueued_at`) FROM `jobs` WHERE `locked_until` IS NULL), (SELECT MIN(`enqueued_at`) FROM `jobs` WHERE `locked_until` <= ?)), ?)"},
		{"mysql", "row lock", "Claim.Take", ""},
		{"mysql", "row lock", "Claim.Pick", "SELECT `id`, `priority` FROM `jobs` WHERE (`not_before` IS NULL OR `not_before` <= UTC_TIMESTAMP(6)) ORDER BY `priority` DESC, `id` LIMIT ?"},
		{"mysql", "row lock", "Claim.PickAfter", "SELECT `id`, `priority` FROM `jobs` WHERE (`priority` < ? OR `priority` = ? AND `id` > ?) AND (`not_before` IS NULL OR `not_before` <= UTC_TIMESTAMP(6)) ORDER BY `priority` DESC, `id` LIMIT ?"},
		{"mysql", "row lock", "Claim.PickLock", "SELECT `id`, `attempt`, `payload`, `last_error`, `priority` FROM `jobs` WHERE `id` IN (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) AND (COALESCE(`not_before`) IS NULL OR COALESCE(`not_before`) <= UTC_TIMESTAMP(6)) ORDER BY `id` LIMIT ? FOR UPDATE SKIP LOCKED"},
		{"mysql", "row lock", "Settle.Retry", "UPDATE `jobs` SET `attempt` = `attempt` + 1, `not_before` = ?, `last_error` = COALESCE(?, `last_error`) WHERE `id` = ?"},
		{"mysql", "row lock", "Settle.Dead", "INSERT INTO `dead` (`id`, `attempt`, `payload`, `last_error`) SELECT `id`, ?, `payload`, COALESCE(?, `last_error`) FROM `jobs` WHERE `id` = ?"},
		{"mysql", "row lock", "Jobs.Enqueue", "INSERT INTO `jobs` (`payload`, `priority`, `enqueued_at`) VALUES (?, ?, UTC_TIMESTAMP(6))"},
		{"mysql", "row lock", "Jobs.Stats", "SELECT (SELECT COUNT(*) FROM `jobs` WHERE `not_before` IS NULL) + (SELECT COUNT(*) FROM `jobs` WHERE `not_before` <= ?), (SELECT COUNT(*) FROM `jobs` WHERE `not_before` > ?), -1, (SELECT COUNT(*) FROM `dead`), TIMESTAMPDIFF(MICROSECOND, COALESCE(LEAST((SELECT MIN(`enqueued_at`) FROM `jobs` WHERE `not_before` IS NULL), (SELECT MIN(`enqueued_at`) FROM `jobs` WHERE `not_before` <= ?)), (SELECT MIN(`enqueued_at`) FROM `jobs` WHERE `not_before` IS NULL), (SELECT MIN(`enqueued_at`) FROM `jobs` WHERE `not_before` <= ?)), ?)"},
		{"mysql", "advisory lock", "Claim.Select", "SELECT `id`, `attempt`, `payload`, `last_error`, `priority` FROM `jobs` WHERE `id` = ? AND `attempt` = ? AND (`not_before` IS NULL OR `not_before` <= UTC_TIMESTAMP(6))"},
		{"mysql", "advisory lock", "Advisory.Candidates", "SELECT `id`, `id`, `attempt`, `priority` FROM `jobs` WHERE (`not_before` IS NULL OR `not_before` <= UTC_TIMESTAMP(6)) ORDER BY `priority` DESC, `id` LIMIT ?"},
		{"mysql", "advisory lock", "Advisory.CandidatesAfter", "SELECT `id`, `id`, `attempt`, `priority` FROM `jobs` WHERE (`priority` < ? OR `priority` = ? AND `id` > ?) AND (`not_before` IS NULL OR `not_before` <= UTC_TIMESTAMP(6)) ORDER BY `priority` DESC, `id` LIMIT ?"},
		{"mysql", "advisory lock", "Settle.Retry", "UPDATE `jobs` SET `not_before` = ?, `last_error` = COALESCE(?, `last_error`) WHERE `id` = ? AND `attempt` = ?"},
		{"mysql", "advisory lock", "Settle.Dead", "INSERT INTO `dead` (`id`, `attempt`, `payload`, `last_error`) SELECT `id`, ?, `payload`, COALESCE(?, `last_error`) FROM `jobs` WHERE `id` = ? AND `attempt` = ?"},
		{"mysql", "advisory lock", "Jobs.Enqueue", "INSERT INTO `jobs` (`payload`, `priority`, `enqueued_at`) VALUES (?, ?, UTC_TIMESTAMP(6))"},
		{"mysql", "advisory lock", "Jobs.Stats", "SELECT (SELECT COUNT(*) FROM `jobs` WHERE `not_before` IS NULL) + (SELECT COUNT(*) FROM `jobs` WHERE `not_before` <= ?), (SELECT COUNT(*) FROM `jobs` WHERE `not_before` > ?), -1, (SELECT COUNT(*) FROM `dead`), TIMESTAMPDIFF(MICROSECOND, COALESCE(LEAST((SELECT MIN(`enqueued_at`) FROM `jobs` WHERE `not_before` IS NULL), (SELECT MIN(`enqueued_at`) FROM `jobs` WHERE `not_before` <= ?)), (SELECT MIN(`enqueued_at`) FROM `jobs` WHERE `not_before` IS NULL), (SELECT MIN(`enqueued_at`) FROM `jobs` WHERE `not_before` <= ?)), ?)"},
		{"sqlite", "lease", "Claim.Take", "UPDATE `jobs` SET `attempt` = `attempt` + 1, `locked_until` = ? WHERE `id` IN (SELECT `id` FROM (SELECT `id`, `priority` FROM (SELECT `id`, `priority` FROM `jobs` WHERE `locked_until` IS NULL ORDER BY `priority` DESC, `id` LIMIT ?) UNION ALL SELECT `id`, `priority` FROM (SELECT `id`, `priority` FROM `jobs` WHERE `locked_until` <= ? ORDER BY `priority` DESC, +`id` LIMIT ?) ORDER BY `priority` DESC, `id` LIMIT ?)) RETURNING `id`, `attempt` - 1, `locked_until`, `payload`, `last_error`, `priority`"},
		{"sqlite", "lease", "Settle.Retry", "UPDATE `jobs` SET `locked_until` = ?, `last_error` = COALESCE(?, `last_error`) WHERE `id` = ? AND `attempt` = ? AND `locked_until` = ?"},
		{"sqlite", "lease", "Settle.Dead", "INSERT INTO `dead` (`id`, `attempt`, `payload`, `last_error`) SELECT `id`, ?, `payload`, COALESCE(?, `last_error`) FROM `jobs` WHERE `id` = ? AND `attempt` = ? AND `locked_until` = ?"},
		{"sqlite", "lease", "Jobs.Enqueue", "INSERT INTO `jobs` (`payload`, `priority`, `enqueued_at`) VALUES (?, ?, ?) RETURNING `id`"},
		{"sqlite", "lease", "Jobs.Stats", "SELECT (SELECT COUNT(*) FROM `jobs` WHERE `locked_until` IS NULL) + (SELECT COUNT(*) FROM `jobs` WHERE `locked_until` <= ?), (SELECT COUNT(*) FROM `jobs` WHERE `locked_until` > ?) + (SELECT COUNT(*) FROM `jobs` WHERE `locked_until` > ? AND `locked_until` <= ? AND `attempt` = 1), (SELECT COUNT(*) FROM `jobs` WHERE `locked_until` > ? AND `locked_until` <= ? AND `attempt` <> 1), (SELECT COUNT(*) FROM `dead`), CAST((julianday(?) - julianday(COALESCE(MIN((SELECT MIN(`enqueued_at`) FROM `jobs` WHERE `locked_until` IS NULL), (SELECT MIN(`enqueued_at`) FROM `jobs` WHERE `locked_until` <= ?)), (SELECT MIN(`enqueued_at`) FROM `jobs` WHERE `locked_until` IS NULL), (SELECT MIN(`enqueued_at`) FROM `jobs` WHERE `locked_until` <= ?)))) * 86400000000 AS INTEGER)"},
		{"sqlite", "advisory lock", "Claim.Take", "UPDATE `jobs` SET `attempt` = `attempt` + 1 WHERE `id` = ? AND `attempt` = ? AND (`not_before` IS NULL OR `not_before` <= ?) RETURNING `id`, `attempt` - 1, `payload`, `last_error`, `priority`"},
		{"sqlite", "advisory lock", "Advisory.Candidates", "SELECT `id`, `id`, `attempt`, `priority` FROM `jobs` WHERE (`not_before` IS NULL OR `not_before` <= ?) ORDER BY `priority` DESC, `id` LIMIT ?"},
		{"sqlite", "advisory lock", "Advisory.CandidatesAfter", "SELECT `id`, `id`, `attempt`, `priority` FROM `jobs` WHERE (`priority` < ? OR `priority` = ? AND `id` > ?) AND (`not_before` IS NULL OR `not_before` <= ?) ORDER BY `priority` DESC, `id` LIMIT ?"},
		{"sqlite", "advisory lock", "Settle.Retry", "UPDATE `jobs` SET `not_before` = ?, `last_error` = COALESCE(?, `last_error`) WHERE `id` = ? AND `attempt` = ?"},
		{"sqlite", "advisory lock", "Settle.Dead", "INSERT INTO `dead` (`id`, `attempt`, `payload`, `last_error`) SELECT `id`, ?, `payload`, COALESCE(?, `last_error`) FROM `jobs` WHERE `id` = ? AND `attempt` = ?"},
		{"sqlite", "advisory lock", "Jobs.Enqueue", "INSERT INTO `jobs` (`payload`, `priority`, `enqueued_at`) VALUES (?, ?, ?) RETURNING `id`"},
		{"sqlite", "advisory lock", "Jobs.Stats", "SELECT (SELECT COUNT(*) FROM `jobs` WHERE `not_before` IS NULL) + (SELECT COUNT(*) FROM `jobs` WHERE `not_before` <= ?), (SELECT COUNT(*) FROM `jobs` WHERE `not_before` > ?), -1, (SELECT COUNT(*) FROM `dead`), CAST((julianday(?) - julianday(COALESCE(MIN((SELECT MIN(`enqueued_at`) FROM `jobs` WHERE `not_before` IS NULL), (SELECT MIN(`enqueued_at`) FROM `jobs` WHERE `not_before` <= ?)), (SELECT MIN(`enqueued_at`) FROM `jobs` WHERE `not_before` IS NULL), (SELECT MIN(`enqueued_at`) FROM `jobs` WHERE `not_before` <= ?)))) * 86400000000 AS INTEGER)"},
	} {
		m := newMock(t)
		q := newQueue(t, m, inbox.Config{Dialect: dialects[w.engine], Table: tables[w.form]})
		got := stmtAt(q.Statements(), w.field).SQL
		if got != w.sql {
			t.Errorf("%s %s %s:\n got %s\nwant %s", w.engine, w.form, w.field, got, w.sql)
		}
	}
}

// stmtAt returns the statement at path ("Claim.Take") in st.
func stmtAt(st *inbox.Statements, path string) dialect.Stmt {
	v := reflect.ValueOf(*st)
	for _, name := range strings.Split(path, ".") {
		v = v.FieldByName(name)
	}
	return v.Interface().(dialect.Stmt)
}
