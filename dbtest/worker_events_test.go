package dbtest

// The worker loop's events (worker.Config.OnEvent, issue 22 item 6) on every
// engine, driver and form: one start and one end per handler run, with the
// outcome the database shows, under eight loops over two pools whose
// contexts end at random.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/worker"
)

// TestWorkEvents: eight loops of batches of two over two pools, four Run
// calls of two Workers, drain a table, each call's context ended at a
// random point and the call made again. A fifth of the jobs' handlers fail (MaxAttempts 2). Each handler run
// has one EventStart before it and one EventEnd of its attempt; a job that
// succeeds ends acked once; one that fails ends retried at attempt 1 and
// dead at attempt 2, once each, and released in between as often as its
// loop stopped under it (row lock and advisory: attempt not spent). No
// settlement fails, no loop error is reported, the table ends empty and the
// dead table holds the failed jobs.
func TestWorkEvents(t *testing.T) {
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		jobs := 150
		if e.IsSQLite() && raceBuild() {
			jobs = 60
		}
		workEvents(t, e, form, jobs)
	})
}

// workXEvents records a loop's events and its handlers' runs by job.
type workXEvents struct {
	mu      sync.Mutex
	events  map[string][]worker.Event
	runs    map[string]int // handler runs
	running map[string]bool
	others  []worker.Event // events without a job
}

func (r *workXEvents) on(e worker.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e.Kind == worker.EventError || e.ID == nil {
		r.others = append(r.others, e)
		return
	}
	id := concKey(e.ID)
	r.events[id] = append(r.events[id], e)
}

func workEvents(t *testing.T, e Engine, form string, jobs int) {
	const (
		loops   = 8 // four per pool
		workers = 2 // loops per Run call
		batch   = 2
	)
	db1, db2 := openTwo(t, e, loops/2*batch+2)
	table := concTable(t, e, db1, "work_events_"+form)
	q1 := newQueue(t, db1, queueConfig(e, Table(table, form), nil))
	q2 := newQueue(t, db2, queueConfig(e, Table(concQualified(t, e, db1, table), form), nil))
	want := concFill(t, e, db1, table, jobs, jobs)
	fails := func(d *inbox.Delivery) bool {
		return strings.HasSuffix(workXPayload(t, d), "0") || strings.HasSuffix(workXPayload(t, d), "3")
	}

	r := &workXEvents{events: map[string][]worker.Event{}, runs: map[string]int{}, running: map[string]bool{}}
	// No grace period: a cut ends the handlers' contexts at once, so that
	// some jobs end released.
	cfg := worker.Config{Workers: workers, Poll: workXPoll, Batch: batch, MaxAttempts: 2, OnEvent: r.on,
		Backoff: func(int) time.Duration { return 0 }, Grace: -1}
	handle := func(ctx context.Context, d *inbox.Delivery) error {
		id := concKey(d.ID())
		r.mu.Lock()
		if r.running[id] {
			t.Errorf("job %s handled by two loops at once", id)
		}
		r.running[id], r.runs[id] = true, r.runs[id]+1
		starts := 0
		for _, e := range r.events[id] {
			if e.Kind == worker.EventStart {
				starts++
			}
		}
		if starts != r.runs[id] {
			t.Errorf("job %s: handler run %d after %d starts, want after its own", id, r.runs[id], starts)
		}
		r.mu.Unlock()
		defer func() {
			r.mu.Lock()
			r.running[id] = false
			r.mu.Unlock()
		}()
		// A moment's work, cut short when the handler's context ends (the
		// loop stops): a failure then releases the job.
		work := time.NewTimer(time.Duration(rand.IntN(2000)) * time.Microsecond)
		defer work.Stop()
		select {
		case <-work.C:
		case <-ctx.Done():
		}
		if fails(d) {
			return fmt.Errorf("job %s fails", id)
		}
		return nil
	}
	workXRunCut(t, []*inbox.Queue{q1, q2}, loops/workers, cfg, handle, func() int { return countRows(t, db1, table) })
	dead, released := 0, 0
	for _, es := range r.events {
		for _, ev := range es {
			if ev.Outcome == worker.OutcomeReleased {
				released++
			}
		}
	}
	t.Logf("%d jobs, %d released by a loop stopping", jobs, released)
	for id := range want {
		dead += workXCheckEvents(t, id, r.events[id], r.runs[id])
	}
	if len(r.events) != len(want) {
		t.Errorf("events for %d jobs, %d enqueued", len(r.events), len(want))
	}
	for _, ev := range r.others {
		t.Errorf("event without a job: %+v", ev)
	}
	if n := countRows(t, db1, table+"_dead"); n != dead || dead == 0 {
		t.Errorf("%d dead rows, %d jobs ended dead (want as many, some)", n, dead)
	}
}

// workXRunCut makes calls Run calls over qs (in turn) until left reports no
// job left, each call cut off after a random stretch and made again, and
// then stops them. It fails when no job leaves for workXDeadline: on a
// loaded machine the whole drain may take longer.
func workXRunCut(t *testing.T, qs []*inbox.Queue, calls int, cfg worker.Config, handle worker.Handler, left func() int) {
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := range calls {
		q := qs[i%len(qs)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 11))
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(20_000))*time.Microsecond)
				if err := worker.Run(ctx, q, cfg, handle); err != nil {
					t.Errorf("Run: %v", err)
				}
				cancel()
			}
		}()
	}
	for last, moved := -1, time.Now(); ; {
		n := left()
		if n == 0 {
			break
		}
		if n != last {
			last, moved = n, time.Now()
		}
		if time.Since(moved) > workXDeadline {
			t.Errorf("%d jobs left, none for %v", n, workXDeadline)
			break
		}
		time.Sleep(10 * time.Millisecond) // polling the table, with a deadline
	}
	close(stop)
	wg.Wait()
}

// workXCheckEvents checks one job's events against its handler's runs and
// returns 1 when it ended dead. A job's next run may start before the end
// of the one before is told (its settlement has committed), so the starts
// and the ends are matched by attempt, not by order.
func workXCheckEvents(t *testing.T, id string, es []worker.Event, runs int) int {
	t.Helper()
	starts := map[int]int{}
	var ends []string
	for _, e := range es {
		switch e.Kind {
		case worker.EventStart:
			starts[e.Attempt]++
		case worker.EventEnd:
			starts[e.Attempt]--
			if e.SettleErr != nil || e.Duration < 0 {
				t.Errorf("job %s: end %+v", id, e)
			}
			if e.Outcome != worker.OutcomeReleased {
				ends = append(ends, fmt.Sprintf("%v@%d", e.Outcome, e.Attempt))
			}
		}
	}
	for a, n := range starts {
		if n != 0 {
			t.Errorf("job %s: attempt %d has %d more starts than ends", id, a, n)
		}
	}
	if len(es) != 2*runs {
		t.Errorf("job %s: %d events for %d handler runs", id, len(es), runs)
	}
	slices.Sort(ends)
	switch got := strings.Join(ends, " "); got {
	case "acked@1":
		return 0
	case "dead@2 retried@1":
		return 1
	default:
		t.Errorf("job %s ended %q (releases left out), want acked@1, or retried@1 and dead@2", id, got)
	}
	return 0
}
