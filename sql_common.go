package inbox

import "github.com/sqlinbox/inbox/dialect"
import "strings"

// Statements that read the same on every engine, but for the placeholders
// and the clock the template fills in.

// Tokens: what a settlement checks before it changes a row. Lease: the
// whole ownership token. Advisory: the attempt, against a holder whose
// session was cut. Row lock: the id alone, as the held transaction is the
// fence.
const (
	leaseToken    = "{id} = $id AND {attempt} = $attempt AND {lease} = $expiry"
	advisoryToken = "{id} = $id AND {attempt} = $attempt"
	rowLockToken  = "{id} = $id"
)

// tokensIn compares size lease tokens as row values, "(id, attempt,
// expiry) IN ((…), …)", which engines with row-value IN lists plan as one
// primary-key probe per token. The n-th token's parameters are the n-th
// $id, $attempt and $expiry.
func tokensIn(size int) string {
	return "({id}, {attempt}, {lease}) IN (" + strings.TrimSuffix(strings.Repeat("($id, $attempt, $expiry), ", size), ", ") + ")"
}

// tokensOr is the same test as an OR of per-token conditions, for engines
// that search each disjunct by primary key but scan for a row-value IN
// (SQLite).
func tokensOr(size int) string {
	return strings.TrimSuffix(strings.Repeat("({id} = $id AND {attempt} = $attempt AND {lease} = $expiry) OR ", size), " OR ")
}

// Probes: whether a claim may find a job, in one statement without locks,
// for the idle Work loop. A row under a lease in force is the one row a
// claim cannot take that the probe can tell apart; rows another claim holds
// answer yes, and the claim then finds them taken.
const (
	leaseProbe   = "SELECT 1 FROM {table} WHERE {lease} IS NULL OR {lease} <= {now} LIMIT 1"
	rowLockProbe = "SELECT 1 FROM {table}{where ready} LIMIT 1"
)

// The control table's Resume and Read (Statements.Control), alike on
// every engine: one primary-key probe each. Resume keeps the row, so that
// the next Pause updates it in place.
const (
	controlResume = "UPDATE {control} SET paused_at = NULL, paused_by = NULL WHERE queue = $queue"
	controlRead   = "SELECT paused_at, paused_by FROM {control} WHERE queue = $queue"
)

// candidates are the advisory form's unlocked reads of claimable rows: id,
// key and attempt in id order, the first page and the pages after an id. The
// attempt lets the claim refuse a row that changed since it was read.
func candidates(t *dialect.Template) (first, after dialect.Stmt) {
	f, a := candidateTemplates(t)
	return t.Query(f), t.Query(a)
}

// candidateTemplates are the templates of candidates.
func candidateTemplates(t *dialect.Template) (first, after string) {
	return "SELECT {id}, {key}, {attempt}{, priority} FROM {table}{where ready} ORDER BY {order} LIMIT $limit",
		"SELECT {id}, {key}, {attempt}{, priority} FROM {table} WHERE " + pastCandidate(t) + "{and ready} ORDER BY {order} LIMIT $limit"
}

// pastCandidate is the condition of the rows past the candidate $id (and
// $priority) in the claim order: by priority, then id.
func pastCandidate(t *dialect.Template) string {
	if t.Fragment("priority") != "" {
		return "({priority} < $priority OR {priority} = $priority AND {id} > $id)"
	}
	return "{id} > $id"
}

// advisorySettlements are the advisory form's Ack, Release and (with a
// not-before column) Retry, each fenced by the attempt.
func advisorySettlements(t *dialect.Template, n *dialect.Names, st *Statements) {
	st.Settle.Ack = t.Exec("DELETE FROM {table} WHERE " + advisoryToken)
	st.Settle.Release = t.Exec("UPDATE {table} SET {attempt} = {attempt} - 1 WHERE " + advisoryToken)
	st.Settle.Retry = retryLater(t, n, advisoryToken)
}

// rowLockRetry is the row lock's Retry: the claim wrote nothing, so the
// Retry counts the attempt spent, with the not-before time and the error
// where the description has their columns.
func rowLockRetry(t *dialect.Template, n *dialect.Names) dialect.Stmt {
	delay := ""
	if n.NotBefore != "" {
		delay = ", {notBefore} = {until}"
	}
	return t.Exec("UPDATE {table} SET {attempt} = {attempt} + 1" + delay + "{, set error} WHERE " + rowLockToken)
}

// rowLockUndo sets the row lock's savepoint statements and Relock. The
// savepoint's name is the package's: a handler's own savepoints live
// inside it. Relock is fenced by the attempt, which only a committed Retry
// changes under the row lock: a job retried meanwhile is another
// delivery's. It waits for the row's lock (recordAnew says why), as long
// as bound allows: the SQL that ends the wait on the server, or a
// statement of its own taking the row where the engine's setting bounds
// it (InnoDB's innodb_lock_wait_timeout, 50 s by default).
func rowLockUndo(t *dialect.Template, st *Statements, relock string) {
	st.RowLock.Savepoint = t.Exec("SAVEPOINT inbox_attempt")
	st.RowLock.RollbackToSavepoint = t.Exec("ROLLBACK TO SAVEPOINT inbox_attempt")
	st.RowLock.Relock = t.Query(relock)
}

// retryLater is the advisory form's Retry: it writes the
// not-before time and, with Table.LastError, the error; empty when there is
// neither column, as a Retry then only commits or lets go.
func retryLater(t *dialect.Template, n *dialect.Names, token string) dialect.Stmt {
	switch {
	case n.NotBefore != "":
		return t.Exec("UPDATE {table} SET {notBefore} = {until}{, set error} WHERE " + token)
	case n.LastError != "":
		return t.Exec("UPDATE {table} SET {lastError} = COALESCE($error, {lastError}) WHERE " + token)
	}
	return dialect.Stmt{}
}

// deadCopy is the move to the dead table in two statements, run in one
// transaction: a copy with the delivered attempt, then the delete.
func deadCopy(t *dialect.Template, token string) (insert, del dialect.Stmt) {
	insert = t.Exec("INSERT INTO {dead} ({id}, {attempt}{, data}{, lastError}{, deadAt}) SELECT {id}, $delivered{, data}{, error}{, deadAt now} FROM {table} WHERE " + token)
	del = t.Exec("DELETE FROM {table} WHERE " + token)
	return insert, del
}

// enqueue builds the four inserts: plain, with an id, with a not-before
// time, with both. returning is false for engines without INSERT …
// RETURNING (MySQL), which read LastInsertId instead. With a notification
// channel (PostgreSQL) the insert notifies in the same statement: the
// notification is delivered when the job commits. clock is the engine's
// clock for the enqueue time, empty for the caller's.
func enqueue(st *Statements, n *dialect.Names, mark func(int) string, returning bool, clock string) {
	st.Jobs.Enqueue = enqueueRows(n, mark, returning, clock, 1, false, false)
	st.Jobs.EnqueueID = enqueueRows(n, mark, returning, clock, 1, true, false)
	if enqueueAtColumn(n) != "" {
		st.Jobs.EnqueueAt = enqueueRows(n, mark, returning, clock, 1, false, true)
		st.Jobs.EnqueueIDAt = enqueueRows(n, mark, returning, clock, 1, true, true)
	}
}

// enqueueAtColumn is the column a not-before time goes into: the lease
// column under the lease form, which delays a job the way it delays a
// retry, with an expiry; Table.NotBefore otherwise (empty: none).
func enqueueAtColumn(n *dialect.Names) string {
	if n.Form == Lease {
		return n.LockedUntil
	}
	return n.NotBefore
}

// enqueueRows is the insert of rows jobs in one statement, as enqueue
// describes it, each row's parameters in the same order, row after row
// ([dialect.BulkEnqueuer]). The column lists vary with the description, so it is
// written column by column.
func enqueueRows(n *dialect.Names, mark func(int) string, returning bool, clock string, rows int, withID, withAt bool) dialect.Stmt {
	s := dialect.NewBuilder(mark)
	var cols []string
	tuples := make([]string, 0, rows)
	for r := 0; r < rows; r++ {
		cols = cols[:0]
		var vals []string
		if withID {
			cols, vals = append(cols, n.ID), append(vals, s.Param(dialect.ArgID))
		}
		for i, c := range n.Data {
			cols, vals = append(cols, c), append(vals, s.Param(dialect.ArgData+dialect.Arg(i)))
		}
		if withAt {
			cols, vals = append(cols, enqueueAtColumn(n)), append(vals, s.Param(dialect.ArgNotBefore))
		}
		if n.Priority != "" {
			cols, vals = append(cols, n.Priority), append(vals, s.Param(dialect.ArgPriority))
		}
		if n.UniqueKey != "" {
			cols, vals = append(cols, n.UniqueKey), append(vals, s.Param(dialect.ArgUniqueKey))
		}
		if n.EnqueuedAt != "" {
			now := clock // the engine's, or the caller's passed as a parameter
			if now == "" {
				now = s.Param(dialect.ArgNow)
			}
			cols, vals = append(cols, n.EnqueuedAt), append(vals, now)
		}
		tuples = append(tuples, "("+strings.Join(vals, ", ")+")")
	}
	insert := "INSERT INTO " + n.Table + " (" + strings.Join(cols, ", ") + ") VALUES " + strings.Join(tuples, ", ")
	if len(cols) == 0 {
		// Nothing to name: one row of defaults (the core sends a statement
		// per job for such a table, as SQLite takes no DEFAULT in VALUES).
		insert = "INSERT INTO " + n.Table + " DEFAULT VALUES"
	}
	if returning && n.UniqueKey != "" {
		// An engine that returns rows says "held" by returning none.
		insert += " ON CONFLICT (" + n.UniqueKey + ") DO NOTHING"
	}
	if returning {
		insert += " RETURNING " + n.ID
	}
	if n.NotifyChannel != "" {
		// pg_notify in FROM runs once per statement, whatever the rows.
		insert = "WITH j AS (" + insert + ") SELECT j." + n.ID + " FROM j CROSS JOIN pg_notify('" + n.NotifyChannel + "', '') AS n"
	}
	s.Write(insert)
	return s.Stmt(returning)
}

// statsDead counts the dead table, -1 without one.
func statsDead(n *dialect.Names) string {
	if n.Dead == "" {
		return "-1"
	}
	return "(SELECT COUNT(*) FROM {dead})"
}

// statsCounts are the Stats columns but the age: ready by time, waiting,
// and in work (inWork, an expression), each an indexed count. Under the
// lease a lease ending within a lease is in work only past the first
// attempt: a claim counts the attempt as it takes the job, so a row still
// at 1 was never claimed (a short not-before time), as Replace tells. The
// rows of that range are read for their attempt; they are the jobs in
// work and the short delays, few.
func statsCounts(n *dialect.Names, now, until, inWork string) string {
	if n.Form == Lease {
		near := "{lease} > " + now + " AND {lease} <= " + until
		return "(SELECT COUNT(*) FROM {table} WHERE {lease} IS NULL) + (SELECT COUNT(*) FROM {table} WHERE {lease} <= " + now + "), " +
			"(SELECT COUNT(*) FROM {table} WHERE {lease} > " + until + ") + (SELECT COUNT(*) FROM {table} WHERE " + near + " AND {attempt} = 1), " +
			"(SELECT COUNT(*) FROM {table} WHERE " + near + " AND {attempt} <> 1), " + statsDead(n)
	}
	if n.NotBefore == "" {
		return "(SELECT COUNT(*) FROM {table}), 0, " + inWork + ", " + statsDead(n)
	}
	return "(SELECT COUNT(*) FROM {table} WHERE {notBefore} IS NULL) + (SELECT COUNT(*) FROM {table} WHERE {notBefore} <= " + now + "), " +
		"(SELECT COUNT(*) FROM {table} WHERE {notBefore} > " + now + "), " + inWork + ", " + statsDead(n)
}

// statsOldest is the oldest enqueue time of a ready job, from the two
// ordered index reads a ready row can come from (none: NULL), each the
// first entry of an index on the enqueue time; least picks the older where
// NULLs are ignored (coalesced around an engine's LEAST that is not).
func statsOldest(n *dialect.Names, now string) (free, due string) {
	if n.EnqueuedAt == "" {
		return "NULL", "NULL"
	}
	col := "{lease}"
	if n.Form != Lease {
		if n.NotBefore == "" {
			return "(SELECT MIN({enqueuedAt}) FROM {table})", "NULL"
		}
		col = "{notBefore}"
	}
	return "(SELECT MIN({enqueuedAt}) FROM {table} WHERE " + col + " IS NULL)",
		"(SELECT MIN({enqueuedAt}) FROM {table} WHERE " + col + " <= " + now + ")"
}

// verdictRead is the lease and advisory forms' Verdict: the row's attempt
// and (lease) expiry, a plain read. The package sends it only once no
// statement of the settlement can still be running (after an extension by
// the token found none, on the advisory session, under the advisory lock),
// and must pass a caller's transaction still open, not wait for it. Empty
// under the row lock, whose settlement ends in its own transaction.
func verdictRead(t *dialect.Template, n *dialect.Names) dialect.Stmt {
	switch n.Form {
	case Lease:
		return t.Query("SELECT {attempt}, {lease} FROM {table} WHERE {id} = $id")
	case Advisory:
		return t.Query("SELECT {attempt} FROM {table} WHERE {id} = $id")
	}
	return dialect.Stmt{}
}

// uniqueStatements are the unique key's (Statements.Unique), when the
// description names one. With separate, Replace updates by id alone and
// ReplaceLock locks the row first, its condition checked there (MySQL,
// which counts only changed rows as affected and cannot lock its own
// table in an UPDATE's subquery); otherwise Replace holds the condition,
// the row lock's a lock taken without waiting.
func uniqueStatements(t *dialect.Template, n *dialect.Names, separate bool) dialect.UniqueStatements {
	if n.UniqueKey == "" {
		return dialect.UniqueStatements{}
	}
	find := "SELECT {id}, {attempt} FROM {table} WHERE {unique} = $unique"
	set, cond := "{id} = {id}", ""
	switch n.Form {
	case dialect.Lease:
		find, set = "SELECT {id}, {attempt} FROM {table} WHERE {unique} = $unique", "{lease} = $at"
		cond = " AND ({attempt} = 1 OR {lease} IS NULL OR {lease} <= {now})"
	case dialect.Advisory:
		find, cond = "SELECT {id}, {attempt}, {key} FROM {table} WHERE {unique} = $unique", " AND {attempt} = $attempt"
	}
	if n.NotBefore != "" {
		set = "{notBefore} = $at"
	}
	u := dialect.UniqueStatements{Find: t.Query(find)}
	update := "UPDATE {table} SET " + set + "{, set data} WHERE {id} = $id"
	switch {
	case separate && n.Form == dialect.RowLock:
		u.ReplaceLock = t.Query("SELECT {id} FROM {table} WHERE {id} = $id FOR UPDATE SKIP LOCKED")
		u.Replace = t.Exec(update)
	case separate:
		u.ReplaceLock = t.Query("SELECT {id} FROM {table} WHERE {id} = $id" + cond + " FOR UPDATE")
		u.Replace = t.Exec(update)
	case n.Form == dialect.RowLock:
		u.Replace = t.Exec("UPDATE {table} SET " + set + "{, set data} WHERE {id} = (SELECT {id} FROM {table} WHERE {id} = $id FOR UPDATE SKIP LOCKED)")
	default:
		u.Replace = t.Exec(update + cond)
	}
	return u
}
