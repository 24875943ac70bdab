package inbox

import "github.com/sqlinbox/inbox/dialect"

// browseStatements write the job browser's statements (Statements.Browse),
// which read the same on every engine but for the clock: now and until are
// the SQL of the times a state is told by (PostgreSQL casts its parameter
// to compare; MySQL reads its clock first, as Stats does, so that now and
// until are one reading).
//
// Every page walks the primary key from the cursor (id below After, above
// Before) in its order, testing the state on each row, and stops at the
// limit: one index range however deep the page. A state that few rows have
// is found by walking past the others (the state's own index, on the lease
// or not-before column, is in the wrong order to page by id); an operator's
// page is rare enough for that, and the limit bounds the rows returned,
// not the rows read. OFFSET was rejected: it reads every row it skips.
//
// The state is written as the row tells it, as Stats counts it: under the
// lease a lease in force ending within a lease is in work, one ending
// beyond waits (a retry delay), and so does a row at its first attempt,
// never claimed (a not-before time within a lease); under the row lock and advisory forms the
// not-before time tells ready from waiting, and a held job reads ready
// (Queue.Job asks the row lock's lock; the advisory key's lock names no
// table: see docs/operations.md).
func browseStatements(t *dialect.Template, n *dialect.Names, now, until string) dialect.BrowseStatements {
	var b dialect.BrowseStatements
	state, when := "1", "NULL"
	ready, waiting, inWork := "", "", ""
	switch {
	case n.Form == Lease:
		state = "(CASE WHEN {lease} IS NULL OR {lease} <= " + now + " THEN 1 WHEN {lease} > " + until + " OR {attempt} = 1 THEN 2 ELSE 3 END)"
		when = "{lease}"
		ready = "({lease} IS NULL OR {lease} <= " + now + ")"
		waiting = "({lease} > " + until + " OR {lease} > " + now + " AND {attempt} = 1)"
		inWork = "{lease} > " + now + " AND {lease} <= " + until + " AND {attempt} <> 1"
	case n.NotBefore != "":
		state = "(CASE WHEN {notBefore} IS NULL OR {notBefore} <= " + now + " THEN 1 ELSE 2 END)"
		when = "{notBefore}"
		ready = "({notBefore} IS NULL OR {notBefore} <= " + now + ")"
		waiting = "{notBefore} > " + now
	}
	cols := "SELECT {id}, {attempt}, " + state + ", " + when + "{, data}{, lastError}{, priority}"
	if n.EnqueuedAt != "" {
		cols += ", {enqueuedAt}"
	}
	cols += " FROM {table}"
	list := func(cond string) dialect.BrowseList {
		and := func(seek string) string {
			if cond == "" {
				return " WHERE " + seek
			}
			return " WHERE " + seek + " AND " + cond
		}
		first := ""
		if cond != "" {
			first = " WHERE " + cond
		}
		return dialect.BrowseList{
			First:  t.Query(cols + first + " ORDER BY {id} DESC LIMIT $limit"),
			After:  t.Query(cols + and("{id} < $id") + " ORDER BY {id} DESC LIMIT $limit"),
			Before: t.Query(cols + and("{id} > $id") + " ORDER BY {id} LIMIT $limit"),
		}
	}
	b.All, b.Ready = list(""), list(ready)
	if waiting != "" {
		b.Waiting = list(waiting)
	}
	if inWork != "" {
		b.InWork = list(inWork)
	}
	b.Job = t.Query(cols + " WHERE {id} = $id")
	if n.Dead != "" {
		b.Dead = t.Query("SELECT {id}, {attempt}{, data}{, lastError}{, deadAt} FROM {dead} WHERE {id} = $id")
	}
	return b
}
