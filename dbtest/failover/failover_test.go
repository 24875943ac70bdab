// Package failover tests the queue across a PostgreSQL failover: a primary
// and its synchronous streaming standby, started by the test on loopback,
// workers on a multi-host DSN, the primary SIGKILLed midway and the standby
// promoted, with no loss and every duplicate explained. It runs only when
// asked, INBOX_CLUSTER_SUITES=1 (CI sets it; see internal/optin).
package failover

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/dbtest/internal/cluster"
	"github.com/sqlinbox/inbox/dbtest/internal/ledger"
	"github.com/sqlinbox/inbox/internal/optin"
)

// TestMain checks that a passing run leaves no goroutine behind: keepers,
// workers and the drivers' watchers all end with the failover behind them.
// A run that skipped the suite says so at its end (cluster.Suite.Run).
func TestMain(m *testing.M) {
	os.Exit(suite.Run(m))
}

// The run: every form on both drivers at once, six queues, each drained by
// its own workers on one pool per queue, so that one failover is met by all
// of them (and the suite needs one cluster).
//
//  1. The workers drain a third of each queue. Then every handler a holder
//     starts holds its job (the row-lock claim's transaction open with its
//     effect written, the advisory session lock taken, the lease kept by
//     its keeper) until every holder of every queue holds one, so that jobs
//     of every form are in work at the kill whatever the machine's speed.
//     One runner per queue never holds: its claims, effects and Acks are in
//     flight when the kill comes.
//  2. Every process of the primary is SIGKILLed at once (a machine's
//     crash). The held row-lock and advisory handlers go on and Ack, which
//     fails: their sessions are gone. The lease holders' keepers find no
//     primary (the old one refuses connections, the standby is read-only
//     and target_session_attrs=read-write passes it by) and must cancel
//     their handlers with ErrLeaseLost before the leases they wrote run
//     out.
//  3. Once every delivery of the old primary is settled, failed or stopped,
//     every stopped holder's lease has run out and a whole lease has passed
//     since the kill (no keeper reached a primary for longer than a lease),
//     the standby's replay must show every acknowledged job gone and every
//     job not being acknowledged still there; then it is promoted
//     (pg_promote).
//  4. The same pools, in the same process, claim on the new primary and
//     drain the queues.
//
// The ledgers (internal/ledger) then prove, per queue, that no job was
// lost, that every duplicate delivery is of a job the kill caught (its
// session, lease keeper or answer died with the primary: the pre-kill
// ledger is a killed process to the checker) and that attempts followed the
// form: row lock not spent, lease and advisory spent. Exactly: each job the
// kill caught unacknowledged comes back once, unless its Ack was in flight
// and committed (an unrecorded ack), and no other job comes back.
//
// Size: INBOX_FAILOVER_JOBS jobs per queue (default 2,000).

const (
	// failLease is the lease form's lease, and failMargin how long before
	// the last expiry it knows of a keeper that cannot extend gives up.
	// A keeper extends every half lease and gives up a margin before the
	// expiry: 2 s for an extension to come back, and 2 s between the
	// handler's stop and the expiry, even on a loaded machine.
	failLease  = 8 * time.Second
	failMargin = 2 * time.Second
	// failHolders and failRunners are a queue's worker goroutines.
	failHolders = 3
	failRunners = 1
	// failDefaultJobs per queue.
	failDefaultJobs = 2000
	// failDrainWait bounds the whole drain, failStall a time without
	// progress: deadlines for a failure, generous for a loaded machine.
	failDrainWait = 10 * time.Minute
	failStall     = 2 * time.Minute
)

func failJobs(t *testing.T) int64 {
	v := os.Getenv("INBOX_FAILOVER_JOBS")
	if v == "" {
		return failDefaultJobs
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 200 {
		t.Fatalf("INBOX_FAILOVER_JOBS=%q: want a number of at least 200", v)
	}
	return n
}

func TestFailover(t *testing.T) {
	optin.Require(t, "the failover suite (a PostgreSQL primary and standby of its own)")
	if testing.Short() {
		t.Skip("the failover suite starts two PostgreSQL servers; -short skips it")
	}
	start := time.Now()
	bin := requirePostgres(t)
	c := startCluster(t, bin, true)
	t.Logf("cluster: PostgreSQL %s, primary 127.0.0.1:%d, synchronous standby 127.0.0.1:%d, up in %v",
		bin.version, c.primary.port, c.standby.port, time.Since(start).Round(time.Millisecond))
	jobs := failJobs(t)
	admin := c.primary.open(t)
	ledgers := t.TempDir()

	var groups []*group
	for _, loop := range []bool{false, true} {
		for _, drv := range []struct{ driver, label string }{{"postgres", "pq"}, {"pgx", "pgx"}} {
			for _, form := range []string{"rowlock", "lease", "advisory"} {
				g := &group{driver: drv.driver, label: drv.label, form: form, loop: loop, jobs: jobs,
					holders: failHolders, runners: failRunners, batch: 1,
					stale: map[int64]time.Time{}, reclaimedAt: map[int64]time.Time{}}
				g.table = "fo_" + drv.label + "_" + form + "_c"
				if loop {
					// Work's loops all hold at the kill: no runner (see
					// workLoop), and half the jobs, enough to resume on.
					g.table = "fo_" + drv.label + "_" + form + "_w"
					g.runners, g.jobs = 0, jobs/2
				} else if form == "lease" {
					// A lease claim holds no connection: claim a few at a time.
					g.batch = 4
				}
				g.holdAfter = g.jobs / 3
				setupGroup(t, c, admin, ledgers, g)
				groups = append(groups, g)
			}
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	r := &run{ctx: ctx, cancel: cancel, released: make(chan struct{})}
	stopWorkers := func() {
		r.cancel()
		select {
		case <-r.released:
		default:
			close(r.released)
		}
		r.wg.Wait()
	}
	t.Cleanup(stopWorkers)
	total := 0
	for _, g := range groups {
		for i := range g.holders + g.runners {
			r.wg.Add(1)
			if g.loop {
				go g.workLoop(r)
			} else {
				go g.work(r, i < g.holders)
			}
		}
		total += g.holders
	}
	groupErr := func() error {
		for _, g := range groups {
			if err := g.err(); err != nil {
				return fmt.Errorf("%s: %w", g.name(), err)
			}
		}
		return nil
	}

	// 1. Midway, every holder holds a job.
	cluster.Eventually(t, serverWait, "every holder to hold a job", func() error {
		if err := groupErr(); err != nil {
			t.Fatal(err)
		}
		if n := r.holding.Load(); n != int64(total) {
			return fmt.Errorf("%d of %d holders hold a job", n, total)
		}
		return nil
	})
	if err := c.checkSync(admin); err != nil {
		t.Fatalf("just before the kill: %v", err)
	}
	left := map[*group]int64{}
	for _, g := range groups {
		left[g] = count(t, admin, g.table)
	}

	// 2. The primary crashes.
	r.killing.Store(true)
	killAt := time.Now()
	if err := c.primary.crash(); err != nil {
		t.Fatalf("killing the primary: %v", err)
	}
	r.killed.Store(true)
	close(r.released)

	// Every delivery of the old primary ends: row-lock and advisory Acks
	// fail, lease holders are stopped by their keepers.
	cluster.Eventually(t, failLease+failStall, "every delivery of the old primary to be settled, failed or stopped", func() error {
		if err := groupErr(); err != nil {
			t.Fatal(err)
		}
		for _, g := range groups {
			if c, w := g.preClaims.Load(), g.preInWork.Load(); c != 0 || w != 0 {
				return fmt.Errorf("%s: %d claims in flight, %d deliveries in work", g.name(), c, w)
			}
		}
		return nil
	})
	var lastExpiry time.Time
	for _, g := range groups {
		g.mu.Lock()
		stops := g.stops
		g.mu.Unlock()
		if g.form == "lease" && len(stops) < g.holders {
			t.Errorf("%s: %d lease holders stopped by their keepers, want at least %d (one per holder)", g.name(), len(stops), g.holders)
		}
		for _, s := range stops {
			if !errors.Is(s.cause, inbox.ErrLeaseLost) {
				t.Errorf("%s: job %d: handler's context ended with cause %v, want ErrLeaseLost", g.name(), s.id, s.cause)
			}
			if !s.at.Before(s.expiry) {
				t.Errorf("%s: job %d: handler's context ended at %v, not before its lease ran out at %v", g.name(), s.id, s.at, s.expiry)
			}
			if s.expiry.After(lastExpiry) {
				lastExpiry = s.expiry
			}
		}
	}
	// 3. The standby is promoted once the holders' leases have run out (the
	// server's clock is this machine's) and a whole lease has passed since
	// the kill, so no keeper reached a primary for longer than a lease.
	promoteAfter := killAt.Add(failLease)
	if lastExpiry.After(promoteAfter) {
		promoteAfter = lastExpiry
	}
	cluster.Eventually(t, failLease+failStall, "the lease holders' leases to run out", func() error {
		if now := time.Now(); !now.After(promoteAfter) {
			return fmt.Errorf("%v to go", promoteAfter.Sub(now))
		}
		return nil
	})
	sdb := c.standby.open(t)
	for _, g := range groups {
		checkStandby(t, sdb, g)
	}
	promoteAt := time.Now()
	if err := c.promote(sdb); err != nil {
		t.Fatalf("promoting the standby: %v", err)
	}
	promoted := time.Now()

	// 4. The workers drain the queues on the new primary.
	deadline := time.Now().Add(failDrainWait)
	last, lastProgress := int64(-1), time.Now()
	for {
		if err := groupErr(); err != nil {
			t.Fatal(err)
		}
		var remaining int64
		for _, g := range groups {
			remaining += count(t, sdb, g.table)
		}
		if remaining == 0 {
			break
		}
		if remaining != last {
			last, lastProgress = remaining, time.Now()
		}
		switch now := time.Now(); {
		case now.After(deadline):
			t.Fatalf("%d jobs left %v after the promotion", remaining, now.Sub(promoted))
		case now.Sub(lastProgress) > failStall:
			t.Fatalf("no job acknowledged for %v, %d left", now.Sub(lastProgress), remaining)
		}
		time.Sleep(50 * time.Millisecond)
	}
	stopWorkers()
	if err := groupErr(); err != nil {
		t.Fatal(err)
	}

	// The stale lease holders' late Acks change nothing.
	for _, g := range groups {
		for _, p := range g.lateAcks() {
			t.Error(p)
		}
	}
	// Nothing held is left on the new primary: no advisory lock, no
	// session in a transaction, no delivery in a queue's count.
	for _, g := range groups {
		if n := g.q.InWork(); n != 0 {
			t.Errorf("%s: InWork %d after the drain, want 0", g.name(), n)
		}
	}
	cluster.Eventually(t, time.Minute, "no advisory lock and no session idle in a transaction", func() error {
		var locks, idle int
		if err := sdb.QueryRow("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").Scan(&locks); err != nil {
			return err
		}
		if err := sdb.QueryRow("SELECT count(*) FROM pg_stat_activity WHERE state LIKE 'idle in transaction%'").Scan(&idle); err != nil {
			return err
		}
		if locks != 0 || idle != 0 {
			return fmt.Errorf("%d advisory locks, %d sessions idle in a transaction", locks, idle)
		}
		return nil
	})
	for _, g := range groups {
		var port int
		if err := g.db.QueryRow("SELECT inet_server_port()").Scan(&port); err != nil {
			t.Fatalf("%s: %v", g.name(), err)
		}
		if port != c.standby.port {
			t.Errorf("%s: the workers' pool reaches port %d, want the new primary's %d", g.name(), port, c.standby.port)
		}
	}

	t.Logf("FIGURE: failover: primary killed, standby promoted %v after the kill (pg_promote took %v); %d jobs per Claim queue (%d holders, %d runner), half as many per Work queue (%d holders); lease %v, keeper margin %v",
		promoteAt.Sub(killAt).Round(time.Millisecond), promoted.Sub(promoteAt).Round(time.Millisecond), jobs, failHolders, failRunners, failHolders, failLease, failMargin)
	for _, g := range groups {
		checkLedger(t, sdb, g, left[g], killAt, promoteAt)
	}
	t.Logf("FIGURE: failover wall: %v", time.Since(start).Round(time.Millisecond))
}

// setupGroup makes g's table, ledgers, pool on the multi-host DSN and
// queue.
func setupGroup(t *testing.T, c *pgCluster, admin *sql.DB, ledgers string, g *group) {
	t.Helper()
	setupTable(t, admin, g)
	g.prePath = filepath.Join(ledgers, g.table+"-pre.ledger")
	g.postPath = filepath.Join(ledgers, g.table+"-post.ledger")
	var err error
	if g.pre, err = ledger.Create(g.prePath); err != nil {
		t.Fatal(err)
	}
	if g.post, err = ledger.Create(g.postPath); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.pre.Close(); g.post.Close() })
	if g.db, err = sql.Open(g.driver, c.multiHost()); err != nil {
		t.Fatal(err)
	}
	// Row lock and advisory hold a connection per job in work; the pool
	// keeps one more for settlements (the pool rule).
	conns := (g.holders+g.runners)*g.batch + 1
	g.db.SetMaxOpenConns(conns)
	g.db.SetMaxIdleConns(conns)
	t.Cleanup(func() { g.db.Close() })
	cfg := inbox.Config{Dialect: inbox.Postgres, Table: describe(g)}
	if g.form == "lease" {
		cfg.Lease, cfg.KeepMargin = failLease, failMargin
	}
	if g.q, err = inbox.New(g.db, cfg); err != nil {
		t.Fatal(err)
	}
	if err := g.q.CheckSchema(context.Background()); err != nil {
		t.Fatalf("%s: %v", g.name(), err)
	}
}

// describe is the queue's table description.
func describe(g *group) inbox.Table {
	tb := inbox.Table{Name: g.table, DeadTable: g.table + "_dead", NotBefore: "not_before"}
	switch g.form {
	case "lease":
		tb.LockedUntil, tb.NotBefore = "locked_until", ""
	case "advisory":
		tb.AdvisoryKey = "id"
	}
	return tb
}

// setupTable creates g's queue table, its dead table, the recommended
// indexes and (row lock) the effects table, and fills it with jobs 1..n.
func setupTable(t *testing.T, db *sql.DB, g *group) {
	t.Helper()
	stmts := []string{
		"CREATE TABLE " + g.table + " (id bigint PRIMARY KEY, attempt integer NOT NULL DEFAULT 1, " +
			"locked_until timestamptz, payload bytea NOT NULL, not_before timestamptz)",
		"CREATE TABLE " + g.table + "_dead (id bigint PRIMARY KEY, attempt integer NOT NULL, payload bytea NOT NULL)",
	}
	if g.form == "lease" {
		stmts = append(stmts,
			"CREATE INDEX "+g.table+"_free ON "+g.table+" (id) WHERE locked_until IS NULL",
			"CREATE INDEX "+g.table+"_lu ON "+g.table+" (locked_until)")
	} else {
		stmts = append(stmts, "CREATE INDEX "+g.table+"_ready ON "+g.table+" (not_before, id)")
	}
	if g.form == "rowlock" {
		g.effects = g.table + "_fx"
		stmts = append(stmts, "CREATE TABLE "+g.effects+" (job_id bigint NOT NULL)")
	}
	stmts = append(stmts, fmt.Sprintf("INSERT INTO %s (id, payload) SELECT g, '\\x6a6f62'::bytea FROM generate_series(1, %d) g", g.table, g.jobs))
	for _, s := range stmts {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

func count(t *testing.T, db *sql.DB, table string) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRow("SELECT count(*) FROM " + table).Scan(&n); err != nil {
		t.Fatalf("counting %s: %v", table, err)
	}
	return n
}

// checkStandby waits for the standby to have replayed what it holds and
// checks g's table there: every job the pre-kill ledger recorded as
// acknowledged is gone (synchronous replication kept each acknowledged
// Ack), and every job not being acknowledged at the kill is still there.
// A job whose Ack was in flight may be either.
func checkStandby(t *testing.T, sdb *sql.DB, g *group) {
	t.Helper()
	acked, acking := map[int64]bool{}, map[int64]bool{}
	data, err := os.ReadFile(g.prePath)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) != 3 {
			continue
		}
		id, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case ledger.OpAcked:
			acked[id] = true
			delete(acking, id)
		case ledger.OpAck:
			acking[id] = true
		}
	}
	// The standby confirmed each commit once it had flushed its WAL;
	// replaying it may trail by a moment.
	cluster.Eventually(t, time.Minute, g.name()+": the standby to show every acknowledged job gone", func() error {
		rows, err := sdb.Query("SELECT id FROM " + g.table)
		if err != nil {
			return err
		}
		defer rows.Close()
		var back []int64
		present, inFlight := 0, 0
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				return err
			}
			present++
			switch {
			case acked[id]:
				back = append(back, id)
			case acking[id]:
				inFlight++
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if len(back) > 0 {
			sort.Slice(back, func(i, j int) bool { return back[i] < back[j] })
			return fmt.Errorf("%d acknowledged jobs are back on the standby, the first %v", len(back), back[:min(len(back), 10)])
		}
		if want := int(g.jobs) - len(acked) - len(acking); present-inFlight != want {
			return fmt.Errorf("%d jobs on the standby besides %d whose Ack was in flight, want %d (%d of %d acknowledged)",
				present-inFlight, inFlight, want, len(acked), g.jobs)
		}
		return nil
	})
}

// checkLedger checks g's ledgers and table after the drain and logs its
// figures; left is how many jobs were in the table just before the kill
// (read while the runners still worked).
func checkLedger(t *testing.T, db *sql.DB, g *group, left int64, killAt, promoteAt time.Time) {
	t.Helper()
	rule := ledger.SpendAttempt
	if g.form == "rowlock" {
		rule = ledger.KeepAttempt
	}
	r, err := ledger.Check([]ledger.Proc{
		{Name: g.name() + " before the kill", Path: g.prePath, Killed: true},
		{Name: g.name() + " after the kill", Path: g.postPath},
	}, g.jobs, rule)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range r.Violations {
		t.Errorf("%s: %s", g.name(), v)
	}
	if r.Acked+r.UnrecordedAcks != int(g.jobs) || r.Lost != 0 {
		t.Errorf("%s: %d jobs acknowledged (%d unrecorded), %d lost; want %d, 0", g.name(), r.Acked+r.UnrecordedAcks, r.UnrecordedAcks, r.Lost, g.jobs)
	}
	g.mu.Lock()
	stopped := int64(len(g.stops))
	g.mu.Unlock()
	// caught: deliveries of the old primary never acknowledged there, held
	// or in flight at the kill: failed Acks, stopped lease holders, failed
	// effect writes.
	caught := g.ackFails.Load() + stopped + g.cutOff.Load()
	if int64(r.AckFails) != g.ackFails.Load() {
		t.Errorf("%s: %d ackfail lines, %d Acks failed", g.name(), r.AckFails, g.ackFails.Load())
	}
	if caught < int64(g.holders) {
		t.Errorf("%s: the kill caught %d deliveries, want at least the %d held", g.name(), caught, g.holders)
	}
	// Each caught job came back once, unless its Ack committed with its
	// answer lost; no other job came back.
	if int64(r.Duplicates+r.UnrecordedAcks) != caught {
		t.Errorf("%s: %d deliveries repeated and %d unrecorded acks, want %d in all: one per delivery the kill caught", g.name(), r.Duplicates, r.UnrecordedAcks, caught)
	}
	// At most a runner's Ack, and a runner's claim, were in flight.
	if r.UnrecordedAcks > g.runners || r.AttemptGaps > g.runners*g.batch {
		t.Errorf("%s: %d unrecorded acks, %d attempt gaps; the %d runners could have had at most %d and %d in flight",
			g.name(), r.UnrecordedAcks, r.AttemptGaps, g.runners, g.runners, g.runners*g.batch)
	}
	if int64(r.KilledInWork) != stopped+g.cutOff.Load() {
		t.Errorf("%s: the ledger has %d deliveries left in work at the kill, want %d stopped lease holders and %d cut-off handlers",
			g.name(), r.KilledInWork, stopped, g.cutOff.Load())
	}
	if g.form == "rowlock" {
		if r.MaxAttempt != 1 {
			t.Errorf("%s: highest attempt delivered %d, want 1: a crash spends none", g.name(), r.MaxAttempt)
		}
	} else if r.Duplicates > 0 && r.MaxAttempt < 2 {
		t.Errorf("%s: jobs came back, but the highest attempt delivered is %d: a crash spends one", g.name(), r.MaxAttempt)
	}
	if n := count(t, db, g.table); n != 0 {
		t.Errorf("%s: %d jobs left", g.name(), n)
	}
	if n := count(t, db, g.table+"_dead"); n != 0 {
		t.Errorf("%s: %d jobs in the dead table", g.name(), n)
	}
	if g.form == "rowlock" {
		// Exactly-once effects: the caught jobs' effects rolled back with
		// the crash, and were written again by their second delivery.
		var n, distinct int64
		if err := db.QueryRow("SELECT count(*), count(DISTINCT job_id) FROM "+g.effects).Scan(&n, &distinct); err != nil {
			t.Fatal(err)
		}
		if n != g.jobs || distinct != g.jobs {
			t.Errorf("%s: %d effect rows for %d jobs, want %d for %d", g.name(), n, distinct, g.jobs, g.jobs)
		}
	}
	first := time.Unix(0, g.firstClaim.Load())
	if g.firstClaim.Load() == 0 {
		t.Errorf("%s: no claim after the kill", g.name())
	}
	extra := ""
	if g.form == "lease" {
		g.mu.Lock()
		lead := time.Duration(1<<63 - 1)
		for _, s := range g.stops {
			lead = min(lead, s.expiry.Sub(s.at))
			if at, ok := g.reclaimedAt[s.id]; !ok {
				t.Errorf("%s: job %d, stopped at the kill, was not claimed again", g.name(), s.id)
			} else if at.Before(s.expiry) {
				t.Errorf("%s: job %d claimed again at %v, before its stopped holder's lease ran out at %v", g.name(), s.id, at, s.expiry)
			}
		}
		g.mu.Unlock()
		extra = fmt.Sprintf(" holders_stopped=%d stopped_before_expiry_by_at_least=%v", stopped, lead.Round(time.Millisecond))
	}
	g.mu.Lock()
	firstErr := g.firstErr
	g.mu.Unlock()
	if !g.loop {
		extra += fmt.Sprintf(" claim_errors=%d", g.claimErrs.Load())
	}
	t.Logf("FIGURE: failover %s: jobs=%d left_at_kill=%d workers=%dx%d caught_by_kill=%d (effect_write_failed=%d) redelivered=%d unrecorded_acks=%d attempt_gaps=%d max_attempt=%d ack_failures=%d kill_to_first_claim=%v promote_to_first_claim=%v%s",
		g.name(), g.jobs, left, g.holders+g.runners, g.batch, caught, g.cutOff.Load(), r.Duplicates, r.UnrecordedAcks, r.AttemptGaps, r.MaxAttempt, r.AckFails,
		first.Sub(killAt).Round(time.Millisecond), first.Sub(promoteAt).Round(time.Millisecond), extra)
	if firstErr != "" {
		t.Logf("%s: first claim error: %s", g.name(), strings.ReplaceAll(firstErr, "\n", " | "))
	}
}
