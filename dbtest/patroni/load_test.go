package patroni

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/dbtest/internal/cluster"
	"github.com/sqlinbox/inbox/worker"
)

// The load: enqueuers on two pools (pgx and lib/pq) and worker.Run with
// loadWorkers loops on a third (pgx), all on the multi-host DSN, flat out
// through a change of leader. The handler writes the job's effect, a row
// of the done table, and acknowledges the job in the same transaction
// (AckTx), so that the effect exists exactly when the acknowledgement
// does. The test records what each client was told:
//
//   - an enqueue is acknowledged when Enqueue returned its id; it is lost
//     when, the queue drained, the job has no effect;
//   - an Ack is acknowledged when its transaction's Commit returned nil; it
//     is undone when its effect (job, attempt) is not in the done table at
//     the end (the commit vanished with the old leader, and the job ran
//     again under a later attempt, or is still queued).
//
// Every job's effect exists at most once (an Ack commits once, deleting the
// row it fences), whatever the failover did to the claims in flight.

const (
	loadEnqueuers = 4
	loadWorkers   = 8
	// loadBefore and loadAfter are how many enqueues and Acks each must be
	// acknowledged before the leader goes, and after the first acknowledged
	// one after it: event counts, not durations.
	loadBefore, loadAfter = 1500, 500
	// loadLease is the jobs' lease. It is shorter than the outage a kill
	// causes (about ttl+loopWait), so that the keepers of the jobs in work
	// at the kill must stop their handlers, and the drain waits for those
	// leases to run out.
	loadLease = 5 * time.Second
)

// enqueuer is a queue on one of the enqueuers' pools.
type enqueuer struct {
	q  *inbox.Queue
	db *sql.DB
}

// ack is an acknowledged Ack: the delivery's attempt and when.
type ack struct {
	attempt int
	at      time.Time
}

// load is one run's clients and what they were told.
type load struct {
	table  string
	workDB *sql.DB
	q      *inbox.Queue

	eventAt           atomic.Int64 // unix nanoseconds; 0 before the event
	stopEnq, stopWork context.CancelFunc
	enqs, work        sync.WaitGroup
	enqQs             []enqueuer // one per enqueuer pool

	mu       sync.Mutex
	enqueued map[int64]time.Time
	acked    map[int64]ack
	handled  map[int64]int       // handler runs per job, committed or not
	started  map[int64]time.Time // each job's first handler run
	enqErrs  []string            // first few enqueue errors after the event
	runErr   error

	enqN, ackN       atomic.Int64
	failedEnq, noAck atomic.Int64 // enqueues and handler runs that returned an error
	workErrs         atomic.Int64 // errors Run's OnError was told of
}

// setupLoad creates table (lease form), its dead table and done table, and
// the pools and queues of a run.
func setupLoad(t *testing.T, c *patroniCluster, admin *sql.DB, table string) *load {
	t.Helper()
	for _, s := range []string{
		"CREATE TABLE " + table + " (id bigserial PRIMARY KEY, attempt integer NOT NULL DEFAULT 1, locked_until timestamptz, payload bytea NOT NULL)",
		"CREATE TABLE " + table + "_dead (id bigint PRIMARY KEY, attempt integer NOT NULL, payload bytea NOT NULL)",
		"CREATE INDEX " + table + "_free ON " + table + " (id) WHERE locked_until IS NULL",
		"CREATE INDEX " + table + "_lu ON " + table + " (locked_until)",
		// port: the server that committed the effect, the leader then.
		"CREATE TABLE " + table + "_done (job_id bigint NOT NULL, attempt integer NOT NULL, port integer NOT NULL DEFAULT inet_server_port())",
	} {
		if _, err := admin.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	cfg := inbox.Config{Dialect: inbox.Postgres, Lease: loadLease,
		Table: inbox.Table{Name: table, LockedUntil: "locked_until", DeadTable: table + "_dead"}}
	l := &load{table: table, enqueued: map[int64]time.Time{}, acked: map[int64]ack{}, handled: map[int64]int{}, started: map[int64]time.Time{}}
	l.workDB = c.open(t, "pgx", 2*loadWorkers+2)
	var err error
	if l.q, err = inbox.New(l.workDB, cfg); err != nil {
		t.Fatal(err)
	}
	for _, driver := range []string{"pgx", "postgres"} {
		db := c.open(t, driver, loadEnqueuers/2+1)
		q, err := inbox.New(db, cfg)
		if err != nil {
			t.Fatal(err)
		}
		l.enqQs = append(l.enqQs, enqueuer{q, db})
	}
	return l
}

// enqueue enqueues flat out until ctx ends; a failed enqueue (no leader)
// is tried again after a short back-off.
func (l *load) enqueue(ctx context.Context, e enqueuer) {
	backoff := 5 * time.Millisecond
	for ctx.Err() == nil {
		id, err := e.q.Enqueue(ctx, e.db, inbox.Job{Data: []any{[]byte("job")}})
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			l.failedEnq.Add(1)
			if l.eventAt.Load() != 0 {
				l.mu.Lock()
				if len(l.enqErrs) < 3 {
					l.enqErrs = append(l.enqErrs, err.Error())
				}
				l.mu.Unlock()
			}
			wait(ctx, backoff)
			backoff = min(2*backoff, 100*time.Millisecond)
			continue
		}
		backoff = 5 * time.Millisecond
		l.mu.Lock()
		l.enqueued[id.(int64)] = time.Now()
		l.mu.Unlock()
		l.enqN.Add(1)
	}
}

// wait pauses an enqueuer between tries: its back-off, not a test
// waiting for an event.
func wait(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// handle writes the job's effect and acknowledges it in one transaction.
func (l *load) handle(ctx context.Context, d *inbox.Delivery) error {
	id := d.ID().(int64)
	l.mu.Lock()
	if l.handled[id]++; l.handled[id] == 1 {
		l.started[id] = time.Now()
	}
	l.mu.Unlock()
	err := l.effectAndAck(ctx, d)
	if err != nil {
		l.noAck.Add(1)
	}
	return err
}

func (l *load) effectAndAck(ctx context.Context, d *inbox.Delivery) error {
	id := d.ID().(int64)
	tx, err := l.workDB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO "+l.table+"_done (job_id, attempt) VALUES ($1, $2)", id, d.Attempt()); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := d.AckTx(ctx, tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		// The commit may have happened, its answer lost: not acknowledged.
		return err
	}
	l.mu.Lock()
	l.acked[id] = ack{attempt: d.Attempt(), at: time.Now()}
	l.mu.Unlock()
	l.ackN.Add(1)
	if err := d.Committed(tx); err != nil && !errors.Is(err, inbox.ErrSettled) {
		return err
	}
	return nil
}

// sinceEvent counts the enqueues and Acks acknowledged after at, and the
// first of each.
func (l *load) sinceEvent(at time.Time) (enq, acks int, firstEnq, firstAck time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ts := range l.enqueued {
		if ts.After(at) {
			enq++
			if firstEnq.IsZero() || ts.Before(firstEnq) {
				firstEnq = ts
			}
		}
	}
	for _, a := range l.acked {
		if a.at.After(at) {
			acks++
			if firstAck.IsZero() || a.at.Before(firstAck) {
				firstAck = a.at
			}
		}
	}
	return enq, acks, firstEnq, firstAck
}

// runLoad runs the load through event, which changes the leader (the
// kill, or the switchover) of old, the member that leads before; then it
// drains the queue and checks what the clients were told against what the
// new leader holds. It returns old.
func runLoad(t *testing.T, c *patroniCluster, table, what string, event func(old *member) error) (old *member) {
	admin := c.open(t, "pgx", 2)
	l := setupLoad(t, c, admin, table)
	old, err := c.leader()
	if err != nil {
		t.Fatal(err)
	}
	l.startClients()
	defer l.stopClients()
	cluster.Eventually(t, bootWait, "the load to be under way", func() error {
		if e, a := l.enqN.Load(), l.ackN.Load(); e < loadBefore || a < loadBefore/2 {
			return fmt.Errorf("%d enqueues and %d Acks acknowledged", e, a)
		}
		return l.err()
	})
	if err := c.healthy(); err != nil {
		t.Fatalf("just before the %s: %v", what, err)
	}
	enqBefore, ackBefore := l.enqN.Load(), l.ackN.Load()
	at := time.Now()
	l.eventAt.Store(at.UnixNano())
	if err := event(old); err != nil {
		t.Fatalf("%s of %s: %v", what, old.name, err)
	}
	eventDone := time.Now()
	newLeader := c.waitNewLeader(t, old)
	leaderAt := time.Now()
	l.goOn(t, what, at)
	drained := l.drain(t, admin)
	l.stopClients()
	if err := l.err(); err != nil {
		t.Fatal(err)
	}
	enqGap, ackGap := l.gaps()
	t.Logf("FIGURE: patroni %s: %s led, %s leads; Patroni named it %v after the %s began (which took %v); no enqueue acknowledged for %v, no Ack for %v; "+
		"before: %d enqueues, %d Acks acknowledged; in all %d and %d; %d enqueues and %d handler runs failed, Run told of %d errors; drained %v",
		what, old.name, newLeader.name, leaderAt.Sub(at).Round(time.Millisecond), what, eventDone.Sub(at).Round(time.Millisecond),
		enqGap.Round(time.Millisecond), ackGap.Round(time.Millisecond),
		enqBefore, ackBefore, l.enqN.Load(), l.ackN.Load(), l.failedEnq.Load(), l.noAck.Load(), l.workErrs.Load(), drained.Round(time.Millisecond))
	l.mu.Lock()
	if len(l.enqErrs) > 0 {
		t.Logf("enqueue errors after the %s, the first: %s", what, strings.Join(l.enqErrs, " | "))
	}
	l.mu.Unlock()
	l.check(t, admin, what, at, eventDone, newLeader)
	return old
}

// startClients starts the enqueuers and the worker.Run call.
func (l *load) startClients() {
	enqCtx, stopEnq := context.WithCancel(context.Background())
	workCtx, stopWork := context.WithCancel(context.Background())
	l.stopEnq, l.stopWork = stopEnq, stopWork
	for i := range loadEnqueuers {
		l.enqs.Add(1)
		go func() { defer l.enqs.Done(); l.enqueue(enqCtx, l.enqQs[i%2]) }()
	}
	l.work.Add(1)
	go func() {
		defer l.work.Done()
		err := worker.Run(workCtx, l.q, worker.Config{Workers: loadWorkers, Poll: 100 * time.Millisecond,
			OnError: func(error) { l.workErrs.Add(1) }}, l.handle)
		l.mu.Lock()
		l.runErr = fmt.Errorf("worker.Run returned before it was stopped: %v", err)
		if workCtx.Err() != nil {
			l.runErr = err
		}
		l.mu.Unlock()
	}()
}

// stopClients stops the enqueuers and then the workers, and waits for
// them; again, it does nothing.
func (l *load) stopClients() {
	l.stopEnq()
	l.enqs.Wait()
	l.stopWork()
	l.work.Wait()
}

// goOn waits until enqueues and then Acks have gone on after the event.
// The enqueuers stop once they have, so that the backlog the workers
// drain stays small.
func (l *load) goOn(t *testing.T, what string, at time.Time) {
	cluster.Eventually(t, bootWait, "enqueues to go on after the "+what, func() error {
		if e, _, _, _ := l.sinceEvent(at); e < loadAfter {
			return fmt.Errorf("%d enqueues acknowledged since", e)
		}
		return l.err()
	})
	l.stopEnq()
	l.enqs.Wait()
	cluster.Eventually(t, bootWait, "Acks to go on after the "+what, func() error {
		if _, a, _, _ := l.sinceEvent(at); a < loadAfter {
			return fmt.Errorf("%d Acks acknowledged since", a)
		}
		return l.err()
	})
}

// gaps are the longest times between two acknowledged enqueues and two
// acknowledged Acks: the outage the clients saw.
func (l *load) gaps() (enq, acks time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var e, a []time.Time
	for _, ts := range l.enqueued {
		e = append(e, ts)
	}
	for _, x := range l.acked {
		a = append(a, x.at)
	}
	return longestGap(e), longestGap(a)
}

func longestGap(ts []time.Time) time.Duration {
	sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
	var g time.Duration
	for i := 1; i < len(ts); i++ {
		g = max(g, ts[i].Sub(ts[i-1]))
	}
	return g
}

// err is the worker.Run call's return, should it have returned.
func (l *load) err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.runErr
}

// drain waits until the workers have emptied the queue (the jobs stopped
// at the event come back once their leases run out) and returns how long
// that took.
func (l *load) drain(t *testing.T, admin *sql.DB) time.Duration {
	start := time.Now()
	cluster.Eventually(t, loadLease+bootWait, "the queue to drain", func() error {
		if err := l.err(); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := admin.QueryRow("SELECT count(*) FROM " + l.table).Scan(&n); err != nil {
			return err
		}
		if n != 0 {
			return fmt.Errorf("%d jobs left", n)
		}
		return nil
	})
	return time.Since(start)
}

// effect is a row of the done table: a job's effect, by its attempt.
type effect struct {
	id      int64
	attempt int
}

// effects reads the done table: each effect, the effects per job, and how
// many the new leader committed.
func (l *load) effects(t *testing.T, admin *sql.DB, newLeader *member) (map[effect]bool, map[int64]int, int) {
	effects, byJob, onNew := map[effect]bool{}, map[int64]int{}, 0
	rows, err := admin.Query("SELECT job_id, attempt, port FROM " + l.table + "_done")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var e effect
		var port int
		if err := rows.Scan(&e.id, &e.attempt, &port); err != nil {
			t.Fatal(err)
		}
		effects[e] = true
		byJob[e.id]++
		if port == newLeader.pgPort {
			onNew++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return effects, byJob, onNew
}

// check compares what the clients were told with the leader's tables:
// no acknowledged enqueue lost, no acknowledged Ack undone, each effect
// once, and Run's loops at work on the new leader.
func (l *load) check(t *testing.T, admin *sql.DB, what string, at, eventDone time.Time, newLeader *member) {
	effects, byJob, onNew := l.effects(t, admin, newLeader)
	_, acksAfter, _, _ := l.sinceEvent(at)
	l.mu.Lock()
	defer l.mu.Unlock()
	var lost, undone, twice []int64
	for id := range l.enqueued {
		if byJob[id] == 0 {
			lost = append(lost, id)
		}
	}
	for id, a := range l.acked {
		if !effects[effect{id, a.attempt}] {
			undone = append(undone, id)
		}
	}
	for id, n := range byJob {
		if n > 1 {
			twice = append(twice, id)
		}
	}
	// A job runs again only when the event caught its first run: started
	// before the event was over, the run's Ack never acknowledged.
	reran := 0
	var unexplained []int64
	for id, n := range l.handled {
		if n > 1 {
			reran++
			if l.started[id].After(eventDone) {
				unexplained = append(unexplained, id)
			}
		}
	}
	t.Logf("FIGURE: patroni %s: enqueues acknowledged %d, lost %d; Acks acknowledged %d, undone %d; effects %d (jobs with two or more: %d); jobs handled more than once %d; Acks on the new leader %d (effects committed there %d)",
		what, len(l.enqueued), len(lost), len(l.acked), len(undone), len(byJob), len(twice), reran, acksAfter, onNew)
	for _, p := range []struct {
		name string
		ids  []int64
	}{{"acknowledged enqueues lost", lost}, {"acknowledged Acks undone", undone}, {"jobs with more than one effect", twice},
		{"jobs run again whose first run started after the " + what, unexplained}} {
		if len(p.ids) > 0 {
			sort.Slice(p.ids, func(i, j int) bool { return p.ids[i] < p.ids[j] })
			t.Errorf("%s: %d %s, the first %v; want none", what, len(p.ids), p.name, p.ids[:min(10, len(p.ids))])
		}
	}
	// The same Run call went on: its handlers acknowledged jobs after the
	// event, on the new leader.
	if acksAfter == 0 || onNew == 0 {
		t.Errorf("%s: %d Acks acknowledged after it, %d effects committed on the new leader %s; want some of each from the same worker.Run", what, acksAfter, onNew, newLeader.name)
	}
}
