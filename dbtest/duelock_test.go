package dbtest

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
)

// MySQL and MariaDB, lease form: a claim's locking read of due rows, its
// transaction still open, holds no lock that the holders of leases in force
// need. A range read that runs out of rows locks the first index entry past
// its range until the transaction ends (MariaDB does so under READ
// COMMITTED too); read forwards, that entry would be the lease that ends
// first, and its Ack, Extend or Retry would wait for the claim. The pool's
// sessions give up a lock wait after one second, so that a wait fails the
// test rather than slowing it.
func TestLeaseDueReadLocksNoLease(t *testing.T) {
	for _, e := range Engines {
		if !e.IsMySQL() {
			continue
		}
		t.Run(e.Name, func(t *testing.T) {
			ctx := context.Background()
			db := e.OpenDSN(t, e.DSN(t, "")+"&innodb_lock_wait_timeout=1", 4)
			table := "duelock_" + e.Name
			e.CreateTable(t, db, table)
			for _, s := range explainIndexes(e, table) {
				if _, err := db.Exec(s); err != nil {
					t.Fatalf("%s: %v", s, err)
				}
			}
			t.Cleanup(func() {
				if !t.Failed() {
					for _, s := range e.Schema(table)[:3] {
						db.Exec(s)
					}
				}
			})
			q, err := inbox.New(db, inbox.Config{Dialect: e.Dialect, Table: Table(table, "lease")})
			if err != nil {
				t.Fatal(err)
			}
			b, err := q.NewBatcher(inbox.BatchConfig{MaxBatch: 2})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			// Four leases in force, two free jobs.
			for i := 0; i < 6; i++ {
				if _, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte("p")}}); err != nil {
					t.Fatal(err)
				}
			}
			ds, err := q.Claim(ctx, 4)
			if err != nil || len(ds) != 4 {
				t.Fatalf("Claim(4) = %d jobs, %v", len(ds), err)
			}

			// A claim's read of due rows, as lease.go sends it, in flight.
			st := q.Statements()
			tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			rows, err := tx.QueryContext(ctx, st.Claim.Select.SQL, opsArgs(t, e, st.Claim.Select, time.Now(), time.Minute, 16)...)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for rows.Next() {
				n++
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			rows.Close()
			if n != 0 {
				t.Fatalf("the due read returned %d rows, want none: every lease is in force", n)
			}

			// Every settlement of the leases in force goes through at once.
			if err := ds[0].Extend(ctx); err != nil {
				t.Fatalf("Extend of the lease that ends first: %v", err)
			}
			if err := ds[0].Retry(ctx, time.Minute); err != nil {
				t.Fatalf("Retry: %v", err)
			}
			if err := ds[1].Ack(ctx); err != nil {
				t.Fatalf("Ack: %v", err)
			}
			for i, err := range b.AckAll(ctx, ds[2:]) {
				if err != nil {
					t.Fatalf("batched Ack of job %v: %v", ds[2+i].ID(), err)
				}
			}
		})
	}
}
