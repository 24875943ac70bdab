package dbtest

// The conformance suite: every form on every engine and driver, written once.
// Subtests are named <engine>/<form> (or <engine> where the form does not
// matter), tables conf_<what>_<engine>, so pq and pgx runs never share one.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/fakeclock"
)

// TestDrain: many workers drain a few thousand jobs, each delivered exactly
// once at its first attempt, none left behind.
func TestDrain(t *testing.T) {
	eachForm(t, formsWithKey, func(t *testing.T, e Engine, form string) {
		const (
			workers = 8
			keys    = 20
		)
		jobs := 2000
		if e.IsSQLite() && raceBuild() {
			jobs = 1000 // modernc.org/sqlite is Go translated from C: slow under -race
		}
		db := e.Open(t, workers+1)
		table := newTable(t, e, db, "drain_"+form)
		tb := Table(table, form)
		q := newQueue(t, db, queueConfig(e, tb, nil))

		// The enqueuer writes the key column too.
		etb := tb
		etb.Data = []string{"payload", "k"}
		eq := newQueue(t, db, queueConfig(e, etb, nil))
		ctx := context.Background()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		want := map[any]string{}
		for i := range jobs {
			p := fmt.Sprintf("job-%d", i)
			id, err := eq.Enqueue(ctx, tx, inbox.Job{Data: []any{[]byte(p), strconv.Itoa(i % keys)}})
			if err != nil {
				t.Fatal(err)
			}
			want[id] = p
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if len(want) != jobs {
			t.Fatalf("enqueue returned %d distinct ids for %d jobs", len(want), jobs)
		}

		batch := 10
		if form != "lease" {
			batch = 3 // each job holds a connection: spread them over the workers
		}
		var mu sync.Mutex
		got := map[any]int{}
		var problems []string
		runWorkers(t, q, jobs, workers, batch, func(ctx context.Context, d *inbox.Delivery) error {
			var b []byte
			if err := d.Scan(&b); err != nil {
				return err
			}
			p := string(b)
			mu.Lock()
			got[d.ID()]++
			if d.Attempt() != 1 {
				problems = append(problems, fmt.Sprintf("job %v delivered with attempt %d", d.ID(), d.Attempt()))
			}
			if want[d.ID()] != p {
				problems = append(problems, fmt.Sprintf("job %v delivered payload %q, enqueued %q", d.ID(), p, want[d.ID()]))
			}
			mu.Unlock()
			return d.Ack(ctx)
		})
		for _, p := range problems {
			t.Error(p)
		}
		for id := range want {
			if got[id] != 1 {
				t.Errorf("job %v delivered %d times, want once", id, got[id])
			}
		}
		for id := range got {
			if _, ok := want[id]; !ok {
				t.Errorf("delivered job %v that was never enqueued", id)
			}
		}
		if n := countRows(t, db, table); n != 0 {
			t.Errorf("%d jobs left in the table", n)
		}
		if n := countRows(t, db, table+"_dead"); n != 0 {
			t.Errorf("%d jobs in the dead table", n)
		}
		mustBeIdle(t, db, q)
		if strings.HasPrefix(form, "advisory") {
			var lockKeys []string
			if form == "advisory" {
				for id := range want {
					lockKeys = append(lockKeys, fmt.Sprint(id))
				}
			} else {
				for i := range keys {
					lockKeys = append(lockKeys, strconv.Itoa(i))
				}
			}
			noLocks(t, e, db, table, lockKeys)
		}
	})
}

// TestOutcomes: each settlement of each form, what it leaves in the table,
// and that a second settlement or an extension after one changes nothing.
func TestOutcomes(t *testing.T) {
	eachForm(t, formsWithKey, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, 4)
		table := newTable(t, e, db, "outcomes_"+form)
		clock := fakeclock.New(clockStart)
		tb := Table(table, form)
		q := newQueue(t, db, queueConfig(e, tb, clock))
		ctx := context.Background()
		lease := form == "lease"
		keyOf := func(id any) string {
			if form == "advisory-k" {
				return "" // the enqueued rows keep the column's default
			}
			return fmt.Sprint(id)
		}

		// afterSettled checks that every settlement and Extend of a settled
		// delivery return ErrSettled (or, a row-lock AckTx, the ErrOwnTx it
		// always gets) and change nothing.
		afterSettled := func(t *testing.T, d *inbox.Delivery) {
			t.Helper()
			before := append(dumpRows(t, db, table), dumpRows(t, db, table+"_dead")...)
			for name, f := range map[string]func() error{
				"Ack":      func() error { return d.Ack(ctx) },
				"Retry(0)": func() error { return d.Retry(ctx, 0) },
				"Retry(d)": func() error { return d.Retry(ctx, time.Second) },
				"Release":  func() error { return d.Release(ctx) },
				"Dead":     func() error { return d.Dead(ctx) },
				"Extend":   func() error { return d.Extend(ctx) },
				"AckTx": func() error {
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						return err
					}
					defer tx.Rollback()
					return d.AckTx(ctx, tx)
				},
			} {
				err := f()
				if name == "AckTx" && form == "rowlock" && errors.Is(err, inbox.ErrOwnTx) {
					continue // refused as it would be before settling: the row lock settles in Delivery.Tx
				}
				if !errors.Is(err, inbox.ErrSettled) {
					t.Errorf("%s after settling: %v, want ErrSettled", name, err)
				}
			}
			sameRows(t, "settling again", before, append(dumpRows(t, db, table), dumpRows(t, db, table+"_dead")...))
			mustBeIdle(t, db, q)
		}
		fresh := func(t *testing.T, p string) any {
			emptyTables(t, db, table)
			return enqueueOne(t, q, db, p)
		}
		claim := func(t *testing.T, id any, attempt int, p string) *inbox.Delivery {
			t.Helper()
			d := claimOne(t, q)
			if d.ID() != id || d.Attempt() != attempt || payloadOf(t, d) != p {
				t.Fatalf("claimed job %v attempt %d payload %q, want %v, %d, %q", d.ID(), d.Attempt(), payloadOf(t, d), id, attempt, p)
			}
			if err := d.Extend(ctx); err != nil {
				t.Fatalf("extend a held job: %v", err)
			}
			return d
		}

		t.Run("ack", func(t *testing.T) {
			id := fresh(t, "a")
			d := claim(t, id, 1, "a")
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
			if n := countRows(t, db, table); n != 0 {
				t.Fatalf("ack left %d rows", n)
			}
			afterSettled(t, d)
		})
		t.Run("retry-now", func(t *testing.T) {
			id := fresh(t, "r")
			d := claim(t, id, 1, "r")
			if err := d.Retry(ctx, 0); err != nil {
				t.Fatal(err)
			}
			if a := attemptOf(t, e, db, table, id); a != 2 {
				t.Fatalf("stored attempt %d after Retry(0), want 2", a)
			}
			afterSettled(t, d)
			d = claim(t, id, 2, "r")
			if a := attemptOf(t, e, db, table, id); form != "rowlock" && a != 3 {
				t.Fatalf("stored attempt %d after the second claim, want 3", a)
			}
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		})
		t.Run("retry-later", func(t *testing.T) {
			id := fresh(t, "l")
			d := claim(t, id, 1, "l")
			if err := d.Retry(ctx, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			afterSettled(t, d)
			claimNone(t, q, "at once after Retry(10s)")
			clock.Advance(10*time.Second - time.Microsecond)
			claimNone(t, q, "a microsecond before the retry delay ends")
			clock.Advance(time.Microsecond)
			d = claim(t, id, 2, "l")
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		})
		t.Run("release", func(t *testing.T) {
			id := fresh(t, "x")
			d := claim(t, id, 1, "x")
			if strings.HasPrefix(form, "advisory") && !e.IsSQLite() {
				if n := locksHeld(t, e, db, table, []string{keyOf(id)}); n != 1 {
					t.Fatalf("%d advisory locks held for the claimed job, want 1", n)
				}
			}
			if err := d.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if a := attemptOf(t, e, db, table, id); a != 1 {
				t.Fatalf("stored attempt %d after Release, want 1", a)
			}
			if lease {
				if lu := lockedUntilOf(t, e, db, table, id); !lu.IsZero() {
					t.Fatalf("locked_until %v after Release, want NULL", lu)
				}
			}
			if strings.HasPrefix(form, "advisory") {
				noLocks(t, e, db, table, []string{keyOf(id)})
			}
			afterSettled(t, d)
			d = claim(t, id, 1, "x")
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		})
		t.Run("dead", func(t *testing.T) {
			id := fresh(t, "d")
			d := claim(t, id, 1, "d")
			if err := d.Retry(ctx, 0); err != nil {
				t.Fatal(err)
			}
			d = claim(t, id, 2, "d")
			if err := d.Dead(ctx); err != nil {
				t.Fatal(err)
			}
			if n := countRows(t, db, table); n != 0 {
				t.Fatalf("dead left %d rows in the table", n)
			}
			dead := dumpRows(t, db, table+"_dead")
			wantRow := fmt.Sprintf("id=%v | attempt=2 | payload=%q", id, "d")
			if len(dead) != 1 || dead[0] != wantRow {
				t.Fatalf("dead table %q, want [%s]", dead, wantRow)
			}
			afterSettled(t, d)
		})
		t.Run("dead-fails-whole", func(t *testing.T) {
			// A dead table that already holds the id refuses the copy: the
			// move must leave the job where it was, not half moved.
			id := fresh(t, "c")
			mustExec(t, e, db, "INSERT INTO "+table+"_dead (id, attempt, payload) VALUES (?, 9, ?)", id, []byte("old"))
			d := claim(t, id, 1, "c")
			if err := d.Dead(ctx); err == nil || errors.Is(err, inbox.ErrSettled) || errors.Is(err, inbox.ErrLeaseLost) {
				t.Fatalf("dead into a conflicting row: %v, want the database's error", err)
			}
			if n := countRows(t, db, table); n != 1 {
				t.Fatalf("a failed dead move left %d rows in the table, want 1", n)
			}
			if dead := dumpRows(t, db, table+"_dead"); len(dead) != 1 || !strings.Contains(dead[0], "attempt=9") {
				t.Fatalf("dead table after a failed move: %q", dead)
			}
			if err := d.Release(ctx); err != nil && !errors.Is(err, inbox.ErrSettled) {
				t.Fatal(err)
			}
			mustBeIdle(t, db, q)
			if strings.HasPrefix(form, "advisory") {
				noLocks(t, e, db, table, []string{keyOf(id)})
			}
		})
		t.Run("no-dead-table", func(t *testing.T) {
			ntb := tb
			ntb.DeadTable = ""
			nq := newQueue(t, db, queueConfig(e, ntb, clock))
			id := fresh(t, "n")
			d := claimOne(t, nq)
			before := dumpRows(t, db, table)
			if err := d.Dead(ctx); !errors.Is(err, inbox.ErrNoDeadTable) {
				t.Fatalf("dead without a dead table: %v, want ErrNoDeadTable", err)
			}
			sameRows(t, "a refused Dead", before, dumpRows(t, db, table))
			if err := d.Release(ctx); err != nil {
				t.Fatalf("release after a refused Dead: %v", err)
			}
			if a := attemptOf(t, e, db, table, id); a != 1 {
				t.Fatalf("stored attempt %d, want 1", a)
			}
			mustBeIdle(t, db, nq)
		})
		if !lease {
			t.Run("no-not-before", func(t *testing.T) {
				ntb := tb
				ntb.NotBefore = ""
				nq := newQueue(t, db, queueConfig(e, ntb, clock))
				id := fresh(t, "b")
				d := claimOne(t, nq)
				before := dumpRows(t, db, table)
				if err := d.Retry(ctx, time.Second); !errors.Is(err, inbox.ErrNoNotBefore) {
					t.Fatalf("delayed retry without a not-before column: %v, want ErrNoNotBefore", err)
				}
				sameRows(t, "a refused Retry", before, dumpRows(t, db, table))
				if err := d.Release(ctx); err != nil {
					t.Fatalf("release after a refused Retry: %v", err)
				}
				if a := attemptOf(t, e, db, table, id); a != 1 {
					t.Fatalf("stored attempt %d, want 1", a)
				}
				mustBeIdle(t, db, nq)
			})
		}
		mustBeIdle(t, db, q)
	})
}

// TestEnqueue: through *sql.DB, *sql.Tx and *sql.Conn, with and without a
// not-before time, returning the new row's int64 id.
func TestEnqueue(t *testing.T) {
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, 4)
		table := newTable(t, e, db, "enqueue_"+form)
		clock := fakeclock.New(clockStart)
		q := newQueue(t, db, queueConfig(e, Table(table, form), clock))
		ctx := context.Background()
		ids := map[string]any{}
		enq := func(name string, ex inbox.Executor, job inbox.Job) any {
			t.Helper()
			job.Data = []any{[]byte(name)}
			id, err := q.Enqueue(ctx, ex, job)
			if err != nil {
				t.Fatalf("enqueue %s: %v", name, err)
			}
			if _, ok := id.(int64); !ok {
				t.Fatalf("enqueue %s returned id %v of type %T, want int64", name, id, id)
			}
			ids[name] = id
			return id
		}
		later := clock.Now().Add(time.Hour)

		enq("db", db, inbox.Job{})
		enq("db-later", db, inbox.Job{NotBefore: later})

		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		enq("tx-rolled-back", tx, inbox.Job{})
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		tx, err = db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		enq("tx", tx, inbox.Job{})
		enq("tx-later", tx, inbox.Job{NotBefore: later})
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}

		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		enq("conn", conn, inbox.Job{})
		enq("conn-later", conn, inbox.Job{NotBefore: later})
		if err := conn.Close(); err != nil {
			t.Fatal(err)
		}

		rows := dumpRows(t, db, table)
		if len(rows) != 6 {
			t.Fatalf("table holds %d rows, want 6 (the rolled-back one absent):\n%s", len(rows), strings.Join(rows, "\n"))
		}
		for name, id := range ids {
			if name == "tx-rolled-back" {
				continue // SQLite may give its id to the next row
			}
			var p []byte
			err := db.QueryRow(bind(e, "SELECT payload FROM "+table+" WHERE id = ?"), id).Scan(&p)
			if err != nil || string(p) != name {
				t.Errorf("job %s (id %v): payload %q, %v", name, id, p, err)
			}
		}
		if strings.Contains(strings.Join(rows, "\n"), "tx-rolled-back") {
			t.Errorf("the job enqueued in a rolled-back transaction is in the table:\n%s", strings.Join(rows, "\n"))
		}

		// The delayed jobs stay out until their time, to the microsecond.
		claimAll := func() map[string]bool {
			t.Helper()
			ds, err := q.Claim(ctx, 10)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]bool{}
			for _, d := range ds {
				got[payloadOf(t, d)] = true
				if err := d.Ack(ctx); err != nil {
					t.Fatal(err)
				}
			}
			return got
		}
		if got := claimAll(); len(got) != 3 || !got["db"] || !got["tx"] || !got["conn"] {
			t.Fatalf("claimed %v before the not-before time, want db, tx and conn", got)
		}
		clock.Advance(time.Hour - time.Microsecond)
		if got := claimAll(); len(got) != 0 {
			t.Fatalf("claimed %v a microsecond before the not-before time", got)
		}
		clock.Advance(time.Microsecond)
		if got := claimAll(); len(got) != 3 || !got["db-later"] || !got["tx-later"] || !got["conn-later"] {
			t.Fatalf("claimed %v at the not-before time, want the three delayed jobs", got)
		}
		mustBeIdle(t, db, q)
	})
}

// TestTextID: a table keyed by UUID-like text given in Job.ID works for lease
// and advisory claims and every settlement.
func TestTextID(t *testing.T) {
	forms := func(Engine) []string { return []string{"lease", "advisory"} }
	eachForm(t, forms, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, 6) // the advisory form holds a connection per job
		table := tableName(e, "textid_"+form)
		textIDTable(t, e, db, table)
		clock := fakeclock.New(clockStart)
		tb := Table(table, form)
		q := newQueue(t, db, queueConfig(e, tb, clock))
		if err := q.CheckSchema(context.Background()); err != nil {
			t.Fatalf("schema check of the text-id table: %v", err)
		}
		ctx := context.Background()
		uuids := []string{
			"0b7e4a52-1c7d-4f1e-9a56-3f2d8e1c0a01",
			"1f0c9d3e-5b6a-4c2d-8e7f-9a0b1c2d3e02",
			"2a3b4c5d-6e7f-4a8b-9c0d-1e2f3a4b5c03",
			"3c4d5e6f-7a8b-4c9d-0e1f-2a3b4c5d6e04",
		}
		for i, u := range uuids {
			id, err := q.Enqueue(ctx, db, inbox.Job{ID: u, Data: []any{[]byte("p" + strconv.Itoa(i))}})
			if err != nil {
				t.Fatal(err)
			}
			if id != u {
				t.Fatalf("enqueue returned %v (%T), want the given id %q", id, id, u)
			}
		}
		ds, err := q.Claim(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) != 4 {
			t.Fatalf("claimed %d jobs, want 4", len(ds))
		}
		byID := map[string]*inbox.Delivery{}
		for i, d := range ds {
			s, ok := d.ID().(string)
			if !ok || s != uuids[i] || d.Attempt() != 1 || payloadOf(t, d) != "p"+strconv.Itoa(i) {
				t.Fatalf("delivery %d: id %v (%T) attempt %d, want %q attempt 1", i, d.ID(), d.ID(), d.Attempt(), uuids[i])
			}
			if form == "advisory" && d.Key() != uuids[i] {
				t.Fatalf("delivery %d holds key %q, want its id", i, d.Key())
			}
			byID[s] = d
		}
		if err := byID[uuids[0]].Ack(ctx); err != nil {
			t.Fatal(err)
		}
		if err := byID[uuids[1]].Retry(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := byID[uuids[2]].Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := byID[uuids[3]].Dead(ctx); err != nil {
			t.Fatal(err)
		}
		rows := dumpRows(t, db, table)
		if len(rows) != 2 || !strings.Contains(rows[0], uuids[1]) || !strings.Contains(rows[0], "attempt=2") ||
			!strings.Contains(rows[1], uuids[2]) || !strings.Contains(rows[1], "attempt=1") {
			t.Fatalf("table after the settlements:\n%s", strings.Join(rows, "\n"))
		}
		dead := dumpRows(t, db, table+"_dead")
		if len(dead) != 1 || !strings.Contains(dead[0], uuids[3]) || !strings.Contains(dead[0], "attempt=1") {
			t.Fatalf("dead table: %q", dead)
		}
		if form == "advisory" {
			noLocks(t, e, db, table, uuids)
		}
		// The released job comes back at once with its attempt, the retried
		// one after its delay with the next.
		d := claimOne(t, q)
		if d.ID() != uuids[2] || d.Attempt() != 1 {
			t.Fatalf("claimed %v attempt %d, want %s attempt 1", d.ID(), d.Attempt(), uuids[2])
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
		clock.Advance(time.Minute)
		d = claimOne(t, q)
		if d.ID() != uuids[1] || d.Attempt() != 2 {
			t.Fatalf("claimed %v attempt %d, want %s attempt 2", d.ID(), d.Attempt(), uuids[1])
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
		if n := countRows(t, db, table); n != 0 {
			t.Fatalf("%d rows left", n)
		}
		mustBeIdle(t, db, q)
	})
}

// countdownCtx is a context that cancels itself at the n-th time anything
// asks it whether it is done, so that a claim can be cancelled at each step
// of its way in turn, deterministically but for the drivers' own watchers.
type countdownCtx struct {
	context.Context
	left  atomic.Int64
	once  sync.Once
	done  chan struct{}
	fired atomic.Bool
	// firedInErr is set when the tick that fired came from Err: its caller
	// was told. A fire in Done may come from a database/sql goroutine
	// watching the context after the claim's last look, which no claim can
	// see.
	firedInErr atomic.Bool
}

func newCountdownCtx(n int) *countdownCtx {
	c := &countdownCtx{Context: context.Background(), done: make(chan struct{})}
	c.left.Store(int64(n))
	return c
}

func (c *countdownCtx) tick(inErr bool) {
	if c.left.Add(-1) <= 0 {
		c.once.Do(func() { c.firedInErr.Store(inErr); c.fired.Store(true); close(c.done) })
	}
}

func (c *countdownCtx) Done() <-chan struct{} { c.tick(false); return c.done }

func (c *countdownCtx) Err() error {
	c.tick(true)
	select {
	case <-c.done:
		return context.Canceled
	default:
		return nil
	}
}

// TestCancelledClaim: a claim under a context cancelled before or during the
// call returns an error and no delivery, holds nothing, and leaves the table
// as it was, or (lease and advisory, whose claim commits at once) as a crash
// right after the claim would have. The shallow lease's claim (one read
// through the primary key) is cancelled at every step too.
func TestCancelledClaim(t *testing.T) {
	withShallow := func(e Engine) []string { return append(formsOf(e), "lease-shallow") }
	eachForm(t, withShallow, func(t *testing.T, e Engine, form string) {
		lease := form == "lease" || form == "lease-shallow"
		db := e.Open(t, 4)
		table := newTable(t, e, db, "cancel_"+form)
		clock := fakeclock.New(clockStart)
		q := newQueue(t, db, queueConfig(e, Table(table, form), clock))
		var keys []string
		for i := range 3 {
			keys = append(keys, fmt.Sprint(enqueueOne(t, q, db, "c"+strconv.Itoa(i))))
		}
		before := dumpRows(t, db, table)

		cancelled, cancel := context.WithCancel(context.Background())
		cancel()
		expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		defer cancel2()
		for _, c := range []struct {
			name string
			ctx  context.Context
			want error
		}{{"cancelled", cancelled, context.Canceled}, {"expired", expired, context.DeadlineExceeded}} {
			ds, err := q.Claim(c.ctx, 2)
			if !errors.Is(err, c.want) || len(ds) != 0 {
				t.Fatalf("claim under a %s context: %d deliveries, %v; want none and %v", c.name, len(ds), err, c.want)
			}
			sameRows(t, "a claim under a "+c.name+" context", before, dumpRows(t, db, table))
			mustBeIdle(t, db, q)
		}

		// Cancel at every step of the claim in turn, until the claim ends
		// before the countdown does.
		var cancels int
		deadline := time.Now().Add(time.Minute)
		for n := 1; ; n++ {
			if n > 2000 {
				t.Fatal("the claim still asked its context after 2000 checks")
			}
			ctx := newCountdownCtx(n)
			ds, err := q.Claim(ctx, 2)
			if err == nil && !ctx.fired.Load() {
				// A session discarded at an earlier step may hold rows a
				// moment longer, and the claim passes over them: try again
				// until they are free.
				if len(ds) == 0 && time.Now().Before(deadline) {
					continue
				}
				if len(ds) == 0 {
					t.Fatal("the uncancelled claim got nothing for a minute")
				}
				for _, d := range ds {
					if err := d.Release(context.Background()); err != nil {
						t.Fatal(err)
					}
				}
				break
			}
			if err == nil && ctx.firedInErr.Load() {
				t.Errorf("step %d: the claim succeeded although it was told its context was cancelled", n)
			}
			if err != nil {
				cancels++
				if !ctx.fired.Load() {
					t.Errorf("step %d: the claim failed before its context was cancelled: %v", n, err)
				}
				if len(ds) != 0 {
					t.Errorf("step %d: claim failed (%v) yet returned %d deliveries", n, err, len(ds))
				}
			}
			for _, d := range ds {
				if err := d.Release(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			idleSoon(t, db, q)
			if form == "advisory" {
				noPoolLocks(t, e, db, table, keys)
			}
			after := dumpRows(t, db, table)
			if strings.Join(after, "\n") != strings.Join(before, "\n") {
				if form == "rowlock" || err == nil {
					sameRows(t, fmt.Sprintf("step %d: a cancelled claim", n), before, after)
					t.FailNow()
				}
				// The claim committed before the cancellation was seen
				// (the statement had run, its rows were still being
				// read): the jobs are out as after a crash, an attempt
				// spent and, lease form, a lease running. Nothing else may
				// differ. Put the table back for the next step.
				changed := 0
				for i := range after {
					if after[i] == before[i] {
						continue
					}
					changed++
					b, a := rowFields(before[i]), rowFields(after[i])
					ok := a["attempt"] == "2" && (!lease || a["locked_until"] != "NULL")
					for k := range b {
						ok = ok && (k == "attempt" || k == "locked_until" && lease || a[k] == b[k])
					}
					if !ok {
						t.Fatalf("step %d: a cancelled claim left %q, from %q", n, after[i], before[i])
					}
				}
				if changed > 2 {
					t.Fatalf("step %d: a cancelled claim of 2 changed %d rows", n, changed)
				}
				t.Logf("step %d: the claim committed before its cancellation was seen (%d rows out as after a crash)", n, changed)
				restoreCancelled(t, e, db, table)
			}
		}
		if cancels == 0 {
			t.Fatal("no step of the claim noticed its cancellation")
		}
		t.Logf("%d cancellation points", cancels)
	})
}

// restoreCancelled puts the rows of TestCancelledClaim back as enqueued.
func restoreCancelled(t *testing.T, e Engine, db *sql.DB, table string) {
	t.Helper()
	mustExec(t, e, db, "UPDATE "+table+" SET attempt = 1, locked_until = NULL")
}
