package dbtest

// The handler decides its job's fate (issue 22 item 5), on every engine and
// form: worker.Permanent, worker.Snooze, Config.Timeout, and a handler that
// settles its delivery itself.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/worker"
)

// TestWorkFates: eight loops over two pools, one job per fate, every engine
// and form, a backoff of an hour:
//
//   - permanent: worker.Permanent at attempt 1 of 25 moves the job to the
//     dead table at once, with that attempt;
//   - snooze: worker.Snooze(2h) delays the job two hours, not the backoff's
//     one, its attempt spent (stored 2), no error reported;
//   - timeout: Config.Timeout ends the handler's context with cause
//     worker.ErrTimeout; the failure retries after the backoff;
//   - own release, own ack, own dead, own retry: a handler that settles its
//     delivery itself, then returns an error or nil, has its settlement
//     stand; the loop sends nothing more, reports nothing to OnError, and
//     tells the end as OutcomeSettled. The released job comes back at
//     attempt 1 and its second run acks it.
func TestWorkFates(t *testing.T) {
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		for _, batch := range []int{1, 4} {
			t.Run(fmt.Sprint("batch ", batch), func(t *testing.T) { workFates(t, e, form, batch) })
		}
	})
}

// workFates is TestWorkFates with claims of batch jobs: those of a lease
// batch settle through a Batcher.
func workFates(t *testing.T, e Engine, form string, batch int) {
	db1, db2 := openTwo(t, e, workXLoops/2*batch+1)
	table := newTable(t, e, db1, "work_fates_"+form)
	q1 := newQueue(t, db1, queueConfig(e, Table(table, form), nil))
	q2 := newQueue(t, db2, queueConfig(e, Table(concQualified(t, e, db1, table), form), nil))
	fates := []string{"permanent", "snooze", "timeout", "own release", "own ack", "own dead", "own retry"}
	ids := map[string]any{}
	for _, f := range fates {
		ids[f] = enqueueOne(t, q1, db1, f)
	}
	r := &workXFates{t: t, outcomes: map[string][]worker.Outcome{}, causes: map[string]error{}, ended: make(chan struct{}, 2*len(fates))}
	cfg := worker.Config{
		Poll:    workXPoll,
		Batch:   batch,
		Backoff: func(int) time.Duration { return workXFateBackoff },
		Timeout: time.Second, // the handlers' own settlements run under it too
		OnError: func(err error) { r.mu.Lock(); r.reported = append(r.reported, err); r.mu.Unlock() },
		OnEvent: r.on,
	}
	cancel := workXRunOn(t, []*inbox.Queue{q1, q2}, workXLoops, cfg, r.handle)
	for range len(fates) + 1 { // the released job runs twice
		workXRecv(t, r.ended, "the jobs' ends")
	}
	cancel()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.reported) != 0 {
		t.Errorf("OnError got %v, want nothing", r.reported)
	}
	if !errors.Is(r.causes["timeout"], worker.ErrTimeout) {
		t.Errorf("the timed-out handler's context ended with cause %v, want worker.ErrTimeout", r.causes["timeout"])
	}
	want := map[string]string{
		"permanent": "[dead]", "snooze": "[snoozed]", "timeout": "[retried]", "own release": "[acked settled]",
		"own ack": "[settled]", "own dead": "[settled]", "own retry": "[settled]",
	}
	for f, w := range want {
		// A job's next run may end before the end of the one before
		// is told: compared in Outcome order.
		got := r.outcomes[concKey(ids[f])]
		slices.Sort(got)
		if fmt.Sprint(got) != w {
			t.Errorf("%s: outcomes %v, want %s", f, got, w)
		}
	}
	workFatesRows(t, e, db1, table, form, ids)
}

// The backoff and the snooze of TestWorkFates.
const workXFateBackoff, workXFateSnooze = time.Hour, 2 * time.Hour

// workXFates is what TestWorkFates' handlers and hooks saw.
type workXFates struct {
	t        *testing.T
	mu       sync.Mutex
	reported []error
	outcomes map[string][]worker.Outcome // by job id, from the ends told
	causes   map[string]error            // by payload
	released int                         // runs of the job its handler releases
	ended    chan struct{}
}

func (r *workXFates) on(ev worker.Event) {
	if ev.Kind != worker.EventEnd {
		return
	}
	r.mu.Lock()
	r.outcomes[concKey(ev.ID)] = append(r.outcomes[concKey(ev.ID)], ev.Outcome)
	r.mu.Unlock()
	r.ended <- struct{}{}
}

// handle gives each job the fate its payload names.
func (r *workXFates) handle(ctx context.Context, d *inbox.Delivery) error {
	t := r.t
	p := workXPayload(t, d)
	switch p {
	case "permanent":
		return worker.Permanent(errors.New("no such customer"))
	case "snooze":
		return worker.Snooze(workXFateSnooze)
	case "timeout":
		<-ctx.Done()
		r.mu.Lock()
		r.causes[p] = context.Cause(ctx)
		r.mu.Unlock()
		return ctx.Err()
	case "own release":
		r.mu.Lock()
		r.released++
		again := r.released > 1
		r.mu.Unlock()
		if again {
			return nil
		}
		return errors.Join(workXOwn(t, p, d.Release(ctx)), errors.New("given back"))
	case "own ack":
		return errors.Join(workXOwn(t, p, d.Ack(ctx)), errors.New("acked, then failed"))
	case "own dead":
		return workXOwn(t, p, d.Dead(ctx))
	case "own retry":
		return workXOwn(t, p, d.Retry(ctx, workXFateBackoff))
	}
	return fmt.Errorf("unknown payload %q", p)
}

// workFatesRows checks the rows TestWorkFates' jobs left: two dead at
// attempt 1, four gone from the queue table, three delayed at attempt 2.
func workFatesRows(t *testing.T, e Engine, db *sql.DB, table, form string, ids map[string]any) {
	t.Helper()
	dead := table + "_dead"
	for _, f := range []string{"permanent", "own dead"} {
		if n := attemptOf(t, e, db, dead, ids[f]); n != 1 {
			t.Errorf("%s: dead at attempt %d, want 1", f, n)
		}
	}
	for _, f := range []string{"own ack", "own release", "permanent", "own dead"} {
		if workXHas(t, e, db, table, ids[f]) {
			t.Errorf("%s: the job is still in the queue table", f)
		}
	}
	for f, delay := range map[string]time.Duration{"snooze": workXFateSnooze, "timeout": workXFateBackoff, "own retry": workXFateBackoff} {
		if n := attemptOf(t, e, db, table, ids[f]); n != 2 {
			t.Errorf("%s: stored attempt %d, want 2", f, n)
		}
		due := workXTime(t, e, db, table, workXDueCol(form), ids[f])
		if left := time.Until(due); left < delay-10*time.Minute || left > delay+10*time.Minute {
			t.Errorf("%s: due in %v, want about %v", f, left.Round(time.Second), delay)
		}
	}
	if n := countRows(t, db, dead); n != 2 {
		t.Errorf("%d dead jobs, want 2", n)
	}
}

// workXOwn fails the test when a handler's own settlement failed.
func workXOwn(t testing.TB, what string, err error) error {
	if err != nil {
		t.Errorf("%s: the handler's settlement: %v", what, err)
	}
	return err
}

// workXHas reports whether table holds row id.
func workXHas(t testing.TB, e Engine, db *sql.DB, table string, id any) bool {
	t.Helper()
	var n int
	if err := db.QueryRow(bind(e, "SELECT COUNT(*) FROM "+table+" WHERE id = ?"), id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// workXRunOn runs loops worker.Run loops, spread over qs, until the
// returned function ends them and waits for their return, each with nil.
// The test's cleanup calls it too.
func workXRunOn(t *testing.T, qs []*inbox.Queue, loops int, cfg worker.Config, h worker.Handler) func() {
	ctx, cancel := context.WithCancel(context.Background())
	returned := make(chan error, loops)
	for i := range loops {
		go func() { returned <- worker.Run(ctx, qs[i%len(qs)], cfg, h) }()
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			for range loops {
				if err := workXRecv(t, returned, "the loops' return"); err != nil {
					t.Errorf("Run: %v", err)
				}
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
