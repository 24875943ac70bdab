package dbtest

import (
	"errors"
	"strings"
	"testing"

	"github.com/sqlinbox/inbox"
)

// TestCheckSchemaClaimsKey: the claims count is an upsert on the side
// table's id, which must be a key of its own. Without one PostgreSQL fails
// every claim and MySQL inserts a row per claim and never counts, so the
// schema check says so; with a primary key it finds nothing wrong.
func TestCheckSchemaClaimsKey(t *testing.T) {
	eachEngine(t, notSQLite, func(t *testing.T, e Engine) {
		db := e.Open(t, 4)
		table := newTable(t, e, db, "claimskey")
		tb := Table(table, "rowlock")
		tb.ClaimsTable, tb.MaxClaims = table+"_claims", 3
		q := newQueue(t, db, queueConfig(e, tb, nil))
		if err := checkUnchanged(t, e, db, q, table, table+"_claims"); err != nil {
			t.Fatalf("with the documented claims table: %v", err)
		}
		mustExec(t, e, db, "DROP TABLE "+table+"_claims")
		mustExec(t, e, db, "CREATE TABLE "+table+"_claims (id bigint NOT NULL, claims integer NOT NULL)")
		err := checkUnchanged(t, e, db, q, table, table+"_claims")
		var se *inbox.SchemaError
		if !errors.As(err, &se) || len(se.Problems) != 1 || !strings.Contains(se.Problems[0], "is not its primary key") {
			t.Fatalf("claims table without a key: CheckSchema = %v, want one problem naming the missing key", err)
		}
	})
}
