package main

// Claim cost with depth: one worker claiming and acknowledging one job at a
// time from a table with 10,000 pending jobs, with 1,000,000, and with a
// head of 100,000 jobs leased into the future (the lowest ids) before
// 10,000 pending ones. Two claims are compared on each, on the primary key
// alone and with the recommended indexes: inbox's lease claim, which reads
// the free jobs and the expired ones in two ordered, limited branches, and
// the old single-condition claim ("lease NULL or over", hand-written here)
// it replaced, which steps over a leased head row by row.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
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
			tx, err := p.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
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

// runDepth loads one table per case, then measures each claim on every
// case in several interleaved passes, so that a change of load on the
// shared machine falls on all cases alike; the figure is the median.
func runDepth(ctx context.Context, out, log io.Writer, es []engine, deep, rounds int, dir string) error {
	cases := []depthCase{
		{"10k pending", 0, 10000},
		{fmt.Sprintf("%dk pending", deep/1000), 0, deep},
		{"100k leased head + 10k pending", 100000, 10000},
	}
	const passes = 6
	fmt.Fprintf(out, "\nClaim + ack of one job by one worker: median per job over about %d rounds in %d interleaved passes; ratio to the 10k case of the same line.\n\n", rounds, passes)
	fmt.Fprintf(out, "| engine | claim | indexes | %s | %s | %s |\n|---|---|---|---:|---:|---:|\n", cases[0].name, cases[1].name, cases[2].name)
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
	return nil
}

func depthEngine(ctx context.Context, out, log io.Writer, e engine, cases []depthCase, passes, rounds int, dir string) error {
	db, err := e.open(dir, 4)
	if err != nil {
		return err
	}
	defer db.Close()
	tables := make([]string, len(cases))
	for i, c := range cases {
		tables[i] = fmt.Sprintf("bench_depth_%s_%d", e.name, i)
		fmt.Fprintf(log, "depth %s: loading %s\n", e.name, c.name)
		if err := e.createTable(ctx, db, tables[i]); err != nil {
			return err
		}
		defer e.drop(context.WithoutCancel(ctx), db, tables[i])
		if err := e.fillUntil(ctx, db, tables[i], c.leased, payload, time.Now().Add(24*time.Hour)); err != nil {
			return err
		}
		if err := e.fill(ctx, db, tables[i], c.pending, payload); err != nil {
			return err
		}
		analyze(ctx, e, db, tables[i])
	}
	idx := strings.Join(indexNames(depthIndexes(e, "t")), " + ")
	lines := []struct{ claim, idx, v string }{
		{"old single-condition", "primary key", "old"},
		{"old single-condition", idx, "old+idx"},
		{"inbox's", "primary key", "inbox"},
		{"inbox's", idx, "inbox+idx"},
	}
	samples := map[string][][]time.Duration{}
	for _, group := range [][]string{{"old", "inbox"}, {"inbox+idx", "old+idx"}} {
		if group[0] == "inbox+idx" {
			for _, t := range tables {
				for _, s := range depthIndexes(e, t) {
					if _, err := db.ExecContext(ctx, s); err != nil {
						return fmt.Errorf("%s: %w", s, err)
					}
				}
				analyze(ctx, e, db, t)
			}
		}
		for pass := 0; pass < passes; pass++ {
			for _, v := range group {
				if samples[v] == nil {
					samples[v] = make([][]time.Duration, len(cases))
				}
				for i := range cases {
					var s side = newOldSide(e, db, tables[i])
					if strings.HasPrefix(v, "inbox") {
						if s, err = newInboxSide(e, db, tables[i], "lease", 1); err != nil {
							return err
						}
					}
					samples[v][i], err = sample(ctx, s, rounds/passes, 3*time.Second/time.Duration(passes), samples[v][i])
					s.close()
					if err != nil {
						return fmt.Errorf("depth %s %s %s: %w", e.name, cases[i].name, v, err)
					}
				}
			}
		}
	}
	for _, l := range lines {
		cells := make([]string, len(cases))
		base := median(samples[l.v][0])
		for i := range cases {
			m := median(samples[l.v][i])
			cells[i] = fmt.Sprintf("%.0f µs", float64(m)/1e3)
			if i > 0 {
				cells[i] += fmt.Sprintf(" (%.2f×)", float64(m)/float64(base))
			}
		}
		fmt.Fprintf(out, "| %s | %s | %s | %s | %s | %s |\n", e.family, l.claim, l.idx, cells[0], cells[1], cells[2])
	}
	return nil
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
