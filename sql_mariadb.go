package inbox

import (
	"context"
	"database/sql"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"strconv"
	"strings"
)

// The optional interfaces of package dialect that mariadb has.
var (
	_ dialect.Locker           = mariadb{}
	_ dialect.LockWaiter       = mariadb{}
	_ dialect.TableIdentifier  = mariadb{}
	_ dialect.DeadlockDetector = mariadb{}
	_ dialect.BatchDialect     = mariadb{}
	_ dialect.BulkEnqueuer     = mariadb{}
	_ dialect.SchemaChecker    = mariadb{}
)

// MariaDB is the dialect of MariaDB 10.6 or later (SKIP LOCKED) through
// go-sql-driver/mysql: [MySQL]'s statements, times and locks, but a batched
// acknowledgement ([Queue.NewBatcher]) is one DELETE … RETURNING (MariaDB
// 10.5), sent on its own, which names the rows it deleted. [MySQL] serves
// MariaDB too; its batched Ack runs in a transaction whose rows affected is
// checked, as MySQL 8 has no RETURNING: two more round trips per batch, and
// the DELETE's locks held until the COMMIT. On MySQL every batched Ack of
// this dialect fails; [Queue.CheckSchema] reports a server that is not
// MariaDB.
//
// Batched Release and Retry are as [MySQL]'s: MariaDB's UPDATE has no
// RETURNING.
//
// Its lease and row-lock claims begin at the session's isolation level
// while their reads find it READ COMMITTED, sparing the SET TRANSACTION a
// claim otherwise sends first: put tx_isolation='READ-COMMITTED' in the
// DSN (go-sql-driver/mysql: tx_isolation=%27READ-COMMITTED%27).
//
// A row-lock claim of one on a table with a not-before column and no
// priority first reads the table by its primary key, skipping held rows,
// as a table without the column is claimed (ROWS EXAMINED bounds the
// delayed rows it passes), where [MySQL] reads a page through the
// not-before index and then locks it. A lease claim of one on a table with
// the claim index and no priority reads the free rows by primary key too
// (bounded the same way, past rows under a lease in force), where [MySQL]
// reads the claim index, whose entries every claim moves and every
// acknowledgement deletes.
var MariaDB Dialect = mariadb{}

type mariadb struct{ mysql }

func (mariadb) Name() string { return "mariadb" }

// BatchStatements are [MySQL]'s but for Ack, which returns the ids it
// deleted ([dialect.BatchDialect]): the batcher reads which tokens were still in
// place from its rows, so it needs no transaction and no Lock. A token
// whose id is not returned lost its lease; a row deleted by a token with
// the same id but another attempt or expiry cannot be, as the statement
// matches whole tokens.
//
// The tokens' rows are found by their primary key, as for myLeaseToken:
// MariaDB plans "(id, attempt, lease) IN (…)" as a range of the lease
// index, whose gap locks, outside a READ COMMITTED transaction, held every
// claim back until the batched Ack committed (0.4–0.55 of the hand-written
// loop at 4 and 16 workers, batches of 16). [MySQL]'s keeps the plain row:
// MySQL 8 searches a row-value IN by key only when the row holds nothing
// but columns.
func (d mariadb) BatchStatements(n *dialect.Names, size int) (*dialect.BatchStatements, error) {
	tokens := "({id}, {attempt}, COALESCE({lease})) IN (" + strings.TrimSuffix(strings.Repeat("($id, $attempt, $expiry), ", size), ", ") + ")"
	st, err := myBatchStatements(n, size, tokens)
	if err != nil {
		return nil, err
	}
	st.Ack.SQL += " RETURNING " + n.ID
	st.Ack.Rows = true
	return st, nil
}

// Statements are [MySQL]'s but for the advisory form's LockFirst (maLockFirst,
// sent while other processes hold keys), the row lock's WalkFirst
// (maWalkFirst) and PickFirst (maPickFirst), the lease's WalkFirst
// (maLeaseWalkFirst), the claim reads' level column (maLevelled) and InWork under the row lock: MariaDB has
// no performance_schema.data_locks (and its performance_schema is off by
// default), but the metadata_lock_info plugin lists the metadata locks
// held: a transaction that locked or wrote rows of the table holds a
// MDL_SHARED_WRITE on it until it ends (open claims, and settlements and
// enqueues in progress). Without the plugin (INSTALL SONAME
// 'metadata_lock_info') the view does not exist and in work is -1.
func (d mariadb) Statements(n *dialect.Names) (*Statements, error) {
	st, err := d.mysql.Statements(n)
	if err != nil {
		return st, err
	}
	if n.Form == Lease {
		if st.Claim.SelectFreeOne.SQL != "" {
			st.Claim.WalkFirst = maLeaseWalkFirst(myTemplate(n), n)
			st.Claim.WalkTake = maLeaseWalkTake(myTemplate(n), n)
		}
		return st, maLevelled(myTemplate(n), n, st)
	}
	if n.Form == Advisory {
		t := myTemplate(n)
		st.Advisory.LockFirst, st.Advisory.LockFirstAfter = maLockFirst(t, false), maLockFirst(t, true)
		// The statement costs the server twice a page read (its derived
		// tables and window): in one process the walk is faster.
		st.Advisory.LockFirstContended = true
		return st, nil
	}
	if st.Claim.Pick.SQL != "" {
		t := myTemplate(n)
		st.Claim.PickFirst = maPickFirst(t)
		if t.Fragment("priority") == "" {
			st.Claim.WalkFirst = maWalkFirst(t)
		}
	}
	if err := maLevelled(myTemplate(n), n, st); err != nil {
		return nil, err
	}
	st.Jobs.InWork = dialect.Stmt{SQL: "SELECT COUNT(DISTINCT THREAD_ID) FROM information_schema.METADATA_LOCK_INFO " +
		"WHERE LOCK_TYPE = 'Table metadata lock' AND LOCK_MODE = 'MDL_SHARED_WRITE' AND TABLE_SCHEMA = " + mySchemaLiteral(n) +
		" AND TABLE_NAME = '" + n.TableName + "'", Rows: true}
	return st, nil
}

// CheckSchema is [MySQL]'s, and also reports a server that is not MariaDB
// ([dialect.SchemaChecker]).
func (mariadb) CheckSchema(ctx context.Context, db *sql.DB, n *dialect.Names) ([]string, error) {
	return myCheckSchema(ctx, db, n, true)
}

// maLockFirst wraps a page of candidates so that the server tries each
// key's GET_LOCK in claim order and stops at the first it takes, as
// PostgreSQL's LockFirst does: across processes a claim then costs one
// statement where the walk from Go sent a GET_LOCK a key, most of them lost
// to another process. The page, ordered and limited, is materialized; the
// window numbering its rows sorts them in claim order (written out: with
// OVER () MariaDB sorts by the first column, which is not the claim order
// under priorities), they reach the outer filter one at a time in that
// order, and LIMIT 1 stops at the first that passes, so no key past it is
// tried (an ORDER BY outside would sort after filtering, trying every key,
// each taken a lock the claim would never let go). The filter passes a
// locked key or the page's last row (r = the page's size), so one read
// serves both answers LockFirst gives; the last column tells them apart by
// asking whether this session now holds that row's lock.
// The name is MySQLLockName's: "inbox_" and the first 16 bytes of SHA-256,
// in hex, over the identity, a zero byte and the key as text (NULL as the
// empty text, as keyString).
func maLockFirst(t *dialect.Template, after bool) dialect.Stmt {
	cols, order := "i, k, a", "i"
	page := "SELECT {id} AS i, {key} AS k, {attempt} AS a"
	if t.Fragment("priority") != "" {
		cols, order = cols+", p", "p DESC, i"
		page += ", {priority} AS p"
	}
	page += " FROM {table}"
	if after {
		page += " WHERE " + pastCandidate(t) + "{and ready}"
	} else {
		page += "{where ready}"
	}
	page += " ORDER BY {order} LIMIT $limit"
	name := "CONCAT('inbox_', LEFT(SHA2(CONCAT($identity, CHAR(0), COALESCE(CAST(k AS CHAR), '')), 256), 32))"
	return t.Query("SELECT " + cols + ", COALESCE(IS_USED_LOCK(n) = CONNECTION_ID(), 0)" +
		" FROM (SELECT " + cols + ", " + name + " AS n, ROW_NUMBER() OVER (ORDER BY " + order + ") AS r FROM (" + page + ") AS pg) AS c" +
		" WHERE GET_LOCK(n, 0) = 1 OR r = $limit LIMIT 1")
}

// maPickFirst is the row lock's pick in one statement, where [MySQL]'s
// sends Pick, then PickLock (two round trips of a claim's six): the page of
// candidates, read without locks in claim order as Pick reads it, is
// materialized and sorted, and STRAIGHT_JOIN makes it the outer table, so
// that each candidate's row is then read by primary key in claim order and
// LIMIT 1 stops at the first locked: rows others hold are skipped, rows
// past the first are never read, and a candidate no longer ready fails the
// filter, which under READ COMMITTED lets its lock go. The page's reads are
// not locking ones, and no sort follows the locking reads (which would
// keep every lock taken, as myRowLock explains). FORCE INDEX keeps the
// table's reads to its primary key: on a table of a few rows MariaDB
// otherwise scanned it into a join buffer, then sorted the join, locking
// every ready row (a claim of two then got one). With a priority the page
// carries it, and is sorted by it first.
func maPickFirst(t *dialect.Template) dialect.Stmt {
	cols, order := "{id} AS inbox_pick", "pg.inbox_pick"
	if t.Fragment("priority") != "" {
		cols, order = cols+", {priority} AS inbox_priority", "pg.inbox_priority DESC, pg.inbox_pick"
	}
	return t.Query("SELECT {id}, {attempt}{, data}{, extra} FROM (SELECT " + cols + " FROM {table}{where ready} ORDER BY {order} LIMIT $limit) AS pg" +
		" STRAIGHT_JOIN {table} FORCE INDEX (PRIMARY) ON {id} = pg.inbox_pick WHERE (COALESCE({notBefore}) IS NULL OR COALESCE({notBefore}) <= {now})" +
		" ORDER BY " + order + " LIMIT 1 FOR UPDATE SKIP LOCKED")
}

// maWalkExamined bounds the rows a WalkFirst reads and cannot claim
// before it gives up: past it, the claim pages through the not-before
// index instead (a head of jobs not yet ready, which the walk would read
// at every claim).
const maWalkExamined = 32

// maWalkFirst is the row lock's claim of one as a table without a
// not-before column has it: a locking read in primary-key order, which
// InnoDB answers from the head of the table, where PickFirst reads a page
// through the not-before index, materializes it and joins it back. A row
// others hold is skipped before the filter sees it, so held rows do not
// count against the bound; a row the filter refuses is unlocked under READ
// COMMITTED, except the last one read when the bound ends the statement
// (ROWS EXAMINED, MariaDB's: the statement returns what it found, here
// nothing, and a warning). FORCE INDEX keeps the read on the primary key,
// in order, with no sort to lock every row read.
func maWalkFirst(t *dialect.Template) dialect.Stmt {
	return t.Query("SELECT {id}, {attempt}{, data}{, extra} FROM {table} FORCE INDEX (PRIMARY){where ready}" +
		" ORDER BY {id} LIMIT 1 ROWS EXAMINED " + strconv.Itoa(maWalkExamined) + " FOR UPDATE SKIP LOCKED")
}

// maLeaseWalkFirst is the indexed lease's claim of one as the shallow
// table has it: a locking read of free rows in primary-key order, where
// Claim.SelectFreeOne reads them through the claim index. A locking read
// through a secondary index locks each entry and then its row, and the
// entries that claims and acknowledgements side by side have just moved
// or deleted stay in the index until purged, each checked by a visit to
// its row; the head of the primary key holds the few rows under lease
// in force, and rows others hold are skipped before the bound counts
// them. Past ROWS EXAMINED rows it could not claim (leases in force, a
// head of delayed jobs) it returns nothing and the claim reads the
// index, as it does for a span of claims after (a deep queue, where the
// index keeps the claim's cost flat). As SelectFreeOne, it returns no
// row while some lease has run out: those come first in claim order. A
// row the bound stopped on may stay locked until the claim commits, a
// few statements later. The check for a lease run out is one dive into
// the claim index; without that index it scans the table, whose rows then
// count against the bound, and the walk gives up on any table longer than
// it (the claim then reads as it would without the walk).
func maLeaseWalkFirst(t *dialect.Template, n *dialect.Names) dialect.Stmt {
	now, clock := "$now", ""
	if n.DBClock {
		now, clock = "UTC_TIMESTAMP(6)", ", UTC_TIMESTAMP(6)"
	}
	s := t.Query("SELECT {id}, {attempt}{, data}{, extra}" + clock + " FROM {table} FORCE INDEX (PRIMARY) WHERE {lease} IS NULL" +
		" AND (SELECT MAX({lease}) FROM {table} WHERE {lease} <= " + now + ") IS NULL" +
		" ORDER BY {id} LIMIT 1 ROWS EXAMINED " + strconv.Itoa(maWalkExamined) + " FOR UPDATE SKIP LOCKED")
	s.Clock = n.DBClock
	return s
}

// maLeaseWalkTake is maLeaseWalkFirst, the mark and the commit in one
// compound statement: one round trip where the claim from the client
// takes four (BEGIN, the walk, Claim.MarkOne, COMMIT), which at one job a
// claim is most of its cost. The row is read into local variables typed
// as its columns (TYPE OF), marked only if it still carries the attempt
// read and no lease (ROW_COUNT() must be 1, else nothing is returned), and
// returned from those variables after the COMMIT: what the client gets is
// what the claim's transaction read and wrote, never a later read. The
// table is aliased so that no column can be taken for a variable.
func maLeaseWalkTake(t *dialect.Template, n *dialect.Names) dialect.Stmt {
	now, until := "$now", "$until"
	if n.DBClock {
		now, until = "UTC_TIMESTAMP(6)", "inbox_now + INTERVAL $micros MICROSECOND"
	}
	cols := append([]string{}, n.Data...)
	if n.LastError != "" {
		cols = append(cols, "{lastError}")
	}
	var declare, vars strings.Builder
	for i, c := range cols {
		v := "inbox_c" + strconv.Itoa(i)
		declare.WriteString(" DECLARE " + v + " TYPE OF {table}." + c + ";")
		vars.WriteString(", " + v)
	}
	return t.Query("BEGIN NOT ATOMIC DECLARE inbox_id TYPE OF {table}.{id}; DECLARE inbox_attempt TYPE OF {table}.{attempt};" + declare.String() +
		" DECLARE inbox_now DATETIME(6) DEFAULT " + now + "; DECLARE inbox_until DATETIME(6) DEFAULT " + until + ";" +
		" DECLARE CONTINUE HANDLER FOR NOT FOUND SET inbox_id = NULL;" +
		" DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;" +
		" SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION;" +
		" SELECT j.{id}, j.{attempt}{, j.data}{, j.extra} INTO inbox_id, inbox_attempt" + vars.String() +
		" FROM {table} j FORCE INDEX (PRIMARY) WHERE j.{lease} IS NULL" +
		" AND (SELECT MAX(k.{lease}) FROM {table} k WHERE k.{lease} <= inbox_now) IS NULL" +
		" ORDER BY j.{id} LIMIT 1 ROWS EXAMINED " + strconv.Itoa(maWalkExamined) + " FOR UPDATE SKIP LOCKED;" +
		" IF inbox_id IS NOT NULL THEN UPDATE {table} j SET j.{attempt} = j.{attempt} + 1, j.{lease} = inbox_until" +
		" WHERE j.{id} = inbox_id AND j.{attempt} = inbox_attempt AND j.{lease} IS NULL;" +
		" IF ROW_COUNT() <> 1 THEN SET inbox_id = NULL; END IF; END IF;" +
		" COMMIT; SELECT inbox_id, inbox_attempt, inbox_until" + vars.String() + " FROM DUAL WHERE inbox_id IS NOT NULL; END")
}

// maLevel is the column a claim read of the lease or the row lock ends with
// ([dialect.Stmt.Level]): whether the session runs at READ COMMITTED, which
// a transaction begun without SET TRANSACTION runs at. Where the DSN (the
// session variable tx_isolation) or the server's default says READ
// COMMITTED, a claim then sends no SET TRANSACTION: a round trip of the
// five a claim of one costs, under either form. Inside a transaction begun
// after SET TRANSACTION the variable still names the session's level, so
// the core reads the column only in claims it began without one.
const maLevel = ", @@tx_isolation = 'READ-COMMITTED'"

// maLevelled appends maLevel to every claim read of a lease or row lock
// table, after the columns a claim scans (and the clock, where it reads
// one).
func maLevelled(t *dialect.Template, n *dialect.Names, st *Statements) error {
	cols := t.Query("SELECT {id}, {attempt}{, data}{, extra}").SQL
	for _, s := range []*dialect.Stmt{&st.Claim.Take, &st.Claim.Select, &st.Claim.SelectMore, &st.Claim.SelectMoreOne,
		&st.Claim.SelectFree, &st.Claim.SelectFreeOne, &st.Claim.PickLock, &st.Claim.PickFirst, &st.Claim.WalkFirst} {
		if s.SQL == "" {
			continue
		}
		head := cols
		if s.Clock {
			head += ", UTC_TIMESTAMP(6)"
		}
		if !strings.HasPrefix(s.SQL, head+" FROM ") {
			return fmt.Errorf("inbox: mariadb: claim read of %s does not begin %q: %s", n.Table, head, s.SQL)
		}
		s.SQL = head + maLevel + s.SQL[len(head):]
		s.Level = true
	}
	return nil
}
