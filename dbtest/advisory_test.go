package dbtest

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
)

// confIdent returns the identity the advisory form names table's locks by,
// as the engine resolves it (Postgres: schema.table; MySQL: database.table).
func confIdent(t testing.TB, e Engine, db *sql.DB, table string) string {
	t.Helper()
	ti, ok := e.Dialect.(inbox.TableIdentifier)
	if !ok {
		return table
	}
	n := inbox.Names{Raw: inbox.Table{Name: table}}
	var quoted []string
	parts := strings.Split(table, ".")
	for _, p := range parts {
		qp, err := e.Dialect.QuoteIdent(p)
		if err != nil {
			t.Fatal(err)
		}
		quoted = append(quoted, qp)
	}
	n.Table, n.TableName = strings.Join(quoted, "."), parts[len(parts)-1]
	if len(parts) == 2 {
		n.Schema = parts[0]
	}
	ident, err := ti.TableIdentity(context.Background(), db, &n)
	if err != nil {
		t.Fatalf("identity of %s: %v", table, err)
	}
	return ident
}

// confLocksHeld returns how many of the advisory locks of table's keys any
// session of the server holds (Postgres: pg_locks; MySQL/MariaDB:
// IS_FREE_LOCK). SQLite has no session locks: it must not be asked.
func confLocksHeld(t testing.TB, e Engine, db *sql.DB, table string, keys []string) int {
	t.Helper()
	n := 0
	if !e.IsSQLite() {
		table = confIdent(t, e, db, table)
	}
	switch {
	case e.IsPostgres():
		// A 64-bit key shows as classid (high half), objid (low half) and
		// objsubid 1.
		rows, err := db.Query("SELECT classid::bigint, objid::bigint FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		held := map[[2]int64]bool{}
		for rows.Next() {
			var hi, lo int64
			if err := rows.Scan(&hi, &lo); err != nil {
				t.Fatal(err)
			}
			held[[2]int64{hi, lo}] = true
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			u := uint64(inbox.PostgresLockKey(table, k))
			if held[[2]int64{int64(u >> 32), int64(u & 0xffffffff)}] {
				n++
			}
		}
	case e.IsMySQL():
		for _, k := range keys {
			var free sql.NullInt64
			if err := db.QueryRow("SELECT IS_FREE_LOCK(?)", inbox.MySQLLockName(table, k)).Scan(&free); err != nil {
				t.Fatal(err)
			}
			if !free.Valid {
				t.Fatalf("IS_FREE_LOCK(%q) returned NULL", inbox.MySQLLockName(table, k))
			}
			if free.Int64 == 0 {
				n++
			}
		}
	default:
		t.Fatalf("%s has no session locks to look at", e.Name)
	}
	return n
}

// confNoLocks fails the test if any advisory lock of table's keys is held.
// On SQLite the keys live in the process; the tests check them with a claim.
func confNoLocks(t testing.TB, e Engine, db *sql.DB, table string, keys []string) {
	t.Helper()
	if e.IsSQLite() {
		return
	}
	if n := confLocksHeld(t, e, db, table, keys); n != 0 {
		t.Errorf("%d advisory locks of %s left held", n, table)
	}
}

// confNoPoolLocks is confNoLocks for the moments after a cancellation. A
// connection cut mid-statement is discarded, but its session lives on in
// the server a moment longer, and may even run a lock call it had already
// received; it holds nothing once it ends. So: no lock of the keys may be
// held by a session of the pool (one that will be reused), and every other
// holder must end, within a deadline.
func confNoPoolLocks(t testing.TB, e Engine, db *sql.DB, table string, keys []string) {
	t.Helper()
	if e.IsSQLite() {
		return
	}
	pool := confPoolSessions(t, e, db)
	for _, pid := range confLockHolders(t, e, db, table, keys) {
		if pool[pid] {
			t.Errorf("session %d of the pool holds an advisory lock of %s", pid, table)
			continue
		}
		deadline := time.Now().Add(10 * time.Second)
		for confSessionAlive(t, e, db, pid) {
			if time.Now().After(deadline) {
				t.Errorf("discarded session %d still holds an advisory lock of %s after 10s", pid, table)
				break
			}
			time.Sleep(5 * time.Millisecond) // polling the server's session list, with a deadline
		}
	}
}

// confPoolSessions returns the server's session ids of every connection
// the pool holds; none may be in use.
func confPoolSessions(t testing.TB, e Engine, db *sql.DB) map[int64]bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q := "SELECT CONNECTION_ID()"
	if e.IsPostgres() {
		q = "SELECT pg_backend_pid()"
	}
	ids := map[int64]bool{}
	var conns []*sql.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range db.Stats().OpenConnections {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		var id int64
		if err := c.QueryRowContext(ctx, q).Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids[id] = true
	}
	return ids
}

// confLockHolders returns the sessions holding advisory locks of table's
// keys.
func confLockHolders(t testing.TB, e Engine, db *sql.DB, table string, keys []string) []int64 {
	t.Helper()
	var out []int64
	table = confIdent(t, e, db, table)
	if e.IsMySQL() {
		for _, k := range keys {
			var id sql.NullInt64
			if err := db.QueryRow("SELECT IS_USED_LOCK(?)", inbox.MySQLLockName(table, k)).Scan(&id); err != nil {
				t.Fatal(err)
			}
			if id.Valid {
				out = append(out, id.Int64)
			}
		}
		return out
	}
	want := map[[2]int64]bool{}
	for _, k := range keys {
		u := uint64(inbox.PostgresLockKey(table, k))
		want[[2]int64{int64(u >> 32), int64(u & 0xffffffff)}] = true
	}
	rows, err := db.Query("SELECT pid, classid::bigint, objid::bigint FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var pid, hi, lo int64
		if err := rows.Scan(&pid, &hi, &lo); err != nil {
			t.Fatal(err)
		}
		if want[[2]int64{hi, lo}] {
			out = append(out, pid)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// confSessionAlive tells whether the server still has session id.
func confSessionAlive(t testing.TB, e Engine, db *sql.DB, id int64) bool {
	t.Helper()
	q := "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?"
	if e.IsPostgres() {
		q = "SELECT COUNT(*) FROM pg_stat_activity WHERE pid = $1"
	}
	var n int
	if err := db.QueryRow(q, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// confOpenTwo opens two pools on the same database (for SQLite, the same
// file): two processes, as far as the queue can tell.
func confOpenTwo(t *testing.T, e Engine, maxConns int) (*sql.DB, *sql.DB) {
	t.Helper()
	dsn := e.DSN(t, t.TempDir())
	return e.OpenDSN(t, dsn, maxConns), e.OpenDSN(t, dsn, maxConns)
}

// confKeyed returns a queue that enqueues (payload, k) into an advisory-k
// table.
func confKeyed(t testing.TB, db *sql.DB, e Engine, table string) *inbox.Queue {
	tb := Table(table, "advisory-k")
	tb.Data = []string{"payload", "k"}
	return confNew(t, db, confConfig(e, tb, nil))
}

func confEnqueueKey(t testing.TB, eq *inbox.Queue, db *sql.DB, p, key string) any {
	t.Helper()
	id, err := eq.Enqueue(context.Background(), db, inbox.Job{Data: []any{[]byte(p), key}})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func advisoryK(Engine) []string  { return []string{"advisory-k"} }
func advisoryID(Engine) []string { return []string{"advisory"} }

// TestAdvisoryKeySerialises: jobs sharing a key are never in work at once,
// while jobs of different keys are: two jobs of two keys each wait in their
// handler for the other to start.
func TestAdvisoryKeySerialises(t *testing.T) {
	confEach(t, advisoryK, func(t *testing.T, e Engine, form string) {
		const (
			workers = 4
			keys    = 4
			perKey  = 5
		)
		db := e.Open(t, workers+1)
		table := confTable(t, e, db, "serial")
		q := confNew(t, db, confConfig(e, Table(table, form), nil))
		eq := confKeyed(t, db, e, table)
		var barrierJobs []any
		var keyNames []string
		for i := range keys * perKey {
			key := "K" + strconv.Itoa(i%keys)
			id := confEnqueueKey(t, eq, db, "s"+strconv.Itoa(i), key)
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
		confRun(t, q, keys*perKey, workers, 1, func(ctx context.Context, d *inbox.Delivery) error {
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
		if n := confCount(t, db, table); n != 0 {
			t.Errorf("%d jobs left", n)
		}
		confIdle(t, db, q)
		confNoLocks(t, e, db, table, keyNames)
	})
}

// hookDialect wraps a dialect so that something happens between reading the
// candidates and taking the first lock: another process settles the row. On
// SQLite, whose keys live in the process, it adds a Locker that locks nothing,
// only to reach that moment; the re-read it tests is the same code.
type hookDialect struct {
	inbox.Dialect
	locker inbox.Locker // the engine's, nil on SQLite
	before func()
	calls  atomic.Int32
	// beforeUnlock, when set, runs before each Unlock with its context.
	beforeUnlock func(ctx context.Context)
}

// TableIdentity passes the engine's table identity through, so that a
// hooked queue locks the keys an unhooked one does.
func (h *hookDialect) TableIdentity(ctx context.Context, db *sql.DB, n *inbox.Names) (string, error) {
	if ti, ok := h.Dialect.(inbox.TableIdentifier); ok {
		return ti.TableIdentity(ctx, db, n)
	}
	return n.Raw.Name, nil
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
	confEach(t, advisoryK, func(t *testing.T, e Engine, form string) {
		db, db2 := confOpenTwo(t, e, 4)
		table := confTable(t, e, db, "raced")
		tb := Table(table, form)
		other := confNew(t, db2, confConfig(e, tb, nil))
		eq := confKeyed(t, db, e, table)
		id := confEnqueueKey(t, eq, db, "raced", "A")

		h := &hookDialect{Dialect: e.Dialect}
		h.locker, _ = e.Dialect.(inbox.Locker)
		h.before = func() {
			d := confClaimOne(t, other)
			if d.ID() != id {
				t.Errorf("the other process claimed %v, want %v", d.ID(), id)
			}
			if err := d.Ack(context.Background()); err != nil {
				t.Error(err)
			}
		}
		cfg := confConfig(e, tb, nil)
		cfg.Dialect = h
		q := confNew(t, db, cfg)
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
		confIdle(t, db, q, other)
		confIdle(t, db2)
		confNoLocks(t, e, db, table, []string{"A"})
		// The key is free in the process too: a new job of key A comes.
		id2 := confEnqueueKey(t, eq, db, "next", "A")
		d := confClaimOne(t, q)
		if d.ID() != id2 || d.Key() != "A" {
			t.Fatalf("claimed %v key %q, want %v key A", d.ID(), d.Key(), id2)
		}
		if err := d.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
		confIdle(t, db, q)
		confNoLocks(t, e, db, table, []string{"A"})
	})
}

// TestAdvisoryBusyKey: a key another session locks (with the lock the
// package would take for it) is passed over, and delivered once free.
func TestAdvisoryBusyKey(t *testing.T) {
	confEach(t, func(e Engine) []string {
		if e.IsSQLite() {
			return nil
		}
		return advisoryK(e)
	}, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, 4)
		table := confTable(t, e, db, "busy")
		q := confNew(t, db, confConfig(e, Table(table, form), nil))
		eq := confKeyed(t, db, e, table)
		idA := confEnqueueKey(t, eq, db, "a", "A")
		idB := confEnqueueKey(t, eq, db, "b", "B")
		ctx := context.Background()

		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		lock, unlock := "SELECT pg_advisory_lock($1)", "SELECT pg_advisory_unlock($1)"
		ident := confIdent(t, e, db, table)
		var key any = inbox.PostgresLockKey(ident, "A")
		if e.IsMySQL() {
			lock, unlock, key = "SELECT GET_LOCK(?, 0)", "SELECT RELEASE_LOCK(?)", inbox.MySQLLockName(ident, "A")
		}
		var ok any
		if err := conn.QueryRowContext(ctx, lock, key).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		if n := confLocksHeld(t, e, db, table, []string{"A"}); n != 1 {
			t.Fatalf("the other session's lock on A does not show: %d held", n)
		}
		d := confClaimOne(t, q)
		if d.ID() != idB {
			t.Fatalf("claimed %v with key A locked elsewhere, want %v", d.ID(), idB)
		}
		if n := confLocksHeld(t, e, db, table, []string{"B"}); n != 1 {
			t.Fatalf("the claim of B holds %d locks, want 1", n)
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
		confClaimNone(t, q, "key A locked by another session")
		if err := conn.QueryRowContext(ctx, unlock, key).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		d = confClaimOne(t, q)
		if d.ID() != idA || d.Attempt() != 1 {
			t.Fatalf("claimed %v attempt %d once A was free, want %v attempt 1", d.ID(), d.Attempt(), idA)
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
		if err := conn.Close(); err != nil {
			t.Fatal(err)
		}
		confIdle(t, db, q)
		confNoLocks(t, e, db, table, []string{"A", "B"})
	})
}

// TestAdvisoryShutdown: Shutdown gives back every held job at once, attempt
// restored and lock freed, and the deliveries then count as settled.
func TestAdvisoryShutdown(t *testing.T) {
	confEach(t, advisoryID, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, 5)
		table := confTable(t, e, db, "shutdown_"+form)
		tb := Table(table, form)
		q := confNew(t, db, confConfig(e, tb, nil))
		ctx := context.Background()
		var keys []string
		for i := range 3 {
			keys = append(keys, fmt.Sprint(confEnqueue(t, q, db, "s"+strconv.Itoa(i))))
		}
		ds, err := q.Claim(ctx, 3)
		if err != nil || len(ds) != 3 {
			t.Fatalf("claimed %d, %v; want 3", len(ds), err)
		}
		if !e.IsSQLite() {
			if n := confLocksHeld(t, e, db, table, keys); n != 3 {
				t.Fatalf("%d locks held for 3 claimed jobs", n)
			}
		}
		q2 := confNew(t, db, confConfig(e, tb, nil))
		confClaimNone(t, q2, "every job held by the first queue")
		if err := q.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		confIdle(t, db, q)
		confNoLocks(t, e, db, table, keys)
		for _, k := range keys {
			if a := confAttempt(t, e, db, table, k); a != 1 {
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
		confIdle(t, db, q, q2)
		confNoLocks(t, e, db, table, keys)
	})
}

// TestAdvisorySQLiteSharedKeys: on SQLite the keys in work are shared by the
// queues of one *sql.DB and table: a key one holds is not delivered by the
// other.
func TestAdvisorySQLiteSharedKeys(t *testing.T) {
	confEach(t, func(e Engine) []string {
		if !e.IsSQLite() {
			return nil
		}
		return advisoryK(e)
	}, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, 4)
		table := confTable(t, e, db, "shared")
		tb := Table(table, form)
		q1 := confNew(t, db, confConfig(e, tb, nil))
		q2 := confNew(t, db, confConfig(e, tb, nil))
		eq := confKeyed(t, db, e, table)
		a1 := confEnqueueKey(t, eq, db, "a1", "A")
		a2 := confEnqueueKey(t, eq, db, "a2", "A")
		b1 := confEnqueueKey(t, eq, db, "b1", "B")
		ctx := context.Background()

		ds, err := q1.Claim(ctx, 1)
		if err != nil || len(ds) != 1 || ds[0].ID() != a1 {
			t.Fatalf("first queue claimed %d, %v; want job %v", len(ds), err, a1)
		}
		d := confClaimOne(t, q2)
		if d.ID() != b1 {
			t.Fatalf("second queue claimed %v while key A is held by the first, want %v", d.ID(), b1)
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
		confClaimNone(t, q2, "key A held by the other queue")
		if err := ds[0].Ack(ctx); err != nil {
			t.Fatal(err)
		}
		d = confClaimOne(t, q2)
		if d.ID() != a2 {
			t.Fatalf("second queue claimed %v once A was free, want %v", d.ID(), a2)
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
		confIdle(t, db, q1, q2)
	})
}
