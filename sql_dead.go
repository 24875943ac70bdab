package inbox

// deadJobs writes the statements an operator's tools run: listing,
// requeueing and purging dead jobs, and cancelling a job that waits. They
// read the same on every engine but for the placeholders and the clock.
// returning is true for engines whose DELETE returns the rows it deleted
// (PostgreSQL, SQLite, MariaDB is left out with MySQL, whose statements it
// shares); rowSeek for engines that seek an index by a row-value comparison
// (PostgreSQL, SQLite).
func deadJobs(t *sqlTemplate, n *Names, st *Statements, returning, rowSeek bool) {
	st.Cancel = t.exec("DELETE FROM {table} WHERE {id} = $id")
	st.JobExists = t.query("SELECT 1 FROM {table} WHERE {id} = $id")
	if n.Form == RowLock {
		// A claim holds its row's lock: SKIP LOCKED tells that row from a
		// waiting one without waiting for the holder.
		st.CancelLock = t.query("SELECT {id} FROM {table} WHERE {id} = $id FOR UPDATE SKIP LOCKED")
	}
	if n.Dead == "" {
		return
	}
	cols := "{id}, {attempt}{, data}{, lastError}{, deadAt}"
	// Newest death first, on an index on (dead_at, id) or the primary key;
	// the next page starts past the last row listed, one index range.
	// PostgreSQL and SQLite seek a row-value comparison to that row. MariaDB
	// 10.11 reads it as a filter on the whole index from the newest death
	// (10,500 rows read for a page of 20 at depth 10,000); spelled out, it
	// is two ranges, dead_at < $at and dead_at = $at AND id < $id, which it
	// seeks (21 rows read). PostgreSQL would seek only the first and filter
	// the ties, so each engine gets its own spelling.
	order, past := "{id} DESC", "{id} < $id"
	if n.DeadAt != "" {
		order, past = "{deadAt} DESC, {id} DESC", "({deadAt}, {id}) < ($at, $id)"
		if !rowSeek {
			past = "{deadAt} <= $at AND ({deadAt} < $at OR {id} < $id)"
		}
	}
	st.DeadList = t.query("SELECT " + cols + " FROM {dead} ORDER BY " + order + " LIMIT $limit")
	st.DeadListAfter = t.query("SELECT " + cols + " FROM {dead} WHERE " + past + " ORDER BY " + order + " LIMIT $limit")
	// Taking the dead row is the requeue's arbiter: of two operators
	// requeueing one job, one deletes it, the other finds nothing.
	if returning {
		st.DeadTake = t.query("DELETE FROM {dead} WHERE {id} = $id RETURNING {id}{, data}{, lastError}")
	} else {
		st.DeadTake = t.query("SELECT {id}{, data}{, lastError} FROM {dead} WHERE {id} = $id FOR UPDATE")
		st.DeadTakeDelete = t.exec("DELETE FROM {dead} WHERE {id} = $id")
	}
	// Ids are never reused: an id given to Enqueue is looked up here first,
	// one probe of the dead table's primary key.
	st.DeadHas = t.query("SELECT 1 FROM {dead} WHERE {id} = $id")
	st.DeadPurge = t.exec("DELETE FROM {dead}")
	if n.DeadAt != "" {
		st.DeadPurgeBefore = t.exec("DELETE FROM {dead} WHERE {deadAt} < $at")
	}
	if n.LastError != "" {
		st.RequeueError = t.exec("UPDATE {table} SET {lastError} = $error WHERE {id} = $id")
	}
}
