package main

// Claim cost with depth: one worker claiming and acknowledging one job at a
// time from a table with 10,000 pending jobs, with 100,000, with 1,000,000
// (-depth-rows), and with a head of 100,000 jobs leased into the future
// (the lowest ids) before 10,000 pending ones. Two claims are compared on
// each, on the primary key alone and with the recommended indexes (a table
// set of each): inbox's lease claim, which reads the free jobs and the
// expired ones in two ordered, limited branches, and the old
// single-condition claim ("lease NULL or over", hand-written here) it
// replaced, which steps over a leased head row by row; with them, on the
// primary key alone, inbox's shallow claim (Table.Shallow) and the minimal
// queue of issue 25. With -svg the indexed and shallow lease and the minimal
// queue are drawn (depthChart).
//
// Then priorities (issue 11), in every form: the claim of one job of high
// priority among a mass of low ones, each form with its recommended
// indexes, and Queue.Stats on the same tables (runPriorityDepth below).

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/sqlinbox/inbox"
)

// depthIndexes are the indexes recommended for the lease claim, per engine
// family (as in the README). Postgres: a partial index of the free jobs in
// id order, which the claim's free branch reads from its start, and one on
// the expiry for the expired branch. InnoDB and SQLite: one index on
// (expiry, id), whose NULL range is the free jobs in id order and whose
// range up to now is the expired ones.
func depthIndexes(e engine, table string) []string {
	switch e.family {
	case "postgres":
		return []string{
			"CREATE INDEX " + table + "_free ON " + table + " (id) WHERE locked_until IS NULL",
			"CREATE INDEX " + table + "_lu ON " + table + " (locked_until)",
		}
	default:
		return []string{"CREATE INDEX " + table + "_lu ON " + table + " (locked_until, id)"}
	}
}

// oldClaim is the lease claim inbox sent before the two branches, for n
// jobs: one ordered read of the rows whose lease is NULL or over, which
// must step over every row under a lease in force below the first
// claimable id.
func oldClaim(e engine, table string) string {
	switch e.family {
	case "postgres":
		return "WITH picked AS MATERIALIZED (SELECT id FROM " + table +
			" WHERE (locked_until IS NULL OR locked_until <= statement_timestamp()) ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) " +
			"UPDATE " + table + " AS j SET attempt = j.attempt + 1, locked_until = (statement_timestamp() + $2 * interval '1 microsecond')" +
			" FROM picked WHERE j.id = picked.id RETURNING j.id, j.attempt, j.locked_until, j.payload"
	case "mysql":
		// The expiry comes back with the row, read from the engine's
		// clock in the same round trip.
		return "SELECT id, attempt, payload, DATE_FORMAT(UTC_TIMESTAMP(6) + INTERVAL 30 SECOND, '%Y-%m-%d %H:%i:%s.%f') FROM " + table +
			" WHERE (locked_until IS NULL OR locked_until <= UTC_TIMESTAMP(6)) ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED"
	default:
		return "UPDATE " + table + " SET attempt = attempt + 1, locked_until = ? WHERE id IN (SELECT id FROM " + table +
			" WHERE locked_until IS NULL OR locked_until <= ? ORDER BY id LIMIT ?) RETURNING id, attempt, locked_until, payload"
	}
}

// oldSide claims one job with oldClaim and acknowledges it by its token.
type oldSide struct {
	e     engine
	db    *sql.DB
	claim string
	mark  string // MySQL
	ack   string
}

func newOldSide(e engine, db *sql.DB, table string) *oldSide {
	return &oldSide{e: e, db: db, claim: oldClaim(e, table),
		mark: "UPDATE " + table + " SET attempt = attempt + 1, locked_until = ? WHERE id = ?",
		ack:  "DELETE FROM " + table + " WHERE id = " + mark(e, 1) + " AND attempt = " + mark(e, 2) + " AND locked_until = " + mark(e, 3)}
}

func (p *oldSide) round(ctx context.Context) (int, error) {
	var j leaseJob
	var err error
	switch p.e.family {
	case "postgres":
		var t time.Time
		err = p.db.QueryRowContext(ctx, p.claim, 1, int64(30000000)).Scan(&j.id, &j.attempt, &t, &j.payload)
		j.until = t
	case "mysql":
		err = func() error {
			tx, err := p.db.BeginTx(ctx, handTx())
			if err != nil {
				return err
			}
			defer tx.Rollback()
			var until string
			if err := tx.QueryRowContext(ctx, p.claim, 1).Scan(&j.id, &j.attempt, &j.payload, &until); err != nil {
				return err
			}
			j.attempt++
			j.until = until
			if _, err := tx.ExecContext(ctx, p.mark, until, j.id); err != nil {
				return err
			}
			return tx.Commit()
		}()
	default:
		now := time.Now().UTC()
		var s string
		err = p.db.QueryRowContext(ctx, p.claim, now.Add(30*time.Second).Format(inbox.SQLiteTimeFormat),
			now.Format(inbox.SQLiteTimeFormat), 1).Scan(&j.id, &j.attempt, &s, &j.payload)
		j.until = s
	}
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	res, err := p.db.ExecContext(ctx, p.ack, j.id, j.attempt, j.until)
	if err != nil {
		return 0, err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return 0, fmt.Errorf("ack of job %d deleted %d rows", j.id, n)
	}
	return 1, nil
}

func (p *oldSide) close() {}

// sample runs up to n rounds of s, one job each, within budget, and
// appends the time of each round to ts.
func sample(ctx context.Context, s side, n int, budget time.Duration, ts []time.Duration) ([]time.Duration, error) {
	start := time.Now()
	for i := 0; i < n && (i < 5 || time.Since(start) < budget); i++ {
		t0 := time.Now()
		got, err := s.round(ctx)
		if err != nil {
			return ts, err
		}
		if got != 1 {
			return ts, fmt.Errorf("claimed %d jobs, want 1", got)
		}
		ts = append(ts, time.Since(t0))
	}
	return ts, nil
}

func median(ts []time.Duration) time.Duration {
	if len(ts) == 0 {
		return 0
	}
	c := append([]time.Duration(nil), ts...)
	sort.Slice(c, func(i, j int) bool { return c[i] < c[j] })
	return c[len(c)/2]
}

// depthCase is a table shape: leased rows first (lowest ids), then pending.
type depthCase struct {
	name            string
	leased, pending int
}

// depthCases are the shapes of -run depth: 10k pending, 100k (when the deep
// case is deeper), deep pending, and a head of 100k leased rows before 10k
// pending.
func depthCases(deep int) []depthCase {
	cases := []depthCase{{"10k pending", 0, 10000}}
	if deep > 100000 {
		cases = append(cases, depthCase{"100k pending", 0, 100000})
	}
	return append(cases, depthCase{rowsName(deep) + " pending", 0, deep}, depthCase{"100k leased head + 10k pending", 100000, 10000})
}

// depthLine is one claim measured on every case: v names its side (see
// depthSide).
type depthLine struct{ claim, idx, v string }

// runDepth loads one table per case, then measures each claim on every
// case in several interleaved passes, so that a change of load on the
// shared machine falls on all cases alike; the figure is the median.
func runDepth(ctx context.Context, out, log io.Writer, es []engine, deep, rounds int, dir string) error {
	cases := depthCases(deep)
	const passes = 6
	fmt.Fprintf(out, "\nClaim + ack of one job by one worker: median per job over about %d rounds in %d interleaved passes; ratio to the 10k case of the same line.\n\n", rounds, passes)
	fmt.Fprint(out, "| engine | claim | indexes |")
	for _, c := range cases {
		fmt.Fprintf(out, " %s |", c.name)
	}
	fmt.Fprintf(out, "\n|---|---|---|%s\n", strings.Repeat("---:|", len(cases)))
	seen := map[string]bool{}
	for _, e := range es {
		if seen[e.family] {
			continue // one driver per engine
		}
		seen[e.family] = true
		if err := depthEngine(ctx, out, log, e, cases, passes, rounds, dir); err != nil {
			return err
		}
	}
	return runPriorityDepth(ctx, out, log, es, deep, rounds, dir)
}

// depthLoad creates and fills a table per case, with the recommended lease
// indexes when indexed; drop removes them.
func depthLoad(ctx context.Context, log io.Writer, e engine, db *sql.DB, cases []depthCase, indexed bool) (tables []string, drop func(), err error) {
	drop = func() {
		for _, t := range tables {
			e.drop(context.WithoutCancel(ctx), db, t)
		}
	}
	for i, c := range cases {
		t := fmt.Sprintf("bench_depth_%s_%d", e.name, i)
		if indexed {
			t += "_idx"
		}
		start := time.Now()
		if err := e.createTable(ctx, db, t); err != nil {
			return tables, drop, err
		}
		tables = append(tables, t)
		if err := e.fillUntil(ctx, db, t, c.leased, payload, time.Now().Add(24*time.Hour)); err != nil {
			return tables, drop, err
		}
		if err := e.fill(ctx, db, t, c.pending, payload); err != nil {
			return tables, drop, err
		}
		for _, s := range depthIndexes(e, t) {
			if !indexed {
				break
			}
			if _, err := db.ExecContext(ctx, s); err != nil {
				return tables, drop, fmt.Errorf("%s: %w", s, err)
			}
		}
		analyze(ctx, e, db, t)
		fmt.Fprintf(log, "depth %s: loaded %s in %v\n", e.name, c.name, time.Since(start).Round(time.Millisecond))
	}
	return tables, drop, nil
}

// depthSide is the side named v on table: the old single-condition claim
// ("old", "old+idx"), inbox's lease claim ("inbox", "inbox+idx"), inbox's
// shallow lease claim (Table.Shallow) and the minimal queue of issue 25.
// The "+idx" sides run on tables with the recommended indexes.
func depthSide(e engine, db *sql.DB, table, v string) (side, error) {
	switch v {
	case "inbox", "inbox+idx":
		return newInboxSide(e, db, table, "lease", 1)
	case "shallow":
		return newInboxSide(e, db, table, "lease-shallow", 1)
	case "minimal":
		return newMinimalLease(e, db, table, 1), nil
	}
	return newOldSide(e, db, table), nil
}

func depthEngine(ctx context.Context, out, log io.Writer, e engine, cases []depthCase, passes, rounds int, dir string) error {
	db, err := e.open(dir, 4)
	if err != nil {
		return err
	}
	defer db.Close()
	// A table set with the indexes and one without, so that every claim
	// is measured in the same passes, under the same load.
	var tables [2][]string
	for k, indexed := range []bool{false, true} {
		var drop func()
		tables[k], drop, err = depthLoad(ctx, log, e, db, cases, indexed)
		defer drop()
		if err != nil {
			return err
		}
	}
	idx := strings.Join(indexNames(depthIndexes(e, "t")), " + ")
	lines := []depthLine{
		{"old single-condition", "primary key", "old"},
		{"old single-condition", idx, "old+idx"},
		{"inbox's", "primary key", "inbox"},
		{"inbox's", idx, "inbox+idx"},
		{"inbox's shallow (Table.Shallow)", "primary key", "shallow"},
		{"minimal queue (issue 25)", "primary key", "minimal"},
	}
	samples := map[string][][]time.Duration{}
	sides := []string{"old", "inbox", "shallow", "minimal", "inbox+idx", "old+idx"}
	if err := depthPasses(ctx, e, db, tables, cases, sides, passes, rounds, samples); err != nil {
		return err
	}
	for _, l := range lines {
		base := median(samples[l.v][0])
		fmt.Fprintf(out, "| %s | %s | %s |", e.family, l.claim, l.idx)
		for i := range cases {
			m := median(samples[l.v][i])
			fmt.Fprintf(out, " %.0f µs", float64(m)/1e3)
			if i > 0 {
				fmt.Fprintf(out, " (%.2f×)", float64(m)/float64(base))
			}
			fmt.Fprint(out, " |")
		}
		fmt.Fprintln(out)
	}
	return writeChart(svgDir, "depth-"+e.name+".svg", depthChart(e, cases, samples))
}

// depthPasses samples each side on every case, pass after pass, appending
// to samples[side][case]; the "+idx" sides run on the indexed tables
// (tables[1]), the others on the primary key alone (tables[0]).
func depthPasses(ctx context.Context, e engine, db *sql.DB, tables [2][]string, cases []depthCase, sides []string, passes, rounds int, samples map[string][][]time.Duration) error {
	for pass := 0; pass < passes; pass++ {
		for _, v := range sides {
			if samples[v] == nil {
				samples[v] = make([][]time.Duration, len(cases))
			}
			set := 0
			if strings.HasSuffix(v, "+idx") {
				set = 1
			}
			for i := range cases {
				s, err := depthSide(e, db, tables[set][i], v)
				if err != nil {
					return err
				}
				samples[v][i], err = sample(ctx, s, rounds/passes, 3*time.Second/time.Duration(passes), samples[v][i])
				s.close()
				if err != nil {
					return fmt.Errorf("depth %s %s %s: %w", e.name, cases[i].name, v, err)
				}
			}
		}
	}
	return nil
}

// depthChart is jobs/s of one worker (one claim + ack of one job, the
// inverse of the median) against the jobs waiting, log scale, for inbox's
// indexed and shallow lease and the minimal queue; the leased-head case
// stands a decade right of the deepest, past a dashed line.
func depthChart(e engine, cases []depthCase, samples map[string][][]time.Duration) chart {
	c := chart{
		title:  "One worker, claim + ack of one job: " + e.family + " (" + e.label + ")",
		xLabel: "jobs waiting (log scale)", yLabel: "jobs/s (one worker)", logX: true,
	}
	head := float64(cases[len(cases)-2].pending) * 10
	c.separator = head / math.Sqrt(10)
	for _, k := range cases {
		x := float64(k.pending)
		if k.leased > 0 {
			c.xTicks = append(c.xTicks, tick{head, rowsName(k.leased) + " leased + " + rowsName(k.pending)})
			continue
		}
		c.xTicks = append(c.xTicks, tick{x, rowsName(k.pending)})
	}
	for _, s := range []struct{ name, v string }{
		{"inbox, indexed lease", "inbox+idx"}, {"inbox, shallow lease", "shallow"}, {"minimal queue", "minimal"},
	} {
		sr := series{name: s.name}
		for i, k := range cases {
			m := median(samples[s.v][i])
			if m <= 0 {
				continue
			}
			p := point{x: float64(k.pending), y: float64(time.Second) / float64(m)}
			if k.leased > 0 {
				p.x, p.apart = head, true
			}
			sr.points = append(sr.points, p)
		}
		c.series = append(c.series, sr)
	}
	return c
}

// indexNames shortens CREATE INDEX statements to their columns.
func indexNames(stmts []string) []string {
	var out []string
	for _, s := range stmts {
		i := strings.Index(s, " ON ")
		out = append(out, strings.TrimPrefix(s[i+4:], "t "))
	}
	return out
}

// analyze refreshes the planner's statistics after a bulk load.
func analyze(ctx context.Context, e engine, db *sql.DB, table string) {
	switch e.family {
	case "postgres":
		_, _ = db.ExecContext(ctx, "VACUUM ANALYZE "+table)
	case "mysql":
		_, _ = db.ExecContext(ctx, "ANALYZE TABLE "+table)
	default:
		_, _ = db.ExecContext(ctx, "ANALYZE")
	}
}

// Priorities with depth (issue 11). Four tables per engine: ten jobs of
// high priority before (the lowest ids) or after (the highest ids) 10,000
// and 1,000,000 (-depth-rows) jobs of low priority. Each form claims one
// job at a time with its recommended indexes (prioIndexes), checks that it
// is one of the ten and releases it, so that every claim meets the same
// table; the figure is the median time of the Claim call alone, compared
// with the same shape at 10,000. Then Queue.Stats runs on the same tables
// with the indexes that serve it (statsIndexes) added.

// prioHigh is the high priority; the low one is 0.
const prioHigh = 10

// prioCase is a table shape: low jobs, with the ten high ones first or last.
type prioCase struct {
	name      string
	low       int
	highFirst bool
}

// benchIndex is an index of a bench table: a name suffix and the part of
// CREATE INDEX after the table's name.
type benchIndex struct{ name, def string }

func (ix benchIndex) create(table string) string {
	return "CREATE INDEX " + table + "_" + ix.name + " ON " + table + " " + ix.def
}

func (ix benchIndex) drop(e engine, table string) string {
	s := "DROP INDEX " + table + "_" + ix.name
	if e.family == "mysql" {
		s += " ON " + table
	}
	return s
}

// prioIndexes are the indexes recommended for a claim by priority, as in
// docs/schema.md. PostgreSQL lease: the free jobs in claim order (a partial
// index) and the expiry, for the expired branch. InnoDB and SQLite lease:
// (expiry, priority DESC, id), whose NULL range is the free jobs in claim
// order. Row lock and advisory: (priority DESC, id), read in order until a
// row passes the not-before test (and, row lock, is not locked).
func prioIndexes(e engine, form string) []benchIndex {
	switch {
	case form == "lease" && e.family == "postgres":
		return []benchIndex{{"free", "(priority DESC, id) WHERE locked_until IS NULL"}, {"lu", "(locked_until)"}}
	case form == "lease":
		return []benchIndex{{"claimable", "(locked_until, priority DESC, id)"}}
	}
	return []benchIndex{{"prio", "(priority DESC, id)"}}
}

// statsIndexes are what Queue.Stats needs beyond the claim's indexes, as in
// docs/schema.md: every count is a range of an index on the form's time
// column (lease: the expiry; the others: not_before), and the oldest ready
// job is the first entry of an index on enqueued_at among the rows whose
// time column is NULL. PostgreSQL does not read (time, enqueued_at) in
// enqueued_at order within the NULL range, so it takes a partial index.
func statsIndexes(e engine, form string) []benchIndex {
	switch {
	case e.family == "postgres" && form == "lease":
		return []benchIndex{{"free_age", "(enqueued_at) WHERE locked_until IS NULL"}}
	case e.family == "postgres":
		return []benchIndex{{"ready", "(not_before, id)"}, {"ready_age", "(enqueued_at) WHERE not_before IS NULL"}}
	case form == "lease":
		return []benchIndex{{"age", "(locked_until, enqueued_at)"}}
	}
	return []benchIndex{{"age", "(not_before, enqueued_at)"}}
}

// prioTable describes a priority table in a form: the schema files' columns
// for it, with a priority, an enqueue time and a dead table.
func prioTable(table, form string) inbox.Table {
	t := inbox.Table{Name: table, DeadTable: table + "_dead", Priority: "priority", EnqueuedAt: "enqueued_at"}
	switch form {
	case "lease":
		t.LockedUntil = "locked_until"
	case "advisory":
		t.AdvisoryKey, t.NotBefore = "id", "not_before"
	default:
		t.NotBefore = "not_before"
	}
	return t
}

// prioCreate (re)creates a priority table and its dead table.
func prioCreate(ctx context.Context, e engine, db *sql.DB, table string) error {
	var create, dead string
	switch e.family {
	case "postgres":
		create = "CREATE TABLE " + table + " (id bigserial PRIMARY KEY, attempt integer NOT NULL DEFAULT 1, locked_until timestamptz, not_before timestamptz, " +
			"priority integer NOT NULL DEFAULT 0, enqueued_at timestamptz, payload bytea NOT NULL)"
		dead = "CREATE TABLE " + table + "_dead (id bigint PRIMARY KEY, attempt integer NOT NULL, payload bytea NOT NULL)"
	case "mysql":
		create = "CREATE TABLE " + table + " (id bigint AUTO_INCREMENT PRIMARY KEY, attempt integer NOT NULL DEFAULT 1, locked_until DATETIME(6) NULL, " +
			"not_before DATETIME(6) NULL, priority integer NOT NULL DEFAULT 0, enqueued_at DATETIME(6) NULL, payload blob NOT NULL)"
		dead = "CREATE TABLE " + table + "_dead (id bigint PRIMARY KEY, attempt integer NOT NULL, payload blob NOT NULL)"
	default:
		create = "CREATE TABLE " + table + " (id INTEGER PRIMARY KEY AUTOINCREMENT, attempt INTEGER NOT NULL DEFAULT 1, locked_until TEXT, not_before TEXT, " +
			"priority INTEGER NOT NULL DEFAULT 0, enqueued_at TEXT, payload BLOB NOT NULL)"
		dead = "CREATE TABLE " + table + "_dead (id INTEGER PRIMARY KEY, attempt INTEGER NOT NULL, payload BLOB NOT NULL)"
	}
	for _, s := range []string{"DROP TABLE IF EXISTS " + table, "DROP TABLE IF EXISTS " + table + "_dead", create, dead} {
		if _, err := db.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("%s: %s: %w", e.name, s, err)
		}
	}
	return nil
}

// prioFill inserts n jobs of one priority, enqueued at at, in one
// statement (as engine.fill does).
func prioFill(ctx context.Context, e engine, db *sql.DB, table string, n, priority int, at time.Time) error {
	switch e.family {
	case "postgres":
		_, err := db.ExecContext(ctx, "INSERT INTO "+table+" (payload, priority, enqueued_at) SELECT $1::bytea, $2, $3::timestamptz FROM generate_series(1, $4)", payload, priority, at, n)
		return err
	case "mysql":
		conn, err := db.Conn(ctx)
		if err != nil {
			return err
		}
		defer conn.Close()
		var version string
		if err := conn.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
			return err
		}
		enq := at.UTC().Format("2006-01-02 15:04:05.000000")
		if strings.Contains(strings.ToLower(version), "mariadb") {
			_, err = conn.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s (payload, priority, enqueued_at) SELECT ?, ?, ? FROM seq_1_to_%d", table, n), payload, priority, enq)
			return err
		}
		if _, err := conn.ExecContext(ctx, fmt.Sprintf("SET SESSION cte_max_recursion_depth = %d", n+1)); err != nil {
			return err
		}
		_, err = conn.ExecContext(ctx, "INSERT INTO "+table+" (payload, priority, enqueued_at) WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < ?) SELECT ?, ?, ? FROM s",
			n, payload, priority, enq)
		return err
	default:
		_, err := db.ExecContext(ctx, "INSERT INTO "+table+" (payload, priority, enqueued_at) WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < ?) SELECT ?, ?, ? FROM s",
			n, payload, priority, at.UTC().Format(inbox.SQLiteTimeFormat))
		return err
	}
}

// rowsName writes a row count as the tables' headers do: 10k, 1M.
func rowsName(n int) string {
	if n >= 1000000 && n%1000000 == 0 {
		return fmt.Sprintf("%dM", n/1000000)
	}
	return fmt.Sprintf("%dk", n/1000)
}

func runPriorityDepth(ctx context.Context, out, log io.Writer, es []engine, deep, rounds int, dir string) error {
	cases := []prioCase{
		{"10 high, then 10k low", 10000, true},
		{"10 high, then " + rowsName(deep) + " low", deep, true},
		{"10k low, then 10 high", 10000, false},
		{rowsName(deep) + " low, then 10 high", deep, false},
	}
	fmt.Fprintf(out, "\nPriorities: one Claim(1) of a job of high priority, then a Release, by one worker, with the form's recommended indexes: "+
		"median time of the claim over up to %d rounds (at most %v), each round one claim on every table in turn; ratio to the same shape with 10k low jobs.\n\n", rounds, prioBudget)
	fmt.Fprintf(out, "| engine | form | indexes | %s | %s | %s | %s |\n|---|---|---|---:|---:|---:|---:|\n", cases[0].name, cases[1].name, cases[2].name, cases[3].name)
	var stats []string
	seen := map[string]bool{}
	for _, e := range es {
		if seen[e.family] {
			continue // one driver per engine
		}
		seen[e.family] = true
		lines, err := priorityEngine(ctx, out, log, e, cases, rounds, dir)
		if err != nil {
			return err
		}
		stats = append(stats, lines...)
	}
	fmt.Fprintf(out, "\nQueue.Stats (one statement) on the same tables, all jobs ready, with the form's claim and Stats indexes: median of %d calls, interleaved.\n\n", statsCalls)
	fmt.Fprintf(out, "| engine | form | Stats indexes | %s rows | %s rows |\n|---|---|---|---:|---:|\n", thousands(cases[2].low+prioHigh), thousands(cases[3].low+prioHigh))
	for _, l := range stats {
		fmt.Fprintln(out, l)
	}
	return nil
}

// statsCalls is how many Stats calls each figure is the median of.
const statsCalls = 15

// priorityEngine loads the engine's tables, measures each form on them and
// prints its claim lines; it returns its Stats lines.
func priorityEngine(ctx context.Context, out, log io.Writer, e engine, cases []prioCase, rounds int, dir string) ([]string, error) {
	db, err := e.open(dir, 4)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	tables := make([]string, len(cases))
	at := time.Now().Add(-time.Minute)
	for i, c := range cases {
		tables[i] = fmt.Sprintf("bench_prio_%s_%d", e.name, i)
		fmt.Fprintf(log, "priority %s: loading %s\n", e.name, c.name)
		if err := prioCreate(ctx, e, db, tables[i]); err != nil {
			return nil, err
		}
		defer e.drop(context.WithoutCancel(ctx), db, tables[i]+"_dead")
		defer e.drop(context.WithoutCancel(ctx), db, tables[i])
		parts := [][2]int{{prioHigh, prioHigh}, {c.low, 0}}
		if !c.highFirst {
			parts[0], parts[1] = parts[1], parts[0]
		}
		for _, p := range parts {
			if err := prioFill(ctx, e, db, tables[i], p[0], p[1], at); err != nil {
				return nil, fmt.Errorf("priority %s: load %s: %w", e.name, c.name, err)
			}
		}
	}
	var statsLines []string
	for _, form := range []string{"lease", "rowlock", "advisory"} {
		if !contains(e.forms(), form) {
			continue
		}
		fmt.Fprintf(log, "priority %s: %s\n", e.name, form)
		idx := prioIndexes(e, form)
		if err := prioIndex(ctx, e, db, tables, idx, true); err != nil {
			return nil, err
		}
		qs := make([]*inbox.Queue, len(tables))
		for i, t := range tables {
			q, err := inbox.New(db, inbox.Config{Dialect: e.dialect, Table: prioTable(t, form)})
			if err != nil {
				return nil, err
			}
			if err := q.CheckSchema(ctx); err != nil {
				return nil, fmt.Errorf("priority %s %s: %w", e.name, form, err)
			}
			defer q.Shutdown(context.WithoutCancel(ctx))
			qs[i] = q
		}
		// The tables in turn, one claim each, round after round, so that a
		// change of load on the shared machine falls on all alike.
		samples := make([][]time.Duration, len(cases))
		start := time.Now()
		for r := 0; r < rounds && (r < 30 || time.Since(start) < prioBudget); r++ {
			for i := range cases {
				d, err := prioClaim(ctx, qs[i])
				if err != nil {
					return nil, fmt.Errorf("priority %s %s %s: %w", e.name, form, cases[i].name, err)
				}
				samples[i] = append(samples[i], d)
			}
		}
		cells := make([]string, len(cases))
		for i := range cases {
			m := median(samples[i])
			cells[i] = fmt.Sprintf("%.0f µs", float64(m)/1e3)
			if i%2 == 1 {
				cells[i] += fmt.Sprintf(" (%.2f×)", float64(m)/float64(median(samples[i-1])))
			}
		}
		fmt.Fprintf(out, "| %s | %s | %s | %s | %s | %s | %s |\n", e.family, form, indexText(idx), cells[0], cells[1], cells[2], cells[3])

		// Stats, on the tables with the ten high jobs last.
		sidx := statsIndexes(e, form)
		if err := prioIndex(ctx, e, db, tables, sidx, true); err != nil {
			return nil, err
		}
		var st [2][]time.Duration
		for k := 0; k < statsCalls; k++ {
			for j, i := range []int{2, 3} {
				t0 := time.Now()
				s, err := qs[i].Stats(ctx)
				if err != nil {
					return nil, fmt.Errorf("priority %s %s: stats: %w", e.name, form, err)
				}
				st[j] = append(st[j], time.Since(t0))
				if want := int64(cases[i].low + prioHigh); s.Ready != want || s.Waiting != 0 || s.OldestReady < time.Minute {
					return nil, fmt.Errorf("priority %s %s: stats of %s: %+v, want %d ready, none waiting, the oldest a minute old", e.name, form, cases[i].name, s, want)
				}
			}
		}
		m0, m1 := median(st[0]), median(st[1])
		statsLines = append(statsLines, fmt.Sprintf("| %s | %s | %s | %s | %s (%.1f×) |", e.family, form, indexText(sidx),
			fmtDuration(m0), fmtDuration(m1), float64(m1)/float64(m0)))
		if err := prioIndex(ctx, e, db, tables, append(idx, sidx...), false); err != nil {
			return nil, err
		}
	}
	return statsLines, nil
}

// prioIndex creates (or drops) indexes on every table, then refreshes the
// statistics.
func prioIndex(ctx context.Context, e engine, db *sql.DB, tables []string, idx []benchIndex, create bool) error {
	for _, t := range tables {
		for _, ix := range idx {
			s := ix.create(t)
			if !create {
				s = ix.drop(e, t)
			}
			if _, err := db.ExecContext(ctx, s); err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
		}
		if create {
			analyze(ctx, e, db, t)
		}
	}
	return nil
}

// prioBudget bounds the claims of one form on one engine.
const prioBudget = 15 * time.Second

// prioClaim claims one job from q, which must be one of the high ones, and
// releases it, so that the next claim meets the same table. It returns the
// time of the claim.
func prioClaim(ctx context.Context, q *inbox.Queue) (time.Duration, error) {
	t0 := time.Now()
	ds, err := q.Claim(ctx, 1)
	d := time.Since(t0)
	if err != nil {
		return 0, err
	}
	if len(ds) != 1 {
		return 0, fmt.Errorf("claimed %d jobs, want 1", len(ds))
	}
	p := ds[0].Priority()
	if err := ds[0].Release(ctx); err != nil {
		return 0, err
	}
	if p != prioHigh {
		return 0, fmt.Errorf("claimed job %v of priority %d, want %d", ds[0].ID(), p, prioHigh)
	}
	return d, nil
}

// indexText writes indexes as the tables' column does.
func indexText(idx []benchIndex) string {
	var s []string
	for _, ix := range idx {
		s = append(s, ix.def)
	}
	return strings.Join(s, " + ")
}

// fmtDuration writes a duration in µs or ms.
func fmtDuration(d time.Duration) string {
	if d < 10*time.Millisecond {
		return fmt.Sprintf("%.0f µs", float64(d)/1e3)
	}
	return fmt.Sprintf("%.1f ms", float64(d)/1e6)
}

// thousands writes n with commas: 1,000,010.
func thousands(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
