package dbtest

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/connhook"
)

// TestRowLockWalk: inbox.MariaDB's row-lock claim of one walks the primary
// key (Claim.WalkFirst), bounded by the rows it reads and cannot claim.
//
//   - Behind a head of 40 delayed rows (more than the bound) the walk gives
//     up, leaving the last delayed row it read locked; the claim rolls back
//     and claims the first ready job by PickFirst, and holds that row
//     alone. The pool's sessions run at READ COMMITTED, so no other
//     rollback (the level's) drops the lingering lock for it.
//   - Rows another session holds do not count against the bound: past 40
//     held ready rows, a claim is the walk alone.
//   - Eight workers over two pools (one at READ COMMITTED, one at the
//     server's default; the table named plainly and schema-qualified)
//     claim and acknowledge every ready job once; the delayed ones stay.
func TestRowLockWalk(t *testing.T) {
	eachEngine(t, func(e Engine) bool { return e.Dialect == inbox.MariaDB }, func(t *testing.T, e Engine) {
		ctx := context.Background()
		db1, log := loggedPool(t, e)
		db2 := e.Open(t, 16)
		sentSince, mark, count := log.since, log.mark, countSent

		const delayed, ready = 40, 100
		now := time.Now().UTC().Truncate(time.Microsecond)
		table := lockTable(t, e, db1, "rowlock", "walk", lockShape{"walk", delayed, ready}, false, now)
		order := claimOrderOf(t, e, db1, table, "rowlock", false, now)
		q1 := newQueue(t, db1, lockConfig(e, table, "rowlock", false, now))
		q2 := newQueue(t, db2, lockConfig(e, concQualified(t, e, db2, table), "rowlock", false, now))
		st := q1.Statements().Claim
		if st.WalkFirst.SQL == "" {
			t.Fatal("inbox.MariaDB has no Claim.WalkFirst for a row-lock table with a not-before column")
		}
		var held []*inbox.Delivery
		defer func() {
			for _, d := range held {
				_ = d.Release(ctx)
			}
		}()
		claimOne := func(q *inbox.Queue, want int64) {
			t.Helper()
			ds, err := q.Claim(ctx, 1)
			if err != nil || len(ds) != 1 {
				t.Fatalf("Claim(1) = %d jobs, %v", len(ds), err)
			}
			held = append(held, ds[0])
			if ds[0].ID() != want {
				t.Fatalf("claimed job %v, want %v, the first ready in claim order", ds[0].ID(), want)
			}
		}

		// The walk gives up behind the delayed head.
		n := mark()
		claimOne(q1, order[0])
		got := sentSince(n)
		if count(got, st.WalkFirst.SQL) != 1 || count(got, st.PickFirst.SQL) != 1 {
			t.Errorf("a claim behind %d delayed rows sent:\n%s\nwant the walk, then PickFirst", delayed, strings.Join(got, "\n"))
		}
		if locked := lockedRows(t, e, db2, table); locked != 1 {
			t.Errorf("a held claim of one keeps %d rows locked, want 1 (the walk's last row let go)", locked)
		}
		claimOne(q2, order[1])
		if locked := lockedRows(t, e, db2, table); locked != 2 {
			t.Errorf("two held claims keep %d rows locked, want 2", locked)
		}

		// Held rows do not count against the bound: on a table whose head
		// is one delayed row, then ready ones, another session holding 40.
		heldTable := lockTable(t, e, db1, "rowlock", "walk_held", lockShape{"walk-held", 1, 60}, false, now)
		heldOrder := claimOrderOf(t, e, db1, heldTable, "rowlock", false, now)
		const others = 40
		holder := holdRows(t, db2, heldTable, heldOrder[:others])
		q3 := newQueue(t, db1, lockConfig(e, heldTable, "rowlock", false, now))
		n = mark()
		claimOne(q3, heldOrder[others])
		got = sentSince(n)
		walk3 := q3.Statements().Claim
		if count(got, walk3.WalkFirst.SQL) != 1 || count(got, walk3.PickFirst.SQL) != 0 || count(got, walk3.Pick.SQL) != 0 {
			t.Errorf("a claim past %d rows held by another session sent:\n%s\nwant the walk alone", others, strings.Join(got, "\n"))
		}
		if locked := lockedRows(t, e, db2, heldTable); locked != others+1 {
			t.Errorf("%d rows locked, want %d", locked, others+1)
		}
		if err := holder.Rollback(); err != nil {
			t.Fatal(err)
		}
		for _, d := range held {
			if err := d.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		held = nil

		// Eight workers over both pools drain the ready jobs.
		if n := drainOnce(t, q1, q2, nil); n != ready {
			t.Errorf("%d jobs acknowledged, want the %d ready", n, ready)
		}
		var left int
		if err := db2.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+table).Scan(&left); err != nil || left != delayed {
			t.Errorf("%d rows left (%v), want the %d delayed", left, err, delayed)
		}
	})
}

// TestLeaseWalk: inbox.MariaDB's lease claim of one walks the primary key
// for free rows in one statement (Claim.WalkTake; Claim.WalkFirst in the
// claim's transaction when its context ends within a second), bounded by
// the rows it reads and cannot claim, and returns none while a lease has
// run out.
//
//   - Behind 40 rows under a lease in force (more than the bound) the walk
//     gives up; the claim goes on in a transaction through the claim index
//     (Claim.SelectFreeOne) and takes the first free job, and once it
//     committed no row stays locked. The next claim of one walks again
//     (a walk that missed once may have raced an enqueue) and gives up
//     again; the claim after that second miss running reads the index
//     alone. A claim with a near deadline walks in its transaction the
//     same way.
//   - Rows another session holds do not count against the bound: past 40
//     held free rows, a claim is the walk alone.
//   - A lease run out comes first: the walk returns nothing and the claim
//     takes the due job, though free ones stand before it in id order.
//   - Eight workers over two pools (one at READ COMMITTED, one at the
//     server's default; the table named plainly and schema-qualified)
//     claim and acknowledge every free job once; the leased ones stay.
func TestLeaseWalk(t *testing.T) {
	eachEngine(t, func(e Engine) bool { return e.Dialect == inbox.MariaDB }, func(t *testing.T, e Engine) {
		ctx := context.Background()
		db1, log := loggedPool(t, e)
		db2 := e.Open(t, 16)
		sentSince, mark, count := log.since, log.mark, countSent
		// leasedThenFree makes a table whose head is leased rows under a
		// lease in force, then free rows, with the claim index (without
		// it the walk's check for a lease run out scans the table, and
		// those rows count against its bound); it returns the free rows'
		// ids.
		leasedThenFree := func(what string, leased, free int) (string, []int64) {
			table := newTable(t, e, db1, what)
			mustExec(t, e, db1, "CREATE INDEX "+table+"_claimable ON "+table+" (locked_until, id)")
			if leased > 0 { // seq_1_to_0 counts down: two rows
				mustExec(t, e, db1, fmt.Sprintf("INSERT INTO %s (payload, locked_until) SELECT x'00', UTC_TIMESTAMP(6) + INTERVAL 1 HOUR FROM seq_1_to_%d", table, leased))
			}
			mustExec(t, e, db1, fmt.Sprintf("INSERT INTO %s (payload) SELECT x'00' FROM seq_1_to_%d", table, free))
			ids := claimOrderOf(t, e, db1, table, "lease", false, time.Now().UTC())
			if len(ids) != free {
				t.Fatalf("%d free rows, want %d", len(ids), free)
			}
			return table, ids
		}
		claimOne := func(q *inbox.Queue, want int64) *inbox.Delivery {
			t.Helper()
			ds, err := q.Claim(ctx, 1)
			if err != nil || len(ds) != 1 {
				t.Fatalf("Claim(1) = %d jobs, %v", len(ds), err)
			}
			if ds[0].ID() != want {
				t.Fatalf("claimed job %v, want %v, the first in claim order", ds[0].ID(), want)
			}
			return ds[0]
		}

		const leased, free = 40, 100
		table, order := leasedThenFree("lwalk", leased, free)
		q1 := newQueue(t, db1, queueConfig(e, Table(table, "lease"), nil))
		q2 := newQueue(t, db2, queueConfig(e, Table(concQualified(t, e, db2, table), "lease"), nil))
		st := q1.Statements().Claim
		if st.WalkFirst.SQL == "" || st.WalkTake.SQL == "" {
			t.Fatal("inbox.MariaDB has no Claim.WalkFirst or Claim.WalkTake for an indexed lease table")
		}
		n := mark()
		d := claimOne(q1, order[0])
		got := sentSince(n)
		if count(got, st.WalkTake.SQL) != 1 || count(got, st.WalkFirst.SQL) != 0 || count(got, st.SelectFreeOne.SQL) != 1 {
			t.Errorf("a claim behind %d leased rows sent:\n%s\nwant the walk in one statement, then SelectFreeOne", leased, strings.Join(got, "\n"))
		}
		if locked := lockedRows(t, e, db2, table); locked != 0 {
			t.Errorf("%d rows locked after the claim committed, want none (the walk's last row let go)", locked)
		}
		n = mark()
		claimOne(q1, order[1])
		if got := sentSince(n); count(got, st.WalkTake.SQL) != 1 || count(got, st.WalkFirst.SQL) != 0 || count(got, st.SelectFreeOne.SQL) != 1 {
			t.Errorf("the claim after one walk that gave up sent:\n%s\nwant the walk again, then SelectFreeOne", strings.Join(got, "\n"))
		}
		n = mark()
		third := claimOne(q1, order[2])
		if got := sentSince(n); count(got, st.WalkTake.SQL)+count(got, st.WalkFirst.SQL) != 0 || count(got, st.SelectFreeOne.SQL) != 1 {
			t.Errorf("the claim after two walks running that gave up sent:\n%s\nwant SelectFreeOne and no walk", strings.Join(got, "\n"))
		}
		for _, d := range []*inbox.Delivery{d, third} {
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
		// From the client: a claim whose context ends within a second,
		// on a queue whose span of claims without the walk is fresh.
		qSoon := newQueue(t, db1, queueConfig(e, Table(table, "lease"), nil))
		n = mark()
		ds, err := claimFromClient(ctx, qSoon, true)
		if err != nil || len(ds) != 1 || ds[0].ID() != order[3] {
			t.Fatalf("Claim(1) with a near deadline = %d jobs, %v; want job %v", len(ds), err, order[3])
		}
		if got := sentSince(n); count(got, st.WalkTake.SQL) != 0 || count(got, st.WalkFirst.SQL) != 1 || count(got, st.SelectFreeOne.SQL) != 1 {
			t.Errorf("a claim with a near deadline behind %d leased rows sent:\n%s\nwant the walk, then SelectFreeOne", leased, strings.Join(got, "\n"))
		}
		if err := ds[0].Ack(ctx); err != nil {
			t.Fatal(err)
		}
		if locked := lockedRows(t, e, db2, table); locked != 0 {
			t.Errorf("%d rows locked after the claim committed, want none (the walk's last row let go)", locked)
		}

		// Held rows do not count against the bound.
		heldTable, heldOrder := leasedThenFree("lwalk_held", 1, 60)
		const others = 40
		holder := holdRows(t, db2, heldTable, heldOrder[:others])
		q3 := newQueue(t, db1, queueConfig(e, Table(heldTable, "lease"), nil))
		st3 := q3.Statements().Claim
		n = mark()
		claimOne(q3, heldOrder[others])
		if got := sentSince(n); len(got) != 1 || count(got, st3.WalkTake.SQL) != 1 {
			t.Errorf("a claim past %d rows held by another session sent:\n%s\nwant the walk in one statement alone", others, strings.Join(got, "\n"))
		}
		if err := holder.Rollback(); err != nil {
			t.Fatal(err)
		}

		// A lease run out comes before the free rows.
		dueTable, dueOrder := leasedThenFree("lwalk_due", 0, 20)
		due := dueOrder[len(dueOrder)-1]
		mustExec(t, e, db1, "UPDATE "+dueTable+" SET locked_until = UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE WHERE id = ?", due)
		q4 := newQueue(t, db1, queueConfig(e, Table(dueTable, "lease"), nil))
		n = mark()
		claimOne(q4, due)
		if got := sentSince(n); len(got) == 0 || got[0] != q4.Statements().Claim.WalkTake.SQL {
			t.Errorf("a claim with a lease run out sent:\n%s\nwant the walk first", strings.Join(got, "\n"))
		}

		// Eight workers over both pools drain the free jobs; order[1] is
		// still leased to the claim above, until its lease ends.
		if n := drainOnce(t, q1, q2, []int64{order[0], order[2], order[3]}); n != free-4 {
			t.Errorf("%d jobs acknowledged, want the %d free", n, free-4)
		}
		var left int
		if err := db2.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+table).Scan(&left); err != nil || left != leased+1 {
			t.Errorf("%d rows left (%v), want the %d leased and the one claim held", left, err, leased+1)
		}
	})
}

// stmtLog is the statements a pool's sessions ran, in the order they ran.
type stmtLog struct {
	mu   sync.Mutex
	sent []string
}

// mark is where the statements run from now on begin in since.
func (l *stmtLog) mark() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.sent)
}

// since returns the statements run from mark n on.
func (l *stmtLog) since(n int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.sent[n:]...)
}

// loggedPool opens a pool of 16 on e whose sessions run at READ COMMITTED
// (so that no rollback of the level's drops a lock a test counts) and
// logs every statement its sessions run.
func loggedPool(t *testing.T, e Engine) (*sql.DB, *stmtLog) {
	t.Helper()
	inner, err := connhook.Connector(e.Driver, e.DSN(t, t.TempDir())+"&tx_isolation=%27READ-COMMITTED%27")
	if err != nil {
		t.Fatal(err)
	}
	log := &stmtLog{}
	// A statement sent as text and refused (driver.ErrSkip) is prepared
	// and run again: counted once, as it ran.
	db := sql.OpenDB(connhook.Wrap(inner, connhook.Hooks{After: func(_ context.Context, c connhook.Call, err error, _ time.Duration) {
		if c.Kind.Runs() && !errors.Is(err, driver.ErrSkip) {
			log.mu.Lock()
			log.sent = append(log.sent, c.SQL)
			log.mu.Unlock()
		}
	}}))
	db.SetMaxOpenConns(16)
	t.Cleanup(func() { db.Close() })
	return db, log
}

// countSent counts the times s is in stmts.
func countSent(stmts []string, s string) int {
	n := 0
	for _, x := range stmts {
		if x == s {
			n++
		}
	}
	return n
}

// drainOnce has eight workers over q1 and q2 (alternately) claim one job at
// a time and acknowledge it until their claims find none, failing t when
// a job is acknowledged twice (the ids of before count as acknowledged);
// it returns how many they acknowledged.
func drainOnce(t *testing.T, q1, q2 *inbox.Queue, before []int64) int {
	t.Helper()
	ctx := context.Background()
	var acked sync.Map
	for _, id := range before {
		acked.Store(id, true)
	}
	var n atomic.Int64
	for _, err := range onTwoPools(8, q1, q2, func(q *inbox.Queue) error {
		for {
			ds, err := q.Claim(ctx, 1)
			if err != nil {
				return err
			}
			if len(ds) == 0 {
				return nil
			}
			if err := ds[0].Ack(ctx); err != nil {
				return fmt.Errorf("ack %v: %w", ds[0].ID(), err)
			}
			if _, twice := acked.LoadOrStore(ds[0].ID(), true); twice {
				return fmt.Errorf("job %v acknowledged twice", ds[0].ID())
			}
			n.Add(1)
		}
	}) {
		t.Error(err)
	}
	return int(n.Load())
}

// holdRows locks the rows of table with ids in a READ COMMITTED
// transaction of db, which it returns; the test's end rolls it back.
func holdRows(t *testing.T, db *sql.DB, table string, ids []int64) *sql.Tx {
	t.Helper()
	tx, err := db.BeginTx(context.Background(), &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback() })
	for _, id := range ids {
		if _, err := tx.Exec("SELECT id FROM "+table+" WHERE id = ? FOR UPDATE", id); err != nil {
			t.Fatal(err)
		}
	}
	return tx
}
