package dbtest

// A batch's tokens compared exactly: PostgreSQL receives them as three
// array literals (ids, attempts, expiries), MySQL, MariaDB and SQLite as a
// parameter each; text ids with an array's punctuation and an expiry one
// microsecond off must be told apart in any session time zone.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/fakeclock"
)

// batchTokenIDs are text ids an array literal must quote or escape.
var batchTokenIDs = []string{`a"b`, `c\d`, `e,f`, `{g}`, `h i`, `NULL`, `ü`}

// zonedDSN is e's DSN with a session time zone of +05:45 (none on SQLite),
// so that a time read or written in the session's zone would be off.
func zonedDSN(t *testing.T, e Engine) string {
	dsn := e.DSN(t, t.TempDir())
	sep := "&"
	if !strings.Contains(dsn, "?") {
		sep = "?"
	}
	switch {
	case e.IsPostgres():
		return dsn + sep + "timezone=Asia%2FKathmandu"
	case e.IsMySQL():
		return dsn + sep + "time_zone=%27%2B05%3A45%27"
	}
	return dsn
}

func TestBatchTokensExact(t *testing.T) {
	for _, engineClock := range []bool{false, true} {
		name := "injected-clock"
		if engineClock {
			name = "engine-clock"
		}
		t.Run(name, func(t *testing.T) {
			eachEngine(t, func(e Engine) bool { return !engineClock || !e.IsSQLite() }, func(t *testing.T, e Engine) {
				batchTokensExact(t, e, engineClock)
			})
		})
	}
}

func batchTokensExact(t *testing.T, e Engine, engineClock bool) {
	db := e.OpenDSN(t, zonedDSN(t, e), 8)
	zone := map[bool]string{true: "SHOW TimeZone", false: "SELECT @@session.time_zone"}[e.IsPostgres()]
	var z string
	if !e.IsSQLite() {
		if err := db.QueryRow(zone).Scan(&z); err != nil || z != "Asia/Kathmandu" && z != "+05:45" {
			t.Fatalf("session time zone %q (%v), want +05:45", z, err)
		}
	}
	table := tableName(e, "batch_tokens")
	textIDTable(t, e, db, table)
	var clock *fakeclock.Clock
	if !engineClock {
		clock = fakeclock.New(clockStart)
	}
	q := newQueue(t, db, queueConfig(e, Table(table, "lease"), clock))
	ctx := context.Background()
	for _, id := range batchTokenIDs {
		if _, err := q.Enqueue(ctx, db, inbox.Job{ID: id, Data: []any{[]byte(id)}}); err != nil {
			t.Fatal(err)
		}
	}
	ds := batClaim(t, q, len(batchTokenIDs))
	// The first job's row moves a microsecond on: its token is stale by
	// the expiry alone, id and attempt still matching.
	stale := ds[0]
	mustExec(t, e, db, "UPDATE "+table+" SET locked_until = ? WHERE id = ?",
		e.Dialect.TimeArg(stale.Expiry().Add(time.Microsecond)), stale.ID())
	b, err := q.NewBatcher(inbox.BatchConfig{}) // the claim's jobs, one statement
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for i, err := range b.AckAll(ctx, ds) {
		switch {
		case ds[i] == stale && !errors.Is(err, inbox.ErrLeaseLost):
			t.Errorf("job %q, its expiry a microsecond off: %v, want ErrLeaseLost", ds[i].ID(), err)
		case ds[i] != stale && err != nil:
			t.Errorf("job %q: %v, want acknowledged", ds[i].ID(), err)
		}
	}
	var left string
	if err := db.QueryRow("SELECT id FROM " + table).Scan(&left); err != nil || left != stale.ID() {
		t.Fatalf("rows left:\n%s\nwant the stale job's alone (%v)", strings.Join(dumpRows(t, db, table), "\n"), err)
	}
}
