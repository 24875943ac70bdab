// Package galera runs the queue on a three-node MariaDB Galera cluster that
// the suite starts on 127.0.0.1 and tears down itself (cluster_test.go):
// the advisory form refused by CheckSchema on every node, and on the nodes
// that granted one GET_LOCK name at once; a drain of the lease and row-lock
// forms together by workers on all three nodes while one node is SIGKILLed
// and rejoins, checked from the workers' ledgers and from every node's
// tables, the killed node's lease job claimed again only once its lease ran
// out, and the rejoined node claiming and settling again; and a split of one
// node from the others (gmcast.isolate) while it holds a lease job. TestGaleraStandalone drains the same way on one
// server without Galera, for the throughput the cluster is compared with.
// TestGaleraSkew (skew_test.go) runs a two-node cluster with one node's
// clock moved ahead by libfaketime (Debian's faketime package) and measures
// which skews break a lease's promises, and that CheckSchema reports them.
//
// It runs only when asked, INBOX_CLUSTER_SUITES=1 (CI sets it; see
// internal/optin). Run (from the repository root):
//
//	INBOX_CLUSTER_SUITES=1 INBOX_REQUIRE_DBS=1 go test -count=1 -v -run 'TestGalera|TestCheck' ./dbtest/galera/
//
// Size: INBOX_GALERA_JOBS jobs per form (default galeraDefaultJobs, what CI
// runs); INBOX_GALERA_JOBS=20000 is the full run. Without
// mariadbd, mariadb-install-db, rsync or Debian's galera-4 the suite skips,
// saying so, and fails under INBOX_REQUIRE_DBS=1. -short skips the drains.
// INBOX_GALERA_LOGS=dir keeps each server's error log there (with every
// certification conflict and brute-force abort: wsrep_log_conflicts).
// INBOX_GALERA_ACK_RR=1 acknowledges lease jobs in REPEATABLE READ
// transactions rather than READ COMMITTED (see ackTx).
package galera

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/dbtest/internal/cluster"
	"github.com/sqlinbox/inbox/dbtest/internal/ledger"
	"github.com/sqlinbox/inbox/internal/optin"
)

// TestMain runs the suite, or a worker process when childEnv is set; a
// passing suite must leave no goroutine running (cluster.Suite.Run).
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	os.Exit(suite.Run(m))
}

// galeraDefaultJobs is the size of each form's table unless
// INBOX_GALERA_JOBS says otherwise: small enough for CI's budget on two
// cores under -race, large enough that the kill lands mid-drain with work
// in flight on every node.
const galeraDefaultJobs = 2000

// galeraLease is the lease form's lease. The kill of a node stalls every
// commit of the cluster until the others declare it gone (evs.suspect_timeout,
// 5 s by default; about 6 s measured here), and a keeper must outlast that:
// it extends every half lease and gives up a tenth of a lease before the
// expiry. A shorter lease would turn the stall into lost leases on the
// live nodes; a longer one only delays the return of the jobs held on the
// killed node.
const galeraLease = 20 * time.Second

// shape is how the workers of a drain run: per node and form one process
// of workers goroutines, claiming up to batch jobs at a time (lease).
type shape struct{ workers, leaseBatch int }

var drainShape = shape{workers: 4, leaseBatch: 8}

func galeraJobs(t testing.TB) int64 {
	if v := os.Getenv("INBOX_GALERA_JOBS"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			t.Fatalf("INBOX_GALERA_JOBS=%q is not a positive number", v)
		}
		return n
	}
	return galeraDefaultJobs
}

// TestGalera boots a three-node cluster and runs the Galera checks on it.
func TestGalera(t *testing.T) {
	optin.Require(t, "the Galera suite (a three-node MariaDB Galera cluster of its own)")
	h := newHarness(t, 3, true)
	boot := h.bootCluster()
	t.Logf("FIGURE: galera boot: three nodes synced in %v (ports %d/%d/%d, galera %d/%d/%d)", boot.Round(100*time.Millisecond),
		h.nodes[0].port, h.nodes[1].port, h.nodes[2].port, h.nodes[0].gcomm, h.nodes[1].gcomm, h.nodes[2].gcomm)
	t.Run("CheckSchema", func(t *testing.T) { testCheckSchema(t, h) })
	t.Run("Drain", func(t *testing.T) {
		if testing.Short() {
			t.Skip("the drain takes minutes; -short skips it")
		}
		runDrain(t, h, true)
	})
	t.Run("Split", func(t *testing.T) { testSplit(t, h) })
}

// TestGaleraStandalone drains as TestGalera does on one server started the
// same way without Galera (the throughput the cluster is measured against),
// where no job may be delivered twice, and shows that the advisory form
// passes CheckSchema there: the refusal is Galera's.
func TestGaleraStandalone(t *testing.T) {
	optin.Require(t, "the Galera suite's standalone server (a MariaDB server of its own)")
	h := newHarness(t, 1, false)
	boot := h.bootStandalone()
	t.Logf("FIGURE: standalone boot: %v (port %d)", boot.Round(100*time.Millisecond), h.nodes[0].port)
	db := openDB(t, h.nodes[0].DSN(), 2)
	createQueue(t, db, "schema_check")
	q, err := inbox.New(db, queueConfig("schema_check", "advisory", 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := q.CheckSchema(context.Background()); err != nil {
		t.Errorf("advisory form on a server without Galera: CheckSchema: %v, want nil", err)
	}
	if testing.Short() {
		t.Skip("the drain takes minutes; -short skips it")
	}
	runDrain(t, h, false)
}

func openDB(t testing.TB, dsn string, conns int) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	t.Cleanup(func() { db.Close() })
	return db
}

// createQueue (re)creates a queue table that serves every form (the
// columns of dbtest's MySQL schema) with the index the README recommends
// for each, and its dead table.
func createQueue(t testing.TB, db *sql.DB, table string) {
	t.Helper()
	for _, s := range []string{
		"DROP TABLE IF EXISTS " + table, "DROP TABLE IF EXISTS " + table + "_dead",
		"CREATE TABLE " + table + " (id bigint AUTO_INCREMENT PRIMARY KEY, attempt integer NOT NULL DEFAULT 1, " +
			"locked_until DATETIME(6) NULL, payload blob NOT NULL, k varchar(64) NOT NULL DEFAULT '', not_before DATETIME(6) NULL, " +
			"INDEX " + table + "_claimable (locked_until, id), INDEX " + table + "_ready (not_before, id))",
		"CREATE TABLE " + table + "_dead (id bigint PRIMARY KEY, attempt integer NOT NULL, payload blob NOT NULL)",
	} {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// createEffects (re)creates an effects table: one row per committed
// acknowledgement, written in its transaction, with (lease) the expiry its
// claim wrote.
func createEffects(t testing.TB, db *sql.DB, table string) {
	t.Helper()
	for _, s := range []string{
		"DROP TABLE IF EXISTS " + table,
		"CREATE TABLE " + table + " (job_id bigint NOT NULL, attempt integer NOT NULL, node varchar(16) NOT NULL, claimed_until DATETIME(6) NULL, PRIMARY KEY (job_id, attempt, node))",
	} {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// testCheckSchema: on every node the advisory and row-lock forms are refused
// with a *inbox.SchemaError naming Galera and the lease form, and the lease
// form passes. First it shows why for the advisory form: GET_LOCK is kept
// by each server, so two nodes grant the same name at once; while both
// hold it, CheckSchema must refuse the advisory form on each node that
// granted it. The drain shows it for the row lock (a job in work on
// several nodes, all but the first commit failing with 1213).
func testCheckSchema(t *testing.T, h *harness) {
	ctx := context.Background()
	createQueue(t, openDB(t, h.nodes[0].DSN(), 1), "schema_check")
	name := fmt.Sprintf("inbox_galera_demo_%d", os.Getpid())
	// node1's session takes a name no one else uses, then node2's asks for
	// it while node1's holds it, neither waiting (timeout 0): were the lock
	// replicated, node2 would answer 0 at once. The answers are the same
	// every run.
	var granted []*node
	var answers []string
	for _, nd := range h.nodes[:2] {
		c, err := nd.admin.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			_, _ = c.ExecContext(ctx, "SELECT RELEASE_ALL_LOCKS()")
			c.Close()
		}()
		var got sql.NullInt64
		switch err := c.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", name).Scan(&got); {
		case err != nil:
			answers = append(answers, fmt.Sprintf("%s refused it: %v", nd.name, err))
		case !got.Valid:
			answers = append(answers, nd.name+" answered NULL (an error)")
		default:
			answers = append(answers, fmt.Sprintf("%s answered %d", nd.name, got.Int64))
			if got.Int64 == 1 {
				granted = append(granted, nd)
			}
		}
	}
	if len(granted) != 2 {
		t.Errorf("GET_LOCK(%q, 0) granted on %d of 2 nodes at once (%s), want both: Galera does not replicate GET_LOCK, which is why CheckSchema "+
			"refuses the advisory form on a node (MariaDB 10.11 grants it on each node); a MariaDB that refuses GET_LOCK under wsrep_on "+
			"fails the advisory form at its first claim instead, and this check must then assert that refusal",
			name, len(granted), strings.Join(answers, "; "))
	} else {
		t.Logf("GET_LOCK(%q, 0) granted at once on %s and %s: two sessions hold one name", name, granted[0].name, granted[1].name)
		for _, nd := range granted {
			q, err := inbox.New(openDB(t, nd.DSN()+"&wsrep_sync_wait=1", 2), queueConfig("schema_check", "advisory", 0))
			if err != nil {
				t.Fatal(err)
			}
			if err := q.CheckSchema(ctx); err == nil {
				t.Errorf("%s granted GET_LOCK(%q, 0) while %s held it, and CheckSchema passes the advisory form there", nd.name, name, other(granted, nd).name)
			}
		}
	}

	for _, nd := range h.nodes {
		t.Run(nd.name, func(t *testing.T) {
			db := openDB(t, nd.DSN()+"&wsrep_sync_wait=1", 2)
			for _, form := range []string{"advisory", "lease", "rowlock"} {
				q, err := inbox.New(db, queueConfig("schema_check", form, time.Minute))
				if err != nil {
					t.Fatal(err)
				}
				err = q.CheckSchema(ctx)
				if form == "lease" {
					if err != nil {
						t.Errorf("lease form on a Galera node: CheckSchema: %v, want nil", err)
					}
					continue
				}
				var se *inbox.SchemaError
				if !errors.As(err, &se) {
					t.Errorf("%s form on a Galera node: CheckSchema returned %v, want a *inbox.SchemaError", form, err)
					continue
				}
				found := false
				for _, p := range se.Problems {
					l := strings.ToLower(p)
					if strings.Contains(l, "galera") && strings.Contains(l, "lease form") {
						found = true
					}
				}
				if !found {
					t.Errorf("%s form on a Galera node: no problem names Galera and the lease form: %q", form, se.Problems)
				}
			}
		})
	}
}

// other returns the node of two that is not nd.
func other(two []*node, nd *node) *node {
	if two[0] == nd {
		return two[1]
	}
	return two[0]
}

// drainForm is one form's table in a drain.
type drainForm struct {
	form, table, effects string
	rule                 ledger.Rule
	procs                []*proc
	ledgers              []ledgerProc
	doneAt               time.Duration // since the workers started, when its table was first seen empty
	goneAtHalf           int64         // its jobs gone when half of all were (the kill's moment)
}

// runDrain fills a lease table and a row-lock table with jobs each, starts
// one worker process per node and form, and waits until both are empty. With
// kill (a cluster), two holders on the last node first claim a job of each
// form and keep it; once half the jobs are gone that node is SIGKILLed, the
// holders try to acknowledge, and the node restarts (position recovery,
// then a start that asks for IST) as soon as the others have formed a view
// without it; the drain ends when both tables are empty and the node is
// synced again. It then checks the ledgers and every node's tables and logs
// the figures: first_half is the rate of each form until half of all jobs
// were gone, before the kill.
func runDrain(t *testing.T, h *harness, kill bool) {
	jobs := galeraJobs(t)
	first := h.nodes[0]
	setup := openDB(t, first.DSN(), 2)
	pid := os.Getpid()
	forms := []*drainForm{
		{form: "lease", table: fmt.Sprintf("drain_lease_%d", pid), rule: ledger.SpendAttempt},
		{form: "rowlock", table: fmt.Sprintf("drain_rowlock_%d", pid), rule: ledger.KeepAttempt},
	}
	for _, f := range forms {
		f.effects = f.table + "_fx"
		createQueue(t, setup, f.table)
		createEffects(t, setup, f.effects)
		fill(t, setup, f.table, jobs)
	}
	// Every node has the tables and the jobs before a worker starts.
	for _, nd := range h.nodes {
		for _, f := range forms {
			if n := count(t, nd, f.table); n != int(jobs) {
				t.Fatalf("%s: %d jobs in %s, want %d", nd.name, n, f.table, jobs)
			}
		}
	}
	t.Cleanup(func() {
		if h.nodes[0].running() {
			for _, f := range forms {
				_, _ = setup.Exec("DROP TABLE IF EXISTS " + f.table + ", " + f.table + "_dead, " + f.effects)
			}
		}
	})

	ledgers := t.TempDir()
	// With one server the three "nodes" are three processes on it, so that
	// the shape matches the cluster's.
	nodeOf := func(i int) *node { return h.nodes[i%len(h.nodes)] }
	victim := -1
	if kill {
		victim = 2
	}
	newProc := func(role string, f *drainForm, i int) *proc {
		nd := nodeOf(i)
		name := fmt.Sprintf("%s-%s-node%d", role, f.form, i+1)
		cfg := childConfig{Role: role, Node: fmt.Sprintf("node%d", i+1), Form: f.form, DSN: nd.DSN(), Table: f.table,
			Effects: f.effects, Ledger: filepath.Join(ledgers, name+".ledger"), Workers: drainShape.workers,
			Batch: 1, Lease: galeraLease, Victim: i == victim, AckRR: os.Getenv("INBOX_GALERA_ACK_RR") == "1"}
		if f.form == "lease" {
			cfg.Batch = drainShape.leaseBatch
		}
		p := startProc(t, name, cfg)
		f.ledgers = append(f.ledgers, ledgerProc{Name: name, Path: cfg.Ledger, Victim: cfg.Victim})
		return p
	}

	// The holders claim first, so that the kill finds a job of each form
	// in work on the victim whatever the timing.
	var holders []*proc
	held := map[string]string{}
	if kill {
		for _, f := range forms {
			p := newProc("holder", f, victim)
			l := p.Line(t, 2*time.Minute)
			if !strings.HasPrefix(l, "HOLDING ") {
				t.Fatalf("%s said %q, want HOLDING id attempt; stderr:\n%s", p.Name, l, p.Stderr())
			}
			held[f.form] = strings.TrimPrefix(l, "HOLDING ")
			holders = append(holders, p)
		}
	}
	start := time.Now()
	for _, f := range forms {
		for i := range 3 {
			f.procs = append(f.procs, newProc("worker", f, i))
		}
	}

	poll := openDB(t, first.DSN(), 1)
	total := 2 * jobs
	var (
		killed, restarted, rejoined                 bool
		halfAt, killAt, viewAt, restartAt, rejoinAt time.Duration
		victimAcksBefore                            int
		holderEnds                                  []string
		heldUntil                                   time.Time // the lease holder's lease as the live nodes had it at the kill
	)
	deadline := start.Add(20 * time.Minute)
	lastLeft, lastProgress := total+1, time.Now()
	for {
		var left [2]int64
		err := poll.QueryRow(fmt.Sprintf("SELECT (SELECT COUNT(*) FROM %s), (SELECT COUNT(*) FROM %s)", forms[0].table, forms[1].table)).Scan(&left[0], &left[1])
		if err != nil {
			t.Fatalf("counting jobs left on %s: %v", first.name, err)
		}
		now := time.Now()
		for i, f := range forms {
			if left[i] == 0 && f.doneAt == 0 {
				f.doneAt = now.Sub(start)
			}
		}
		all := left[0] + left[1]
		if all < lastLeft {
			lastLeft, lastProgress = all, now
		}
		if halfAt == 0 && all <= total/2 {
			halfAt = now.Sub(start)
			for i, f := range forms {
				f.goneAtHalf = jobs - left[i]
			}
		}
		for _, f := range forms {
			for _, p := range f.procs {
				if p.Exited() {
					t.Fatalf("%s exited on its own (%v) with %d jobs left; stderr:\n%s", p.Name, p.Err(), all, p.Stderr())
				}
			}
		}
		switch {
		case now.After(deadline):
			t.Fatalf("%d of %d jobs left after %v", all, total, now.Sub(start))
		case now.Sub(lastProgress) > 3*time.Minute:
			t.Fatalf("no job acknowledged for %v, %d left", now.Sub(lastProgress), all)
		}
		if kill && !killed && all <= total/2 {
			killed = true
			h.kill(h.nodes[victim])
			killAt = time.Since(start)
			heldUntil = leaseOf(t, first, forms[0].table, held["lease"])
			for _, p := range holders {
				fmt.Fprintln(p.Stdin(), "ACK")
			}
			for _, p := range holders {
				l := p.Line(t, 2*time.Minute)
				end, ok := strings.CutPrefix(l, "DONE ")
				if !ok {
					t.Fatalf("%s said %q, want DONE op; stderr:\n%s", p.Name, l, p.Stderr())
				}
				holderEnds = append(holderEnds, p.cfg.Form+":"+end)
			}
		}
		if killed && !restarted {
			if st, err := first.status(context.Background(), "wsrep_cluster_size"); err == nil && st["wsrep_cluster_size"] == "2" {
				viewAt = time.Since(start)
				restarted = true
				restartAt = time.Since(start)
				h.start(h.nodes[victim], false, h.recoverPosition(h.nodes[victim]))
			}
		}
		if restarted && !rejoined {
			nd := h.nodes[victim]
			if !nd.running() {
				t.Fatalf("%s exited (%v) while rejoining; error.log:\n%s", nd.name, nd.proc.Err(), cluster.Tail(filepath.Join(nd.dir, "error.log"), 40))
			}
			if nd.ready(3) == nil {
				rejoined = true
				rejoinAt = time.Since(start)
				victimAcksBefore = victimAcks(t, first, forms, nd.name)
			}
		}
		if all == 0 && (!kill || rejoined) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	wall := time.Since(start)
	for _, f := range forms {
		for _, p := range f.procs {
			if err := p.Stop(time.Minute); err != nil {
				t.Fatalf("%s: %v; stderr:\n%s", p.Name, err, p.Stderr())
			}
		}
	}
	for _, p := range holders {
		if err := p.Stop(time.Minute); err != nil {
			t.Fatalf("%s: %v; stderr:\n%s", p.Name, err, p.Stderr())
		}
	}

	// Every node: synced, nothing left, the same effects.
	for _, nd := range h.nodes {
		h.waitReady(nd, len(h.nodes)*btoi(nd.galera))
	}
	for _, f := range forms {
		var sums []string
		for _, nd := range h.nodes {
			sum := checkNode(t, nd, f, jobs)
			sums = append(sums, sum)
			if sum != sums[0] {
				t.Errorf("%s: effects of %s differ from %s's: %s, %s", nd.name, f.form, h.nodes[0].name, sum, sums[0])
			}
		}
	}
	victimAcksAfter := 0
	if kill {
		victimAcksAfter = victimAcks(t, first, forms, h.nodes[victim].name) - victimAcksBefore
		checkReclaim(t, first, forms[0], held["lease"], heldUntil)
		settleOn(t, h, h.nodes[victim], "kill")
	}

	label := "standalone"
	if kill {
		label = "galera"
	}
	for _, f := range forms {
		r, err := check(f.ledgers, jobs, f.rule)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range r.Violations {
			t.Errorf("%s: %s", f.form, v)
		}
		if r.Acked+r.UnknownAcks != int(jobs) || r.Lost != 0 {
			t.Errorf("%s: %d jobs acknowledged (%d in flight on the killed node), %d lost; want %d, 0", f.form, r.Acked+r.UnknownAcks, r.UnknownAcks, r.Lost, jobs)
		}
		for _, id := range r.GapJobs {
			t.Logf("%s: job %d has an attempt gap; its ledger lines:\n%s", f.form, id, trail(f.ledgers, id))
		}
		if f.form == "lease" {
			for _, id := range r.ConflictJobs {
				t.Logf("%s: job %d had a delivery end in a conflict; its ledger lines:\n%s", f.form, id, trail(f.ledgers, id))
			}
		}
		// Each acknowledged delivery's effect row carries its attempt.
		checkFinal(t, first, f, r)
		stats := map[string]int{}
		for _, p := range f.procs {
			for k, v := range p.stats() {
				stats[k] += v
			}
		}
		if !kill && (r.Duplicates != 0 || r.AttemptGaps != 0 || r.MaxAttempt != 1 || stats["conflicts"] != 0) {
			t.Errorf("%s on one server: %d duplicates, %d attempt gaps, highest attempt %d, %d conflicts; want 0, 0, 1, 0",
				f.form, r.Duplicates, r.AttemptGaps, r.MaxAttempt, stats["conflicts"])
		}
		if kill {
			// The holder's delivery ended with its node, so its job was
			// delivered again: the kill found work in flight.
			if r.ByNode == 0 {
				t.Errorf("%s: no delivery ended with the killed node; the holder's job was not delivered again", f.form)
			}
			// A lease claim that committed as its node died spends an
			// attempt nobody saw: at most one claim per goroutine there.
			if most := drainShape.workers * drainShape.leaseBatch; r.AttemptGaps > most {
				t.Errorf("%s: %d attempts spent without a recorded delivery, more than the %d one kill explains", f.form, r.AttemptGaps, most)
			}
		}
		t.Logf("FIGURE: %s %s: jobs=%d procs=%d(x%d goroutines, claim %d) first_half=%.0f/s drained_in=%v deliveries=%d duplicates=%d "+
			"by_conflict=%d by_node_kill=%d by_lease_lost=%d concurrent_in_one_process=%d unknown_acks=%d attempt_gaps=%d max_attempt=%d "+
			"claim_conflicts=%d claim_other_errors=%d",
			label, f.form, jobs, len(f.procs), drainShape.workers, f.procs[0].cfg.Batch, float64(f.goneAtHalf)/halfAt.Seconds(),
			f.doneAt.Round(100*time.Millisecond), r.Deliveries, r.Duplicates, r.ByConflict, r.ByNode, r.ByLost, r.Concurrent, r.UnknownAcks, r.AttemptGaps,
			r.MaxAttempt, stats["claim_conflicts"], stats["claim_other_errors"])
	}
	t.Logf("FIGURE: %s both forms: %d jobs in %v (%.0f jobs/s); the first half in %v (%.0f jobs/s)",
		label, total, wall.Round(100*time.Millisecond), float64(total)/wall.Seconds(), halfAt.Round(100*time.Millisecond), float64(total)/2/halfAt.Seconds())
	if kill {
		kind, lines := transfer(h.nodes[victim])
		t.Logf("FIGURE: galera kill: node%d SIGKILLed at %v; view without it after %v more; restarted at once, synced %v after the restart (%v after the kill, by %s); "+
			"holders ended %v (held %v); node%d's workers acknowledged %d jobs after it rejoined",
			victim+1, killAt.Round(100*time.Millisecond), (viewAt - killAt).Round(100*time.Millisecond), (rejoinAt - restartAt).Round(100*time.Millisecond),
			(rejoinAt - killAt).Round(100*time.Millisecond), kind, holderEnds, held, victim+1, victimAcksAfter)
		t.Logf("node%d's state transfer, from its error log:\n%s", victim+1, lines)
		for _, e := range holderEnds {
			if e == "lease:acked" {
				t.Errorf("the lease holder's acknowledgement succeeded on a killed node")
			}
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// fill inserts jobs 1..n into table.
func fill(t testing.TB, db *sql.DB, table string, n int64) {
	t.Helper()
	if err := ledger.Fill(db, table, n, []byte("galera"), nil); err != nil {
		t.Fatal(err)
	}
}

// count returns the rows of table on nd, after nd applied what the cluster
// committed before.
func count(t testing.TB, nd *node, table string) int {
	t.Helper()
	var n int
	if err := nd.reads.QueryRow("SELECT COUNT(*) FROM " + dbName + "." + table).Scan(&n); err != nil {
		t.Fatalf("%s: counting %s: %v", nd.name, table, err)
	}
	return n
}

// victimAcks counts the effect rows written by workers of node name.
func victimAcks(t testing.TB, nd *node, forms []*drainForm, name string) int {
	t.Helper()
	n := 0
	for _, f := range forms {
		var c int
		if err := nd.reads.QueryRow("SELECT COUNT(*) FROM "+dbName+"."+f.effects+" WHERE node = ?", name).Scan(&c); err != nil {
			t.Fatalf("%s: %v", nd.name, err)
		}
		n += c
	}
	return n
}

// checkNode checks, on nd, that f's queue and dead tables are empty and that
// its effects hold exactly one row for each job 1..jobs, and returns a
// digest of the effect rows for comparison across nodes.
func checkNode(t testing.TB, nd *node, f *drainForm, jobs int64) string {
	t.Helper()
	if n := count(t, nd, f.table); n != 0 {
		t.Errorf("%s: %d jobs left in %s", nd.name, n, f.table)
	}
	if n := count(t, nd, f.table+"_dead"); n != 0 {
		t.Errorf("%s: %d jobs in %s_dead", nd.name, n, f.table)
	}
	var rows, distinct, lo, hi int64
	var digest string
	err := nd.reads.QueryRow("SELECT COUNT(*), COUNT(DISTINCT job_id), COALESCE(MIN(job_id), 0), COALESCE(MAX(job_id), 0), "+
		"COALESCE(BIT_XOR(CRC32(CONCAT_WS(':', job_id, attempt, node))), 0) FROM "+dbName+"."+f.effects).Scan(&rows, &distinct, &lo, &hi, &digest)
	if err != nil {
		t.Fatalf("%s: %v", nd.name, err)
	}
	if rows != jobs || distinct != jobs || lo != 1 || hi != jobs {
		t.Errorf("%s: %s effects: %d rows for %d distinct jobs %d..%d; want exactly one for each job 1..%d",
			nd.name, f.form, rows, distinct, lo, hi, jobs)
	}
	return fmt.Sprintf("rows=%d digest=%s", rows, digest)
}

// checkFinal checks that each job's effect row carries the attempt of the
// delivery the ledgers say settled it.
func checkFinal(t testing.TB, nd *node, f *drainForm, r report) {
	t.Helper()
	rows, err := nd.reads.Query("SELECT job_id, attempt FROM " + dbName + "." + f.effects)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	bad := 0
	for rows.Next() {
		var id int64
		var att int
		if err := rows.Scan(&id, &att); err != nil {
			t.Fatal(err)
		}
		if want, ok := r.Final[id]; ok && want != att {
			if bad++; bad <= 10 {
				t.Errorf("%s: job %d's effect row has attempt %d, the ledgers' settling delivery %d", f.form, id, att, want)
			}
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
}

// transfer tells from nd's error log how it last joined, IST (the
// writesets it missed) or SST (a whole copy), and returns the log's lines
// about it.
func transfer(nd *node) (kind, lines string) {
	data, err := os.ReadFile(filepath.Join(nd.dir, "error.log"))
	if err != nil {
		return "?", err.Error()
	}
	log := string(data)
	if i := strings.LastIndex(log, "Starting MariaDB"); i >= 0 {
		log = log[i:]
	}
	var keep []string
	for _, l := range strings.Split(log, "\n") {
		for _, k := range []string{"Recovered position", "Found saved state", "IST receiver", "Prepared IST", "IST received", "SST succeeded",
			"SST request", "State transfer", "Failed to prepare for incremental", "Receiving IST"} {
			if strings.Contains(l, k) {
				keep = append(keep, "  "+l)
				break
			}
		}
	}
	// The joiner asks for the writesets after its position: from 0 when
	// it knows none, which the donor answers with a whole copy first.
	kind = "?"
	if _, rest, ok := strings.Cut(log, "Prepared IST receiver for "); ok {
		from, _, _ := strings.Cut(rest, "-")
		kind = "IST"
		if from == "0" {
			kind = "SST"
		}
	}
	if _, rest, ok := strings.Cut(log, "Receiving IST: "); ok {
		n, _, _ := strings.Cut(rest, " ")
		kind += " of " + n + " writesets"
	}
	return kind, strings.Join(keep, "\n")
}

// leaseOf returns the lease in force of the job held ("id attempt") in
// table, as nd has it.
func leaseOf(t testing.TB, nd *node, table, held string) time.Time {
	t.Helper()
	id, _, _ := strings.Cut(held, " ")
	var until sql.NullTime
	if err := nd.reads.QueryRow("SELECT locked_until FROM "+dbName+"."+table+" WHERE id = ?", id).Scan(&until); err != nil {
		t.Fatalf("%s: the held job %s: %v", nd.name, id, err)
	}
	if !until.Valid {
		t.Fatalf("%s: the held job %s has no lease", nd.name, id)
	}
	return until.Time
}

// checkReclaim checks that the lease job held ("id attempt") on the killed
// node was claimed again only once its lease (until, as the live nodes had
// it at the kill) had run out: the effect row of the delivery that settled
// it carries the expiry its claim wrote, the claim's time plus the lease,
// on the servers' clock.
func checkReclaim(t testing.TB, nd *node, f *drainForm, held string, until time.Time) {
	t.Helper()
	id, att, _ := strings.Cut(held, " ")
	heldAttempt, _ := strconv.Atoi(att)
	var attempt int
	var claimed sql.NullTime
	err := nd.reads.QueryRow("SELECT attempt, claimed_until FROM "+dbName+"."+f.effects+" WHERE job_id = ?", id).Scan(&attempt, &claimed)
	if err != nil {
		t.Fatalf("%s: the effect of the held job %s: %v", nd.name, id, err)
	}
	if attempt <= heldAttempt || !claimed.Valid {
		t.Fatalf("the held lease job %s was settled by attempt %d (claimed until %v), want a later attempt than the holder's %d",
			id, attempt, claimed, heldAttempt)
	}
	at := claimed.Time.Add(-galeraLease)
	if at.Before(until) {
		t.Errorf("the lease job %s held on the killed node was claimed again at %v, %v before its lease ran out at %v",
			id, at.Format("15:04:05.000000"), until.Sub(at), until.Format("15:04:05.000000"))
	}
	t.Logf("FIGURE: galera kill: the lease job held on the killed node (lease until %v) was claimed again %v after its lease ran out, as attempt %d",
		until.Format("15:04:05.000"), at.Sub(until).Round(time.Millisecond), attempt)
}

// settleOn checks that nd, restarted or healed and rejoined, claims and
// settles work again: a job of each form enqueued through the first node is claimed and
// acknowledged through nd alone, and is gone on every node.
func settleOn(t testing.TB, h *harness, nd *node, label string) {
	t.Helper()
	const n = 20
	setup := openDB(t, h.nodes[0].DSN(), 2)
	db := openDB(t, nd.DSN(), 3)
	for _, form := range []string{"lease", "rowlock"} {
		table := fmt.Sprintf("rejoined_%s_%d", form, os.Getpid())
		createQueue(t, setup, table)
		t.Cleanup(func() { _, _ = setup.Exec("DROP TABLE IF EXISTS " + table + ", " + table + "_dead") })
		fill(t, setup, table, n)
		// The table and its rows were written on the first node; a causal
		// read on nd waits until nd has applied them, so the claim below
		// does not race the replication of the CREATE TABLE.
		if got := count(t, nd, table); got != n {
			t.Fatalf("%s: %d of %d %s jobs replicated after the fill", nd.name, got, n, form)
		}
		q, err := inbox.New(db, queueConfig(table, form, galeraLease))
		if err != nil {
			t.Fatal(err)
		}
		settled := 0
		deadline := time.Now().Add(bootWait)
		for settled < n {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d of %d %s jobs settled in %v", nd.name, settled, n, form, bootWait)
			}
			ds, err := q.Claim(context.Background(), 1)
			if err != nil {
				t.Fatalf("%s, rejoined: %s claim: %v", nd.name, form, err)
			}
			for _, d := range ds {
				if err := d.Ack(context.Background()); err != nil {
					t.Fatalf("%s, rejoined: %s ack of job %v: %v", nd.name, form, d.ID(), err)
				}
				settled++
			}
			if len(ds) == 0 {
				time.Sleep(10 * time.Millisecond) // a poll with a deadline: the jobs reach nd by replication
			}
		}
		for _, other := range h.nodes {
			if left := count(t, other, table); left != 0 {
				t.Errorf("%s: %d %s jobs left after %s, rejoined, settled all %d", other.name, left, form, nd.name, n)
			}
		}
	}
	t.Logf("FIGURE: galera %s: %s, rejoined, claimed and acknowledged %d jobs of each form", label, nd.name, n)
}

// splitLease is the lease of the split's queue: long enough for the
// majority's stall while it evicts the isolated node (about 6 s), short
// enough that the held job comes back soon after.
const splitLease = 10 * time.Second

// testSplit cuts one node off from the other two with its own gmcast
// settings (gmcast.isolate=1: it drops its group connections and refuses
// new ones) while a lease job is held there, then heals it:
//
//   - the two others form a primary component without it, and it is
//     non-primary, refusing work;
//   - the holder's keeper, unable to extend, cancels its handler with
//     ErrLeaseLost before the lease runs out, and its Ack fails;
//   - the majority claims the held job only once the lease has run out,
//     and drains the rest;
//   - healed, the node rejoins, and claims and settles work again.
func testSplit(t *testing.T, h *harness) {
	ctx := context.Background()
	first, island := h.nodes[0], h.nodes[2]
	for _, nd := range h.nodes {
		h.waitReady(nd, len(h.nodes))
	}
	const n = 50
	table := fmt.Sprintf("split_lease_%d", os.Getpid())
	setup := openDB(t, first.DSN(), 2)
	createQueue(t, setup, table)
	t.Cleanup(func() { _, _ = setup.Exec("DROP TABLE IF EXISTS " + table + ", " + table + "_dead") })
	fill(t, setup, table, n)
	if got := count(t, island, table); got != n {
		t.Fatalf("%s: %d jobs, want %d", island.name, got, n)
	}
	qi, err := inbox.New(openDB(t, island.DSN(), 3), queueConfig(table, "lease", splitLease))
	if err != nil {
		t.Fatal(err)
	}
	ds, err := qi.Claim(ctx, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("%s: claim: %d jobs, %v", island.name, len(ds), err)
	}
	held := ds[0]
	hctx, stop := held.Keep(ctx)
	defer stop()
	cancelled := make(chan time.Time, 1)
	context.AfterFunc(hctx, func() { cancelled <- time.Now() })

	isolate := func(v int) {
		t.Helper()
		if _, err := island.admin.Exec(fmt.Sprintf("SET GLOBAL wsrep_provider_options = 'gmcast.isolate=%d'", v)); err != nil {
			t.Fatalf("%s: gmcast.isolate=%d: %v", island.name, v, err)
		}
	}
	isolate(1)
	splitAt := time.Now()
	healed := false
	defer func() {
		if !healed {
			_, _ = island.admin.Exec("SET GLOBAL wsrep_provider_options = 'gmcast.isolate=0'")
		}
	}()
	wait := func(what string, f func() error) {
		t.Helper()
		cluster.Poll(t, bootWait, 50*time.Millisecond, what, f)
	}
	wait("the majority to form a primary component of two", func() error { return first.ready(2) })
	viewAt := time.Now()
	wait(island.name+" to be non-primary", func() error {
		st, err := island.status(ctx, "wsrep_cluster_status")
		if err != nil {
			return err
		}
		if st["wsrep_cluster_status"] == "Primary" {
			return errors.New("still primary")
		}
		return nil
	})
	// The lease the majority has for the held job: the holder's last
	// extension that committed.
	until := leaseOf(t, first, table, fmt.Sprintf("%v %d", held.ID(), held.Attempt()))

	// The holder stops before its lease runs out.
	var stoppedAt time.Time
	select {
	case stoppedAt = <-cancelled:
	case <-time.After(splitLease + bootWait):
		t.Fatalf("the holder on %s was not stopped %v into the split", island.name, splitLease+bootWait)
	}
	if cause := context.Cause(hctx); !errors.Is(cause, inbox.ErrLeaseLost) {
		t.Errorf("the isolated holder's handler ended with %v, want ErrLeaseLost", cause)
	}
	if !stoppedAt.Before(until) {
		t.Errorf("the isolated holder was stopped at %v, not before its lease ran out at %v", stoppedAt.UTC().Format("15:04:05.000"), until.Format("15:04:05.000"))
	}
	if err := held.Ack(ctx); err == nil {
		t.Errorf("the isolated holder's Ack succeeded on a non-primary node")
	}

	// The majority drains the table; the held job only after its lease.
	qm, err := inbox.New(openDB(t, first.DSN(), 3), queueConfig(table, "lease", splitLease))
	if err != nil {
		t.Fatal(err)
	}
	var reclaimedAt time.Time
	acked := 0
	wait("the majority to drain the table", func() error {
		ds, err := qm.Claim(ctx, 10)
		if err != nil {
			return err
		}
		for _, d := range ds {
			if d.ID() == held.ID() {
				reclaimedAt = d.Expiry().Add(-splitLease)
				if d.Attempt() <= held.Attempt() {
					t.Errorf("the held job claimed again as attempt %d, the holder's was %d", d.Attempt(), held.Attempt())
				}
			}
			if err := d.Ack(ctx); err != nil {
				return fmt.Errorf("ack of job %v: %w", d.ID(), err)
			}
			acked++
		}
		if acked < n {
			return fmt.Errorf("%d of %d jobs acknowledged", acked, n)
		}
		return nil
	})
	if reclaimedAt.Before(until) {
		t.Errorf("the held job was claimed again by the majority at %v, before its lease ran out at %v",
			reclaimedAt.Format("15:04:05.000"), until.Format("15:04:05.000"))
	}

	// Healed, the node rejoins and works again.
	isolate(0)
	healed = true
	healAt := time.Now()
	h.waitReady(island, len(h.nodes))
	rejoinAt := time.Now()
	if got := count(t, island, table); got != 0 {
		t.Errorf("%s, rejoined: %d jobs left in %s, want 0", island.name, got, table)
	}
	settleOn(t, h, island, "split")
	t.Logf("FIGURE: galera split: %s isolated (gmcast.isolate=1); the others a primary component of two after %v; "+
		"its lease holder stopped %v before the lease ran out; the job claimed again by the majority %v after; %s synced again %v after the heal",
		island.name, viewAt.Sub(splitAt).Round(100*time.Millisecond), until.Sub(stoppedAt).Round(10*time.Millisecond),
		reclaimedAt.Sub(until).Round(10*time.Millisecond), island.name, rejoinAt.Sub(healAt).Round(100*time.Millisecond))
}
