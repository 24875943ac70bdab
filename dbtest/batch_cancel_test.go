package dbtest

// Settlements through one Batcher whose contexts end at random points, on
// every engine and driver: the Batcher must never lose a flusher slot (with
// Flushers 1 a lost slot hangs every later settlement and Close), and each
// delivery must end consistent with what its settlement returned. Run under
// -race this is also the check that no settlement is read after it was
// given back.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
)

const (
	bcSingles  = 16  // goroutines settling deliveries one at a time
	bcEach     = 2   // deliveries each of them settles in turn
	bcGroups   = 2   // goroutines settling a few deliveries with AckAll
	bcGroup    = 3   // deliveries per AckAll
	bcMinRound = 8   // rounds run whatever the time they take
	bcMaxRound = 150 // and at most, while the budget lasts
	bcBudget   = 600 * time.Millisecond
	bcMaxDelay = 200 * time.Microsecond // contexts end after 0 to this
	bcHang     = 60 * time.Second       // a wait this long means a hang
)

func TestBatchCancelStress(t *testing.T) {
	eachEngine(t, nil, func(t *testing.T, e Engine) {
		for _, c := range []struct {
			name string
			cfg  inbox.BatchConfig
		}{
			{"flushers-1", inbox.BatchConfig{Flushers: 1}},
			{"default", inbox.BatchConfig{}},
		} {
			t.Run(c.name, func(t *testing.T) {
				db := e.Open(t, 8)
				table := newTable(t, e, db, "batch_cancel_"+c.name)
				q, err := inbox.New(db, inbox.Config{Dialect: e.Dialect, Table: Table(table, "lease"), Lease: time.Minute, Prepare: prepareAll})
				if err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				rounds, cut := 0, 0
				for rounds < bcMaxRound && (rounds < bcMinRound || time.Since(start) < bcBudget) {
					cut += bcRound(t, db, q, table, c.cfg)
					rounds++
					if t.Failed() {
						t.Fatalf("round %d failed", rounds)
					}
				}
				t.Logf("%d rounds, %d settlements ended by their contexts", rounds, cut)
			})
		}
	})
}

// bcRound claims a fresh set of jobs, settles them from many goroutines
// through a new Batcher with contexts that end at random points, closes the
// Batcher, then checks every delivery and the table. It returns how many
// settlements returned their context's error.
func bcRound(t *testing.T, db *sql.DB, q *inbox.Queue, table string, cfg inbox.BatchConfig) int {
	t.Helper()
	ctx := context.Background()
	n := bcSingles*bcEach + bcGroups*bcGroup
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		if _, err := q.Enqueue(ctx, tx, inbox.Job{Data: []any{[]byte(fmt.Sprint("job ", i))}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	ds, err := q.Claim(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != n {
		t.Fatalf("claimed %d jobs, want %d", len(ds), n)
	}
	// Each delivery runs under a keeper, as a handler's would.
	for _, d := range ds {
		_, stop := d.Keep(ctx)
		defer stop()
	}
	// Singles acknowledge three jobs in four and release the fourth.
	release := func(i int) bool { return i < bcSingles*bcEach && i%4 == 3 }

	b, err := q.NewBatcher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for w := 0; w < bcSingles; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w * bcEach; i < (w+1)*bcEach; i++ {
				ctx, cancel := bcContext()
				if release(i) {
					errs[i] = b.Release(ctx, ds[i])
				} else {
					errs[i] = b.Ack(ctx, ds[i])
				}
				cancel()
			}
		}()
	}
	for g := 0; g < bcGroups; g++ {
		lo := bcSingles*bcEach + g*bcGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := bcContext()
			defer cancel()
			copy(errs[lo:], b.AckAll(ctx, ds[lo:lo+bcGroup]))
		}()
	}
	bcWait(t, "the settlements", wg.Wait)
	bcWait(t, "Batcher.Close", b.Close)

	// A context error leaves the outcome unknown: settling again (through
	// the delivery or another Batcher) tells, nil or ErrLeaseLost. A
	// verdict finishes the delivery: settling again returns ErrSettled,
	// and ErrLeaseLost with it after a lost lease.
	b2, err := q.NewBatcher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	cut := 0
	for i, d := range ds {
		err := errs[i]
		what := fmt.Sprintf("job %v (%s)", d.ID(), map[bool]string{false: "ack", true: "release"}[release(i)])
		retried := errors.Is(err, context.DeadlineExceeded)
		if retried {
			cut++
			switch {
			case release(i) && i%2 == 0:
				err = d.Release(ctx)
			case release(i):
				err = b2.Release(ctx, d)
			case i%2 == 0:
				err = d.Ack(ctx)
			default:
				err = b2.Ack(ctx, d)
			}
			what += " settled again"
		}
		switch {
		case err == nil:
		case !retried:
			t.Errorf("%s: %v, want nil or the context's error", what, err)
			continue
		case !errors.Is(err, inbox.ErrLeaseLost) || errors.Is(err, inbox.ErrSettled):
			t.Errorf("%s: %v, want nil or ErrLeaseLost", what, err)
			continue
		}
		again := b2.Ack(ctx, d)
		if !errors.Is(again, inbox.ErrSettled) || errors.Is(again, inbox.ErrLeaseLost) != (err != nil) {
			t.Errorf("%s, then settled again: %v, want ErrSettled (and ErrLeaseLost after %v)", what, again, err)
		}
	}

	// Acknowledged jobs are gone; released ones are back, unleased, with
	// their attempt given back; nothing else is in the table.
	want := map[string]bool{}
	for i, d := range ds {
		if release(i) {
			want[fmt.Sprint(d.ID())] = true
		}
	}
	rows, err := db.Query("SELECT id, attempt, locked_until IS NULL FROM " + table)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var attempt int
		var free bool
		if err := rows.Scan(&id, &attempt, &free); err != nil {
			t.Fatal(err)
		}
		switch {
		case !want[id]:
			t.Errorf("job %s is still in the table: acknowledged, or from an earlier round", id)
		case attempt != 1 || !free:
			t.Errorf("released job %s: attempt %d, unleased %v; want attempt 1, unleased", id, attempt, free)
		}
		delete(want, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for id := range want {
		t.Errorf("released job %s is missing from the table", id)
	}
	if _, err := db.Exec("DELETE FROM " + table); err != nil {
		t.Fatal(err)
	}
	return cut
}

// bcContext returns a context ending at a random point in the next
// bcMaxDelay, or one in eight times a context that never ends, so that
// batches mix callers who may give up with callers who cannot.
func bcContext() (context.Context, context.CancelFunc) {
	if rand.N(8) == 0 {
		return context.Background(), func() {}
	}
	return context.WithTimeout(context.Background(), rand.N(bcMaxDelay+1))
}

// bcWait runs fn and fails the test with every goroutine's stack when it
// does not return within bcHang: a hang is reported, never waited out.
func bcWait(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(bcHang):
		buf := make([]byte, 1<<20)
		for {
			n := runtime.Stack(buf, true)
			if n < len(buf) {
				buf = buf[:n]
				break
			}
			buf = make([]byte, 2*len(buf))
		}
		t.Fatalf("%s did not return within %v (a lost flusher slot?); goroutines:\n%s", what, bcHang, buf)
	}
}
