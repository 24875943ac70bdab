package dbtest

// worker.Config.Workers (issue 22 item 7): n loops in one Run call, and the
// pool they need under the forms that hold a connection per job in work.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/worker"
)

// TestWorkWorkers: one Run call with Workers 8 runs eight loops, on every
// engine and form, over two pools.
//
//   - refused: under the row lock and the advisory form on PostgreSQL and
//     MySQL, a pool one connection short of Workers × Batch + 1 is refused
//     at start with an error naming the SetMaxOpenConns to call; the job
//     enqueued before is untouched. Before, such loops ran one job fewer
//     than asked, without a word.
//   - all in work: with the pool Run asks for (Workers × Batch + 1), every
//     loop of both calls has its job in work at once: sixteen handlers wait
//     for each other, and all sixteen jobs are acknowledged.
//   - one fails, all stop: a loop that meets an error that cannot heal (a
//     dead table that does not exist) stops its seven siblings, and Run
//     returns that error.
func TestWorkWorkers(t *testing.T) {
	const workers = workXLoops
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		t.Run("refused", func(t *testing.T) {
			const batch = 2
			db1, db2 := openTwo(t, e, workers*batch)
			table := newTable(t, e, db1, "work_workers_refused_"+form)
			q1 := newQueue(t, db1, queueConfig(e, Table(table, form), nil))
			q2 := newQueue(t, db2, queueConfig(e, Table(concQualified(t, e, db1, table), form), nil))
			id := enqueueOne(t, q1, db1, "untouched")
			if q1.MaxInWork() < 0 {
				return // the lease and SQLite's advisory form hold no connection per job: all in work shows it
			}
			cfg := worker.Config{Workers: workers, Batch: batch, Poll: workXPoll}
			for _, q := range []*inbox.Queue{q1, q2} {
				err := worker.Run(context.Background(), q, cfg, func(context.Context, *inbox.Delivery) error {
					t.Error("a handler ran")
					return nil
				})
				if !errors.Is(err, inbox.ErrPoolTooSmall) || !strings.Contains(err.Error(), "db.SetMaxOpenConns(17) or more (the pool allows 16)") {
					t.Errorf("Run: %v; want ErrPoolTooSmall asking for SetMaxOpenConns(17)", err)
				}
			}
			if n := attemptOf(t, e, db1, table, id); n != 1 {
				t.Errorf("attempt %d, want 1: nothing may have changed", n)
			}
		})
		t.Run("all in work", func(t *testing.T) {
			workWorkersAllInWork(t, e, form, workers)
		})
		t.Run("one fails, all stop", func(t *testing.T) {
			db := e.Open(t, workers+1)
			table := newTable(t, e, db, "work_workers_stop_"+form)
			tb := Table(table, form)
			tb.DeadTable = table + "_nodead"
			q := newQueue(t, db, queueConfig(e, tb, nil))
			enqueueOne(t, q, db, "buried")
			returned := make(chan error, 1)
			go func() {
				returned <- worker.Run(context.Background(), q, worker.Config{Workers: workers, Poll: workXPoll, MaxAttempts: 1},
					func(context.Context, *inbox.Delivery) error { return errors.New("failed") })
			}()
			err := workXRecv(t, returned, "Run's return after a loop met a missing dead table")
			var se *inbox.SchemaError
			if !errors.As(err, &se) || !strings.Contains(err.Error(), tb.DeadTable) {
				t.Errorf("Run returned %v, want a *inbox.SchemaError naming %s", err, tb.DeadTable)
			}
		})
	})
}

// workWorkersAllInWork runs two Run calls of n loops each, on two pools of
// n + 1 connections, on 2n jobs whose handlers return only once all 2n are
// running at once.
func workWorkersAllInWork(t *testing.T, e Engine, form string, n int) {
	db1, db2 := openTwo(t, e, n+1)
	table := newTable(t, e, db1, "work_workers_all_"+form)
	q1 := newQueue(t, db1, queueConfig(e, Table(table, form), nil))
	q2 := newQueue(t, db2, queueConfig(e, Table(concQualified(t, e, db1, table), form), nil))
	for i := 0; i < 2*n; i++ {
		enqueueOne(t, q1, db1, fmt.Sprint("job ", i))
	}
	var (
		mu      sync.Mutex
		running int
		all     = make(chan struct{})
		handled = map[string]int{}
	)
	handle := func(ctx context.Context, d *inbox.Delivery) error {
		mu.Lock()
		handled[concKey(d.ID())]++
		if running++; running == 2*n {
			close(all)
		}
		mu.Unlock()
		deadline := time.NewTimer(workXDeadline)
		defer deadline.Stop()
		select {
		case <-all:
			return nil
		case <-deadline.C:
			return fmt.Errorf("job %v: %d handlers in work at most, want %d", d.ID(), running, 2*n)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	returned := make(chan error, 2)
	for _, q := range []*inbox.Queue{q1, q2} {
		go func(q *inbox.Queue) {
			returned <- worker.Run(ctx, q, worker.Config{Workers: n, Poll: workXPoll}, handle)
		}(q)
	}
	workXRecv(t, all, fmt.Sprintf("%d handlers in work at once", 2*n))
	workXUntil(t, "the acks", func() error {
		if c := countRows(t, db1, table); c != 0 {
			return fmt.Errorf("%d rows left", c)
		}
		return nil
	})
	cancel()
	for i := 0; i < 2; i++ {
		if err := workXRecv(t, returned, "Run's return"); err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for id, k := range handled {
		if k != 1 {
			t.Errorf("job %s handled %d times, want once", id, k)
		}
	}
	if len(handled) != 2*n {
		t.Errorf("%d jobs handled, want %d", len(handled), 2*n)
	}
}
