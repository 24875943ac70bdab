package dbtest

// A lease batch's settlement of a job its handler settled itself in a
// transaction of its own, committed without Delivery.Committed: the batch
// finds the token gone and must read the settlement back, as the loop with
// Batch 1 does, not report a lost lease.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/worker"
)

// workOwnTxKinds are the handlers of TestWorkBatchOwnTx, by payload prefix,
// and the end each job gets (its outcome, the settlement's error): AckTx or
// RetryTx(1h) committed by the handler, which then returns nil or fails,
// ends settled by the handler; AckTx rolled back leaves the loop's own
// settlement to take effect, as for a plain handler.
var workOwnTxKinds = map[string]string{
	"acktx":         "settled <nil>",
	"acktx-fail":    "settled <nil>",
	"retrytx":       "settled <nil>",
	"retrytx-fail":  "settled <nil>",
	"rollback":      "acked <nil>",
	"rollback-fail": "retried <nil>",
	"plain":         "acked <nil>",
	"plain-fail":    "retried <nil>",
}

// workOwnTxDelay is the backoff, and the RetryTx delay, of
// TestWorkBatchOwnTx: no retried job comes back during the test.
const workOwnTxDelay = time.Hour

// TestWorkBatchOwnTx: eight lease loops over two pools, with Batch 1 and
// then Batch 16 (claims of up to 16 settled through a Batcher), drain 160
// jobs of the kinds of workOwnTxKinds, interleaved so that each batch
// mixes them. Each job runs once and ends once, with the kind's outcome
// and no settlement error; OnError hears nothing; the jobs acked or acked
// by the handler are gone and the retried ones wait an hour at attempt 2.
// Both batch sizes give every kind the same end. Only the lease form
// settles batches together; the other forms settle each job alone.
func TestWorkBatchOwnTx(t *testing.T) {
	eachEngine(t, nil, func(t *testing.T, e Engine) {
		ends := map[int]map[string]string{}
		for _, batch := range []int{1, 16} {
			t.Run(fmt.Sprint("batch ", batch), func(t *testing.T) { ends[batch] = workBatchOwnTx(t, e, batch) })
		}
		if len(ends) == 2 && !maps.Equal(ends[1], ends[16]) {
			t.Errorf("the ends by kind differ:\nbatch 1:  %v\nbatch 16: %v", ends[1], ends[16])
		}
	})
}

// workBatchOwnTx runs TestWorkBatchOwnTx with claims of batch jobs and
// returns each kind's ends, its distinct "outcome settle-error" joined.
func workBatchOwnTx(t *testing.T, e Engine, batch int) map[string]string {
	const loops, perKind = 8, 20
	db1, db2 := openTwo(t, e, 16)
	table := newTable(t, e, db1, fmt.Sprintf("work_owntx_%d", batch))
	dbs := []*sql.DB{db1, db2}
	qs := []*inbox.Queue{
		newQueue(t, db1, queueConfig(e, Table(table, "lease"), nil)),
		newQueue(t, db2, queueConfig(e, Table(table, "lease"), nil)),
	}
	kinds := slices.Sorted(maps.Keys(workOwnTxKinds))
	kindOf, ids := map[string]string{}, map[string]any{} // by job id as text
	for i := range perKind * len(kinds) {
		k := kinds[i%len(kinds)]
		id := enqueueOne(t, qs[0], db1, fmt.Sprintf("%s %d", k, i))
		kindOf[concKey(id)], ids[concKey(id)] = k, id
	}

	var (
		mu       sync.Mutex
		reported []error
		runs     = map[string]int{}
		endsOf   = map[string][]worker.Event{}
		ended    = make(chan struct{}, 2*len(kindOf))
	)
	cfg := worker.Config{
		Batch:   batch,
		Poll:    workXPoll,
		Backoff: func(int) time.Duration { return workOwnTxDelay },
		OnError: func(err error) { mu.Lock(); reported = append(reported, err); mu.Unlock() },
		OnEvent: func(ev worker.Event) {
			if ev.Kind != worker.EventEnd {
				return
			}
			mu.Lock()
			endsOf[concKey(ev.ID)] = append(endsOf[concKey(ev.ID)], ev)
			mu.Unlock()
			ended <- struct{}{}
		},
	}
	handler := func(db *sql.DB) worker.Handler {
		return func(ctx context.Context, d *inbox.Delivery) error {
			mu.Lock()
			runs[concKey(d.ID())]++
			mu.Unlock()
			kind, _, _ := strings.Cut(workXPayload(t, d), " ")
			fail := errors.New(kind + " fails")
			switch kind {
			case "plain":
				return nil
			case "plain-fail":
				return fail
			}
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Errorf("job %v: begin: %v", d.ID(), err)
				return err
			}
			if strings.HasPrefix(kind, "retrytx") {
				err = d.RetryTx(ctx, tx, workOwnTxDelay)
			} else {
				err = d.AckTx(ctx, tx)
			}
			if err != nil {
				t.Errorf("job %v: the handler's %s: %v", d.ID(), kind, err)
				_ = tx.Rollback()
				return err
			}
			if strings.HasPrefix(kind, "rollback") {
				err = tx.Rollback()
			} else {
				// Committed, and Delivery.Committed not called: the
				// loop's settlement learns it from the row.
				err = tx.Commit()
			}
			if err != nil {
				t.Errorf("job %v: ending the handler's transaction: %v", d.ID(), err)
			}
			if strings.HasSuffix(kind, "-fail") {
				return fail
			}
			return nil
		}
	}
	var stops []func()
	for i, q := range qs {
		stops = append(stops, workXRunOn(t, []*inbox.Queue{q}, loops/len(qs), cfg, handler(dbs[i])))
	}
	for range kindOf {
		workXRecv(t, ended, "the jobs' ends")
	}
	for _, stop := range stops {
		stop()
	}

	mu.Lock()
	defer mu.Unlock()
	if len(reported) != 0 {
		t.Errorf("OnError got %d errors, want none; the first: %v", len(reported), reported[0])
	}
	byKind := map[string]map[string]int{} // kind -> "outcome settle-error" -> jobs
	for id, kind := range kindOf {
		es := endsOf[id]
		if runs[id] != 1 || len(es) != 1 {
			t.Errorf("%s job %s: %d handler runs and %d ends, want one each", kind, id, runs[id], len(es))
			continue
		}
		ev := es[0]
		if byKind[kind] == nil {
			byKind[kind] = map[string]int{}
		}
		byKind[kind][fmt.Sprintf("%v %v", ev.Outcome, ev.SettleErr)]++
		if want := map[bool]time.Duration{true: workOwnTxDelay}[ev.Outcome == worker.OutcomeRetried]; ev.Delay != want {
			t.Errorf("%s job %s: delay %v, want %v", kind, id, ev.Delay, want)
		}
	}
	out := map[string]string{}
	for kind, ends := range byKind {
		out[kind] = strings.Join(slices.Sorted(maps.Keys(ends)), ", ")
		if n := ends[workOwnTxKinds[kind]]; n != perKind {
			t.Errorf("%s: %d of %d jobs ended %s; the ends: %v", kind, n, perKind, workOwnTxKinds[kind], ends)
		}
	}
	workOwnTxRows(t, e, db1, table, kindOf, ids)
	return out
}

// workOwnTxRows checks the table TestWorkBatchOwnTx leaves: the jobs that
// ended retried, or retried by the handler, wait an hour at attempt 2; the
// others are gone; nothing is dead.
func workOwnTxRows(t *testing.T, e Engine, db *sql.DB, table string, kindOf map[string]string, ids map[string]any) {
	t.Helper()
	waiting := 0
	for id, kind := range kindOf {
		stays := strings.HasPrefix(kind, "retrytx") || workOwnTxKinds[kind] == "retried <nil>"
		attempt, until, ok := rowOf(t, e, db, table, ids[id])
		switch {
		case ok != stays:
			t.Errorf("%s job %s: in the table %v, want %v", kind, id, ok, stays)
		case !ok:
		case attempt != 2:
			t.Errorf("%s job %s: stored attempt %d, want 2", kind, id, attempt)
		default:
			waiting++
			if left := time.Until(until); left < workOwnTxDelay-10*time.Minute || left > workOwnTxDelay+10*time.Minute {
				t.Errorf("%s job %s: due in %v, want about %v", kind, id, left.Round(time.Second), workOwnTxDelay)
			}
		}
	}
	if n := countRows(t, db, table); n != waiting {
		t.Errorf("%d rows in the table, %d jobs waiting", n, waiting)
	}
	if n := countRows(t, db, table+"_dead"); n != 0 {
		t.Errorf("%d dead jobs, want none", n)
	}
}
