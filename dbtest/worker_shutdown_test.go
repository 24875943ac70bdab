package dbtest

// Shutdown in two steps (issue 22 item 4): when Run's context ends the
// loops stop claiming, the running handlers go on for Config.Grace, and
// then their contexts end with cause worker.ErrShutdown and their jobs go
// back without spending the attempt, under every form.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/worker"
)

// workXSlack bounds how long after its grace period a Run whose handlers
// return when their contexts end may take to return: their releases and
// the loops' own return, on a loaded machine.
const workXSlack = 5 * time.Second

// TestWorkShutdown: the loops' context ends while a handler runs, on every
// engine and form. The idle loops return at once; the handler's context
// lives on through the grace period, then ends with cause
// worker.ErrShutdown; the handler's failure releases the job: its attempt
// is not spent, nothing delays it, no lock is left, and a claim takes it at
// once. The busy loop returns within the grace period and a bounded slack.
func TestWorkShutdown(t *testing.T) {
	const grace = time.Second
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, workXLoops+2)
		table := newTable(t, e, db, "work_shutdown_"+form)
		q := newQueue(t, db, queueConfig(e, Table(table, form), nil))
		id := enqueueOne(t, q, db, "shutdown")
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		started := make(chan int, 1)
		atShutdown, cause := make(chan error, 1), make(chan error, 1)
		returned := make(chan error, workXLoops)
		for range workXLoops {
			go func() {
				returned <- worker.Run(ctx, q, worker.Config{Poll: workXNever, Grace: grace}, func(hctx context.Context, d *inbox.Delivery) error {
					// What the handler's context says as the loop's ends.
					stop := context.AfterFunc(ctx, func() { atShutdown <- hctx.Err() })
					defer stop()
					started <- d.Attempt()
					<-hctx.Done()
					cause <- context.Cause(hctx)
					return hctx.Err()
				})
			}()
		}
		if a := workXRecv(t, started, "the handler"); a != 1 {
			t.Fatalf("delivered attempt %d, want 1", a)
		}
		cancelled := time.Now()
		cancel()
		for i := range workXLoops {
			if err := workXRecv(t, returned, "the loops' return"); err != nil {
				t.Errorf("Run: %v", err)
			}
			if i == workXLoops-2 {
				// The idle ones have returned; the busy one has not.
				if err := workXRecv(t, atShutdown, "the handler's context at the shutdown"); err != nil {
					t.Errorf("the handler's context ended (%v) with the loop's, before the grace period", err)
				}
			}
		}
		if took := time.Since(cancelled); took > grace+workXSlack {
			t.Errorf("the busy loop returned %v after its context ended, want within the grace period %v and %v", took, grace, workXSlack)
		}
		if err := workXRecv(t, cause, "the handler's cause"); !errors.Is(err, worker.ErrShutdown) {
			t.Errorf("the handler's context ended with cause %v, want worker.ErrShutdown", err)
		}
		if n := attemptOf(t, e, db, table, id); n != 1 {
			t.Errorf("attempt %d after the shutdown, want 1: the attempt was spent", n)
		}
		if due := workXTime(t, e, db, table, workXDueCol(form), id); !due.IsZero() {
			t.Errorf("%s %v after the shutdown, want NULL: the job was not given back", workXDueCol(form), due)
		}
		idleSoon(t, db, q)
		noLocks(t, e, db, table, []string{fmt.Sprint(id)})
		d := claimOne(t, q)
		if d.ID() != id || d.Attempt() != 1 {
			t.Errorf("claimed %v at attempt %d, want %v at 1", d.ID(), d.Attempt(), id)
		}
		if err := d.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// TestWorkShutdownCut: eight loops over two pools, each run again and again
// with a context ended at a random point and a random grace period (none,
// or up to 20 ms), on every engine and form, until 48 jobs are acked. The
// first run of each job works until its context ends, which must be by the
// shutdown (worker.ErrShutdown); its job must then come back at once, its
// attempt not spent: every job is delivered at attempt 1, the second run
// acks it, and no job runs twice at once. Each Run returns within its grace
// period and a bounded slack after its context ended.
func TestWorkShutdownCut(t *testing.T) {
	const (
		loops = workXLoops
		jobs  = 48
	)
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		db1, db2 := openTwo(t, e, loops/2+2)
		table := newTable(t, e, db1, "work_cut_"+form)
		q1 := newQueue(t, db1, queueConfig(e, Table(table, form), nil))
		q2 := newQueue(t, db2, queueConfig(e, Table(concQualified(t, e, db1, table), form), nil))
		for i := range jobs {
			enqueueOne(t, q1, db1, fmt.Sprint("job ", i))
		}
		var (
			mu      sync.Mutex
			running = map[string]bool{}
			runs    = map[string]int{}
			stopped int // runs stopped by a shutdown
		)
		handle := func(ctx context.Context, d *inbox.Delivery) error {
			id := concKey(d.ID())
			mu.Lock()
			if running[id] {
				t.Errorf("job %s runs twice at once", id)
			}
			running[id] = true
			runs[id]++
			first := runs[id] == 1
			mu.Unlock()
			defer func() {
				mu.Lock()
				running[id] = false
				mu.Unlock()
			}()
			if d.Attempt() != 1 {
				t.Errorf("job %s delivered at attempt %d, want 1: a shutdown spent an attempt", id, d.Attempt())
			}
			if !first {
				return nil
			}
			<-ctx.Done()
			if cause := context.Cause(ctx); !errors.Is(cause, worker.ErrShutdown) {
				t.Errorf("job %s: the handler's context ended with cause %v, want worker.ErrShutdown", id, cause)
			}
			mu.Lock()
			stopped++
			mu.Unlock()
			return ctx.Err()
		}
		workXShutdownCut(t, []*inbox.Queue{q1, q2}, loops, handle, func() bool { return countRows(t, db1, table) == 0 })
		mu.Lock()
		defer mu.Unlock()
		if len(runs) != jobs || stopped != jobs {
			t.Errorf("%d jobs run, %d runs stopped by a shutdown; want %d and %d", len(runs), stopped, jobs, jobs)
		}
		for id, n := range runs {
			if n != 2 {
				t.Errorf("job %s ran %d times, want twice (stopped, then acked)", id, n)
			}
		}
		idleSoon(t, db1, q1)
		idleSoon(t, db2, q2)
	})
}

// workXShutdownCut runs loops goroutines, each running worker.Run on one of
// qs in turn with a context ended after a random 0–30 ms and a random
// Grace (none, or 0–20 ms), until drained reports true. Each Run must
// return within its grace period and workXSlack after its context ended.
func workXShutdownCut(t *testing.T, qs []*inbox.Queue, loops int, handle worker.Handler, drained func() bool) {
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := range loops {
		q := qs[i%len(qs)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 22))
			for {
				select {
				case <-stop:
					return
				default:
				}
				grace := time.Duration(rng.IntN(20_000)) * time.Microsecond
				if rng.IntN(4) == 0 {
					grace = -1 // none: River's StopAndCancel
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(30_000))*time.Microsecond)
				ended := make(chan time.Time, 1)
				context.AfterFunc(ctx, func() { ended <- time.Now() })
				err := worker.Run(ctx, q, worker.Config{Poll: workXPoll, Grace: grace}, handle)
				cancel()
				if err != nil {
					t.Errorf("Run: %v", err)
				}
				if took := time.Since(<-ended); took > max(grace, 0)+workXSlack {
					t.Errorf("Run returned %v after its context ended, want within its grace period %v and %v", took, grace, workXSlack)
				}
			}
		}()
	}
	workXUntil(t, "the drain", func() error {
		if !drained() {
			return fmt.Errorf("jobs left")
		}
		return nil
	})
	close(stop)
	wg.Wait()
}

// TestWorkShutdownLeaseExtended: a lease job's lease (2 s, extended each
// second) is still extended through a grace period longer than it (3 s):
// the lease stored moves past the one held when the loops' context ended,
// and the handler's context ends with worker.ErrShutdown, not with
// inbox.ErrLeaseLost at the lease's end, as it did when a shutdown paused
// the keepers. The job is then released, its attempt not spent.
func TestWorkShutdownLeaseExtended(t *testing.T) {
	const lease, grace = 2 * time.Second, 3 * time.Second
	eachEngine(t, nil, func(t *testing.T, e Engine) {
		db := e.Open(t, workXLoops+2)
		table := newTable(t, e, db, "work_shutdown_extended")
		cfg := queueConfig(e, Table(table, "lease"), nil)
		cfg.Lease = lease
		q := newQueue(t, db, cfg)
		id := enqueueOne(t, q, db, "extended")
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		started, cause := make(chan struct{}, 1), make(chan error, 1)
		returned := make(chan error, workXLoops)
		for range workXLoops {
			go func() {
				returned <- worker.Run(ctx, q, worker.Config{Poll: workXNever, Grace: grace}, func(hctx context.Context, d *inbox.Delivery) error {
					started <- struct{}{}
					<-hctx.Done()
					cause <- context.Cause(hctx)
					return hctx.Err()
				})
			}()
		}
		workXRecv(t, started, "the handler")
		held := lockedUntilOf(t, e, db, table, id)
		cancel()
		workXUntil(t, "an extension during the grace period", func() error {
			if now := lockedUntilOf(t, e, db, table, id); !now.After(held) {
				return fmt.Errorf("lease %v, still the %v held at the shutdown", now, held)
			}
			return nil
		})
		if err := workXRecv(t, cause, "the handler's cause"); !errors.Is(err, worker.ErrShutdown) {
			t.Errorf("the handler's context ended with cause %v, want worker.ErrShutdown", err)
		}
		for range workXLoops {
			if err := workXRecv(t, returned, "the loops' return"); err != nil {
				t.Errorf("Run: %v", err)
			}
		}
		if n := attemptOf(t, e, db, table, id); n != 1 {
			t.Errorf("attempt %d after the shutdown, want 1", n)
		}
		if until := lockedUntilOf(t, e, db, table, id); !until.IsZero() {
			t.Errorf("lease %v after the shutdown, want NULL", until)
		}
	})
}
