package dbtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
)

// bulkOld is when the old dead jobs of TestBulkDead died: before
// bulkCutoff, which the recent deaths are after.
var (
	bulkOld    = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	bulkCutoff = time.Date(2021, 1, 1, 0, 0, 0, 0, time.UTC)
)

// bulkInsertDead writes n dead jobs that died at bulkOld straight into the
// dead table, ids from first, payloads "old<id>".
func bulkInsertDead(t *testing.T, e Engine, db *sql.DB, dead string, first, n int) {
	t.Helper()
	var at any = bulkOld
	if e.IsSQLite() {
		at = bulkOld.Format(inbox.SQLiteTimeFormat)
	}
	ph := "?, ?, ?, ?, ?"
	if e.IsPostgres() {
		ph = "$1, $2, $3, $4, $5"
	}
	for id := first; id < first+n; id++ {
		mustExec(t, e, db, "INSERT INTO "+dead+" (id, attempt, payload, last_error, dead_at) VALUES ("+ph+")",
			id, 3, []byte(fmt.Sprintf("old%d", id)), "old failure", at)
	}
}

// TestBulkDead runs the operators' bulk tools on every engine and form,
// the table named plainly and schema-qualified: counts before acting,
// deleting one dead job, requeueing a chosen few (all or none), and
// requeueing every old dead job in batches smaller than their number
// while eight workers claim: each requeued job runs once, and the recent
// deaths stay dead.
func TestBulkDead(t *testing.T) {
	for _, e := range Engines {
		for _, form := range e.Forms() {
			for _, qualified := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/qualified=%v", e.Name, form, qualified), func(t *testing.T) {
					testBulkDead(t, e, form, qualified)
				})
			}
		}
	}
}

func testBulkDead(t *testing.T, e Engine, form string, qualified bool) {
	ctx := context.Background()
	db := e.Open(t, 12)
	table := "bulk_ops"
	tb := deadOpsTable(t, e, db, table, form)
	dropAtEnd(t, e, db, table, table+"_dead", table+"_claims")
	if qualified {
		tb.Name, tb.DeadTable = concQualified(t, e, db, table), concQualified(t, e, db, table+"_dead")
	}
	q, err := inbox.New(db, inbox.Config{Dialect: e.Dialect, Table: tb})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		enqueueOne(t, q, db, fmt.Sprintf("recent%d", i))
	}
	deadOpsKill(t, q, 3)
	bulkInsertDead(t, e, db, table+"_dead", 1000, bulkOldJobs)
	bulkCount(t, q, inbox.DeadFilter{}, bulkOldJobs+3)
	bulkCount(t, q, inbox.DeadFilter{DiedBefore: bulkCutoff}, bulkOldJobs)
	bulkCount(t, q, inbox.DeadFilter{DiedBefore: bulkCutoff, Max: 5}, 5)

	// Delete one: gone, and a second delete finds nothing.
	if err := q.DeleteDead(ctx, int64(1000)); err != nil {
		t.Fatalf("DeleteDead: %v", err)
	}
	if err := q.DeleteDead(ctx, int64(1000)); !errors.Is(err, inbox.ErrNotDead) {
		t.Fatalf("second DeleteDead = %v, want ErrNotDead", err)
	}
	bulkCount(t, q, inbox.DeadFilter{DiedBefore: bulkCutoff}, bulkOldJobs-1)
	requeued := bulkChosen(t, q)
	bulkRequeueAll(t, q, requeued)
}

// bulkOldJobs is how many old dead jobs testBulkDead writes.
const bulkOldJobs = 40

// bulkCount checks that CountDead(f) is want.
func bulkCount(t *testing.T, q *inbox.Queue, f inbox.DeadFilter, want int64) {
	t.Helper()
	if n, err := q.CountDead(context.Background(), f); err != nil || n != want {
		t.Fatalf("CountDead(%+v) = %d, %v; want %d", f, n, err, want)
	}
}

// bulkChosen requeues two of the three recent deaths, after a list with
// an unknown id changed nothing, and returns their payloads.
func bulkChosen(t *testing.T, q *inbox.Queue) []string {
	t.Helper()
	ctx := context.Background()
	recent, err := q.ListDead(ctx, 3, nil)
	if err != nil || len(recent) != 3 {
		t.Fatalf("ListDead: %d, %v", len(recent), err)
	}
	if _, err := q.RequeueDeadMany(ctx, []any{recent[0].ID, int64(1 << 40)}); !errors.Is(err, inbox.ErrNotDead) {
		t.Fatalf("RequeueDeadMany with an unknown id = %v, want ErrNotDead", err)
	}
	if err := q.DeleteDeadMany(ctx, []any{recent[0].ID, int64(1 << 40)}); !errors.Is(err, inbox.ErrNotDead) {
		t.Fatalf("DeleteDeadMany with an unknown id = %v, want ErrNotDead", err)
	}
	bulkCount(t, q, inbox.DeadFilter{}, bulkOldJobs+2)
	newIDs, err := q.RequeueDeadMany(ctx, []any{recent[0].ID, recent[1].ID})
	if err != nil || len(newIDs) != 2 {
		t.Fatalf("RequeueDeadMany = %v, %v", newIDs, err)
	}
	bulkCount(t, q, inbox.DeadFilter{}, bulkOldJobs)
	return []string{string(recent[0].Data[0].([]byte)), string(recent[1].Data[0].([]byte))}
}

// bulkRequeueAll requeues every old death in batches of 7 while eight
// workers claim, and checks that each job ran once: the old ones and
// those requeued before.
func bulkRequeueAll(t *testing.T, q *inbox.Queue, requeued []string) {
	t.Helper()
	want := map[string]bool{}
	for _, p := range requeued {
		want[p] = true
	}
	for id := 1001; id < 1000+bulkOldJobs; id++ {
		want[fmt.Sprintf("old%d", id)] = true
	}
	runs := bulkWorkers(t, q, len(want), func() {
		n, err := q.RequeueDeadAll(context.Background(), inbox.DeadFilter{DiedBefore: bulkCutoff}, 7)
		if err != nil || n != bulkOldJobs-1 {
			t.Errorf("RequeueDeadAll = %d, %v; want %d", n, err, bulkOldJobs-1)
		}
	})
	for p := range want {
		if runs[p] != 1 {
			t.Errorf("job %s ran %d times, want once", p, runs[p])
		}
	}
	if len(runs) != len(want) {
		t.Errorf("ran %d distinct jobs, want %d: %v", len(runs), len(want), runs)
	}
	bulkCount(t, q, inbox.DeadFilter{DiedBefore: bulkCutoff}, 0)
	bulkCount(t, q, inbox.DeadFilter{}, 1)
}

// bulkWorkers runs act while eight workers claim and ack q's jobs, until
// they have acked total jobs or a minute has passed, and returns how often
// each payload ran.
func bulkWorkers(t *testing.T, q *inbox.Queue, total int, act func()) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var mu sync.Mutex
	runs := map[string]int{}
	acked := 0
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				ds, err := q.Claim(ctx, 2)
				if err != nil && ctx.Err() == nil {
					t.Errorf("claim: %v", err)
					return
				}
				if len(ds) == 0 {
					select {
					case <-ctx.Done():
					case <-time.After(3 * time.Millisecond): // polling, within the deadline
					}
				}
				for _, d := range ds {
					var p []byte
					if err := d.Scan(&p); err != nil {
						t.Errorf("scan: %v", err)
					}
					if err := d.Ack(context.Background()); err != nil {
						t.Errorf("ack %v: %v", d.ID(), err)
						continue
					}
					mu.Lock()
					runs[string(p)]++
					acked++
					if acked >= total {
						cancel()
					}
					mu.Unlock()
				}
			}
		}()
	}
	act()
	wg.Wait()
	if acked < total {
		t.Errorf("acked %d of %d jobs within a minute", acked, total)
	}
	return runs
}

// TestBulkRunNow runs a waiting job now on every engine and form: its
// delay (a not-before time, or under the lease a retry's lease) is
// cleared and a claim takes it; a ready job is not waiting; a job in work
// is left alone and its holder's acknowledgement still holds.
func TestBulkRunNow(t *testing.T) {
	for _, e := range Engines {
		for _, form := range e.Forms() {
			t.Run(e.Name+"/"+form, func(t *testing.T) {
				ctx := context.Background()
				db := e.Open(t, 10)
				tb := deadOpsTable(t, e, db, "run_now", form)
				dropAtEnd(t, e, db, "run_now", "run_now_dead", "run_now_claims")
				q, err := inbox.New(db, inbox.Config{Dialect: e.Dialect, Table: tb})
				if err != nil {
					t.Fatal(err)
				}
				waiting := bulkWaiting(t, q, db, form)
				if j, err := q.Job(ctx, waiting); err != nil || j.State != inbox.StateWaiting {
					t.Fatalf("the delayed job: %+v, %v; want waiting", j, err)
				}
				held := enqueueOne(t, q, db, "held")
				d := claimOne(t, q)
				if d.ID() != held {
					t.Fatalf("claimed %v, want %v", d.ID(), held)
				}
				err = q.RunNow(ctx, held)
				if !errors.Is(err, inbox.ErrInWork) && !(form == "advisory" && errors.Is(err, inbox.ErrNotWaiting)) {
					t.Fatalf("RunNow of a job in work = %v, want ErrInWork", err)
				}
				if err := q.RunNow(ctx, waiting); err != nil {
					t.Fatalf("RunNow: %v", err)
				}
				if err := q.RunNow(ctx, waiting); !errors.Is(err, inbox.ErrNotWaiting) {
					t.Fatalf("second RunNow = %v, want ErrNotWaiting", err)
				}
				if err := q.RunNow(ctx, int64(1<<40)); !errors.Is(err, inbox.ErrNotFound) {
					t.Fatalf("RunNow of an unknown id = %v, want ErrNotFound", err)
				}
				if got := claimOne(t, q); got.ID() != waiting {
					t.Fatalf("claimed %v after RunNow, want %v", got.ID(), waiting)
				} else if err := got.Ack(ctx); err != nil {
					t.Fatal(err)
				}
				if err := d.Ack(ctx); err != nil {
					t.Fatalf("the holder's ack after a refused RunNow: %v", err)
				}
			})
		}
	}
}

// bulkWaiting makes a job that waits an hour: enqueued not before then,
// or under the lease claimed and retried after an hour.
func bulkWaiting(t *testing.T, q *inbox.Queue, db *sql.DB, form string) any {
	t.Helper()
	ctx := context.Background()
	if form != "lease" {
		id, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte("waiting")}, NotBefore: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	id := enqueueOne(t, q, db, "waiting")
	d := claimOne(t, q)
	if err := d.Retry(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	return id
}

// BenchmarkRequeueDeadAll times Queue.RequeueDeadAll of 2,000 dead jobs in
// batches of 200 (the lease form, one driver per server): µs/job is the
// cost of one job requeued.
//
//	cd dbtest && go test -run '^$' -bench RequeueDeadAll -benchtime 5x .
func BenchmarkRequeueDeadAll(b *testing.B) {
	const jobs, batch = 2000, 200
	for _, e := range Engines {
		if e.Name == "pq" || e.Name == "mysql" || e.Name == "modernc" {
			continue
		}
		b.Run(e.Name, func(b *testing.B) {
			ctx := context.Background()
			db := e.OpenDSN(b, e.DSN(b, b.TempDir()), 4)
			table := "bulk_bench"
			e.CreateTable(b, db, table)
			b.Cleanup(func() {
				for _, tb := range []string{table, table + "_dead", table + "_claims"} {
					db.Exec("DROP TABLE IF EXISTS " + tb)
				}
			})
			q, err := inbox.New(db, inbox.Config{Dialect: e.Dialect, Table: Table(table, "lease")})
			if err != nil {
				b.Fatal(err)
			}
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				mustExec(b, e, db, "DELETE FROM "+table)
				tx, err := db.Begin()
				if err != nil {
					b.Fatal(err)
				}
				for id := i * jobs; id < (i+1)*jobs; id++ {
					if _, err := tx.Exec(bind(e, "INSERT INTO "+table+"_dead (id, attempt, payload) VALUES (?, 3, ?)"), id+1, []byte("p")); err != nil {
						b.Fatal(err)
					}
				}
				if err := tx.Commit(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if n, err := q.RequeueDeadAll(ctx, inbox.DeadFilter{}, batch); err != nil || n != jobs {
					b.Fatalf("RequeueDeadAll = %d, %v; want %d", n, err, jobs)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*jobs), "µs/job")
		})
	}
}
