package dbtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
)

// The cut tests end, from a second connection, the server session that holds
// a job (pg_terminate_backend, MariaDB KILL CONNECTION), as a network cut, a
// server restart or an operator would, while the holder's process lives on.

// cutXSetup makes a table for form, the holder's queue on a pool of conns
// connections, another worker's queue on a pool of its own (as another
// process would have: the holder's process still counts the job in work)
// and an admin pool, and enqueues one job.
func cutXSetup(t *testing.T, e Engine, form string, lease time.Duration, conns int) (db, admin *sql.DB, q, other *inbox.Queue, table string, id any) {
	t.Helper()
	db = e.Open(t, conns)
	admin = e.Open(t, 2)
	table = fmt.Sprintf("cut_%s_%s_%d", e.Name, form, os.Getpid())
	checkAtEnd(e, table, 0)
	e.CreateTable(t, admin, table)
	t.Cleanup(func() { dropNow(t, admin, table, table+"_dead", table+"_claims") })
	q, err := inbox.New(db, formConfig(e, table, form, lease))
	if err != nil {
		t.Fatal(err)
	}
	if other, err = inbox.New(e.Open(t, 4), formConfig(e, table, form, lease)); err != nil {
		t.Fatal(err)
	}
	if id, err = q.Enqueue(context.Background(), db, inbox.Job{Data: []any{[]byte("cut")}}); err != nil {
		t.Fatal(err)
	}
	return db, admin, q, other, table, id
}

// TestCutRowLock cuts the session of a row-lock transaction: the job is
// claimable again at once with the same attempt, the holder's writes are
// gone, and its Ack fails and changes nothing.
func TestCutRowLock(t *testing.T) {
	logWall(t)
	for _, e := range serverEngines() {
		t.Run(e.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			logWall(t)
			_, admin, q, other, table, id := cutXSetup(t, e, "rowlock", 0, 4)
			effects := table + "_fx"
			for _, s := range effectsTableSQL(e, effects) {
				if _, err := admin.Exec(s); err != nil {
					t.Fatal(err)
				}
			}
			t.Cleanup(func() { dropNow(t, admin, effects) })
			ds, err := q.Claim(ctx, 1)
			if err != nil || len(ds) != 1 {
				t.Fatalf("claim: %d, %v", len(ds), err)
			}
			d := ds[0]
			if _, err := d.Tx().Exec(bind(e, "INSERT INTO "+effects+" (job_id, note) VALUES (?, 'cut')"), d.ID()); err != nil {
				t.Fatal(err)
			}
			sid, err := sessionID(ctx, e, d.Tx())
			if err != nil {
				t.Fatal(err)
			}
			terminateSession(t, e, admin, sid)
			d2, delay := claimSoon(t, other, inbox.DefaultLease)
			if fmt.Sprint(d2.ID()) != fmt.Sprint(id) || d2.Attempt() != 1 {
				t.Fatalf("after the cut: job %v attempt %d, want job %v attempt 1", d2.ID(), d2.Attempt(), id)
			}
			err = d.Ack(ctx)
			if err == nil || errors.Is(err, inbox.ErrSettled) || errors.Is(err, inbox.ErrLeaseLost) {
				t.Fatalf("cut holder's Ack: %v; want the driver's error", err)
			}
			t.Logf("FIGURE: cut %s rowlock: claimable again %v after the cut, attempt 1 -> %d; holder's Ack: %v",
				e.Name, delay.Round(time.Millisecond), d2.Attempt(), err)
			if err := d.Ack(ctx); !errors.Is(err, inbox.ErrSettled) {
				t.Errorf("second Ack of the cut holder: %v, want ErrSettled", err)
			}
			// Nothing changed: the row is there with its attempt, and the
			// holder's write is gone.
			if att, _, ok := rowOf(t, e, admin, table, id); !ok || att != 1 {
				t.Errorf("row after the failed Ack: present %v attempt %d, want present with attempt 1", ok, att)
			}
			if n := countWhere(t, e, admin, effects, ""); n != 0 {
				t.Errorf("%d rows the cut holder wrote survived", n)
			}
			if err := d2.Ack(ctx); err != nil {
				t.Fatal(err)
			}
			if n := countWhere(t, e, admin, table, ""); n != 0 {
				t.Errorf("%d rows left after the new holder's Ack", n)
			}
		})
	}
}

// cutXLockHolder finds the session holding the advisory lock of key of
// table: PostgreSQL from pg_locks, MariaDB from IS_USED_LOCK.
func cutXLockHolder(t *testing.T, e Engine, admin *sql.DB, table, key string) string {
	t.Helper()
	var holder sql.NullInt64
	ident, err := schemaIdent(context.Background(), e, admin, table)
	if err != nil {
		t.Fatal(err)
	}
	if e.IsPostgres() {
		k := uint64(inbox.PostgresLockKey(ident, key))
		err = admin.QueryRow(`SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
			AND classid = $1 AND objid = $2 AND objsubid = 1`, int64(k>>32), int64(k&0xffffffff)).Scan(&holder)
	} else {
		err = admin.QueryRow("SELECT IS_USED_LOCK(?)", inbox.MySQLLockName(ident, key)).Scan(&holder)
	}
	if err != nil || !holder.Valid {
		t.Fatalf("no session holds the lock of %s key %s: %v", table, key, err)
	}
	return strconv.FormatInt(holder.Int64, 10)
}

// cutXLockWaiters counts the PostgreSQL sessions waiting for the advisory
// lock of key of table.
func cutXLockWaiters(t *testing.T, e Engine, admin *sql.DB, table, key string) int {
	t.Helper()
	ident, err := schemaIdent(context.Background(), e, admin, table)
	if err != nil {
		t.Fatal(err)
	}
	k := uint64(inbox.PostgresLockKey(ident, key))
	var n int
	if err := admin.QueryRow(`SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
		AND classid = $1 AND objid = $2 AND objsubid = 1`, int64(k>>32), int64(k&0xffffffff)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCutAdvisory cuts the session holding an advisory lock: the job is
// claimable again at once with its attempt spent, and the holder's Ack fails
// and changes nothing.
func TestCutAdvisory(t *testing.T) {
	logWall(t)
	for _, e := range serverEngines() {
		t.Run(e.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			logWall(t)
			_, admin, q, other, table, id := cutXSetup(t, e, "advisory", 0, 4)
			checkAtEnd(e, table, 1)
			ds, err := q.Claim(ctx, 1)
			if err != nil || len(ds) != 1 {
				t.Fatalf("claim: %d, %v", len(ds), err)
			}
			d := ds[0]
			terminateSession(t, e, admin, cutXLockHolder(t, e, admin, table, d.Key()))
			d2, delay := claimSoon(t, other, inbox.DefaultLease)
			if fmt.Sprint(d2.ID()) != fmt.Sprint(id) || d2.Attempt() != 2 {
				t.Fatalf("after the cut: job %v attempt %d, want job %v attempt 2", d2.ID(), d2.Attempt(), id)
			}
			err = d.Ack(ctx)
			if err == nil || errors.Is(err, inbox.ErrSettled) {
				t.Fatalf("cut holder's Ack: %v; want an error", err)
			}
			t.Logf("FIGURE: cut %s advisory: claimable again %v after the cut, attempt 1 -> %d; holder's Ack: %v",
				e.Name, delay.Round(time.Millisecond), d2.Attempt(), err)
			if err := d.Ack(ctx); !errors.Is(err, inbox.ErrSettled) {
				t.Errorf("second Ack of the cut holder: %v, want ErrSettled", err)
			}
			if e.IsPostgres() {
				// The holder's Ack read back under the key's lock, which d2
				// holds, until it gave up. The server must have ended that
				// wait by then: a backend still waiting (its client gone,
				// its cancellation in flight) takes the key when d2 lets go
				// and holds it until it finds its client gone.
				if n := cutXLockWaiters(t, e, admin, table, d.Key()); n > 0 {
					t.Errorf("%d sessions still wait for the lock of key %s after the holder's Ack returned", n, d.Key())
				}
			}
			// Nothing changed: the row is there, with the attempt the new
			// claim counted.
			if att, _, ok := rowOf(t, e, admin, table, id); !ok || att != 3 {
				t.Errorf("row after the failed Ack: present %v attempt %d, want present with attempt 3", ok, att)
			}
			if err := d2.Ack(ctx); err != nil {
				t.Fatal(err)
			}
			if n := countWhere(t, e, admin, table, ""); n != 0 {
				t.Errorf("%d rows left after the new holder's Ack", n)
			}
			noKeyLocks(t, e, admin, table, 1)
		})
	}
}

// cutXKeeperLease is the real lease of the keeper test: the first extension
// comes at half of it, and a failed one is tried again every tenth.
const cutXKeeperLease = 4 * time.Second

// TestCutLeaseKeeper cuts the connection a keeper extends through: the pool
// holds one connection, so the keeper's next extension meets the cut one, and
// database/sql must give it a fresh connection in time for the keeper to
// keep the lease, without cancelling the handler.
func TestCutLeaseKeeper(t *testing.T) {
	logWall(t)
	for _, e := range serverEngines() {
		t.Run(e.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			logWall(t)
			db, admin, q, _, table, id := cutXSetup(t, e, "lease", cutXKeeperLease, 1)
			ds, err := q.Claim(ctx, 1)
			if err != nil || len(ds) != 1 {
				t.Fatalf("claim: %d, %v", len(ds), err)
			}
			d := ds[0]
			hctx, stop := d.Keep(ctx)
			defer stop()
			// With one connection in the pool, this is the keeper's.
			sid, err := sessionID(ctx, e, db)
			if err != nil {
				t.Fatal(err)
			}
			atCut := d.Expiry()
			terminateSession(t, e, admin, sid)
			cutAt := time.Now()
			eventually(t, 3*cutXKeeperLease, "an extension after the cut", func() error {
				if err := context.Cause(hctx); err != nil {
					t.Fatalf("the handler was cancelled after the cut: %v", err)
				}
				if !d.Expiry().After(atCut) {
					return errors.New("the lease was not extended")
				}
				return nil
			})
			extendedAfter := time.Since(cutAt)
			if err := hctx.Err(); err != nil {
				t.Fatalf("the handler was cancelled: %v", context.Cause(hctx))
			}
			// The row carries the extended token, and the pool serves from a
			// new session.
			if _, lu, ok := rowOf(t, e, admin, table, id); !ok || !lu.Equal(d.Expiry()) {
				t.Errorf("row's lease %v (present %v), want the delivery's %v", lu, ok, d.Expiry())
			}
			sid2, err := sessionID(ctx, e, db)
			if err != nil {
				t.Fatal(err)
			}
			if sid2 == sid {
				t.Errorf("the pool still serves from the cut session %s", sid)
			}
			t.Logf("FIGURE: cut %s lease keeper: extended %v after its connection was cut (lease %v), expiry %v -> %v, session %s -> %s",
				e.Name, extendedAfter.Round(time.Millisecond), cutXKeeperLease, atCut.Format("15:04:05.000"), d.Expiry().Format("15:04:05.000"), sid, sid2)
			stop()
			if err := d.Ack(ctx); err != nil {
				t.Fatalf("Ack after the kept lease: %v", err)
			}
			if n := countWhere(t, e, admin, table, ""); n != 0 {
				t.Errorf("%d rows left after the Ack", n)
			}
		})
	}
}
