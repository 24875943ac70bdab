package dbtest

// Two ends of a failed row-lock attempt that once let the handler's writes
// or the job outlive the attempt (issue 33, items 2 and 3): a Permanent
// error on a table without a dead table, and a handler statement cut by
// its timeout while the server session runs on.

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

// TestRowLockDroppedWrites: eight worker.Run loops over two pools, the table
// named plainly and qualified, with no dead table (RetryForever). The
// handler writes a shipment through Delivery.Tx, then returns a Permanent
// error: each job is deleted (OutcomeDropped) and none of the shipments
// stays, as for every failed attempt. Before Delivery.Drop, the drop was an
// Ack, which committed them.
func TestRowLockDroppedWrites(t *testing.T) {
	eachEngine(t, notSQLite, func(t *testing.T, e Engine) {
		const jobs = 16
		db1, db2, plain, qualified, effects := attXSetup(t, e, "att_drop", "TEXT")
		tb1, tb2 := attXTable(plain), attXTable(qualified)
		tb1.DeadTable, tb2.DeadTable = "", ""
		q1 := newQueue(t, db1, queueConfig(e, tb1, nil))
		q2 := newQueue(t, db2, queueConfig(e, tb2, nil))
		for i := range jobs {
			enqueueOne(t, q1, db1, fmt.Sprintf("order-%d", i))
		}
		insert := bind(e, "INSERT INTO "+effects+" (job_id, note) VALUES (?, ?)")
		var mu sync.Mutex
		var failures []error
		outcomes := map[worker.Outcome]int{}
		cfg := worker.Config{Poll: workXPoll, RetryForever: true,
			OnError: func(err error) {
				mu.Lock()
				failures = append(failures, err)
				mu.Unlock()
			},
			OnEvent: func(ev worker.Event) {
				if ev.Kind == worker.EventEnd {
					mu.Lock()
					outcomes[ev.Outcome]++
					mu.Unlock()
				}
			}}
		handle := func(ctx context.Context, d *inbox.Delivery) error {
			if _, err := d.Tx().ExecContext(ctx, insert, d.ID(), "shipment of a failed attempt"); err != nil {
				return err
			}
			return worker.Permanent(errors.New("no such customer"))
		}
		run1 := workXStart(t, q1, attXLoops/2, cfg, handle)
		run2 := workXStart(t, q2, attXLoops/2, cfg, handle)
		eventually(t, 60*time.Second, "every job dropped", func() error {
			if n := countRows(t, db1, plain); n != 0 {
				return fmt.Errorf("%d jobs left", n)
			}
			return nil
		})
		run1.stop(t)
		run2.stop(t)
		mu.Lock()
		defer mu.Unlock()
		for _, err := range failures {
			t.Errorf("a claim or settlement failed: %v", err)
		}
		if outcomes[worker.OutcomeDropped] != jobs || len(outcomes) != 1 {
			t.Errorf("outcomes %v, want %d dropped", outcomes, jobs)
		}
		if rows := dumpRows(t, db1, effects); len(rows) != 0 {
			t.Errorf("dropped attempts left %d shipments: %q", len(rows), rows)
		}
		mustBeIdle(t, db1, q1)
		mustBeIdle(t, db2, q2)
	})
}

// TestRowLockCutStatement: a handler statement through Delivery.Tx that runs
// 1.5 s on the server, under a worker Timeout of 150 ms, with MaxAttempts 2
// and eight loops over two pools. The timeout cuts the statement; the
// driver may close its socket while the server session runs on holding the
// row (go-sql-driver/mysql, pgx) or end it on the server (lib/pq). Whatever
// it does, each failed attempt is recorded: every job ends in the dead
// table at attempt 2, leaving no write. Before the relock waited for a row
// its own cut session still held, the Retry reported a lost lease and the
// job ran at attempt 1 again and again (MySQL: never dead).
//
// A cut session that ends at once (lib/pq, pgx) lets its row go before the
// Retry locks it again, and another loop may claim the job first at the
// same attempt: that run's own settlement then finds the attempt recorded
// and reports a lost lease. So each job runs twice plus once per lost
// lease of its own, and never otherwise.
func TestRowLockCutStatement(t *testing.T) {
	eachEngine(t, notSQLite, func(t *testing.T, e Engine) {
		const jobs = 4
		db1, db2, plain, qualified, effects := attXSetup(t, e, "att_cutstmt", "TEXT")
		q1 := newQueue(t, db1, queueConfig(e, attXTable(plain), nil))
		q2 := newQueue(t, db2, queueConfig(e, attXTable(qualified), nil))
		for i := range jobs {
			enqueueOne(t, q1, db1, fmt.Sprintf("order-%d", i))
		}
		insert := bind(e, "INSERT INTO "+effects+" (job_id, note) VALUES (?, ?)")
		slow := "SELECT pg_sleep(1.5)"
		if e.IsMySQL() {
			slow = "SELECT SLEEP(1.5)"
		}
		var mu sync.Mutex
		var failures []error
		runs := map[string][]int{}
		lost := map[string]int{}
		cfg := worker.Config{Poll: workXPoll, MaxAttempts: 2, Timeout: 150 * time.Millisecond,
			Backoff: func(int) time.Duration { return 0 },
			OnEvent: func(ev worker.Event) {
				if ev.Kind != worker.EventEnd {
					return
				}
				mu.Lock()
				defer mu.Unlock()
				switch {
				case errors.Is(ev.SettleErr, inbox.ErrLeaseLost):
					lost[concKey(ev.ID)]++
				case ev.SettleErr != nil:
					failures = append(failures, ev.SettleErr)
				}
			}}
		handle := func(ctx context.Context, d *inbox.Delivery) error {
			mu.Lock()
			runs[concKey(d.ID())] = append(runs[concKey(d.ID())], d.Attempt())
			mu.Unlock()
			if _, err := d.Tx().ExecContext(ctx, insert, d.ID(), fmt.Sprintf("attempt %d", d.Attempt())); err != nil {
				return err
			}
			_, err := d.Tx().ExecContext(ctx, slow)
			if err == nil {
				return errors.New("the slow statement was not cut")
			}
			return err
		}
		start := time.Now()
		run1 := workXStart(t, q1, attXLoops/2, cfg, handle)
		run2 := workXStart(t, q2, attXLoops/2, cfg, handle)
		eventually(t, 90*time.Second, "every job dead", func() error {
			if n := countRows(t, db1, plain+"_dead"); n != jobs {
				mu.Lock()
				defer mu.Unlock()
				return fmt.Errorf("%d of %d jobs dead; attempts run: %v", n, jobs, runs)
			}
			return nil
		})
		run1.stop(t)
		run2.stop(t)
		mu.Lock()
		defer mu.Unlock()
		t.Logf("FIGURE: %s: %d jobs dead after %v; runs %v, lost leases %v", e.Name, jobs, time.Since(start).Round(time.Millisecond), runs, lost)
		for _, err := range failures {
			t.Errorf("a settlement failed: %v", err)
		}
		for id, r := range runs {
			if len(r) != 2+lost[id] || r[0] != 1 || r[len(r)-1] != 2 {
				t.Errorf("job %s ran at attempts %v with %d lost leases, want [1 2] and one more run per lost lease", id, r, lost[id])
			}
		}
		for id, row := range attXDead(t, e, db1, plain) {
			if !strings.HasPrefix(row, "attempt=2 ") {
				t.Errorf("dead job %s: %s, want attempt 2", id, row)
			}
		}
		if rows := dumpRows(t, db1, effects); len(rows) != 0 {
			t.Errorf("cut attempts left %d shipments: %q", len(rows), rows)
		}
		mustBeIdle(t, db1, q1)
		mustBeIdle(t, db2, q2)
	})
}
