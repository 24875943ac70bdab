package dbtest

import (
	"context"
	"strings"
	"testing"

	"github.com/sqlinbox/inbox"
)

// TestMissingColumnFails (issue 21 item 7): a description naming a column
// the table lacks makes every statement that reads it fail with an error
// naming the column, on every engine. SQLite reads a double-quoted name it
// cannot resolve as a string literal: with identifiers in double quotes the
// advisory claim delivered LastError() == "last_error" and Stats an oldest
// age of 0.
func TestMissingColumnFails(t *testing.T) {
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, 4)
		table := newTable(t, e, db, "missingcol_"+form)
		ctx := context.Background()
		plain := newQueue(t, db, queueConfig(e, Table(table, form), nil))
		for _, tc := range []struct {
			column string
			set    func(tb *inbox.Table)
		}{
			{"no_last_error", func(tb *inbox.Table) { tb.LastError = "no_last_error" }},
			{"no_priority", func(tb *inbox.Table) { tb.Priority = "no_priority" }},
			{"no_enqueued_at", func(tb *inbox.Table) { tb.EnqueuedAt = "no_enqueued_at" }},
			{"no_data", func(tb *inbox.Table) { tb.Data = []string{"payload", "no_data"} }},
		} {
			t.Run(tc.column, func(t *testing.T) {
				emptyTables(t, db, table)
				enqueueOne(t, plain, db, "p")
				tb := Table(table, form)
				tc.set(&tb)
				q := newQueue(t, db, queueConfig(e, tb, nil))
				ds, err := q.Claim(ctx, 5)
				for _, d := range ds {
					if tc.column == "no_last_error" {
						t.Errorf("claim delivered a job whose last error is %q", d.LastError())
					}
					_ = d.Release(ctx)
				}
				// A claim reads every column but the enqueue time.
				if tc.column != "no_enqueued_at" {
					wantNamed(t, "claim", err, tc.column)
				} else if err != nil {
					t.Errorf("claim: %v", err)
				}
				if tc.column != "no_data" && tc.column != "no_last_error" {
					_, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte("p")}})
					wantNamed(t, "enqueue", err, tc.column)
				}
				if tc.column == "no_enqueued_at" {
					st, err := q.Stats(ctx)
					if err == nil {
						t.Logf("stats: oldest ready %v", st.OldestReady)
					}
					wantNamed(t, "stats", err, tc.column)
				}
				emptyTables(t, db, table)
				mustBeIdle(t, db, plain, q)
			})
		}
	})
}

// wantNamed fails unless err is an error naming column.
func wantNamed(t *testing.T, what string, err error, column string) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), column) {
		t.Errorf("%s with a missing column %s: %v, want an error naming it", what, column, err)
	}
}
