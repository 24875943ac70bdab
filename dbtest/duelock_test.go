package dbtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
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

// TestLeaseFreeFirstDueBefore: MySQL and MariaDB, lease form: a claim reads
// the free rows alone first, and only while no lease has run out; then the
// due rows still come first, for a claim of one (its index read) and of
// several (its primary key walk), and a delayed row is never taken.
func TestLeaseFreeFirstDueBefore(t *testing.T) {
	eachEngine(t, func(e Engine) bool { return e.IsMySQL() }, func(t *testing.T, e Engine) {
		ctx := context.Background()
		db := e.Open(t, 4)
		table := newTable(t, e, db, "freefirst")
		for _, s := range explainIndexes(e, table) {
			mustExec(t, e, db, s)
		}
		now := time.Now().UTC().Truncate(time.Microsecond)
		q := newQueue(t, db, lockConfig(e, table, "lease", false, now))
		var ids []int64
		for i := 0; i < 6; i++ {
			id, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte("p")}})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id.(int64))
		}
		setLease := func(i int, at time.Time) {
			mustExec(t, e, db, "UPDATE "+table+" SET locked_until = ? WHERE id = ?", opsTime(e, at), ids[i])
		}
		setLease(4, now.Add(-time.Hour))   // due
		setLease(5, now.Add(24*time.Hour)) // delayed
		take := func(n int, want ...int64) {
			t.Helper()
			ds, err := q.Claim(ctx, n)
			if err != nil {
				t.Fatal(err)
			}
			var got []int64
			for _, d := range ds {
				got = append(got, d.ID().(int64))
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("Claim(%d) = %v, want %v", n, got, want)
			}
		}
		take(1, ids[4])                 // the due row before the free ones
		take(3, ids[0], ids[1], ids[2]) // nothing due: free rows alone
		setLease(1, now.Add(-time.Minute))
		take(3, ids[1], ids[3]) // due first, then the free one left
		take(3)                 // only the delayed row is left
	})
}

// TestCheckSchemaIDPrimary: MySQL and MariaDB, lease form: a table whose
// primary key is not its id alone is a schema problem that names the
// column, as a claim of several walks the primary key in id order; the
// recommended table is none.
func TestCheckSchemaIDPrimary(t *testing.T) {
	eachEngine(t, func(e Engine) bool { return e.IsMySQL() }, func(t *testing.T, e Engine) {
		ctx := context.Background()
		db := e.Open(t, 2)
		good := newTable(t, e, db, "idkey_good")
		bad := tableName(e, "idkey_bad")
		mustExec(t, e, db, "DROP TABLE IF EXISTS "+bad)
		mustExec(t, e, db, "CREATE TABLE "+bad+" (id bigint NOT NULL AUTO_INCREMENT, attempt int NOT NULL DEFAULT 0, "+
			"payload blob, locked_until datetime(6) NULL, PRIMARY KEY (id, attempt), INDEX (locked_until, id)) ENGINE=InnoDB")
		dropAtEnd(t, e, db, bad)
		for _, c := range []struct {
			table string
			want  bool
		}{{good, false}, {bad, true}} {
			cfg := queueConfig(e, Table(c.table, "lease"), nil)
			cfg.Table.DeadTable = ""
			err := newQueue(t, db, cfg).CheckSchema(ctx)
			var se *inbox.SchemaError
			found := errors.As(err, &se) && strings.Contains(se.Error(), "column id is not its primary key")
			if found != c.want || (!c.want && err != nil) {
				t.Errorf("%s: CheckSchema = %v, want a problem naming the primary key: %v", c.table, err, c.want)
			}
		}
	})
}
