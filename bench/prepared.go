package main

// Plain statements against statements prepared once: inbox's own lease
// statements (Queue.Statements), run by hand for one job at a time by one
// worker, either passed as text to database/sql on every call (what inbox
// does) or prepared once with DB.PrepareContext and reused (inside the
// MySQL claim's transaction through Tx.StmtContext, which reuses the
// statement where the connection has it). MySQL is also run with
// interpolateParams=true, where the driver sends each statement with its
// values in one round trip instead of preparing and closing it.

import (
	"context"
	"database/sql"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"io"
	"strings"
	"time"

	"github.com/sqlinbox/inbox"
)

// stmtSide runs inbox's lease claim and ack SQL for one job.
type stmtSide struct {
	e       engine
	db      *sql.DB
	st      *inbox.Statements
	lease   time.Duration
	prep    map[string]*sql.Stmt // nil: plain statements
	dialect inbox.Dialect
}

func newStmtSide(ctx context.Context, e engine, db *sql.DB, table string, prepared bool) (*stmtSide, error) {
	q, err := inbox.New(db, inbox.Config{Dialect: e.dialect, Table: benchTable(table, "lease")})
	if err != nil {
		return nil, err
	}
	s := &stmtSide{e: e, db: db, st: q.Statements(), lease: q.Lease(), dialect: e.dialect}
	if prepared {
		s.prep = map[string]*sql.Stmt{}
		for _, st := range []dialect.Stmt{s.st.Now, s.st.Claim.Take, s.st.Claim.Select, s.st.Claim.Mark, s.st.Settle.Ack} {
			if st.SQL == "" {
				continue
			}
			p, err := db.PrepareContext(ctx, st.SQL)
			if err != nil {
				return nil, err
			}
			s.prep[st.SQL] = p
		}
	}
	return s, nil
}

type execer interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}

// query runs st through ex, or its prepared statement (bound to tx when
// there is one).
func (s *stmtSide) query(ctx context.Context, ex execer, tx *sql.Tx, st dialect.Stmt, args []any) (*sql.Rows, error) {
	if p := s.prep[st.SQL]; p != nil {
		if tx != nil {
			p = tx.StmtContext(ctx, p)
		}
		return p.QueryContext(ctx, args...)
	}
	return ex.QueryContext(ctx, st.SQL, args...)
}

func (s *stmtSide) exec(ctx context.Context, ex execer, tx *sql.Tx, st dialect.Stmt, args []any) (sql.Result, error) {
	if p := s.prep[st.SQL]; p != nil {
		if tx != nil {
			p = tx.StmtContext(ctx, p)
		}
		return p.ExecContext(ctx, args...)
	}
	return ex.ExecContext(ctx, st.SQL, args...)
}

// args fills st's parameters as inbox would.
func (s *stmtSide) args(st dialect.Stmt, id any, stored int64, expiry, now time.Time) []any {
	out := make([]any, len(st.Args))
	for i, a := range st.Args {
		switch a {
		case dialect.ArgID:
			out[i] = id
		case dialect.ArgAttempt:
			out[i] = stored
		case dialect.ArgExpiry:
			out[i] = s.dialect.TimeArg(expiry)
		case dialect.ArgNow:
			out[i] = s.dialect.TimeArg(now)
		case dialect.ArgUntil:
			out[i] = s.dialect.TimeArg(now.Add(s.lease))
		case dialect.ArgMicros:
			out[i] = s.lease.Microseconds()
		case dialect.ArgLimit:
			out[i] = 1
		}
	}
	return out
}

func (s *stmtSide) round(ctx context.Context) (int, error) {
	var id any
	var stored int64
	var expiry time.Time
	found := false
	if s.st.Claim.Take.SQL != "" {
		now := time.Now().UTC().Truncate(time.Microsecond)
		rows, err := s.query(ctx, s.db, nil, s.st.Claim.Take, s.args(s.st.Claim.Take, nil, 0, time.Time{}, now))
		if err != nil {
			return 0, err
		}
		for rows.Next() {
			var raw any
			var p []byte
			if err := rows.Scan(&id, &stored, &raw, &p); err != nil {
				rows.Close()
				return 0, err
			}
			if expiry, err = s.dialect.ScanTime(raw); err != nil {
				rows.Close()
				return 0, err
			}
			stored++
			found = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return 0, err
		}
	} else {
		tx, err := s.db.BeginTx(ctx, handTx())
		if err != nil {
			return 0, err
		}
		err = func() error {
			var raw any
			rows, err := s.query(ctx, tx, tx, s.st.Now, nil)
			if err != nil {
				return err
			}
			for rows.Next() {
				err = rows.Scan(&raw)
			}
			rows.Close()
			if err != nil {
				return err
			}
			now, err := s.dialect.ScanTime(raw)
			if err != nil {
				return err
			}
			rows, err = s.query(ctx, tx, tx, s.st.Claim.Select, s.args(s.st.Claim.Select, nil, 0, time.Time{}, now))
			if err != nil {
				return err
			}
			for rows.Next() {
				var p []byte
				if err := rows.Scan(&id, &stored, &p); err != nil {
					rows.Close()
					return err
				}
				stored++
				found = true
			}
			rows.Close()
			if !found {
				return rows.Err()
			}
			expiry = now.Add(s.lease)
			if _, err := s.exec(ctx, tx, tx, s.st.Claim.Mark, s.args(s.st.Claim.Mark, id, 0, time.Time{}, now)); err != nil {
				return err
			}
			return tx.Commit()
		}()
		if err != nil {
			tx.Rollback()
			return 0, err
		}
	}
	if !found {
		return 0, nil
	}
	res, err := s.exec(ctx, s.db, nil, s.st.Settle.Ack, s.args(s.st.Settle.Ack, id, stored, expiry, time.Time{}))
	if err != nil {
		return 0, err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return 0, fmt.Errorf("ack of job %v deleted %d rows", id, n)
	}
	return 1, nil
}

func (s *stmtSide) close() {
	for _, p := range s.prep {
		p.Close()
	}
}

func runPrepared(ctx context.Context, out, log io.Writer, es []engine, rounds int, dir string) error {
	const passes = 6
	fmt.Fprintf(out, "\nLease claim + ack of one job by one worker with inbox's statements: median per job over about %d rounds in %d interleaved passes.\n\n", rounds, passes)
	fmt.Fprintln(out, "| engine | driver | plain | prepared once | prepared / plain |")
	fmt.Fprintln(out, "|---|---|---:|---:|---:|")
	for _, e := range es {
		modes := []struct {
			label    string
			dsn      string
			prepared bool
		}{{label: e.label, dsn: e.dsn(dir)}, {label: e.label, dsn: e.dsn(dir), prepared: true}}
		if e.family == "mysql" {
			sep := "?"
			if strings.Contains(modes[0].dsn, "?") {
				sep = "&"
			}
			modes = append(modes, struct {
				label    string
				dsn      string
				prepared bool
			}{label: e.label + " interpolateParams", dsn: modes[0].dsn + sep + "interpolateParams=true"})
		}
		table := "bench_prep_" + e.name
		var sides []side
		for i, m := range modes {
			db, err := e.openDSN(m.dsn, 3)
			if err != nil {
				return err
			}
			defer db.Close()
			if i == 0 {
				if err := e.createTable(ctx, db, table); err != nil {
					return err
				}
				defer e.drop(context.WithoutCancel(ctx), db, table)
				if err := e.fill(ctx, db, table, 3*rounds*len(modes)+100, payload); err != nil {
					return err
				}
			}
			s, err := newStmtSide(ctx, e, db, table, m.prepared)
			if err != nil {
				return err
			}
			defer s.close()
			sides = append(sides, s)
		}
		samples := make([][]time.Duration, len(sides))
		for pass := 0; pass < passes; pass++ {
			for i, s := range sides {
				var err error
				if samples[i], err = sample(ctx, s, rounds/passes, 5*time.Second/passes, samples[i]); err != nil {
					return fmt.Errorf("prepared %s mode %d: %w", e.name, i, err)
				}
			}
		}
		plain := median(samples[0])
		prep := median(samples[1])
		fmt.Fprintf(out, "| %s | %s | %.0f µs | %.0f µs | %.2f |\n", e.family, e.label, float64(plain)/1e3, float64(prep)/1e3, float64(prep)/float64(plain))
		if len(sides) > 2 {
			ip := median(samples[2])
			fmt.Fprintf(out, "| %s | %s | %.0f µs | | %.2f (interpolated / plain) |\n", e.family, modes[2].label, float64(ip)/1e3, float64(ip)/float64(plain))
		}
		fmt.Fprintf(log, "prepared %s done\n", e.name)
	}
	return nil
}
