package dbtest

// Plans of the statements the optional columns bring (issue 11), read as
// explain_test.go reads the lease claim's, on 20,000 rows, with the indexes
// docs/schema.md recommends (the same as bench/depth.go's):
//   - Queue.Stats reads the queue table through indexes alone: no Seq Scan
//     (PostgreSQL), no ALL (MariaDB), no SCAN of the table (SQLite); its
//     counts are index ranges and the age of the oldest ready job is the
//     first entry of an index on enqueued_at;
//   - the claim by priority reads its index in claim order, from the head:
//     no full scan, no sort of the table (MySQL's SKIP LOCKED needs that:
//     after a filesort it skips the first row in order when it is held and
//     returns none), and no more rows read than it claims.
//
// The table: rows under a lease (or not-before time) in force, some ending
// within a lease and some far beyond, a few due, and the ready mass of low
// priority, with ten of high priority last (the highest ids), which a claim
// in id order would reach last.

import (
	"context"
	"database/sql"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
)

// opsPrioHigh is the high priority of the plans' tables; the others are 0.
const opsPrioHigh = 10

// opsExplainIndexes are the recommended indexes of a form with a priority,
// and, with stats, those Queue.Stats needs too (docs/schema.md).
// PostgreSQL lease: the free jobs in claim order (partial) and the expiry;
// MariaDB and SQLite lease: (expiry, priority DESC, id), whose NULL range
// is the free jobs in claim order; row lock and advisory: (priority DESC,
// id). Stats: an index on the time column (lease: the expiry; others:
// not_before) for the counts, and one on enqueued_at among the rows whose
// time column is NULL for the oldest: PostgreSQL a partial index,
// MariaDB and SQLite (time, enqueued_at), whose NULL range is in
// enqueued_at order.
func opsExplainIndexes(e Engine, form, table string, stats bool) []string {
	idx := func(name, def string) string {
		return "CREATE INDEX " + table + "_" + name + " ON " + table + " " + def
	}
	var out []string
	switch {
	case form == "lease" && e.IsPostgres():
		out = []string{idx("free", "(priority DESC, id) WHERE locked_until IS NULL"), idx("lu", "(locked_until)")}
	case form == "lease":
		out = []string{idx("claimable", "(locked_until, priority DESC, id)")}
	default:
		out = []string{idx("prio", "(priority DESC, id)")}
	}
	if !stats {
		return out
	}
	switch {
	case e.IsPostgres() && form == "lease":
		out = append(out, idx("free_age", "(enqueued_at) WHERE locked_until IS NULL"))
	case e.IsPostgres():
		out = append(out, idx("ready", "(not_before, id)"), idx("ready_age", "(enqueued_at) WHERE not_before IS NULL"))
	case form == "lease":
		out = append(out, idx("age", "(locked_until, enqueued_at)"))
	default:
		out = append(out, idx("age", "(not_before, enqueued_at)"))
	}
	return out
}

// opsPart is a run of rows of the plans' table.
type opsPart struct {
	n        int
	at       time.Duration // the time column's offset from now; 0: NULL
	priority int
}

// opsShape is the plans' table, part by part in id order: 2,000 rows held
// within a lease of now (lease form only), 2,000 waiting a day, 10 due an
// hour ago, the ready mass and ten of high priority: 20,000 rows.
func opsShape(form string) []opsPart {
	parts := []opsPart{{2000, 24 * time.Hour, 0}, {10, -time.Hour, 0}, {15980, 0, 0}, {10, 0, opsPrioHigh}}
	if form == "lease" {
		return append([]opsPart{{2000, 30 * time.Second, 0}}, parts...)
	}
	parts[2].n += 2000
	return parts
}

// opsExplainTable creates table for form with the optional columns, loads
// opsShape (every job enqueued an hour before now, a payload of 128 bytes,
// as a job's would be: with rows of a few bytes PostgreSQL finds a heap
// read as cheap as the index's), creates the indexes and refreshes the
// statistics.
func opsExplainTable(t *testing.T, e Engine, db *sql.DB, form, table string, now time.Time, stats bool) {
	t.Helper()
	e.CreateTable(t, db, table)
	dropAtEnd(t, e, db, table, table+"_dead", table+"_claims")
	addColumns(t, e, db, table, "last_error", "priority", "enqueued_at", "dead.last_error")
	col := "not_before"
	if form == "lease" {
		col = "locked_until"
	}
	payload := []byte(strings.Repeat("p", 128))
	enq := opsTime(e, now.Add(-time.Hour))
	for _, p := range opsShape(form) {
		var at any
		if p.at != 0 {
			at = opsTime(e, now.Add(p.at))
		}
		var err error
		switch {
		case e.IsPostgres():
			_, err = db.Exec("INSERT INTO "+table+" (payload, "+col+", priority, enqueued_at) SELECT $1::bytea, $2::timestamptz, $3, $4::timestamptz FROM generate_series(1, $5)",
				payload, at, p.priority, enq, p.n)
		case e.IsMySQL():
			_, err = db.Exec(fmt.Sprintf("INSERT INTO %s (payload, %s, priority, enqueued_at) SELECT ?, ?, ?, ? FROM seq_1_to_%d", table, col, p.n),
				payload, at, p.priority, enq)
		default:
			_, err = db.Exec("INSERT INTO "+table+" (payload, "+col+", priority, enqueued_at) WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < ?) SELECT ?, ?, ?, ? FROM s",
				p.n, payload, at, p.priority, enq)
		}
		if err != nil {
			t.Fatalf("%s: load: %v", e.Name, err)
		}
	}
	if form == "lease" {
		// The jobs in work were claimed, which counts the attempt: at
		// attempt 1 a lease in force is a job never claimed, waiting.
		mustExec(t, e, db, "UPDATE "+table+" SET attempt = 2 WHERE locked_until > ? AND locked_until <= ?", opsTime(e, now), opsTime(e, now.Add(time.Minute)))
	}
	for _, s := range opsExplainIndexes(e, form, table, stats) {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	explainAnalyze(t, e, db, table)
}

// opsTime is a time as the engine's time columns take it.
func opsTime(e Engine, t time.Time) any {
	switch {
	case e.IsMySQL():
		return t.UTC().Format("2006-01-02 15:04:05.000000")
	case e.IsSQLite():
		return t.UTC().Format(inbox.SQLiteTimeFormat)
	}
	return t
}

// opsArgs are the arguments of st, in its order: the clock's now (and now
// plus lease), the lease in microseconds, a limit.
func opsArgs(t *testing.T, e Engine, st dialect.Stmt, now time.Time, lease time.Duration, limit int) []any {
	t.Helper()
	var args []any
	for _, a := range st.Args {
		switch a {
		case dialect.ArgNow:
			args = append(args, opsTime(e, now))
		case dialect.ArgUntil:
			args = append(args, opsTime(e, now.Add(lease)))
		case dialect.ArgMicros:
			args = append(args, lease.Microseconds())
		case dialect.ArgLimit:
			args = append(args, limit)
		default:
			t.Fatalf("%s: no value for argument %d", st.SQL, a)
		}
	}
	return args
}

// opsExplainEach runs fn for every engine (one PostgreSQL driver: the
// server plans) and form, on a database opened for EXPLAIN.
func opsExplainEach(t *testing.T, fn func(t *testing.T, e Engine, db *sql.DB, form string)) {
	for _, e := range Engines {
		if e.Name == "pgx" {
			continue
		}
		for _, form := range e.Forms() {
			t.Run(e.Name+"/"+form, func(t *testing.T) {
				dsn := e.DSN(t, t.TempDir())
				if e.IsMySQL() {
					// Client-side parameters, so that EXPLAIN is not prepared.
					dsn += "&interpolateParams=true"
				}
				fn(t, e, e.OpenDSN(t, dsn, 2), form)
			})
		}
	}
}

// opsConfig configures a queue on the plans' table: the form's description
// with the optional columns, a lease of a minute for the lease form.
func opsConfig(e Engine, table, form string) inbox.Config {
	tb := Table(table, form)
	tb.LastError, tb.Priority, tb.EnqueuedAt = "last_error", "priority", "enqueued_at"
	cfg := inbox.Config{Dialect: e.Dialect, Table: tb}
	if form == "lease" {
		cfg.Lease = time.Minute
	}
	return cfg
}

// noFullScan checks that no read of the plan scans table whole: PostgreSQL
// Seq Scan, MariaDB ALL, SQLite SCAN of the table (a SCAN through an index
// reads the index). The dead table, a table of its own, is not table.
func noFullScan(t *testing.T, e Engine, what string, plan []planNode, table string) {
	t.Helper()
	var bad string
	switch {
	case e.IsPostgres():
		bad = "Seq Scan on " + table + " using"
	case e.IsMySQL():
		bad = "ALL on " + table + " using"
	default:
		bad = "SCAN " + table + " on "
	}
	explainMust(t, what, plan, nil, []string{bad})
}

// TestExplainStats (issue 11): with the recommended indexes, Queue.Stats
// reads the queue table through indexes alone, and its figures are the
// table's.
func TestExplainStats(t *testing.T) {
	opsExplainEach(t, func(t *testing.T, e Engine, db *sql.DB, form string) {
		table := "explain_stats_" + form + "_" + e.Name
		if e.Dialect == inbox.MariaDB && strings.HasPrefix(form, "rowlock") {
			mariaLockInfo(t, db) // Stats' in-work count reads it
		}
		now := time.Now().UTC().Truncate(time.Microsecond)
		opsExplainTable(t, e, db, form, table, now, true)
		cfg := opsConfig(e, table, form)
		if e.IsSQLite() {
			cfg.Now = func() time.Time { return now }
		}
		q, err := inbox.New(db, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := q.CheckSchema(context.Background()); err != nil {
			t.Fatal(err)
		}
		st := q.Statements().Jobs.Stats
		plan := explainPlan(t, e, db, true, st.SQL, opsArgs(t, e, st, now, time.Minute, 0)...)
		t.Logf("Stats:\n%s", planText(plan))
		noFullScan(t, e, "Stats", plan, table)
		switch {
		case e.IsMySQL():
			// The counts are ranges of (time, enqueued_at) and the oldest
			// its first entry in the NULL range, which MariaDB reads
			// while planning ("Select tables optimized away").
			explainMust(t, "Stats", plan, []string{" on " + table + " using " + table + "_age "}, nil)
		case e.IsSQLite():
			explainMust(t, "Stats", plan, []string{"SEARCH " + table + " USING COVERING INDEX " + table + "_age "}, nil)
		}
		if e.IsPostgres() {
			// The oldest ready job is the first entry of the partial
			// index on enqueued_at.
			age := table + "_free_age"
			if form != "lease" {
				age = table + "_ready_age"
			}
			one := false
			for _, r := range reads(plan, table) {
				// A count may read the same index whole: the oldest's
				// read is the one that stops at its first entry.
				one = one || (r.Op == "Index Only Scan" && r.Index == age && r.Rows <= 1)
			}
			if !one {
				t.Errorf("Stats: the oldest ready job is not one entry of %s:\n%s", age, planText(plan))
			}
		}

		got, err := q.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		want := inbox.Stats{Ready: 16000, Waiting: 2000, InWork: 2000, Dead: 0}
		if form != "lease" {
			want = inbox.Stats{Ready: 18000, Waiting: 2000, InWork: -1, Dead: 0}
			if (form == "rowlock" && e.Dialect != inbox.MySQL) || e.IsSQLite() {
				want.InWork = 0 // none held
			}
		}
		if got.Ready != want.Ready || got.Waiting != want.Waiting || got.InWork != want.InWork || got.Dead != want.Dead {
			t.Errorf("Stats = ready %d, waiting %d, in work %d (InWorkErr: %v), dead %d; want %d, %d, %d, %d",
				got.Ready, got.Waiting, got.InWork, got.InWorkErr, got.Dead, want.Ready, want.Waiting, want.InWork, want.Dead)
		}
		// SQLite's date functions count whole milliseconds.
		if got.OldestReady < time.Hour-time.Millisecond || got.OldestReady > time.Hour+time.Minute {
			t.Errorf("the oldest ready job is %v old, want the hour since every job was enqueued", got.OldestReady)
		}
	})
}

// TestExplainPriorityClaim (issue 11): with its recommended index, the claim
// by priority reads the ten high jobs at the end of the table first, through
// the index in claim order.
func TestExplainPriorityClaim(t *testing.T) {
	opsExplainEach(t, func(t *testing.T, e Engine, db *sql.DB, form string) {
		table := "explain_prio_" + form + "_" + e.Name
		now := time.Now().UTC().Truncate(time.Microsecond)
		opsExplainTable(t, e, db, form, table, now, false)
		cfg := opsConfig(e, table, form)
		cfg.Now = func() time.Time { return now }
		q, err := inbox.New(db, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := q.CheckSchema(context.Background()); err != nil {
			t.Fatal(err)
		}
		st := q.Statements()
		// The statement that finds the job: the claim itself, or the
		// advisory form's candidates, read without a lock; MySQL's claims
		// pick (sql_mysql.go): the lease's reads due rows (the few expired
		// ones, sorted), then free ones, the row lock's its ready rows, all
		// without locks.
		var find []dialect.Stmt
		switch {
		case form == "advisory":
			find = []dialect.Stmt{st.Advisory.Candidates}
		case e.IsMySQL() && form == "lease":
			find = []dialect.Stmt{st.Claim.Pick, st.Claim.PickMore}
		case e.IsMySQL():
			find = []dialect.Stmt{st.Claim.Pick}
		case st.Claim.Take.SQL != "":
			find = []dialect.Stmt{st.Claim.For(1)}
		default:
			find = []dialect.Stmt{st.Claim.Select}
		}
		var plan []planNode
		for _, s := range find {
			plan = append(plan, explainPlan(t, e, db, true, s.SQL, opsArgs(t, e, s, now, time.Minute, 1)...)...)
		}
		t.Logf("claim:\n%s", planText(plan))
		noFullScan(t, e, "claim", plan, table)
		var has []string
		switch {
		case e.IsPostgres() && form == "lease":
			has = []string{"Index Scan on " + table + " using " + table + "_free", "Index Scan on " + table + " using " + table + "_lu"}
		case e.IsPostgres():
			has = []string{"Index Scan on " + table + " using " + table + "_prio"}
		case e.IsMySQL() && form == "lease":
			has = []string{" on " + table + " using " + table + "_claimable"}
		case e.IsMySQL():
			has = []string{"index on " + table + " using " + table + "_prio"}
		case form == "lease":
			has = []string{"SEARCH " + table + " USING COVERING INDEX " + table + "_claimable (locked_until=?)"}
		default:
			has = []string{"SCAN " + table + " USING INDEX " + table + "_prio"}
		}
		explainMust(t, "claim", plan, has, nil)
		switch {
		case e.IsMySQL():
			// The free rows (lease) or the whole claim (row lock,
			// advisory) in index order, so that the read stops at its
			// first rows. The lease's due rows are a range of the
			// expiry, sorted.
			sorted := find
			if form == "lease" {
				sorted = find[1:]
			}
			for _, s := range sorted {
				if extra := mysqlExtra(t, db, s.SQL, opsArgs(t, e, s, now, time.Minute, 1)...); strings.Contains(extra, "filesort") {
					t.Errorf("claim: %s sorts the rows: %s", s.SQL, extra)
				}
			}
			if form != "advisory" {
				// The pick's lock: primary-key probes of the candidates
				// in id order, no sort (a locking read that sorts keeps
				// every row it read locked), stopping at its LIMIT.
				var args []any
				id := int64(opsHighFirst(t, db, table))
				for _, a := range st.Claim.PickLock.Args {
					switch a {
					case dialect.ArgID:
						args = append(args, id)
						id++
					case dialect.ArgNow:
						args = append(args, opsTime(e, now))
					case dialect.ArgLimit:
						args = append(args, 1)
					}
				}
				lock := explainPlan(t, e, db, true, st.Claim.PickLock.SQL, args...)
				t.Logf("pick's lock:\n%s", planText(lock))
				explainMust(t, "pick's lock", lock, []string{"range on " + table + " using PRIMARY"}, []string{"filesort"})
				for _, r := range reads(lock, table) {
					if r.Rows+r.Removed > 1 {
						t.Errorf("pick's lock: %v reads %.0f rows for a claim of one", r, r.Rows+r.Removed)
					}
				}
				if extra := mysqlExtra(t, db, st.Claim.PickLock.SQL, args...); strings.Contains(extra, "filesort") {
					t.Errorf("pick's lock sorts the rows: %s", extra)
				}
			}
		case e.IsSQLite() && form == "advisory":
			explainMust(t, "claim", plan, nil, []string{"USE TEMP B-TREE FOR ORDER BY"})
		}
		// Executed plans: no read walks more rows than a claim of one
		// needs (the lease's expired branch reads the 10 due rows to sort
		// them).
		for _, r := range reads(plan, table) {
			if r.Rows+r.Removed > 16 {
				t.Errorf("claim: %v reads %.0f rows for a claim of one", r, r.Rows+r.Removed)
			}
		}
		ds, err := q.Claim(context.Background(), 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("Claim(1) = %d jobs, %v; want one", len(ds), err)
		}
		if p := ds[0].Priority(); p != opsPrioHigh {
			t.Errorf("Claim(1) delivered job %v of priority %d before the free ones of priority %d", ds[0].ID(), p, opsPrioHigh)
		}
		if err := ds[0].Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// mysqlExtra is the Extra column of EXPLAIN query, one line per table read,
// where MariaDB and MySQL say "Using filesort".
func mysqlExtra(t *testing.T, db *sql.DB, query string, args ...any) string {
	t.Helper()
	rows, err := db.Query("EXPLAIN "+query, args...)
	if err != nil {
		t.Fatalf("EXPLAIN %s: %v", query, err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var out []string
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		var table, extra string
		for i, c := range cols {
			switch c {
			case "table":
				table = vals[i].String
			case "Extra":
				extra = vals[i].String
			}
		}
		out = append(out, table+": "+extra)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(out, "; ")
}

// opsHighFirst is the lowest id of the jobs of high priority of an
// opsShape table, the first in claim order.
func opsHighFirst(t *testing.T, db *sql.DB, table string) int64 {
	t.Helper()
	var id int64
	if err := db.QueryRow(fmt.Sprintf("SELECT MIN(id) FROM %s WHERE priority = %d", table, opsPrioHigh)).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}
