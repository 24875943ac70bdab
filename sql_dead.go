package inbox

import (
	"github.com/sqlinbox/inbox/dialect"
	"strconv"
	"strings"
)

// deadJobs writes the statements an operator's tools run: listing,
// requeueing and purging dead jobs, and cancelling a job that waits. They
// read the same on every engine but for the placeholders and the clock.
// returning is true for engines whose DELETE returns the rows it deleted
// (PostgreSQL, SQLite, MariaDB is left out with MySQL, whose statements it
// shares); rowSeek for engines that seek an index by a row-value comparison
// (PostgreSQL, SQLite), false for MySQL and MariaDB, whose planners also
// need the NULL dead_at rows asked for otherwise (below).
func deadJobs(t *dialect.Template, n *dialect.Names, st *Statements, returning, rowSeek bool) {
	st.Jobs.Cancel = t.Exec("DELETE FROM {table} WHERE {id} = $id")
	st.Jobs.Exists = t.Query("SELECT 1 FROM {table} WHERE {id} = $id")
	if n.Form == RowLock {
		// A claim holds its row's lock: SKIP LOCKED tells that row from a
		// waiting one without waiting for the holder.
		st.RowLock.CancelLock = t.Query("SELECT {id} FROM {table} WHERE {id} = $id FOR UPDATE SKIP LOCKED")
	}
	st.Jobs.RunNow = runNow(t, n)
	if n.Dead == "" {
		return
	}
	deadList(t, n, st, rowSeek)
	// Taking the dead row is the requeue's arbiter: of two operators
	// requeueing one job, one deletes it, the other finds nothing.
	if returning {
		st.Dead.Take = t.Query("DELETE FROM {dead} WHERE {id} = $id RETURNING {id}{, data}{, lastError}")
	} else {
		st.Dead.Take = t.Query("SELECT {id}{, data}{, lastError} FROM {dead} WHERE {id} = $id FOR UPDATE")
		st.Dead.TakeDelete = t.Exec("DELETE FROM {dead} WHERE {id} = $id")
	}
	// Ids are never reused: an id given to Enqueue is looked up here first,
	// one probe of the dead table's primary key.
	st.Dead.Has = t.Query("SELECT 1 FROM {dead} WHERE {id} = $id")
	st.Dead.Purge = t.Exec("DELETE FROM {dead}")
	if n.DeadAt != "" {
		st.Dead.PurgeBefore = t.Exec("DELETE FROM {dead} WHERE {deadAt} < $at")
	}
	if n.LastError != "" {
		st.Dead.RequeueError = t.Exec("UPDATE {table} SET {lastError} = $error WHERE {id} = $id")
	}
	deadBulk(t, n, st)
}

// deadList writes the statements that list the dead jobs a page at a time,
// newest death first.
func deadList(t *dialect.Template, n *dialect.Names, st *Statements, rowSeek bool) {
	cols := "{id}, {attempt}{, data}{, lastError}{, deadAt}"
	// Newest death first, on an index on (dead_at, id) or the primary key;
	// the next page starts past the last row listed, one index range.
	// PostgreSQL and SQLite seek a row-value comparison to that row. MariaDB
	// 10.11 reads it as a filter on the whole index from the newest death
	// (10,500 rows read for a page of 20 at depth 10,000); spelled out, it
	// is two ranges, dead_at < $at and dead_at = $at AND id < $id, which it
	// seeks (21 rows read). PostgreSQL would seek only the first and filter
	// the ties, so each engine gets its own spelling.
	if n.DeadAt == "" {
		st.Dead.List = t.Query("SELECT " + cols + " FROM {dead} ORDER BY {id} DESC LIMIT $limit")
		st.Dead.ListAfter = t.Query("SELECT " + cols + " FROM {dead} WHERE {id} < $id ORDER BY {id} DESC LIMIT $limit")
		return
	}
	deadListDated(t, n, st, cols, rowSeek)
}

// deadListDated is deadList where the dead table has a dead_at column.
func deadListDated(t *dialect.Template, n *dialect.Names, st *Statements, cols string, rowSeek bool) {
	past := "({deadAt}, {id}) < ($at, $id)"
	if !rowSeek {
		past = "{deadAt} <= $at AND ({deadAt} < $at OR {id} < $id)"
	}
	// A dead_at added to a table that held dead jobs leaves theirs
	// NULL: the oldest deaths, listed last. PostgreSQL's index gives
	// NULLs first in descending order and cannot serve NULLS LAST, and
	// a row comparison never passes a NULL, so a page is two seeks of
	// the index, each bounded by the limit (in derived tables, where
	// SQLite takes ORDER BY and LIMIT in a compound), merged by a sort
	// of at most twice the limit. The NULL rows are read in index
	// order only when PostgreSQL's ORDER BY names the whole key (its
	// planner takes IS NULL for no equality) and MariaDB's the id
	// alone; otherwise each sorts all of them. The derived tables name
	// the columns by position (c0 the id, the last one dead_at): a data
	// column may be the id, which they cannot hold twice.
	named := append([]string{"{id}", "{attempt}"}, n.Data...)
	if n.LastError != "" {
		named = append(named, "{lastError}")
	}
	named = append(named, "{deadAt}")
	as, pos := make([]string, len(named)), make([]string, len(named))
	for i, c := range named {
		pos[i] = "c" + strconv.Itoa(i)
		as[i] = c + " AS " + pos[i]
	}
	at := pos[len(pos)-1]
	order := at + " DESC, c0 DESC LIMIT $limit"
	byKey := " ORDER BY " + order
	nullsBy := " ORDER BY c0 DESC LIMIT $limit"
	if rowSeek {
		nullsBy = byKey
	}
	read := func(where, order string) string {
		return "SELECT * FROM (SELECT " + strings.Join(as, ", ") + " FROM {dead} WHERE " + where + order + ")"
	}
	page := func(dated string) string {
		return "SELECT " + strings.Join(pos, ", ") + " FROM (" + read(dated, byKey) + " AS dated UNION ALL " +
			read("{deadAt} IS NULL", nullsBy) + " AS undated) AS page ORDER BY (" + at + " IS NULL), " + order
	}
	st.Dead.List = t.Query(page("{deadAt} IS NOT NULL"))
	st.Dead.ListAfter = t.Query(page(past))
	// Past a NULL job, MariaDB 10.11 reads the NULL rows by dead_at
	// alone (ref) and filters the ids, all those newer than the cursor,
	// unless the primary key's range on the id is out of its choice:
	// then it seeks (dead_at, id) (20 rows read for a page of 20 at
	// depth 5,000, where it read 5,021).
	from := "{dead}"
	if !rowSeek {
		from = "{dead} IGNORE INDEX (PRIMARY)"
	}
	nullOrder := " ORDER BY {id} DESC LIMIT $limit"
	if rowSeek {
		nullOrder = " ORDER BY {deadAt} DESC, {id} DESC LIMIT $limit"
	}
	st.Dead.ListAfterNull = t.Query("SELECT " + cols + " FROM " + from + " WHERE {deadAt} IS NULL AND {id} < $id" + nullOrder)
}

// deadBulk writes the statements of the bulk tools: deleting one dead job,
// and counting and walking the dead jobs (all, or those dead before a
// time) for a requeue in batches. A batch is a seek of the primary key
// past the last id of the one before, so each batch reads its own rows
// however many were requeued already (each requeue leaves the table, but
// one that failed to, or a key that sorts ids as text, would be read again
// from the start). The dead_at filter reads the rows it skips: an
// operator's rare walk, not worth an index of its own.
func deadBulk(t *dialect.Template, n *dialect.Names, st *Statements) {
	st.Dead.Delete = t.Exec("DELETE FROM {dead} WHERE {id} = $id")
	st.Dead.Count = t.Query("SELECT COUNT(*) FROM {dead}")
	st.Dead.Batch = t.Query("SELECT {id} FROM {dead} ORDER BY {id} LIMIT $limit")
	st.Dead.BatchAfter = t.Query("SELECT {id} FROM {dead} WHERE {id} > $id ORDER BY {id} LIMIT $limit")
	if n.DeadAt != "" {
		st.Dead.CountOlder = t.Query("SELECT COUNT(*) FROM {dead} WHERE {deadAt} < $at")
		st.Dead.BatchOlder = t.Query("SELECT {id} FROM {dead} WHERE {deadAt} < $at ORDER BY {id} LIMIT $limit")
		st.Dead.BatchOlderAfter = t.Query("SELECT {id} FROM {dead} WHERE {deadAt} < $at AND {id} > $id ORDER BY {id} LIMIT $limit")
	}
}

// runNow writes Jobs.RunNow: the job waits when its time is beyond what a
// holder can have. Under the lease a holder's lease ends within a lease
// (a claim and every extension write now plus the lease), so only a lease
// ending beyond one is a retry delay that may be cleared; a holder's is
// left alone and its token stays whole. The other forms wait on the
// not-before column, which a claim never moves past now. Without one no
// job waits: the statement is empty.
func runNow(t *dialect.Template, n *dialect.Names) dialect.Stmt {
	switch {
	case n.Form == Lease:
		return t.Exec("UPDATE {table} SET {lease} = NULL WHERE {id} = $id AND {lease} > {until}")
	case n.NotBefore != "":
		return t.Exec("UPDATE {table} SET {notBefore} = NULL WHERE {id} = $id AND {notBefore} > {now}")
	}
	return dialect.Stmt{}
}
