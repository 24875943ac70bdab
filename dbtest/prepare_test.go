package dbtest

// Config.Prepare on real databases: every settlement of every form through
// prepared statements, a settlement in a transaction of another pool (which
// gets the text), a pool of one connection, and, where the server shows
// it, that the statements really are prepared once and not per call.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"
)

func TestPrepared(t *testing.T) {
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		db1, db2 := openTwo(t, e, 6) // room for four jobs holding a connection each
		table := newTable(t, e, db1, "prep_"+form)
		cfg := queueConfig(e, Table(table, form), nil)
		cfg.Prepare = true
		q := newQueue(t, db1, cfg)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for i := range 4 {
			enqueueOne(t, q, db1, "p"+strconv.Itoa(i))
		}
		ds, err := q.Claim(ctx, 4)
		if err != nil || len(ds) != 4 {
			t.Fatalf("claim: %d jobs, %v", len(ds), err)
		}
		ok := func(what string, err error) {
			t.Helper()
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		}
		ok("Ack", ds[0].Ack(ctx))
		ok("Retry", ds[1].Retry(ctx, 0))
		ok("Dead", ds[2].Dead(ctx))
		if form == "rowlock" {
			ok("Release", ds[3].Release(ctx))
		} else {
			// A transaction of another pool: the queue's statements cannot
			// run in it, its text does.
			tx, err := db2.BeginTx(ctx, nil)
			ok("begin on the second pool", err)
			ok("AckTx", ds[3].AckTx(ctx, tx))
			ok("commit", tx.Commit())
		}
		wantLeft := 1 // the retried job
		if form == "rowlock" {
			wantLeft = 2 // and the released one
		}
		if n := countRows(t, db1, table); n != wantLeft {
			t.Errorf("%d jobs in the table, want %d", n, wantLeft)
		}
		if n := countRows(t, db1, table+"_dead"); n != 1 {
			t.Errorf("%d jobs in the dead table, want 1", n)
		}
		// The retried job comes back at its next attempt.
		again, err := q.Claim(ctx, 4)
		ok("claim again", err)
		if len(again) != wantLeft {
			t.Fatalf("claimed %d jobs again, want %d", len(again), wantLeft)
		}
		for _, d := range again {
			if d.ID() == ds[1].ID() && d.Attempt() != 2 {
				t.Errorf("the retried job came back at attempt %d, want 2", d.Attempt())
			}
			ok("Ack", d.Ack(ctx))
		}
		if err := errors.Join(q.Shutdown(ctx)); err != nil {
			t.Error(err)
		}
		idleSoon(t, db1, q)
	})
}

// TestPreparedPoolOfOne: a lease queue whose pool has one connection claims
// and settles with its statements prepared, the MySQL claim's transaction
// included, without waiting for a second connection; and the statements are
// prepared once on it, not per call, where the server shows that (lib/pq
// and go-sql-driver/mysql send the text path's statements unnamed, or
// prepared and closed per call).
func TestPreparedPoolOfOne(t *testing.T) {
	eachForm(t, leaseOnly, func(t *testing.T, e Engine, form string) {
		const rounds = 20
		for _, prepare := range []bool{false, true} {
			t.Run(fmt.Sprintf("prepare=%v", prepare), func(t *testing.T) {
				db := e.Open(t, 1)
				table := newTable(t, e, db, fmt.Sprintf("prep_one_%v", prepare))
				cfg := queueConfig(e, Table(table, form), nil)
				cfg.Prepare = prepare
				q := newQueue(t, db, cfg)
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				before := sessionPrepares(t, e, db)
				for i := range rounds {
					enqueueOne(t, q, db, "p"+strconv.Itoa(i))
					ds, err := q.Claim(ctx, 1)
					if err != nil || len(ds) != 1 {
						t.Fatalf("round %d: claim %d jobs, %v (a pool of one must not wait for a second connection)", i, len(ds), err)
					}
					if err := ds[0].Ack(ctx); err != nil {
						t.Fatalf("round %d: ack: %v", i, err)
					}
				}
				after := sessionPrepares(t, e, db)
				// The enqueue, the claim's reads and mark, the ack; the
				// walk too where the dialect has one (inbox.MariaDB).
				most := 6
				if q.Statements().Claim.WalkFirst.SQL != "" {
					most++
				}
				switch {
				case before < 0:
					// The engine shows no count: the rounds above are the test.
				case prepare && after-before > most:
					t.Errorf("%d prepares for %d rounds of enqueue, claim and ack with Prepare, want at most one per statement", after-before, rounds)
				case prepare && after-before < 3:
					t.Errorf("%d statements prepared with Prepare, want the enqueue's, the claim's and the ack's", after-before)
				case !prepare && e.IsMySQL() && after-before < 2*rounds:
					t.Errorf("%d prepares for %d rounds without Prepare: the count does not see them", after-before, rounds)
				case !prepare && e.Name == "pq" && after-before != 0:
					t.Errorf("%d named statements without Prepare, want none", after-before)
				}
				if n := countRows(t, db, table); n != 0 {
					t.Errorf("%d jobs left", n)
				}
			})
		}
	})
}

// sessionPrepares returns the statements the pool's only session has
// prepared so far, by the server's count; -1 where it keeps none that can
// be read (SQLite, and pgx, which prepares and caches the text path's
// statements itself).
func sessionPrepares(t *testing.T, e Engine, db *sql.DB) int {
	t.Helper()
	switch {
	case e.IsMySQL():
		var name string
		var n int
		if err := db.QueryRow("SHOW SESSION STATUS LIKE 'Com_stmt_prepare'").Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		return n
	case e.Name == "pq":
		// Named statements of the session: lib/pq's text path uses the
		// unnamed one, which this view leaves out.
		var n int
		if err := db.QueryRow("SELECT COUNT(*) FROM pg_prepared_statements WHERE NOT from_sql AND statement NOT LIKE '%pg_prepared_statements%'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	return -1
}
