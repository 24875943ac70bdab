package dbtest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
)

func rowlockOnly(e Engine) []string {
	if e.IsSQLite() {
		return nil
	}
	return []string{"rowlock"}
}

// holdingForms are the forms that hold a connection per job in work.
func holdingForms(e Engine) []string {
	if e.IsSQLite() {
		return nil
	}
	return []string{"rowlock", "advisory"}
}

// TestRowLockHolds: the claim's transaction holds the row from every other
// claim, and its attempt increment commits only with the settlement.
func TestRowLockHolds(t *testing.T) {
	eachForm(t, rowlockOnly, func(t *testing.T, e Engine, form string) {
		db, db2 := openTwo(t, e, 4)
		table := newTable(t, e, db, "holds")
		tb := Table(table, form)
		q := newQueue(t, db, queueConfig(e, tb, nil))
		same := newQueue(t, db, queueConfig(e, tb, nil))
		other := newQueue(t, db2, queueConfig(e, tb, nil))
		ctx := context.Background()
		id := enqueueOne(t, q, db, "h")

		d := claimOne(t, q)
		claimNone(t, same, "held by a queue on the same pool")
		claimNone(t, other, "held by another process")
		if a := attemptOf(t, e, db, table, id); a != 1 {
			t.Fatalf("attempt %d visible outside the held transaction, want 1", a)
		}
		if err := d.Retry(ctx, 0); err != nil {
			t.Fatal(err)
		}
		if a := attemptOf(t, e, db, table, id); a != 2 {
			t.Fatalf("attempt %d after Retry committed, want 2", a)
		}
		d = claimOne(t, other)
		if d.Attempt() != 2 {
			t.Fatalf("delivered attempt %d, want 2", d.Attempt())
		}
		claimNone(t, q, "held by another process")
		if err := d.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if a := attemptOf(t, e, db, table, id); a != 2 {
			t.Fatalf("attempt %d after Release, want 2: the increment must roll back", a)
		}
		d = claimOne(t, same)
		if d.Attempt() != 2 {
			t.Fatalf("delivered attempt %d after Release, want 2", d.Attempt())
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
		mustBeIdle(t, db, q, same)
		mustBeIdle(t, db2, other)
	})
}

// TestRowLockTx: the handler's writes through Delivery.Tx commit with Ack
// and vanish with Release, and cancelling Claim's context after it returned
// does not roll the delivery's transaction back.
func TestRowLockTx(t *testing.T) {
	eachForm(t, rowlockOnly, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, 4)
		table := newTable(t, e, db, "tx")
		effects := tableName(e, "effects")
		for _, s := range []string{"DROP TABLE IF EXISTS " + effects, "CREATE TABLE " + effects + " (job_id bigint NOT NULL, note varchar(20) NOT NULL)"} {
			mustExec(t, e, db, s)
		}
		dropAtEnd(t, e, db, effects)
		q := newQueue(t, db, queueConfig(e, Table(table, form), nil))
		id := enqueueOne(t, q, db, "t")
		write := func(d *inbox.Delivery, note string) {
			t.Helper()
			if d.Tx() == nil {
				t.Fatal("a row-lock delivery has no transaction")
			}
			if _, err := d.Tx().Exec(bind(e, "INSERT INTO "+effects+" (job_id, note) VALUES (?, ?)"), d.ID(), note); err != nil {
				t.Fatal(err)
			}
		}
		ctx := context.Background()

		d := claimOne(t, q)
		// The caller's own transaction is refused: the claim's is the one.
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.AckTx(ctx, tx); !errors.Is(err, inbox.ErrOwnTx) {
			t.Fatalf("AckTx of a row-lock delivery: %v, want ErrOwnTx", err)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		write(d, "released")
		if n := countRows(t, db, effects); n != 0 {
			t.Fatalf("%d effects visible before the settlement", n)
		}
		if err := d.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if n := countRows(t, db, effects); n != 0 {
			t.Fatalf("%d effects left by a released job", n)
		}

		claimCtx, cancel := context.WithCancel(ctx)
		ds, err := q.Claim(claimCtx, 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("claim: %d, %v", len(ds), err)
		}
		cancel()
		d = ds[0]
		write(d, "acked")
		if err := d.Ack(ctx); err != nil {
			t.Fatalf("ack after Claim's context was cancelled: %v", err)
		}
		rows := dumpRows(t, db, effects)
		if len(rows) != 1 || !strings.Contains(rows[0], "acked") {
			t.Fatalf("effects after Ack: %q, want the acked write alone", rows)
		}
		if n := countRows(t, db, table); n != 0 {
			t.Fatalf("job %v still in the table after Ack", id)
		}
		mustBeIdle(t, db, q)
	})
}

// TestPoolRule: with SetMaxOpenConns(n) the forms that hold a connection per
// job keep at most n-1 jobs in work, across every queue on the pool, and
// claim fewer rather than wait; a pool of one is refused.
func TestPoolRule(t *testing.T) {
	eachForm(t, holdingForms, func(t *testing.T, e Engine, form string) {
		const conns = 4
		db := e.Open(t, conns)
		table := newTable(t, e, db, "pool_"+form)
		tb := Table(table, form)
		q1 := newQueue(t, db, queueConfig(e, tb, nil))
		q2 := newQueue(t, db, queueConfig(e, tb, nil))
		for range 10 {
			enqueueOne(t, q1, db, "p")
		}
		// A claim that waited for a connection would hang: the deadline
		// turns that into a failure.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		claim := func(q *inbox.Queue, max, want int) []*inbox.Delivery {
			t.Helper()
			ds, err := q.Claim(ctx, max)
			if err != nil {
				t.Fatalf("claim %d: %v", max, err)
			}
			if len(ds) != want {
				t.Fatalf("claim %d: got %d jobs, want %d (pool of %d)", max, len(ds), want, conns)
			}
			return ds
		}
		ackAll := func(ds []*inbox.Delivery) {
			t.Helper()
			for _, d := range ds {
				if err := d.Ack(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
		held := claim(q1, 10, conns-1)
		claim(q1, 1, 0)
		claim(q2, 10, 0)
		// The last connection serves everything else.
		var one int
		if err := db.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil {
			t.Fatalf("the pool's last connection: %v", err)
		}
		enqueueOne(t, q2, db, "p")
		ackAll(held[:1])
		more := claim(q2, 10, 1)
		ackAll(append(held[1:], more...))

		a := claim(q1, 2, 2)
		b := claim(q2, 5, 1)
		claim(q1, 1, 0)
		ackAll(append(a, b...))
		mustBeIdle(t, db, q1, q2)
		left := countRows(t, db, table)
		if want := 11 - (conns - 1 + 1 + 2 + 1); left != want {
			t.Fatalf("%d jobs left, want %d", left, want)
		}

		// A pool of one connection has none to spare.
		one1 := e.Open(t, 1)
		qs := newQueue(t, one1, queueConfig(e, tb, nil))
		before := dumpRows(t, db, table)
		ds, err := qs.Claim(ctx, 1)
		if !errors.Is(err, inbox.ErrPoolTooSmall) || len(ds) != 0 {
			t.Fatalf("claim on a pool of one: %d jobs, %v; want ErrPoolTooSmall", len(ds), err)
		}
		sameRows(t, "a refused claim", before, dumpRows(t, db, table))
		mustBeIdle(t, one1, qs)
	})
}

// TestSQLiteRefusesRowLock: SQLite has no row locks; asking for them fails at
// construction and names the two forms it has.
func TestSQLiteRefusesRowLock(t *testing.T) {
	eachForm(t, func(e Engine) []string {
		if !e.IsSQLite() {
			return nil
		}
		return []string{"rowlock"}
	}, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, 2)
		q, err := inbox.New(db, queueConfig(e, Table(tableName(e, "norowlock"), form), nil))
		if err == nil || q != nil {
			t.Fatal("New accepted the row-lock form on SQLite")
		}
		for _, want := range []string{"LockedUntil", "lease", "AdvisoryKey", "advisory"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not name %q", err, want)
			}
		}
	})
}

// TestRowLockPoisonPill: a job whose handler keeps killing its process comes
// back with the same attempt (a crash spends none); a settled delivery
// (Retry, Release) counts for nothing, and only once more than MaxClaims
// deliveries ended without a settlement does the next claim move the job to
// the dead table instead of delivering it.
func TestRowLockPoisonPill(t *testing.T) {
	eachForm(t, rowlockOnly, func(t *testing.T, e Engine, form string) {
		const maxClaims = 2
		dsn := e.DSN(t, "")
		db := e.OpenDSN(t, dsn, 4)
		table := newTable(t, e, db, "poison")
		tb := Table(table, form)
		tb.ClaimsTable, tb.MaxClaims = table+"_claims", maxClaims
		q := newQueue(t, db, queueConfig(e, tb, nil))
		ctx := context.Background()
		claimsOf := func(id any) int { t.Helper(); return claimsCounted(t, e, db, table, id) }

		// A Release or a Retry is no crash: it gives the count back.
		other := enqueueOne(t, q, db, "retried")
		d := claimOne(t, q)
		if err := d.Retry(ctx, 0); err != nil {
			t.Fatal(err)
		}
		if c, a := claimsOf(other), attemptOf(t, e, db, table, other); c != 0 || a != 2 {
			t.Fatalf("after Retry: claims %d attempt %d, want 0 and 2", c, a)
		}
		mustExec(t, e, db, "DELETE FROM "+table)
		id := enqueueOne(t, q, db, "poison")
		d = claimOne(t, q)
		if err := d.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if c := claimsOf(id); c != 0 {
			t.Fatalf("after Release: claims %d, want 0", c)
		}

		for crash := 1; crash <= maxClaims+1; crash++ {
			// Each crash is a process of its own whose transaction ends
			// without a settlement.
			pdb := e.OpenDSN(t, dsn, 3)
			pq := newQueue(t, pdb, queueConfig(e, tb, nil))
			ds, err := pq.Claim(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			if len(ds) != 1 {
				t.Fatalf("crash %d: the claim after %d unsettled deliveries (MaxClaims %d) delivered nothing (dead table: %q)",
					crash, crash-1, maxClaims, dumpRows(t, db, table+"_dead"))
			}
			if d := ds[0]; d.ID() != id || d.Attempt() != 1 {
				t.Fatalf("crash %d: delivered %v attempt %d, want %v attempt 1", crash, d.ID(), d.Attempt(), id)
			}
			if err := ds[0].Tx().Rollback(); err != nil {
				t.Fatal(err)
			}
			if err := pdb.Close(); err != nil {
				t.Fatal(err)
			}
			if c, a := claimsOf(id), attemptOf(t, e, db, table, id); c != crash || a != 1 {
				t.Fatalf("after crash %d: claims %d attempt %d, want %d and 1", crash, c, a, crash)
			}
			if crash == 1 {
				// A settled delivery between crashes adds nothing.
				d := claimOne(t, q)
				if err := d.Release(ctx); err != nil {
					t.Fatal(err)
				}
				if c := claimsOf(id); c != crash {
					t.Fatalf("a released delivery after crash %d: claims %d, want %d", crash, c, crash)
				}
			}
		}
		claimNone(t, q, "a job past MaxClaims")
		if n := countRows(t, db, table); n != 0 {
			t.Fatalf("the poison pill is still in the table (%d rows)", n)
		}
		dead := dumpRows(t, db, table+"_dead")
		if len(dead) != 1 || !strings.HasPrefix(dead[0], "id=") || !strings.Contains(dead[0], "attempt=1 ") || !strings.Contains(dead[0], `"poison"`) {
			t.Fatalf("dead table %q, want the job with attempt 1", dead)
		}
		if c := claimsOf(id); c != 0 {
			t.Fatalf("the dead job still counts %d claims", c)
		}
		mustBeIdle(t, db, q)
	})
}

// TestRowLockShutdown: Shutdown rolls back every held transaction at once.
func TestRowLockShutdown(t *testing.T) {
	eachForm(t, rowlockOnly, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, 4)
		table := newTable(t, e, db, "shutdown_rl")
		tb := Table(table, form)
		q := newQueue(t, db, queueConfig(e, tb, nil))
		ctx := context.Background()
		enqueueOne(t, q, db, "a")
		enqueueOne(t, q, db, "b")
		ds, err := q.Claim(ctx, 2)
		if err != nil || len(ds) != 2 {
			t.Fatalf("claimed %d, %v", len(ds), err)
		}
		if err := q.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		mustBeIdle(t, db, q)
		for _, d := range ds {
			if err := d.Ack(ctx); !errors.Is(err, inbox.ErrSettled) {
				t.Errorf("ack after Shutdown: %v, want ErrSettled", err)
			}
		}
		q2 := newQueue(t, db, queueConfig(e, tb, nil))
		got, err := q2.Claim(ctx, 5)
		if err != nil || len(got) != 2 {
			t.Fatalf("after Shutdown claimed %d, %v; want 2", len(got), err)
		}
		for _, d := range got {
			if d.Attempt() != 1 {
				t.Errorf("attempt %d after Shutdown, want 1", d.Attempt())
			}
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
		mustBeIdle(t, db, q2)
	})
}
