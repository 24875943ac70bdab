package dbtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
)

func advisoryK(Engine) []string  { return []string{"advisory-k"} }
func advisoryID(Engine) []string { return []string{"advisory"} }

// TestAdvisoryKeySerialises: jobs sharing a key are never in work at once,
// while jobs of different keys are: two jobs of two keys each wait in their
// handler for the other to start.
func TestAdvisoryKeySerialises(t *testing.T) {
	eachForm(t, advisoryK, func(t *testing.T, e Engine, form string) {
		const (
			workers = 4
			keys    = 4
			perKey  = 5
		)
		db := e.Open(t, workers+1)
		table := newTable(t, e, db, "serial")
		q := newQueue(t, db, queueConfig(e, Table(table, form), nil))
		eq := keyedQueue(t, db, e, table)
		var barrierJobs []any
		var keyNames []string
		for i := range keys * perKey {
			key := "K" + strconv.Itoa(i%keys)
			id := enqueueKey(t, eq, db, "s"+strconv.Itoa(i), key)
			if i < 2 {
				barrierJobs = append(barrierJobs, id) // the first of K0 and of K1
			}
			if i < keys {
				keyNames = append(keyNames, key)
			}
		}

		var (
			mu       sync.Mutex
			seq      int
			active   = map[string]any{}
			spans    = map[string][][2]int{} // per key: start and end sequence numbers
			arrived  atomic.Int32
			together = make(chan struct{})
		)
		runWorkers(t, q, keys*perKey, workers, 1, func(ctx context.Context, d *inbox.Delivery) error {
			mu.Lock()
			seq++
			start := seq
			if other, busy := active[d.Key()]; busy {
				mu.Unlock()
				return fmt.Errorf("key %s delivered while job %v of the same key is in work", d.Key(), other)
			}
			active[d.Key()] = d.ID()
			mu.Unlock()
			if d.ID() == barrierJobs[0] || d.ID() == barrierJobs[1] {
				if arrived.Add(1) == 2 {
					close(together)
				}
				select {
				case <-together:
				case <-time.After(time.Minute):
					return fmt.Errorf("job %v of key %s waited a minute for a job of another key to start beside it", d.ID(), d.Key())
				}
			}
			mu.Lock()
			delete(active, d.Key())
			seq++
			spans[d.Key()] = append(spans[d.Key()], [2]int{start, seq})
			mu.Unlock()
			return d.Ack(ctx)
		})
		// Each key's spans, in start order, must not overlap.
		for key, ss := range spans {
			if len(ss) != perKey {
				t.Errorf("key %s: %d jobs run, want %d", key, len(ss), perKey)
			}
			for i := 1; i < len(ss); i++ {
				if ss[i][0] < ss[i-1][1] {
					t.Errorf("key %s: job spans %v and %v overlap", key, ss[i-1], ss[i])
				}
			}
		}
		if arrived.Load() != 2 {
			t.Errorf("%d of the two barrier jobs ran", arrived.Load())
		}
		if n := countRows(t, db, table); n != 0 {
			t.Errorf("%d jobs left", n)
		}
		mustBeIdle(t, db, q)
		noLocks(t, e, db, table, keyNames)
	})
}

// hookDialect wraps a dialect so that something happens between reading the
// candidates and taking the first lock: another process settles the row. On
// SQLite, whose keys live in the process, it adds a Locker that locks nothing,
// only to reach that moment; the re-read it tests is the same code.
type hookDialect struct {
	inbox.Dialect
	locker dialect.Locker // the engine's, nil on SQLite
	before func()
	calls  atomic.Int32
	// beforeUnlock, when set, runs before each Unlock with its context.
	beforeUnlock func(ctx context.Context)
}

// TableIdentity passes the engine's table identity through, so that a
// hooked queue locks the keys an unhooked one does.
func (h *hookDialect) TableIdentity(ctx context.Context, db *sql.DB, n *dialect.Names) (string, error) {
	if ti, ok := h.Dialect.(dialect.TableIdentifier); ok {
		return ti.TableIdentity(ctx, db, n)
	}
	return n.Raw.Name, nil
}

// Statements are the engine's, without LockFirst when before is set: a
// hook between the candidate read and the lock needs the walk from Go,
// which MySQL and SQLite take. (LockFirst reads and locks in one
// statement; TestLockFirstMiss reaches its window.)
func (h *hookDialect) Statements(n *dialect.Names) (*inbox.Statements, error) {
	st, err := h.Dialect.Statements(n)
	if err == nil && h.before != nil {
		st.Advisory.LockFirst, st.Advisory.LockFirstAfter = dialect.Stmt{}, dialect.Stmt{}
	}
	return st, err
}

func (h *hookDialect) TryLock(ctx context.Context, conn *sql.Conn, table, key string) (bool, error) {
	if h.calls.Add(1) == 1 && h.before != nil {
		h.before()
	}
	if h.locker == nil {
		return true, nil
	}
	return h.locker.TryLock(ctx, conn, table, key)
}

func (h *hookDialect) Unlock(ctx context.Context, conn *sql.Conn, table, key string) error {
	if h.beforeUnlock != nil {
		h.beforeUnlock(ctx)
	}
	if h.locker == nil {
		return nil
	}
	return h.locker.Unlock(ctx, conn, table, key)
}

// TestAdvisorySettledBeforeLock: a row another process claims and acks
// between this claim's candidate read and its lock is not delivered, and
// the claim leaves no lock, key or connection behind.
func TestAdvisorySettledBeforeLock(t *testing.T) {
	eachForm(t, advisoryK, func(t *testing.T, e Engine, form string) {
		db, db2 := openTwo(t, e, 4)
		table := newTable(t, e, db, "raced")
		tb := Table(table, form)
		other := newQueue(t, db2, queueConfig(e, tb, nil))
		eq := keyedQueue(t, db, e, table)
		id := enqueueKey(t, eq, db, "raced", "A")

		h := &hookDialect{Dialect: e.Dialect}
		h.locker, _ = e.Dialect.(dialect.Locker)
		h.before = func() {
			d := claimOne(t, other)
			if d.ID() != id {
				t.Errorf("the other process claimed %v, want %v", d.ID(), id)
			}
			if err := d.Ack(context.Background()); err != nil {
				t.Error(err)
			}
		}
		cfg := queueConfig(e, tb, nil)
		cfg.Dialect = h
		q := newQueue(t, db, cfg)
		ds, err := q.Claim(context.Background(), 1)
		if err != nil {
			t.Fatal(err)
		}
		if h.calls.Load() != 1 {
			t.Fatalf("the claim took %d locks, want 1: the hook did not run between candidates and lock", h.calls.Load())
		}
		if len(ds) != 0 {
			t.Fatalf("claimed %v (attempt %d), a job acked before its lock was taken", ds[0].ID(), ds[0].Attempt())
		}
		mustBeIdle(t, db, q, other)
		mustBeIdle(t, db2)
		noLocks(t, e, db, table, []string{"A"})
		// The key is free in the process too: a new job of key A comes.
		id2 := enqueueKey(t, eq, db, "next", "A")
		d := claimOne(t, q)
		if d.ID() != id2 || d.Key() != "A" {
			t.Fatalf("claimed %v key %q, want %v key A", d.ID(), d.Key(), id2)
		}
		if err := d.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
		mustBeIdle(t, db, q)
		noLocks(t, e, db, table, []string{"A"})
	})
}

// TestAdvisoryBusyKey: a key another session locks (with the lock the
// package would take for it) is passed over, and delivered once free.
func TestAdvisoryBusyKey(t *testing.T) {
	eachForm(t, func(e Engine) []string {
		if e.IsSQLite() {
			return nil
		}
		return advisoryK(e)
	}, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, 4)
		table := newTable(t, e, db, "busy")
		q := newQueue(t, db, queueConfig(e, Table(table, form), nil))
		eq := keyedQueue(t, db, e, table)
		idA := enqueueKey(t, eq, db, "a", "A")
		idB := enqueueKey(t, eq, db, "b", "B")
		ctx := context.Background()

		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		lock, unlock := "SELECT pg_advisory_lock($1)", "SELECT pg_advisory_unlock($1)"
		ident := tableIdentity(t, e, db, table)
		var key any = inbox.PostgresLockKey(ident, "A")
		if e.IsMySQL() {
			lock, unlock, key = "SELECT GET_LOCK(?, 0)", "SELECT RELEASE_LOCK(?)", inbox.MySQLLockName(ident, "A")
		}
		var ok any
		if err := conn.QueryRowContext(ctx, lock, key).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		if n := locksHeld(t, e, db, table, []string{"A"}); n != 1 {
			t.Fatalf("the other session's lock on A does not show: %d held", n)
		}
		d := claimOne(t, q)
		if d.ID() != idB {
			t.Fatalf("claimed %v with key A locked elsewhere, want %v", d.ID(), idB)
		}
		if n := locksHeld(t, e, db, table, []string{"B"}); n != 1 {
			t.Fatalf("the claim of B holds %d locks, want 1", n)
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
		claimNone(t, q, "key A locked by another session")
		if err := conn.QueryRowContext(ctx, unlock, key).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		// The queue found A held by another session on this very row, so
		// its claims may pass A over for up to inbox's heldFor (100 ms)
		// after the other session let go of it with the row kept.
		d = nil
		eventually(t, 30*time.Second, "a claim of A once the other session let it go", func() error {
			ds, err := q.Claim(ctx, 1)
			if err != nil {
				return err
			}
			if len(ds) == 0 {
				return errors.New("claimed nothing")
			}
			d = ds[0]
			return nil
		})
		if d.ID() != idA || d.Attempt() != 1 {
			t.Fatalf("claimed %v attempt %d once A was free, want %v attempt 1", d.ID(), d.Attempt(), idA)
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
		if err := conn.Close(); err != nil {
			t.Fatal(err)
		}
		mustBeIdle(t, db, q)
		noLocks(t, e, db, table, []string{"A", "B"})
	})
}

// TestAdvisoryShutdown: Shutdown gives back every held job at once, attempt
// restored and lock freed, and the deliveries then count as settled.
func TestAdvisoryShutdown(t *testing.T) {
	eachForm(t, advisoryID, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, 5)
		table := newTable(t, e, db, "shutdown_"+form)
		tb := Table(table, form)
		q := newQueue(t, db, queueConfig(e, tb, nil))
		ctx := context.Background()
		var keys []string
		for i := range 3 {
			keys = append(keys, fmt.Sprint(enqueueOne(t, q, db, "s"+strconv.Itoa(i))))
		}
		ds, err := q.Claim(ctx, 3)
		if err != nil || len(ds) != 3 {
			t.Fatalf("claimed %d, %v; want 3", len(ds), err)
		}
		if !e.IsSQLite() {
			if n := locksHeld(t, e, db, table, keys); n != 3 {
				t.Fatalf("%d locks held for 3 claimed jobs", n)
			}
		}
		q2 := newQueue(t, db, queueConfig(e, tb, nil))
		claimNone(t, q2, "every job held by the first queue")
		if err := q.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		mustBeIdle(t, db, q)
		noLocks(t, e, db, table, keys)
		for _, k := range keys {
			if a := attemptOf(t, e, db, table, k); a != 1 {
				t.Errorf("job %s stored attempt %d after Shutdown, want 1", k, a)
			}
		}
		for _, d := range ds {
			if err := d.Ack(ctx); !errors.Is(err, inbox.ErrSettled) {
				t.Errorf("ack after Shutdown: %v, want ErrSettled", err)
			}
		}
		got, err := q2.Claim(ctx, 5)
		if err != nil || len(got) != 3 {
			t.Fatalf("after Shutdown another queue claimed %d, %v; want 3", len(got), err)
		}
		for _, d := range got {
			if d.Attempt() != 1 {
				t.Errorf("job %v came back with attempt %d, want 1", d.ID(), d.Attempt())
			}
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
		mustBeIdle(t, db, q, q2)
		noLocks(t, e, db, table, keys)
	})
}

// TestAdvisorySQLiteSharedKeys: on SQLite the keys in work are shared by the
// queues of one *sql.DB and table: a key one holds is not delivered by the
// other.
func TestAdvisorySQLiteSharedKeys(t *testing.T) {
	eachForm(t, func(e Engine) []string {
		if !e.IsSQLite() {
			return nil
		}
		return advisoryK(e)
	}, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, 4)
		table := newTable(t, e, db, "shared")
		tb := Table(table, form)
		q1 := newQueue(t, db, queueConfig(e, tb, nil))
		q2 := newQueue(t, db, queueConfig(e, tb, nil))
		eq := keyedQueue(t, db, e, table)
		a1 := enqueueKey(t, eq, db, "a1", "A")
		a2 := enqueueKey(t, eq, db, "a2", "A")
		b1 := enqueueKey(t, eq, db, "b1", "B")
		ctx := context.Background()

		ds, err := q1.Claim(ctx, 1)
		if err != nil || len(ds) != 1 || ds[0].ID() != a1 {
			t.Fatalf("first queue claimed %d, %v; want job %v", len(ds), err, a1)
		}
		d := claimOne(t, q2)
		if d.ID() != b1 {
			t.Fatalf("second queue claimed %v while key A is held by the first, want %v", d.ID(), b1)
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
		claimNone(t, q2, "key A held by the other queue")
		if err := ds[0].Ack(ctx); err != nil {
			t.Fatal(err)
		}
		d = claimOne(t, q2)
		if d.ID() != a2 {
			t.Fatalf("second queue claimed %v once A was free, want %v", d.ID(), a2)
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
		mustBeIdle(t, db, q1, q2)
	})
}
