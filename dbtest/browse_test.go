package dbtest

// The job browser (Queue.ListJobs, Queue.Job) on every engine and form:
// pages both ways by id, the state each row tells, rows from before the
// optional columns were added, text ids; and its pages' plans, a seek of
// the primary key at any depth.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/dialect"
)

func pageIDs(p inbox.JobPage) []any {
	var ids []any
	for _, j := range p.Jobs {
		ids = append(ids, j.ID)
	}
	return ids
}

// TestBrowse: three jobs enqueued before last_error and enqueued_at were
// added, five after; of the first three, one is held, one waits an hour
// for its retry, one died. Every page is the ids expected, in both
// directions, and each state's list holds its jobs.
func TestBrowse(t *testing.T) {
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		ctx := context.Background()
		db := e.Open(t, 8)
		table := newTable(t, e, db, "browse_"+form)
		old := newQueue(t, db, queueConfig(e, Table(table, form), nil))
		for i := 1; i <= 3; i++ {
			if _, err := old.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte(fmt.Sprintf("old-%d", i))}}); err != nil {
				t.Fatal(err)
			}
		}
		addColumns(t, e, db, table, "last_error", "enqueued_at", "dead.last_error", "dead.dead_at")
		tb := Table(table, form)
		tb.LastError, tb.EnqueuedAt, tb.DeadAt = "last_error", "enqueued_at", "dead_at"
		q := newQueue(t, db, queueConfig(e, tb, nil))
		for i := 4; i <= 8; i++ {
			if _, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte(fmt.Sprintf(`{"n":%d}`, i))}}); err != nil {
				t.Fatal(err)
			}
		}
		ds, err := q.Claim(ctx, 3)
		if err != nil || len(ds) != 3 {
			t.Fatalf("claim: %d, %v", len(ds), err)
		}
		held, waiting, dead := ds[0], ds[1], ds[2]
		defer held.Release(ctx)
		waiting.SetError(errors.New("try later"))
		if err := waiting.Retry(ctx, time.Hour); err != nil {
			t.Fatal(err)
		}
		dead.SetError(errors.New("gave up"))
		if err := dead.Dead(ctx); err != nil {
			t.Fatal(err)
		}
		id := func(n int) any { return int64(n) }
		list := func(f inbox.JobFilter) inbox.JobPage {
			t.Helper()
			p, err := q.ListJobs(ctx, f)
			if err != nil {
				t.Fatalf("ListJobs(%+v): %v", f, err)
			}
			return p
		}
		for _, w := range []struct {
			f            inbox.JobFilter
			want         []any
			newer, older bool
		}{
			{inbox.JobFilter{Limit: 3}, []any{id(8), id(7), id(6)}, false, true},
			{inbox.JobFilter{Limit: 3, After: id(6)}, []any{id(5), id(4), id(2)}, true, true},
			{inbox.JobFilter{Limit: 3, After: id(2)}, []any{id(1)}, true, false},
			{inbox.JobFilter{Limit: 3, Before: id(5)}, []any{id(8), id(7), id(6)}, false, true},
			{inbox.JobFilter{Limit: 2, Before: id(4)}, []any{id(6), id(5)}, true, true},
			{inbox.JobFilter{State: inbox.StateWaiting}, []any{id(2)}, false, false},
			{inbox.JobFilter{ID: id(7)}, []any{id(7)}, false, false},
			{inbox.JobFilter{ID: id(3)}, nil, false, false}, // dead: not the queue table's
		} {
			p := list(w.f)
			if got := pageIDs(p); !slices.Equal(got, w.want) || p.Newer != w.newer || p.Older != w.older {
				t.Errorf("ListJobs(%+v) = %v newer %v older %v, want %v %v %v", w.f, got, p.Newer, p.Older, w.want, w.newer, w.older)
			}
		}
		ready := []any{id(8), id(7), id(6), id(5), id(4)}
		if form != "lease" {
			ready = append(ready, id(1)) // held, ready by its time
		}
		if got := pageIDs(list(inbox.JobFilter{State: inbox.StateReady})); !slices.Equal(got, ready) {
			t.Errorf("ready = %v, want %v", got, ready)
		}
		p, err := q.ListJobs(ctx, inbox.JobFilter{State: inbox.StateInWork})
		switch {
		case form == "lease" && (err != nil || !slices.Equal(pageIDs(p), []any{id(1)})):
			t.Errorf("in work = %v, %v, want [1]", pageIDs(p), err)
		case form != "lease" && !errors.Is(err, inbox.ErrNoInWorkList):
			t.Errorf("in work under %s: %v, want ErrNoInWorkList", form, err)
		}
		if p := list(inbox.JobFilter{}); p.StatsErr != nil || p.Stats.Dead != 1 || p.Stats.Waiting != 1 {
			t.Errorf("the page's counts: %+v, %v", p.Stats, p.StatsErr)
		}

		// The detail: each state as the row tells it; the row lock asks
		// the lock of the held job.
		wantHeld := inbox.StateInWork
		if form == "advisory" {
			wantHeld = inbox.StateReady
		}
		for _, w := range []struct {
			id    any
			state inbox.JobState
			check func(j inbox.JobView) string
		}{
			{id(1), wantHeld, func(j inbox.JobView) string {
				if form == "lease" && j.Due.IsZero() {
					return "no lease expiry"
				}
				return ""
			}},
			{id(2), inbox.StateWaiting, func(j inbox.JobView) string {
				if j.Due.Before(time.Now().Add(50*time.Minute)) || j.LastError != "try later" || !j.EnqueuedAt.IsZero() {
					return "want due in an hour, its error, no enqueue time (added after it)"
				}
				return ""
			}},
			{id(3), inbox.StateDead, func(j inbox.JobView) string {
				if j.LastError != "gave up" || j.DeadAt.IsZero() || string(j.Data[0].([]byte)) != "old-3" {
					return "want its error, time of death and data"
				}
				return ""
			}},
			{id(8), inbox.StateReady, func(j inbox.JobView) string {
				if j.EnqueuedAt.IsZero() || j.Attempt != 1 || !json.Valid(j.Data[0].([]byte)) {
					return "want an enqueue time, attempt 1, its data"
				}
				return ""
			}},
		} {
			j, err := q.Job(ctx, w.id)
			if err != nil {
				t.Errorf("Job(%v): %v", w.id, err)
				continue
			}
			if j.State != w.state {
				t.Errorf("Job(%v).State = %v, want %v", w.id, j.State, w.state)
			}
			if s := w.check(j); s != "" {
				t.Errorf("Job(%v) = %+v: %s", w.id, j, s)
			}
		}
		if _, err := q.Job(ctx, id(999)); !errors.Is(err, inbox.ErrNotFound) {
			t.Errorf("Job(999): %v, want ErrNotFound", err)
		}
	})
}

// TestBrowseTextIDs: text ids (UUIDs) page by their order as text, and the
// detail finds them.
func TestBrowseTextIDs(t *testing.T) {
	eachEngine(t, nil, func(t *testing.T, e Engine) {
		ctx := context.Background()
		db := e.Open(t, 4)
		table := tableName(e, "browse_text")
		textIDTable(t, e, db, table)
		q := newQueue(t, db, queueConfig(e, inbox.Table{Name: table, LockedUntil: "locked_until", DeadTable: table + "_dead"}, nil))
		ids := []string{"0b7c2a3e-0000-4000-8000-000000000001", "5f0e9d11-0000-4000-8000-000000000002", "9a1b7c33-0000-4000-8000-000000000003",
			"c4d5e6f7-0000-4000-8000-000000000004", "f0e1d2c3-0000-4000-8000-000000000005"}
		for _, id := range ids {
			if _, err := q.Enqueue(ctx, db, inbox.Job{ID: id, Data: []any{[]byte(id)}}); err != nil {
				t.Fatal(err)
			}
		}
		var got []any
		f := inbox.JobFilter{Limit: 2}
		for {
			p, err := q.ListJobs(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, pageIDs(p)...)
			if !p.Older {
				break
			}
			f.After = p.Jobs[len(p.Jobs)-1].ID
		}
		var want []any
		for i := len(ids) - 1; i >= 0; i-- {
			want = append(want, ids[i])
		}
		if !slices.Equal(got, want) {
			t.Errorf("pages = %v, want %v", got, want)
		}
		p, err := q.ListJobs(ctx, inbox.JobFilter{Limit: 2, Before: ids[1]})
		if err != nil || !slices.Equal(pageIDs(p), []any{ids[3], ids[2]}) || !p.Newer {
			t.Errorf("before %s: %v newer %v, %v", ids[1], pageIDs(p), p.Newer, err)
		}
		j, err := q.Job(ctx, ids[2])
		if err != nil || j.ID != ids[2] || j.State != inbox.StateReady {
			t.Errorf("Job(%s) = %+v, %v", ids[2], j, err)
		}
	})
}

// TestExplainBrowse: a page of the browser deep in a table of 20,000 rows
// is a seek of the primary key from its cursor, read in its order: no scan
// of the table, no sort, whatever the state listed.
func TestExplainBrowse(t *testing.T) {
	dashEngines(t, func(t *testing.T, e Engine) {
		dsn := e.DSN(t, t.TempDir())
		if e.IsMySQL() {
			dsn += "&interpolateParams=true"
		}
		db := e.OpenDSN(t, dsn, 4)
		table := "explain_browse_" + e.Name
		now := time.Now().UTC().Truncate(time.Second)
		dashLoad(t, e, db, table, 20000, 10, now)
		q, err := inbox.New(db, dashConfig(e, table, now))
		if err != nil {
			t.Fatal(err)
		}
		b := q.Statements().Browse
		for _, st := range []struct {
			name string
			s    dialect.Stmt
		}{{"All.After", b.All.After}, {"All.Before", b.All.Before}, {"Ready.After", b.Ready.After}, {"All.First", b.All.First}} {
			var args []any
			for _, a := range st.s.Args {
				switch a {
				case dialect.ArgLimit:
					args = append(args, 21)
				case dialect.ArgID:
					args = append(args, 10000)
				case dialect.ArgNow:
					args = append(args, opsTime(e, now))
				case dialect.ArgUntil:
					args = append(args, opsTime(e, now.Add(time.Minute)))
				case dialect.ArgMicros:
					args = append(args, int64(60_000_000))
				default:
					t.Fatalf("%s: argument %v", st.name, a)
				}
			}
			if e.IsMySQL() {
				var js string
				if err := db.QueryRow("ANALYZE FORMAT=JSON "+st.s.SQL, args...).Scan(&js); err != nil {
					t.Fatal(err)
				}
				var v any
				if err := json.Unmarshal([]byte(js), &v); err != nil {
					t.Fatal(err)
				}
				if sorted := sortedTables(v); len(sorted) != 0 {
					t.Errorf("%s: sorts %v:\n%s", st.name, sorted, js)
				}
				rs := reads(planNodes(v, false), table)
				if len(rs) != 1 || rs[0].Index != "PRIMARY" || rs[0].Rows > 25 && st.name != "Ready.After" {
					t.Errorf("%s: reads %v, want one of the primary key:\n%s", st.name, rs, js)
				}
				continue
			}
			plan := explainPlan(t, e, db, true, st.s.SQL, args...)
			good, bad := []string{table + "_pkey"}, []string{"Seq Scan", "Sort"}
			if e.IsSQLite() {
				good, bad = []string{"PRIMARY KEY"}, []string{"SCAN " + table + " on", "TEMP B-TREE"}
				if st.name == "All.First" {
					good = []string{"SCAN " + table} // the rowid in order, from its end
					bad = []string{"TEMP B-TREE"}
				}
			}
			explainMust(t, st.name, plan, good, bad)
			if text := planText(plan); strings.Contains(text, "rows 20000") {
				t.Errorf("%s: read the whole table:\n%s", st.name, text)
			}
		}
	})
}
