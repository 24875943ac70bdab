package dbtest

// The concurrency suite: the promises of every form under several workers,
// two pools on one database, a table named two ways, contexts that end
// mid-call, and a claim asked for too much. Each test names the defect of
// issue 9 it guards against. Tables are conc_<what>_<engine>_<pid>, so that
// two test processes on one server never share one.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/fakeclock"
)

// concName is the table of one test on one engine in this process.
func concName(e Engine, what string) string {
	return fmt.Sprintf("conc_%s_%s_%d", strings.ReplaceAll(what, "-", "_"), e.Name, os.Getpid())
}

// concTable creates the table of one test with its dead and claims tables,
// dropped again when the test passed.
func concTable(t *testing.T, e Engine, db *sql.DB, what string) string {
	t.Helper()
	table := concName(e, what)
	e.CreateTable(t, db, table)
	dropAtEnd(t, e, db, table, table+"_dead", table+"_claims")
	return table
}

// concQualified returns table qualified by the schema (Postgres), database
// (MySQL) or attached database (SQLite) it lives in: another spelling of
// the same table.
func concQualified(t testing.TB, e Engine, db *sql.DB, table string) string {
	t.Helper()
	if e.IsSQLite() {
		return "main." + table
	}
	q := "SELECT current_schema()"
	if e.IsMySQL() {
		q = "SELECT DATABASE()"
	}
	var schema string
	if err := db.QueryRow(q).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	return schema + "." + table
}

// concIDs returns the ids of table's rows, sorted, with their attempts.
func concIDs(t testing.TB, db *sql.DB, table string) map[string]int {
	t.Helper()
	rows, err := db.Query("SELECT id, attempt FROM " + table)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id any
		var attempt int
		if err := rows.Scan(&id, &attempt); err != nil {
			t.Fatal(err)
		}
		out[concKey(id)] = attempt
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// concSnapshot returns the ids and attempts of table's rows and of its dead
// table's, read in one statement and so from one snapshot: a settlement the
// driver gave up on may still commit on the server between two reads, and
// two reads would then see a job in both tables, or in neither.
func concSnapshot(t testing.TB, db *sql.DB, table string) (queue, dead map[string]int) {
	t.Helper()
	rows, err := db.Query("SELECT id, attempt, 0 FROM " + table + " UNION ALL SELECT id, attempt, 1 FROM " + table + "_dead")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	queue, dead = map[string]int{}, map[string]int{}
	for rows.Next() {
		var id any
		var attempt, isDead int
		if err := rows.Scan(&id, &attempt, &isDead); err != nil {
			t.Fatal(err)
		}
		map[bool]map[string]int{false: queue, true: dead}[isDead == 1][concKey(id)] = attempt
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return queue, dead
}

// concKey turns an id as a driver or the queue returned it into text.
func concKey(id any) string {
	if b, ok := id.([]byte); ok {
		return string(b)
	}
	return fmt.Sprint(id)
}

// concFirst returns up to n items of a sorted list, for error messages.
func concFirst(items []string, n int) string {
	sort.Strings(items)
	if len(items) > n {
		return strings.Join(items[:n], ", ") + ", …"
	}
	return strings.Join(items, ", ")
}

// concWorkers runs workers goroutines, spread over qs in turn, that claim up
// to batch jobs each and hand every delivery to handle, which settles it,
// until done reports true. A worker whose claim finds nothing waits for
// another worker's settlement, or polls again after a few milliseconds. It
// returns false when the deadline passed first; a claim error fails t.
func concWorkers(t *testing.T, qs []*inbox.Queue, workers, batch int, deadline time.Duration, done func() bool,
	handle func(ctx context.Context, d *inbox.Delivery)) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	var (
		mu   sync.Mutex
		wake = make(chan struct{})
		wg   sync.WaitGroup
	)
	for w := range workers {
		q := qs[w%len(qs)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && !done() {
				mu.Lock()
				seen := wake
				mu.Unlock()
				ds, err := q.Claim(ctx, batch)
				if err != nil {
					if ctx.Err() == nil {
						t.Errorf("claim: %v", err)
						cancel()
					}
					return
				}
				if len(ds) == 0 {
					select {
					case <-seen:
					case <-time.After(3 * time.Millisecond): // polling, within the deadline
					case <-ctx.Done():
					}
					continue
				}
				for _, d := range ds {
					handle(ctx, d)
				}
				mu.Lock()
				close(wake)
				wake = make(chan struct{})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return done()
}

// concLedger records, for every delivery, the interval in which its handler
// held the job: how many handlers hold each job (and key) right now, and
// every time a second one joined.
type concLedger struct {
	mu         sync.Mutex
	holders    map[string]int // job → handlers holding it now
	keyHolders map[string]int // advisory key → handlers holding it now
	twice      map[string]int // job → times a handler started while another held it
	keyTwice   map[string]int
	delivered  map[string]int
	acked      map[string]int
	attempts   []string // deliveries at an attempt other than 1
	errs       []string // settlements that failed
}

func newConcLedger() *concLedger {
	return &concLedger{holders: map[string]int{}, keyHolders: map[string]int{}, twice: map[string]int{},
		keyTwice: map[string]int{}, delivered: map[string]int{}, acked: map[string]int{}}
}

// start records that a handler took d (key "" when jobs have no shared key).
func (l *concLedger) start(d *inbox.Delivery, key string) {
	id := concKey(d.ID())
	l.mu.Lock()
	defer l.mu.Unlock()
	l.delivered[id]++
	if d.Attempt() != 1 {
		l.attempts = append(l.attempts, fmt.Sprintf("%s@%d", id, d.Attempt()))
	}
	if l.holders[id]++; l.holders[id] > 1 {
		l.twice[id]++
	}
	if key != "" {
		if l.keyHolders[key]++; l.keyHolders[key] > 1 {
			l.keyTwice[key]++
		}
	}
}

// done records that the handler of d finished its work and is about to
// settle: the settlement lets the key go before it returns, so that another
// job of the key may start before the Ack returns, but not before this.
func (l *concLedger) done(key string) {
	if key == "" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.keyHolders[key]--
}

// end records that the handler of d let it go, with its Ack's result: the
// job is gone then, so no other handler may have started it before.
func (l *concLedger) end(d *inbox.Delivery, ackErr error) {
	id := concKey(d.ID())
	l.mu.Lock()
	defer l.mu.Unlock()
	l.holders[id]--
	if ackErr == nil {
		l.acked[id]++
	} else {
		l.errs = append(l.errs, fmt.Sprintf("job %s: %v", id, ackErr))
	}
}

func (l *concLedger) ackedJobs() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acked)
}

// check fails t for every broken promise among want's jobs.
func (l *concLedger) check(t *testing.T, want map[string]bool) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var twice, keyTwice, notOnce, notAcked, stranger []string
	for id := range l.twice {
		twice = append(twice, id)
	}
	for k, n := range l.keyTwice {
		keyTwice = append(keyTwice, fmt.Sprintf("%s (%d times)", k, n))
	}
	for id := range want {
		if l.delivered[id] != 1 {
			notOnce = append(notOnce, fmt.Sprintf("%s×%d", id, l.delivered[id]))
		}
		if l.acked[id] != 1 {
			notAcked = append(notAcked, fmt.Sprintf("%s×%d", id, l.acked[id]))
		}
	}
	for id := range l.delivered {
		if !want[id] {
			stranger = append(stranger, id)
		}
	}
	if len(twice) > 0 {
		t.Errorf("%d of %d jobs held by two handlers at once: %s", len(twice), len(want), concFirst(twice, 10))
	}
	if len(keyTwice) > 0 {
		t.Errorf("%d keys held by two handlers at once: %s", len(keyTwice), concFirst(keyTwice, 10))
	}
	if len(notOnce) > 0 {
		t.Errorf("%d of %d jobs not delivered exactly once: %s", len(notOnce), len(want), concFirst(notOnce, 10))
	}
	if len(notAcked) > 0 {
		t.Errorf("%d of %d jobs not acked exactly once: %s", len(notAcked), len(want), concFirst(notAcked, 10))
	}
	if len(l.attempts) > 0 {
		t.Errorf("%d deliveries at an attempt other than 1 (no job failed): %s", len(l.attempts), concFirst(l.attempts, 10))
	}
	if len(stranger) > 0 {
		t.Errorf("delivered %d jobs never enqueued: %s", len(stranger), concFirst(stranger, 10))
	}
	if len(l.errs) > 0 {
		t.Errorf("%d acks failed: %s", len(l.errs), concFirst(l.errs, 5))
	}
}

// concFill enqueues n jobs, job i with key k = i mod keys, in one
// transaction, and returns their ids.
func concFill(t *testing.T, e Engine, db *sql.DB, table string, n, keys int) map[string]bool {
	t.Helper()
	eq := keyedQueue(t, db, e, table)
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for i := range n {
		id, err := eq.Enqueue(ctx, tx, inbox.Job{Data: []any{[]byte("job-" + strconv.Itoa(i)), "K" + strconv.Itoa(i%keys)}})
		if err != nil {
			t.Fatal(err)
		}
		want[concKey(id)] = true
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if len(want) != n {
		t.Fatalf("enqueue returned %d distinct ids for %d jobs", len(want), n)
	}
	return want
}

// TestConcDrainTwoPools (issue 9, defect 2): every form (and the shallow
// lease, Table.Shallow) is drained by eight
// workers over two *sql.DB pools on one database (one file for SQLite), one
// naming the table plainly and the other schema-qualified. No job may be
// held by two handlers at once, nor (advisory-k) a key; each job is
// delivered once, at attempt 1, and acked once; nothing is left or dead.
func TestConcDrainTwoPools(t *testing.T) {
	withShallow := func(e Engine) []string { return append(formsWithKey(e), "lease-shallow") }
	eachForm(t, withShallow, func(t *testing.T, e Engine, form string) {
		jobs := 400
		if e.IsSQLite() {
			jobs = 300
			if raceBuild() {
				jobs = 150 // SQLite under -race is slow; the defect showed on nearly every job
			}
		}
		concDrainTwoPools(t, e, form, jobs, false, 0)
	})
}

// TestPreparedDrainTwoPools is TestConcDrainTwoPools with Config.Prepare:
// statements prepared by two pools, one naming the table plainly and the
// other by its qualified name, each job acked once.
func TestPreparedDrainTwoPools(t *testing.T) { concDrainEveryForm(t, true, 0) }

// TestConcDrainClaimsAtOnce is TestConcDrainTwoPools with
// Config.ClaimsAtOnce 2 on each pool's queue: eight workers, two claiming at
// once per queue, the others waiting their turn; each job acked once.
func TestConcDrainClaimsAtOnce(t *testing.T) { concDrainEveryForm(t, false, 2) }

// concDrainEveryForm runs concDrainTwoPools on every form, the advisory one
// keyed too, with 200 jobs (100 on SQLite under -race).
func concDrainEveryForm(t *testing.T, prepare bool, claimsAtOnce int) {
	eachForm(t, formsWithKey, func(t *testing.T, e Engine, form string) {
		jobs := 200
		if e.IsSQLite() && raceBuild() {
			jobs = 100
		}
		concDrainTwoPools(t, e, form, jobs, prepare, claimsAtOnce)
	})
}

// concDrainTwoPools drains jobs with eight workers over two pools, each
// queue with Config.Prepare as prepare says and claimsAtOnce as its
// Config.ClaimsAtOnce.
func concDrainTwoPools(t *testing.T, e Engine, form string, jobs int, prepare bool, claimsAtOnce int) {
	const (
		workers = 8 // four per pool
		keys    = 20
		conns   = 7
	)
	db1, db2 := openTwo(t, e, conns)
	what := "two_" + form
	if prepare {
		what = "two_prep_" + form
	}
	if claimsAtOnce > 0 {
		what = "two_turns_" + form
	}
	table := concTable(t, e, db1, what)
	qualified := concQualified(t, e, db1, table)
	cfg1, cfg2 := queueConfig(e, Table(table, form), nil), queueConfig(e, Table(qualified, form), nil)
	cfg1.Prepare, cfg2.Prepare = prepare, prepare
	cfg1.ClaimsAtOnce, cfg2.ClaimsAtOnce = claimsAtOnce, claimsAtOnce
	q1 := newQueue(t, db1, cfg1)
	q2 := newQueue(t, db2, cfg2)
	want := concFill(t, e, db1, table, jobs, keys)

	l := newConcLedger()
	batch := 5
	if !strings.HasPrefix(form, "lease") {
		batch = 2 // each job holds a connection
	}
	keyed := form == "advisory-k"
	var work atomic.Int64
	ok := concWorkers(t, []*inbox.Queue{q1, q2}, workers, batch, 2*time.Minute,
		func() bool { return l.ackedJobs() >= jobs },
		func(ctx context.Context, d *inbox.Delivery) {
			key := ""
			if keyed {
				key = d.Key()
			}
			l.start(d, key)
			// The handler works a moment (a statement of its own, on
			// either pool), so that other claims run while it holds the
			// job.
			var one int
			db := db1
			if work.Add(1)%2 == 0 {
				db = db2
			}
			if err := db.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil && ctx.Err() == nil {
				t.Errorf("handler's statement: %v", err)
			}
			l.done(key)
			l.end(d, d.Ack(context.WithoutCancel(ctx)))
		})
	if !ok {
		t.Errorf("workers stalled: %d of %d jobs acked in two minutes; left: %d", l.ackedJobs(), jobs, countRows(t, db1, table))
	}
	l.check(t, want)
	if n := countRows(t, db1, table); n != 0 {
		t.Errorf("%d jobs left in the table", n)
	}
	if n := countRows(t, db1, table+"_dead"); n != 0 {
		t.Errorf("%d jobs in the dead table", n)
	}
	idleSoon(t, db1, q1)
	idleSoon(t, db2, q2)
	if strings.HasPrefix(form, "advisory") && !e.IsSQLite() {
		var lockKeys []string
		if keyed {
			for i := range keys {
				lockKeys = append(lockKeys, "K"+strconv.Itoa(i))
			}
		} else {
			for id := range want {
				lockKeys = append(lockKeys, id)
			}
		}
		noLocks(t, e, db1, table, lockKeys)
	}
}

// TestConcClaimsNoFalseDead (issue 9, defect 1): with the row-lock claims
// counter, eight workers over two pools that always Ack at once drain 500
// jobs: none is dead-lettered, each is acked once, and no count is left.
func TestConcClaimsNoFalseDead(t *testing.T) {
	eachForm(t, rowlockOnly, func(t *testing.T, e Engine, _ string) {
		const (
			workers = 8
			jobs    = 500
		)
		db1, db2 := openTwo(t, e, 6)
		table := concTable(t, e, db1, "claims_drain")
		q1 := newQueue(t, db1, queueConfig(e, Table(table, "rowlock-claims"), nil))
		q2 := newQueue(t, db2, queueConfig(e, Table(concQualified(t, e, db1, table), "rowlock-claims"), nil))
		want := concFill(t, e, db1, table, jobs, 1)
		l := newConcLedger()
		ok := concWorkers(t, []*inbox.Queue{q1, q2}, workers, 1, 2*time.Minute,
			func() bool {
				// Dead-lettered jobs are never acked: stop once none is left.
				n, err := concRows(db1, table)
				return l.ackedJobs() >= jobs || err == nil && n == 0
			},
			func(ctx context.Context, d *inbox.Delivery) {
				l.start(d, "")
				l.end(d, d.Ack(context.WithoutCancel(ctx)))
			})
		if !ok {
			t.Errorf("workers stalled: %d of %d jobs acked in two minutes", l.ackedJobs(), jobs)
		}
		if dead := dumpRows(t, db1, table+"_dead"); len(dead) > 0 {
			t.Errorf("%d of %d jobs dead-lettered by the claims counter though every delivery was acked at once (MaxClaims %d): %s",
				len(dead), jobs, ClaimsLimit, concFirst(dead, 3))
		}
		l.check(t, want)
		if n := countRows(t, db1, table); n != 0 {
			t.Errorf("%d jobs left in the table", n)
		}
		var counted int
		if err := db1.QueryRow("SELECT COUNT(*) FROM " + table + "_claims WHERE claims > 0").Scan(&counted); err != nil {
			t.Fatal(err)
		}
		if counted != 0 {
			t.Errorf("%d claim counts left for jobs whose deliveries were all acked", counted)
		}
		idleSoon(t, db1, q1)
		idleSoon(t, db2, q2)
	})
}

// TestConcClaimsReleaseStorm (issue 9, defect 1): twelve workers over two
// pools claim one job and Release it, hundreds of times: a delivery that
// settled counts for nothing, so the job is never dead-lettered, its
// attempt stays 1 and its count ends at 0.
func TestConcClaimsReleaseStorm(t *testing.T) {
	eachForm(t, rowlockOnly, func(t *testing.T, e Engine, _ string) {
		const workers = 12
		rounds := int64(300)
		if raceBuild() {
			rounds = 150
		}
		db1, db2 := openTwo(t, e, 8)
		table := concTable(t, e, db1, "claims_storm")
		q1 := newQueue(t, db1, queueConfig(e, Table(table, "rowlock-claims"), nil))
		q2 := newQueue(t, db2, queueConfig(e, Table(concQualified(t, e, db1, table), "rowlock-claims"), nil))
		id := concKey(enqueueOne(t, q1, db1, "hot"))
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var (
			released atomic.Int64
			wg       sync.WaitGroup
			mu       sync.Mutex
			problems []string
		)
		fail := func(p string) {
			mu.Lock()
			problems = append(problems, p)
			mu.Unlock()
			cancel()
		}
		for w := range workers {
			q, db := q1, db1
			if w%2 == 1 {
				q, db = q2, db2
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil && released.Load() < rounds {
					ds, err := q.Claim(ctx, 1)
					if err != nil {
						if ctx.Err() == nil {
							fail("claim: " + err.Error())
						}
						return
					}
					if len(ds) == 0 {
						// Held by another worker, or gone: look.
						var n int
						if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+table).Scan(&n); err != nil {
							if ctx.Err() == nil {
								fail(err.Error())
							}
							return
						}
						if n == 0 {
							fail(fmt.Sprintf("the job left the queue after %d released deliveries", released.Load()))
							return
						}
						continue
					}
					d := ds[0]
					if concKey(d.ID()) != id || d.Attempt() != 1 {
						fail(fmt.Sprintf("delivered %v attempt %d, want %s attempt 1", d.ID(), d.Attempt(), id))
					}
					if err := d.Release(context.Background()); err != nil {
						fail("release: " + err.Error())
						return
					}
					released.Add(1)
				}
			}()
		}
		wg.Wait()
		for _, p := range problems {
			t.Error(p)
		}
		if dead := dumpRows(t, db1, table+"_dead"); len(dead) > 0 {
			t.Errorf("the job was dead-lettered after %d deliveries, all released (MaxClaims %d): %q", released.Load(), ClaimsLimit, dead)
		}
		if t.Failed() {
			return
		}
		if released.Load() < rounds {
			t.Fatalf("%d of %d rounds in two minutes", released.Load(), rounds)
		}
		if a := attemptOf(t, e, db1, table, id); a != 1 {
			t.Errorf("attempt %d after releases alone, want 1", a)
		}
		if c := claimsCounted(t, e, db1, table, id); c != 0 {
			t.Errorf("%d claims counted after %d released deliveries, want 0", c, released.Load())
		}
		d := claimOne(t, q1)
		if err := d.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
		idleSoon(t, db1, q1)
		idleSoon(t, db2, q2)
		t.Logf("FIGURE: %d claim/release rounds by %d workers on two pools", released.Load(), workers)
	})
}

// TestConcClaimsCrash (issue 9, defect 1): a job whose holder is killed
// (SIGKILL, a child process) while it holds the row lock comes back at
// attempt 1, its count up by one each time. After MaxClaims such kills it
// is still delivered; only after MaxClaims+1 does the next claim move it to
// the dead table instead, at attempt 1, and clear its count.
func TestConcClaimsCrash(t *testing.T) {
	logWall(t)
	eachEngine(t, notSQLite, func(t *testing.T, e Engine) {
		ctx := context.Background()
		dsn := e.DSN(t, "")
		db := e.OpenDSN(t, dsn, 4)
		table := concName(e, "claims_crash")
		effects := concName(e, "claims_fx")
		e.CreateTable(t, db, table)
		for _, s := range effectsTableSQL(e, effects) {
			mustExec(t, e, db, s)
		}
		t.Cleanup(func() { dropNow(t, db, table, table+"_dead", table+"_claims", effects) })
		checkAtEnd(e, table, 0)
		checkAtEnd(e, effects, 0)
		q := newQueue(t, db, queueConfig(e, Table(table, "rowlock-claims"), nil))
		id := concKey(enqueueOne(t, q, db, "poison"))

		// reclaim waits for the killed child's session to end, then claims:
		// the job, released again (a settled delivery counts for nothing),
		// or nothing once the job is in the dead table.
		reclaim := func(after int) *inbox.Delivery {
			t.Helper()
			deadline := time.Now().Add(30 * time.Second)
			for {
				ds, err := q.Claim(ctx, 1)
				if err != nil {
					t.Fatal(err)
				}
				if len(ds) == 1 {
					return ds[0]
				}
				if countRows(t, db, table+"_dead") > 0 {
					return nil
				}
				if time.Now().After(deadline) {
					t.Fatalf("after kill %d: the job neither came back nor went to the dead table in 30s", after)
				}
				time.Sleep(5 * time.Millisecond) // polling for the server to end the session, with a deadline
			}
		}
		for kill := 1; kill <= ClaimsLimit+1; kill++ {
			child := startChild(t, fmt.Sprintf("child %d", kill), "crash", childConfig{Engine: e.Name, DSN: dsn, Table: table,
				Form: "rowlock-claims", Effects: effects, Conns: 3})
			f := strings.Fields(child.Line(t, 2*time.Minute))
			if len(f) != 4 || f[0] != "CLAIMED" {
				t.Fatalf("child %d said %q, want CLAIMED id attempt session", kill, f)
			}
			if f[1] != id || f[2] != "1" {
				t.Fatalf("child %d claimed job %s attempt %s, want job %s attempt 1", kill, f[1], f[2], id)
			}
			child.Kill()
			if c := claimsCounted(t, e, db, table, id); c != kill {
				t.Errorf("after kill %d the job counts %d claims, want %d", kill, c, kill)
			}
			d := reclaim(kill)
			if kill <= ClaimsLimit {
				if d == nil {
					t.Fatalf("after %d unsettled deliveries (MaxClaims %d) the job went to the dead table: %q",
						kill, ClaimsLimit, dumpRows(t, db, table+"_dead"))
				}
				if concKey(d.ID()) != id || d.Attempt() != 1 {
					t.Fatalf("after kill %d: delivered %v attempt %d, want %s attempt 1", kill, d.ID(), d.Attempt(), id)
				}
				if err := d.Release(ctx); err != nil {
					t.Fatal(err)
				}
				if c := claimsCounted(t, e, db, table, id); c != kill {
					t.Errorf("after kill %d and a released delivery the job counts %d claims, want %d", kill, c, kill)
				}
				continue
			}
			if d != nil {
				_ = d.Release(ctx)
				t.Fatalf("after %d unsettled deliveries (MaxClaims %d) the job was delivered again (attempt %d)", kill, ClaimsLimit, d.Attempt())
			}
		}
		if n := countRows(t, db, table); n != 0 {
			t.Errorf("%d rows left in the queue", n)
		}
		dead := dumpRows(t, db, table+"_dead")
		if len(dead) != 1 || !strings.HasPrefix(dead[0], "id="+id+" ") || !strings.Contains(dead[0], "attempt=1 ") {
			t.Errorf("dead table %q, want job %s at attempt 1", dead, id)
		}
		if c := claimsCounted(t, e, db, table, id); c != 0 {
			t.Errorf("the dead job still counts %d claims", c)
		}
		if n := countRows(t, db, effects); n != 0 {
			t.Errorf("%d writes of killed holders survived", n)
		}
		mustBeIdle(t, db, q)
	})
}

// TestConcAdvisoryStarvation (issue 9, defect 3): a claimable job is found
// whatever waits ahead of it.
func TestConcAdvisoryStarvation(t *testing.T) {
	ctx := context.Background()
	// busy-key: 30 jobs of a key held by another delivery, then a job of
	// another key: Claim(1) returns that job.
	t.Run("busy-key", func(t *testing.T) {
		eachForm(t, advisoryK, func(t *testing.T, e Engine, form string) {
			db1, db2 := openTwo(t, e, 4)
			table := concTable(t, e, db1, "starve_key")
			tb := Table(table, form)
			q := newQueue(t, db1, queueConfig(e, tb, nil))
			other := newQueue(t, db2, queueConfig(e, tb, nil))
			eq := keyedQueue(t, db1, e, table)
			first := enqueueKey(t, eq, db1, "busy-0", "busy")
			for i := 1; i < 30; i++ {
				enqueueKey(t, eq, db1, "busy-"+strconv.Itoa(i), "busy")
			}
			free := enqueueKey(t, eq, db1, "free", "free")
			ds, err := other.Claim(ctx, 1)
			if err != nil || len(ds) != 1 || ds[0].ID() != first {
				t.Fatalf("the other pool claimed %d jobs, %v; want job %v", len(ds), err, first)
			}
			held := ds[0]
			got, err := q.Claim(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0].ID() != free {
				var ids []any
				for _, d := range got {
					ids = append(ids, d.ID())
					_ = d.Release(ctx)
				}
				_ = held.Release(ctx)
				t.Fatalf("with 30 jobs of a held key ahead, Claim(1) returned %v, want job %v of key \"free\"", ids, free)
			}
			for _, d := range []*inbox.Delivery{got[0], held} {
				if err := d.Ack(ctx); err != nil {
					t.Fatal(err)
				}
			}
			mustBeIdle(t, db1, q)
			mustBeIdle(t, db2, other)
		})
	})
	// held-head: another pool holds the 12 head jobs (key on id): Claim(1)
	// returns one of the other 18, and repeated Claim(1)s get all 18.
	t.Run("held-head", func(t *testing.T) {
		eachForm(t, advisoryID, func(t *testing.T, e Engine, form string) {
			dsn := e.DSN(t, t.TempDir())
			db1, db2 := e.OpenDSN(t, dsn, 20), e.OpenDSN(t, dsn, 14)
			table := concTable(t, e, db1, "starve_head")
			tb := Table(table, form)
			q := newQueue(t, db1, queueConfig(e, tb, nil))
			other := newQueue(t, db2, queueConfig(e, tb, nil))
			var ids []string
			for i := range 30 {
				ids = append(ids, concKey(enqueueOne(t, q, db1, "j"+strconv.Itoa(i))))
			}
			head, err := other.Claim(ctx, 12)
			if err != nil || len(head) != 12 {
				t.Fatalf("the other pool claimed %d jobs, %v; want 12", len(head), err)
			}
			all := append([]*inbox.Delivery(nil), head...)
			defer func() {
				for _, d := range all {
					_ = d.Release(ctx)
				}
			}()
			headIDs := map[string]bool{}
			for i, d := range head {
				if concKey(d.ID()) != ids[i] {
					t.Fatalf("the other pool's claim %d got job %v, want the head job %s", i, d.ID(), ids[i])
				}
				headIDs[ids[i]] = true
			}
			seen := map[string]bool{}
			for i := range 18 {
				ds, err := q.Claim(ctx, 1)
				if err != nil {
					t.Fatal(err)
				}
				if len(ds) != 1 {
					t.Fatalf("claim %d: %d jobs while %d are claimable behind the 12 held ones", i+1, len(ds), 18-i)
				}
				all = append(all, ds[0])
				id := concKey(ds[0].ID())
				if headIDs[id] || seen[id] {
					t.Fatalf("claim %d: job %s, which is held already", i+1, id)
				}
				seen[id] = true
			}
			claimNone(t, q, "every job held")
			for _, d := range all {
				if err := d.Ack(ctx); err != nil {
					t.Fatal(err)
				}
			}
			all = nil
			if n := countRows(t, db1, table); n != 0 {
				t.Errorf("%d jobs left", n)
			}
			mustBeIdle(t, db1, q)
			mustBeIdle(t, db2, other)
		})
	})
}

// concLockWaiting reports whether a session of the server waits for a row
// lock in a statement naming table.
func concLockWaiting(t testing.TB, e Engine, db *sql.DB, table string) bool {
	t.Helper()
	var n int
	var err error
	if e.IsPostgres() {
		err = db.QueryRow("SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND position($1 in query) > 0", table).Scan(&n)
	} else {
		// MariaDB serves INNODB_TRX from a cache it refreshes only when its
		// last read is over 100 ms old, which a poll (or another test's)
		// can keep from ever happening: a statement naming the table that
		// has run for a second or more waits too (a claim takes
		// milliseconds), as PROCESSLIST, read live, tells. A statement
		// with arguments runs as 'Execute' (prepared, by Config.Prepare or
		// by the driver itself without interpolateParams), others as 'Query'.
		err = db.QueryRow("SELECT (SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT' AND LOCATE(?, trx_query) > 0)"+
			" + (SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE COMMAND IN ('Query', 'Execute') AND TIME >= 1 AND ID <> CONNECTION_ID() AND LOCATE(?, INFO) > 0)",
			table, table).Scan(&n)
	}
	if err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// TestConcTxSettlements (issue 9, defect 4): every settlement inside the
// caller's transaction means the same on every engine, committed or rolled
// back. RetryTx(1h) then Commit: no claim gets the job, not even one that
// ran while the caller's transaction was still open.
func TestConcTxSettlements(t *testing.T) {
	forms := func(Engine) []string { return []string{"lease", "advisory"} }
	eachForm(t, forms, func(t *testing.T, e Engine, form string) {
		db1, db2 := openTwo(t, e, 4)
		table := concTable(t, e, db1, "tx_"+form)
		clock := fakeclock.New(clockStart)
		tb := Table(table, form)
		q := newQueue(t, db1, queueConfig(e, tb, clock))
		other := newQueue(t, db2, queueConfig(e, tb, clock))
		ctx := context.Background()
		lease := form == "lease"

		// row returns the job's attempt, or 0 when it is gone, and whether
		// the dead table holds it (and at which attempt).
		row := func(id any) (attempt, deadAttempt int) {
			t.Helper()
			ids, dead := concSnapshot(t, db1, table)
			return ids[concKey(id)], dead[concKey(id)]
		}
		claimable := func(id any, attempt int) {
			t.Helper()
			d := claimOne(t, other)
			if d.ID() != id || d.Attempt() != attempt {
				t.Fatalf("the other pool claimed %v attempt %d, want %v attempt %d", d.ID(), d.Attempt(), id, attempt)
			}
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}

		t.Run("retry-1h", func(t *testing.T) {
			emptyTables(t, db1, table)
			id := enqueueOne(t, q, db1, "retry")
			d := claimOne(t, q)
			tx, err := db1.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			if err := d.RetryTx(ctx, tx, time.Hour); err != nil {
				t.Fatal(err)
			}
			if !e.IsSQLite() {
				// A claim while the caller's transaction is open: it may pass
				// the row over or wait for its lock, and must not deliver the
				// job once the transaction commits.
				type result struct {
					ds  []*inbox.Delivery
					err error
				}
				res := make(chan result, 1)
				go func() {
					ds, err := other.Claim(ctx, 1)
					res <- result{ds, err}
				}()
				var r result
				received := false
				deadline := time.Now().Add(30 * time.Second)
			wait:
				for {
					select {
					case r = <-res:
						received = true
						break wait
					case <-time.After(10 * time.Millisecond): // polling the server's lock waits, with a deadline
					}
					if concLockWaiting(t, e, db1, table) {
						t.Logf("the concurrent claim waits for the row lock of the caller's transaction")
						break wait
					}
					if time.Now().After(deadline) {
						t.Fatal("the concurrent claim neither returned nor waited for a lock in 30s")
					}
				}
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
				if !received {
					r = <-res
				}
				if r.err != nil {
					t.Fatal(r.err)
				}
				if len(r.ds) != 0 {
					for _, d := range r.ds {
						_ = d.Release(ctx)
					}
					t.Fatalf("a claim that ran while RetryTx(1h)'s transaction was open delivered job %v (attempt %d) once it committed",
						r.ds[0].ID(), r.ds[0].Attempt())
				}
			} else if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			// Confirmed: the delivery is settled (an advisory one lets its
			// lock go).
			if err := d.Committed(tx); err != nil {
				t.Fatal(err)
			}
			claimNone(t, other, "a job retried for an hour, committed")
			claimNone(t, q, "a job retried for an hour, committed")
			if a, _ := row(id); a != 2 {
				t.Fatalf("stored attempt %d after RetryTx, want 2", a)
			}
			clock.Advance(time.Hour)
			claimable(id, 2)
		})

		type txCase struct {
			op     string
			commit bool
		}
		var cases []txCase
		for _, op := range []string{"AckTx", "ReleaseTx", "DeadTx", "RetryTx-0"} {
			cases = append(cases, txCase{op, true}, txCase{op, false})
		}
		for _, c := range cases {
			name := c.op + map[bool]string{true: "-commit", false: "-rollback"}[c.commit]
			t.Run(name, func(t *testing.T) {
				emptyTables(t, db1, table)
				id := enqueueOne(t, q, db1, name)
				d := claimOne(t, q)
				tx, err := db1.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback()
				switch c.op {
				case "AckTx":
					err = d.AckTx(ctx, tx)
				case "ReleaseTx":
					err = d.ReleaseTx(ctx, tx)
				case "DeadTx":
					err = d.DeadTx(ctx, tx)
				case "RetryTx-0":
					err = d.RetryTx(ctx, tx, 0)
				}
				if err != nil {
					t.Fatalf("%s: %v", c.op, err)
				}
				if c.commit {
					err = tx.Commit()
				} else {
					err = tx.Rollback()
				}
				if err != nil {
					t.Fatal(err)
				}
				attempt, dead := row(id)
				// An advisory RetryTx(0) writes nothing: it settles at once,
				// whatever becomes of the transaction.
				atOnce := c.op == "RetryTx-0" && !lease
				if !c.commit && !atOnce {
					// As if the settlement never ran: the claim's attempt is
					// spent, and the job is still the delivery's (issue 21,
					// item 4), which may settle it again.
					if attempt != 2 || dead != 0 {
						t.Fatalf("after %s: attempt %d, dead %d; want the job at attempt 2, not dead", name, attempt, dead)
					}
					claimNone(t, other, "a job held by a delivery whose settlement rolled back")
					if err := d.Release(ctx); err != nil {
						t.Fatalf("release after %s: %v", name, err)
					}
					claimable(id, 1)
					mustBeIdle(t, db1, q)
					mustBeIdle(t, db2, other)
					return
				}
				// Committed, not confirmed: the next settlement learns it
				// from the row. (An advisory RetryTx(0) writes nothing: it
				// settled at once.)
				if err := d.Ack(ctx); !errors.Is(err, inbox.ErrSettled) {
					t.Errorf("ack after %s: %v, want ErrSettled", name, err)
				}
				switch {
				case c.op == "AckTx":
					if attempt != 0 || dead != 0 {
						t.Fatalf("after %s: attempt %d, dead %d; want the job gone", name, attempt, dead)
					}
				case c.op == "ReleaseTx":
					if attempt != 1 || dead != 0 {
						t.Fatalf("after %s: attempt %d, dead %d; want the job back at attempt 1", name, attempt, dead)
					}
					claimable(id, 1)
				case c.op == "DeadTx":
					if attempt != 0 || dead != 1 {
						t.Fatalf("after %s: attempt %d, dead at attempt %d; want the job in the dead table at attempt 1", name, attempt, dead)
					}
				case c.op == "RetryTx-0":
					if attempt != 2 || dead != 0 {
						t.Fatalf("after %s: attempt %d, dead %d; want the job back at attempt 2", name, attempt, dead)
					}
					claimable(id, 2)
				}
				mustBeIdle(t, db1, q)
				mustBeIdle(t, db2, other)
				if !lease && !e.IsSQLite() {
					noLocks(t, e, db1, table, []string{concKey(id)})
				}
			})
		}
	})
}

// TestConcAdvisoryUnlockFails (issue 9, defect 5): an advisory settlement
// that committed returns nil even when letting the lock go fails (the
// caller's context ends between the statement and the unlock); settling
// again returns ErrSettled, and the lock is not left held.
func TestConcAdvisoryUnlockFails(t *testing.T) {
	eachForm(t, func(e Engine) []string {
		if e.IsSQLite() {
			return nil // no session locks to let go
		}
		return advisoryID(e)
	}, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, 4)
		table := concTable(t, e, db, "unlock")
		tb := Table(table, form)
		for _, op := range []string{"Ack", "Retry", "Release", "Dead"} {
			t.Run(op, func(t *testing.T) {
				emptyTables(t, db, table)
				h := &hookDialect{Dialect: e.Dialect}
				h.locker, _ = e.Dialect.(dialect.Locker)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				var armed atomic.Bool
				var unlocks atomic.Int32
				h.beforeUnlock = func(context.Context) {
					if armed.Load() {
						unlocks.Add(1)
						cancel()
					}
				}
				cfg := queueConfig(e, tb, nil)
				cfg.Dialect = h
				q := newQueue(t, db, cfg)
				id := enqueueOne(t, q, db, op)
				d := claimOne(t, q)
				if n := locksHeld(t, e, db, table, []string{concKey(id)}); n != 1 {
					t.Fatalf("%d locks held for the claimed job, want 1", n)
				}
				armed.Store(true)
				var err error
				switch op {
				case "Ack":
					err = d.Ack(ctx)
				case "Retry":
					err = d.Retry(ctx, 0)
				case "Release":
					err = d.Release(ctx)
				case "Dead":
					err = d.Dead(ctx)
				}
				if unlocks.Load() == 0 {
					t.Fatalf("%s never let the lock go through the dialect", op)
				}
				if err != nil {
					t.Errorf("%s that committed, its context cancelled before the unlock: %v, want nil", op, err)
				}
				attempt, dead := concIDs(t, db, table)[concKey(id)], concIDs(t, db, table+"_dead")[concKey(id)]
				want := map[string][2]int{"Ack": {0, 0}, "Retry": {2, 0}, "Release": {1, 0}, "Dead": {0, 1}}[op]
				if attempt != want[0] || dead != want[1] {
					t.Errorf("after %s: attempt %d, dead at attempt %d; want %d and %d", op, attempt, dead, want[0], want[1])
				}
				if err := d.Ack(context.Background()); !errors.Is(err, inbox.ErrSettled) {
					t.Errorf("ack after %s: %v, want ErrSettled", op, err)
				}
				idleSoon(t, db, q)
				noPoolLocks(t, e, db, table, []string{concKey(id)})
				if op == "Retry" || op == "Release" {
					// The job is free for every session again.
					other := newQueue(t, e.Open(t, 3), queueConfig(e, tb, nil))
					deadline := time.Now().Add(10 * time.Second)
					for {
						ds, err := other.Claim(context.Background(), 1)
						if err != nil {
							t.Fatal(err)
						}
						if len(ds) == 1 {
							if err := ds[0].Ack(context.Background()); err != nil {
								t.Fatal(err)
							}
							break
						}
						if time.Now().After(deadline) {
							t.Fatalf("after %s the job was not claimable from another pool for 10s", op)
						}
						time.Sleep(5 * time.Millisecond) // polling for a discarded session to end, with a deadline
					}
				}
			})
		}
	})
}

// concCancelled waits up to a generous deadline for kctx to end and checks
// that its cause is ErrLeaseLost.
func concCancelled(t testing.TB, kctx context.Context, what string) {
	t.Helper()
	select {
	case <-kctx.Done():
	case <-time.After(15 * time.Second):
		t.Fatalf("%s: the handler's context still live at the last known expiry less the margin", what)
	}
	if cause := context.Cause(kctx); !errors.Is(cause, inbox.ErrLeaseLost) {
		t.Fatalf("%s: the handler's context ended with cause %v, want ErrLeaseLost", what, cause)
	}
}

// TestConcKeeperFencing (issue 9, defect 6): when nobody extends a lease
// any more and no verdict is known, the handler's context is cancelled with
// ErrLeaseLost by the last known expiry less the margin, before another
// worker may claim attempt 2: after Queue.Shutdown, and after a settlement
// that failed without a verdict (its context cancelled before or during the
// call).
func TestConcKeeperFencing(t *testing.T) {
	eachForm(t, leaseOnly, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, 4)
		table := concTable(t, e, db, "fence")
		clock := fakeclock.New(clockStart)
		tb := Table(table, form)
		ctx := context.Background()
		const (
			lease  = time.Minute
			margin = lease / 10 // the default margin
		)
		other := newQueue(t, db, queueConfig(e, tb, clock))

		// claimKept claims the job with a keeper and returns the delivery,
		// the handler's context, its stop function, and the moment the
		// keeper gives up: the claim's expiry less the margin.
		claimKept := func(t *testing.T, q *inbox.Queue) (*inbox.Delivery, context.Context, func(), time.Time) {
			t.Helper()
			d := claimOne(t, q)
			giveUp := clock.Now().Add(lease - margin)
			if !d.Expiry().Equal(clock.Now().Add(lease).Truncate(time.Microsecond)) {
				t.Fatalf("delivery expiry %v, want the claim's time plus the lease", d.Expiry())
			}
			n := clock.Afters()
			kctx, stop := d.Keep(ctx)
			clock.WaitAfters(t, n+1)
			return d, kctx, stop, giveUp
		}
		// takeOver advances the clock past the expiry and has another worker
		// claim attempt 2; the first handler must already have stopped.
		// A statement the failed settlement sent may still run on the
		// server, holding the row or deleting it: the take-over waits for
		// it, up to a deadline.
		takeOver := func(t *testing.T, kctx context.Context, id any) {
			t.Helper()
			clock.Advance(margin)
			if kctx.Err() == nil {
				t.Fatal("the handler's context is live at the expiry")
			}
			deadline := time.Now().Add(10 * time.Second)
			for {
				ds, err := other.Claim(ctx, 1)
				if err != nil {
					t.Fatal(err)
				}
				if len(ds) == 1 {
					d := ds[0]
					if d.ID() != id || d.Attempt() != 2 {
						t.Fatalf("after the expiry another worker claimed %v attempt %d, want %v attempt 2", d.ID(), d.Attempt(), id)
					}
					if err := d.Ack(ctx); err != nil {
						t.Fatal(err)
					}
					return
				}
				if countRows(t, db, table) == 0 {
					return // the failed Ack's statement committed after all
				}
				if time.Now().After(deadline) {
					t.Fatal("after the expiry no other worker could claim the job for 10s")
				}
				time.Sleep(5 * time.Millisecond) // polling for the failed settlement's statement to end, with a deadline
			}
		}

		t.Run("shutdown", func(t *testing.T) {
			emptyTables(t, db, table)
			q := newQueue(t, db, queueConfig(e, tb, clock))
			id := enqueueOne(t, q, db, "shutdown")
			d, kctx, stop, giveUp := claimKept(t, q)
			defer stop()
			if err := q.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			if kctx.Err() != nil {
				t.Fatalf("Shutdown ended the handler's context at once (%v): the job keeps its lease and may still settle", context.Cause(kctx))
			}
			clock.Advance(giveUp.Sub(clock.Now()))
			concCancelled(t, kctx, "after Shutdown")
			if got := lockedUntilOf(t, e, db, table, id); !got.Equal(d.Expiry()) {
				t.Errorf("the lease moved to %v after Shutdown, want %v: the keeper extends no more", got, d.Expiry())
			}
			takeOver(t, kctx, id)
			if err := d.Ack(ctx); !errors.Is(err, inbox.ErrLeaseLost) {
				t.Errorf("the first holder's ack after the take-over: %v, want ErrLeaseLost", err)
			}
			mustBeIdle(t, db, q, other)
		})

		t.Run("cancelled-before", func(t *testing.T) {
			emptyTables(t, db, table)
			q := newQueue(t, db, queueConfig(e, tb, clock))
			id := enqueueOne(t, q, db, "cancelled")
			d, kctx, stop, giveUp := claimKept(t, q)
			defer stop()
			cctx, cancel := context.WithCancel(ctx)
			cancel()
			if err := d.Ack(cctx); err == nil || errors.Is(err, inbox.ErrLeaseLost) || errors.Is(err, inbox.ErrSettled) {
				t.Fatalf("ack under a cancelled context: %v, want the context's error", err)
			}
			clock.Advance(giveUp.Sub(clock.Now()))
			concCancelled(t, kctx, "after an ack under a cancelled context")
			takeOver(t, kctx, id)
			stop()
			mustBeIdle(t, db, q, other)
		})

		t.Run("cancelled-during", func(t *testing.T) {
			// Cancel at each step of the Ack in turn, until one succeeds.
			failures := 0
			for n := 1; ; n++ {
				if n > 500 {
					t.Fatal("the ack still asked its context after 500 checks")
				}
				emptyTables(t, db, table)
				q := newQueue(t, db, queueConfig(e, tb, clock))
				id := enqueueOne(t, q, db, "during")
				d, kctx, stop, giveUp := claimKept(t, q)
				cctx := newCountdownCtx(n)
				err := d.Ack(cctx)
				if err == nil {
					stop()
					if countRows(t, db, table) != 0 {
						t.Fatal("ack returned nil and the job is still there")
					}
					break
				}
				if errors.Is(err, inbox.ErrLeaseLost) || errors.Is(err, inbox.ErrSettled) {
					t.Fatalf("step %d: ack: %v, a verdict the countdown cannot cause", n, err)
				}
				failures++
				clock.Advance(giveUp.Sub(clock.Now()))
				concCancelled(t, kctx, fmt.Sprintf("step %d: after an ack that failed (%v)", n, err))
				if countRows(t, db, table) == 1 {
					takeOver(t, kctx, id)
				} else {
					clock.Advance(margin) // the ack committed before it failed
				}
				stop()
				idleSoon(t, db, q, other)
			}
			if failures == 0 {
				t.Fatal("no step of the ack noticed its cancellation")
			}
			t.Logf("%d cancellation points", failures)
		})
	})
}

// TestConcSettleStorm (issue 9, defects 5 and 6, and connection leaks):
// sixteen goroutines (eight on SQLite under -race) over two pools settle deliveries of every form (Ack,
// Retry, Release, Dead at random) under contexts that end 0–300 µs into the
// call, then settle again without a deadline where the first failed.
// Afterwards every job is in exactly one consistent state (gone, dead, or
// claimable at a sane attempt), none is held, and no connection is leaked.
func TestConcSettleStorm(t *testing.T) {
	eachForm(t, formsWithKey, func(t *testing.T, e Engine, form string) {
		workers, jobs, rounds := 16, 80, 20
		switch {
		case e.IsSQLite() && raceBuild():
			// modernc.org/sqlite is C translated to Go: slow under -race,
			// and one writer at a time serialises the rest.
			workers, jobs, rounds = 8, 30, 8
		case raceBuild():
			jobs, rounds = 60, 12
		}
		db1, db2 := openTwo(t, e, 8)
		table := concTable(t, e, db1, "storm_"+form)
		tb := Table(table, form)
		// The real clock: a settlement the driver gave up on may still run
		// on the server after the job's next claim, and only a clock that
		// moves gives that claim another token (a new expiry). The lease is
		// short so that leases a failed settlement left run out soon; the
		// keepers extend the others.
		cfg := queueConfig(e, tb, nil)
		const lease = 5 * time.Second
		if form == "lease" {
			cfg.Lease = lease
		}
		q1, q2 := newQueue(t, db1, cfg), newQueue(t, db2, cfg)
		want := concFill(t, e, db1, table, jobs, 7)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()

		var (
			mu         sync.Mutex
			deliveries = map[string]int{}    // claims that delivered the job
			last       = map[string]string{} // the settlement of the job's latest delivery, if it took effect
			lastSeq    = map[string]int{}    // which delivery last is of
			ambiguous  = map[string]bool{}   // a settlement failed, and its retry found it settled
			problems   []string
			settled    atomic.Int64
			badConns   atomic.Int64 // claims, counts and settlements that found only broken connections
			wg         sync.WaitGroup
		)
		problem := func(f string, args ...any) {
			mu.Lock()
			problems = append(problems, fmt.Sprintf(f, args...))
			mu.Unlock()
		}
		ops := []string{"ack", "retry", "release", "dead"}
		began := time.Now()
		settle := func(d *inbox.Delivery, op string, sctx context.Context) error {
			switch op {
			case "ack":
				return d.Ack(sctx)
			case "retry":
				return d.Retry(sctx, 0)
			case "release":
				return d.Release(sctx)
			}
			return d.Dead(sctx)
		}
		for w := range workers {
			q := []*inbox.Queue{q1, q2}[w%2]
			wg.Add(1)
			go func() {
				defer wg.Done()
				for r := 0; r < rounds && ctx.Err() == nil; {
					ds, err := q.Claim(ctx, 1)
					if errors.Is(err, driver.ErrBadConn) {
						// Connections that cancelled statements broke go back to
						// the pool, to be found out at their next use; under this
						// much pressure database/sql can run out of its three
						// tries for a good one. The claim took nothing: again
						// (a claim that never succeeds ends at the deadline).
						badConns.Add(1)
						continue
					}
					if err != nil {
						if ctx.Err() == nil {
							problem("claim: %v", err)
						}
						return
					}
					if len(ds) == 0 {
						n, err := concRows(db1, table)
						if errors.Is(err, driver.ErrBadConn) {
							badConns.Add(1)
							continue
						}
						if err != nil || n == 0 {
							if err != nil {
								problem("counting jobs: %v", err)
							}
							return
						}
						select {
						case <-time.After(time.Millisecond): // polling, within the deadline
						case <-ctx.Done():
						}
						continue
					}
					r++
					d := ds[0]
					id := concKey(d.ID())
					// A job's deliveries follow one another, so their numbers
					// order their settlements too.
					mu.Lock()
					deliveries[id]++
					seq := deliveries[id]
					mu.Unlock()
					_, stop := d.Keep(ctx)
					op := ops[rand.IntN(len(ops))]
					sctx, scancel := context.WithTimeout(context.Background(), rand.N(300*time.Microsecond))
					deadline, _ := sctx.Deadline()
					err = settle(d, op, sctx)
					// A dial or read may time out by the deadline a moment
					// before the context's own timer fires.
					ended := sctx.Err() != nil || !time.Now().Before(deadline)
					scancel()
					effect := err == nil
					if err != nil {
						switch {
						case errors.Is(err, driver.ErrBadConn):
							// database/sql ran out of tries for a good connection
							// (see the claim above): no verdict, as for a timeout.
							badConns.Add(1)
						case !ended:
							problem("%s of job %s failed under a live context: %v", op, id, err)
						}
						err2 := settle(d, op, context.Background())
						switch {
						case err2 == nil:
							effect = true
						case errors.Is(err2, inbox.ErrSettled), errors.Is(err2, inbox.ErrLeaseLost):
							mu.Lock()
							ambiguous[id] = true
							mu.Unlock()
						default:
							problem("%s of job %s again, without a deadline: %v (first: %v)", op, id, err2, err)
						}
					}
					stop()
					mu.Lock()
					if seq > lastSeq[id] {
						lastSeq[id] = seq
						last[id] = map[bool]string{true: op, false: ""}[effect]
						if !effect {
							ambiguous[id] = true
						}
					}
					mu.Unlock()
					settled.Add(1)
				}
			}()
		}
		wg.Wait()
		if ctx.Err() != nil {
			t.Errorf("the storm did not end in two minutes (%d settlements)", settled.Load())
		}
		for _, p := range problems {
			t.Error(p)
		}

		// Nothing is held and no connection leaked.
		idleSoon(t, db1, q1)
		idleSoon(t, db2, q2)

		rows, dead := concSnapshot(t, db1, table)
		mu.Lock()
		defer mu.Unlock()
		var bad []string
		for id := range want {
			a, inQueue := rows[id]
			da, isDead := dead[id]
			switch {
			case inQueue && isDead:
				bad = append(bad, id+": in the queue and in the dead table")
			case inQueue && (a < 1 || a > 1+deliveries[id]):
				bad = append(bad, fmt.Sprintf("%s: attempt %d after %d deliveries", id, a, deliveries[id]))
			case isDead && (da < 1 || da > deliveries[id]):
				bad = append(bad, fmt.Sprintf("%s: dead at attempt %d after %d deliveries", id, da, deliveries[id]))
			case ambiguous[id] || last[id] == "" && lastSeq[id] > 0:
				// A settlement may or may not have taken effect: any one state.
			case last[id] == "ack" && (inQueue || isDead):
				bad = append(bad, id+": acked, yet still there")
			case last[id] == "dead" && !isDead:
				bad = append(bad, id+": dead-lettered, yet not in the dead table")
			case (last[id] == "retry" || last[id] == "release") && !inQueue:
				bad = append(bad, id+": given back ("+last[id]+"), yet gone")
			case lastSeq[id] == 0 && !inQueue:
				bad = append(bad, id+": never delivered, yet gone")
			}
		}
		if len(bad) > 0 {
			t.Errorf("%d of %d jobs in an inconsistent state: %s", len(bad), jobs, concFirst(bad, 10))
		}

		// Every job left comes back to a fresh pool: once leases run out
		// (lease), at once (row lock, advisory).
		stormed := time.Since(began)
		fresh := e.OpenDSN(t, concDSN(t, e, db1), 4)
		fq := newQueue(t, fresh, cfg)
		// The loop ends when the queue is empty, not after len(rows) claims:
		// a settlement given up on may still land after the snapshot.
		got := 0
		deadline := time.Now().Add(lease + 30*time.Second)
		for {
			ds, err := fq.Claim(context.Background(), 3)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range ds {
				if err := d.Ack(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			got += len(ds)
			if len(ds) > 0 {
				continue
			}
			left, _ := concSnapshot(t, db1, table)
			if len(left) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d jobs could not be claimed for 30s (%d claimed again): held forever%s", len(left), got,
					concHolders(t, e, db1, table, form, left))
			}
			time.Sleep(5 * time.Millisecond) // polling for discarded sessions to end, with a deadline
		}
		mustBeIdle(t, fresh, fq)
		t.Logf("FIGURE: %d settlements in %v, %d jobs left (all claimed again in %v), %d dead, %d ambiguous, %d statements that found only broken connections",
			settled.Load(), stormed.Round(time.Millisecond), len(rows), (time.Since(began) - stormed).Round(time.Millisecond), len(dead), len(ambiguous), badConns.Load())
	})
}

// concHolders describes, for an error message, who holds the advisory locks
// of the jobs in rows (Postgres, MySQL): which session, in which state,
// after which statement.
func concHolders(t testing.TB, e Engine, db *sql.DB, table, form string, rows map[string]int) string {
	t.Helper()
	if e.IsSQLite() || !strings.HasPrefix(form, "advisory") {
		return ""
	}
	keys := map[string]bool{}
	if form == "advisory-k" {
		rs, err := db.Query("SELECT k FROM " + table)
		if err != nil {
			return "; " + err.Error()
		}
		defer rs.Close()
		for rs.Next() {
			var k string
			if err := rs.Scan(&k); err != nil {
				return "; " + err.Error()
			}
			keys[k] = true
		}
	} else {
		for id := range rows {
			keys[id] = true
		}
	}
	var list []string
	for k := range keys {
		list = append(list, k)
	}
	var b strings.Builder
	for _, pid := range lockHolders(t, e, db, table, list) {
		var state, query, started string
		var err error
		if e.IsPostgres() {
			err = db.QueryRow("SELECT coalesce(state, ''), left(coalesce(query, ''), 200), backend_start::text FROM pg_stat_activity WHERE pid = $1", pid).
				Scan(&state, &query, &started)
		} else {
			err = db.QueryRow("SELECT coalesce(STATE, ''), left(coalesce(INFO, ''), 200), CONCAT(TIME, 's') FROM information_schema.PROCESSLIST WHERE ID = ?", pid).
				Scan(&state, &query, &started)
		}
		fmt.Fprintf(&b, "; session %d holds a lock: state %q, since %s, last statement %q (%v)", pid, state, started, query, err)
	}
	if b.Len() == 0 {
		return "; no session holds their advisory locks"
	}
	return b.String()
}

// concRows counts the rows of table, for goroutines that must not stop the
// test.
func concRows(db *sql.DB, table string) (int, error) {
	var n int
	err := db.QueryRow("SELECT COUNT(*) FROM " + table).Scan(&n)
	return n, err
}

// concDSN returns a DSN for the database of db, a pool of e: for SQLite,
// its file.
func concDSN(t testing.TB, e Engine, db *sql.DB) string {
	t.Helper()
	if !e.IsSQLite() {
		return e.DSN(t, "")
	}
	var file string
	if err := db.QueryRow("SELECT file FROM pragma_database_list WHERE name = 'main'").Scan(&file); err != nil {
		t.Fatal(err)
	}
	return e.DSN(t, filepath.Dir(file))
}

// concClaim claims, turning a panic into an error for the test to report.
func concClaim(q *inbox.Queue, max int) (ds []*inbox.Delivery, err error, panicked any) {
	defer func() { panicked = recover() }()
	ds, err = q.Claim(context.Background(), max)
	return ds, err, nil
}

// TestConcClaimTooMany (issue 9, defect 8): Claim(math.MaxInt) and
// Claim(MaxClaim+1) return an error before any I/O and change nothing; the
// database stays writable (SQLite: no write lock left behind) and a claim
// of MaxClaim works.
func TestConcClaimTooMany(t *testing.T) {
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, 4)
		table := concTable(t, e, db, "toomany_"+form)
		q := newQueue(t, db, queueConfig(e, Table(table, form), nil))
		for i := range 3 {
			enqueueOne(t, q, db, "m"+strconv.Itoa(i))
		}
		before := dumpRows(t, db, table)
		for _, max := range []int{math.MaxInt, inbox.MaxClaim + 1} {
			ds, err, panicked := concClaim(q, max)
			if panicked != nil {
				t.Errorf("Claim(%d) panicked: %v", max, panicked)
			} else if err == nil || len(ds) != 0 {
				t.Errorf("Claim(%d): %d deliveries, %v; want an error", max, len(ds), err)
			}
			sameRows(t, fmt.Sprintf("Claim(%d)", max), before, dumpRows(t, db, table))
			mustBeIdle(t, db, q)
		}
		// Still writable, and still claimable.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte("after")}}); err != nil {
			t.Fatalf("enqueue after the refused claims: %v", err)
		}
		ds, err := q.Claim(ctx, inbox.MaxClaim)
		if err != nil {
			t.Fatalf("Claim(MaxClaim): %v", err)
		}
		// Forms that hold a connection per job leave the pool's last free.
		holds := form == "rowlock" || (form == "advisory" && !e.IsSQLite())
		if want := map[bool]int{true: 3, false: 4}[holds]; len(ds) != want {
			t.Errorf("Claim(MaxClaim) got %d jobs, want %d", len(ds), want)
		}
		for _, d := range ds {
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
		mustBeIdle(t, db, q)
	})
}

// TestConcIDsNeverReused (issue 9, defect 11): with the documented schemas
// a new job never takes the id of a deleted one, even the highest, on any
// engine; and SQLite's schema check refuses an id that would.
func TestConcIDsNeverReused(t *testing.T) {
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, 4)
		table := concTable(t, e, db, "ids_"+form)
		q := newQueue(t, db, queueConfig(e, Table(table, form), nil))
		ctx := context.Background()
		seen := map[string]bool{}
		enqueue := func(p string) string {
			t.Helper()
			id := concKey(enqueueOne(t, q, db, p))
			if seen[id] {
				t.Fatalf("job %q got id %s, which an earlier job had", p, id)
			}
			seen[id] = true
			return id
		}
		for i := range 3 {
			enqueue("first-" + strconv.Itoa(i))
		}
		// Ack the highest id, then every job: no later job takes an id.
		ds, err := q.Claim(ctx, 3)
		if err != nil || len(ds) != 3 {
			t.Fatalf("claimed %d, %v; want 3", len(ds), err)
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i].ID().(int64) > ds[j].ID().(int64) })
		if err := ds[0].Ack(ctx); err != nil {
			t.Fatal(err)
		}
		enqueue("after-highest")
		for _, d := range ds[1:] {
			if err := d.Dead(ctx); err != nil {
				t.Fatal(err)
			}
		}
		for {
			ds, err := q.Claim(ctx, 3)
			if err != nil {
				t.Fatal(err)
			}
			if len(ds) == 0 {
				break
			}
			for _, d := range ds {
				if err := d.Ack(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
		enqueue("after-all")
		mustBeIdle(t, db, q)
		if !e.IsSQLite() || form != "lease" {
			return
		}
		if err := q.CheckSchema(ctx); err != nil {
			t.Errorf("the documented SQLite schema: %v", err)
		}
		reuse := concName(e, "ids_reuse")
		mustExec(t, e, db, "CREATE TABLE "+reuse+" (id INTEGER PRIMARY KEY, attempt INTEGER NOT NULL DEFAULT 1, locked_until TEXT, payload BLOB NOT NULL)")
		rtb := Table(reuse, "lease")
		rtb.DeadTable = ""
		ps := problemsOf(t, checkUnchanged(t, e, db, newQueue(t, db, queueConfig(e, rtb, nil)), reuse))
		hasProblem(t, ps, reuse, "AUTOINCREMENT")
	})
}
