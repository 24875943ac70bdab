package dbtest

// Batched settlement (inbox.Batcher) on every real database and driver: a
// batch mixing live tokens and stale ones (their jobs taken by another claim
// after the injected clock passed their leases) settles exactly the live
// ones and returns ErrLeaseLost to exactly the stale ones; Release and Retry
// in one batch do what the plain settlements do.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/fakeclock"
)

// batTable creates bench_batch_<engine>, dropped again after a passing test.
func batTable(t *testing.T, e Engine, db *sql.DB) string {
	t.Helper()
	table := "bench_batch_" + e.Name
	e.CreateTable(t, db, table)
	if !e.IsSQLite() {
		t.Cleanup(func() {
			if t.Failed() {
				return
			}
			for _, tb := range []string{table, table + "_dead", table + "_claims"} {
				if _, err := db.Exec("DROP TABLE IF EXISTS " + tb); err != nil {
					t.Errorf("drop %s: %v", tb, err)
				}
			}
		})
	}
	return table
}

func batQueue(t *testing.T, e Engine, db *sql.DB, table string, clock *fakeclock.Clock) *inbox.Queue {
	t.Helper()
	return batQueuePrepared(t, e, db, table, clock, prepareAll)
}

func batQueuePrepared(t *testing.T, e Engine, db *sql.DB, table string, clock *fakeclock.Clock, prepare bool) *inbox.Queue {
	t.Helper()
	cfg := inbox.Config{Dialect: e.Dialect, Table: Table(table, "lease"), Lease: time.Minute, Prepare: prepare}
	if clock != nil {
		cfg.Now = clock.Now
	}
	q, err := inbox.New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func batEnqueue(t *testing.T, q *inbox.Queue, db *sql.DB, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		if _, err := q.Enqueue(context.Background(), db, inbox.Job{Data: []any{[]byte(fmt.Sprintf("job %d", i))}}); err != nil {
			t.Fatal(err)
		}
	}
}

func batClaim(t *testing.T, q *inbox.Queue, n int) []*inbox.Delivery {
	t.Helper()
	ds, err := q.Claim(context.Background(), n)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != n {
		t.Fatalf("claimed %d jobs, want %d", len(ds), n)
	}
	return ds
}

// batSettleAll runs settle for every delivery at once and returns the
// results in the order of ds.
func batSettleAll(ds []*inbox.Delivery, settle func(d *inbox.Delivery) error) []error {
	errs := make([]error, len(ds))
	var wg sync.WaitGroup
	for i, d := range ds {
		wg.Add(1)
		go func(i int, d *inbox.Delivery) {
			defer wg.Done()
			errs[i] = settle(d)
		}(i, d)
	}
	wg.Wait()
	return errs
}

func batCount(t *testing.T, db *sql.DB, table string) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM " + table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func batIDs(ds []*inbox.Delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = fmt.Sprint(d.ID())
	}
	sort.Strings(out)
	return out
}

// Both ways: statements as text, and prepared (Config.Prepare, which
// docs/operations.md recommends for lib/pq, SQLite and MySQL without
// interpolateParams).
func TestBatchMixedTokens(t *testing.T) {
	for _, e := range Engines {
		e := e
		for _, prepare := range []bool{false, true} {
			name := e.Name
			if prepare {
				name += "/prepared"
			}
			t.Run(name, func(t *testing.T) { batchMixedTokens(t, e, prepare) })
		}
	}
}

// batchMixedTokens acknowledges six deliveries in one batch, three of them
// stale: those three get ErrLeaseLost, the others are deleted.
func batchMixedTokens(t *testing.T, e Engine, prepare bool) {
	db := e.Open(t, 8)
	table := batTable(t, e, db)
	clock := fakeclock.New(time.Date(2031, 3, 4, 5, 6, 7, 123456789, time.UTC))
	q := batQueuePrepared(t, e, db, table, clock, prepare || prepareAll)
	batEnqueue(t, q, db, 6)
	first := batClaim(t, q, 6)
	// The leases run out; another claim takes the three lowest ids
	// with new tokens, leaving the first three deliveries stale
	// and the last three still carrying their tokens.
	clock.Advance(2 * time.Minute)
	second := batClaim(t, q, 3)
	stale := map[any]bool{}
	for _, d := range second {
		stale[d.ID()] = true
	}
	// One batch of exactly six: MaxBatch fills, MaxWait never ends.
	b, err := q.NewBatcher(inbox.BatchConfig{MaxBatch: 6, MaxWait: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	errs := batSettleAll(first, func(d *inbox.Delivery) error { return b.Ack(context.Background(), d) })
	for i, d := range first {
		switch {
		case stale[d.ID()] && !errors.Is(errs[i], inbox.ErrLeaseLost):
			t.Errorf("stale job %v: got %v, want ErrLeaseLost", d.ID(), errs[i])
		case !stale[d.ID()] && errs[i] != nil:
			t.Errorf("live job %v: got %v, want nil", d.ID(), errs[i])
		}
		if err := d.Ack(context.Background()); !errors.Is(err, inbox.ErrSettled) {
			t.Errorf("job %v acked again: got %v, want ErrSettled", d.ID(), err)
		}
	}
	if n := batCount(t, db, table); n != 3 {
		t.Fatalf("%d rows left, want the 3 held by the second claim", n)
	}
	// The second claim's tokens are intact: its batch succeeds.
	b3, err := q.NewBatcher(inbox.BatchConfig{MaxBatch: 3, MaxWait: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer b3.Close()
	for i, err := range batSettleAll(second, func(d *inbox.Delivery) error { return b3.Ack(context.Background(), d) }) {
		if err != nil {
			t.Errorf("second claim's job %v: %v", second[i].ID(), err)
		}
	}
	if n := batCount(t, db, table); n != 0 {
		t.Fatalf("%d rows left, want none", n)
	}
}

// Release and Retry in one batch: the released job is claimable at once
// with its attempt given back, the retried one only after its delay. Both
// clocks: the injected one, and the engine's (SQLite has only the caller's).
func TestBatchReleaseRetry(t *testing.T) {
	for _, e := range Engines {
		e := e
		for _, injected := range []bool{true, false} {
			if !injected && e.IsSQLite() {
				continue
			}
			name := e.Name + "/engine-clock"
			if injected {
				name = e.Name + "/injected-clock"
			}
			t.Run(name, func(t *testing.T) {
				db := e.Open(t, 8)
				table := batTable(t, e, db)
				var clock *fakeclock.Clock
				if injected {
					clock = fakeclock.New(time.Date(2031, 3, 4, 5, 6, 7, 123456789, time.UTC))
				}
				q := batQueue(t, e, db, table, clock)
				batEnqueue(t, q, db, 3)
				ds := batClaim(t, q, 3)
				b, err := q.NewBatcher(inbox.BatchConfig{MaxBatch: 2, MaxWait: time.Hour})
				if err != nil {
					t.Fatal(err)
				}
				defer b.Close()
				errs := batSettleAll(ds[:2], func(d *inbox.Delivery) error {
					if d == ds[0] {
						return b.Release(context.Background(), d)
					}
					return b.Retry(context.Background(), d, time.Hour)
				})
				for i, err := range errs {
					if err != nil {
						t.Fatalf("settlement of job %v: %v", ds[i].ID(), err)
					}
				}
				// ds[1] waits for its delay, ds[2] still holds its lease.
				got, err := q.Claim(context.Background(), 5)
				if err != nil {
					t.Fatal(err)
				}
				if len(got) != 1 || got[0].ID() != ds[0].ID() || got[0].Attempt() != 1 {
					t.Fatalf("claimable after the batch: %v, want only job %v, with attempt 1 again", batIDs(got), ds[0].ID())
				}
				if !injected {
					return
				}
				clock.Advance(time.Hour + time.Minute)
				late := batClaim(t, q, 3)
				if ids := batIDs(late); fmt.Sprint(ids) != fmt.Sprint(batIDs(ds)) {
					t.Fatalf("after the delay: %v, want %v", ids, batIDs(ds))
				}
				for _, d := range late {
					if d.ID() == ds[1].ID() && d.Attempt() != 2 {
						t.Errorf("retried job delivered with attempt %d, want 2", d.Attempt())
					}
				}
			})
		}
	}
}
