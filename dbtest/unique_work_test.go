package dbtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/worker"
)

// uniqueLedger records what the enqueuers were told and what the handlers
// saw, keyed by payload (each payload is sent once).
type uniqueLedger struct {
	mu       sync.Mutex
	accepted map[string]string // payload -> id it was stored under (inserted or replaced)
	refused  map[string]bool   // payloads answered ErrDuplicate: stored nowhere
	unsure   map[string]bool   // payloads whose call was cancelled: stored or not
	busy     int               // calls that found the key taken and freed again and again (documented)
	inWork   map[string]int    // key -> handlers running now
	ran      map[string]string // id -> the payload its handler read
	errs     []string
}

func (l *uniqueLedger) fail(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, fmt.Sprintf(format, args...))
}

// TestUniqueReplaceUnderWork: four enqueuers on two pools, one naming the
// table plainly and the other qualified, send 10 keys over and over, half
// with Replace, their contexts cancelled at random points, while worker.Run
// on both pools (8 loops) drains the table. No two handlers run one key at
// once; no settlement fails (a Replace never takes a job in work: its
// holder would meet ErrLeaseLost); each job runs once, with a payload some
// call stored under its id, never one refused; every id a call returned
// runs.
func TestUniqueReplaceUnderWork(t *testing.T) {
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		db1, db2 := openTwo(t, e, 8)
		table := newTable(t, e, db1, "unique_work_"+form)
		tb := uniqueTable(t, e, db1, table, form)
		qualified := tb
		qualified.Name = concQualified(t, e, db1, table)
		qs := []*inbox.Queue{newQueue(t, db1, queueConfig(e, tb, nil)), newQueue(t, db2, queueConfig(e, qualified, nil))}
		l := &uniqueLedger{accepted: map[string]string{}, refused: map[string]bool{}, unsure: map[string]bool{},
			inWork: map[string]int{}, ran: map[string]string{}}

		stop := uniqueWorkers(l, qs, db2)
		calls := 60
		if e.IsSQLite() && raceBuild() {
			calls = 30
		}
		var wg sync.WaitGroup
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				uniqueEnqueuer(l, qs[g%2], []any{db1, db2}[g%2].(inbox.Executor), g, calls)
			}()
		}
		wg.Wait()
		eventually(t, 2*time.Minute, "the table drained", func() error {
			if n := countRows(t, db1, table); n > 0 {
				return fmt.Errorf("%d jobs left", n)
			}
			return nil
		})
		stop()

		l.mu.Lock()
		defer l.mu.Unlock()
		for _, msg := range l.errs {
			t.Error(msg)
		}
		uniqueLedgerCheck(t, l)
	})
}

// uniqueWorkers runs worker.Run with 4 loops on each queue until stop.
func uniqueWorkers(l *uniqueLedger, qs []*inbox.Queue, db *sql.DB) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	handle := func(ctx context.Context, d *inbox.Delivery) error {
		var payload []byte
		if err := d.Scan(&payload); err != nil {
			return err
		}
		key, _, _ := strings.Cut(string(payload), "|")
		id := concKey(d.ID())
		l.mu.Lock()
		l.inWork[key]++
		if l.inWork[key] > 1 {
			l.errs = append(l.errs, fmt.Sprintf("key %s: two handlers at once", key))
		}
		if prev, ok := l.ran[id]; ok {
			l.errs = append(l.errs, fmt.Sprintf("job %s ran twice (%q, then %q)", id, prev, payload))
		}
		l.ran[id] = string(payload)
		l.mu.Unlock()
		// A statement of the handler's own, so that claims and enqueues
		// run while it holds the key.
		var one int
		if err := db.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil && ctx.Err() == nil {
			l.fail("handler's statement: %v", err)
		}
		l.mu.Lock()
		l.inWork[key]--
		l.mu.Unlock()
		return nil
	}
	for _, q := range qs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := worker.Config{Workers: 4, Poll: 20 * time.Millisecond, OnError: func(err error) { l.fail("worker: %v", err) }}
			if err := worker.Run(ctx, q, cfg, handle); err != nil {
				l.fail("Run: %v", err)
			}
		}()
	}
	return func() { cancel(); wg.Wait() }
}

// uniqueEnqueuer makes calls enqueues of 10 keys, Replace on every other,
// a third of them under a context cancelled after a random moment, and
// records each answer.
func uniqueEnqueuer(l *uniqueLedger, q *inbox.Queue, ex inbox.Executor, g, calls int) {
	rnd := rand.New(rand.NewSource(int64(g) + time.Now().UnixNano()))
	for i := 0; i < calls; i++ {
		key := fmt.Sprint("k", rnd.Intn(10))
		payload := fmt.Sprintf("%s|%d-%d", key, g, i)
		ctx, cancel := context.WithCancel(context.Background())
		if i%3 == 0 {
			// A cut at a random point of the call: before it, mid-statement
			// or mid-COMMIT. The test asserts nothing about when it lands.
			time.AfterFunc(time.Duration(rnd.Intn(3000))*time.Microsecond, cancel)
		}
		id, err := q.Enqueue(ctx, ex, inbox.Job{Data: []any{[]byte(payload)}, UniqueKey: key, Replace: i%2 == 0})
		cut := ctx.Err() != nil
		cancel()
		l.mu.Lock()
		switch {
		case err == nil:
			l.accepted[payload] = concKey(id)
		case errors.Is(err, inbox.ErrDuplicate):
			l.refused[payload] = true
		case cut:
			l.unsure[payload] = true
		case strings.Contains(err.Error(), "taken and freed again and again"):
			l.busy++ // the documented answer to a key churning under the call
		default:
			l.errs = append(l.errs, fmt.Sprintf("enqueue %s: %v", payload, err))
		}
		l.mu.Unlock()
	}
}

// uniqueLedgerCheck compares the handlers' runs with the enqueuers' answers.
func uniqueLedgerCheck(t *testing.T, l *uniqueLedger) {
	t.Helper()
	for id, payload := range l.ran {
		switch storedAs, ok := l.accepted[payload]; {
		case l.refused[payload]:
			t.Errorf("job %s ran with %q, whose enqueue was refused as a duplicate", id, payload)
		case ok && storedAs != id:
			t.Errorf("job %s ran with %q, which its enqueue stored under id %s", id, payload, storedAs)
		case !ok && !l.unsure[payload]:
			t.Errorf("job %s ran with %q, which no call sent", id, payload)
		}
	}
	for payload, id := range l.accepted {
		if _, ok := l.ran[id]; !ok {
			t.Errorf("enqueue of %q returned id %s, which never ran", payload, id)
		}
	}
	if len(l.ran) == 0 || len(l.accepted) == 0 {
		t.Fatalf("%d jobs ran, %d enqueues accepted: the test exercised nothing", len(l.ran), len(l.accepted))
	}
	t.Logf("%d jobs ran; %d enqueues accepted, %d refused, %d cut, %d busy", len(l.ran), len(l.accepted), len(l.refused), len(l.unsure), l.busy)
}
