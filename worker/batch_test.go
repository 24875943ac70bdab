package worker

// The loop gathers the acknowledgements of a lease batch itself (runBatch,
// collect), pinned with sqlmock's exact matcher. Its waits run on timers
// the test fires (loop.afterFunc), never on the wall clock: the batch wait
// is an hour, so that a Batcher made to wait that long as well (MaxWait)
// would hold the partial groups below and fail the test.

import (
	"context"
	"database/sql/driver"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/fakedb"
)

// The Postgres lease claim of up to 3 jobs and the batch Ack, as the root's
// tests pin them (sql_postgres_test.go's pgClaimUpTo(4, false),
// batch_test.go's pgBatchWhere).
const (
	pgClaim3 = `WITH picked AS MATERIALIZED (SELECT "id" FROM (` +
		`(SELECT "id" FROM (SELECT "id" FROM "jobs" WHERE "locked_until" IS NULL ORDER BY "id" LIMIT 4 FOR UPDATE SKIP LOCKED) AS free LIMIT $1) UNION ALL ` +
		`(SELECT "id" FROM (SELECT "id" FROM "jobs" WHERE "locked_until" <= statement_timestamp() ORDER BY "locked_until" LIMIT 4 FOR UPDATE SKIP LOCKED) AS expired LIMIT $2)` +
		`) AS c ORDER BY "id" LIMIT $3) ` +
		`UPDATE "jobs" AS j SET "attempt" = j."attempt" + 1, "locked_until" = (statement_timestamp() + $4 * interval '1 microsecond') WHERE j."id" = ANY (ARRAY(SELECT "id" FROM picked)) ` +
		`RETURNING j."id", j."attempt" - 1, j."locked_until", j."payload"`
	pgBatchAck = `DELETE FROM "jobs" WHERE "id" = ANY ($1) AND ("id", "attempt", "locked_until") IN ` +
		`(SELECT * FROM unnest($1, CAST($2 AS bigint[]), CAST($3 AS timestamptz[]))) RETURNING "id"`
	leaseMicros = int64(time.Minute / time.Microsecond)
)

// manualTimers stands in for time.AfterFunc: a timer's function runs only
// when the test fires it.
type manualTimers struct {
	mu    sync.Mutex
	fs    []func()
	ds    []time.Duration
	armed chan struct{} // a value per timer armed
}

func newManualTimers() *manualTimers { return &manualTimers{armed: make(chan struct{}, 64)} }

func (m *manualTimers) afterFunc(d time.Duration, f func()) *time.Timer {
	m.mu.Lock()
	m.fs, m.ds = append(m.fs, f), append(m.ds, d)
	m.mu.Unlock()
	m.armed <- struct{}{}
	// A real timer for Stop, never due while the test runs.
	return time.AfterFunc(24*time.Hour, func() {})
}

// wait waits until the timer numbered n (from 0) has been armed.
func (m *manualTimers) wait(t *testing.T, n int) {
	t.Helper()
	for {
		m.mu.Lock()
		k := len(m.fs)
		m.mu.Unlock()
		if k > n {
			return
		}
		signalled(t, m.armed, fmt.Sprintf("timer %d to be armed", n))
	}
}

// fire runs timer n's function in a goroutine of its own, as time.AfterFunc
// does.
func (m *manualTimers) fire(n int) {
	m.mu.Lock()
	f := m.fs[n]
	m.mu.Unlock()
	go f()
}

// durations returns the durations of the timers armed so far.
func (m *manualTimers) durations() []time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.ds)
}

// signalled waits for a value on ch, failing the test after a generous
// deadline.
func signalled(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("waited 30s for %s", what)
	}
}

// idSet matches a Postgres array of ids holding exactly ids, in any
// order: jobs that end side by side join a group in the order they end.
type idSet []string

func (s idSet) Match(v driver.Value) bool {
	str, ok := v.(string)
	if !ok || !strings.HasPrefix(str, "{") || !strings.HasSuffix(str, "}") {
		return false
	}
	got, want := strings.Split(str[1:len(str)-1], ","), slices.Clone(s)
	slices.Sort(got)
	slices.Sort(want)
	return slices.Equal(got, want)
}

// batchSetup claims 3 jobs through sqlmock and returns a loop of Batch 3
// running handle on them, its timers manual, whose settlement errors fail
// the test.
func batchSetup(t *testing.T, handle Handler) (*fakedb.DB, *loop, *manualTimers, []*inbox.Delivery) {
	m := fakedb.New(t)
	q, err := inbox.New(m.DB, inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "jobs", LockedUntil: "locked_until"}, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	exp := time.Date(2024, 3, 1, 12, 1, 0, 123456000, time.UTC)
	r := sqlmock.NewRows([]string{"id", "attempt", "locked_until", "payload"})
	for id := int64(1); id <= 3; id++ {
		r.AddRow(id, int64(1), exp, []byte("p"))
	}
	m.ExpectQuery(pgClaim3).WithArgs(3, 3, 3, leaseMicros).WillReturnRows(r)
	w, err := newLoop(context.Background(), q, Config{Batch: 3, RetryForever: true, OnError: func(err error) { t.Errorf("OnError: %v", err) }}, handle)
	if err != nil {
		t.Fatal(err)
	}
	timers := newManualTimers()
	w.afterFunc, w.batchWait = timers.afterFunc, time.Hour
	t.Cleanup(func() {
		for _, b := range w.batchers {
			b.Close()
		}
	})
	ds, err := q.Claim(context.Background(), 3)
	if err != nil || len(ds) != 3 {
		t.Fatalf("Claim: %d jobs, %v", len(ds), err)
	}
	return m, w, timers, ds
}

// expectAck expects the batch Ack of ids, any order.
func expectAck(m *fakedb.DB, ids ...string) {
	exps := "{" + strings.TrimSuffix(strings.Repeat(`"2024-03-01 12:01:00.123456+00",`, len(ids)), ",") + "}"
	attempts := "{" + strings.TrimSuffix(strings.Repeat("2,", len(ids)), ",") + "}"
	r := sqlmock.NewRows([]string{"id"})
	for _, id := range ids {
		n, _ := strconv.ParseInt(id, 10, 64)
		r.AddRow(n)
	}
	m.ExpectQuery(pgBatchAck).WithArgs(idSet(ids), attempts, exps).WillReturnRows(r)
}

// handleAllAsync runs w.handleAll(ds) and returns a channel closed when it
// returns.
func handleAllAsync(w *loop, ds []*inbox.Delivery) <-chan struct{} {
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		w.handleAll(ds)
	}()
	return returned
}

// The acknowledgements of a batch of quick handlers go in one statement,
// sent when the last handler returns, without waiting for the batch wait.
func TestWorkBatchQuickOneStatement(t *testing.T) {
	m, w, timers, ds := batchSetup(t, func(context.Context, *inbox.Delivery) error { return nil })
	expectAck(m, "1", "2", "3")
	w.handleAll(ds)
	m.Met(t)
	if got := timers.durations(); !slices.Equal(got, []time.Duration{time.Hour}) {
		t.Errorf("timers armed for %v, want the spread's alone, for the batch wait", got)
	}
}

// Once the batch spread (its wait passed), a slow sibling holds a finished
// job's acknowledgement no longer than the wait: job 1, done before the
// spread, is acknowledged at it; job 3, done after it, when the wait that
// its group started runs out, job 2 still running; job 2 alone when it
// ends.
func TestWorkBatchSlowSibling(t *testing.T) {
	started2, release2 := make(chan struct{}), make(chan struct{})
	ended3 := make(chan struct{})
	m, w, timers, ds := batchSetup(t, func(_ context.Context, d *inbox.Delivery) error {
		switch d.ID() {
		case int64(2):
			close(started2)
			<-release2
		case int64(3):
			close(ended3)
		}
		return nil
	})
	acked1, acked3 := make(chan struct{}), make(chan struct{})
	expectAck(m, "1")
	expectAck(m, "3")
	expectAck(m, "2")
	m.After("query "+pgBatchAck, func() {
		close(acked1)
		m.After("query "+pgBatchAck, func() { close(acked3) })
	})
	returned := handleAllAsync(w, ds)

	signalled(t, started2, "job 2 to start")
	timers.wait(t, 0)
	timers.fire(0) // the spread
	signalled(t, acked1, "job 1's acknowledgement at the spread")
	signalled(t, ended3, "job 3 to run")
	timers.wait(t, 1) // job 3's group waits for its siblings
	timers.fire(1)
	signalled(t, acked3, "job 3's acknowledgement, job 2 still running")
	close(release2)
	signalled(t, returned, "the batch to end")
	m.Met(t)
	if got := timers.durations(); !slices.Equal(got, []time.Duration{time.Hour, time.Hour}) {
		t.Errorf("timers armed for %v, want the spread and job 3's group, each for the batch wait", got)
	}
}

// After the spread, the jobs that end within the wait share a statement,
// sent as soon as none of the batch is left running: job 1 runs on past
// the spread, jobs 2 and 3 end at once, and all three go together when job
// 1 ends, the group's wait never run out.
func TestWorkBatchGathersAfterSpread(t *testing.T) {
	started1, release1 := make(chan struct{}), make(chan struct{})
	var others sync.WaitGroup
	others.Add(2)
	m, w, timers, ds := batchSetup(t, func(_ context.Context, d *inbox.Delivery) error {
		if d.ID() == int64(1) {
			close(started1)
			<-release1
			return nil
		}
		others.Done()
		return nil
	})
	expectAck(m, "1", "2", "3")
	returned := handleAllAsync(w, ds)

	signalled(t, started1, "job 1 to start")
	timers.wait(t, 0)
	timers.fire(0) // the spread: jobs 2 and 3 start
	ended := make(chan struct{})
	go func() { others.Wait(); close(ended) }()
	signalled(t, ended, "jobs 2 and 3 to end")
	timers.wait(t, 1) // their group waits
	close(release1)
	signalled(t, returned, "the batch to end")
	m.Met(t)
}
