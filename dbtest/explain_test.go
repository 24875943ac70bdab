package dbtest

// Plans of the lease claim and of the batch statements, read with EXPLAIN
// (Postgres, MariaDB) and EXPLAIN QUERY PLAN (SQLite) on a table with a head
// of leased rows before pending ones:
//   - the batch settlements probe the primary key once per token;
//   - inbox's claim, with the recommended indexes (as in the README), reads
//     the free jobs and the expired ones each through its index from where
//     the claimable rows start: it neither scans the table nor walks the
//     leased head, which keeps its cost flat with the head's size.

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
)

// explainIndexes are the recommended indexes of a lease table, as in the
// README and bench/depth.go: Postgres, a partial index of the free jobs in
// id order and one on the expiry; MariaDB/MySQL and SQLite, one on (expiry,
// id).
func explainIndexes(e Engine, table string) []string {
	if e.IsPostgres() {
		return []string{
			"CREATE INDEX " + table + "_free ON " + table + " (id) WHERE locked_until IS NULL",
			"CREATE INDEX " + table + "_lu ON " + table + " (locked_until)",
		}
	}
	return []string{"CREATE INDEX " + table + "_lu ON " + table + " (locked_until, id)"}
}

// explainLoad fills table with leased rows (the lowest ids) then pending
// ones, in one statement each, and refreshes the statistics.
func explainLoad(t *testing.T, e Engine, db *sql.DB, table string, leased, pending int, future time.Time) {
	t.Helper()
	for _, part := range []struct {
		n  int
		lu any
	}{{leased, future}, {pending, nil}} {
		var err error
		switch {
		case e.IsPostgres():
			_, err = db.Exec("INSERT INTO "+table+" (payload, locked_until) SELECT '\\x00'::bytea, $2::timestamptz FROM generate_series(1, $1)", part.n, part.lu)
		case e.IsMySQL():
			lu := part.lu
			if lu != nil {
				lu = future.Format("2006-01-02 15:04:05.000000")
			}
			_, err = db.Exec(fmt.Sprintf("INSERT INTO %s (payload, locked_until) SELECT x'00', ? FROM seq_1_to_%d", table, part.n), lu)
		default:
			lu := part.lu
			if lu != nil {
				lu = future.Format(inbox.SQLiteTimeFormat)
			}
			_, err = db.Exec("INSERT INTO "+table+" (payload, locked_until) WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < ?) SELECT x'00', ? FROM s", part.n, lu)
		}
		if err != nil {
			t.Fatalf("%s: load: %v", e.Name, err)
		}
	}
	explainAnalyze(t, e, db, table)
}

// explainAnalyze refreshes the statistics of table.
func explainAnalyze(t testing.TB, e Engine, db *sql.DB, table string) {
	t.Helper()
	s := "ANALYZE"
	switch {
	case e.IsPostgres():
		s = "VACUUM ANALYZE " + table
	case e.IsMySQL():
		s = "ANALYZE TABLE " + table
	}
	rows, err := db.Query(s)
	if err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	rows.Close()
	if e.IsPostgres() {
		allVisible(t, db, table)
	}
}

// allVisible vacuums table until its visibility map covers every page. A
// VACUUM cannot mark a page all-visible while a transaction of another test
// in the database is older than its rows; the planner then prices an index
// only scan with a heap fetch a row and may rightly choose a Seq Scan, which
// is a state of the test's database, not of the statement under test.
func allVisible(t testing.TB, db *sql.DB, table string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var pages, visible int64
		if err := db.QueryRow("SELECT relpages, relallvisible FROM pg_class WHERE oid = to_regclass($1)", table).Scan(&pages, &visible); err != nil {
			t.Fatalf("visibility of %s: %v", table, err)
		}
		if visible >= pages {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: VACUUM left %d of %d pages not all-visible for 5 min (a transaction held open elsewhere in the database)", table, pages-visible, pages)
		}
		time.Sleep(100 * time.Millisecond) // poll: an older transaction elsewhere must end first
		if _, err := db.Exec("VACUUM ANALYZE " + table); err != nil {
			t.Fatalf("VACUUM ANALYZE %s: %v", table, err)
		}
	}
}

// planNode is one step of a plan: a table or index read.
type planNode struct {
	Op, Table, Index string
	Rows, Removed    float64 // rows produced and rows read then filtered away (executed plans)
}

func (n planNode) String() string {
	return fmt.Sprintf("%s on %s using %s (rows %.0f, removed %.0f)", n.Op, n.Table, n.Index, n.Rows, n.Removed)
}

// planNodes flattens a JSON plan, Postgres's or MariaDB's.
func planNodes(x any, pg bool) []planNode {
	var nodes []planNode
	num := func(v any) float64 { f, _ := v.(float64); return f }
	str := func(v any) string { s, _ := v.(string); return s }
	var walk func(x any)
	walk = func(x any) {
		switch n := x.(type) {
		case []any:
			for _, c := range n {
				walk(c)
			}
		case map[string]any:
			if pg {
				if op := str(n["Node Type"]); op != "" {
					nodes = append(nodes, planNode{op, str(n["Relation Name"]), str(n["Index Name"]), num(n["Actual Rows"]), num(n["Rows Removed by Filter"]) + num(n["Rows Removed by Index Recheck"])})
				}
			} else if tb := str(n["table_name"]); tb != "" {
				op := str(n["access_type"])
				if _, sorted := n["filesort"]; sorted {
					op += "+filesort"
				}
				nodes = append(nodes, planNode{op, tb, str(n["key"]), num(n["r_rows"]), 0})
			}
			for _, c := range n {
				walk(c)
			}
		}
	}
	walk(x)
	return nodes
}

// explainGenericPlan returns the plan Postgres runs query with once it is
// prepared and planned generically, as a driver that prepares statements
// (pgx) gets after five runs: the plan cannot see the parameters' values.
func explainGenericPlan(t *testing.T, db *sql.DB, query string, args ...any) []planNode {
	t.Helper()
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	defer conn.ExecContext(ctx, "DEALLOCATE ALL") // after the rollback, which PREPARE outlives
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.Exec("SET LOCAL plan_cache_mode = force_generic_plan"); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("PREPARE inbox_generic AS " + query); err != nil {
		t.Fatalf("PREPARE %s: %v", query, err)
	}
	// EXECUTE's arguments as literals: a utility statement takes no
	// parameters.
	params := make([]string, len(args))
	for i, a := range args {
		switch a := a.(type) {
		case time.Time:
			params[i] = "'" + a.UTC().Format("2006-01-02 15:04:05.999999") + "+00'"
		default:
			params[i] = fmt.Sprint(a)
		}
	}
	var js string
	if err := tx.QueryRow("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE inbox_generic(" + strings.Join(params, ", ") + ")").Scan(&js); err != nil {
		t.Fatalf("EXPLAIN EXECUTE %s: %v", query, err)
	}
	var v any
	if err := json.Unmarshal([]byte(js), &v); err != nil {
		t.Fatal(err)
	}
	return planNodes(v, true)
}

// explainPlan returns the plan of query with args. Postgres runs it with
// EXPLAIN ANALYZE in a transaction rolled back, and MariaDB, when analyze
// is set (a SELECT), with ANALYZE, so that the rows actually read show
// (their planners may change course at run time); MariaDB's other
// statements, which ANALYZE would run, and SQLite's get EXPLAIN (QUERY
// PLAN) alone.
func explainPlan(t *testing.T, e Engine, db *sql.DB, analyze bool, query string, args ...any) []planNode {
	t.Helper()
	var nodes []planNode
	walk := func(x any, pg bool) { nodes = append(nodes, planNodes(x, pg)...) }
	switch {
	case e.IsPostgres():
		tx, err := db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		var js string
		if err := tx.QueryRow("EXPLAIN (ANALYZE, FORMAT JSON) "+query, args...).Scan(&js); err != nil {
			t.Fatalf("EXPLAIN %s: %v", query, err)
		}
		var v any
		if err := json.Unmarshal([]byte(js), &v); err != nil {
			t.Fatal(err)
		}
		walk(v, true)
	case e.IsMySQL() && analyze:
		var js string
		if err := db.QueryRow("ANALYZE FORMAT=JSON "+query, args...).Scan(&js); err != nil {
			t.Fatalf("ANALYZE %s: %v", query, err)
		}
		var v any
		if err := json.Unmarshal([]byte(js), &v); err != nil {
			t.Fatal(err)
		}
		walk(v, false)
	case e.IsMySQL():
		rows, err := db.Query("EXPLAIN "+query, args...)
		if err != nil {
			t.Fatalf("EXPLAIN %s: %v", query, err)
		}
		defer rows.Close()
		cols, _ := rows.Columns()
		for rows.Next() {
			vals := make([]sql.NullString, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			var n planNode
			for i, c := range cols {
				switch c {
				case "table":
					n.Table = vals[i].String
				case "type":
					n.Op = vals[i].String
				case "key":
					n.Index = vals[i].String
				}
			}
			nodes = append(nodes, n)
		}
	default:
		rows, err := db.Query("EXPLAIN QUERY PLAN "+query, args...)
		if err != nil {
			t.Fatalf("EXPLAIN QUERY PLAN %s: %v", query, err)
		}
		defer rows.Close()
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			nodes = append(nodes, planNode{Op: detail})
		}
	}
	return nodes
}

// reads are the plan's reads of table, optionally through one index.
func reads(plan []planNode, table string) []planNode {
	var out []planNode
	for _, n := range plan {
		if n.Table == table {
			out = append(out, n)
		}
	}
	return out
}

func planText(plan []planNode) string {
	var b strings.Builder
	for _, n := range plan {
		b.WriteString(n.String() + ";\n")
	}
	return b.String()
}

// explainMust checks that the plan's text has every of has and none of
// hasNot.
func explainMust(t *testing.T, what string, plan []planNode, has, hasNot []string) {
	t.Helper()
	text := planText(plan)
	for _, h := range has {
		if !strings.Contains(text, h) {
			t.Errorf("%s: the plan lacks %q:\n%s", what, h, text)
		}
	}
	for _, h := range hasNot {
		if strings.Contains(text, h) {
			t.Errorf("%s: the plan has %q:\n%s", what, h, text)
		}
	}
}

func TestExplainLeaseClaim(t *testing.T) {
	for _, e := range Engines {
		e := e
		if e.Name == "pgx" {
			continue // the server plans, not the driver: one Postgres driver is enough
		}
		t.Run(e.Name, func(t *testing.T) {
			dsn := e.DSN(t, t.TempDir())
			if e.IsMySQL() {
				// Client-side parameters, so that EXPLAIN is not prepared.
				dsn += "&interpolateParams=true"
			}
			db := e.OpenDSN(t, dsn, 2)
			table := "explain_" + e.Name
			e.CreateTable(t, db, table)
			if !e.IsSQLite() {
				t.Cleanup(func() {
					if !t.Failed() {
						db.Exec("DROP TABLE IF EXISTS " + table)
						db.Exec("DROP TABLE IF EXISTS " + table + "_dead")
						db.Exec("DROP TABLE IF EXISTS " + table + "_claims")
					}
				})
			}
			// The head's expiry: the batch statements below name tokens of
			// real rows, so that no engine sees through them at planning.
			future := time.Now().Add(24 * time.Hour).UTC().Truncate(time.Microsecond)
			n := 20000
			if e.IsSQLite() {
				// Its plans do not hang on the size; modernc under -race
				// loads slowly.
				n = 2000
			}
			explainLoad(t, e, db, table, n, n, future)
			now := time.Now()
			q, err := inbox.New(db, inbox.Config{Dialect: e.Dialect, Table: Table(table, "lease"), Now: func() time.Time { return now }})
			if err != nil {
				t.Fatal(err)
			}
			st := q.Statements()

			var plan []planNode
			// The batch statements probe the primary key, once per token, at
			// every size. MySQL: as the driver sends them by default, in
			// statements the server prepares.
			names := dialect.Names{Form: inbox.Lease, Table: quote(e, table), TableName: table, ID: quote(e, "id"),
				Attempt: quote(e, "attempt"), LockedUntil: quote(e, "locked_until"), Data: []string{quote(e, "payload")}, DBClock: !e.IsSQLite()}
			prepDB := db
			if e.IsMySQL() {
				prepDB = e.OpenDSN(t, e.DSN(t, ""), 2)
			}
			checkBatch := func(when string) {
				for _, size := range []int{1, 2, 16} {
					bst, err := e.Dialect.(dialect.BatchDialect).BatchStatements(&names, size)
					if err != nil {
						t.Fatal(err)
					}
					var tok []any
					for k := 0; k < size; k++ {
						var exp any = future
						switch {
						case e.IsMySQL():
							exp = future.Format("2006-01-02 15:04:05.000000")
						case e.IsSQLite():
							exp = future.Format(inbox.SQLiteTimeFormat)
						}
						tok = append(tok, int64(100+k), int64(1), exp)
					}
					what := fmt.Sprintf("batch ack of %d, %s", size, when)
					switch {
					case e.IsPostgres():
						// The tokens go as array literals: ids, attempts, expiries.
						var ids, atts, exps []string
						for k := 0; k < size; k++ {
							ids = append(ids, fmt.Sprint(100+k))
							atts = append(atts, "1")
							exps = append(exps, `"`+future.UTC().Format("2006-01-02 15:04:05.999999")+`+00"`)
						}
						arr := func(xs []string) string { return "{" + strings.Join(xs, ",") + "}" }
						plan = explainPlan(t, e, db, false, bst.Ack.SQL, arr(ids), arr(atts), arr(exps))
						explainMust(t, what, plan, []string{" using " + table + "_pkey"}, []string{"Seq Scan"})
					case e.IsMySQL():
						for _, st := range []dialect.Stmt{bst.Ack, bst.Release, bst.Lock} {
							plan = explainPlan(t, e, prepDB, false, st.SQL, tok...)
							explainMust(t, what+": "+st.SQL[:6], plan, []string{" on " + table + " using PRIMARY"}, []string{"ALL on", "index on"})
						}
					default:
						plan = explainPlan(t, e, db, false, bst.Ack.SQL, tok...)
						explainMust(t, what, plan, []string{"USING INTEGER PRIMARY KEY"}, []string{"SCAN " + table})
					}
				}
			}
			checkBatch("primary key only")

			// inbox's claim, with the recommended indexes: each branch reads
			// its index from where the claimable rows start. The caller's
			// clock: the arguments in the statements' order.
			for _, s := range explainIndexes(e, table) {
				if _, err := db.Exec(s); err != nil {
					t.Fatalf("%s: %v", s, err)
				}
			}
			explainAnalyze(t, e, db, table)
			// The lease index must not draw the batch statements away from
			// the primary key: MariaDB read a batched Ack's tokens as a range
			// of it, whose gap locks held every claim back (sql_mariadb.go).
			// inbox.MySQL's row-value IN still does on MariaDB, as MySQL 8
			// searches only a row of plain columns by key.
			if e.Dialect != inbox.MySQL {
				checkBatch("with the lease index")
			}
			if e.IsMySQL() {
				// So must the single token statements, which run outside
				// a READ COMMITTED transaction too.
				exp := future.Format("2006-01-02 15:04:05.000000")
				for _, c := range []struct {
					s    dialect.Stmt
					args []any
				}{
					{st.Settle.Ack, []any{int64(100), int64(1), exp}},
					{st.Settle.Release, []any{int64(100), int64(1), exp}},
					{st.Settle.Extend, []any{exp, int64(100), int64(1), exp}},
					{st.Settle.Exists, []any{int64(100), int64(1), exp}},
				} {
					plan = explainPlan(t, e, prepDB, false, c.s.SQL, c.args...)
					explainMust(t, "single token: "+c.s.SQL[:6], plan, []string{" on " + table + " using PRIMARY"}, []string{"ALL on", "index on", "_lu"})
				}
			}
			switch {
			case e.IsPostgres():
				// limit, now, limit, limit, until
				plan = explainPlan(t, e, db, true, st.Claim.For(1).SQL, 1, now, 1, 1, now.Add(time.Minute))
				explainMust(t, "claim", plan,
					[]string{"Index Scan on " + table + " using " + table + "_free", "Index Scan on " + table + " using " + table + "_lu"},
					[]string{"Seq Scan"})
				// The generic plan too: it cannot see the limits, and must
				// still probe the claimed rows by primary key.
				generic := explainGenericPlan(t, db, st.Claim.For(1).SQL, 1, now, 1, 1, now.Add(time.Minute))
				explainMust(t, "claim, generic plan", generic,
					[]string{"Index Scan on " + table + " using " + table + "_free", "Index Scan on " + table + " using " + table + "_pkey"},
					[]string{"Seq Scan"})
			case e.IsMySQL():
				// A claim of one: the rows whose lease ran out (now,
				// limit), then free rows (limit): each one ordered read of
				// the lease index.
				plan = explainPlan(t, e, db, true, st.Claim.Select.SQL, now.UTC().Format("2006-01-02 15:04:05.000000"), 1)
				more := explainPlan(t, e, db, true, st.Claim.SelectMoreOne.SQL, 1)
				plan = append(plan, more...)
				// A claim of several reads its free rows through the
				// primary key from the lowest free id, which the lease
				// index gives: past the leased head, not through it.
				many := explainPlan(t, e, db, true, st.Claim.SelectMore.SQL, 16)
				explainMust(t, "claim of 16", many, []string{" on " + table + " using PRIMARY"}, []string{"ALL on", "index on"})
				for _, r := range reads(many, table) {
					if r.Rows+r.Removed > 32 {
						t.Errorf("claim of 16: %v reads %.0f rows, the leased head walked:\n%s", r, r.Rows+r.Removed, planText(many))
					}
				}
				explainMust(t, "claim", plan, nil, []string{"ALL on " + table})
				rs := reads(plan, table)
				if len(rs) != 2 {
					t.Errorf("claim: %d reads of %s, want one per statement:\n%s", len(rs), table, planText(plan))
				}
				for _, r := range rs {
					if r.Index != table+"_lu" {
						t.Errorf("claim: a branch reads %s, want %s_lu:\n%s", r.Index, table, planText(plan))
					}
				}
				// The mark, and the read-back after a short one: probes of
				// the rows the claim names (by primary key, or for the
				// read-back the (lease, id) index at one expiry), never a scan.
				my := func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000000") }
				// The first reads, of free rows while none is due: the
				// same paths, the subquery asking for a due row one probe
				// of the lease index.
				for _, c := range []struct {
					what  string
					s     dialect.Stmt
					limit int
				}{{"first read of one", st.Claim.SelectFreeOne, 1}, {"first read of 16", st.Claim.SelectFree, 16}} {
					p := explainPlan(t, e, db, true, c.s.SQL, my(now), c.limit)
					explainMust(t, c.what, p, nil, []string{"ALL on", "index on"})
					for _, r := range reads(p, table) {
						if r.Rows+r.Removed > 32 {
							t.Errorf("%s: %v reads %.0f rows, the leased head walked:\n%s", c.what, r, r.Rows+r.Removed, planText(p))
						}
					}
				}
				markArgs := []any{my(now.Add(time.Minute))}
				var markedArgs []any
				for k := 0; k < 16; k++ {
					markArgs = append(markArgs, int64(100+k), int64(0))
					markedArgs = append(markedArgs, int64(100+k))
				}
				markArgs = append(markArgs, my(now))
				markedArgs = append(markedArgs, my(now.Add(time.Minute)))
				for _, c := range []struct {
					s    dialect.Stmt
					args []any
					uses string
				}{{st.Claim.Mark, markArgs, "PRIMARY"}, {st.Claim.MarkOne, []any{my(now.Add(time.Minute)), int64(100), int64(0), my(now)}, "PRIMARY"}, {st.Claim.Marked, markedArgs, ""}} {
					p := explainPlan(t, e, prepDB, false, c.s.SQL, c.args...)
					explainMust(t, "claim: "+c.s.SQL[:6], p, []string{" on " + table + " using " + c.uses}, []string{"ALL on", "index on"})
				}
				// The idle loop's probe: one range of the lease index from
				// its start, never the primary key walked past the head of
				// leases in force.
				probe := explainPlan(t, e, db, true, st.Jobs.Probe.SQL, my(now))
				explainMust(t, "probe", probe, []string{" on " + table + " using " + table + "_lu"}, []string{"ALL on", "index on"})
				for _, r := range reads(probe, table) {
					if r.Rows+r.Removed > 16 {
						t.Errorf("probe: %v reads %.0f rows to find one:\n%s", r, r.Rows+r.Removed, planText(probe))
					}
				}
			default:
				// until, limit, now, limit, limit
				ts := func(t time.Time) string { return t.UTC().Format(inbox.SQLiteTimeFormat) }
				plan = explainPlan(t, e, db, true, st.Claim.For(1).SQL, ts(now.Add(time.Minute)), 1, ts(now), 1, 1)
				explainMust(t, "claim", plan, []string{"USING COVERING INDEX " + table + "_lu (locked_until=?)", "USING COVERING INDEX " + table + "_lu (locked_until<?)"},
					[]string{"SCAN " + table})
			}
			t.Logf("inbox's claim:\n%s", planText(plan))
			// Executed plans: no branch reads more rows than it claims (a few
			// of slack), so the leased head is never walked.
			for _, r := range reads(plan, table) {
				if r.Rows+r.Removed > 16 {
					t.Errorf("claim: %v reads %.0f rows for a claim of one", r, r.Rows+r.Removed)
				}
			}
		})
	}
}

// quote quotes an identifier for the engine.
func quote(e Engine, s string) string {
	q, err := e.Dialect.QuoteIdent(s)
	if err != nil {
		panic(err)
	}
	return q
}

// Before the table has statistics (autovacuum has not analyzed it yet, or
// is off, as on the CI machine), and under a generic plan, the lease claim
// still reads each index from where its claimable rows start: the expired
// rows in the order of the lease index, not the primary key walked through
// every row with a filter.
func TestExplainLeaseClaimWithoutStatistics(t *testing.T) {
	for _, e := range Engines {
		if e.Name != "pq" {
			continue // the server plans: one Postgres driver is enough
		}
		t.Run(e.Name, func(t *testing.T) {
			db := e.OpenDSN(t, e.DSN(t, t.TempDir()), 2)
			table := "explain_nostats_" + e.Name
			e.CreateTable(t, db, table)
			t.Cleanup(func() {
				db.Exec("DROP TABLE IF EXISTS " + table)
				db.Exec("DROP TABLE IF EXISTS " + table + "_dead")
				db.Exec("DROP TABLE IF EXISTS " + table + "_claims")
			})
			for _, s := range explainIndexes(e, table) {
				if _, err := db.Exec(s); err != nil {
					t.Fatalf("%s: %v", s, err)
				}
			}
			if _, err := db.Exec("INSERT INTO " + table + " (payload) SELECT '\\x00'::bytea FROM generate_series(1, 20000)"); err != nil {
				t.Fatal(err)
			}
			now := time.Now()
			q, err := inbox.New(db, inbox.Config{Dialect: e.Dialect, Table: Table(table, "lease"), Now: func() time.Time { return now }})
			if err != nil {
				t.Fatal(err)
			}
			st := q.Statements()
			args := []any{1, now, 1, 1, now.Add(time.Minute)}
			for what, plan := range map[string][]planNode{
				"custom plan":  explainPlan(t, e, db, true, st.Claim.For(1).SQL, args...),
				"generic plan": explainGenericPlan(t, db, st.Claim.For(1).SQL, args...),
			} {
				explainMust(t, "claim without statistics, "+what, plan,
					[]string{"Index Scan on " + table + " using " + table + "_free", "Index Scan on " + table + " using " + table + "_lu"},
					[]string{"Seq Scan"})
				for _, r := range reads(plan, table) {
					if r.Rows+r.Removed > 16 {
						t.Errorf("claim without statistics, %s: %v reads %.0f rows for a claim of one:\n%s", what, r, r.Rows+r.Removed, planText(plan))
					}
				}
			}
		})
	}
}

// TestExplainRowLockPick (issue 21): MySQL's row-lock claim with a
// not-before column picks (sql_mysql.go), on tables of 2,000 rows mostly
// delayed and mostly ready, with the recommended indexes, with and without
// a priority: the candidates are read without a full scan and without
// walking the delayed rows, and the lock probes the primary key in id
// order, without a sort, reading the one row it claims.
func TestExplainRowLockPick(t *testing.T) {
	eachEngine(t, func(e Engine) bool { return e.IsMySQL() }, func(t *testing.T, e Engine) {
		for _, shape := range lockShapes {
			for _, priority := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/priority=%v", shape.name, priority), func(t *testing.T) {
					db := e.OpenDSN(t, e.DSN(t, "")+"&interpolateParams=true", 2)
					now := time.Now().UTC().Truncate(time.Microsecond)
					table := lockTable(t, e, db, "rowlock", fmt.Sprintf("explain_pick_%d_%v", shape.claimable, priority), shape, priority, now)
					order := claimOrderOf(t, e, db, table, "rowlock", priority, now)
					q := newQueue(t, db, lockConfig(e, table, "rowlock", priority, now))
					st := q.Statements()
					pick := explainPlan(t, e, db, true, st.Claim.Pick.SQL, opsArgs(t, e, st.Claim.Pick, now, time.Minute, 10)...)
					t.Logf("pick:\n%s", planText(pick))
					noFullScan(t, e, "pick", pick, table)
					for _, r := range reads(pick, table) {
						if max := float64(shape.claimable + 10); r.Rows+r.Removed > max {
							t.Errorf("pick: %v reads %.0f rows, more than the ready ones and a page (%.0f)", r, r.Rows+r.Removed, max)
						}
					}
					if st.Claim.PickFirst.SQL != "" {
						// MariaDB's pick in one statement: the page sorted
						// first, each candidate's row then read by primary
						// key, no sort or join buffer after the locking read.
						first := explainPlan(t, e, db, true, st.Claim.PickFirst.SQL, opsArgs(t, e, st.Claim.PickFirst, now, time.Minute, 10)...)
						t.Logf("pick first:\n%s", planText(first))
						explainMust(t, "pick first", first, []string{"eq_ref on " + table + " using PRIMARY"}, []string{"ALL on " + table})
						extra := mysqlExtra(t, db, st.Claim.PickFirst.SQL, opsArgs(t, e, st.Claim.PickFirst, now, time.Minute, 10)...)
						if strings.Contains(extra, "temporary") || strings.Contains(extra, "join buffer") {
							t.Errorf("pick first sorts after its locking read: %s", extra)
						}
					} else if e.Dialect == inbox.MariaDB {
						t.Error("inbox.MariaDB has no Claim.PickFirst for a row-lock table with a not-before column")
					}
					if st.Claim.WalkFirst.SQL != "" {
						// MariaDB's claim of one by the primary key, in order:
						// no sort, which would lock every row read.
						walk := explainPlan(t, e, db, true, st.Claim.WalkFirst.SQL, opsArgs(t, e, st.Claim.WalkFirst, now, time.Minute, 1)...)
						t.Logf("walk first:\n%s", planText(walk))
						explainMust(t, "walk first", walk, []string{"index on " + table + " using PRIMARY"}, []string{"ALL on " + table, "range on " + table})
						extra := mysqlExtra(t, db, st.Claim.WalkFirst.SQL, opsArgs(t, e, st.Claim.WalkFirst, now, time.Minute, 1)...)
						if strings.Contains(extra, "filesort") || strings.Contains(extra, "temporary") {
							t.Errorf("walk first sorts after its locking read: %s", extra)
						}
					} else if e.Dialect == inbox.MariaDB && !priority {
						t.Error("inbox.MariaDB has no Claim.WalkFirst for a row-lock table with a not-before column")
					}
					// The lock of a page of 10 candidates (the last repeated),
					// as a claim of one sends it, and of 32.
					for _, n := range []int{10, 32} {
						var args []any
						k := 0
						for _, a := range st.Claim.PickLock.Args {
							switch a {
							case dialect.ArgID:
								args = append(args, order[min(k, n-1, len(order)-1)])
								k++
							case dialect.ArgNow:
								args = append(args, opsTime(e, now))
							case dialect.ArgLimit:
								args = append(args, 1)
							}
						}
						what := fmt.Sprintf("pick's lock of %d", n)
						lock := explainPlan(t, e, db, true, st.Claim.PickLock.SQL, args...)
						t.Logf("%s:\n%s", what, planText(lock))
						explainMust(t, what, lock, []string{"range on " + table + " using PRIMARY"}, []string{"filesort"})
						for _, r := range reads(lock, table) {
							if r.Rows+r.Removed > 1 {
								t.Errorf("%s: %v reads %.0f rows for a claim of one", what, r, r.Rows+r.Removed)
							}
						}
						if extra := mysqlExtra(t, db, st.Claim.PickLock.SQL, args...); strings.Contains(extra, "filesort") {
							t.Errorf("%s sorts the rows: %s", what, extra)
						}
					}
				})
			}
		}
	})
}
