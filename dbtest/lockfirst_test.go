package dbtest

// PostgreSQL's and MariaDB's advisory claims take their lock in SQL
// (Statements.Advisory.LockFirst): the server walks a page of candidates and
// stops at the first key it locks. These tests hold it to what the walk from Go promised: the lock
// is PostgresLockKey's, one lock a job, held keys passed over however many
// stand ahead, and a row gone before its lock costs nothing.

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/dialect"
	"github.com/sqlinbox/inbox/internal/connhook"
)

func postgresOnly(e Engine) bool { return e.IsPostgres() }

// locksInSQL keeps the engines whose dialect has LockFirst: PostgreSQL's and
// inbox.MariaDB (inbox.MySQL keeps the walk from Go).
func locksInSQL(e Engine) bool { return e.IsPostgres() || e.Dialect == inbox.MariaDB }

// lockingFirst is a dialect whose advisory claims always lock in SQL:
// inbox.MariaDB sends LockFirst only once a walk has found a key held by
// another process (LockFirstContended, TestLockFirstWhenContended); these
// tests hold the statement itself to its promises.
type lockingFirst struct{ inbox.Dialect }

func (d lockingFirst) Unwrap() inbox.Dialect { return d.Dialect }

func (d lockingFirst) Statements(n *dialect.Names) (*inbox.Statements, error) {
	st, err := d.Dialect.Statements(n)
	if err == nil {
		st.Advisory.LockFirstContended = false
	}
	return st, err
}

// lockFirstDialect is e's dialect, locking in SQL at every claim.
func lockFirstDialect(e Engine) inbox.Dialect {
	if e.Dialect == inbox.MariaDB {
		return lockingFirst{e.Dialect}
	}
	return e.Dialect
}

// lockFirstTable creates a plain advisory table whose key column k has the
// given type, under both spellings a user writes: the name alone and
// schema-qualified.
func lockFirstTable(t *testing.T, e Engine, db *sql.DB, what, keyType string) string {
	t.Helper()
	table := tableName(e, what)
	mustExec(t, e, db, "DROP TABLE IF EXISTS "+table)
	if e.IsMySQL() {
		mustExec(t, e, db, "CREATE TABLE "+table+" (id bigint AUTO_INCREMENT PRIMARY KEY, attempt integer NOT NULL DEFAULT 0, k "+keyType+", payload blob)")
	} else {
		mustExec(t, e, db, "CREATE TABLE "+table+" (id bigserial PRIMARY KEY, attempt integer NOT NULL DEFAULT 0, k "+keyType+", payload bytea)")
	}
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + table) })
	return table
}

// TestLockFirstLocksKeyName: the key the statement hashes in SQL is the one
// PostgresLockKey (MySQLLockName on MariaDB) names, for every key type
// CheckSchema accepts and for keys of every shape (empty, spaces, quotes,
// non-ASCII, a NULL key), under both spellings of the table: another
// session sees exactly that lock held while the job is in work, and the
// queue's Unlock (from Go) lets it go.
func TestLockFirstLocksKeyName(t *testing.T) {
	eachEngine(t, locksInSQL, func(t *testing.T, e Engine) {
		db, db2 := openTwo(t, e, 4)
		texts := []any{"A", "", " spaced key ", "quote'd", "é日本", "null\\x"}
		type keyCase struct {
			typ  string
			keys []any
		}
		cases := []keyCase{
			{"bigint", []any{int64(7), int64(-1), int64(1) << 40}},
			{"integer", []any{int64(0), int64(2147483647)}},
			{"smallint", []any{int64(-32768)}},
			{"text", texts},
			{"character varying(40)", []any{"tenant-42"}},
			{"uuid", []any{"0b8c2f1e-5d0a-4c3e-9f6b-1a2b3c4d5e6f"}},
			{"text", []any{nil}},
		}
		if e.IsMySQL() {
			cases = []keyCase{
				{"bigint", []any{int64(7), int64(-1), int64(1) << 40}},
				{"bigint unsigned", []any{uint64(1) << 63}},
				{"int", []any{int64(0), int64(2147483647)}},
				{"smallint", []any{int64(-32768)}},
				{"varchar(64)", texts},
				{"varchar(64) CHARACTER SET latin1", []any{"tenant-42", "café"}},
				{"char(36)", []any{"0b8c2f1e-5d0a-4c3e-9f6b-1a2b3c4d5e6f"}},
				{"uuid", []any{"0b8c2f1e-5d0a-4c3e-9f6b-1a2b3c4d5e6f"}},
				{"varchar(64)", []any{nil}},
			}
		}
		for _, c := range cases {
			name := strings.NewReplacer(" ", "_", "(", "", ")", "").Replace(c.typ)
			t.Run(name, func(t *testing.T) {
				table := lockFirstTable(t, e, db, "lockfirst_"+name, c.typ)
				for _, spelling := range []string{table, concQualified(t, e, db, table)} {
					q := newQueue(t, db2, inbox.Config{Dialect: lockFirstDialect(e), Table: inbox.Table{Name: spelling, AdvisoryKey: "k"}})
					if q.Statements().Advisory.LockFirst.SQL == "" {
						t.Fatalf("the %s dialect has no LockFirst: this test tests nothing", e.Name)
					}
					for _, k := range c.keys {
						mustExec(t, e, db, "INSERT INTO "+table+" (k) VALUES (?)", k)
						d := claimOne(t, q)
						want := keyText(k)
						if d.Key() != want {
							t.Fatalf("%s: claimed key %q, want %q", spelling, d.Key(), want)
						}
						if n := locksHeld(t, e, db, table, []string{want}); n != 1 {
							t.Fatalf("%s key %q: the lock Go names is held %d times, want 1: the SQL hash differs", spelling, want, n)
						}
						if err := d.Ack(context.Background()); err != nil {
							t.Fatal(err)
						}
						if n := locksHeld(t, e, db, table, []string{want}); n != 0 {
							t.Fatalf("%s key %q: the lock is held after the ack", spelling, want)
						}
					}
					mustBeIdle(t, db2, q)
				}
			})
		}
	})
}

// keyString is the text the queue names a key by: a NULL key is "".
func keyText(k any) string {
	if k == nil {
		return ""
	}
	return fmt.Sprint(k)
}

// TestLockFirstStopsAtFirst: among many free keys the statement locks the
// first in claim order and no other, one lock a job for a claim of one and
// of several; with priorities, the highest first.
func TestLockFirstStopsAtFirst(t *testing.T) {
	eachEngine(t, locksInSQL, func(t *testing.T, e Engine) {
		db := e.Open(t, 12)
		table := lockFirstTable(t, e, db, "lockfirst_first", "text")
		mustExec(t, e, db, "ALTER TABLE "+table+" ADD COLUMN priority integer NOT NULL DEFAULT 0")
		for i := range 60 {
			mustExec(t, e, db, "INSERT INTO "+table+" (k, priority) VALUES (?, ?)", fmt.Sprintf("k%02d", i), i%3)
		}
		keys := make([]string, 60)
		for i := range keys {
			keys[i] = fmt.Sprintf("k%02d", i)
		}
		q := newQueue(t, db, inbox.Config{Dialect: lockFirstDialect(e), Table: inbox.Table{Name: table, AdvisoryKey: "k", Priority: "priority"}})
		ctx := context.Background()
		var got []string
		for _, n := range []int{1, 4, 3} {
			ds, err := q.Claim(ctx, n)
			if err != nil {
				t.Fatal(err)
			}
			if len(ds) != n {
				t.Fatalf("Claim(%d) gave %d jobs", n, len(ds))
			}
			for _, d := range ds {
				got = append(got, d.Key())
			}
			if held := locksHeld(t, e, db, table, keys); held != len(got) {
				t.Fatalf("after claiming %d jobs, %d keys are locked: the walk went past the first free key", len(got), held)
			}
		}
		// Priority 2 first (k02, k05, …), in id order.
		want := []string{"k02", "k05", "k08", "k11", "k14", "k17", "k20", "k23"}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("claimed %v, want %v", got, want)
		}
		if err := q.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		if held := locksHeld(t, e, db, table, keys); held != 0 {
			t.Fatalf("%d keys locked after Shutdown", held)
		}
	})
}

// TestLockFirstPastHeldPages: keys another session holds fill many pages
// ahead; the claim walks past them all to the first free key, whichever
// pool it comes from, and locks only that one.
func TestLockFirstPastHeldPages(t *testing.T) {
	eachEngine(t, locksInSQL, func(t *testing.T, e Engine) {
		db, db2 := openTwo(t, e, 4)
		table := lockFirstTable(t, e, db, "lockfirst_pages", "bigint")
		const held = 300
		lock, unlockAll := "SELECT pg_advisory_lock($1)", "SELECT pg_advisory_unlock_all()"
		if e.IsMySQL() {
			lock, unlockAll = "SELECT GET_LOCK(?, 10)", "SELECT RELEASE_ALL_LOCKS()"
			mustExec(t, e, db, fmt.Sprintf("INSERT INTO %s (k) SELECT seq FROM seq_1_to_%d", table, held+2))
		} else {
			mustExec(t, e, db, fmt.Sprintf("INSERT INTO %s (k) SELECT g FROM generate_series(1, %d) g", table, held+2))
		}
		ident := tableIdentity(t, e, db, table)
		holder, err := db.Conn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			mustExecConn(t, holder, unlockAll)
			holder.Close()
		}()
		var keys []string
		for i := 1; i <= held+2; i++ {
			keys = append(keys, fmt.Sprint(i))
		}
		for _, k := range keys[:held] {
			if e.IsMySQL() {
				mustExecConn(t, holder, lock, inbox.MySQLLockName(ident, k))
			} else {
				mustExecConn(t, holder, lock, inbox.PostgresLockKey(ident, k))
			}
		}
		for i, pool := range []*sql.DB{db, db2} {
			q := newQueue(t, pool, inbox.Config{Dialect: lockFirstDialect(e), Table: inbox.Table{Name: table, AdvisoryKey: "k"}})
			ds, err := q.Claim(context.Background(), 1)
			if err != nil || len(ds) != 1 {
				t.Fatalf("Claim(1): %d jobs, %v", len(ds), err)
			}
			if want := keys[held+i]; ds[0].Key() != want {
				t.Fatalf("claimed key %s, want %s: the first key no one holds", ds[0].Key(), want)
			}
			if n := locksHeld(t, e, db, table, keys); n != held+i+1 {
				t.Fatalf("%d keys locked, want %d", n, held+i+1)
			}
			defer func() {
				if err := ds[0].Ack(context.Background()); err != nil {
					t.Error(err)
				}
			}()
		}
	})
}

// mustExecConn runs a statement on one connection, failing the test on error.
func mustExecConn(t testing.TB, conn *sql.Conn, query string, args ...any) {
	t.Helper()
	if _, err := conn.ExecContext(context.Background(), query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// TestLockFirstMiss: a row deleted between the statement that locked its
// key and the claim's re-read is not delivered; the claim lets the lock,
// the key in the process and the connection go, and a new job of that key
// is claimed next.
func TestLockFirstMiss(t *testing.T) {
	eachEngine(t, locksInSQL, func(t *testing.T, e Engine) {
		inner, err := connhook.Connector(e.Driver, e.DSN(t, t.TempDir()))
		if err != nil {
			t.Fatal(err)
		}
		other := e.Open(t, 2)
		table := lockFirstTable(t, e, other, "lockfirst_miss", "text")
		var armed atomic.Bool
		db := sql.OpenDB(connhook.Wrap(inner, connhook.Hooks{After: func(_ context.Context, call connhook.Call, _ error, _ time.Duration) {
			if (strings.Contains(call.SQL, "pg_try_advisory_lock(") || strings.Contains(call.SQL, "GET_LOCK(n, 0)")) && armed.CompareAndSwap(true, false) {
				mustExec(t, e, other, "DELETE FROM "+table)
			}
		}}))
		db.SetMaxOpenConns(4)
		t.Cleanup(func() { db.Close() })
		q := newQueue(t, db, inbox.Config{Dialect: lockFirstDialect(e), Table: inbox.Table{Name: table, AdvisoryKey: "k"}})
		mustExec(t, e, other, "INSERT INTO "+table+" (k) VALUES ('A')")
		armed.Store(true)
		ds, err := q.Claim(context.Background(), 1)
		if err != nil {
			t.Fatal(err)
		}
		if armed.Load() {
			t.Fatal("the hook never ran: no LockFirst statement was sent")
		}
		if len(ds) != 0 {
			t.Fatalf("claimed %v, a row deleted before the claim re-read it", ds[0].ID())
		}
		if n := locksHeld(t, e, other, table, []string{"A"}); n != 0 {
			t.Fatal("the key's lock is left held")
		}
		mustBeIdle(t, db, q)
		mustExec(t, e, other, "INSERT INTO "+table+" (k) VALUES ('A')")
		d := claimOne(t, q)
		if d.Key() != "A" {
			t.Fatalf("claimed key %q, want A", d.Key())
		}
		if err := d.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
		mustBeIdle(t, db, q)
	})
}

// TestLockFirstKeyHeldHere: when the server lets go of a key whose job
// this process still works on (its session ended under the handler), the
// statement finds that key free and first; the claim passes over it as
// the walk from Go does, and delivers the next key's job rather than none.
func TestLockFirstKeyHeldHere(t *testing.T) {
	eachEngine(t, locksInSQL, func(t *testing.T, e Engine) {
		db := e.Open(t, 6)
		table := lockFirstTable(t, e, db, "lockfirst_here", "text")
		q := newQueue(t, db, inbox.Config{Dialect: lockFirstDialect(e), Table: inbox.Table{Name: table, AdvisoryKey: "k"}})
		mustExec(t, e, db, "INSERT INTO "+table+" (k) VALUES ('A'), ('A'), ('B')")
		ctx := context.Background()
		first, err := q.Claim(ctx, 1)
		if err != nil || len(first) != 1 || first[0].Key() != "A" {
			t.Fatalf("first claim: %d jobs, %v", len(first), err)
		}
		pids := lockHolders(t, e, db, table, []string{"A"})
		if len(pids) != 1 {
			t.Fatalf("%d sessions hold key A, want 1", len(pids))
		}
		if e.IsMySQL() {
			mustExec(t, e, db, "KILL ?", pids[0])
		} else {
			mustExec(t, e, db, "SELECT pg_terminate_backend($1)", pids[0])
		}
		deadline := time.Now().Add(10 * time.Second)
		for locksHeld(t, e, db, table, []string{"A"}) != 0 {
			if time.Now().After(deadline) {
				t.Fatal("the terminated session still holds key A after 10s")
			}
			time.Sleep(10 * time.Millisecond)
		}
		ds, err := q.Claim(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) != 1 || ds[0].Key() != "B" {
			t.Fatalf("claimed %d jobs, want the job of key B: a key held here must be passed over", len(ds))
		}
		if err := ds[0].Ack(ctx); err != nil {
			t.Fatal(err)
		}
		_ = first[0].Release(ctx) // its session is gone: the error says so
		if n := q.InWork(); n != 0 {
			t.Fatalf("%d jobs still in work", n)
		}
		// Key A is free again, in the process and on the server.
		d := claimOne(t, q)
		if d.Key() != "A" {
			t.Fatalf("claimed key %q, want A", d.Key())
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// TestLockFirstDrainContended: eight workers over two pools (the table
// named plainly on one, schema-qualified on the other) drain jobs of 20
// keys while another session holds one of the keys, with the engine's own
// dialect: on MariaDB the key found held elsewhere turns the claims to
// LockFirst (LockFirstContended), on PostgreSQL they always are. Each job is
// delivered and acked once, no key is worked by two handlers at once, the
// held key's jobs wait for its holder, and no lock is left.
func TestLockFirstDrainContended(t *testing.T) {
	eachEngine(t, locksInSQL, func(t *testing.T, e Engine) {
		const (
			workers = 8
			jobs    = 200
			keys    = 20
		)
		inner, err := connhook.Connector(e.Driver, e.DSN(t, t.TempDir()))
		if err != nil {
			t.Fatal(err)
		}
		var inSQL atomic.Int64
		db1 := sql.OpenDB(connhook.Wrap(inner, connhook.Hooks{After: func(_ context.Context, call connhook.Call, _ error, _ time.Duration) {
			if strings.Contains(call.SQL, "GET_LOCK(n, 0)") || strings.Contains(call.SQL, "pg_try_advisory_lock(") {
				inSQL.Add(1)
			}
		}}))
		db1.SetMaxOpenConns(7)
		t.Cleanup(func() { db1.Close() })
		db2 := e.Open(t, 7)
		table := concTable(t, e, db2, "lockfirst_drain")
		q1 := newQueue(t, db1, inbox.Config{Dialect: e.Dialect, Table: Table(table, "advisory-k")})
		q2 := newQueue(t, db2, inbox.Config{Dialect: e.Dialect, Table: Table(concQualified(t, e, db2, table), "advisory-k")})
		want := concFill(t, e, db2, table, jobs, keys)

		holder, err := e.Open(t, 1).Conn(context.Background()) // another session, as another process's
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Close()
		ident := tableIdentity(t, e, db2, table)
		hold, unhold := "SELECT pg_advisory_lock($1)", "SELECT pg_advisory_unlock_all()"
		var heldKey any = inbox.PostgresLockKey(ident, "K0")
		if e.IsMySQL() {
			hold, unhold, heldKey = "SELECT GET_LOCK(?, 10)", "SELECT RELEASE_ALL_LOCKS()", inbox.MySQLLockName(ident, "K0")
		}
		mustExecConn(t, holder, hold, heldKey)
		var released atomic.Bool
		l := newConcLedger()
		drain := func(until int) bool {
			return concWorkers(t, []*inbox.Queue{q1, q2}, workers, 2, 2*time.Minute,
				func() bool { return l.ackedJobs() >= until },
				func(ctx context.Context, d *inbox.Delivery) {
					if d.Key() == "K0" && !released.Load() {
						t.Errorf("job %v of key K0 delivered while another session holds the key", d.ID())
					}
					l.start(d, d.Key())
					l.done(d.Key())
					l.end(d, d.Ack(context.WithoutCancel(ctx)))
				})
		}
		if !drain(jobs - jobs/keys) {
			t.Fatalf("workers stalled: %d of %d jobs of the free keys acked", l.ackedJobs(), jobs-jobs/keys)
		}
		if inSQL.Load() == 0 {
			t.Fatal("no claim locked in SQL: a key held elsewhere did not turn the claims to LockFirst")
		}
		released.Store(true)
		mustExecConn(t, holder, unhold)
		if !drain(jobs) {
			t.Fatalf("workers stalled: %d of %d jobs acked after the key was let go", l.ackedJobs(), jobs)
		}
		l.check(t, want)
		lockFirstDrained(t, e, table, keys, [2]*sql.DB{db1, db2}, [2]*inbox.Queue{q1, q2})
	})
}

// TestLockFirstCancelledClaims: eight workers over two pools (the table
// named plainly and schema-qualified) claim in SQL at every claim, half the
// claims under a deadline of up to 3 ms, so that many end mid-statement,
// with a lock perhaps taken and the session then ended. No job is lost or
// delivered twice, no key is worked twice at once, and no lock or
// connection is left once all are acked.
func TestLockFirstCancelledClaims(t *testing.T) {
	eachEngine(t, locksInSQL, func(t *testing.T, e Engine) {
		const (
			workers = 8
			jobs    = 120
			keys    = 20
		)
		db1, db2 := openTwo(t, e, 7)
		table := concTable(t, e, db1, "lockfirst_cut")
		qs := []*inbox.Queue{
			newQueue(t, db1, inbox.Config{Dialect: lockFirstDialect(e), Table: Table(table, "advisory-k")}),
			newQueue(t, db2, inbox.Config{Dialect: lockFirstDialect(e), Table: Table(concQualified(t, e, db1, table), "advisory-k")}),
		}
		want := concFill(t, e, db1, table, jobs, keys)
		l := newConcLedger()
		var cut atomic.Int64
		deadline := time.Now().Add(2 * time.Minute)
		var wg sync.WaitGroup
		for w := range workers {
			q := qs[w%2]
			wg.Add(1)
			go func() {
				defer wg.Done()
				for l.ackedJobs() < jobs && time.Now().Before(deadline) {
					// Half the claims may be cut, the others run to their end,
					// so that the drain progresses however slow the machine.
					limit := time.Minute
					if rand.IntN(2) == 0 {
						limit = rand.N(3 * time.Millisecond)
					}
					ctx, cancel := context.WithTimeout(context.Background(), limit)
					ds, err := q.Claim(ctx, 2)
					cancel()
					if err != nil {
						if ctx.Err() == nil {
							t.Errorf("claim: %v", err)
							return
						}
						cut.Add(1)
						continue
					}
					for _, d := range ds {
						l.start(d, d.Key())
						l.done(d.Key())
						l.end(d, d.Ack(context.Background()))
					}
				}
			}()
		}
		wg.Wait()
		if l.ackedJobs() < jobs {
			t.Fatalf("%d of %d jobs acked in two minutes", l.ackedJobs(), jobs)
		}
		if cut.Load() == 0 {
			t.Fatal("no claim was cut by its deadline: the test cut nothing")
		}
		// A claim cut after counting a job's attempt spends it, as a
		// crash would (the form's promise): attempts above 1 are expected.
		l.attempts = nil
		l.check(t, want)
		lockFirstDrained(t, e, table, keys, [2]*sql.DB{db1, db2}, [2]*inbox.Queue{qs[0], qs[1]})
		t.Logf("%d claims cut by their deadline", cut.Load())
	})
}

// lockFirstDrained checks what a drain of table over two pools leaves: no
// job, no connection checked out, no job in work, and no lock of the keys
// K0 … K<keys-1> held.
func lockFirstDrained(t *testing.T, e Engine, table string, keys int, dbs [2]*sql.DB, qs [2]*inbox.Queue) {
	t.Helper()
	if n := countRows(t, dbs[0], table); n != 0 {
		t.Errorf("%d jobs left in the table", n)
	}
	for i := range dbs {
		idleSoon(t, dbs[i], qs[i])
	}
	var lockKeys []string
	for i := range keys {
		lockKeys = append(lockKeys, "K"+fmt.Sprint(i))
	}
	noLocks(t, e, dbs[0], table, lockKeys)
}
