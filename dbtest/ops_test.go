package dbtest

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/fakeclock"
)

// opsTable makes a queue table for form with the optional operability
// columns: last_error (also in the dead table), priority and enqueued_at.
func opsTable(t *testing.T, e Engine, db *sql.DB, form string) string {
	t.Helper()
	table := newTable(t, e, db, "ops_"+strings.ReplaceAll(form, "-", "_"))
	addColumns(t, e, db, table, "last_error", "priority", "enqueued_at", "dead.last_error")
	// The claim order's index: MySQL's SKIP LOCKED after a filesort
	// returns no row when the first in order is held.
	mustExec(t, e, db, "CREATE INDEX "+table+"_prio ON "+table+" (priority DESC, id)")
	return table
}

func opsDescription(table, form string) inbox.Table {
	tb := Table(table, form)
	tb.LastError, tb.Priority, tb.EnqueuedAt = "last_error", "priority", "enqueued_at"
	return tb
}

// TestLastError (issue 11): Retry and Dead write the error recorded with
// SetError, cut to MaxErrorText bytes at a character boundary; the next
// claim delivers it, the dead table keeps it, and a Retry without one keeps
// the row's.
func TestLastError(t *testing.T) {
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, 4)
		table := opsTable(t, e, db, form)
		clock := fakeclock.New(time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC))
		q := newQueue(t, db, queueConfig(e, opsDescription(table, form), clock))
		if err := q.CheckSchema(context.Background()); err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		enqueueOne(t, q, db, "a")
		d := claimOne(t, q)
		if d.LastError() != "" {
			t.Fatalf("a new job's last error is %q, want none", d.LastError())
		}
		long := strings.Repeat("é", inbox.MaxErrorText) // two bytes each: the cut falls inside one
		d.SetError(errors.New(long))
		if err := d.Retry(ctx, 0); err != nil {
			t.Fatal(err)
		}
		d = claimOne(t, q)
		want := long[:inbox.MaxErrorText]
		if got := d.LastError(); got != want {
			t.Fatalf("last error delivered: %d bytes, want the first %d of the text", len(got), len(want))
		}
		// A Retry recording nothing keeps the row's error.
		if err := d.Retry(ctx, 0); err != nil {
			t.Fatal(err)
		}
		d = claimOne(t, q)
		if d.LastError() != want {
			t.Fatalf("after a Retry without an error the last error is %d bytes, want the %d kept", len(d.LastError()), len(want))
		}
		d.SetError(errors.New("gave up: disk full"))
		if err := d.Dead(ctx); err != nil {
			t.Fatal(err)
		}
		var kept string
		if err := db.QueryRow("SELECT last_error FROM " + table + "_dead").Scan(&kept); err != nil {
			t.Fatal(err)
		}
		if kept != "gave up: disk full" {
			t.Fatalf("the dead table keeps %q, want the error recorded with Dead", kept)
		}
	})
}

// TestPriority (issue 11): claims take the highest priority first, then the
// oldest, in every form.
func TestPriority(t *testing.T) {
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, 6)
		table := opsTable(t, e, db, form)
		q := newQueue(t, db, queueConfig(e, opsDescription(table, form), nil))
		ctx := context.Background()
		var order []string
		for i, p := range []int{0, 5, 0, 9, 5} {
			payload := string(rune('a' + i))
			if _, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte(payload)}, Priority: p}); err != nil {
				t.Fatal(err)
			}
			order = append(order, payload)
		}
		want := []string{"d", "b", "e", "a", "c"} // 9, then 5 by age, then 0 by age
		var got []string
		for range order {
			d := opsClaimOne(t, q)
			got = append(got, payloadOf(t, d))
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if strings.Join(got, "") != strings.Join(want, "") {
			t.Fatalf("claimed in order %v, want %v", got, want)
		}
	})
}

// TestStats (issue 11): one call reads ready, waiting, in work, dead and the
// age of the oldest ready job; without Table.EnqueuedAt it names the column.
func TestStats(t *testing.T) {
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, 6)
		table := opsTable(t, e, db, form)
		clock := fakeclock.New(time.Now().UTC().Truncate(time.Second))
		q := newQueue(t, db, queueConfig(e, opsDescription(table, form), clock))
		ctx := context.Background()
		plain := newQueue(t, db, queueConfig(e, Table(table, form), clock))
		if _, err := plain.Stats(ctx); !errors.Is(err, inbox.ErrNoEnqueuedAt) || !strings.Contains(err.Error(), "Table.EnqueuedAt") {
			t.Fatalf("Stats without Table.EnqueuedAt = %v, want ErrNoEnqueuedAt naming the column", err)
		}
		for _, p := range []string{"a", "b", "c", "d"} {
			enqueueOne(t, q, db, p)
		}
		later := clock.Now().Add(time.Hour)
		if _, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte("later")}, NotBefore: later}); err != nil {
			t.Fatal(err)
		}
		clock.Advance(10 * time.Second)
		held := opsClaimOne(t, q)
		dead := opsClaimOne(t, q)
		if err := dead.Dead(ctx); err != nil {
			t.Fatal(err)
		}
		st, err := q.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := inbox.Stats{Ready: 2, Waiting: 1, InWork: 1, Dead: 1}
		switch {
		case form == "advisory" && !e.IsSQLite(), form == "rowlock" && e.Dialect == inbox.MySQL:
			want.InWork, want.Ready = -1, 3 // the engine cannot tell: the held job counts as ready
		}
		if st.Ready != want.Ready || st.Waiting != want.Waiting || st.InWork != want.InWork || st.Dead != want.Dead {
			t.Errorf("Stats = ready %d, waiting %d, in work %d, dead %d; want %d, %d, %d, %d",
				st.Ready, st.Waiting, st.InWork, st.Dead, want.Ready, want.Waiting, want.InWork, want.Dead)
		}
		// SQLite's julianday arithmetic keeps some microseconds.
		if st.OldestReady < 10*time.Second-time.Millisecond || st.OldestReady > 11*time.Second {
			t.Errorf("oldest ready job %v old, want the 10s the clock moved", st.OldestReady)
		}
		if err := held.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// opsClaimOne claims exactly one job.
func opsClaimOne(t testing.TB, q *inbox.Queue) *inbox.Delivery {
	t.Helper()
	ds, err := q.Claim(context.Background(), 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("claim: %d jobs, %v; want one", len(ds), err)
	}
	return ds[0]
}

// TestOpsSchemaCheck (issue 11): CheckSchema checks every optional column
// named, and on MySQL the row lock's priority index, reporting each
// missing one by its field.
func TestOpsSchemaCheck(t *testing.T) {
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, 4)
		table := newTable(t, e, db, "opscheck_"+form)
		// dead_at on the queue table is not the dead table's: the
		// schema files once added it there.
		at := "timestamptz"
		switch {
		case e.IsMySQL():
			at = "DATETIME(6)"
		case e.IsSQLite():
			at = "TEXT"
		}
		mustExec(t, e, db, "ALTER TABLE "+table+" ADD COLUMN dead_at "+at)
		desc := opsDescription(table, form)
		desc.DeadAt = "dead_at"
		q := newQueue(t, db, queueConfig(e, desc, nil))
		err := q.CheckSchema(context.Background())
		var se *inbox.SchemaError
		if !errors.As(err, &se) {
			t.Fatalf("CheckSchema = %v, want a *SchemaError", err)
		}
		all := strings.Join(se.Problems, "\n")
		for _, field := range []string{"Table.LastError", "Table.Priority", "Table.EnqueuedAt", "table " + table + "_dead has no column dead_at (Table.DeadAt)"} {
			if !strings.Contains(all, field) {
				t.Errorf("no problem names %s:\n%s", field, all)
			}
		}
		if e.IsMySQL() && form == "rowlock" {
			// With the columns but without the index.
			table := opsTable(t, e, db, "rowlock_noindex")
			mustExec(t, e, db, "DROP INDEX "+table+"_prio ON "+table)
			q := newQueue(t, db, queueConfig(e, opsDescription(table, form), nil))
			err := q.CheckSchema(context.Background())
			if !errors.As(err, &se) || len(se.Problems) != 1 || !strings.Contains(se.Problems[0], "no index on (priority DESC, id)") {
				t.Fatalf("MySQL row lock with a priority and no index: CheckSchema = %v, want the index named", err)
			}
		}
	})
}
