// Package pgbouncer runs the queue through PgBouncer in transaction pooling,
// the most common PostgreSQL deployment, on a PgBouncer of its own
// (bouncer_test.go) in front of the server of INBOX_POSTGRES_DSN: the lease
// and the row lock drained by worker loops over a lib/pq pool and a pgx pool
// while enqueuers fill them, every job delivered once and acknowledged; and
// CheckSchema refusing the advisory form and Config.Prepare there, on both
// drivers, while it passes them on a direct connection and through session
// pooling. It also measures which settings of pgx and lib/pq work through
// transaction pooling, and shows that a LISTEN there gets no notification,
// which is why the listeners need a session.
//
// It runs only when asked, INBOX_CLUSTER_SUITES=1 (CI sets it; see
// internal/optin), and needs INBOX_POSTGRES_DSN (trust authentication, as
// CI's server) and the pgbouncer program (Debian's package; INBOX_PGBOUNCER
// names another). Without either it skips, saying so, and fails under
// INBOX_REQUIRE_DBS=1. Run (from the repository root):
//
//	INBOX_CLUSTER_SUITES=1 INBOX_REQUIRE_DBS=1 INBOX_POSTGRES_DSN=postgres://postgres@127.0.0.1:5432/inbox_test?sslmode=disable \
//		go test -count=1 -v ./dbtest/pgbouncer/
//
// Size: INBOX_PGBOUNCER_JOBS jobs per form (default pgbDefaultJobs).
package pgbouncer

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/dbtest/internal/cluster"
	"github.com/sqlinbox/inbox/internal/optin"
	"github.com/sqlinbox/inbox/worker"
)

// TestMain runs the suite and checks that a passing run left no goroutine
// running (worker loops, keepers, the drivers' watchers), and says at the
// end that the suite skipped, and why, when it did (cluster.Suite.Run).
func TestMain(m *testing.M) {
	os.Exit(suite.Run(m))
}

// pgbDefaultJobs is each form's jobs unless INBOX_PGBOUNCER_JOBS says
// otherwise: enough that every loop claims many times and the pool's four
// server connections are handed around thousands of times, few enough for
// CI's two cores under -race.
const pgbDefaultJobs = 1000

// drainWait bounds a drain: a deadline for a failure, generous for a loaded
// machine.
const drainWait = 2 * time.Minute

func pgbJobs(t *testing.T) int {
	v := os.Getenv("INBOX_PGBOUNCER_JOBS")
	if v == "" {
		return pgbDefaultJobs
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 16 {
		t.Fatalf("INBOX_PGBOUNCER_JOBS=%q: want a number of at least 16", v)
	}
	return n
}

// TestPgBouncer starts PgBouncer and runs the checks through it.
func TestPgBouncer(t *testing.T) {
	optin.Require(t, "the PgBouncer suite (a PgBouncer of its own in front of INBOX_POSTGRES_DSN's server)")
	dsn := optin.DSN(t, "INBOX_POSTGRES_DSN", "the PgBouncer suite")
	bin, err := findPgBouncer()
	suite.Require(t, err)
	backend, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("INBOX_POSTGRES_DSN: %v", err)
	}
	b := startBouncer(t, bin, backend)
	t.Logf("%s on 127.0.0.1:%d in front of %s:%d/%s: %s in transaction pooling (pool_size %d), %s in session pooling",
		b.version, b.port, backend.Host, backend.Port, backend.Database, txDB, poolSize, sessionDB)
	h := &harness{b: b, direct: dsn, suffix: strconv.Itoa(os.Getpid())}
	t.Run("CheckSchema", h.testCheckSchema)
	t.Run("DriverModes", h.testDriverModes)
	t.Run("Listen", h.testListen)
	t.Run("Drain", h.testDrain)
}

// harness is what the subtests share.
type harness struct {
	b      *bouncer
	direct string // INBOX_POSTGRES_DSN
	suffix string // of the tables' names: this process's
}

// Through transaction pooling (PgBouncer before 1.21) each statement must
// reach the server in one transaction of the pooler: pgx's default
// (cache_statement) prepares named statements, and lib/pq's default
// prepares the unnamed statement in a round trip of its own, which the next
// transaction may not find (DriverModes shows which settings work).
const pqTx = "&binary_parameters=yes"

func pgxMode(mode string) string { return "&default_query_exec_mode=" + mode }

// open opens a pool, closed at t's end.
func open(t testing.TB, driver, dsn string, conns int) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	t.Cleanup(func() { db.Close() })
	return db
}

// createQueue (re)creates a table serving every form (the columns of
// schema/postgres-*.sql together) and its dead table, directly on the
// server, and drops both at t's end.
func (h *harness) createQueue(t testing.TB, table string) {
	t.Helper()
	db := open(t, "postgres", h.direct, 1)
	for _, s := range []string{
		"DROP TABLE IF EXISTS " + table + ", " + table + "_dead, " + table + "_effects",
		"CREATE TABLE " + table + " (id bigserial PRIMARY KEY, attempt integer NOT NULL DEFAULT 1, locked_until timestamptz, " +
			"payload bytea NOT NULL, not_before timestamptz)",
		"CREATE INDEX " + table + "_free ON " + table + " (id) WHERE locked_until IS NULL",
		"CREATE INDEX " + table + "_lu ON " + table + " (locked_until)",
		"CREATE INDEX " + table + "_ready ON " + table + " (not_before, id)",
		"CREATE TABLE " + table + "_dead (id bigint PRIMARY KEY, attempt integer NOT NULL, payload bytea NOT NULL)",
		// One row per committed row-lock handler, written through the
		// claim's transaction (Delivery.Tx): a second commit of one job's
		// effect fails on the key.
		"CREATE TABLE " + table + "_effects (payload bytea PRIMARY KEY)",
	} {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	t.Cleanup(func() {
		db, err := sql.Open("postgres", h.direct)
		if err != nil {
			return
		}
		defer db.Close()
		_, _ = db.Exec("DROP TABLE IF EXISTS " + table + ", " + table + "_dead, " + table + "_effects")
	})
}

// queueConfig describes table under form.
func queueConfig(table, form string, prepare bool) inbox.Config {
	return inbox.Config{Dialect: inbox.Postgres, Table: cluster.FormTable(table, form), Prepare: prepare}
}

// route is one way to the server: a driver and a data source.
type route struct {
	name, driver, dsn string
	pooled            bool // transaction pooling
}

func (h *harness) routes() []route {
	return []route{
		{"pq/transaction", "postgres", h.b.dsn(txDB) + pqTx, true},
		{"pgx/transaction", "pgx", h.b.dsn(txDB) + pgxMode("exec"), true},
		{"pq/session", "postgres", h.b.dsn(sessionDB), false},
		{"pgx/session", "pgx", h.b.dsn(sessionDB) + pgxMode("exec"), false},
		{"pq/direct", "postgres", h.direct, false},
		{"pgx/direct", "pgx", withParam(h.direct, "default_query_exec_mode", "exec"), false},
	}
}

// withParam adds a parameter to a data source, a URL or key=value pairs.
func withParam(dsn, k, v string) string {
	if !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") {
		return dsn + " " + k + "=" + v
	}
	if strings.Contains(dsn, "?") {
		return dsn + "&" + k + "=" + v
	}
	return dsn + "?" + k + "=" + v
}

// checkRuns is how many times each refusal is asked for, each on a fresh
// pool: the check must refuse every time, not once in a while.
const checkRuns = 10

// testCheckSchema: through transaction pooling CheckSchema passes the lease
// and the row lock and refuses the advisory form and Config.Prepare, every
// time, on both drivers, naming the fix; directly and through session
// pooling it passes all of them. Pools of two connections, the least a
// held form runs on.
func (h *harness) testCheckSchema(t *testing.T) {
	table := "pgb_check_" + h.suffix
	h.createQueue(t, table)
	ctx := context.Background()
	type ask struct {
		form    string
		prepare bool
		words   []string // what the one problem names; none: passes
	}
	refused := map[string][2]int{} // ask → refused, asked (transaction pooling)
	for _, r := range h.routes() {
		t.Run(r.name, func(t *testing.T) {
			for _, a := range []ask{
				{"lease", false, nil},
				{"rowlock", false, nil},
				{"advisory", false, []string{"do not each keep one server session", "transaction pooler", "pool_mode = session", "lease form", "row lock"}},
				// The statement is gone (26000) from the server connection
				// the next transaction runs on, or one of its name is
				// there already (42P05), left by an earlier run's client.
				{"lease", true, []string{"Config.Prepare", "failed when it ran again", "prepared statement", "set Config.Prepare to false", "max_prepared_statements"}},
				{"rowlock", true, []string{"Config.Prepare", "prepared statement"}},
			} {
				name := a.form
				if a.prepare {
					name += "+Prepare"
				}
				runs := 1
				if r.pooled && a.words != nil {
					runs = checkRuns
				}
				for i := 0; i < runs; i++ {
					db := open(t, r.driver, r.dsn, 2)
					q, err := inbox.New(db, queueConfig(table, a.form, a.prepare))
					if err != nil {
						t.Fatal(err)
					}
					err = q.CheckSchema(ctx)
					q.Close()
					db.Close()
					if !r.pooled || a.words == nil {
						if err != nil {
							t.Errorf("%s: CheckSchema = %v, want nil", name, err)
						}
						continue
					}
					var se *inbox.SchemaError
					if !errors.As(err, &se) || len(se.Problems) != 1 {
						t.Errorf("%s, run %d: CheckSchema = %v, want one problem", name, i+1, err)
						continue
					}
					for _, w := range a.words {
						if !strings.Contains(se.Problems[0], w) {
							t.Errorf("%s: the problem does not name %q: %s", name, w, se.Problems[0])
						}
					}
					if a.prepare && !strings.Contains(se.Problems[0], "26000") && !strings.Contains(se.Problems[0], "42P05") {
						t.Errorf("%s: the problem names neither 26000 nor 42P05: %s", name, se.Problems[0])
					}
					c := refused[r.name+" "+name]
					c[0]++
					refused[r.name+" "+name] = c
					if i == 0 {
						t.Logf("%s refused: %s", name, se.Problems[0])
					}
				}
				if r.pooled && a.words != nil {
					c := refused[r.name+" "+name]
					t.Logf("FIGURE: pgbouncer check: %s %s refused in %d of %d runs", r.name, name, c[0], runs)
				}
			}
		})
	}
}

// testDriverModes runs each driver setting through transaction pooling:
// four connections at once, each sending a parameterised statement of five
// texts 25 times, as a pool of workers would, and checking each answer.
// The settings that send each statement in one transaction of the pooler
// (pgx's exec and simple_protocol, lib/pq's binary_parameters=yes) or
// prepare only the unnamed statement in the same round trip as its run
// (pgx's cache_describe) must not fail. Those that prepare a named
// statement (pgx's cache_statement, its default) or prepare the unnamed one
// in a round trip of its own (pgx's describe_exec; lib/pq's default, whose
// Bind may then find another client's statement on the server connection,
// refused when the parameters differ in number and run otherwise) fail
// when the next transaction runs on another server connection, which the
// figures count: how often depends on the pooler's hand-out, so it is not
// asserted.
func (h *harness) testDriverModes(t *testing.T) {
	ctx := context.Background()
	for _, m := range []struct {
		driver, param string
		works         bool
	}{
		{"pgx", "default_query_exec_mode=cache_statement", false},
		{"pgx", "default_query_exec_mode=describe_exec", false},
		{"pgx", "default_query_exec_mode=cache_describe", true},
		{"pgx", "default_query_exec_mode=exec", true},
		{"pgx", "default_query_exec_mode=simple_protocol", true},
		{"postgres", "binary_parameters=no", false},
		{"postgres", "binary_parameters=yes", true},
	} {
		db := open(t, m.driver, h.b.dsn(txDB)+"&"+m.param, 4)
		var (
			wg     sync.WaitGroup
			failed atomic.Int64
			first  atomic.Value
		)
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				for i := 0; i < 25; i++ {
					var got int64
					// Statements of one and of two parameters, so that a
					// Bind meeting another client's statement is refused
					// as often as it runs it.
					q, args, want := fmt.Sprintf("SELECT $1::int + %d", i%5), []any{g}, int64(g+i%5)
					if i%2 == 1 {
						q, args, want = fmt.Sprintf("SELECT $1::int * $2::int + %d", i%5), []any{g, 10}, int64(10*g+i%5)
					}
					err := db.QueryRowContext(ctx, q, args...).Scan(&got)
					if err == nil && got != want {
						err = fmt.Errorf("%s answered %d, want %d", q, got, want)
					}
					if err != nil {
						failed.Add(1)
						first.CompareAndSwap(nil, err.Error())
					}
				}
			}(g)
		}
		wg.Wait()
		db.Close()
		msg, _ := first.Load().(string)
		t.Logf("FIGURE: pgbouncer %s %s: %d of 100 statements failed %s", m.driver, m.param, failed.Load(), msg)
		if m.works && failed.Load() > 0 {
			t.Errorf("%s %s through transaction pooling: %d of 100 statements failed, first: %s", m.driver, m.param, failed.Load(), msg)
		}
	}
}

// testListen shows why the listeners (pgxlisten, pqlisten) need a session,
// which CheckSchema cannot see (a listener connects with a DSN of its own):
// a LISTEN through transaction pooling registers on the server connection
// that ran it, which goes back to the pool, and PgBouncer drops a
// notification arriving there while no client holds it. Nothing else runs
// through the PgBouncer meanwhile, so the connection is idle when the
// notification arrives; PgBouncer logs the drop, and a statement sent after
// that would carry any notification that had reached the client. Through
// session pooling the same notification arrives.
func (h *harness) testListen(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	channel := "inbox_pgb_" + h.suffix
	notify := open(t, "postgres", h.direct, 1)
	const dropped = "got packet 'A' from server when not linked"
	for _, db := range []string{txDB, sessionDB} {
		var got atomic.Int64
		cfg, err := pgconn.ParseConfig(h.b.dsn(db))
		if err != nil {
			t.Fatal(err)
		}
		cfg.OnNotification = func(*pgconn.PgConn, *pgconn.Notification) { got.Add(1) }
		l, err := pgconn.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close(context.Background())
		if _, err := l.Exec(ctx, "LISTEN "+channel).ReadAll(); err != nil {
			t.Fatal(err)
		}
		before := strings.Count(h.b.log(), dropped)
		if _, err := notify.ExecContext(ctx, "SELECT pg_notify($1, 'wake')", channel); err != nil {
			t.Fatal(err)
		}
		if db == sessionDB {
			if err := l.WaitForNotification(ctx); err != nil {
				t.Fatalf("through session pooling: no notification: %v", err)
			}
			t.Logf("through session pooling: the notification arrived")
			continue
		}
		tick := time.NewTicker(10 * time.Millisecond)
		for strings.Count(h.b.log(), dropped) == before && ctx.Err() == nil {
			select {
			case <-tick.C:
			case <-ctx.Done():
			}
		}
		tick.Stop()
		if ctx.Err() != nil {
			t.Fatalf("through transaction pooling: PgBouncer's log does not say %q within a minute of the notification", dropped)
		}
		if _, err := l.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
			t.Fatal(err)
		}
		if got.Load() != 0 {
			t.Errorf("through transaction pooling: the listener got %d notifications, want none (PgBouncer logged a drop)", got.Load())
		}
		t.Logf("FIGURE: pgbouncer listen: through transaction pooling the notification was dropped (PgBouncer: %q), the listener got %d", dropped, got.Load())
	}
}

// drainForm is one form's queue in the drain: its workers on a lib/pq pool
// and on a pgx pool, its enqueuers on both.
type drainForm struct {
	form, table string
	pgxMode     string
	workers     int // loops per pool
	batch       int
	conns       int // per pool

	mu        sync.Mutex
	delivered map[string]int // payload → deliveries
	acked     atomic.Int64
	ended     map[worker.Outcome]int
	errs      []string
}

// testDrain drains a lease table and a row-lock table at once through
// transaction pooling, each by 8 worker loops (worker.Run, Workers 4, on a
// lib/pq pool and on a pgx pool) while an enqueuer per pool fills it, and
// checks every job delivered once and acknowledged, the row lock's effect
// committed once each through the claim's transaction, and the tables
// empty. pgx runs in exec mode for the lease and simple_protocol for the
// row lock, the two modes the documentation names.
func (h *harness) testDrain(t *testing.T) {
	jobs := pgbJobs(t)
	forms := []*drainForm{
		{form: "lease", table: "pgb_lease_" + h.suffix, pgxMode: "exec", workers: 4, batch: 4, conns: 4},
		// A row-lock job in work holds a connection (and, through the
		// pooler, a server connection) until it settles: 4 loops need 5.
		{form: "rowlock", table: "pgb_rowlock_" + h.suffix, pgxMode: "simple_protocol", workers: 4, batch: 1, conns: 5},
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var runs sync.WaitGroup
	var runErrs []error
	var runMu sync.Mutex
	start := time.Now()
	var enq sync.WaitGroup
	for _, f := range forms {
		h.createQueue(t, f.table)
		f.delivered, f.ended = map[string]int{}, map[worker.Outcome]int{}
		pools := []*sql.DB{
			open(t, "postgres", h.b.dsn(txDB)+pqTx, f.conns),
			open(t, "pgx", h.b.dsn(txDB)+pgxMode(f.pgxMode), f.conns),
		}
		for pi, db := range pools {
			q, err := inbox.New(db, queueConfig(f.table, f.form, false))
			if err != nil {
				t.Fatal(err)
			}
			if err := q.CheckSchema(ctx); err != nil {
				t.Fatalf("%s through transaction pooling: CheckSchema = %v, want nil", f.form, err)
			}
			runs.Add(1)
			go func() {
				defer runs.Done()
				err := worker.Run(ctx, q, worker.Config{Workers: f.workers, Batch: f.batch, Poll: 100 * time.Millisecond,
					OnEvent: f.observe, OnError: f.report}, f.handler(f.table))
				if err != nil {
					runMu.Lock()
					runErrs = append(runErrs, fmt.Errorf("%s: worker.Run: %w", f.form, err))
					runMu.Unlock()
				}
			}()
			// Each enqueue wakes every idle loop of the table in the
			// process, whose claims then wait for the pool's four server
			// connections: one job at a time, the enqueuers would wait
			// on 16 claims each time, so they write ten at once, and one
			// of them one at a time, from both drivers at once.
			enq.Add(1)
			go func(pi int) {
				defer enq.Done()
				var batch []inbox.Job
				for i := pi; i < jobs; i += len(pools) {
					batch = append(batch, inbox.Job{Data: []any{[]byte(fmt.Sprintf("%s-%d", f.form, i))}})
					if len(batch) < 10 && i+len(pools) < jobs {
						continue
					}
					var err error
					if len(batch) == 1 {
						_, err = q.Enqueue(ctx, db, batch[0])
					} else {
						_, err = q.EnqueueMany(ctx, db, batch)
					}
					if err != nil {
						f.report(fmt.Errorf("enqueue %d jobs: %w", len(batch), err))
					}
					batch = batch[:0]
				}
			}(pi)
		}
	}
	enq.Wait()
	enqueued := time.Since(start)
	direct := open(t, "postgres", h.direct, 2)
	deadline := time.Now().Add(drainWait)
	tick := time.NewTicker(20 * time.Millisecond)
	for _, f := range forms {
		for f.acked.Load() < int64(jobs) && time.Now().Before(deadline) {
			<-tick.C
		}
	}
	tick.Stop()
	drained := time.Since(start)
	cancel()
	runs.Wait()
	for _, err := range runErrs {
		t.Error(err)
	}
	for _, f := range forms {
		f.mu.Lock()
		var twice, never []string
		for i := 0; i < jobs; i++ {
			p := fmt.Sprintf("%s-%d", f.form, i)
			switch n := f.delivered[p]; {
			case n == 0:
				never = append(never, p)
			case n > 1:
				twice = append(twice, fmt.Sprintf("%s×%d", p, n))
			}
		}
		t.Logf("FIGURE: pgbouncer drain %s: %d jobs enqueued and drained by 8 loops (4 on lib/pq, 4 on pgx %s) through transaction pooling, pool_size %d: "+
			"%d deliveries, %d acked, outcomes %v, %d loop errors; enqueued in %v, drained in %v",
			f.form, jobs, f.pgxMode, poolSize, len(f.delivered), f.acked.Load(), f.ended, len(f.errs), enqueued.Round(time.Millisecond), drained.Round(time.Millisecond))
		if len(never) > 0 || len(twice) > 0 || f.acked.Load() != int64(jobs) || f.ended[worker.OutcomeAcked] != jobs {
			t.Errorf("%s: %d of %d jobs never delivered (first %q), %d delivered more than once (%q), %d acked, outcomes %v",
				f.form, len(never), jobs, first(never, 5), len(twice), first(twice, 5), f.acked.Load(), f.ended)
		}
		for _, e := range first(f.errs, 5) {
			t.Errorf("%s: the loops met: %s", f.form, e)
		}
		f.mu.Unlock()
		var left, dead, effects int
		err := direct.QueryRow("SELECT (SELECT count(*) FROM "+f.table+"), (SELECT count(*) FROM "+f.table+"_dead), (SELECT count(*) FROM "+f.table+"_effects)").
			Scan(&left, &dead, &effects)
		if err != nil {
			t.Fatal(err)
		}
		wantEffects := 0
		if f.form == "rowlock" {
			wantEffects = jobs
		}
		if left != 0 || dead != 0 || effects != wantEffects {
			t.Errorf("%s: %d jobs left in the table, %d dead, %d effects committed (want 0, 0, %d)", f.form, left, dead, effects, wantEffects)
		}
	}
}

// handler records each delivery; a row-lock handler also writes its effect
// through the claim's transaction, committed by the loop's Ack.
func (f *drainForm) handler(table string) worker.Handler {
	return func(ctx context.Context, d *inbox.Delivery) error {
		var payload []byte
		if err := d.Scan(&payload); err != nil {
			return err
		}
		f.mu.Lock()
		f.delivered[string(payload)]++
		f.mu.Unlock()
		if f.form == "rowlock" {
			if _, err := d.Tx().ExecContext(ctx, "INSERT INTO "+table+"_effects (payload) VALUES ($1)", payload); err != nil {
				return err
			}
		}
		return nil
	}
}

func (f *drainForm) observe(e worker.Event) {
	if e.Kind != worker.EventEnd {
		return
	}
	f.mu.Lock()
	f.ended[e.Outcome]++
	f.mu.Unlock()
	if e.Outcome == worker.OutcomeAcked && e.SettleErr == nil {
		f.acked.Add(1)
	}
}

func (f *drainForm) report(err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	f.mu.Lock()
	f.errs = append(f.errs, err.Error())
	f.mu.Unlock()
}

func first(s []string, n int) []string { return s[:min(n, len(s))] }
