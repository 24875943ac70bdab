package dbtest

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/dashboard"
)

// deadOpsTable creates a queue table whose dead table keeps the last error
// and the time of death, and returns its description in form.
func deadOpsTable(t *testing.T, e Engine, db *sql.DB, table, form string) inbox.Table {
	t.Helper()
	e.CreateTable(t, db, table)
	text, at := "text", "timestamptz"
	switch {
	case e.IsMySQL():
		text, at = "varchar(2000)", "DATETIME(6)"
	case e.IsSQLite():
		text, at = "TEXT", "TEXT"
	}
	mustExec(t, e, db, "ALTER TABLE "+table+" ADD COLUMN last_error "+text)
	mustExec(t, e, db, "ALTER TABLE "+table+"_dead ADD COLUMN last_error "+text)
	mustExec(t, e, db, "ALTER TABLE "+table+"_dead ADD COLUMN dead_at "+at)
	mustExec(t, e, db, "CREATE INDEX "+table+"_dead_at ON "+table+"_dead (dead_at, id)")
	tb := Table(table, form)
	tb.LastError, tb.DeadAt = "last_error", "dead_at"
	return tb
}

// deadOpsKill claims every job of q and buries each with its own error,
// one at a time, so that each dies after the one before.
func deadOpsKill(t *testing.T, q *inbox.Queue, n int) {
	t.Helper()
	ctx := context.Background()
	for i := 0; i < n; i++ {
		ds, err := q.Claim(ctx, 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("claim %d: %v, %d jobs", i, err, len(ds))
		}
		ds[0].SetError(fmt.Errorf("failure of job %v", ds[0].ID()))
		if err := ds[0].Dead(ctx); err != nil {
			t.Fatalf("dead %v: %v", ds[0].ID(), err)
		}
	}
}

// TestDeadJobs lists, requeues and purges dead jobs on every engine and
// form, with the table named plainly and schema-qualified: pages come newest
// death first with their errors; eight operators on two pools requeueing one
// job bring it back once, under a new id with attempt 1 and its error kept;
// a purge by age keeps the recent deaths.
func TestDeadJobs(t *testing.T) {
	for _, e := range Engines {
		for _, form := range e.Forms() {
			for _, qualified := range []bool{false, true} {
				name := fmt.Sprintf("%s/%s/qualified=%v", e.Name, form, qualified)
				t.Run(name, func(t *testing.T) {
					ctx := context.Background()
					dir := t.TempDir()
					dsn := e.DSN(t, dir)
					db, db2 := e.OpenDSN(t, dsn, 10), e.OpenDSN(t, dsn, 10)
					table := "dead_ops"
					tb := deadOpsTable(t, e, db, table, form)
					dropAtEnd(t, e, db, table, table+"_dead", table+"_claims")
					if qualified {
						tb.Name, tb.DeadTable = concQualified(t, e, db, table), concQualified(t, e, db, table+"_dead")
					}
					q, err := inbox.New(db, inbox.Config{Dialect: e.Dialect, Table: tb})
					if err != nil {
						t.Fatal(err)
					}
					q2, err := inbox.New(db2, inbox.Config{Dialect: e.Dialect, Table: tb})
					if err != nil {
						t.Fatal(err)
					}
					const n = 7
					for i := 0; i < n; i++ {
						enqueueOne(t, q, db, fmt.Sprintf("p%d", i))
					}
					deadOpsKill(t, q, n)

					// Pages of three, newest death first.
					var all []inbox.DeadJob
					var after *inbox.DeadJob
					for {
						page, err := q.ListDead(ctx, 3, after)
						if err != nil {
							t.Fatal(err)
						}
						if len(page) == 0 {
							break
						}
						all = append(all, page...)
						after = &page[len(page)-1]
					}
					if len(all) != n {
						t.Fatalf("listed %d dead jobs, want %d", len(all), n)
					}
					for i, j := range all {
						if j.LastError != fmt.Sprintf("failure of job %v", j.ID) || j.Attempt != 1 || j.DeadAt.IsZero() || len(j.Data) != 1 {
							t.Errorf("dead job %d: %+v", i, j)
						}
						if i > 0 {
							p := all[i-1]
							if j.DeadAt.After(p.DeadAt) || j.DeadAt.Equal(p.DeadAt) && idLess(p.ID, j.ID) {
								t.Errorf("order: %v (%v) listed after %v (%v)", j.ID, j.DeadAt, p.ID, p.DeadAt)
							}
						}
					}

					// Eight operators on two pools requeue the newest at once.
					target := all[0]
					var wg sync.WaitGroup
					var mu sync.Mutex
					var newIDs []any
					notDead := 0
					for i := 0; i < 8; i++ {
						wg.Add(1)
						go func(i int) {
							defer wg.Done()
							qq := q
							if i%2 == 1 {
								qq = q2
							}
							id, err := qq.RequeueDead(ctx, target.ID)
							mu.Lock()
							defer mu.Unlock()
							switch {
							case err == nil:
								newIDs = append(newIDs, id)
							case errors.Is(err, inbox.ErrNotDead):
								notDead++
							default:
								t.Errorf("requeue: %v", err)
							}
						}(i)
					}
					wg.Wait()
					if len(newIDs) != 1 || notDead != 7 {
						t.Fatalf("8 requeues of one job: %d succeeded (%v), %d not dead; want 1 and 7", len(newIDs), newIDs, notDead)
					}
					if newIDs[0] == target.ID {
						t.Errorf("requeued under its old id %v", target.ID)
					}
					ds, err := q.Claim(ctx, 10)
					if err != nil {
						t.Fatal(err)
					}
					if len(ds) != 1 || ds[0].ID() != newIDs[0] || ds[0].Attempt() != 1 || ds[0].LastError() != target.LastError {
						t.Fatalf("claimed after the requeue: %d jobs %v", len(ds), describe(ds))
					}
					var p []byte
					if err := ds[0].Scan(&p); err != nil || string(p) != string(target.Data[0].([]byte)) {
						t.Errorf("requeued payload %q (%v), want %q", p, err, target.Data[0])
					}
					if err := ds[0].Ack(ctx); err != nil {
						t.Fatal(err)
					}
					if _, err := q.RequeueDead(ctx, int64(1<<40)); !errors.Is(err, inbox.ErrNotDead) {
						t.Errorf("requeue of an unknown id = %v, want ErrNotDead", err)
					}

					// Purge by age: the deaths before the third oldest go.
					rest := all[1:]
					cut := rest[len(rest)-3].DeadAt
					older := 0
					for _, j := range rest {
						if j.DeadAt.Before(cut) {
							older++
						}
					}
					purged, err := q.PurgeDead(ctx, cut)
					if err != nil || purged != int64(older) {
						t.Fatalf("PurgeDead(%v) = %d, %v; want %d", cut, purged, err, older)
					}
					left, err := q.ListDead(ctx, 100, nil)
					if err != nil || len(left) != len(rest)-older {
						t.Fatalf("after the purge %d left (%v), want %d", len(left), err, len(rest)-older)
					}
					if purged, err := q2.PurgeDead(ctx, time.Time{}); err != nil || purged != int64(len(left)) {
						t.Fatalf("PurgeDead(all) = %d, %v; want %d", purged, err, len(left))
					}
				})
			}
		}
	}
}

// TestCancel cancels a waiting job on every engine and form; a job in work
// is left to its holder under the row lock (ErrInWork) and deleted under
// the lease and advisory forms, whose holder's settlement then fails with
// ErrCancelled (matching ErrLeaseLost); an unknown id is ErrNotFound, and nothing else changes.
func TestCancel(t *testing.T) {
	for _, e := range Engines {
		for _, form := range e.Forms() {
			t.Run(e.Name+"/"+form, func(t *testing.T) {
				ctx := context.Background()
				db := e.Open(t, 10)
				tb := deadOpsTable(t, e, db, "cancel_ops", form)
				dropAtEnd(t, e, db, "cancel_ops", "cancel_ops_dead", "cancel_ops_claims")
				q, err := inbox.New(db, inbox.Config{Dialect: e.Dialect, Table: tb})
				if err != nil {
					t.Fatal(err)
				}
				held := enqueueOne(t, q, db, "held")
				waiting := enqueueOne(t, q, db, "waiting")
				ds, err := q.Claim(ctx, 1)
				if err != nil || len(ds) != 1 || ds[0].ID() != held {
					t.Fatalf("claim: %v %v", err, describe(ds))
				}
				if err := q.Cancel(ctx, waiting); err != nil {
					t.Fatalf("cancel of a waiting job: %v", err)
				}
				if err := q.Cancel(ctx, waiting); !errors.Is(err, inbox.ErrNotFound) {
					t.Errorf("second cancel = %v, want ErrNotFound", err)
				}
				err = q.Cancel(ctx, held)
				switch form {
				case "rowlock":
					if !errors.Is(err, inbox.ErrInWork) {
						t.Fatalf("cancel of a held row-lock job = %v, want ErrInWork", err)
					}
					if err := ds[0].Ack(ctx); err != nil {
						t.Fatalf("the holder's ack after a refused cancel: %v", err)
					}
				default:
					if err != nil {
						t.Fatalf("cancel of a job in work: %v", err)
					}
					if err := ds[0].Ack(ctx); !errors.Is(err, inbox.ErrCancelled) || !errors.Is(err, inbox.ErrLeaseLost) {
						t.Fatalf("the holder's ack after a cancel = %v, want ErrCancelled, matching ErrLeaseLost", err)
					}
				}
				var left int
				if err := db.QueryRow("SELECT COUNT(*) FROM cancel_ops").Scan(&left); err != nil || left != 0 {
					t.Fatalf("%d jobs left (%v), want 0", left, err)
				}
			})
		}
	}
}

// idLess orders two integer or text ids.
func idLess(a, b any) bool {
	x, ok1 := a.(int64)
	y, ok2 := b.(int64)
	if ok1 && ok2 {
		return x < y
	}
	return fmt.Sprint(a) < fmt.Sprint(b)
}

func describe(ds []*inbox.Delivery) string {
	s := ""
	for _, d := range ds {
		s += fmt.Sprintf("[id %v attempt %d last error %q] ", d.ID(), d.Attempt(), d.LastError())
	}
	return s
}

// TestListDeadTies pages through deaths that share one time (a batch
// buried by one statement on the engine's clock) on every engine and
// driver: each job is listed once, ties by id descending, as the next
// page's condition spells the last job's (dead_at, id) on each engine.
func TestListDeadTies(t *testing.T) {
	for _, e := range Engines {
		t.Run(e.Name, func(t *testing.T) {
			db := e.OpenDSN(t, e.DSN(t, t.TempDir()), 4)
			table := "dead_ties"
			tb := deadOpsTable(t, e, db, table, "lease")
			dropAtEnd(t, e, db, table, table+"_dead", table+"_claims")
			q, err := inbox.New(db, inbox.Config{Dialect: e.Dialect, Table: tb})
			if err != nil {
				t.Fatal(err)
			}
			at := time.Date(2026, 12, 3, 8, 0, 0, 250000000, time.UTC)
			// Ids 1 to 7: 2 to 6 died together, 1 before them, 7 after.
			want := []int64{7, 6, 5, 4, 3, 2, 1}
			for id := int64(1); id <= 7; id++ {
				died := at
				switch id {
				case 1:
					died = at.Add(-time.Second)
				case 7:
					died = at.Add(time.Second)
				}
				mustExec(t, e, db, "INSERT INTO "+table+"_dead (id, attempt, payload, last_error, dead_at) VALUES (?, 2, ?, 'x', ?)", id, []byte("p"), opsTime(e, died))
			}
			var got []int64
			var after *inbox.DeadJob
			for len(got) <= len(want) {
				page, err := q.ListDead(context.Background(), 2, after)
				if err != nil {
					t.Fatal(err)
				}
				if len(page) == 0 {
					break
				}
				for _, j := range page {
					got = append(got, j.ID.(int64))
				}
				after = &page[len(page)-1]
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("listed %v, want %v", got, want)
			}
		})
	}
}

// TestEnqueueDeadID: ids are never reused. On every engine and form, the id
// of a dead job given to Enqueue (through the pool and in the caller's
// transaction) or to EnqueueMany is refused with ErrDeadID and nothing is
// inserted; a fresh id is taken; the dead job comes back by RequeueDead,
// under a new id.
func TestEnqueueDeadID(t *testing.T) {
	for _, e := range Engines {
		for _, form := range e.Forms() {
			t.Run(e.Name+"/"+form, func(t *testing.T) {
				ctx := context.Background()
				db := e.Open(t, 4)
				table := "dead_reuse"
				tb := deadOpsTable(t, e, db, table, form)
				dropAtEnd(t, e, db, table, table+"_dead", table+"_claims")
				q, err := inbox.New(db, inbox.Config{Dialect: e.Dialect, Table: tb})
				if err != nil {
					t.Fatal(err)
				}
				dead := enqueueOne(t, q, db, "dies")
				deadOpsKill(t, q, 1)
				job := inbox.Job{ID: dead, Data: []any{[]byte("again")}}
				if _, err := q.Enqueue(ctx, db, job); !errors.Is(err, inbox.ErrDeadID) {
					t.Fatalf("Enqueue of a dead job's id = %v, want ErrDeadID", err)
				}
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := q.Enqueue(ctx, tx, job); !errors.Is(err, inbox.ErrDeadID) {
					t.Fatalf("Enqueue in a transaction of a dead job's id = %v, want ErrDeadID", err)
				}
				if err := tx.Rollback(); err != nil {
					t.Fatal(err)
				}
				fresh := dead.(int64) + 1000
				_, err = q.EnqueueMany(ctx, db, []inbox.Job{{ID: fresh, Data: []any{[]byte("a")}}, job})
				if !errors.Is(err, inbox.ErrDeadID) || !strings.Contains(err.Error(), "job 1") {
					t.Fatalf("EnqueueMany with a dead job's id = %v, want ErrDeadID naming job 1", err)
				}
				if n := countRows(t, db, table); n != 0 {
					t.Fatalf("%d jobs inserted after the refusals, want none", n)
				}
				if id, err := q.Enqueue(ctx, db, inbox.Job{ID: fresh, Data: []any{[]byte("a")}}); err != nil || id != fresh {
					t.Fatalf("Enqueue of a fresh id = %v, %v", id, err)
				}
				if id, err := q.RequeueDead(ctx, dead); err != nil || id == dead {
					t.Fatalf("RequeueDead = %v, %v; want a new id", id, err)
				}
				if n := countRows(t, db, table); n != 2 {
					t.Fatalf("%d jobs, want the fresh one and the requeued one", n)
				}
			})
		}
	}
}

// BenchmarkEnqueueGivenID measures what the dead table's probe costs an
// Enqueue given an id: the same inserts with and without Table.DeadTable
// named, in one transaction, one driver per engine family:
//
//	cd dbtest && go test -run '^$' -bench EnqueueGivenID -benchtime 2000x .
func BenchmarkEnqueueGivenID(b *testing.B) {
	for _, e := range Engines {
		if e.Name != "pq" && e.Name != "mariadb" && e.Name != "mattn" {
			continue
		}
		for _, withDead := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/dead=%v", e.Name, withDead), func(b *testing.B) {
				db := e.OpenDSN(b, e.DSN(b, b.TempDir()), 4)
				table := "enqueue_given_id"
				e.CreateTable(b, db, table)
				b.Cleanup(func() {
					for _, tb := range []string{table, table + "_dead", table + "_claims"} {
						db.Exec("DROP TABLE IF EXISTS " + tb)
					}
				})
				tb := Table(table, "lease")
				if !withDead {
					tb.DeadTable = ""
				}
				q, err := inbox.New(db, inbox.Config{Dialect: e.Dialect, Table: tb})
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				// In one transaction, rolled back: the commits' flushes,
				// which swamp a read's cost on a shared machine, are left
				// out of both sides.
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					b.Fatal(err)
				}
				defer tx.Rollback()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if _, err := q.Enqueue(ctx, tx, inbox.Job{ID: int64(i + 1), Data: []any{[]byte("p")}}); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// TestListDeadNullDeadAt: Table.DeadAt added to a dead table that already
// held jobs, whose dead_at is then NULL. They died before the column
// existed, so they are the oldest: on every engine and driver, with integer
// and text ids, paging at 1, 2, 3 and 7 jobs through ListDead, the
// dashboard's api/dead and its page (whose links carry no time for such a
// job) lists every dead job once, by dead_at descending, ties by id
// descending, then the NULL ones by id descending.
func TestListDeadNullDeadAt(t *testing.T) {
	at := time.Date(2026, 12, 3, 8, 0, 0, 250000000, time.UTC)
	// Job n died at at+died[n] seconds; missing: NULL.
	died := map[int]int{2: 0, 4: 1, 5: 0, 7: 1, 8: -1, 10: 0, 11: 2}
	order := []int{11, 7, 4, 10, 5, 2, 8, 12, 9, 6, 3, 1}
	eachEngine(t, nil, func(t *testing.T, e Engine) {
		for _, kind := range []string{"int", "text"} {
			t.Run(kind, func(t *testing.T) {
				ctx := context.Background()
				db := e.Open(t, 4)
				table := "dead_null_" + kind
				idOf := func(n int) any { return int64(n) }
				if kind == "text" {
					textIDTable(t, e, db, table)
					idOf = func(n int) any { return fmt.Sprintf("job-%02d", n) }
				} else {
					e.CreateTable(t, db, table)
					dropAtEnd(t, e, db, table, table+"_dead", table+"_claims")
				}
				// The rows of before the column: no dead_at.
				for n := 1; n <= len(order); n++ {
					mustExec(t, e, db, "INSERT INTO "+table+"_dead (id, attempt, payload) VALUES (?, 1, ?)", idOf(n), []byte("p"))
				}
				addColumns(t, e, db, table, "dead.dead_at")
				mustExec(t, e, db, "CREATE INDEX "+table+"_dead_at ON "+table+"_dead (dead_at, id)")
				for n, s := range died {
					mustExec(t, e, db, "UPDATE "+table+"_dead SET dead_at = ? WHERE id = ?", opsTime(e, at.Add(time.Duration(s)*time.Second)), idOf(n))
				}
				tb := Table(table, "lease")
				tb.DeadAt = "dead_at"
				data := 1 // payload
				if kind == "int" {
					// The id as data too: a name a page's derived tables
					// would hold twice.
					tb.Data, data = []string{"id", "payload"}, 2
				}
				q := newQueue(t, db, queueConfig(e, tb, nil))
				var want []string
				for _, n := range order {
					want = append(want, fmt.Sprint(idOf(n)))
				}
				diedAt := func(id string) time.Time {
					for n, s := range died {
						if fmt.Sprint(idOf(n)) == id {
							return at.Add(time.Duration(s) * time.Second)
						}
					}
					return time.Time{}
				}

				for _, limit := range []int{1, 2, 3, 7} {
					// ListDead, each page past the last job of the one before.
					var got []string
					var after *inbox.DeadJob
					for pages := 0; pages <= len(want); pages++ {
						page, err := q.ListDead(ctx, limit, after)
						if err != nil {
							t.Fatalf("limit %d, after %+v: %v", limit, after, err)
						}
						if len(page) == 0 {
							break
						}
						for _, j := range page {
							id := fmt.Sprint(j.ID)
							if fmt.Sprintf("%T", j.ID) != fmt.Sprintf("%T", idOf(1)) || !j.DeadAt.Equal(diedAt(id)) || len(j.Data) != data {
								t.Errorf("limit %d: job %v (%T) died at %v with data %v, want %v", limit, j.ID, j.ID, j.DeadAt, j.Data, diedAt(id))
							} else if kind == "int" && fmt.Sprint(j.Data[0]) != id {
								t.Errorf("limit %d: job %v has the id %v as data", limit, j.ID, j.Data[0])
							}
							got = append(got, id)
						}
						after = &page[len(page)-1]
					}
					if fmt.Sprint(got) != fmt.Sprint(want) {
						t.Errorf("ListDead by %d: %v, want %v", limit, got, want)
					}

					h, err := dashboard.New(dashboard.Config{Queues: []dashboard.QueueConfig{{Name: "jobs", Queue: q, TextIDs: kind == "text"}}, DeadPage: limit})
					if err != nil {
						t.Fatal(err)
					}
					get := func(target string) string {
						rec := httptest.NewRecorder()
						h.ServeHTTP(rec, httptest.NewRequest("GET", target, nil))
						if rec.Code != 200 {
							t.Fatalf("GET %s = %d %s", target, rec.Code, rec.Body)
						}
						return rec.Body.String()
					}

					// api/dead, following its next.
					got = nil
					target := fmt.Sprintf("/api/dead?queue=jobs&limit=%d", limit)
					for pages := 0; target != "" && pages <= len(want); pages++ {
						var body struct {
							Jobs []struct {
								ID     any        `json:"id"`
								DeadAt *time.Time `json:"dead_at"`
							} `json:"jobs"`
							Next map[string]string `json:"next"`
						}
						if err := json.Unmarshal([]byte(get(target)), &body); err != nil {
							t.Fatal(err)
						}
						for _, j := range body.Jobs {
							id := fmt.Sprint(j.ID)
							if j.DeadAt == nil != diedAt(id).IsZero() || j.DeadAt != nil && !j.DeadAt.Equal(diedAt(id)) {
								t.Errorf("api/dead by %d: job %s died at %v, want %v", limit, id, j.DeadAt, diedAt(id))
							}
							got = append(got, id)
						}
						target = ""
						if body.Next != nil {
							v := url.Values{"queue": {"jobs"}, "limit": {fmt.Sprint(limit)}}
							for k, x := range body.Next {
								v.Set(k, x)
							}
							target = "/api/dead?" + v.Encode()
						}
					}
					if fmt.Sprint(got) != fmt.Sprint(want) {
						t.Errorf("api/dead by %d: %v, want %v", limit, got, want)
					}

					// The page, following its link to older dead jobs.
					got = nil
					target = "/?queue=jobs"
					for pages := 0; target != "" && pages <= len(want); pages++ {
						body := get(target)
						if i := strings.Index(body, `id="dead-error"`); i >= 0 {
							t.Fatalf("the page by %d: %.300s", limit, body[i:])
						}
						for _, m := range deadRowRE.FindAllStringSubmatch(body, -1) {
							got = append(got, html.UnescapeString(m[1]))
						}
						target = ""
						if m := olderRE.FindStringSubmatch(body); m != nil {
							target = "/" + html.UnescapeString(m[1])
						}
					}
					if fmt.Sprint(got) != fmt.Sprint(want) {
						t.Errorf("the page by %d: %v, want %v", limit, got, want)
					}
				}
			})
		}
	})
}

var (
	deadRowRE = regexp.MustCompile(`<tr data-id="([^"]*)">`)
	olderRE   = regexp.MustCompile(`<a id="older" href="([^"]*)">`)
)
