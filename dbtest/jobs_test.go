package dbtest

// Jobs through the queue: enqueue one, claim one or none, a pool that must
// end idle, and workers that drain a queue in batches.

import (
	"context"
	"database/sql"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
)

func enqueueKey(t testing.TB, eq *inbox.Queue, db *sql.DB, p, key string) any {
	t.Helper()
	id, err := eq.Enqueue(context.Background(), db, inbox.Job{Data: []any{[]byte(p), key}})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// enqueueOne enqueues one job with payload p through db and returns its id.
func enqueueOne(t testing.TB, q *inbox.Queue, db *sql.DB, p string) any {
	t.Helper()
	id, err := q.Enqueue(context.Background(), db, inbox.Job{Data: []any{[]byte(p)}})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// claimOne claims and expects exactly one delivery.
func claimOne(t testing.TB, q *inbox.Queue) *inbox.Delivery {
	t.Helper()
	ds, err := q.Claim(context.Background(), 5)
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	if len(ds) != 1 {
		for _, d := range ds {
			_ = d.Release(context.Background())
		}
		t.Fatalf("claimed %d jobs, want 1", len(ds))
	}
	return ds[0]
}

// claimNone claims and expects nothing.
func claimNone(t testing.TB, q *inbox.Queue, why string) {
	t.Helper()
	ds, err := q.Claim(context.Background(), 5)
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	if len(ds) != 0 {
		ids := make([]any, len(ds))
		for i, d := range ds {
			ids[i] = d.ID()
			_ = d.Release(context.Background())
		}
		t.Fatalf("%s: claimed %v, want nothing", why, ids)
	}
}

func payloadOf(t testing.TB, d *inbox.Delivery) string {
	t.Helper()
	var p []byte
	if err := d.Scan(&p); err != nil {
		t.Fatal(err)
	}
	return string(p)
}

// mustBeIdle checks that the queue holds no job and the pool no connection:
// every test must end so.
func mustBeIdle(t testing.TB, db *sql.DB, qs ...*inbox.Queue) {
	t.Helper()
	for _, q := range qs {
		if n := q.InWork(); n != 0 {
			t.Errorf("queue still holds %d jobs", n)
		}
	}
	if n := db.Stats().InUse; n != 0 {
		t.Errorf("%d connections still checked out", n)
	}
}

// idleSoon is mustBeIdle for the moments after a cancellation, when
// database/sql may still be handing a connection back from a goroutine of
// its own: it waits for the pool to settle, up to a deadline.
func idleSoon(t testing.TB, db *sql.DB, qs ...*inbox.Queue) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for db.Stats().InUse != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond) // polling a pool counter, with a deadline
	}
	mustBeIdle(t, db, qs...)
}

// runWorkers has workers claim from q in batches and hand each delivery to
// handle, which settles it, until n deliveries were made. A worker whose claim
// finds nothing waits until another worker settles a batch, rather than
// polling; a run where no one progresses for three minutes fails.
func runWorkers(t *testing.T, q *inbox.Queue, n, workers, batch int, handle func(ctx context.Context, d *inbox.Delivery) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var (
		mu        sync.Mutex
		delivered int
		wake      = make(chan struct{})
		failed    atomic.Bool
		wg        sync.WaitGroup
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				mu.Lock()
				if delivered >= n {
					mu.Unlock()
					return
				}
				seen := wake
				mu.Unlock()
				ds, err := q.Claim(ctx, batch)
				if err != nil {
					for _, d := range ds {
						_ = d.Release(context.WithoutCancel(ctx))
					}
					if ctx.Err() == nil {
						t.Errorf("claim: %v", err)
						failed.Store(true)
						cancel()
					}
					return
				}
				if len(ds) == 0 {
					select {
					case <-seen:
					case <-ctx.Done():
					}
					continue
				}
				mu.Lock()
				delivered += len(ds)
				mu.Unlock()
				for _, d := range ds {
					if err := handle(ctx, d); err != nil {
						t.Errorf("job %v: %v", d.ID(), err)
						failed.Store(true)
						cancel()
					}
				}
				mu.Lock()
				close(wake)
				wake = make(chan struct{})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if ctx.Err() != nil && !failed.Load() {
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("workers stalled: %d of %d jobs delivered before the deadline", delivered, n)
	}
}

// claimSoon polls q until it claims a job, returning it and how long it
// took.
func claimSoon(t *testing.T, q *inbox.Queue, timeout time.Duration) (*inbox.Delivery, time.Duration) {
	t.Helper()
	start := time.Now()
	for {
		ds, err := q.Claim(context.Background(), 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) == 1 {
			return ds[0], time.Since(start)
		}
		if time.Since(start) > timeout {
			t.Fatalf("no job claimable %v after the cut", timeout)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
