package dbtest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/worker"
)

// TestWorkCancelInWork (issue 23 item 4): eight worker.Run loops over two
// pools each hold a lease job; an operator cancels all eight through
// Queue.Cancel. Every handler's context ends with cause ErrCancelled (its
// keeper's next extension, within half a lease, finds the row gone), every
// job is gone, and none is handled again. Every engine and driver.
func TestWorkCancelInWork(t *testing.T) {
	eachForm(t, leaseOnly, func(t *testing.T, e Engine, form string) {
		db1, db2 := openTwo(t, e, workXLoops/2+2)
		table := newTable(t, e, db1, "work_cancel")
		cfg1 := queueConfig(e, Table(table, form), nil)
		cfg1.Lease = 2 * time.Second
		cfg2 := queueConfig(e, Table(concQualified(t, e, db1, table), form), nil)
		cfg2.Lease = cfg1.Lease
		qs := []*inbox.Queue{newQueue(t, db1, cfg1), newQueue(t, db2, cfg2)}
		for i := range workXLoops {
			enqueueOne(t, qs[0], db1, fmt.Sprint("job ", i))
		}
		started := make(chan any, 2*workXLoops)
		causes := make(chan error, 2*workXLoops)
		h := func(hctx context.Context, d *inbox.Delivery) error {
			started <- d.ID()
			<-hctx.Done()
			causes <- context.Cause(hctx)
			return hctx.Err()
		}
		// One job a loop: each claims one and works on it until cancelled.
		cfg := worker.Config{Poll: workXNever, Batch: 1}
		workXStart(t, qs[0], workXLoops/2, cfg, h)
		workXStart(t, qs[1], workXLoops/2, cfg, h)
		ids := map[any]bool{}
		for range workXLoops {
			ids[workXRecv(t, started, "a handler's start")] = true
		}
		if len(ids) != workXLoops {
			t.Fatalf("%d distinct jobs in work, want %d", len(ids), workXLoops)
		}
		ctx := context.Background()
		for id := range ids {
			if err := qs[0].Cancel(ctx, id); err != nil {
				t.Fatalf("Cancel(%v): %v", id, err)
			}
		}
		for range workXLoops {
			if cause := workXRecv(t, causes, "a handler's end"); !errors.Is(cause, inbox.ErrCancelled) || !errors.Is(cause, inbox.ErrLeaseLost) {
				t.Errorf("a handler ended with cause %v, want ErrCancelled (matching ErrLeaseLost)", cause)
			}
		}
		if n := countRows(t, db1, table); n != 0 {
			t.Errorf("%d jobs left after the cancels, want none", n)
		}
		select {
		case id := <-started:
			t.Errorf("job %v handled again after its cancel", id)
		default:
		}
	})
}
