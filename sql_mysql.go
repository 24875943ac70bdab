package inbox

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"strconv"
	"strings"
	"time"
)

// The optional interfaces of package dialect that mysql has.
var (
	_ dialect.Locker            = mysql{}
	_ dialect.LockWaiter        = mysql{}
	_ dialect.TableIdentifier   = mysql{}
	_ dialect.DeadlockDetector  = mysql{}
	_ dialect.DuplicateDetector = mysql{}
	_ dialect.BatchDialect      = mysql{}
	_ dialect.BulkEnqueuer      = mysql{}
	_ dialect.SchemaChecker     = mysql{}
)

// MySQL is the dialect of MySQL 8 and MariaDB 10.6 or later (SKIP LOCKED)
// through go-sql-driver/mysql, with or without parseTime. Times are
// DATETIME(6) in UTC; the engine's clock is UTC_TIMESTAMP(6), never the
// session-zoned NOW(). UPDATE cannot return what it wrote, so the queue reads
// the clock first (Statements.Now; a lease claim's reads return it with
// their rows) and writes the times it computed. On MariaDB, [MariaDB] saves
// a batched Ack its transaction.
var MySQL Dialect = mysql{}

// mysqlTime is how times go to the server: text it reads as DATETIME(6)
// whatever the connection's time zone or parseTime setting.
const mysqlTime = "2006-01-02 15:04:05.000000"

type mysql struct{}

func (mysql) Name() string { return "mysql" }

func (mysql) QuoteIdent(s string) (string, error) {
	return "`" + strings.ReplaceAll(s, "`", "``") + "`", nil
}

// mysqlLayout reads DATETIME text with or without fractional seconds.
const mysqlLayout = "2006-01-02 15:04:05.999999"

func (mysql) TimeArg(t time.Time) any { return t.UTC().Format(mysqlTime) }

func (mysql) ScanTime(src any) (time.Time, error) {
	switch s := src.(type) {
	case time.Time:
		// parseTime=true: the driver read the UTC wall clock in its loc.
		return time.Date(s.Year(), s.Month(), s.Day(), s.Hour(), s.Minute(), s.Second(), s.Nanosecond(), time.UTC), nil
	case []byte:
		return time.Parse(mysqlLayout, string(s))
	case string:
		return time.Parse(mysqlLayout, s)
	}
	return time.Time{}, fmt.Errorf("mysql: time column returned %T", src)
}

// claimMarkIDs is how many ids one lease Claim.Mark takes.
const claimMarkIDs = 16

// myPickIDs are the candidates one PickLock names: enough to pass the jobs
// a few dozen workers hold at the head of the queue in one read, a range
// of primary-key probes.
var myPickIDs = strings.TrimSuffix(strings.Repeat("$id, ", 32), ", ")

func (mysql) Statements(n *dialect.Names) (*Statements, error) {
	if n.NotifyChannel != "" {
		return nil, fmt.Errorf("Config.NotifyChannel %q: MySQL has no notifications; idle workers of other processes find jobs by polling", n.NotifyChannel)
	}
	t := myTemplate(n)
	var st *Statements
	switch n.Form {
	case Lease:
		st = myLease(t, n)
	case RowLock:
		st = myRowLock(t, n)
	case Advisory:
		st = myAdvisory(t, n)
	}
	if n.DBClock {
		st.Now = t.Query("SELECT UTC_TIMESTAMP(6)")
	}
	enqueue(st, n, dialect.Question, false, myEnqueueClock(n))
	st.Unique = uniqueStatements(t, n, true)
	// MySQL has no DELETE … RETURNING (MariaDB has, but shares these).
	deadJobs(t, n, st, false, false)
	// In work is counted in this statement under the lease form alone; the
	// row lock's comes from the server's lock tables apart (InWork), which
	// may be missing or not granted. The clock is read first.
	free, due := statsOldest(n, "$now")
	st.Jobs.Stats = t.Query("SELECT " + statsCounts(n, "$now", "$until", "-1") +
		", TIMESTAMPDIFF(MICROSECOND, COALESCE(LEAST(" + free + ", " + due + "), " + free + ", " + due + "), $now)")
	if n.Form == RowLock {
		// MySQL 8 lists every InnoDB lock in performance_schema.data_locks:
		// a transaction that locked or wrote rows of the table holds an IX
		// lock on it (open claims, and settlements and enqueues in
		// progress). With performance_schema off the view is empty, which
		// is not "none": -1. MariaDB has no data_locks (its dialect reads
		// metadata locks instead). The advisory form's GET_LOCK names are
		// hashes of table and key: the server cannot tell which are this
		// table's without hashing every row's key.
		st.Jobs.InWork = t.Query("SELECT CASE WHEN @@performance_schema = 1 THEN (SELECT COUNT(DISTINCT ENGINE_TRANSACTION_ID) " +
			"FROM performance_schema.data_locks WHERE OBJECT_SCHEMA = " + mySchemaLiteral(n) + " AND OBJECT_NAME = '" + n.TableName +
			"' AND LOCK_TYPE = 'TABLE' AND LOCK_MODE = 'IX' AND LOCK_STATUS = 'GRANTED') ELSE -1 END")
	}
	// The browser's states, told by one reading of the clock (as Stats).
	st.Browse = browseStatements(t, n, "$now", "$until")
	st.Settle.Verdict = verdictRead(t, n)
	st.Control = myControl(t, n)
	return st, nil
}

// myTemplate is the template of MySQL's statements. Conditions only
// compare, so they read the engine's clock in place. UPDATE cannot return
// what it wrote: a time that becomes a token is computed from a reading
// taken first (Now) and written as $until.
func myTemplate(n *dialect.Names) *dialect.Template {
	now := "UTC_TIMESTAMP(6)"
	if !n.DBClock {
		now = "$now"
	}
	return dialect.NewTemplate(n, dialect.Question, now, "$until")
}

// mySchemaLiteral is the table's database as an SQL expression: the
// qualifier as a string (identifiers are letters, digits and underscores:
// nothing to escape) or the connection's database.
func mySchemaLiteral(n *dialect.Names) string {
	if n.Schema == "" {
		return "DATABASE()"
	}
	return "'" + n.Schema + "'"
}

// myLease: without UPDATE … RETURNING the claim locks its rows with a
// SELECT in a READ COMMITTED transaction, then writes their leases.
func myLease(t *dialect.Template, n *dialect.Names) *Statements {
	st := &Statements{}
	myLeaseClaim(t, n, st)
	// One UPDATE writes the leases of up to claimMarkIDs rows; a claim of
	// fewer repeats its last row, which changes nothing twice. It writes a
	// row only if the row still has the attempt the SELECT read and is still
	// claimable: the SELECT's lock is real on one server, but on a Galera
	// node it is local, and a row read there may since have been claimed
	// through another node, whose writeset the UPDATE then sees.
	st.Claim.Mark = t.Exec("UPDATE {table} SET {attempt} = {attempt} + 1, {lease} = $until WHERE ({id}, {attempt}) IN (" +
		strings.Repeat("($id, $delivered), ", claimMarkIDs-1) + "($id, $delivered)) AND ({lease} <= $now OR {lease} IS NULL)")
	// A claim of one names its row by equality: the list's sixteen places
	// cost the server more than the one row's write.
	st.Claim.MarkOne = t.Exec("UPDATE {table} SET {attempt} = {attempt} + 1, {lease} = $until WHERE {id} = $id AND {attempt} = $delivered AND ({lease} <= $now OR {lease} IS NULL)")
	// When the mark changed fewer rows than it named, the rows carrying its
	// expiry are the claim's.
	// An idle loop asks first: the claim is a transaction of five
	// statements, the probe one.
	st.Jobs.Probe = t.Query(leaseProbe)
	st.Claim.Marked = t.Query("SELECT {id} FROM {table} WHERE {id} IN (" +
		strings.Repeat("$id, ", claimMarkIDs-1) + "$id) AND {lease} = $until")
	st.Settle.Extend = t.Exec("UPDATE {table} SET {lease} = $until WHERE " + myLeaseToken)
	st.Settle.Retry = t.Exec("UPDATE {table} SET {lease} = $until{, set error} WHERE " + myLeaseToken)
	// MySQL reports changed rows, not matched ones: a write of the expiry a
	// row already holds is confirmed by counting the token.
	st.Settle.Exists = t.Query("SELECT COUNT(*) FROM {table} WHERE " + myLeaseToken)
	st.Settle.Ack = t.Exec("DELETE FROM {table} WHERE " + myLeaseToken)
	st.Settle.Release = t.Exec("UPDATE {table} SET {lease} = NULL, {attempt} = {attempt} - 1 WHERE " + myLeaseToken)
	if n.Dead != "" {
		st.Settle.Dead, st.Settle.DeadDelete = deadCopy(t, myLeaseToken)
	}
	return st
}

// myLeaseClaim writes the lease form's claim reads.
func myLeaseClaim(t *dialect.Template, n *dialect.Names, st *Statements) {
	// Rows whose lease ran out (a crashed holder, a retry delay) and free
	// rows are read apart, each an ordered, limited read of the index on
	// (lease, id), so that a head of rows under lease in force is never
	// walked; SKIP LOCKED lets concurrent claims pass each other's rows. The
	// due rows come first, then free rows fill the places left: two reads,
	// not a UNION, whose temporary table MariaDB 10.11 was seen to crash on
	// (signal 11 in create_tmp_table's failure path) under load.
	//
	// Under the engine's clock each read returns it too, constant within a
	// statement, so that the claim reads no clock apart: the lease is
	// computed from the first reading that came with rows.
	//
	// The due rows are read backwards, the most recently expired first. A
	// locking range read that runs out of rows before its LIMIT (as a read
	// of due rows nearly always does) also locks the first index entry past
	// its range, until the claim commits: MariaDB 10.11 does so under READ
	// COMMITTED too. Read forwards, that entry is the lease in force that
	// ends first, whose holder's Ack, Extend or Retry then waits for the
	// claim, and concurrent claims lock the next ones (measured: 0.5 lock
	// waits per batch of 16 at 4 workers, on the acknowledgements). Read
	// backwards, it is the newest free row's, which no settlement touches
	// and which other claims step over (SKIP LOCKED) or their free read
	// stops before (an equality range ends without a lock).
	now, clock := "$now", ""
	if n.DBClock {
		now, clock = "UTC_TIMESTAMP(6)", ", UTC_TIMESTAMP(6)"
	}
	//
	// With a priority the due rows are sorted by it, and a locking read
	// that sorts locks every row it read, returned or not, until the claim
	// commits: 40 locks for a claim of one among 20 due rows, which the
	// concurrent claims then step over, taking jobs of lower priority. The
	// claim then picks (Statements.Claim.Pick): the due rows and the free ones
	// are read without locks, in claim order, and the best are locked by
	// primary key, in id order among rows of one priority, each read
	// locking only the rows it returns.
	if n.Shallow {
		myShallowClaim(t, n, st, now, clock)
	} else if n.Priority != "" {
		past := pastCandidate(t)
		st.Claim.Pick = t.Query("SELECT {pick} FROM {table} WHERE {lease} <= " + now + " ORDER BY {order} LIMIT $limit")
		st.Claim.PickAfter = t.Query("SELECT {pick} FROM {table} WHERE {lease} <= " + now + " AND " + past + " ORDER BY {order} LIMIT $limit")
		st.Claim.PickMore = t.Query("SELECT {pick} FROM {table} WHERE {lease} IS NULL ORDER BY {order} LIMIT $limit")
		st.Claim.PickMoreAfter = t.Query("SELECT {pick} FROM {table} WHERE {lease} IS NULL AND " + past + " ORDER BY {order} LIMIT $limit")
		st.Claim.PickLock = t.Query("SELECT {id}, {attempt}{, data}{, extra}" + clock + " FROM {table} WHERE {id} IN (" + myPickIDs +
			") AND (COALESCE({lease}) IS NULL OR COALESCE({lease}) <= " + now + ") ORDER BY {id} LIMIT $limit FOR UPDATE SKIP LOCKED")
		st.Claim.PickLock.Clock = n.DBClock
	} else {
		myIndexedClaim(t, st, now, clock, n.DBClock)
	}
}

// myIndexedClaim writes the claim reads of a lease table with the claim
// index and no priority.
func myIndexedClaim(t *dialect.Template, st *Statements, now, clock string, dbClock bool) {
	st.Claim.Select = t.Query("SELECT {id}, {attempt}{, data}{, extra}" + clock + " FROM {table} WHERE {lease} <= " + now + " ORDER BY {lease} DESC, {id} DESC LIMIT $limit FOR UPDATE SKIP LOCKED")
	// A claim of several locks its free rows through the primary key,
	// from the lowest free id on (read without a lock by the subquery,
	// once, through the claim index). A locking read through a
	// secondary index locks each entry and then its row, and InnoDB
	// checks who holds an entry by visiting its row: claims of 16 side
	// by side, each stepping over the others' entries, ran at 0.4-0.6
	// of the minimal queue on MariaDB, and at 0.6-0.85 through the
	// primary key. A claim of one steps over few, and the subquery
	// and the primary key's unpurged rows cost it more than they save
	// (16 claims of one side by side: 0.8 of the index read).
	// inbox.MariaDB's claim of one walks from the head of the primary key
	// instead, without the subquery, bounded (maLeaseWalkFirst).
	rows := "SELECT {id}, {attempt}{, data}{, extra}" + clock + " FROM {table}"
	walk := " FORCE INDEX (PRIMARY) WHERE {id} >= (SELECT MIN({id}) FROM {table} WHERE {lease} IS NULL) AND {lease} IS NULL"
	byIndex := " WHERE {lease} IS NULL"
	// First, the free rows alone while no lease has run out (read
	// without a lock, once, by the subquery): the due rows' locking
	// read, of a range nearly always empty, is then not sent.
	noneDue := " AND (SELECT MAX({lease}) FROM {table} WHERE {lease} <= " + now + ") IS NULL"
	locked := " ORDER BY {order} LIMIT $limit FOR UPDATE SKIP LOCKED"
	st.Claim.SelectMore = t.Query(rows + walk + locked)
	st.Claim.SelectMoreOne = t.Query(rows + byIndex + locked)
	st.Claim.SelectFree = t.Query(rows + walk + noneDue + locked)
	st.Claim.SelectFreeOne = t.Query(rows + byIndex + noneDue + locked)
	for _, s := range []*dialect.Stmt{&st.Claim.Select, &st.Claim.SelectMore, &st.Claim.SelectMoreOne, &st.Claim.SelectFree, &st.Claim.SelectFreeOne} {
		s.Clock = dbClock
	}
}

// myShallowClaim is myLeaseClaim for a table without an index on the lease.
func myShallowClaim(t *dialect.Template, n *dialect.Names, st *Statements, now, clock string) {
	// A shallow table has no index on the lease: the claimable rows
	// are read in claim order through the primary key (or the
	// priority's index), stepping over the few under lease. Picked
	// first with a priority, for the reason myLeaseClaim gives.
	claimable := "({lease} IS NULL OR {lease} <= " + now + ")"
	if n.Priority != "" {
		st.Claim.Pick = t.Query("SELECT {pick} FROM {table} WHERE " + claimable + " ORDER BY {order} LIMIT $limit")
		st.Claim.PickAfter = t.Query("SELECT {pick} FROM {table} WHERE " + claimable + " AND " + pastCandidate(t) + " ORDER BY {order} LIMIT $limit")
		st.Claim.PickLock = t.Query("SELECT {id}, {attempt}{, data}{, extra}" + clock + " FROM {table} WHERE {id} IN (" + myPickIDs +
			") AND " + claimable + " ORDER BY {id} LIMIT $limit FOR UPDATE SKIP LOCKED")
		st.Claim.PickLock.Clock = n.DBClock
	} else {
		st.Claim.Select = t.Query("SELECT {id}, {attempt}{, data}{, extra}" + clock + " FROM {table} WHERE " + claimable + " ORDER BY {id} LIMIT $limit FOR UPDATE SKIP LOCKED")
		st.Claim.Select.Clock = n.DBClock
	}
}

// myLeaseToken is the lease token as InnoDB must search it: by primary key.
// With the lease column compared plainly, MariaDB reads the row through the
// lease index ((lease, id) holds both), and a settlement or extension
// outside a READ COMMITTED transaction (autocommit at the server's default,
// REPEATABLE READ) then locks the index's gaps too: the one after the
// latest expiry is where every claim writes its new leases, so each
// settlement held every claim back until it committed. The lease column
// inside COALESCE cannot be searched; the primary key is, and the value is
// compared as before.
const myLeaseToken = "{id} = $id AND {attempt} = $attempt AND COALESCE({lease}) = $expiry"

// myRowLock: the held transaction locks the row with SKIP LOCKED and writes
// nothing: only a committed Retry counts the attempt, so a crash or a
// Release leaves the row as it was.
//
// Without a not-before column the claim is one read of an index in claim
// order (the primary key, or (priority DESC, id)), which locks the row it
// returns. With one, the ready rows (NULL or due) are no range of any index
// in claim order, and InnoDB may read them through the (not_before, id)
// index and sort them: a locking read then keeps the lock of every ready
// row it read until the held transaction ends (41 row locks for a claim
// of one among 20 ready rows), and every other claim finds nothing while
// it is held. The claim then picks (Statements.Claim.Pick): candidates are read
// without locks, in claim order, and PickLock locks the first free one by
// primary key, a range read in id order that stops at its LIMIT.
//
// PickLock compares the time column inside COALESCE, which no index can
// search, as for myLeaseToken, so that the primary key is the plan's only
// way in: compared plainly, the ready rows' range of (not_before, id) is a
// plan too, and a sort after it would lock every ready row again (MariaDB
// chose it for a read of ten candidates' ids).
func myRowLock(t *dialect.Template, n *dialect.Names) *Statements {
	st := &Statements{}
	if n.NotBefore != "" {
		st.Claim.Pick = t.Query("SELECT {pick} FROM {table}{where ready} ORDER BY {order} LIMIT $limit")
		st.Claim.PickAfter = t.Query("SELECT {pick} FROM {table} WHERE " + pastCandidate(t) + "{and ready} ORDER BY {order} LIMIT $limit")
		st.Claim.PickLock = t.Query("SELECT {id}, {attempt}{, data}{, extra} FROM {table} WHERE {id} IN (" + myPickIDs +
			") AND (COALESCE({notBefore}) IS NULL OR COALESCE({notBefore}) <= {now}) ORDER BY {id} LIMIT $limit FOR UPDATE SKIP LOCKED")
	} else {
		st.Claim.Take = t.Query("SELECT {id}, {attempt}{, data}{, extra} FROM {table} ORDER BY {order} LIMIT 1 FOR UPDATE SKIP LOCKED")
	}
	// The claim is a transaction: an idle loop asks first.
	st.Jobs.Probe = t.Query(rowLockProbe)
	st.Settle.Ack = t.Exec("DELETE FROM {table} WHERE " + rowLockToken)
	st.Settle.Retry = rowLockRetry(t, n)
	// The wait ends at innodb_lock_wait_timeout: MySQL 8 cannot bound it
	// in the statement (MariaDB's WAIT n is not MySQL's).
	rowLockUndo(t, st, "SELECT {id} FROM {table} WHERE {id} = $id AND {attempt} = $delivered FOR UPDATE")
	if n.ClaimsTable != "" {
		// Written by a second session while the held transaction has the
		// row, so only its holder counts it; without RETURNING the count is
		// read back after.
		st.RowLock.ClaimsCount = t.Exec("INSERT INTO {claims} ({id}, claims) VALUES ($id, 1) ON DUPLICATE KEY UPDATE claims = claims + 1")
		st.RowLock.ClaimsRead = t.Query("SELECT claims FROM {claims} WHERE {id} = $id")
		st.RowLock.ClaimsGiveBack = t.Exec("UPDATE {claims} SET claims = claims - 1 WHERE {id} = $id AND claims > 0")
		st.RowLock.ClaimsClear = t.Exec("DELETE FROM {claims} WHERE {id} = $id")
	}
	if n.Dead != "" {
		st.Settle.Dead, st.Settle.DeadDelete = deadCopy(t, rowLockToken)
	}
	return st
}

// myAdvisory: under the lock taken from Go, re-read the row if it still has
// the attempt the candidate read saw, then count the attempt, which commits
// at once so that a crash spends it. The count checks attempt and readiness
// again: a caller's transaction that settled the row (RetryTx) may have
// committed between the two.
func myAdvisory(t *dialect.Template, n *dialect.Names) *Statements {
	st := &Statements{}
	st.Advisory.Candidates, st.Advisory.CandidatesAfter = candidates(t)
	st.Claim.Select = t.Query("SELECT {id}, {attempt}{, data}{, extra} FROM {table} WHERE {id} = $id AND {attempt} = $delivered{and ready}")
	st.Claim.Mark = t.Exec("UPDATE {table} SET {attempt} = {attempt} + 1 WHERE {id} = $id AND {attempt} = $delivered{and ready}")
	advisorySettlements(t, n, st)
	if st.Settle.Retry.SQL != "" {
		// A Retry writing the values the row holds changes no row,
		// which MySQL reports as none affected: it is confirmed by counting.
		st.Settle.Exists = t.Query("SELECT COUNT(*) FROM {table} WHERE " + advisoryToken)
	}
	if n.Dead != "" {
		st.Settle.Dead, st.Settle.DeadDelete = deadCopy(t, advisoryToken)
	}
	return st
}

// MySQLLockName is the GET_LOCK name of one key value of a table: "inbox_"
// and 32 hex digits of SHA-256 over the table name, a zero byte and the value,
// 38 characters whatever the key, under the server's limit of 64.
func MySQLLockName(table, key string) string {
	h := sha256.Sum256([]byte(table + "\x00" + key))
	return "inbox_" + hex.EncodeToString(h[:16])
}

func (mysql) TryLock(ctx context.Context, conn *sql.Conn, table, key string) (bool, error) {
	var got sql.NullInt64
	err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", MySQLLockName(table, key)).Scan(&got)
	if err == nil && !got.Valid {
		err = fmt.Errorf("GET_LOCK returned NULL")
	}
	return got.Int64 == 1, err
}

func (mysql) Unlock(ctx context.Context, conn *sql.Conn, table, key string) error {
	var released sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT RELEASE_LOCK(?)", MySQLLockName(table, key)).Scan(&released); err != nil {
		return err
	}
	if released.Int64 != 1 {
		return fmt.Errorf("RELEASE_LOCK: the session did not hold the lock")
	}
	return nil
}

// BatchStatements builds the lease settlements of size tokens at once
// ([dialect.BatchDialect]). The tokens are compared as row values, which MySQL and
// MariaDB plan as a range of primary-key lookups. MySQL 8 has no DELETE …
// RETURNING (MariaDB has), so one approach serves both: the statement runs
// in a transaction whose rows affected is checked against the number of
// tokens; when it falls short, Lock (SELECT … FOR UPDATE of the tokens still
// in place) names the rows first and the statement runs again under those
// locks.
func (mysql) BatchStatements(n *dialect.Names, size int) (*dialect.BatchStatements, error) {
	return myBatchStatements(n, size, tokensIn(size))
}

// myBatchStatements are the batched settlements of MySQL and MariaDB, whose
// rows are those tokens names.
func myBatchStatements(n *dialect.Names, size int, tokens string) (*dialect.BatchStatements, error) {
	if n.Form != Lease {
		return nil, fmt.Errorf("batched settlement is for the lease form")
	}
	// MariaDB plans a row-value IN of one row, in a prepared statement, as
	// a table scan; plain conditions use the key.
	if size == 1 {
		tokens = "(" + myLeaseToken + ")"
	}
	// The new expiry is not returned, as the delivery ends here, so the
	// engine's clock is read in place rather than first.
	until := "DATE_ADD(UTC_TIMESTAMP(6), INTERVAL $micros MICROSECOND)"
	if !n.DBClock {
		until = "$until"
	}
	t := dialect.NewTemplate(n, dialect.Question, "", until)
	return &dialect.BatchStatements{
		Size:    size,
		Ack:     t.Exec("DELETE FROM {table} WHERE " + tokens),
		Release: t.Exec("UPDATE {table} SET {lease} = NULL, {attempt} = {attempt} - 1 WHERE " + tokens),
		Retry:   t.Exec("UPDATE {table} SET {lease} = {until} WHERE " + tokens),
		Lock:    t.Query("SELECT {id} FROM {table} WHERE " + tokens + " FOR UPDATE"),
	}, nil
}

// IsDeadlock reports InnoDB's deadlock victim (error 1213). Secondary
// indexes on the lease column make claims and acknowledgements take index
// locks in different orders, so a victim now and then is expected.
func (mysql) IsDeadlock(err error) bool {
	return strings.Contains(err.Error(), "Error 1213")
}

// IsDuplicate reports a unique violation (error 1062, ER_DUP_ENTRY) on an
// index other than the primary key ([dialect.DuplicateDetector]): the
// enqueue of a job whose unique key is held. The primary key's is a
// caller's id given twice, which no retry cures.
func (mysql) IsDuplicate(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "Error 1062") && !strings.Contains(msg, "PRIMARY'")
}

// TableIdentity is the table's database and name as the server stores them
// ([dialect.TableIdentifier]). GET_LOCK names are server-wide, so the database is
// part of them, and "jobs" and "test.jobs" lock the same keys.
func (mysql) TableIdentity(ctx context.Context, db *sql.DB, n *dialect.Names) (string, error) {
	var ident sql.NullString
	err := db.QueryRowContext(ctx, "SELECT (SELECT CONCAT(table_schema, '.', table_name) FROM information_schema.tables "+
		"WHERE table_schema = COALESCE(NULLIF(?, ''), DATABASE()) AND table_name = ?)", n.Schema, n.TableName).Scan(&ident)
	if err == nil && !ident.Valid {
		err = fmt.Errorf("no table %s", n.Table)
	}
	return ident.String, err
}

// myIDPrimary reports a lease table whose primary key is not its id column
// alone: a claim of several jobs walks the primary key in id order.
func myIDPrimary(ctx context.Context, db *sql.DB, n *dialect.Names) ([]string, error) {
	var primary int
	err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.statistics s WHERE s.table_schema = COALESCE(NULLIF(?, ''), DATABASE()) "+
		"AND s.table_name = ? AND s.index_name = 'PRIMARY' AND s.seq_in_index = 1 AND s.column_name = ? AND NOT EXISTS (SELECT 1 "+
		"FROM information_schema.statistics o WHERE o.table_schema = s.table_schema AND o.table_name = s.table_name "+
		"AND o.index_name = 'PRIMARY' AND o.seq_in_index = 2)", n.Schema, n.TableName, n.Raw.ID).Scan(&primary)
	if err != nil || primary > 0 {
		return nil, err
	}
	return []string{fmt.Sprintf("table %s: column %s is not its primary key: a claim of several jobs walks the primary key in %s order",
		n.Raw.Name, n.Raw.ID, n.Raw.ID)}, nil
}

// myPriorityIndex reports a row-lock table with a priority but no index
// leading with (priority DESC, id) (MariaDB 10.8 or later keeps DESC): InnoDB's SKIP LOCKED after a filesort picks
// the first row in order and then skips it when held, returning none, so
// every claim would wait for the head job's holder.
func myPriorityIndex(ctx context.Context, db *sql.DB, n *dialect.Names) ([]string, error) {
	var found int
	err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.statistics p JOIN information_schema.statistics i "+
		"ON i.table_schema = p.table_schema AND i.table_name = p.table_name AND i.index_name = p.index_name AND i.seq_in_index = 2 "+
		"WHERE p.table_schema = COALESCE(NULLIF(?, ''), DATABASE()) AND p.table_name = ? AND p.seq_in_index = 1 "+
		"AND p.column_name = ? AND p.collation = 'D' AND i.column_name = ?", n.Schema, n.TableName, n.Raw.Priority, n.Raw.ID).Scan(&found)
	if err != nil || found > 0 {
		return nil, err
	}
	return []string{fmt.Sprintf("table %s has no index on (%s DESC, %s): without it MySQL sorts the rows, and SKIP LOCKED "+
		"then returns no job while the first in order is held", n.Raw.Name, n.Raw.Priority, n.Raw.ID)}, nil
}

// myLookalike refuses a form that an engine speaking MySQL's protocol cannot
// hold, naming the engine, the form and what to use instead. TiDB and
// Vitess hold the advisory form whatever MySQL version they announce: it
// needs no SKIP LOCKED.
func myLookalike(s server, f Form, galera bool) string {
	switch {
	case galera && f == Advisory:
		return "MariaDB Galera (wsrep_on): GET_LOCK is held by one node and not replicated, so two nodes would hand out the same key: " +
			"the advisory form cannot hold a job on a cluster; use the lease form (Table.LockedUntil)"
	case galera && f == RowLock:
		return "MariaDB Galera (wsrep_on): row locks are held by one node, so a job is in work on every node that claims it " +
			"until the first commit wins and the others fail with 1213: the row-lock form cannot hold a job on a cluster; " +
			"use the lease form (Table.LockedUntil), whose expiry replicates"
	case s.engine == engineTiDB && f != Advisory:
		return fmt.Sprintf("TiDB (version %q, told by %s) does not honour FOR UPDATE SKIP LOCKED (pingcap/tidb#18207), which the %s form's claim relies on: "+
			"use the advisory form (Table.AdvisoryKey); TiDB's GET_LOCK holds across the cluster", s.version, s.by, f)
	case s.engine == engineVitess && f != Advisory:
		return fmt.Sprintf("Vitess (version %q, told by %s) rejects FOR UPDATE SKIP LOCKED, which the %s form's claim needs: "+
			"use the advisory form (Table.AdvisoryKey); Vitess routes GET_LOCK to one mysqld", s.version, s.by, f)
	}
	return ""
}

// CheckSchema checks the server (SKIP LOCKED: MySQL 8, MariaDB 10.6; the
// engines that only speak like them; Galera), the tables' columns and
// storage engine through information_schema, a LastError column too
// narrow for MaxErrorText, an id the server assigns other than by
// AUTO_INCREMENT and an advisory key Enqueue leaves without a value
// ([dialect.SchemaChecker]). Its first statement (myProbe) tells a server of
// another engine, which is named with the dialect to use.
func (mysql) CheckSchema(ctx context.Context, db *sql.DB, n *dialect.Names) ([]string, error) {
	return myCheckSchema(ctx, db, n, false)
}

// myColumns reads each column's type as declared ("varchar(100)").
const myColumns = "SELECT column_name, column_type FROM information_schema.columns WHERE table_schema = COALESCE(NULLIF(?, ''), DATABASE()) AND table_name = ?"

// myRules judge MySQL's and MariaDB's columns.
var myRules = columnRules{fits: myKind, timeType: "DATETIME(6)", textCap: myTextCap,
	widen: func(table, column string) string { return "ALTER TABLE " + table + " MODIFY " + column + " TEXT" }}

// myCheckSchema is the schema check of [MySQL] and, with mariadbOnly, of
// [MariaDB], which also refuses a server that is not MariaDB.
func myCheckSchema(ctx context.Context, db *sql.DB, n *dialect.Names, mariadbOnly bool) ([]string, error) {
	problems, other, err := myServer(ctx, db, n, mariadbOnly)
	if err != nil || other {
		return problems, err
	}
	found, err := checkTables(ctx, db, n, myColumns, myRules)
	if err != nil {
		return nil, err
	}
	for _, p := range found {
		if strings.Contains(p, "is datetime,") || strings.Contains(p, "is datetime(") {
			p += " (fractional seconds missing: the lease token needs DATETIME(6))"
		}
		problems = append(problems, p)
	}
	p, err := myFilled(ctx, db, n)
	if err != nil {
		return nil, err
	}
	problems = append(problems, p...)
	if p, err = myEngines(ctx, db, n); err != nil {
		return nil, err
	}
	problems = append(problems, p...)
	if p, err = priorityNullable(ctx, db, n, myPriorityNullable, n.Schema, n.TableName, n.Raw.Priority); err != nil {
		return nil, err
	}
	problems = append(problems, p...)
	if n.Form == RowLock && n.Priority != "" {
		p, err = myPriorityIndex(ctx, db, n)
	} else if n.Form == Lease && !n.Shallow && n.Priority == "" {
		p, err = myIDPrimary(ctx, db, n)
	} else {
		p = nil
	}
	if err != nil {
		return nil, err
	}
	problems = append(problems, p...)
	if n.UniqueKey != "" {
		var unique int
		if err := db.QueryRowContext(ctx, myUniqueIndexed, n.Schema, n.TableName, n.Raw.UniqueKey).Scan(&unique); err != nil {
			return nil, err
		}
		if unique == 0 {
			problems = append(problems, uniqueKeyProblem(n))
		}
	}
	if n.ClaimsTable == "" {
		return problems, nil
	}
	p, err = myClaimsKey(ctx, db, n)
	return append(problems, p...), err
}

// myPriorityNullable tells whether the priority column accepts NULL
// (priorityNullable).
const myPriorityNullable = "SELECT is_nullable = 'YES' FROM information_schema.columns " +
	"WHERE table_schema = COALESCE(NULLIF(?, ''), DATABASE()) AND table_name = ? AND column_name = ?"

// myFill reads how the server fills the queue table's id and advisory key
// columns when an insert leaves them out: the default as declared (NULL,
// or on MariaDB the text NULL for a nullable column, when there is none),
// extra (auto_increment) and the expression of a generated column.
const myFill = "SELECT column_name, column_default, extra, COALESCE(generation_expression, '') FROM information_schema.columns " +
	"WHERE table_schema = COALESCE(NULLIF(?, ''), DATABASE()) AND table_name = ? AND column_name IN (?, ?)"

// myFilled reports an id the server assigns by a default or a generated
// column: MySQL and MariaDB report only what AUTO_INCREMENT assigns
// (LastInsertId is 0 otherwise), so Enqueue could not return the new job's
// id; and an advisory key that Enqueue does not write ([keyUnwritten]) and
// the server does not fill, which every insert would leave without a key.
func myFilled(ctx context.Context, db *sql.DB, n *dialect.Names) ([]string, error) {
	key := n.Raw.ID
	if keyUnwritten(n) {
		key = n.Raw.AdvisoryKey
	}
	rows, err := db.QueryContext(ctx, myFill, n.Schema, n.TableName, n.Raw.ID, key)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var problems []string
	for rows.Next() {
		var name, extra, generated string
		var dflt sql.NullString
		if err := rows.Scan(&name, &dflt, &extra, &generated); err != nil {
			return nil, err
		}
		auto := strings.Contains(strings.ToLower(extra), "auto_increment")
		// MariaDB writes a string default quoted, so its bare NULL is none.
		hasDefault := dflt.Valid && dflt.String != "NULL"
		switch {
		case strings.EqualFold(name, n.Raw.ID) && !auto && (hasDefault || generated != ""):
			how := "DEFAULT " + dflt.String
			if generated != "" {
				how = "generated column (" + generated + ")"
			}
			problems = append(problems, fmt.Sprintf("column %s.%s (Table.ID) is assigned by its %s, not by AUTO_INCREMENT: "+
				"MySQL and MariaDB report only the ids AUTO_INCREMENT assigns (LastInsertId is 0), so Enqueue, EnqueueMany and "+
				"RequeueDead could not return the new job's id; make it an AUTO_INCREMENT integer key, "+
				"or drop the default and give every Job an ID", n.Raw.Name, name, how))
		case strings.EqualFold(name, key) && !strings.EqualFold(key, n.Raw.ID) && !auto && !hasDefault && generated == "":
			problems = append(problems, keyValueProblem(n))
		}
	}
	return problems, rows.Err()
}

// myEngine reads a table's storage engine (NULL for a view); no row when
// there is no such table.
const myEngine = "SELECT COALESCE(engine, '') FROM information_schema.tables WHERE table_schema = COALESCE(NULLIF(?, ''), DATABASE()) AND table_name = ?"

// myEngines reports a table whose storage engine is not InnoDB. MyISAM (or
// Aria, MEMORY, a view) has no transactions and no row locks: a row-lock
// claim holds nothing, a lease claim's read and write are not atomic, a
// move to the dead table is not, and every loop runs the same jobs (issue
// 21: 4 loops ran each of 40 jobs more than once on MyISAM).
func myEngines(ctx context.Context, db *sql.DB, n *dialect.Names) ([]string, error) {
	var problems []string
	for _, tb := range checkedTables(n) {
		var engine string
		err := db.QueryRowContext(ctx, myEngine, tb.schema, tb.name).Scan(&engine)
		if errors.Is(err, sql.ErrNoRows) {
			continue // reported as a missing table
		}
		if err != nil {
			return nil, err
		}
		if strings.EqualFold(engine, "InnoDB") {
			continue
		}
		name := tb.name
		if tb.schema != "" {
			name = tb.schema + "." + tb.name
		}
		if engine == "" {
			engine = "no"
		}
		problems = append(problems, fmt.Sprintf("table %s has %s storage engine, not InnoDB: without transactions and row locks "+
			"no claim holds its job, so several workers run it; convert it: ALTER TABLE %s ENGINE=InnoDB", name, engine, name))
	}
	return problems, nil
}

// myServer checks what the server is (its first statement, myProbe):
// another engine's server (other: nothing else is checked), an engine that
// only looks like MySQL, a Galera node, the version (SKIP LOCKED, for the
// lease and row-lock forms); with mariadbOnly, a server that is not
// MariaDB.
func myServer(ctx context.Context, db *sql.DB, n *dialect.Names, mariadbOnly bool) (problems []string, other bool, err error) {
	s, err := probeServer(ctx, db, askMySQL, askPostgres, askSQLite)
	if err != nil {
		return nil, false, err
	}
	dialect := "inbox.MySQL"
	if mariadbOnly {
		dialect = "inbox.MariaDB"
	}
	if s.engine != "" && !s.speaksMySQL() {
		return []string{wrongDialect(s, dialect, "MySQL or MariaDB")}, true, nil
	}
	galera := false
	if n.Form != Lease && (s.engine == engineMySQL || s.engine == engineMariaDB) {
		// SHOW answers on MySQL too, where the variable does not exist;
		// GLOBAL, as a session may set its own.
		var name, value string
		err := db.QueryRowContext(ctx, "SHOW GLOBAL VARIABLES LIKE 'wsrep_on'").Scan(&name, &value)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return nil, false, err
		}
		galera = strings.EqualFold(value, "ON")
	}
	version := s.version
	switch p := myLookalike(s, n.Form, galera); {
	case p != "":
		return []string{p}, false, nil
	case mariadbOnly && s.engine != engineMariaDB:
		return []string{fmt.Sprintf("server %s is not MariaDB: the dialect inbox.MariaDB acknowledges batches with DELETE … RETURNING "+
			"(MariaDB 10.5), which MySQL lacks; use inbox.MySQL", version)}, false, nil
	case n.Form == Advisory:
		// The advisory form needs no SKIP LOCKED.
	case s.engine == engineMariaDB && versionBelow(version, 10, 6):
		return []string{fmt.Sprintf("MariaDB %s is older than 10.6, which brought SKIP LOCKED, which the %s form's claim needs", version, n.Form)}, false, nil
	case s.engine == engineMySQL && versionBelow(version, 8, 0):
		return []string{fmt.Sprintf("MySQL %s is older than 8.0, which brought SKIP LOCKED, which the %s form's claim needs", version, n.Form)}, false, nil
	}
	return nil, false, nil
}

// myTextCap is how many characters a MySQL text type holds: char(n) and
// varchar(n) n, tinytext 255 bytes; text and the larger ones hold more than
// MaxErrorText.
func myTextCap(t string) (int, bool) {
	t = strings.ToLower(t)
	if strings.HasPrefix(t, "tinytext") {
		return 255, true
	}
	open := strings.IndexByte(t, '(')
	if open < 0 || !strings.Contains(t[:open], "char") {
		return 0, false
	}
	end := strings.IndexByte(t[open:], ')')
	if end < 0 {
		return 0, false
	}
	n, err := strconv.Atoi(t[open+1 : open+end])
	return n, err == nil
}

// myKind tells whether a MySQL column type fits a column kind.
func myKind(k colKind, t string) bool {
	t = strings.ToLower(t)
	isInt := strings.Contains(t, "int")
	switch k {
	case kindID:
		return isInt || strings.Contains(t, "char") || strings.Contains(t, "text") || strings.Contains(t, "binary")
	case kindInt:
		return isInt
	case kindString:
		return strings.Contains(t, "char") || strings.Contains(t, "text")
	case kindTime:
		// A bare DATETIME drops the microseconds of the token; TIMESTAMP
		// follows the session's time zone.
		return t == "datetime(6)"
	}
	return true
}

// myClaimsKey reports a claims table whose id is not a key of its own: the
// count's upsert would insert a row per claim and never count.
func myClaimsKey(ctx context.Context, db *sql.DB, n *dialect.Names) ([]string, error) {
	var tables, keys int
	err := db.QueryRowContext(ctx, "SELECT (SELECT COUNT(*) FROM information_schema.tables t "+
		"WHERE t.table_schema = COALESCE(NULLIF(?, ''), DATABASE()) AND t.table_name = ?), "+
		"(SELECT COUNT(*) FROM information_schema.statistics s WHERE s.table_schema = COALESCE(NULLIF(?, ''), DATABASE()) "+
		"AND s.table_name = ? AND s.column_name = ? AND s.non_unique = 0 AND NOT EXISTS (SELECT 1 FROM information_schema.statistics o "+
		"WHERE o.table_schema = s.table_schema AND o.table_name = s.table_name AND o.index_name = s.index_name AND o.seq_in_index > 1))",
		n.ClaimsSchema, n.ClaimsName, n.ClaimsSchema, n.ClaimsName, n.Raw.ID).Scan(&tables, &keys)
	if err != nil || tables == 0 || keys > 0 {
		return nil, err
	}
	return []string{claimsKeyProblem(n)}, nil
}

// EnqueueMany is Enqueue's insert with a row per job. LastInsertId is the
// first row's id; InnoDB reserves the ids of a multi-row INSERT … VALUES (a
// "simple insert") at once, so that the rows' ids follow each other
// @@auto_increment_increment apart (more than 1 on a Galera node) in every
// innodb_autoinc_lock_mode. The server takes up to 65,535 placeholders in a
// prepared statement.
func (mysql) EnqueueMany(n *dialect.Names, rows int, withID, withAt bool) dialect.ManyStatements {
	return dialect.ManyStatements{
		Insert: enqueueRows(n, dialect.Question, false, myEnqueueClock(n), rows, withID, withAt),
		Step:   dialect.Stmt{SQL: "SELECT @@auto_increment_increment", Rows: true},
	}
}

func (mysql) MaxEnqueueParams() int { return 65535 }

// myEnqueueClock is the enqueue time's SQL: the engine's clock, or empty
// for the caller's, passed as a parameter.
func myEnqueueClock(n *dialect.Names) string {
	if n.DBClock {
		return "UTC_TIMESTAMP(6)"
	}
	return ""
}

// WaitLock waits in GET_LOCK for whole seconds, ending before ctx's
// deadline ([dialect.LockWaiter]); without a deadline, five seconds.
func (mysql) WaitLock(ctx context.Context, conn *sql.Conn, table, key string) error {
	wait := 5
	if deadline, ok := ctx.Deadline(); ok {
		wait = max(int(time.Until(deadline)/time.Second), 1)
	}
	var ok sql.NullInt64
	err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, ?)", MySQLLockName(table, key), wait).Scan(&ok)
	if err == nil && ok.Int64 != 1 {
		err = errors.New("GET_LOCK timed out")
	}
	return err
}

// myUniqueIndexed counts the unique indexes of the column alone.
const myUniqueIndexed = "SELECT COUNT(*) FROM information_schema.statistics s WHERE s.table_schema = COALESCE(NULLIF(?, ''), DATABASE()) " +
	"AND s.table_name = ? AND s.column_name = ? AND s.non_unique = 0 AND s.seq_in_index = 1 AND NOT EXISTS (SELECT 1 " +
	"FROM information_schema.statistics o WHERE o.table_schema = s.table_schema AND o.table_name = s.table_name " +
	"AND o.index_name = s.index_name AND o.seq_in_index = 2)"

// myControl pauses and resumes (Statements.Control). Pause is one upsert
// (ON DUPLICATE KEY UPDATE), as on PostgreSQL, but MySQL assigns left to
// right, each assignment seeing the ones before: paused_by is decided
// first, from the paused_at still stored. VALUES() names the row proposed
// (deprecated by MySQL 8.0.20 for an alias MariaDB lacks; still served by
// both).
func myControl(t *dialect.Template, n *dialect.Names) dialect.ControlStatements {
	if n.ControlTable == "" {
		return dialect.ControlStatements{}
	}
	return dialect.ControlStatements{
		Pause: t.Exec("INSERT INTO {control} (queue, paused_at, paused_by) VALUES ($queue, {now}, $by) ON DUPLICATE KEY UPDATE " +
			"paused_by = IF(paused_at IS NULL, VALUES(paused_by), paused_by), paused_at = COALESCE(paused_at, VALUES(paused_at))"),
		Resume: t.Exec(controlResume),
		Read:   t.Query(controlRead),
	}
}
