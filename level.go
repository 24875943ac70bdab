package inbox

import (
	"database/sql"
	"errors"
	"github.com/sqlinbox/inbox/dialect"
)

// A claim's isolation level. The lease's and the row lock's claims run at
// READ COMMITTED: at MySQL's default, REPEATABLE READ, their locking reads
// also lock the gaps between the rows they read, which enqueues and other
// claims then wait on (under the row lock, while the handler runs).
// Setting the level costs a round trip on MySQL and MariaDB (SET
// TRANSACTION, then START TRANSACTION), one of the five a claim of one
// sends. A session may run at READ COMMITTED already, by its DSN or the
// server's default: where every claim read says whether it does
// (dialect.Stmt.Level, inbox.MariaDB), claims begin at the session's level
// and check; the first that finds another level rolls back, claims again
// at READ COMMITTED, and so does every claim of the queue after it.

// errOtherLevel is a claim begun at the session's level that found another
// than READ COMMITTED: rolled back, it is made again with the level set.
var errOtherLevel = errors.New("inbox: claim: the session's isolation level is not READ COMMITTED")

// claimReadsLevelled reports whether every claim read a table of form f
// sends carries the session's level, so that its claims may begin at it.
func claimReadsLevelled(f Form, st *Statements) bool {
	if f != Lease && f != RowLock {
		return false
	}
	c := st.Claim
	some := false
	for _, s := range []dialect.Stmt{c.Take, c.Select, c.SelectMore, c.SelectMoreOne, c.SelectFree, c.SelectFreeOne, c.PickLock, c.PickFirst, c.WalkFirst} {
		if s.SQL == "" {
			continue
		}
		if !s.Level {
			return false
		}
		some = true
	}
	return some
}

// claimTxOptions returns the options a claim's transaction begins with,
// and whether the claim must find its session at READ COMMITTED in the
// rows it reads (nil options: the session's own level).
func (q *Queue) claimTxOptions() (*sql.TxOptions, bool) {
	if q.levelled && !q.levelSet.Load() {
		return nil, true
	}
	return readCommitted, false
}

// readCommitted is the options of a claim that sets its level; database/sql
// only reads them.
var readCommitted = &sql.TxOptions{Isolation: sql.LevelReadCommitted}

// readAtOtherLevel reports whether a row of ds was read at another level
// than READ COMMITTED; if so, every later claim of q sets the level.
func (q *Queue) readAtOtherLevel(ds ...*Delivery) bool {
	for _, d := range ds {
		if d.otherLevel {
			q.levelSet.Store(true)
			return true
		}
	}
	return false
}
