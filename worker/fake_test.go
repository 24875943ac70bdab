package worker

// The loop's batches against the fake driver answering the Postgres lease
// statements from memory (fakedb.Lease, as the root's benchmarks).

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/fakedb"
)

// btQueue is a lease queue on f, with the engine's clock.
func btQueue(tb testing.TB, f *fakedb.Lease) *inbox.Queue {
	q, err := inbox.New(f.DB(tb).DB, inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "jobs", LockedUntil: "locked_until"}})
	if err != nil {
		tb.Fatal(err)
	}
	return q
}

// The batch loop settles a lease claim's jobs through a Batcher whose
// batches are full at the claim's size: handlers that succeed together are
// acknowledged in one statement (the wait here is an hour, so the batch
// never spreads), and one that runs on does not hold back the others past
// the wait, on the real clock (batch_test.go pins the same on timers the
// test fires).
func TestWorkBatchSharesStatements(t *testing.T) {
	run := func(t *testing.T, wait time.Duration, handle func(id any, acks func() [][]any) error) [][]any {
		f := fakedb.NewLease()
		q := btQueue(t, f)
		var mu sync.Mutex
		var acks [][]any // the distinct ids of each batch Ack, in order
		seen := func() [][]any {
			mu.Lock()
			defer mu.Unlock()
			return append([][]any(nil), acks...)
		}
		f.Seen = func(query string, args []driver.NamedValue) {
			if !strings.HasPrefix(query, "DELETE") {
				return
			}
			batch, err := fakedb.BatchIDs(args)
			if err != nil {
				t.Error(err)
			}
			var ids []any
			for _, id := range batch {
				ids = append(ids, id)
			}
			mu.Lock()
			acks = append(acks, ids)
			mu.Unlock()
		}
		w, err := newLoop(context.Background(), q, Config{Batch: 3, RetryForever: true}, func(_ context.Context, d *inbox.Delivery) error { return handle(d.ID(), seen) })
		if err != nil {
			t.Fatal(err)
		}
		w.batchWait = wait
		defer func() {
			for _, b := range w.batchers {
				b.Close()
			}
		}()
		ds, err := q.Claim(context.Background(), 3)
		if err != nil || len(ds) != 3 {
			t.Fatalf("Claim: %d jobs, %v", len(ds), err)
		}
		w.handleAll(ds)
		for _, d := range ds {
			if err := d.Release(context.Background()); !errors.Is(err, inbox.ErrSettled) {
				t.Errorf("job %v not settled: Release says %v", d.ID(), err)
			}
		}
		return seen()
	}
	sorted := func(acks [][]any) string {
		for _, ids := range acks {
			sort.Slice(ids, func(i, j int) bool { return ids[i].(int64) < ids[j].(int64) })
		}
		return fmt.Sprint(acks)
	}

	t.Run("together", func(t *testing.T) {
		acks := run(t, time.Hour, func(any, func() [][]any) error { return nil })
		if got := sorted(acks); got != "[[1 2 3]]" {
			t.Fatalf("batch acks %s, want one of [1 2 3]", got)
		}
	})
	t.Run("one runs on", func(t *testing.T) {
		acks := run(t, time.Millisecond, func(id any, seen func() [][]any) error {
			if id != int64(3) {
				return nil
			}
			// Job 3 finishes only once its siblings were acknowledged
			// (together, or apart on a machine too loaded to start both
			// within the wait).
			deadline := time.Now().Add(20 * time.Second)
			acked := func() (n int) {
				for _, ids := range seen() {
					n += len(ids)
				}
				return n
			}
			for acked() < 2 {
				if time.Now().After(deadline) {
					return errors.New("jobs 1 and 2 waited for job 3")
				}
				runtime.Gosched()
				time.Sleep(100 * time.Microsecond)
			}
			return nil
		})
		if got := sorted(acks); got != "[[1 2] [3]]" && got != "[[1] [2] [3]]" && got != "[[2] [1] [3]]" {
			t.Fatalf("batch acks %s, want [1 2] (or each alone) then [3]", got)
		}
	})
	t.Run("the first runs on", func(t *testing.T) {
		// The loop runs quick handlers in its own goroutine: job 1's,
		// which waits for its siblings' acknowledgements, must not keep
		// them from starting, or from being acknowledged, past the wait.
		acks := run(t, time.Millisecond, func(id any, seen func() [][]any) error {
			if id != int64(1) {
				return nil
			}
			deadline := time.Now().Add(20 * time.Second)
			for {
				n := 0
				for _, ids := range seen() {
					n += len(ids)
				}
				if n >= 2 {
					return nil
				}
				if time.Now().After(deadline) {
					return errors.New("jobs 2 and 3 waited for job 1")
				}
				runtime.Gosched()
				time.Sleep(100 * time.Microsecond)
			}
		})
		if got := sorted(acks); got != "[[2 3] [1]]" && got != "[[2] [3] [1]]" && got != "[[3] [2] [1]]" {
			t.Fatalf("batch acks %s, want [2 3] (or each alone) then [1]", got)
		}
	})
}

// BenchmarkWork16 is Run with Config.Batch 16 and a no-op
// handler, one job per op: the loop's own cost over the root's BenchmarkClaimAckAll16
// (goroutines, keepers, the gathering of a batch's acks).
func BenchmarkWork16(b *testing.B) {
	f := fakedb.NewLease()
	q := btQueue(b, f)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var handled atomic.Int64
	n := int64(b.N)
	b.ReportAllocs()
	b.ResetTimer()
	err := Run(ctx, q, Config{Batch: 16, RetryForever: true}, func(context.Context, *inbox.Delivery) error {
		if handled.Add(1) >= n {
			cancel()
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}
