package worker

import (
	"context"
	"database/sql/driver"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/fakedb"
)

// claimWatch counts the lease claims in progress at the fake, and holds
// each until hold returns.
type claimWatch struct {
	active, most, claims atomic.Int32
	hold                 func(n int32)
}

func (c *claimWatch) seen(query string, _ []driver.NamedValue) {
	if !strings.HasPrefix(query, "WITH picked") {
		return
	}
	c.claims.Add(1)
	n := c.active.Add(1)
	for m := c.most.Load(); n > m && !c.most.CompareAndSwap(m, n); m = c.most.Load() {
	}
	c.hold(n)
	c.active.Add(-1)
}

// waitFor polls cond until it holds, failing the test after a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s", what)
		}
		runtime.Gosched()
		time.Sleep(time.Millisecond)
	}
}

// parkedForTurn counts the goroutines waiting for a turn to claim.
func parkedForTurn() int {
	buf := make([]byte, 1<<20)
	return strings.Count(string(buf[:runtime.Stack(buf, true)]), "(*loop).waitClaimTurn")
}

// runLoopsOn starts Run with cfg on a lease queue answered by f and
// returns its stop, which waits for Run to return.
func runLoopsOn(t *testing.T, f *fakedb.Lease, cfg Config) (stop func()) {
	q := btQueue(t, f)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, q, cfg, func(context.Context, *inbox.Delivery) error { return nil })
	}()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
}

// TestRunClaimTurns: the loops of one Run call claim at most
// claimRowsAtOnce jobs at once. With batches of 1,000, four loops claim one
// at a time: while one claim is held at the database, the three others
// wait for their turn and none reaches it. With batches of one, the four
// claim side by side.
func TestRunClaimTurns(t *testing.T) {
	t.Run("batch 1000", func(t *testing.T) {
		release := make(chan struct{})
		var first atomic.Bool
		w := &claimWatch{hold: func(int32) {
			if first.CompareAndSwap(false, true) {
				<-release
			}
		}}
		f := fakedb.NewLease()
		f.Seen = w.seen
		stop := runLoopsOn(t, f, Config{Workers: 4, Batch: 1000, RetryForever: true})
		waitFor(t, "three loops waiting for their turn to claim", func() bool { return parkedForTurn() == 3 })
		if n := w.active.Load(); n != 1 {
			t.Errorf("%d claims at the database while the first is held, want 1", n)
		}
		close(release)
		waitFor(t, "twenty claims", func() bool { return w.claims.Load() >= 20 })
		stop()
		if m := w.most.Load(); m != 1 {
			t.Errorf("%d claims of 1,000 were at the database at once, want 1", m)
		}
	})
	t.Run("batch 1", func(t *testing.T) {
		release := make(chan struct{})
		var opened atomic.Bool
		w := &claimWatch{}
		w.hold = func(n int32) {
			if n == 4 && opened.CompareAndSwap(false, true) {
				close(release)
			}
			<-release
		}
		f := fakedb.NewLease()
		f.Seen = w.seen
		stop := runLoopsOn(t, f, Config{Workers: 4, Batch: 1, RetryForever: true})
		waitFor(t, "four claims at the database at once", func() bool { return opened.Load() })
		stop()
		if n := parkedForTurn(); n != 0 {
			t.Errorf("%d goroutines wait for a turn to claim with batches of one", n)
		}
	})
}
