package dbtest

// Queue.EnqueueMany on real databases: ids in job order under concurrent
// producers on two pools (the table named plainly and qualified), all or
// nothing through a pool, a connection and the caller's transaction, and
// contexts cancelled at random points.

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
)

// manyJobs returns n jobs whose payloads name tag and their index.
func manyJobs(tag string, n int) []inbox.Job {
	jobs := make([]inbox.Job, n)
	for i := range jobs {
		jobs[i] = inbox.Job{Data: []any{[]byte(fmt.Sprintf("%s-%d", tag, i))}}
	}
	return jobs
}

// manyPayloads reads every row's payload by id.
func manyPayloads(t testing.TB, db *sql.DB, table string) map[string]string {
	t.Helper()
	rows, err := db.Query("SELECT id, payload FROM " + table)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var id any
		var p []byte
		if err := rows.Scan(&id, &p); err != nil {
			t.Fatal(err)
		}
		if b, ok := id.([]byte); ok {
			id = string(b)
		}
		out[fmt.Sprint(id)] = string(p)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// manyCheck fails the test unless each id names the row of its job.
func manyCheck(t testing.TB, stored map[string]string, jobs []inbox.Job, ids []any) {
	t.Helper()
	if len(ids) != len(jobs) {
		t.Fatalf("%d ids for %d jobs", len(ids), len(jobs))
	}
	for i, id := range ids {
		want := string(jobs[i].Data[0].([]byte))
		if got, ok := stored[fmt.Sprint(id)]; !ok || got != want {
			t.Fatalf("job %d: id %v holds %q (stored: %v), want %q", i, id, got, ok, want)
		}
	}
}

// TestEnqueueManyOrder: eight producers on two pools, one naming the table
// plainly and one qualified, each enqueue 1,500 jobs (two statements, past
// the thousand rows of one) twice, and ids given mixed with assigned ones
// once; every id returned names its own job's row, and no row is missing.
func TestEnqueueManyOrder(t *testing.T) {
	eachEngine(t, nil, func(t *testing.T, e Engine) {
		db1, db2 := openTwo(t, e, 4)
		table := concTable(t, e, db1, "many_order")
		q1 := newQueue(t, db1, queueConfig(e, Table(table, "lease"), nil))
		q2 := newQueue(t, db2, queueConfig(e, Table(concQualified(t, e, db1, table), "lease"), nil))
		const producers, calls, per = 8, 2, 1500
		type call struct {
			jobs []inbox.Job
			ids  []any
		}
		var mu sync.Mutex
		var done []call
		var wg sync.WaitGroup
		errs := make(chan error, producers)
		for p := 0; p < producers; p++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				q, db := q1, db1
				if p%2 == 1 {
					q, db = q2, db2
				}
				for c := 0; c < calls; c++ {
					jobs := manyJobs(fmt.Sprintf("p%d-c%d", p, c), per)
					ids, err := q.EnqueueMany(context.Background(), db, jobs)
					if err != nil {
						errs <- fmt.Errorf("producer %d: %w", p, err)
						return
					}
					mu.Lock()
					done = append(done, call{jobs, ids})
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		// Ids given among assigned ones: a run of each kind.
		mixed := manyJobs("mixed", 6)
		for i := 2; i < 4; i++ {
			mixed[i].ID = int64(900000000 + i)
		}
		ids, err := q1.EnqueueMany(context.Background(), db1, mixed)
		ok(t, "EnqueueMany mixed", err)
		done = append(done, call{mixed, ids})

		stored := manyPayloads(t, db1, table)
		if want := producers*calls*per + len(mixed); len(stored) != want {
			t.Fatalf("%d rows stored, want %d", len(stored), want)
		}
		for _, c := range done {
			manyCheck(t, stored, c.jobs, c.ids)
		}
		t.Logf("FIGURE: %d producers on two pools enqueued %d jobs, each id its own job's", producers, len(stored))
	})
}

// TestEnqueueManyAllOrNothing: a statement that fails after another
// succeeded (an id taken already, in the second run) leaves nothing through
// a pool and through a connection; the caller's transaction rolled back
// leaves nothing; a bad job leaves nothing and names its index; a context
// cancelled at a random point leaves all the jobs or none.
func TestEnqueueManyAllOrNothing(t *testing.T) {
	eachEngine(t, nil, func(t *testing.T, e Engine) {
		db := e.Open(t, 4)
		table := concTable(t, e, db, "many_all")
		q := newQueue(t, db, queueConfig(e, Table(table, "lease"), nil))
		ctx := context.Background()
		first, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte("first")}})
		ok(t, "Enqueue", err)
		count := func() int {
			t.Helper()
			var n int
			ok(t, "count", db.QueryRow("SELECT COUNT(*) FROM "+table).Scan(&n))
			return n
		}
		clash := append(manyJobs("clash", 5), inbox.Job{ID: first, Data: []any{[]byte("dup")}})
		if _, err := q.EnqueueMany(ctx, db, clash); err == nil {
			t.Fatal("EnqueueMany with a taken id through the pool: no error")
		}
		conn, err := db.Conn(ctx)
		ok(t, "Conn", err)
		if _, err := q.EnqueueMany(ctx, conn, clash); err == nil {
			t.Fatal("EnqueueMany with a taken id through a connection: no error")
		}
		conn.Close()
		if n := count(); n != 1 {
			t.Fatalf("%d rows after failed EnqueueMany calls, want the 1 before", n)
		}

		tx, err := db.BeginTx(ctx, nil)
		ok(t, "BeginTx", err)
		ids, err := q.EnqueueMany(ctx, tx, manyJobs("tx", 1200))
		ok(t, "EnqueueMany in the caller's transaction", err)
		if len(ids) != 1200 {
			t.Fatalf("%d ids, want 1200", len(ids))
		}
		ok(t, "Rollback", tx.Rollback())
		if n := count(); n != 1 {
			t.Fatalf("%d rows after the caller's rollback, want 1", n)
		}

		bad := manyJobs("bad", 3)
		bad[1].Data = nil
		if _, err := q.EnqueueMany(ctx, db, bad); err == nil || err.Error() != "inbox: enqueue many: job 1: 0 data values for the 1 data columns [payload]" {
			t.Fatalf("EnqueueMany with a bad job: %v", err)
		}
		if n := count(); n != 1 {
			t.Fatalf("%d rows after a refused EnqueueMany, want 1", n)
		}

		// Cancelled at random points: every job or none. A cancel that
		// lands during the COMMIT may leave its outcome unknown to the
		// driver: an error then, with all the jobs or none.
		before := count()
		for try := 0; try < 6; try++ {
			cctx, cancel := context.WithTimeout(ctx, time.Duration(rand.IntN(30000))*time.Microsecond)
			_, err := q.EnqueueMany(cctx, db, manyJobs(fmt.Sprint("cut", try), 2500))
			cancel()
			n := count()
			switch {
			case err == nil && n != before+2500, n != before && n != before+2500:
				t.Fatalf("try %d: %d rows after EnqueueMany (err %v), want %d or %d", try, n, err, before, before+2500)
			}
			before = n
		}
	})
}

// ok fails the test if err is not nil.
func ok(t testing.TB, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}
