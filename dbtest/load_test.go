package dbtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/dbtest/internal/child"
	"github.com/sqlinbox/inbox/dbtest/internal/ledger"
)

// The load tests drain a table with several worker processes (the test
// binary re-executed, TestMain's INBOX_CHILD=load) of several goroutines
// each, while the harness SIGKILLs workers and starts others. Every worker
// writes a ledger (internal/ledger); the checker then proves from the ledgers
// and the table that no job was lost, that every duplicate delivery was of a
// job in work in a killed process, and that attempts followed the form's
// rule. The same run without kills must show no duplicate at all.
//
// The first kill does not depend on the clock: a run with kills starts with
// one worker alone, told to hold (childConfig.Hold). It handles a few
// jobs, then every handler it starts blocks with its job in work, and the
// first to block says HOLDING on stdout; the harness kills the worker on that
// line, starts the others, and checks from the ledgers that the kill found a
// job in work. A fast machine would otherwise drain the table before a kill
// on a timer was due (SQLite drains 20,000 jobs in under two seconds on two
// cores). Further kills hit a random worker every one to three seconds while
// jobs remain.
//
// Size: INBOX_LOAD_JOBS jobs per run (default 20,000). Drivers: by default one
// per engine family and form, so that CI stays within budget while every
// driver is loaded by some form (PostgreSQL: row lock on pq, lease on pgx,
// advisory on pq; MariaDB: all three; SQLite: lease on modernc, advisory on
// mattn); INBOX_LOAD_DRIVERS=all runs every form on every driver. The run
// without kills drains a quarter as many jobs: it checks that nothing is
// ever delivered twice in the absence of crashes, which needs no bigger
// size to fail, and the budget goes to the runs with kills.

// loadXHoldAfter is how many deliveries the holding worker of a run with
// kills handles in full before its handlers block.
const loadXHoldAfter = 16

// loadXHoldWait is how long the harness waits for the holding worker's
// HOLDING line: generous, as a deadline for a failure, not a duration the
// test expects.
const loadXHoldWait = 2 * time.Minute

// loadXDefaultJobs is the size of a run with kills unless INBOX_LOAD_JOBS
// says otherwise.
const loadXDefaultJobs = 20000

// loadXCIDriver names the driver of each engine family that loads a form
// by default.
var loadXCIDriver = map[string]map[string]string{
	"rowlock":  {"postgres": "pq", "mysql": "mysql"},
	"lease":    {"postgres": "pgx", "mysql": "mysql", "sqlite": "modernc"},
	"advisory": {"postgres": "pq", "mysql": "mysql", "sqlite": "mattn"},
}

// loadXShape is how many worker processes run at once, with how many
// goroutines each, claiming up to how many jobs at a time.
type loadXShape struct{ procs, workers, batch int }

func loadXShapeOf(e Engine, form string) loadXShape {
	s := loadXShape{procs: 3, workers: 4, batch: 1}
	if form == "lease" {
		// A lease claim holds no connection: claim a few at a time.
		s.batch = 8
	}
	if e.IsSQLite() && form == "lease" {
		// SQLite has one writer: every claim, extension and ack of every
		// process queues for the same lock, whose busy handler is not
		// fair, and the lease is computed before the claim waits for it
		// (the caller's clock): a writer starved past the lease would
		// look like a lost lease. Fewer writers keep the waits well under
		// the lease; the lock caps throughput anyway.
		s.workers, s.batch = 2, 4
	}
	if e.IsSQLite() && form == "advisory" {
		// SQLite's advisory keys live in the claiming process, so one
		// process serves a file at a time (the documented rule); the
		// killed worker's successor is the next process.
		s.procs = 1
	}
	return s
}

// childLoad is a load worker: goroutines claim, write the ledger, (row
// lock) write an effect row through the claim's transaction, and ack, until
// stdin closes. A failed Ack ends the process with an error: no worker of
// this load ever loses a job it holds, so that is a failure of the test.
//
// With cfg.Hold > 0 the handler of the Hold-th delivery, and of every later
// one, blocks after its claim line (and effect row) until the process is
// killed, holding its job; the first to block prints "HOLDING id attempt".
func childLoad(cfg childConfig) error {
	db, q, e, err := childQueue(cfg)
	if err != nil {
		return err
	}
	defer db.Close()
	w, err := ledger.Create(cfg.Ledger)
	if err != nil {
		return err
	}
	defer w.Close()
	ctx, cancel := child.StopContext()
	defer cancel()
	var (
		wg        sync.WaitGroup
		fatalMu   sync.Mutex
		fatal     error
		claimErr  atomic.Int64
		leaseLost atomic.Int64
		delivered atomic.Int64 // handlers started, for cfg.Hold
		holding   sync.Once
	)
	fail := func(err error) {
		fatalMu.Lock()
		if fatal == nil {
			fatal = err
		}
		fatalMu.Unlock()
		cancel()
	}
	insert := bind(e, "INSERT INTO "+cfg.Effects+" (job_id, note) VALUES (?, 'load')")
	handle := func(d *inbox.Delivery, stop func()) error {
		id, ok := d.ID().(int64)
		if !ok {
			return fmt.Errorf("job id %v is a %T, want int64", d.ID(), d.ID())
		}
		if err := w.Write(ledger.OpClaim, id, d.Attempt()); err != nil {
			return err
		}
		if tx := d.Tx(); tx != nil {
			if _, err := tx.Exec(insert, id); err != nil {
				return fmt.Errorf("job %d: writing its effect: %w", id, err)
			}
		}
		if n := delivered.Add(1); cfg.Hold > 0 && n >= int64(cfg.Hold) {
			holding.Do(func() { fmt.Printf("HOLDING %d %d\n", id, d.Attempt()) })
			<-ctx.Done()
			return fmt.Errorf("job %d: stdin closed while held for a kill", id)
		}
		if err := w.Write(ledger.OpAck, id, d.Attempt()); err != nil {
			return err
		}
		// The ack must finish even when the process is being stopped.
		err := d.Ack(context.Background())
		if stop != nil {
			stop()
		}
		if err != nil {
			_ = w.Write(ledger.OpAckFail, id, d.Attempt())
			if errors.Is(err, inbox.ErrLeaseLost) && cfg.Hold == 0 {
				// A worker kept from the database past its lease (SQLite's
				// one writer, while processes die and start) is fenced, as
				// designed: the next claim delivers the job again. Counted
				// and bounded by the parent, not fatal.
				leaseLost.Add(1)
				return nil
			}
			return fmt.Errorf("job %d attempt %d: %w", id, d.Attempt(), err)
		}
		return w.Write(ledger.OpAcked, id, d.Attempt())
	}
	for range cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			idle := 5 * time.Millisecond
			for ctx.Err() == nil {
				ds, err := q.Claim(ctx, cfg.Batch)
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					// Claim errors are counted, not fatal: a claim that
					// failed took nothing.
					if claimErr.Add(1) <= 5 {
						fmt.Fprintf(os.Stderr, "CLAIMERR %v\n", err)
					}
					time.Sleep(idle)
					continue
				}
				if len(ds) == 0 {
					time.Sleep(idle)
					idle = min(2*idle, 50*time.Millisecond)
					continue
				}
				idle = 5 * time.Millisecond
				// Every job of the batch is kept from the claim on, not
				// from its turn: a job waiting behind slow acks would
				// otherwise see its lease run out.
				stops := make([]func(), len(ds))
				if cfg.Keep {
					for i, d := range ds {
						_, stops[i] = d.Keep(context.Background())
					}
				}
				for i, d := range ds {
					if err := handle(d, stops[i]); err != nil {
						fail(err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	fmt.Fprintf(os.Stderr, "CLAIMERRS %d\nLEASELOST %d\n", claimErr.Load(), leaseLost.Load())
	return fatal
}

// loadXResult is what one run measured.
type loadXResult struct {
	report      ledger.Report
	kills       int
	procs       int
	claimErrors int
	wall        time.Duration
}

// loadXJobs is the size of a run.
func loadXJobs(t testing.TB) int64 {
	if v := os.Getenv("INBOX_LOAD_JOBS"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			t.Fatalf("INBOX_LOAD_JOBS=%q is not a positive number", v)
		}
		return n
	}
	return loadXDefaultJobs
}

// loadXDSN returns the run's data source: for SQLite, the engine's file
// with synchronous=NORMAL, which under WAL loses nothing when a process dies
// (only a power cut could lose the last commits) and spares a sync per
// commit.
func loadXDSN(t testing.TB, e Engine, dir string) string {
	dsn := e.DSN(t, dir)
	switch e.Name {
	case "mattn":
		dsn += "&_synchronous=NORMAL"
	case "modernc":
		dsn += "&_pragma=synchronous(NORMAL)"
	}
	return dsn
}

// TestLoad drains jobs with killed and restarted worker processes, and
// without kills, for every form on the engines chosen (see above).
func TestLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("the load tests take minutes; -short skips them")
	}
	logWall(t)
	all := os.Getenv("INBOX_LOAD_DRIVERS") == "all"
	jobs := loadXJobs(t)
	for _, form := range []string{"rowlock", "lease", "advisory"} {
		for _, e := range Engines {
			if !supports(e, form) {
				continue
			}
			family := e.Dialect.Name()
			if !all && loadXCIDriver[form][family] != e.Name {
				continue
			}
			t.Run(e.Name+"/"+form, func(t *testing.T) {
				t.Run("kills", func(t *testing.T) { loadXRun(t, e, form, jobs, true) })
				t.Run("nokills", func(t *testing.T) { loadXRun(t, e, form, max(jobs/4, 1), false) })
			})
		}
	}
}

func loadXRun(t *testing.T, e Engine, form string, jobs int64, kill bool) loadXResult {
	start := time.Now()
	dir := t.TempDir()
	dsn := loadXDSN(t, e, dir)
	db := e.OpenDSN(t, dsn, 4)
	suffix := "k"
	if !kill {
		suffix = "n"
	}
	table := fmt.Sprintf("load_%s_%s_%s_%d", e.Name, form, suffix, os.Getpid())
	effects := table + "_fx"
	e.CreateTable(t, db, table)
	t.Cleanup(func() { dropNow(t, db, table, table+"_dead", table+"_claims") })
	if form == "rowlock" {
		for _, s := range effectsTableSQL(e, effects) {
			if _, err := db.Exec(s); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() { dropNow(t, db, effects) })
	}
	switch form {
	case "advisory":
		checkAtEnd(e, table, jobs)
	case "rowlock":
		checkAtEnd(e, table, 0)
	}
	for _, s := range loadXIndexes(e, form, table) {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	if err := ledger.Fill(db, table, jobs, []byte("load"), func(q string) string { return bind(e, q) }); err != nil {
		t.Fatal(err)
	}

	shape := loadXShapeOf(e, form)
	ledgers := t.TempDir()
	var procs []ledger.Proc
	live := map[*childProc]int{} // → index in procs
	startProc := func(hold int) *childProc {
		name := fmt.Sprintf("w%d", len(procs)+1)
		path := filepath.Join(ledgers, name+".ledger")
		p := startChild(t, name, "load", childConfig{Engine: e.Name, DSN: dsn, Table: table, Form: form,
			Lease: realLease, Effects: effects, Ledger: path, Workers: shape.workers, Batch: shape.batch,
			Conns: shape.workers*shape.batch + 1, Keep: form == "lease", Hold: hold})
		live[p] = len(procs)
		procs = append(procs, ledger.Proc{Name: name, Path: path})
		return p
	}
	var claimErrors, leaseLost int
	countClaimErrors := func(p *childProc) {
		for _, l := range strings.Split(p.Stderr(), "\n") {
			if n, ok := strings.CutPrefix(l, "CLAIMERRS "); ok {
				c, _ := strconv.Atoi(n)
				claimErrors += c
			}
			if n, ok := strings.CutPrefix(l, "LEASELOST "); ok {
				c, _ := strconv.Atoi(n)
				leaseLost += c
			}
		}
	}
	kills := 0
	killProc := func(p *childProc) {
		p.Kill()
		procs[live[p]].Killed = true
		countClaimErrors(p)
		delete(live, p)
		kills++
	}
	if kill {
		// The holder runs alone, so that no other worker drains the jobs
		// it is to hold (and, on SQLite's advisory form, because one
		// process serves a file at a time); it is killed before the
		// others start.
		p := startProc(int(min(loadXHoldAfter+1, jobs)))
		if l := p.Line(t, loadXHoldWait); !strings.HasPrefix(l, "HOLDING ") {
			t.Fatalf("%s said %q, want HOLDING id attempt; stderr:\n%s", p.Name, l, p.Stderr())
		}
		killProc(p)
	}
	for len(live) < shape.procs {
		startProc(0)
	}

	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	nextKill := func() time.Time { return time.Now().Add(time.Second + time.Duration(rng.Int64N(int64(2*time.Second)))) }
	killAt := nextKill()
	deadline := time.Now().Add(15 * time.Minute)
	lastLeft, lastProgress := jobs+1, time.Now()
	for {
		left := int64(countWhere(t, e, db, table, ""))
		if left == 0 {
			break
		}
		if left < lastLeft {
			lastLeft, lastProgress = left, time.Now()
		}
		for p := range live {
			select {
			case <-p.Done():
				t.Fatalf("%s exited on its own (%v) with %d jobs left; stderr:\n%s%s", p.Name, p.Err(), left, p.Stderr(), loadXTrail(procs, p.Stderr()))
			default:
			}
		}
		now := time.Now()
		switch {
		case now.After(deadline):
			t.Fatalf("%d of %d jobs left after %v", left, jobs, time.Since(start))
		case now.Sub(lastProgress) > 2*time.Minute:
			t.Fatalf("no job acknowledged for %v, %d left", now.Sub(lastProgress), left)
		}
		if kill && now.After(killAt) {
			victims := make([]*childProc, 0, len(live))
			for p := range live {
				victims = append(victims, p)
			}
			killProc(victims[rng.IntN(len(victims))])
			startProc(0)
			killAt = nextKill()
		}
		time.Sleep(100 * time.Millisecond)
	}
	for p := range live {
		if err := p.Stop(time.Minute); err != nil {
			t.Fatalf("%s: %v; stderr:\n%s", p.Name, err, p.Stderr())
		}
		countClaimErrors(p)
	}
	wall := time.Since(start)

	rule := ledger.SpendAttempt
	if form == "rowlock" {
		rule = ledger.KeepAttempt
	}
	r, err := ledger.Check(procs, jobs, rule)
	if err != nil {
		t.Fatal(err)
	}
	res := loadXResult{report: r, kills: kills, procs: len(procs), claimErrors: claimErrors, wall: wall}
	t.Logf("FIGURE: load %s %s kills=%v: jobs=%d procs=%d(x%d goroutines, claim %d) kills=%d killed_in_work=%d lost=%d duplicates=%d unrecorded_acks=%d attempt_gaps=%d max_attempt=%d ack_failures=%d leases_lost=%d claim_errors=%d wall=%v",
		e.Name, form, kill, jobs, res.procs, shape.workers, shape.batch, kills, r.KilledInWork, r.Lost, r.Duplicates, r.UnrecordedAcks, r.AttemptGaps, r.MaxAttempt, r.AckFails, leaseLost, claimErrors, wall.Round(time.Second))
	if int64(leaseLost)*100 > jobs {
		t.Errorf("%d acknowledgements found their leases lost, more than 1%% of %d jobs", leaseLost, jobs)
	}
	for _, v := range r.Violations {
		t.Error(v)
	}
	if r.Acked+r.UnrecordedAcks != int(jobs) {
		t.Errorf("%d jobs acknowledged (%d of them unrecorded), want %d", r.Acked+r.UnrecordedAcks, r.UnrecordedAcks, jobs)
	}
	if n := countWhere(t, e, db, table+"_dead", ""); n != 0 {
		t.Errorf("%d jobs in the dead table", n)
	}
	if kill {
		// Each killed process may have had at most workers*batch claims
		// committed but not yet written to its ledger.
		if max := kills * shape.workers * shape.batch; r.AttemptGaps > max {
			t.Errorf("%d attempts spent without a recorded delivery, more than the %d that %d kills could explain", r.AttemptGaps, max, kills)
		}
		if kills == 0 {
			t.Error("no process was killed")
		}
		if r.KilledInWork == 0 {
			t.Error("no kill found a job in work: the holding worker was killed with none")
		}
	} else if r.Duplicates != 0 || r.AttemptGaps != 0 || r.UnrecordedAcks != 0 || r.MaxAttempt != 1 {
		t.Errorf("without kills: %d duplicates, %d attempt gaps, %d unrecorded acks, highest attempt %d; want 0, 0, 0, 1",
			r.Duplicates, r.AttemptGaps, r.UnrecordedAcks, r.MaxAttempt)
	}
	if form == "rowlock" {
		// Exactly-once effects: the handler's write committed with each
		// ack and rolled back with every killed holder.
		if n := countWhere(t, e, db, effects, ""); n != int(jobs) {
			t.Errorf("%d effect rows, want exactly %d (one per job)", n, jobs)
		}
		var distinct int
		if err := db.QueryRow("SELECT COUNT(DISTINCT job_id) FROM " + effects).Scan(&distinct); err != nil {
			t.Fatal(err)
		}
		if distinct != int(jobs) {
			t.Errorf("effects for %d distinct jobs, want %d", distinct, jobs)
		}
	}
	if form == "advisory" {
		noKeyLocks(t, e, db, table, jobs)
	}
	if e.IsPostgres() {
		// No session, a killed worker's included, is left in a
		// transaction on this table.
		reg := []hygieneTable{{e, table, 0}}
		eventually(t, 30*time.Second, "no session idle in a transaction on "+table, func() error {
			p, err := pgSessions(context.Background(), db, nil, reg)
			if err == nil && len(p) > 0 {
				err = fmt.Errorf("%s", strings.Join(p, "; "))
			}
			return err
		})
	}
	return res
}

// loadXIndexes are the indexes the README recommends for form, as a user
// following it would create them. Without them the lease claim's read of
// expired rows walks the whole table, holding SQLite's one write lock while
// it does: claims then queue long enough for a lease, computed before the
// wait by the caller's clock, to be born expired.
func loadXIndexes(e Engine, form, table string) []string {
	switch {
	case form != "lease":
		return []string{"CREATE INDEX " + table + "_ready ON " + table + " (not_before, id)"}
	case e.IsPostgres():
		return []string{"CREATE INDEX " + table + "_free ON " + table + " (id) WHERE locked_until IS NULL",
			"CREATE INDEX " + table + "_lu ON " + table + " (locked_until)"}
	}
	return []string{"CREATE INDEX " + table + "_claimable ON " + table + " (locked_until, id)"}
}

// loadXTrail returns, for the job a worker's error names ("job N"), every
// ledger line about it, for the failure message.
func loadXTrail(procs []ledger.Proc, stderr string) string {
	_, rest, ok := strings.Cut(stderr, ": job ")
	if !ok {
		return ""
	}
	id, _, _ := strings.Cut(rest, " ")
	var b strings.Builder
	b.WriteString("ledger lines of job " + id + ":\n")
	for _, p := range procs {
		data, _ := os.ReadFile(p.Path)
		for _, l := range strings.Split(string(data), "\n") {
			if f := strings.Fields(l); len(f) == 3 && f[1] == id {
				b.WriteString("  " + p.Name + ": " + l + "\n")
			}
		}
	}
	return b.String()
}
