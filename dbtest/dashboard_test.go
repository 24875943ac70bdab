package dbtest

// The dashboard's reads on real databases (issue 23): a page reads every
// queue's Stats (TestExplainStats checks its plan), the row lock's lock view
// where there is one, and a page of dead jobs (Statements.Dead.List, or
// Dead.ListAfter and Dead.ListAfterNull for the next pages). With the index
// on (dead_at, id) that docs/schema.md recommends, the dead page is two
// reads of that index in order, the deaths and those with a NULL dead_at,
// each of at most a page, and a sort of what they returned: no full scan
// of the dead table.
//
// BenchmarkDashboardPage measures a whole page load (the handler's GET /,
// every read included) at 10,000 and 1,000,000 queue rows:
//
//	cd dbtest && go test -run '^$' -bench DashboardPage -benchtime 20x .

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/dashboard"
)

// dashShape is the queue of the dashboard's tests: of n rows, a tenth
// under a lease in force, a twentieth waiting a day, the rest ready; dead
// rows died one a minute before now, each with an error of 200 bytes.
func dashLoad(t testing.TB, e Engine, db *sql.DB, table string, n, dead int, now time.Time) {
	t.Helper()
	e.CreateTable(t, db, table)
	if !e.IsSQLite() {
		t.Cleanup(func() {
			db.Exec("DROP TABLE IF EXISTS " + table)
			db.Exec("DROP TABLE IF EXISTS " + table + "_dead")
			db.Exec("DROP TABLE IF EXISTS " + table + "_claims")
		})
	}
	addColumns(t, e, db, table, "last_error", "enqueued_at", "dead.last_error", "dead.dead_at")
	payload := []byte(strings.Repeat("p", 128))
	enq := opsTime(e, now.Add(-time.Hour))
	parts := []struct {
		n  int
		at time.Duration
	}{{n / 10, 30 * time.Second}, {n / 20, 24 * time.Hour}, {n - n/10 - n/20, 0}}
	for _, p := range parts {
		var at any
		if p.at != 0 {
			at = opsTime(e, now.Add(p.at))
		}
		var err error
		switch {
		case e.IsPostgres():
			_, err = db.Exec("INSERT INTO "+table+" (payload, locked_until, enqueued_at) SELECT $1::bytea, $2::timestamptz, $3::timestamptz FROM generate_series(1, $4)", payload, at, enq, p.n)
		case e.IsMySQL():
			_, err = db.Exec(fmt.Sprintf("INSERT INTO %s (payload, locked_until, enqueued_at) SELECT ?, ?, ? FROM seq_1_to_%d", table, p.n), payload, at, enq)
		default:
			_, err = db.Exec("INSERT INTO "+table+" (payload, locked_until, enqueued_at) WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < ?) SELECT ?, ?, ? FROM s", p.n, payload, at, enq)
		}
		if err != nil {
			t.Fatalf("%s: load: %v", e.Name, err)
		}
	}
	// The jobs in work were claimed, which counts the attempt: at attempt
	// 1 a lease in force is a job never claimed, waiting.
	mustExec(t, e, db, "UPDATE "+table+" SET attempt = 2 WHERE locked_until > ? AND locked_until <= ?", opsTime(e, now), opsTime(e, now.Add(time.Minute)))
	errText := strings.Repeat("e", 200)
	var err error
	switch {
	case e.IsPostgres():
		_, err = db.Exec("INSERT INTO "+table+"_dead (id, attempt, payload, last_error, dead_at) SELECT i, 25, $1::bytea, $2, $3::timestamptz - i * interval '1 minute' FROM generate_series(1, $4) AS i", payload, errText, now, dead)
	case e.IsMySQL():
		_, err = db.Exec(fmt.Sprintf("INSERT INTO %s_dead (id, attempt, payload, last_error, dead_at) SELECT seq, 25, ?, ?, DATE_SUB(?, INTERVAL seq MINUTE) FROM seq_1_to_%d", table, dead), payload, errText, opsTime(e, now))
	default:
		_, err = db.Exec("INSERT INTO "+table+"_dead (id, attempt, payload, last_error, dead_at) WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < ?) "+
			"SELECT n, 25, ?, ?, strftime('%Y-%m-%dT%H:%M:%S', julianday(?) - n / 1440.0) || '.000000Z' FROM s", dead, payload, errText, opsTime(e, now))
	}
	if err != nil {
		t.Fatalf("%s: load dead: %v", e.Name, err)
	}
	idx := func(name, def string) string {
		return "CREATE INDEX " + table + "_" + name + " ON " + table + " " + def
	}
	stmts := []string{"CREATE INDEX " + table + "_dead_at ON " + table + "_dead (dead_at, id)"}
	if e.IsPostgres() {
		stmts = append(stmts, idx("free", "(id) WHERE locked_until IS NULL"), idx("lu", "(locked_until)"), idx("free_age", "(enqueued_at) WHERE locked_until IS NULL"))
	} else {
		stmts = append(stmts, idx("claimable", "(locked_until, id)"), idx("age", "(locked_until, enqueued_at)"))
	}
	for _, s := range stmts {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	for _, tb := range []string{table, table + "_dead"} {
		explainAnalyze(t, e, db, tb)
	}
}

func dashConfig(e Engine, table string, now time.Time) inbox.Config {
	tb := Table(table, "lease")
	tb.LastError, tb.EnqueuedAt, tb.DeadAt = "last_error", "enqueued_at", "dead_at"
	cfg := inbox.Config{Dialect: e.Dialect, Table: tb, Lease: time.Minute}
	if e.IsSQLite() {
		cfg.Now = func() time.Time { return now }
	}
	return cfg
}

// dashEngines are the engines the dashboard's reads are measured on: one
// driver per engine family (the statements do not depend on the driver).
func dashEngines(t *testing.T, fn func(t *testing.T, e Engine)) {
	for _, e := range Engines {
		if e.Name != "pq" && e.Name != "mariadb" && e.Name != "mattn" {
			continue
		}
		t.Run(e.Name, func(t *testing.T) { fn(t, e) })
	}
}

// TestExplainDashboard (issue 23): with the index on (dead_at, id), the
// dead jobs' first page and the next read that index in order, at most a
// page from the deaths and a page from the NULL dead_at rows, sorted
// together, and the page past a NULL one reads a page of them, unsorted: no
// full scan of the dead table. The page the handler serves shows the
// table's counts.
func TestExplainDashboard(t *testing.T) {
	dashEngines(t, func(t *testing.T, e Engine) {
		dsn := e.DSN(t, t.TempDir())
		if e.IsMySQL() {
			dsn += "&interpolateParams=true"
		}
		db := e.OpenDSN(t, dsn, 4)
		table := "explain_dash_" + e.Name
		now := time.Now().UTC().Truncate(time.Second)
		dashLoad(t, e, db, table, 20000, 20000, now)
		dead := table + "_dead"
		// Ids 20001 to 30000 died before dead_at was added: NULL, listed
		// after the others, each page of them one more seek of the index.
		mustExec(t, e, db, "INSERT INTO "+dead+" (id, attempt, payload, last_error) SELECT id + 20000, attempt, payload, last_error FROM "+dead+" WHERE id <= 10000")
		explainAnalyze(t, e, db, dead)
		q, err := inbox.New(db, dashConfig(e, table, now))
		if err != nil {
			t.Fatal(err)
		}
		if err := q.CheckSchema(context.Background()); err != nil {
			t.Fatal(err)
		}
		for _, st := range []struct {
			name string
			s    dialect.Stmt
			id   int
		}{{"Dead.List", q.Statements().Dead.List, 0}, {"Dead.ListAfter", q.Statements().Dead.ListAfter, 10000}, {"Dead.ListAfterNull", q.Statements().Dead.ListAfterNull, 25000}} {
			var args []any
			for _, a := range st.s.Args {
				switch a {
				case dialect.ArgLimit:
					args = append(args, 20)
				case dialect.ArgID:
					args = append(args, st.id)
				case dialect.ArgNotBefore:
					args = append(args, opsTime(e, now.Add(-10000*time.Minute)))
				default:
					t.Fatalf("%s: argument %v", st.name, a)
				}
			}
			var text string
			// A page of the union is two reads of the index, each of at
			// most a page, then one sort of what they returned; the page
			// past a NULL dead_at one read and no sort.
			sorts, branches := 1, 2
			if st.name == "Dead.ListAfterNull" {
				sorts, branches = 0, 1
			}
			switch {
			case e.IsMySQL():
				// ANALYZE's JSON names a sort as a "filesort" node over
				// the table it sorts.
				var js string
				if err := db.QueryRow("ANALYZE FORMAT=JSON "+st.s.SQL, args...).Scan(&js); err != nil {
					t.Fatal(err)
				}
				text = js
				var v any
				if err := json.Unmarshal([]byte(js), &v); err != nil {
					t.Fatal(err)
				}
				if sorted := sortedTables(v); len(sorted) != sorts || sorts == 1 && !strings.HasPrefix(sorted[0], "<derived") {
					t.Errorf("%s: sorts %v, want %d of the union's rows:\n%s", st.name, sorted, sorts, js)
				}
				rs := reads(planNodes(v, false), dead)
				if len(rs) != branches {
					t.Errorf("%s: %d reads of %s, want %d:\n%s", st.name, len(rs), dead, branches, js)
				}
				for i, r := range rs {
					if r.Op != "range" && r.Op != "ref" || r.Index != dead+"_at" {
						t.Errorf("%s: read %d of %s is %s on %q, not a seek of %s_at:\n%s", st.name, i, dead, r.Op, r.Index, dead, js)
					}
					// The next page seeks its two ranges (dead_at before
					// the last one listed, and its ties past its id):
					// MariaDB counts the row that ends the second range,
					// 21 rows for a page of 20 where the row-value
					// comparison it cannot seek read 10,500 at this depth.
					if r.Rows < 1 || r.Rows > 21 {
						t.Errorf("%s: read %d of %s read %v rows for a page of 20 at depth 10,000", st.name, i, dead, r.Rows)
					}
				}
				if st.name == "Dead.ListAfter" && (len(rs) == 0 || rs[0].Op != "range") {
					t.Errorf("%s: not a range of %s_at:\n%s", st.name, dead, js)
				}
			default:
				plan := explainPlan(t, e, db, true, st.s.SQL, args...)
				text = planText(plan)
				bad, sort := []string{"Seq Scan on " + dead + " "}, "Sort on"
				good := []string{dead + "_at"}
				if e.IsSQLite() {
					bad, sort = []string{"SCAN " + dead + " on"}, "TEMP B-TREE"
				}
				explainMust(t, st.name, plan, good, bad)
				if n := strings.Count(text, sort); n != sorts {
					t.Errorf("%s: %d sorts, want %d of the union's rows:\n%s", st.name, n, sorts, text)
				}
				for _, r := range reads(plan, dead) {
					if r.Rows > 20 {
						t.Errorf("%s: %s read %v rows for a page of 20:\n%s", st.name, r.Index, r.Rows, text)
					}
				}
			}
			t.Logf("%s:\n%s", st.name, text)
		}

		h, err := dashboard.New(dashboard.Config{Queues: []dashboard.QueueConfig{{Name: "jobs", Queue: q}}, Now: func() time.Time { return now }})
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		body := rec.Body.String()
		for _, want := range []string{
			`<td class="n ready-count">17000</td>`, `<td class="n waiting-count">1000</td>`,
			`<td class="n inwork-count">2000</td>`, `<td class="n dead-count">30000</td>`,
			`<tr data-id="1">`, `<tr data-id="20">`, `id="older"`,
		} {
			if !strings.Contains(body, want) {
				t.Errorf("the page (status %d) lacks %s", rec.Code, want)
			}
		}
		if strings.Contains(body, `<tr data-id="21">`) {
			t.Errorf("the page lists more than its 20 dead jobs")
		}
	})
}

// BenchmarkDashboardPage measures the handler's GET / (every queue's Stats
// and a page of dead jobs, rendered) at 10,000 and 1,000,000 queue rows
// with as many dead rows as a tenth of them.
func BenchmarkDashboardPage(b *testing.B) {
	for _, e := range Engines {
		if e.Name != "pq" && e.Name != "mariadb" && e.Name != "mattn" {
			continue
		}
		for _, n := range []int{10000, 1000000} {
			b.Run(fmt.Sprintf("%s/%d", e.Name, n), func(b *testing.B) {
				db := e.OpenDSN(b, e.DSN(b, b.TempDir()), 4)
				table := fmt.Sprintf("bench_dash_%s_%d", e.Name, n)
				now := time.Now().UTC().Truncate(time.Second)
				dashLoad(b, e, db, table, n, n/10, now)
				q, err := inbox.New(db, dashConfig(e, table, now))
				if err != nil {
					b.Fatal(err)
				}
				h, err := dashboard.New(dashboard.Config{Queues: []dashboard.QueueConfig{{Name: "jobs", Queue: q}}})
				if err != nil {
					b.Fatal(err)
				}
				srv := httptest.NewServer(h)
				defer srv.Close()
				get := func() {
					resp, err := http.Get(srv.URL + "/")
					if err != nil {
						b.Fatal(err)
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						b.Fatalf("GET / = %d", resp.StatusCode)
					}
				}
				get() // warm the pool and the caches
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					get()
				}
			})
		}
	}
}

// sortedTables are the tables that the sorts of MariaDB's ANALYZE FORMAT=JSON
// read: the table each "filesort" node holds.
func sortedTables(x any) []string {
	var out []string
	switch n := x.(type) {
	case []any:
		for _, c := range n {
			out = append(out, sortedTables(c)...)
		}
	case map[string]any:
		for k, c := range n {
			if k == "filesort" {
				if fs, ok := c.(map[string]any); ok {
					tb, _ := fs["table"].(map[string]any)
					name, _ := tb["table_name"].(string)
					out = append(out, name)
				}
			}
			out = append(out, sortedTables(c)...)
		}
	}
	return out
}
