package dbtest

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
)

// inWorkHeld is how many jobs TestStatsInWorkServer holds: one per worker.
const inWorkHeld = 8

// TestStatsInWorkServer (issue 23): eight workers on two pools of one
// database, one pool naming the table plainly and the other schema-
// qualified, each hold a job; Stats, through either queue, counts the eight
// in work and takes them out of the ready ones wherever the server can
// tell (the lease everywhere, the row lock on PostgreSQL and MariaDB, the
// advisory form on SQLite), and says -1 where it cannot (the advisory form
// on PostgreSQL and MySQL; the MySQL dialect on MariaDB, which has no
// performance_schema.data_locks, with the reason in InWorkErr). After the
// jobs are settled it counts none.
func TestStatsInWorkServer(t *testing.T) {
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		dir := t.TempDir()
		db1, db2 := e.OpenDSN(t, e.DSN(t, dir), inWorkHeld), e.OpenDSN(t, e.DSN(t, dir), inWorkHeld)
		if e.Dialect == inbox.MariaDB && strings.HasPrefix(form, "rowlock") {
			mariaLockInfo(t, db1)
		}
		table := opsTable(t, e, db1, form)
		q1 := newQueue(t, db1, queueConfig(e, opsDescription(table, form), nil))
		q2 := newQueue(t, db2, queueConfig(e, opsDescription(concQualified(t, e, db2, table), form), nil))
		for i := 0; i < 2*inWorkHeld; i++ {
			enqueueOne(t, q1, db1, "job")
		}
		ctx := context.Background()

		// Eight workers, four on each pool, each claim one job and hold it.
		var mu sync.Mutex
		var held []*inbox.Delivery
		errs := onTwoPools(inWorkHeld, q1, q2, func(q *inbox.Queue) error {
			// A claim may find every candidate locked by the others'
			// at that instant (MySQL's lease): none is no failure.
			var ds []*inbox.Delivery
			var err error
			for deadline := time.Now().Add(time.Minute); len(ds) == 0 && err == nil && time.Now().Before(deadline); {
				ds, err = q.Claim(ctx, 1)
			}
			mu.Lock()
			held = append(held, ds...)
			mu.Unlock()
			if err != nil || len(ds) != 1 {
				return fmt.Errorf("claim: %d jobs, %v; want one", len(ds), err)
			}
			return nil
		})
		for _, err := range errs {
			t.Error(err)
		}
		if t.Failed() {
			return
		}

		cannot := form == "advisory" && !e.IsSQLite() || strings.HasPrefix(form, "rowlock") && e.Dialect == inbox.MySQL
		for i, q := range []*inbox.Queue{q1, q2} {
			st, err := q.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			want := inbox.Stats{Ready: inWorkHeld, InWork: inWorkHeld}
			if cannot {
				want = inbox.Stats{Ready: 2 * inWorkHeld, InWork: -1}
			}
			if st.InWork != want.InWork || st.Ready != want.Ready {
				t.Errorf("pool %d: Stats holding %d jobs = ready %d, in work %d (%v); want ready %d, in work %d",
					i+1, inWorkHeld, st.Ready, st.InWork, st.InWorkErr, want.Ready, want.InWork)
			}
			wantErr := strings.HasPrefix(form, "rowlock") && e.Dialect == inbox.MySQL
			if (st.InWorkErr != nil) != wantErr {
				t.Errorf("pool %d: InWorkErr = %v, want one: %v", i+1, st.InWorkErr, wantErr)
			}
		}

		for _, d := range held {
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
		st, err := q2.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := int64(0)
		if cannot {
			want = -1
		}
		if st.InWork != want || st.Ready != inWorkHeld {
			t.Errorf("Stats after the acks = ready %d, in work %d; want ready %d, in work %d", st.Ready, st.InWork, inWorkHeld, want)
		}
	})
}

// mariaLockInfo makes sure MariaDB's metadata_lock_info plugin is active,
// which the row lock's in-work count reads: installed by the test when it
// is not (root, as CI's .ci/run does too), a failure when it cannot be.
func mariaLockInfo(t *testing.T, db *sql.DB) {
	t.Helper()
	var status sql.NullString
	q := "SELECT (SELECT PLUGIN_STATUS FROM information_schema.PLUGINS WHERE PLUGIN_NAME = 'METADATA_LOCK_INFO')"
	if err := db.QueryRow(q).Scan(&status); err != nil {
		t.Fatal(err)
	}
	if status.String == "ACTIVE" {
		return
	}
	if _, err := db.Exec("INSTALL SONAME 'metadata_lock_info'"); err != nil {
		t.Fatalf("MariaDB's metadata_lock_info plugin is not active and cannot be installed (%v): "+
			"run INSTALL SONAME 'metadata_lock_info' as a user with INSERT on mysql.plugin", err)
	}
}

// TestStatsCancelled (issue 23): Stats under contexts cancelled at random
// points, with jobs held, either returns the table's figures or fails; a
// cancelled lock read is Stats' error, never an in-work count of -1 blamed
// on the server (InWorkErr).
func TestStatsCancelled(t *testing.T) {
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, 6)
		if e.Dialect == inbox.MariaDB && strings.HasPrefix(form, "rowlock") {
			mariaLockInfo(t, db)
		}
		table := opsTable(t, e, db, form)
		q := newQueue(t, db, queueConfig(e, opsDescription(table, form), nil))
		for i := 0; i < 6; i++ {
			enqueueOne(t, q, db, "job")
		}
		held := opsClaimOne(t, q)
		defer held.Release(context.Background())
		want, err := q.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewSource(int64(len(table))))
		failed := 0
		for i := 0; i < 150; i++ {
			ctx, cancel := context.WithCancel(context.Background())
			stop := time.AfterFunc(time.Duration(rng.Intn(3000))*time.Microsecond, cancel)
			st, err := q.Stats(ctx)
			stop.Stop()
			cancel()
			if err != nil {
				failed++
				continue
			}
			if st.Ready != want.Ready || st.Waiting != want.Waiting || st.InWork != want.InWork || st.Dead != want.Dead ||
				(st.InWorkErr == nil) != (want.InWorkErr == nil) {
				t.Errorf("Stats under a cancelled context = %+v, want %+v or an error", st, want)
			}
		}
		t.Logf("%d of 150 reads cancelled", failed)
	})
}
