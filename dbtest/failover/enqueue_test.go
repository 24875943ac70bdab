package failover

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/dbtest/internal/cluster"
	"github.com/sqlinbox/inbox/internal/optin"
)

// TestFailoverEnqueue enqueues and acknowledges flat out on the primary up
// to the moment it is SIGKILLed, promotes the standby, and compares the new
// primary with what the clients were told, once with a synchronous standby
// and once with an asynchronous one:
//
//   - an acknowledged enqueue (Enqueue returned its id) is lost when its job
//     is neither on the new primary nor was acknowledged by a worker (or
//     being acknowledged at the kill);
//   - an acknowledged Ack is undone when its job is back on the new primary.
//
// With synchronous_commit=on and the standby in synchronous_standby_names,
// the primary reports a commit only once the standby has it: the test
// asserts that nothing is lost or undone. With an asynchronous standby the
// last commits before the kill may never have left the primary: the
// package promises nothing there that PostgreSQL does not, so the test
// reports what was lost (and how many were acknowledged in the last 100 ms
// before the kill) and asserts only that the new primary's queue drains,
// each job it holds delivered and acknowledged.
func TestFailoverEnqueue(t *testing.T) {
	optin.Require(t, "the failover suite (a PostgreSQL primary and standby of its own)")
	if testing.Short() {
		t.Skip("the failover suite starts two PostgreSQL servers; -short skips it")
	}
	bin := requirePostgres(t)
	for _, kind := range []struct {
		name string
		sync bool
	}{{"sync", true}, {"async", false}} {
		t.Run(kind.name, func(t *testing.T) { enqueueFailover(t, bin, kind.sync) })
	}
}

const (
	// enqWorkers and enqProducers are goroutines claiming and acking, and
	// enqueueing; enqBefore and ackBefore are how many enqueues and Acks
	// are acknowledged before the kill comes.
	enqWorkers, enqProducers = 4, 4
	enqBefore, ackBefore     = 4000, 1000
	// enqLease is long enough for a claim's Acks on a loaded machine, and
	// what the drain on the new primary waits for the jobs claimed at the
	// kill.
	enqLease = 10 * time.Second
)

// stamp is a job id and when the client was told of its commit.
type stamp struct {
	id int64
	at time.Time
}

func enqueueFailover(t *testing.T, bin pgBinaries, synchronous bool) {
	c := startCluster(t, bin, synchronous)
	admin := c.primary.open(t)
	const table = "fo_enqueue"
	for _, s := range []string{
		"CREATE TABLE " + table + " (id bigserial PRIMARY KEY, attempt integer NOT NULL DEFAULT 1, locked_until timestamptz, payload bytea NOT NULL)",
		"CREATE TABLE " + table + "_dead (id bigint PRIMARY KEY, attempt integer NOT NULL, payload bytea NOT NULL)",
		"CREATE INDEX " + table + "_free ON " + table + " (id) WHERE locked_until IS NULL",
		"CREATE INDEX " + table + "_lu ON " + table + " (locked_until)",
	} {
		if _, err := admin.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	cfg := inbox.Config{Dialect: inbox.Postgres, Lease: enqLease,
		Table: inbox.Table{Name: table, LockedUntil: "locked_until", DeadTable: table + "_dead"}}
	db, err := sql.Open("pgx", c.primary.dsn())
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(enqWorkers + enqProducers + 1)
	db.SetMaxIdleConns(enqWorkers + enqProducers + 1)
	t.Cleanup(func() { db.Close() })
	q, err := inbox.New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}

	var (
		killing              atomic.Bool
		enqueued, acked      atomic.Int64
		wg                   sync.WaitGroup
		mu                   sync.Mutex
		enqStamps, ackStamps []stamp
		inFlight             []int64 // jobs whose Ack failed at the kill: it may have committed
		fatal                error
	)
	fail := func(err error) {
		mu.Lock()
		if fatal == nil {
			fatal = err
		}
		mu.Unlock()
	}
	keep := func(into *[]stamp, mine []stamp) {
		mu.Lock()
		*into = append(*into, mine...)
		mu.Unlock()
	}
	ctx := context.Background()
	// Each goroutine runs until a statement fails: after the kill every
	// one does (the server's sockets are gone); before it, any failure
	// fails the test.
	for range enqProducers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []stamp
			defer func() { keep(&enqStamps, mine) }()
			for {
				id, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte("job")}})
				if err != nil {
					if !killing.Load() {
						fail(fmt.Errorf("enqueue before the kill: %w", err))
					}
					return
				}
				mine = append(mine, stamp{id.(int64), time.Now()})
				enqueued.Add(1)
			}
		}()
	}
	for range enqWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []stamp
			defer func() { keep(&ackStamps, mine) }()
			for {
				ds, err := q.Claim(ctx, 8)
				if err != nil {
					if !killing.Load() {
						fail(fmt.Errorf("claim before the kill: %w", err))
					}
					return
				}
				for _, d := range ds {
					if err := d.Ack(ctx); err != nil {
						if !killing.Load() {
							fail(fmt.Errorf("ack of job %v before the kill: %w", d.ID(), err))
						}
						mu.Lock()
						inFlight = append(inFlight, d.ID().(int64))
						mu.Unlock()
						return
					}
					mine = append(mine, stamp{d.ID().(int64), time.Now()})
					acked.Add(1)
				}
				if len(ds) == 0 {
					time.Sleep(time.Millisecond) // the worker's idle back-off
				}
			}
		}()
	}
	stopped := make(chan struct{})
	go func() { wg.Wait(); close(stopped) }()
	cluster.Eventually(t, serverWait, "enqueues and acks to be under way", func() error {
		mu.Lock()
		err := fatal
		mu.Unlock()
		if err != nil {
			killing.Store(true) // the goroutines stop at their next failure
			t.Fatal(err)
		}
		if e, a := enqueued.Load(), acked.Load(); e < enqBefore || a < ackBefore {
			return fmt.Errorf("%d enqueues and %d acks acknowledged so far", e, a)
		}
		return nil
	})
	if err := c.checkSync(admin); err != nil {
		t.Fatalf("just before the kill: %v", err)
	}
	killing.Store(true)
	killAt := time.Now()
	if err := c.primary.crash(); err != nil {
		t.Fatalf("killing the primary: %v", err)
	}
	select {
	case <-stopped:
	case <-time.After(serverWait):
		t.Fatalf("the enqueuers and workers still ran %v after the kill", serverWait)
	}
	if fatal != nil {
		t.Fatal(fatal)
	}
	sdb := c.standby.open(t)
	if err := c.promote(sdb); err != nil {
		t.Fatalf("promoting the standby: %v", err)
	}

	present := map[int64]bool{}
	rows, err := sdb.Query("SELECT id FROM " + table)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		present[id] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	ackedAt := map[int64]time.Time{}
	for _, s := range ackStamps {
		ackedAt[s.id] = s.at
	}
	for _, id := range inFlight {
		ackedAt[id] = killAt // its Ack may have committed, its answer lost
	}
	var lost, undone []stamp
	for _, s := range enqStamps {
		if _, ok := ackedAt[s.id]; !ok && !present[s.id] {
			lost = append(lost, s)
		}
	}
	for _, s := range ackStamps {
		if present[s.id] {
			undone = append(undone, s)
		}
	}
	recent := func(ss []stamp) int {
		n := 0
		for _, s := range ss {
			if killAt.Sub(s.at) <= 100*time.Millisecond {
				n++
			}
		}
		return n
	}
	oldest := func(ss []stamp) time.Duration {
		var d time.Duration
		for _, s := range ss {
			d = max(d, killAt.Sub(s.at))
		}
		return d
	}
	kind := "async"
	if synchronous {
		kind = "sync"
	}
	t.Logf("FIGURE: failover enqueue %s: acknowledged before the kill: %d enqueues (%d in its last 100 ms), %d acks (%d in its last 100 ms); "+
		"lost enqueues %d (%d acknowledged in the last 100 ms, the oldest %v before the kill); undone acks %d (%d in the last 100 ms, the oldest %v before)",
		kind, len(enqStamps), recent(enqStamps), len(ackStamps), recent(ackStamps),
		len(lost), recent(lost), oldest(lost).Round(time.Millisecond), len(undone), recent(undone), oldest(undone).Round(time.Millisecond))
	if synchronous && (len(lost) != 0 || len(undone) != 0) {
		sort.Slice(lost, func(i, j int) bool { return lost[i].id < lost[j].id })
		t.Errorf("synchronous standby: %d acknowledged enqueues lost (first %v), %d acknowledged acks undone; want none",
			len(lost), ids(lost, 10), len(undone))
	}

	// The new primary's queue drains: each job it holds delivered once
	// (the ones claimed at the kill when their leases run out) and acked.
	pool, err := sql.Open("pgx", c.standby.dsn())
	if err != nil {
		t.Fatal(err)
	}
	pool.SetMaxOpenConns(4)
	t.Cleanup(func() { pool.Close() })
	q2, err := inbox.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	delivered := map[int64]int{}
	cluster.Eventually(t, enqLease+failStall, "the new primary's queue to drain", func() error {
		ds, err := q2.Claim(ctx, 100)
		if err != nil {
			return err
		}
		for _, d := range ds {
			delivered[d.ID().(int64)]++
			if err := d.Ack(ctx); err != nil {
				t.Fatalf("ack of job %v on the new primary: %v", d.ID(), err)
			}
		}
		if n := count(t, pool, table); n != 0 {
			return fmt.Errorf("%d jobs left", n)
		}
		return nil
	})
	var twice []string
	for id, n := range delivered {
		if n != 1 {
			twice = append(twice, fmt.Sprintf("%d×%d", id, n))
		}
		if !present[id] {
			t.Errorf("job %d delivered on the new primary, where it was not after the promotion", id)
		}
	}
	if len(delivered) != len(present) || len(twice) != 0 {
		t.Errorf("the new primary held %d jobs; %d delivered, these more than once: %v", len(present), len(delivered), twice)
	}
}

// ids lists the first n ids of ss.
func ids(ss []stamp, n int) string {
	var out []string
	for _, s := range ss[:min(n, len(ss))] {
		out = append(out, fmt.Sprint(s.id))
	}
	return strings.Join(out, ", ")
}
