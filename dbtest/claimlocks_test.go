package dbtest

// Issue 21, item 8: a claim locks only the rows it returns, and claims
// follow the claim order, the highest priority first, then the lowest id.
//
// On MariaDB a locking read that sorts (the ready rows of a not-before
// column read through its index, a lease's due rows by priority) locked every
// row it read: a held row-lock claim of one kept 20 ready rows locked, and
// every other claim found nothing. The tables here have 2,000 rows, mostly
// delayed (20 claimable, at the end) or mostly claimable (20 delayed first),
// with the recommended indexes, with and without a priority. Rows a claim
// holds are counted from another session: the rows a locking read that
// skips locked rows cannot have.

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/connhook"
)

// lockShape is a claim-lock table: delayed rows (a not-before time or a
// lease in force a day ahead, priority 0) then claimable ones, alternately
// of priority 0 and 10.
type lockShape struct {
	name               string
	delayed, claimable int
}

var lockShapes = []lockShape{{"mostly-delayed", 1980, 20}, {"mostly-ready", 20, 1980}}

// lockTable creates a table of shape for form ("rowlock": not_before;
// "lease": locked_until, the claimable rows half due an hour ago and half
// free) with a priority column and the form's recommended indexes.
func lockTable(t *testing.T, e Engine, db *sql.DB, form, what string, shape lockShape, priority bool, now time.Time) string {
	t.Helper()
	table := newTable(t, e, db, what)
	mustExec(t, e, db, "ALTER TABLE "+table+" ADD COLUMN priority integer NOT NULL DEFAULT 0")
	col := "not_before"
	if form == "lease" {
		col = "locked_until"
	}
	delayed, due := opsTime(e, now.Add(24*time.Hour)), any(nil)
	if form == "lease" {
		due = opsTime(e, now.Add(-time.Hour))
	}
	// The claimable rows, n from 0: priority 10 for odd n; under the lease
	// due for n%4 < 2, free otherwise.
	var err error
	switch {
	case e.IsPostgres():
		if _, err = db.Exec("INSERT INTO "+table+" (payload, "+col+") SELECT '\\x00'::bytea, $1::timestamptz FROM generate_series(1, $2)", delayed, shape.delayed); err == nil {
			_, err = db.Exec("INSERT INTO "+table+" (payload, "+col+", priority) SELECT '\\x00'::bytea, CASE WHEN n % 4 < 2 THEN $1::timestamptz END, 10 * (n % 2) FROM generate_series(0, $2 - 1) AS n", due, shape.claimable)
		}
	default:
		if _, err = db.Exec(fmt.Sprintf("INSERT INTO %s (payload, %s) SELECT x'00', ? FROM seq_1_to_%d", table, col, shape.delayed), delayed); err == nil {
			_, err = db.Exec(fmt.Sprintf("INSERT INTO %s (payload, %s, priority) SELECT x'00', CASE WHEN seq %% 4 < 2 THEN ? END, 10 * (seq %% 2) FROM seq_0_to_%d", table, col, shape.claimable-1), due)
		}
	}
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	idx := []string{"CREATE INDEX " + table + "_ready ON " + table + " (not_before, id)"}
	switch {
	case form == "lease" && e.IsPostgres() && priority:
		idx = []string{"CREATE INDEX " + table + "_free ON " + table + " (priority DESC, id) WHERE locked_until IS NULL", "CREATE INDEX " + table + "_lu ON " + table + " (locked_until)"}
	case form == "lease" && e.IsPostgres():
		idx = []string{"CREATE INDEX " + table + "_free ON " + table + " (id) WHERE locked_until IS NULL", "CREATE INDEX " + table + "_lu ON " + table + " (locked_until)"}
	case form == "lease" && priority:
		idx = []string{"CREATE INDEX " + table + "_claimable ON " + table + " (locked_until, priority DESC, id)"}
	case form == "lease":
		idx = []string{"CREATE INDEX " + table + "_claimable ON " + table + " (locked_until, id)"}
	case priority:
		idx = append(idx, "CREATE INDEX "+table+"_prio ON "+table+" (priority DESC, id)")
	}
	for _, s := range idx {
		mustExec(t, e, db, s)
	}
	explainAnalyze(t, e, db, table)
	return table
}

// lockConfig describes a claim-lock table to inbox.
func lockConfig(e Engine, table, form string, priority bool, now time.Time) inbox.Config {
	cfg := queueConfig(e, Table(table, form), nil)
	if priority {
		cfg.Table.Priority = "priority"
	}
	cfg.Now = func() time.Time { return now }
	return cfg
}

// lockedRows counts the rows of table that other sessions hold locked: the
// rows a locking read through the primary key that skips locked rows does
// not return.
func lockedRows(t testing.TB, e Engine, db *sql.DB, table string) int {
	t.Helper()
	tx, err := db.BeginTx(context.Background(), &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var all, free int
	if err := tx.QueryRow("SELECT COUNT(*) FROM " + table).Scan(&all); err != nil {
		t.Fatal(err)
	}
	force := ""
	if e.IsMySQL() {
		force = " FORCE INDEX (PRIMARY)"
	}
	rows, err := tx.Query("SELECT id FROM " + table + force + " FOR UPDATE SKIP LOCKED")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		free++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return all - free
}

// claimOrderOf returns the claimable rows of table in the claim order.
func claimOrderOf(t testing.TB, e Engine, db *sql.DB, table, form string, priority bool, now time.Time) []int64 {
	t.Helper()
	by := "id"
	if priority {
		by = "priority DESC, id"
	}
	cond := "(not_before IS NULL OR not_before <= ?)"
	if form == "lease" {
		cond = "(locked_until IS NULL OR locked_until <= ?)"
	}
	rows, err := db.Query(bind(e, "SELECT id FROM "+table+" WHERE "+cond+" ORDER BY "+by), opsTime(e, now))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// onTwoPools runs work in n goroutines, alternately on q1 and q2 (two
// pools), and returns the errors they returned.
func onTwoPools(n int, q1, q2 *inbox.Queue, work func(q *inbox.Queue) error) []error {
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for w := 0; w < n; w++ {
		q := q1
		if w%2 == 1 {
			q = q2
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := work(q); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return all
}

// TestClaimLocksRowLock: a held row-lock claim of one job holds that row
// alone, and eight workers over two pools claim every other ready job while
// it is held. Before (MariaDB, mostly delayed): the held claim kept all 20
// ready rows locked, and the others found nothing.
//
// A table of four rows too: MariaDB plans a join over a few rows as a scan
// into a join buffer, then a sort, and a pick in one statement planned so
// (Claim.PickFirst before its FORCE INDEX) locked every ready row.
func TestClaimLocksRowLock(t *testing.T) {
	eachEngine(t, notSQLite, func(t *testing.T, e Engine) {
		for _, shape := range append(lockShapes[:len(lockShapes):len(lockShapes)], lockShape{"few", 1, 3}) {
			for _, priority := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/priority=%v", shape.name, priority), func(t *testing.T) {
					ctx := context.Background()
					db1, db2 := openTwo(t, e, 16)
					now := time.Now().UTC().Truncate(time.Microsecond)
					table := lockTable(t, e, db1, "rowlock", fmt.Sprintf("locks_rl_%d_%v", shape.claimable, priority), shape, priority, now)
					order := claimOrderOf(t, e, db1, table, "rowlock", priority, now)
					q1 := newQueue(t, db1, lockConfig(e, table, "rowlock", priority, now))
					q2 := newQueue(t, db2, lockConfig(e, table, "rowlock", priority, now))
					var held []*inbox.Delivery
					var mu sync.Mutex
					defer func() {
						for _, d := range held {
							_ = d.Release(ctx)
						}
					}()
					ds, err := q1.Claim(ctx, 1)
					if err != nil || len(ds) != 1 {
						t.Fatalf("Claim(1) = %d jobs, %v", len(ds), err)
					}
					first := ds[0]
					held = append(held, first)
					if first.ID() != order[0] {
						t.Errorf("the first claim took job %v, want %v, the first in claim order", first.ID(), order[0])
					}
					locked := lockedRows(t, e, db2, table)
					if locked != 1 {
						t.Errorf("a held claim of one job keeps %d rows locked, want 1", locked)
					}
					// Eight workers, four on each pool: every other ready job
					// is claimable while the first is held (mostly ready: two
					// each).
					each := 0
					if shape.claimable > 100 {
						each = 2
					}
					for _, err := range onTwoPools(8, q1, q2, func(q *inbox.Queue) error {
						for n := 0; each == 0 || n < each; n++ {
							ds, err := q.Claim(ctx, 1)
							if err != nil {
								return err
							}
							if len(ds) == 0 {
								if each > 0 {
									return fmt.Errorf("a claim found nothing with %d jobs ready", shape.claimable)
								}
								return nil
							}
							mu.Lock()
							held = append(held, ds[0])
							mu.Unlock()
						}
						return nil
					}) {
						t.Error(err)
					}
					want := shape.claimable
					if each > 0 {
						want = 1 + 8*each
					}
					seen := map[any]bool{}
					for _, d := range held {
						if seen[d.ID()] {
							t.Errorf("job %v claimed twice", d.ID())
						}
						seen[d.ID()] = true
					}
					if len(held) != want {
						t.Errorf("with one job held, %d jobs were claimed in all, want %d", len(held), want)
					}
					t.Logf("a held claim of one locked %d rows; then %d claims in all, want %d", locked, len(held), want)
				})
			}
		}
	})
}

// TestClaimLocksRowLockPastHeld: another session (a process of its own)
// holds the first 60 ready jobs, more than a claim's first page passes;
// eight workers over two pools, one queue on the plain name and one on the
// schema-qualified one, claim and acknowledge every other job, each once,
// in claim order per claim, then the held ones once they are let go. On
// MariaDB the claims find Claim.PickFirst's page held, pick past it, and
// leave PickFirst out for a span.
func TestClaimLocksRowLockPastHeld(t *testing.T) {
	eachEngine(t, notSQLite, func(t *testing.T, e Engine) {
		ctx := context.Background()
		db1, db2 := openTwo(t, e, 16)
		now := time.Now().UTC().Truncate(time.Microsecond)
		table := lockTable(t, e, db1, "rowlock", "locks_rl_past", lockShape{"past-held", 1, 200}, false, now)
		order := claimOrderOf(t, e, db1, table, "rowlock", false, now)
		q1 := newQueue(t, db1, lockConfig(e, table, "rowlock", false, now))
		cfg2 := lockConfig(e, concQualified(t, e, db2, table), "rowlock", false, now)
		q2 := newQueue(t, db2, cfg2)
		holder, err := db2.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Rollback()
		held := map[int64]bool{}
		for _, id := range order[:60] {
			if _, err := holder.ExecContext(ctx, bind(e, "SELECT id FROM "+table+" WHERE id = ? FOR UPDATE"), id); err != nil {
				t.Fatal(err)
			}
			held[id] = true
		}
		drain := func(what string) map[int64]int {
			var mu sync.Mutex
			acked := map[int64]int{}
			for _, err := range onTwoPools(8, q1, q2, func(q *inbox.Queue) error {
				for {
					ds, err := q.Claim(ctx, 1)
					if err != nil || len(ds) == 0 {
						return err
					}
					id := ds[0].ID().(int64)
					if err := ds[0].Ack(ctx); err != nil {
						return fmt.Errorf("%s: ack %d: %w", what, id, err)
					}
					mu.Lock()
					acked[id]++
					mu.Unlock()
				}
			}) {
				t.Error(err)
			}
			return acked
		}
		acked := drain("past the held jobs")
		for id, n := range acked {
			if held[id] || n != 1 {
				t.Errorf("job %d acknowledged %d times while held by another session: %v", id, n, held[id])
			}
		}
		if len(acked) != len(order)-60 {
			t.Errorf("%d jobs acknowledged past the 60 held, want %d", len(acked), len(order)-60)
		}
		if err := holder.Rollback(); err != nil {
			t.Fatal(err)
		}
		rest := drain("the jobs let go")
		for id, n := range rest {
			if !held[id] || n != 1 {
				t.Errorf("job %d acknowledged %d times after the holder let go (held: %v)", id, n, held[id])
			}
		}
		if len(rest) != 60 || countRows(t, db1, table) != 1 {
			t.Errorf("after the holder let go: %d acknowledged, want 60; %d rows left, want the delayed one", len(rest), countRows(t, db1, table))
		}
	})
}

// TestClaimOrder: claims follow the claim order, the highest priority first,
// then the lowest id, on every engine and form, whether a job is free or its
// lease (not-before time) ran out. Before: MySQL's lease took a due job
// before an older free one of the same priority.
func TestClaimOrder(t *testing.T) {
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		ctx := context.Background()
		db := e.Open(t, 8)
		now := time.Now().UTC().Truncate(time.Microsecond)
		table := newTable(t, e, db, "order_"+form)
		if e.IsSQLite() {
			mustExec(t, e, db, "ALTER TABLE "+table+" ADD COLUMN priority INTEGER NOT NULL DEFAULT 0")
		} else {
			mustExec(t, e, db, "ALTER TABLE "+table+" ADD COLUMN priority integer NOT NULL DEFAULT 0")
		}
		col := "not_before"
		if form == "lease" {
			col = "locked_until"
		}
		// 40 jobs: priorities 0, 5, 10 in turn; every other one due (its
		// time an hour or less ago, the later ids longer ago), every
		// seventh delayed a day.
		for i := 1; i <= 40; i++ {
			var at any
			switch {
			case i%7 == 0:
				at = opsTime(e, now.Add(24*time.Hour))
			case i%2 == 0:
				at = opsTime(e, now.Add(-time.Duration(i)*time.Minute))
			}
			mustExec(t, e, db, "INSERT INTO "+table+" (payload, "+col+", priority) VALUES (?, ?, ?)", []byte("x"), at, 5*(i%3))
		}
		order := claimOrderOf(t, e, db, table, form, true, now)
		q := newQueue(t, db, lockConfig(e, table, form, true, now))
		var got []int64
		for _, n := range []int{5, 1, 1, 1, 3, 1, 1, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1} {
			ds, err := q.Claim(ctx, n)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range ds {
				got = append(got, d.ID().(int64))
				if err := d.Ack(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
		out := 0
		for i := range got {
			if i >= len(order) || got[i] != order[i] {
				out++
			}
		}
		if out > 0 || len(got) != len(order) {
			t.Errorf("%d of %d claims out of the claim order:\n got %v\nwant %v", out, len(got), got, order)
		}
	})
}

// TestClaimLocksLease: a MySQL lease claim of one, stopped before it marks
// its rows, holds those rows alone, and a claim beside it takes the next job
// in the claim order. Before, with a priority: the claim's read of due rows
// locked all of them (20), and the claim beside it took a job of priority 0
// while jobs of priority 10 were claimable.
func TestClaimLocksLease(t *testing.T) {
	eachEngine(t, func(e Engine) bool { return e.IsMySQL() }, func(t *testing.T, e Engine) {
		for _, shape := range lockShapes {
			for _, priority := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/priority=%v", shape.name, priority), func(t *testing.T) {
					ctx := context.Background()
					plain := e.Open(t, 4)
					now := time.Now().UTC().Truncate(time.Microsecond)
					table := lockTable(t, e, plain, "lease", fmt.Sprintf("locks_ls_%d_%v", shape.claimable, priority), shape, priority, now)
					order := claimOrderOf(t, e, plain, table, "lease", priority, now)
					q2 := newQueue(t, plain, lockConfig(e, table, "lease", priority, now))
					var locked = -1
					var beside []*inbox.Delivery
					var besideErr error
					var once atomic.Bool
					db := pausingDB(t, e, func(query string) {
						// The claim's mark, its last statement before COMMIT.
						if !strings.HasPrefix(query, "UPDATE ") || !strings.Contains(query, "`attempt` = `attempt` + 1") || !once.CompareAndSwap(false, true) {
							return
						}
						locked = lockedRows(t, e, plain, table)
						beside, besideErr = q2.Claim(ctx, 1)
					})
					q1 := newQueue(t, db, lockConfig(e, table, "lease", priority, now))
					ds, err := q1.Claim(ctx, 1)
					if err != nil || len(ds) != 1 {
						t.Fatalf("Claim(1) = %d jobs, %v", len(ds), err)
					}
					if besideErr != nil || len(beside) != 1 {
						t.Fatalf("the claim beside: %d jobs, %v", len(beside), besideErr)
					}
					t.Logf("a lease claim of one locked %d rows; it took %v, the claim beside %v (priority %d); claim order %v", locked, ds[0].ID(), beside[0].ID(), beside[0].Priority(), order[:2])
					if locked != 1 {
						t.Errorf("a lease claim of one job locks %d rows before it marks them, want 1", locked)
					}
					if priority {
						if ds[0].ID() != order[0] {
							t.Errorf("the claim took %v (priority %d), want %v, the first in claim order", ds[0].ID(), ds[0].Priority(), order[0])
						}
						if beside[0].ID() != order[1] {
							t.Errorf("the claim beside took %v (priority %d), want %v, the next in claim order", beside[0].ID(), beside[0].Priority(), order[1])
						}
					}
				})
			}
		}
	})
}

// pausingDB opens e's database through a driver wrapper that calls before
// with the text of each statement before it is sent (client-side
// parameters, so that every statement is one call, unless the queue
// prepares its statements: before is then called at each run of the
// prepared statement, for Config.Prepare under INBOX_TEST_PREPARE=1).
func pausingDB(t *testing.T, e Engine, before func(query string)) *sql.DB {
	t.Helper()
	inner, err := connhook.Connector(e.Driver, e.DSN(t, t.TempDir())+"&interpolateParams=true")
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(connhook.Wrap(inner, connhook.Hooks{Before: func(_ context.Context, call connhook.Call) {
		if call.Kind.Runs() {
			before(call.SQL)
		}
	}}))
	db.SetMaxOpenConns(4)
	t.Cleanup(func() { db.Close() })
	return db
}
