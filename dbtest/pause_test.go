package dbtest

// Pausing a queue (issue 37 item 4): Queue.Pause keeps the state in the
// control table, and worker.Run's loops of every process claim nothing
// while it holds.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/worker"
)

// pausePoll is the loops' fallback interval: a pause from another process
// is seen within it.
const pausePoll = 150 * time.Millisecond

// pauseRun counts the deliveries of each payload, and holds the jobs whose
// payload starts with "slow" until gate closes.
type pauseRun struct {
	mu      sync.Mutex
	runs    map[string]int
	started chan string
	gate    chan struct{}
}

func (r *pauseRun) handle(ctx context.Context, d *inbox.Delivery) error {
	var p []byte
	if err := d.Scan(&p); err != nil {
		return err
	}
	r.mu.Lock()
	r.runs[string(p)]++
	r.mu.Unlock()
	if strings.HasPrefix(string(p), "slow") {
		r.started <- string(p)
		<-r.gate
	}
	return nil
}

// ran counts the deliveries of the payloads starting with prefix.
func (r *pauseRun) ran(prefix string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for p, k := range r.runs {
		if strings.HasPrefix(p, prefix) {
			n += k
		}
	}
	return n
}

// controlTable creates the control table of table in e's types.
func controlTable(t *testing.T, e Engine, db *sql.DB, table string) string {
	t.Helper()
	ctl := table + "_control"
	cols := "queue text PRIMARY KEY, paused_at timestamptz, paused_by text"
	switch {
	case e.IsMySQL():
		cols = "queue varchar(191) PRIMARY KEY, paused_at DATETIME(6) NULL, paused_by text NULL"
	case e.IsSQLite():
		cols = "queue TEXT PRIMARY KEY, paused_at TEXT, paused_by TEXT"
	}
	mustExec(t, e, db, "DROP TABLE IF EXISTS "+ctl)
	mustExec(t, e, db, "CREATE TABLE "+ctl+" ("+cols+")")
	dropAtEnd(t, e, db, ctl)
	return ctl
}

// TestPauseWorkers: two pools (two processes, as far as the queue can
// tell), each running worker.Run with 4 loops, on every engine and form.
//
//   - refused: Pause and Resume on a queue without Table.ControlTable
//     return ErrNoControlTable and write nothing.
//   - in-process pause: jobs in work when Pause returns finish and are
//     acknowledged; jobs enqueued from then on are claimed by neither pool
//     and stay in the table, Stats and Paused say paused, by whom; Resume
//     from the other pool drains them.
//   - another process's pause (the control row written by hand, so that
//     no loop of this process is told): within a poll interval neither
//     pool claims; a resume by hand drains the table within another.
//
// Absence can only be shown by waiting: the waits are three poll
// intervals, three times what the contract allows.
func TestPauseWorkers(t *testing.T) {
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		db1, db2 := openTwo(t, e, 8)
		table := newTable(t, e, db1, "pause_"+form)
		addColumns(t, e, db1, table, "enqueued_at")
		ctx := context.Background()

		tb := Table(table, form)
		tb.EnqueuedAt = "enqueued_at"
		plain := newQueue(t, db1, queueConfig(e, tb, nil))
		tb.ControlTable = controlTable(t, e, db1, table)
		if err := plain.Pause(ctx, "ops"); !errors.Is(err, inbox.ErrNoControlTable) {
			t.Fatalf("Pause without a control table = %v, want ErrNoControlTable", err)
		}
		if err := plain.Resume(ctx); !errors.Is(err, inbox.ErrNoControlTable) {
			t.Fatalf("Resume without a control table = %v, want ErrNoControlTable", err)
		}
		if n := countRows(t, db1, tb.ControlTable); n != 0 {
			t.Fatalf("the control table has %d rows after refused calls, want none", n)
		}

		// The second pool names both tables by their qualified names: a
		// pause keyed by the name as written would miss its loops.
		qualified := tb
		qualified.Name = concQualified(t, e, db1, table)
		qualified.ControlTable = concQualified(t, e, db1, tb.ControlTable)
		q1, q2 := newQueue(t, db1, queueConfig(e, tb, nil)), newQueue(t, db2, queueConfig(e, qualified, nil))
		r := &pauseRun{runs: map[string]int{}, started: make(chan string, 2), gate: make(chan struct{})}
		stop := pauseWorkers(t, r, q1, q2)
		defer stop()

		pauseInProcess(t, e, db1, q1, q2, r, table)
		pauseElsewhere(t, e, db1, q1, r, table, tb.ControlTable)
	})
}

// pauseWorkers starts worker.Run with 4 loops on each queue, and returns
// what stops them and waits for them.
func pauseWorkers(t *testing.T, r *pauseRun, qs ...*inbox.Queue) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, q := range qs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := worker.Config{Workers: 4, Poll: pausePoll, OnError: func(err error) { t.Errorf("worker: %v", err) }}
			if err := worker.Run(ctx, q, cfg, r.handle); err != nil {
				t.Errorf("Run: %v", err)
			}
		}()
	}
	return func() { cancel(); wg.Wait() }
}

func pauseInProcess(t *testing.T, e Engine, db *sql.DB, q1, q2 *inbox.Queue, r *pauseRun, table string) {
	ctx := context.Background()
	enqueueOne(t, q1, db, "slow-1")
	enqueueOne(t, q1, db, "slow-2")
	for range 2 {
		select {
		case <-r.started:
		case <-time.After(20 * time.Second):
			t.Fatal("the slow jobs did not start")
		}
	}
	if err := q1.Pause(ctx, "ops"); err != nil {
		t.Fatal(err)
	}
	close(r.gate) // the jobs in work finish after the pause
	eventually(t, 20*time.Second, "the jobs in work acknowledged", func() error {
		if n := countRows(t, db, table); n != 0 {
			return fmt.Errorf("%d rows left", n)
		}
		return nil
	})
	const paused = 12
	for i := range paused {
		enqueueOne(t, q2, db, fmt.Sprintf("paused-%d", i))
	}
	<-time.After(3 * pausePoll)
	if n := r.ran("paused"); n != 0 {
		t.Errorf("%d jobs enqueued while paused were delivered, want none", n)
	}
	if n := countRows(t, db, table); n != paused {
		t.Errorf("%d rows in the table while paused, want the %d enqueued", n, paused)
	}
	ps, err := q2.Paused(ctx)
	if err != nil || !ps.Paused || ps.By != "ops" || ps.Since.IsZero() {
		t.Errorf("Paused = %+v, %v; want paused by ops", ps, err)
	}
	if st, err := q2.Stats(ctx); err != nil || !st.Paused || !st.PausedSince.Equal(ps.Since) {
		t.Errorf("Stats = %+v, %v; want paused since %v", st, err, ps.Since)
	}
	if err := q2.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the paused jobs drained after Resume", func() error {
		if n := countRows(t, db, table); n != 0 {
			return fmt.Errorf("%d rows left, %d delivered", n, r.ran("paused"))
		}
		return nil
	})
	if n := r.ran("paused"); n != paused {
		t.Errorf("%d deliveries of the paused jobs, want %d", n, paused)
	}
}

// pauseElsewhere pauses and resumes by writing the control row as
// another process's Pause would, telling no loop of this one.
func pauseElsewhere(t *testing.T, e Engine, db *sql.DB, q *inbox.Queue, r *pauseRun, table, ctl string) {
	write := func(at any, by any) {
		t.Helper()
		mustExec(t, e, db, "UPDATE "+ctl+" SET paused_at = ?, paused_by = ? WHERE queue = ?", at, by, table)
	}
	write(e.Dialect.TimeArg(time.Now().UTC().Truncate(time.Microsecond)), "elsewhere")
	<-time.After(3 * pausePoll) // each pool's watch reads it within one interval
	const paused = 12
	for i := range paused {
		enqueueOne(t, q, db, fmt.Sprintf("elsewhere-%d", i))
	}
	<-time.After(3 * pausePoll)
	if n := r.ran("elsewhere"); n != 0 {
		t.Errorf("%d jobs enqueued while paused elsewhere were delivered, want none", n)
	}
	if n := countRows(t, db, table); n != paused {
		t.Errorf("%d rows in the table while paused elsewhere, want %d", n, paused)
	}
	write(nil, nil)
	eventually(t, 20*time.Second, "the jobs drained after a resume elsewhere", func() error {
		if n := countRows(t, db, table); n != 0 {
			return fmt.Errorf("%d rows left", n)
		}
		return nil
	})
}
