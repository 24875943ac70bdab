//go:build unix

package main

// -run breakdown: where each microsecond of a job goes. For each form, engine
// and driver, with -workers (4 unless given) and each -batch, the two sides of
// the table (inbox_side.go and hand_side.go, unchanged) work through
// -breakdown-jobs jobs each, in two halves (inbox, hand, hand, inbox), on one
// pool wrapped by idle.go's counting driver, which this file extends to time
// every call by its SQL text. Per job acknowledged it reports the calls that reached the
// driver, the wall time spent inside them per statement (the client's view of
// server time plus network), the process's CPU time and allocations, and what
// the server wrote: WAL on PostgreSQL, redo and handler row counters on
// MariaDB. Both tables are seeded before any counter is read.
//
// The file builds on unix only: the CPU time comes from getrusage.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sqlinbox/inbox/internal/connhook"
)

// breakdownJobs is the number of jobs each side works through.
var breakdownJobs = 4000

func init() {
	flag.IntVar(&breakdownJobs, "breakdown-jobs", breakdownJobs, "breakdown: jobs each side of a line works through (seeded before any counter is read)")
	runBreakdownMode = runBreakdownOptions
}

// runBreakdownOptions reads the mode's options: -workers only when given on
// the command line, since its default (1,4,16) is the table's and a breakdown
// of one worker count is what this mode is for.
func runBreakdownOptions(ctx context.Context, out, log io.Writer, es []engine, o options, dir string) error {
	workers := []int{4}
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "workers" })
	var err error
	if given {
		if workers, err = parseInts(o.workers); err != nil {
			return err
		}
	}
	batches, err := parseInts(o.batches)
	if err != nil {
		return err
	}
	if breakdownJobs <= 0 {
		return fmt.Errorf("-breakdown-jobs %d: want a positive number", breakdownJobs)
	}
	return runBreakdown(ctx, out, log, es, strings.Split(o.forms, ","), workers, batches, breakdownJobs, dir)
}

var sideNames = [2]string{"inbox", "hand-written"}

// sideBreakdown is what one side of a line cost, over its whole run.
type sideBreakdown struct {
	jobs, left int
	elapsed    time.Duration
	empty      int64 // rounds that acknowledged nothing
	calls      callCounts
	stmts      map[stmtKey]stmtStat
	cpu        time.Duration
	mallocs    uint64
	server     []serverCounter // deltas over one part of the run
	parts      []sideBreakdown // the parts summed by add, for serverPerJob
	pgss       []pgssRow       // PostgreSQL, when pg_stat_statements is readable
}

// breakdownLine is one block of the output: a cell, both sides.
type breakdownLine struct {
	c     cell
	sides [2]sideBreakdown
}

func runBreakdown(ctx context.Context, out, log io.Writer, es []engine, forms []string, workers, batches []int, jobs int, dir string) error {
	sideNames[1] = baselineName()
	pgss := false
	pgssNote := ""
	var drops []func()
	defer func() {
		for _, drop := range drops {
			drop()
		}
	}()
	seen, err := headerOf(out, es, dir, func(e engine, db *sql.DB) {
		if e.family == "postgres" {
			var drop func()
			pgss, pgssNote, drop = probeStatStatements(ctx, e, db)
			drops = append(drops, drop)
		}
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "Per job acknowledged: each side works through %d jobs seeded beforehand (not counted), on one pool wrapped by a driver that counts and times every call. "+
		"Driver µs are wall time inside the driver's calls, summed over the workers: a query from its call to its rows' close (the client's view of server time plus network). "+
		"CPU is the whole process's getrusage (user + sys; SQLite's engine runs in it). Each side runs in two halves (inbox, hand, hand, inbox); server counters are server-wide, so each is the lower of the two halves' figures per job, other clients of a shared server only adding to them. "+
		"inbox's side: %s%s; the other side sends text.\n\n", jobs, preparedOrText(), boundNote())
	if seen["postgres"] {
		if pgss {
			fmt.Fprintln(out, "PostgreSQL server time per statement comes from pg_stat_statements.")
		} else {
			fmt.Fprintf(out, "PostgreSQL server time per statement is absent: %s\n", pgssNote)
		}
	}
	if seen["sqlite"] {
		fmt.Fprintln(out, "SQLite: page writes are not measured; its CPU time is in the client's.")
	}
	if seen["mysql"] {
		fmt.Fprintln(out, "MariaDB 10.11 has no Innodb_rows_* counters: rows come from Handler_* (every storage engine, index reads included); redo bytes from Innodb_lsn_current. go-sql-driver/mysql's BEGIN with an isolation level is two round trips (SET TRANSACTION, START TRANSACTION).")
	}
	fmt.Fprintln(out)
	var lines []breakdownLine
	for _, c := range loopCells(es, forms, workers, batches) {
		l, err := breakdownCell(ctx, c, dir, jobs, pgss)
		if err != nil {
			return fmt.Errorf("%v: %w", c, err)
		}
		printBreakdown(out, l)
		fmt.Fprintf(log, "%v: inbox %d jobs in %v, hand %d jobs in %v\n", c,
			l.sides[0].jobs, l.sides[0].elapsed.Round(time.Millisecond), l.sides[1].jobs, l.sides[1].elapsed.Round(time.Millisecond))
		lines = append(lines, l)
	}
	printBreakdownSummary(out, lines)
	return nil
}

// breakdownCell runs both sides of c on tables of jobs each.
func breakdownCell(ctx context.Context, c cell, dir string, jobs int, pgss bool) (breakdownLine, error) {
	l := breakdownLine{c: c}
	counter := &callCounter{}
	rec := newStmtRecorder()
	db, err := openTimed(c.e, dir, counter, rec, c.conns())
	if err != nil {
		return l, err
	}
	defer db.Close()
	// Server readings go through a pool of their own, outside the counts.
	var stats *sql.DB
	if c.e.family != "sqlite" {
		if stats, err = c.e.open(dir, 1); err != nil {
			return l, err
		}
		defer stats.Close()
	}
	tables, drop, err := createTables(ctx, c, db)
	defer drop()
	if err != nil {
		return l, err
	}
	var sides [2]side
	for k, hand := range []bool{false, true} {
		if sides[k], err = newSide(c, db, tables[k], hand); err != nil {
			return l, err
		}
		defer sides[k].close()
	}
	if err := fillTables(ctx, c, db, tables, jobs); err != nil {
		return l, err
	}
	// Connections are opened before counting, so that neither side pays
	// for the pool's growth.
	if err := warmPool(ctx, db, c.conns()); err != nil {
		return l, err
	}
	// Two halves, inbox, hand, hand, inbox, so that a change of load on a
	// shared machine falls on both sides alike.
	for half := range 2 {
		for i := range 2 {
			k := i
			if half == 1 {
				k = 1 - i
			}
			limit := jobs / 2
			if half == 1 {
				limit = jobs - l.sides[k].jobs
			}
			part, err := breakdownSegment(ctx, c, stats, tables[k], sides[k], counter, rec, limit, pgss)
			if err != nil {
				return l, fmt.Errorf("%s: %w", sideNames[k], err)
			}
			l.sides[k].add(part)
		}
	}
	for k := range sides {
		sb := &l.sides[k]
		if sb.left, err = count(ctx, db, tables[k]); err != nil {
			return l, err
		}
		// Every job was deleted by an acknowledgement that counted it:
		// none acknowledged twice, none left.
		if sb.jobs != jobs || sb.left != 0 {
			return l, fmt.Errorf("%s: %d of %d jobs acknowledged, %d rows left", sideNames[k], sb.jobs, jobs, sb.left)
		}
	}
	return l, nil
}

// warmPool opens n connections and gives them back to the pool.
func warmPool(ctx context.Context, db *sql.DB, n int) error {
	conns := make([]*sql.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range n {
		c, err := db.Conn(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, c)
		if err := c.PingContext(ctx); err != nil {
			return err
		}
	}
	return nil
}

// emptyRounds counts a side's rounds that acknowledged nothing: claims that
// found every remaining job held by another worker near the end of a run,
// rounds of the held forms that found no free connection.
type emptyRounds struct {
	side
	n atomic.Int64
}

func (s *emptyRounds) round(ctx context.Context) (int, error) {
	n, err := s.side.round(ctx)
	if n == 0 && err == nil {
		s.n.Add(1)
	}
	return n, err
}

// breakdownSegment works s through limit jobs of table and returns what
// that cost.
func breakdownSegment(ctx context.Context, c cell, stats *sql.DB, table string, s side, counter *callCounter, rec *stmtRecorder, limit int, pgss bool) (sideBreakdown, error) {
	var sb sideBreakdown
	before, err := serverSnapshot(ctx, c.e, stats)
	if err != nil {
		return sb, err
	}
	var pgBefore map[int64]pgssRow
	if pgss && c.e.family == "postgres" {
		if pgBefore, err = readStatStatements(ctx, stats, table); err != nil {
			return sb, err
		}
	}
	es := &emptyRounds{side: s}
	runtime.GC() // the seeding's garbage is not the side's
	counter.reset()
	rec.reset()
	var m0, m1 runtime.MemStats
	cpu0 := processCPU()
	runtime.ReadMemStats(&m0)
	r := measure(ctx, es, c.workers, limit, 0, 10*time.Second)
	runtime.ReadMemStats(&m1)
	cpu1 := processCPU()
	if r.err != nil {
		return sb, r.err
	}
	sb.calls = counter.snapshot()
	sb.stmts = rec.snapshot()
	after, err := serverSnapshot(ctx, c.e, stats)
	if err != nil {
		return sb, err
	}
	sb.jobs, sb.elapsed, sb.empty = r.jobs, r.elapsed, es.n.Load()
	sb.cpu = cpu1 - cpu0
	sb.mallocs = m1.Mallocs - m0.Mallocs
	for i := range after {
		sb.server = append(sb.server, serverCounter{after[i].name, after[i].value - before[i].value})
	}
	if pgBefore != nil {
		pgAfter, err := readStatStatements(ctx, stats, table)
		if err != nil {
			return sb, err
		}
		sb.pgss = diffStatStatements(pgBefore, pgAfter)
	}
	return sb, nil
}

// add sums the figures of another part of the side's run into sb.
func (sb *sideBreakdown) add(o sideBreakdown) {
	sb.jobs += o.jobs
	sb.elapsed += o.elapsed
	sb.empty += o.empty
	sb.calls.statements += o.calls.statements
	sb.calls.tx += o.calls.tx
	sb.calls.prepares += o.calls.prepares
	if sb.stmts == nil {
		sb.stmts = map[stmtKey]stmtStat{}
	}
	for k, v := range o.stmts {
		t := sb.stmts[k]
		t.calls += v.calls
		t.spent += v.spent
		sb.stmts[k] = t
	}
	sb.cpu += o.cpu
	sb.mallocs += o.mallocs
	if sb.server == nil {
		sb.server = make([]serverCounter, len(o.server))
	}
	for i, v := range o.server {
		sb.server[i].name = v.name
		sb.server[i].value += v.value
	}
	sb.parts = append(sb.parts, o)
	for _, p := range o.pgss {
		found := false
		for i := range sb.pgss {
			if sb.pgss[i].query == p.query {
				sb.pgss[i].calls += p.calls
				sb.pgss[i].exec += p.exec
				sb.pgss[i].plan += p.plan
				found = true
			}
		}
		if !found {
			sb.pgss = append(sb.pgss, p)
		}
	}
}

// processCPU is the process's CPU time so far, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// serverCounter is one server-wide counter.
type serverCounter struct {
	name  string
	value float64
}

// mysqlStatus are the MariaDB/MySQL status variables read: the redo
// position and the handler's row operations.
var mysqlStatus = []string{"Innodb_lsn_current", "Innodb_os_log_written",
	"Handler_read_first", "Handler_read_key", "Handler_read_last", "Handler_read_next", "Handler_read_prev",
	"Handler_read_rnd", "Handler_read_rnd_next", "Handler_write", "Handler_update", "Handler_delete"}

// serverSnapshot reads the server's write counters: PostgreSQL's WAL
// position, MariaDB's redo position and row operations; none for SQLite.
func serverSnapshot(ctx context.Context, e engine, db *sql.DB) ([]serverCounter, error) {
	switch e.family {
	case "postgres":
		pos, err := walPosition(ctx, cell{e: e}, db)
		return []serverCounter{{"WAL bytes", float64(pos)}}, err
	case "mysql":
		rows, err := db.QueryContext(ctx, "SHOW GLOBAL STATUS WHERE Variable_name IN ('"+strings.Join(mysqlStatus, "', '")+"')")
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		v := map[string]float64{}
		for rows.Next() {
			var name string
			var n float64
			if err := rows.Scan(&name, &n); err != nil {
				return nil, err
			}
			v[name] = n
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
		redo := serverCounter{"redo bytes (Innodb_lsn_current)", v["Innodb_lsn_current"]}
		if _, ok := v["Innodb_lsn_current"]; !ok { // MySQL 8 has no such variable
			redo = serverCounter{"redo bytes (Innodb_os_log_written)", v["Innodb_os_log_written"]}
		}
		var read float64
		for _, n := range mysqlStatus {
			if strings.HasPrefix(n, "Handler_read_") {
				read += v[n]
			}
		}
		return []serverCounter{redo,
			{"rows read (Handler_read_*)", read},
			{"rows inserted (Handler_write)", v["Handler_write"]},
			{"rows updated (Handler_update)", v["Handler_update"]},
			{"rows deleted (Handler_delete)", v["Handler_delete"]},
		}, nil
	}
	return nil, nil
}

// pg_stat_statements, when the server has it loaded. It needs
// shared_preload_libraries, which a shared server is not restarted for: the
// probe creates the extension in a transaction it rolls back unless its view
// can be read.

// pgssRow is a statement's counters, or their change over a run.
type pgssRow struct {
	query      string
	calls      int64
	exec, plan float64 // ms
}

// probeStatStatements reports whether pg_stat_statements can be read, why
// not otherwise, and a function that drops the extension if the probe
// created it.
func probeStatStatements(ctx context.Context, e engine, db *sql.DB) (ok bool, note string, drop func()) {
	drop = func() {}
	var installed bool
	if err := db.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements')").Scan(&installed); err != nil {
		return false, err.Error(), drop
	}
	if installed {
		var n int64
		if err := db.QueryRowContext(ctx, "SELECT count(*) FROM pg_stat_statements").Scan(&n); err != nil {
			return false, "the extension is installed but its view cannot be read (" + err.Error() + ").", drop
		}
		return true, "", drop
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return false, err.Error(), drop
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "CREATE EXTENSION pg_stat_statements"); err != nil {
		return false, "CREATE EXTENSION pg_stat_statements failed (" + err.Error() + ").", drop
	}
	var n int64
	if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM pg_stat_statements").Scan(&n); err != nil {
		return false, "the extension can be created but not read (" + err.Error() + "); the shared server is not reconfigured for it.", drop
	}
	if err := tx.Commit(); err != nil {
		return false, err.Error(), drop
	}
	return true, "", func() {
		// The run created it: it leaves the database as it found it.
		if db, err := e.open("", 1); err == nil {
			db.ExecContext(context.WithoutCancel(ctx), "DROP EXTENSION IF EXISTS pg_stat_statements")
			db.Close()
		}
	}
}

// readStatStatements reads the counters of the statements naming table.
func readStatStatements(ctx context.Context, db *sql.DB, table string) (map[int64]pgssRow, error) {
	rows, err := db.QueryContext(ctx, "SELECT queryid, query, calls, total_exec_time, total_plan_time FROM pg_stat_statements"+
		" WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND query LIKE '%' || $1 || '%'", table)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[int64]pgssRow{}
	for rows.Next() {
		var id int64
		var r pgssRow
		if err := rows.Scan(&id, &r.query, &r.calls, &r.exec, &r.plan); err != nil {
			return nil, err
		}
		out[id] = r
	}
	return out, rows.Err()
}

func diffStatStatements(before, after map[int64]pgssRow) []pgssRow {
	var out []pgssRow
	for id, a := range after {
		b := before[id]
		if a.calls > b.calls {
			out = append(out, pgssRow{a.query, a.calls - b.calls, a.exec - b.exec, a.plan - b.plan})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].exec+out[i].plan > out[j].exec+out[j].plan })
	return out
}

// The timing driver: idle.go's counting hooks, each call also timed and
// recorded by its kind and SQL text.

type stmtKey struct{ kind, text string }

type stmtStat struct {
	calls int64
	spent time.Duration
}

// stmtRecorder sums calls and time per statement; safe for concurrent use.
type stmtRecorder struct {
	mu sync.Mutex
	m  map[stmtKey]*stmtStat
}

func newStmtRecorder() *stmtRecorder { return &stmtRecorder{m: map[stmtKey]*stmtStat{}} }

func (r *stmtRecorder) add(kind, text string, d time.Duration) {
	r.mu.Lock()
	st := r.m[stmtKey{kind, text}]
	if st == nil {
		st = &stmtStat{}
		r.m[stmtKey{kind, text}] = st
	}
	st.calls++
	st.spent += d
	r.mu.Unlock()
}

func (r *stmtRecorder) reset() {
	r.mu.Lock()
	r.m = map[stmtKey]*stmtStat{}
	r.mu.Unlock()
}

func (r *stmtRecorder) snapshot() map[stmtKey]stmtStat {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[stmtKey]stmtStat, len(r.m))
	for k, v := range r.m {
		out[k] = *v
	}
	return out
}

// openTimed opens e through the counting driver, timed into r.
func openTimed(e engine, dir string, c *callCounter, r *stmtRecorder, maxConns int) (*sql.DB, error) {
	inner, err := connhook.Connector(e.driver, e.dsn(dir))
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(connhook.Wrap(inner, connhook.Hooks{
		Before: c.before,
		After: func(ctx context.Context, call connhook.Call, err error, d time.Duration) {
			c.after(ctx, call, err, d)
			r.after(call, err, d)
		},
		RowsClosed: r.rowsClosed,
	}))
	return e.ready(db, maxConns)
}

// after records a call that reached the driver, but a query that
// returned rows: rowsClosed records it as its rows close, with the time
// spent fetching them, for drivers that stream results (pgx, pq) wait for
// the server there too. Each prepared statement's close is recorded:
// go-sql-driver/mysql closes each statement it prepared for one call.
func (r *stmtRecorder) after(call connhook.Call, err error, d time.Duration) {
	switch call.Kind {
	case connhook.Query:
		// A driver.ErrSkip is prepared by database/sql instead: timed there.
		if err != nil && !errors.Is(err, driver.ErrSkip) {
			r.add("query", call.SQL, d)
		}
	case connhook.StmtQuery:
		if err != nil {
			r.add("query", call.SQL, d)
		}
	case connhook.Exec:
		if !errors.Is(err, driver.ErrSkip) {
			r.add("exec", call.SQL, d)
		}
	case connhook.StmtExec:
		r.add("exec", call.SQL, d)
	case connhook.Prepare:
		r.add("prepare", call.SQL, d)
	case connhook.StmtClose:
		r.add("close", call.SQL, d)
	case connhook.Begin:
		what := "BEGIN"
		if call.TxOptions.Isolation != driver.IsolationLevel(sql.LevelDefault) {
			what += " " + strings.ToUpper(sql.IsolationLevel(call.TxOptions.Isolation).String())
		}
		r.add("tx", what, d)
	case connhook.Commit:
		r.add("tx", "COMMIT", d)
	case connhook.Rollback:
		r.add("tx", "ROLLBACK", d)
	}
}

func (r *stmtRecorder) rowsClosed(_ context.Context, call connhook.Call, spent time.Duration) {
	r.add("query", call.SQL, spent)
}

// stmtLabel shortens a statement for the tables: its verb, its table, the
// first condition of its first WHERE, whether it skips locked rows or
// returns rows, and how many parameters it takes (which tells batch sizes
// apart).
func stmtLabel(text string) string {
	s := strings.Join(strings.Fields(strings.NewReplacer(`"`, "", "`", "").Replace(text)), " ")
	words := strings.Fields(s)
	if len(words) == 0 {
		return s
	}
	up := func(i int) string { return strings.ToUpper(words[i]) }
	verb, at := up(0), 0
	if verb == "WITH" {
		// The statement's own verb is the first one outside parentheses.
		depth := 0
		for i := 1; i < len(words); i++ {
			if depth == 0 && contains([]string{"SELECT", "UPDATE", "DELETE", "INSERT"}, up(i)) {
				verb, at = up(i), i
				break
			}
			depth += strings.Count(words[i], "(") - strings.Count(words[i], ")")
		}
	}
	table := ""
	after := func(kw string) string {
		for i := at + 1; i+1 < len(words); i++ {
			if up(i) == kw && !strings.HasPrefix(words[i+1], "(") {
				return strings.TrimRight(words[i+1], ",;")
			}
		}
		return ""
	}
	var label string
	switch verb {
	case "UPDATE":
		if at+1 < len(words) {
			table = words[at+1]
		}
		label = "UPDATE " + table
	case "DELETE":
		table = after("FROM")
		label = "DELETE FROM " + table
	case "INSERT":
		table = after("INTO")
		label = "INSERT INTO " + table
	case "SELECT":
		table = after("FROM")
		label = "SELECT … FROM " + table
	}
	if table == "" {
		if len(s) > 48 {
			return s[:47] + "…"
		}
		return s
	}
	if at > 0 {
		label = "WITH … " + label
	}
	for i := 0; i < len(words); i++ {
		if up(i) != "WHERE" {
			continue
		}
		var cond []string
		more, depth := false, 0
		for j := i + 1; j < len(words) && len(cond) < 12; j++ {
			if depth == 0 && contains([]string{"AND", "OR", "ORDER", "LIMIT", "FOR", "RETURNING", "UNION"}, up(j)) {
				more = up(j) == "AND" || up(j) == "OR"
				break
			}
			depth += strings.Count(words[j], "(") - strings.Count(words[j], ")")
			if depth < 0 { // the end of the subquery this WHERE is in
				cond = append(cond, strings.TrimRight(words[j], ")"))
				break
			}
			cond = append(cond, words[j])
		}
		label += " WHERE " + shortCond(strings.Join(cond, " "))
		if more {
			label += " …"
		}
		break
	}
	if strings.Contains(strings.ToUpper(s), "SKIP LOCKED") {
		label += " SKIP LOCKED"
	}
	if strings.Contains(strings.ToUpper(s), " RETURNING ") {
		label += " RETURNING"
	}
	switch n := countParams(text); n {
	case 0:
	case 1:
		label += " (1 arg)"
	default:
		label += fmt.Sprintf(" (%d args)", n)
	}
	return label
}

// shortCond elides a condition's lists and subqueries: "(id, attempt) IN
// (…)", "id = (…)".
func shortCond(cond string) string {
	if i := strings.Index(strings.ToUpper(cond), " IN ("); i >= 0 {
		return cond[:i] + " IN (…)"
	}
	var open []int
	for i, r := range cond {
		switch r {
		case '(':
			open = append(open, i)
		case ')':
			if len(open) > 0 {
				open = open[:len(open)-1]
			}
		}
	}
	if len(open) > 0 {
		return cond[:open[0]] + "(…)"
	}
	return cond
}

// countParams counts a statement's placeholders: ? or the highest $n.
func countParams(text string) int {
	q, dollar := 0, 0
	for i := 0; i < len(text); i++ {
		switch text[i] {
		case '?':
			q++
		case '$':
			n := 0
			for i+1 < len(text) && text[i+1] >= '0' && text[i+1] <= '9' {
				i++
				n = n*10 + int(text[i]-'0')
			}
			dollar = max(dollar, n)
		}
	}
	return max(q, dollar)
}

// Output.

type stmtLine struct {
	side  int
	label string
	stmtStat
}

// stmtLines lists a side's calls by label, most time per job first.
func stmtLines(side int, m map[stmtKey]stmtStat) []stmtLine {
	var out []stmtLine
	for k, v := range m {
		label := k.text
		switch k.kind {
		case "query", "exec":
			label = stmtLabel(k.text)
		case "prepare", "close":
			label = k.kind + " " + stmtLabel(k.text)
		}
		out = append(out, stmtLine{side, label, v})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].spent != out[j].spent {
			return out[i].spent > out[j].spent
		}
		return out[i].label < out[j].label
	})
	return out
}

// callsOf sums a side's recorded calls of one kind (tx: of one SQL text).
func (sb sideBreakdown) callsOf(kind, text string) int64 {
	var n int64
	for k, v := range sb.stmts {
		if k.kind == kind && (text == "" || strings.HasPrefix(k.text, text)) {
			n += v.calls
		}
	}
	return n
}

func (sb sideBreakdown) driverTime() time.Duration {
	var d time.Duration
	for _, v := range sb.stmts {
		d += v.spent
	}
	return d
}

func (sb sideBreakdown) perJob(v float64) float64 {
	if sb.jobs == 0 {
		return 0
	}
	return v / float64(sb.jobs)
}

func (sb sideBreakdown) micros(d time.Duration) float64 {
	return sb.perJob(float64(d) / float64(time.Microsecond))
}

// serverPerJob is the server counter i per job: the least of the parts'
// figures, since whatever else the shared server does can only add to a
// server-wide counter.
func (sb sideBreakdown) serverPerJob(i int) float64 {
	best, seen := 0.0, false
	for _, p := range sb.parts {
		if p.jobs == 0 || i >= len(p.server) {
			continue
		}
		if v := p.perJob(p.server[i].value); !seen || v < best {
			best, seen = v, true
		}
	}
	if !seen && i < len(sb.server) {
		return sb.perJob(sb.server[i].value)
	}
	return best
}

// allCalls counts every call that reached the driver.
func (sb sideBreakdown) allCalls() int64 {
	return sb.calls.statements + sb.calls.tx + sb.calls.prepares + sb.callsOf("close", "")
}

// fnum prints a figure with about three significant digits.
func fnum(v float64) string {
	a := v
	if a < 0 {
		a = -a
	}
	switch {
	case v == 0:
		return "0"
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.3f", v)
}

func familyName(e engine) string {
	switch e.family {
	case "postgres":
		return "PostgreSQL"
	case "mysql":
		if strings.Contains(e.label, "MariaDB") {
			return "MariaDB"
		}
		return "MySQL"
	}
	return "SQLite"
}

// breakdownRows are the per-job figures of a line, by name.
func breakdownRows(l breakdownLine) (names []string, vals [][2]float64) {
	row := func(name string, f func(sb sideBreakdown) float64) {
		names = append(names, name)
		vals = append(vals, [2]float64{f(l.sides[0]), f(l.sides[1])})
	}
	w := float64(l.c.workers)
	row("wall µs (run time / jobs)", func(sb sideBreakdown) float64 { return sb.micros(sb.elapsed) })
	row("worker µs (wall × workers / jobs)", func(sb sideBreakdown) float64 { return w * sb.micros(sb.elapsed) })
	row("µs inside driver calls", func(sb sideBreakdown) float64 { return sb.micros(sb.driverTime()) })
	row("client CPU µs (user + sys)", func(sb sideBreakdown) float64 { return sb.micros(sb.cpu) })
	row("allocations", func(sb sideBreakdown) float64 { return sb.perJob(float64(sb.mallocs)) })
	row("driver calls, all", func(sb sideBreakdown) float64 { return sb.perJob(float64(sb.allCalls())) })
	row("statements", func(sb sideBreakdown) float64 { return sb.perJob(float64(sb.calls.statements)) })
	row("BEGIN", func(sb sideBreakdown) float64 { return sb.perJob(float64(sb.callsOf("tx", "BEGIN"))) })
	row("COMMIT + ROLLBACK", func(sb sideBreakdown) float64 {
		return sb.perJob(float64(sb.callsOf("tx", "COMMIT") + sb.callsOf("tx", "ROLLBACK")))
	})
	row("prepares", func(sb sideBreakdown) float64 { return sb.perJob(float64(sb.calls.prepares)) })
	row("prepared-statement closes", func(sb sideBreakdown) float64 { return sb.perJob(float64(sb.callsOf("close", ""))) })
	row("rounds that acknowledged nothing (no job or no free connection left)", func(sb sideBreakdown) float64 { return sb.perJob(float64(sb.empty)) })
	for i := range l.sides[0].server {
		row(l.sides[0].server[i].name, func(sb sideBreakdown) float64 { return sb.serverPerJob(i) })
	}
	return names, vals
}

func printBreakdown(out io.Writer, l breakdownLine) {
	c := l.c
	fmt.Fprintf(out, "#### %s, %s, %s, batch %d, %d workers, %d jobs a side\n\n", familyName(c.e), c.e.label, c.form, c.batch, c.workers, l.sides[0].jobs)
	fmt.Fprintf(out, "| per job | inbox | %s | inbox − %s |\n", sideNames[1], sideNames[1])
	fmt.Fprintln(out, "|---|--:|--:|--:|")
	names, vals := breakdownRows(l)
	for i, n := range names {
		fmt.Fprintf(out, "| %s | %s | %s | %s |\n", n, fnum(vals[i][0]), fnum(vals[i][1]), fnum(vals[i][0]-vals[i][1]))
	}
	fmt.Fprintln(out)
	fmt.Fprintln(out, "| side | driver call | calls/job | mean µs | µs/job |")
	fmt.Fprintln(out, "|---|---|--:|--:|--:|")
	for k, sb := range l.sides {
		for _, s := range stmtLines(k, sb.stmts) {
			mean := float64(s.spent) / float64(time.Microsecond) / float64(max(s.calls, 1))
			fmt.Fprintf(out, "| %s | %s | %s | %s | %s |\n", sideNames[k], s.label, fnum(sb.perJob(float64(s.calls))), fnum(mean), fnum(sb.micros(s.spent)))
		}
	}
	fmt.Fprintln(out)
	if len(l.sides[0].pgss)+len(l.sides[1].pgss) > 0 {
		fmt.Fprintln(out, "| side | statement (pg_stat_statements) | calls/job | server mean µs, execution | planning |")
		fmt.Fprintln(out, "|---|---|--:|--:|--:|")
		for k, sb := range l.sides {
			for _, p := range sb.pgss {
				fmt.Fprintf(out, "| %s | %s | %s | %s | %s |\n", sideNames[k], stmtLabel(p.query), fnum(sb.perJob(float64(p.calls))),
					fnum(1000*p.exec/float64(p.calls)), fnum(1000*p.plan/float64(p.calls)))
			}
		}
		fmt.Fprintln(out)
	}
}

// printBreakdownSummary prints a line per block, inbox / hand-written.
func printBreakdownSummary(out io.Writer, lines []breakdownLine) {
	if len(lines) == 0 {
		return
	}
	fmt.Fprintln(out, "#### Summary, per job, inbox / "+sideNames[1])
	fmt.Fprintln(out)
	fmt.Fprintln(out, "| engine | driver | form | batch | workers | wall µs | driver µs | CPU µs | allocations | driver calls | statements | server writes |")
	fmt.Fprintln(out, "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	for _, l := range lines {
		pair := func(f func(sb sideBreakdown) float64) string {
			return fnum(f(l.sides[0])) + " / " + fnum(f(l.sides[1]))
		}
		writes := "–"
		if len(l.sides[0].server) > 0 {
			writes = pair(func(sb sideBreakdown) float64 { return sb.serverPerJob(0) }) + " B"
		}
		fmt.Fprintf(out, "| %s | %s | %s | %d | %d | %s | %s | %s | %s | %s | %s | %s |\n",
			familyName(l.c.e), l.c.e.label, l.c.form, l.c.batch, l.c.workers,
			pair(func(sb sideBreakdown) float64 { return sb.micros(sb.elapsed) }),
			pair(func(sb sideBreakdown) float64 { return sb.micros(sb.driverTime()) }),
			pair(func(sb sideBreakdown) float64 { return sb.micros(sb.cpu) }),
			pair(func(sb sideBreakdown) float64 { return sb.perJob(float64(sb.mallocs)) }),
			pair(func(sb sideBreakdown) float64 { return sb.perJob(float64(sb.allCalls())) }),
			pair(func(sb sideBreakdown) float64 { return sb.perJob(float64(sb.calls.statements)) }),
			writes)
	}
	fmt.Fprintln(out)
}
