package dbtest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/sqlinbox/inbox"
)

// TestUsersNullPriority: a priority column added without NOT NULL DEFAULT
// 0 after rows existed (NULL in them) is a problem CheckSchema reports,
// naming the fix, on every engine and form, the table named qualified.
// Applied (the NULLs set to 0, the column declared NOT NULL DEFAULT 0,
// its index made), the check passes and the job of highest priority is
// claimed first. Before: the check passed and every claim meeting a NULL
// failed to read it, on PostgreSQL (NULLs first in DESC) every claim.
func TestUsersNullPriority(t *testing.T) {
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		ctx := context.Background()
		db := e.Open(t, 4)
		table := newTable(t, e, db, "unp_"+form)
		old := newQueue(t, db, queueConfig(e, Table(table, form), nil))
		for i := 0; i < 2; i++ {
			if _, err := old.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte(fmt.Sprint("old-", i))}}); err != nil {
				t.Fatal(err)
			}
		}
		mustExec(t, e, db, "ALTER TABLE "+table+" ADD COLUMN priority integer")
		tb := Table(concQualified(t, e, db, table), form)
		tb.Priority = "priority"
		q := newQueue(t, db, queueConfig(e, tb, nil))
		err := q.CheckSchema(ctx)
		var se *inbox.SchemaError
		if !errors.As(err, &se) || !strings.Contains(err.Error(), `Table.Priority "priority" accepts NULL`) ||
			!strings.Contains(err.Error(), "SET priority = 0 WHERE priority IS NULL") {
			t.Fatalf("CheckSchema = %v, want the NULL priority named with its fix", err)
		}
		if e.IsSQLite() {
			return // SQLite alters no column's constraint: the table is rebuilt
		}
		mustExec(t, e, db, "UPDATE "+table+" SET priority = 0 WHERE priority IS NULL")
		if e.IsPostgres() {
			mustExec(t, e, db, "ALTER TABLE "+table+" ALTER COLUMN priority SET DEFAULT 0, ALTER COLUMN priority SET NOT NULL")
		} else {
			mustExec(t, e, db, "ALTER TABLE "+table+" MODIFY priority integer NOT NULL DEFAULT 0")
		}
		mustExec(t, e, db, "CREATE INDEX "+table+"_prio ON "+table+" (priority DESC, id)")
		if err := q.CheckSchema(ctx); err != nil {
			t.Fatalf("CheckSchema after the fix: %v", err)
		}
		if _, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte("high")}, Priority: 5}); err != nil {
			t.Fatal(err)
		}
		ds, err := q.Claim(ctx, 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("claim: %d, %v", len(ds), err)
		}
		defer ds[0].Release(ctx)
		if ds[0].Priority() != 5 {
			t.Errorf("claimed first priority %d, want the job of 5", ds[0].Priority())
		}
	})
}
