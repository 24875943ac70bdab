package patroni

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/dbtest/internal/cluster"
)

// The row-lock and advisory forms hold a job by the claiming session: a
// transaction's row lock, a session's advisory lock. Both live on the
// leader only and die with it; a lease is a row, and carries over.
// runHolders holds a job of each form (two advisory ones) at the leader's
// kill, then looks at what their holders and the next claimer on the new
// leader meet.

const holderJobs = 4

// holderLease is the lease holder's lease: shorter than the outage a kill
// causes (about ttl), so that its keeper must give up before the new
// leader answers.
const holderLease = 4 * time.Second

// setupForm creates a table of form (rowlock, lease or advisory) with jobs
// 1..holderJobs, its dead table and (row lock) its effects table, and
// returns a queue on a pool of its own.
func setupForm(t *testing.T, c *patroniCluster, admin *sql.DB, table, form string) *inbox.Queue {
	t.Helper()
	stmts := []string{
		"CREATE TABLE " + table + " (id bigint PRIMARY KEY, attempt integer NOT NULL DEFAULT 1, locked_until timestamptz, payload bytea NOT NULL)",
		"CREATE TABLE " + table + "_dead (id bigint PRIMARY KEY, attempt integer NOT NULL, payload bytea NOT NULL)",
		fmt.Sprintf("INSERT INTO %s (id, payload) SELECT g, '\\x6a6f62'::bytea FROM generate_series(1, %d) g", table, holderJobs),
	}
	if form == "rowlock" {
		stmts = append(stmts, "CREATE TABLE "+table+"_fx (job_id bigint NOT NULL)")
	}
	for _, s := range stmts {
		if _, err := admin.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	cfg := inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: table, DeadTable: table + "_dead"}}
	switch form {
	case "advisory":
		cfg.Table.AdvisoryKey = "id"
	case "lease":
		cfg.Table.LockedUntil, cfg.Lease = "locked_until", holderLease
	}
	q, err := inbox.New(c.open(t, "pgx", 4), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// claimOne claims one job and checks its id and attempt.
func claimOne(t *testing.T, q *inbox.Queue, max int, wantID int64, wantAttempt int) []*inbox.Delivery {
	t.Helper()
	ds, err := q.Claim(context.Background(), max)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != max {
		t.Fatalf("claimed %d jobs, want %d", len(ds), max)
	}
	for i, d := range ds {
		if id := d.ID().(int64); id != wantID+int64(i) || d.Attempt() != wantAttempt {
			t.Fatalf("claimed job %d attempt %d, want job %d attempt %d", id, d.Attempt(), wantID+int64(i), wantAttempt)
		}
	}
	return ds
}

func count(t *testing.T, db *sql.DB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// runHolders holds a row-lock job (its effect written in the claim's
// transaction), two advisory jobs and a lease job (kept) at the kill of the
// leader's node, and returns the killed member.
func runHolders(t *testing.T, c *patroniCluster) *member {
	ctx := context.Background()
	admin := c.open(t, "pgx", 2)
	rl := setupForm(t, c, admin, "pt_rowlock", "rowlock")
	adv := setupForm(t, c, admin, "pt_advisory", "advisory")
	ls := setupForm(t, c, admin, "pt_lease", "lease")
	// The next claimer: another queue on the advisory table, on a pool
	// of its own, as another process would be.
	next, err := inbox.New(c.open(t, "pgx", 4), adv.Config())
	if err != nil {
		t.Fatal(err)
	}
	held := claimOne(t, rl, 1, 1, 1)[0]
	if _, err := held.Tx().Exec("INSERT INTO pt_rowlock_fx (job_id) VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	advHeld := claimOne(t, adv, 2, 1, 1)
	kctx, stopKeep := advHeld[1].Keep(ctx)
	defer stopKeep()
	leased := claimOne(t, ls, 1, 1, 1)[0]
	lctx, stopLease := leased.Keep(ctx)
	defer stopLease()
	// When the keeper ends the handler's context, as it ends.
	var leaseStopped time.Time
	noted := make(chan struct{})
	stopAt := context.AfterFunc(lctx, func() { leaseStopped = time.Now(); close(noted) })
	defer stopAt()

	old, err := c.leader()
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	if err := c.crash(old); err != nil {
		t.Fatalf("killing %s: %v", old.name, err)
	}
	cluster.Eventually(t, bootWait, "a new leader to accept writes", func() error { return pingWrite(ctx, admin) })
	t.Logf("FIGURE: patroni holders: %s killed; a new leader accepted a write %v later", old.name, time.Since(at).Round(time.Millisecond))
	checkRowLock(t, admin, rl, held)
	checkAdvisory(t, admin, next, advHeld, kctx)
	// The keeper gave up before the new leader answered: lctx has ended.
	<-noted
	checkLease(t, ls, leased, leaseStopped, context.Cause(lctx))
	return old
}

// checkRowLock: the holder's transaction died with the old leader's
// session, its effect with it; its Ack fails; the job is on the new leader
// as it was before the claim, claimable again at once, its attempt not
// spent.
func checkRowLock(t *testing.T, admin *sql.DB, q *inbox.Queue, held *inbox.Delivery) {
	ctx := context.Background()
	err := held.Ack(ctx)
	t.Logf("FIGURE: patroni rowlock holder: Ack after the kill: %v", err)
	if err == nil {
		t.Fatal("rowlock: the holder's Ack after the kill returned nil; its transaction was on the killed leader")
	}
	if n := count(t, admin, "SELECT count(*) FROM pt_rowlock_fx"); n != 0 {
		t.Errorf("rowlock: %d effects on the new leader, want 0: the holder's transaction rolled back", n)
	}
	again := claimOne(t, q, 1, 1, 1)[0]
	if _, err := again.Tx().Exec("INSERT INTO pt_rowlock_fx (job_id) VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	if err := again.Ack(ctx); err != nil {
		t.Fatalf("rowlock: Ack of the job claimed again: %v", err)
	}
	if n := count(t, admin, "SELECT count(*) FROM pt_rowlock_fx WHERE job_id = 1"); n != 1 {
		t.Errorf("rowlock: %d effects of job 1, want 1", n)
	}
}

// checkAdvisory: the holders' locks died with the old leader's sessions;
// the kept one's keeper finds its session gone and cancels its context
// with ErrLeaseLost, and the next claimer takes their jobs on the new
// leader, attempt spent, while they still hold them. first's Ack, the job untouched since, fails;
// second's, after the next claimer acknowledged its job, finds the job
// gone.
func checkAdvisory(t *testing.T, admin *sql.DB, next *inbox.Queue, held []*inbox.Delivery, kctx context.Context) {
	ctx := context.Background()
	if n := count(t, admin, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"); n != 0 {
		t.Errorf("advisory: %d advisory locks on the new leader before any claim there, want 0", n)
	}
	first, second := held[0], held[1]
	err1 := first.Ack(ctx)
	t.Logf("FIGURE: patroni advisory holder of job 1: Ack after the kill, the job untouched since: %v (ErrOutcomeUnknown %v, ErrLeaseLost %v)",
		err1, errors.Is(err1, inbox.ErrOutcomeUnknown), errors.Is(err1, inbox.ErrLeaseLost))
	// The new leader answered the read-back: the row still carries the
	// holder's attempt, so the Ack did not take effect, and it says so with
	// the connection's error (docs/scaling.md states what it returns).
	if err1 == nil || errors.Is(err1, inbox.ErrOutcomeUnknown) || errors.Is(err1, inbox.ErrLeaseLost) {
		t.Errorf("advisory: the holder's Ack after the kill returned %v; want the connection's error (the Ack did not take effect)", err1)
	}
	if n := count(t, admin, "SELECT count(*) FROM pt_advisory WHERE id = 1"); n != 1 {
		t.Errorf("advisory: job 1 present %d times after its holder's failed Ack, want 1", n)
	}
	// Job 2's holder runs under Keep, which pings its session: the ping
	// after the kill fails and cancels the handler's context.
	cluster.Eventually(t, time.Minute, "the kept advisory holder told its session ended", func() error {
		if kctx.Err() == nil {
			return errors.New("its context goes on")
		}
		return nil
	})
	if cause := context.Cause(kctx); !errors.Is(cause, inbox.ErrLeaseLost) {
		t.Errorf("advisory: the kept holder of job 2 was cancelled with %v, want ErrLeaseLost", cause)
	}
	// Both jobs again, the second while its first holder still holds it.
	again := claimOne(t, next, 2, 1, 2)
	for _, d := range again {
		if err := d.Ack(ctx); err != nil {
			t.Fatalf("advisory: Ack of job %v claimed again: %v", d.ID(), err)
		}
	}
	// The stale holder's Ack reads the row back on the new leader, under
	// the key's lock: the row is gone, which reads as its own Ack having
	// committed (an advisory row carries no token but the attempt). It
	// changes nothing: the job stays acknowledged, once.
	err2 := second.Ack(ctx)
	t.Logf("FIGURE: patroni advisory holder of job 2: Ack after the next claimer acknowledged it: %v", err2)
	if err2 != nil {
		t.Errorf("advisory: the stale holder's Ack returned %v; docs/scaling.md says it returns nil (the row is gone)", err2)
	}
	if n := count(t, admin, "SELECT count(*) FROM pt_advisory WHERE id <= 2") + count(t, admin, "SELECT count(*) FROM pt_advisory_dead"); n != 0 {
		t.Errorf("advisory: %d rows of jobs 1 and 2 in the table or the dead table after the stale Ack, want 0", n)
	}
	if n := count(t, admin, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"); n != 0 {
		t.Errorf("advisory: %d advisory locks left on the new leader, want 0", n)
	}
}

// checkLease: the lease holder's keeper reached no leader and cancelled
// its handler with ErrLeaseLost before the lease it had written ran out;
// the job, a row, carried over to the new leader, where it is claimed again
// only once that lease has run out (by the server's clock: the new
// expiry less the lease), attempt spent; the stale holder's Ack changes
// nothing.
func checkLease(t *testing.T, q *inbox.Queue, held *inbox.Delivery, stopped time.Time, cause error) {
	ctx := context.Background()
	expiry := held.Expiry()
	t.Logf("FIGURE: patroni lease holder: handler cancelled with %v, %v before its lease ran out", cause, expiry.Sub(stopped).Round(time.Millisecond))
	if !errors.Is(cause, inbox.ErrLeaseLost) || !stopped.Before(expiry) {
		t.Errorf("lease: the holder's context ended at %v with %v; want ErrLeaseLost before its lease ran out at %v", stopped, cause, expiry)
	}
	var again *inbox.Delivery
	cluster.Eventually(t, holderLease+bootWait, "the lease job to be claimed again", func() error {
		ds, err := q.Claim(ctx, 1)
		if err != nil || len(ds) == 0 {
			return fmt.Errorf("claimed %d: %v", len(ds), err)
		}
		again = ds[0]
		return nil
	})
	if id := again.ID().(int64); id != 1 || again.Attempt() != 2 {
		t.Errorf("lease: claimed job %d attempt %d again, want job 1 attempt 2", id, again.Attempt())
	}
	if claimedAt := again.Expiry().Add(-q.Lease()); claimedAt.Before(expiry) {
		t.Errorf("lease: job 1 claimed again at %v, before its holder's lease ran out at %v", claimedAt, expiry)
	}
	if err := held.Ack(ctx); !errors.Is(err, inbox.ErrLeaseLost) {
		t.Errorf("lease: the stale holder's Ack returned %v, want ErrLeaseLost", err)
	}
	if err := again.Ack(ctx); err != nil {
		t.Fatalf("lease: Ack of the job claimed again: %v", err)
	}
}
