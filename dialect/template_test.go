package dialect

import (
	"reflect"
	"strings"
	"testing"
)

var names = &Names{Table: `"jobs"`, ID: `"id"`, Attempt: `"attempt"`, Data: []string{`"payload"`, `"kind"`},
	LockedUntil: `"locked_until"`, NotBefore: `"not_before"`, LastError: `"last_error"`}

// A template reads as the statement it becomes: fragments expand (the
// optional ones to nothing or to their SQL), parameters are numbered in
// the order written, and $^name names one again.
func TestTemplate(t *testing.T) {
	tm := NewTemplate(names, Dollar, "now()", "$until")
	got := tm.Exec("UPDATE {table} SET {lease} = {until}{, set error} WHERE {id} = $id AND {lease} > $^until{and ready}")
	want := `UPDATE "jobs" SET "locked_until" = $1, "last_error" = COALESCE($2, "last_error") WHERE "id" = $3 AND "locked_until" > $1` +
		` AND ("not_before" IS NULL OR "not_before" <= now())`
	if got.SQL != want || got.Rows {
		t.Errorf("Exec:\n got %s (rows %v)\nwant %s", got.SQL, got.Rows, want)
	}
	if wantArgs := []Arg{ArgUntil, ArgError, ArgID}; !reflect.DeepEqual(got.Args, wantArgs) {
		t.Errorf("Args = %v, want %v", got.Args, wantArgs)
	}
	q := NewTemplate(&Names{Table: "`jobs`", ID: "`id`", Attempt: "`attempt`"}, Question, "UTC_TIMESTAMP(6)", "$until").
		Query("SELECT {id}{, data}{, extra} FROM {table}{where ready} ORDER BY {order} LIMIT $limit")
	if q.SQL != "SELECT `id` FROM `jobs` ORDER BY `id` LIMIT ?" || !q.Rows || !q.Takes(ArgLimit) || q.Takes(ArgID) {
		t.Errorf("Query without optional columns: %+v", q)
	}
	if tm.Fragment(", j.data") != `, j."payload", j."kind"` || tm.Fragment("priority") != "" {
		t.Errorf("Fragment: %q, %q", tm.Fragment(", j.data"), tm.Fragment("priority"))
	}
}

// A mistake in a template panics with the template named, at the first
// statement built: an unknown fragment or parameter, or $^ where the
// placeholders are not numbered.
func TestTemplateMistakes(t *testing.T) {
	for _, c := range []struct {
		mark func(int) string
		tmpl string
		want string
	}{
		{Dollar, "SELECT {nope} FROM {table}", "unknown template fragment in {nope}"},
		{Dollar, "SELECT 1 WHERE x = $nope", "unknown template parameter in $nope"},
		{Question, "SELECT 1 WHERE a = $id AND b = $^id", "named again"},
		{Dollar, "SELECT 1 WHERE b = $^id", "named again"},
	} {
		func() {
			defer func() {
				r, _ := recover().(string)
				if !strings.Contains(r, c.want) {
					t.Errorf("%s: panic %q, want one containing %q", c.tmpl, r, c.want)
				}
			}()
			NewTemplate(names, c.mark, "now()", "$until").Query(c.tmpl)
		}()
	}
}

// For picks the first bounded claim at or above the limit, else the claim
// of one for one job, else Take.
func TestClaimFor(t *testing.T) {
	bounded := make([]Stmt, ClaimBounds)
	for i := range bounded {
		bounded[i] = Stmt{SQL: strings.Repeat("x", i+1)}
	}
	c := ClaimStatements{Take: Stmt{SQL: "take"}, TakeOne: Stmt{SQL: "one"}}
	if c.For(1).SQL != "one" || c.For(2).SQL != "take" {
		t.Errorf("without TakeBounded: For(1) %q, For(2) %q", c.For(1).SQL, c.For(2).SQL)
	}
	c.TakeBounded = bounded
	for max, want := range map[int]int{1: 1, 2: 2, 3: 3, 4: 3, 5: 4, 512: 10, 513: 11, 1000: 11} {
		if got := len(c.For(max).SQL); got != want {
			t.Errorf("For(%d) is bound %d, want %d", max, got, want)
		}
	}
}
