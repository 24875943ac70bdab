package inbox

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"strings"
	"time"
)

// MySQL is the dialect of MySQL 8 and MariaDB 10.6 or later (SKIP LOCKED)
// through go-sql-driver/mysql, with or without parseTime. Times are
// DATETIME(6) in UTC; the engine's clock is UTC_TIMESTAMP(6), never the
// session-zoned NOW(). UPDATE cannot return what it wrote, so the queue reads
// the clock first (Statements.Now) and writes the times it computed.
var MySQL Dialect = mysql{}

type mysql struct{}

func (mysql) Name() string { return "mysql" }

func (mysql) QuoteIdent(s string) (string, error) {
	return "`" + strings.ReplaceAll(s, "`", "``") + "`", nil
}

// mysqlTime is how times go to the server: text it reads as DATETIME(6)
// whatever the connection's time zone or parseTime setting.
const mysqlTime = "2006-01-02 15:04:05.000000"

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

// claimMarkIDs is how many ids one lease ClaimMark takes.
const claimMarkIDs = 16

func (mysql) Statements(n *Names) (*Statements, error) {
	st := &Statements{}
	b := func() *sqlBuilder { return &sqlBuilder{mark: question} }
	t, id, att := n.Table, n.ID, n.Attempt
	data := ""
	if len(n.Data) > 0 {
		data = ", " + joinCols("", n.Data)
	}
	if n.DBClock {
		st.Now = Stmt{SQL: "SELECT UTC_TIMESTAMP(6)", Rows: true}
	}
	// Conditions only compare, so they read the clock in place when it is
	// the engine's.
	now := func(s *sqlBuilder) string {
		if n.DBClock {
			return "UTC_TIMESTAMP(6)"
		}
		return s.p(ArgNow)
	}
	ready := func(s *sqlBuilder, prefix string) string {
		if n.NotBefore == "" {
			return ""
		}
		return prefix + "(" + n.NotBefore + " IS NULL OR " + n.NotBefore + " <= " + now(s) + ")"
	}
	switch n.Form {
	case Lease:
		lu := n.LockedUntil
		// No UPDATE … RETURNING: lock the rows with a SELECT in a READ
		// COMMITTED transaction, then write each lease. SKIP LOCKED lets
		// concurrent claims pass each other's rows.
		s := b()
		// Free rows and expired ones are read apart, each an ordered,
		// limited read of the index on (lease, id), so that a head of rows
		// under lease in force is never walked. The union is ordered by
		// position: a data column may repeat the id's name.
		s.w("(SELECT ", id, ", ", att, data, " FROM ", t, " WHERE ", lu, " IS NULL ORDER BY ", id, " LIMIT ", s.p(ArgLimit), " FOR UPDATE SKIP LOCKED)",
			" UNION ALL ",
			"(SELECT ", id, ", ", att, data, " FROM ", t, " WHERE ", lu, " <= ", s.p(ArgNow), " ORDER BY ", id, " LIMIT ", s.p(ArgLimit), " FOR UPDATE SKIP LOCKED)",
			" ORDER BY 1 LIMIT ", s.p(ArgLimit))
		st.ClaimSelect = s.stmt(true)
		// One UPDATE writes the leases of up to claimMarkIDs rows; a claim of
		// fewer repeats its last id, which changes nothing twice.
		s = b()
		s.w("UPDATE ", t, " SET ", att, " = ", att, " + 1, ", lu, " = ", s.p(ArgUntil), " WHERE ", id, " IN (")
		for i := 0; i < claimMarkIDs; i++ {
			if i > 0 {
				s.w(", ")
			}
			s.w(s.p(ArgID))
		}
		s.w(")")
		st.ClaimMark = s.stmt(false)
		tok := func(s *sqlBuilder) string {
			return id + " = " + s.p(ArgID) + " AND " + att + " = " + s.p(ArgAttempt) + " AND " + lu + " = " + s.p(ArgExpiry)
		}
		s = b()
		s.w("UPDATE ", t, " SET ", lu, " = ", s.p(ArgUntil), " WHERE ", tok(s))
		st.Extend = s.stmt(false)
		st.Retry = st.Extend
		// MySQL reports changed rows, not matched ones: a write of the
		// expiry a row already holds is confirmed by counting the token.
		s = b()
		s.w("SELECT COUNT(*) FROM ", t, " WHERE ", tok(s))
		st.Exists = s.stmt(true)
		s = b()
		s.w("DELETE FROM ", t, " WHERE ", tok(s))
		st.Ack = s.stmt(false)
		s = b()
		s.w("UPDATE ", t, " SET ", lu, " = NULL, ", att, " = ", att, " - 1 WHERE ", tok(s))
		st.Release = s.stmt(false)
		if n.Dead != "" {
			st.DeadInsert, st.DeadDelete = deadMove(n, b, tok, false)
		}
	case RowLock:
		s := b()
		s.w("SELECT ", id, ", ", att, data, " FROM ", t, ready(s, " WHERE "), " ORDER BY ", id, " LIMIT 1 FOR UPDATE SKIP LOCKED")
		st.ClaimSelect = s.stmt(true)
		// Counted inside the held transaction: a crash rolls it back.
		s = b()
		s.w("UPDATE ", t, " SET ", att, " = ", att, " + 1 WHERE ", id, " = ", s.p(ArgID))
		st.ClaimMark = s.stmt(false)
		tok := func(s *sqlBuilder) string { return id + " = " + s.p(ArgID) }
		s = b()
		s.w("DELETE FROM ", t, " WHERE ", tok(s))
		st.Ack = s.stmt(false)
		if n.NotBefore != "" {
			s = b()
			s.w("UPDATE ", t, " SET ", n.NotBefore, " = ", s.p(ArgUntil), " WHERE ", tok(s))
			st.Retry = s.stmt(false)
		}
		if n.ClaimsTable != "" {
			// The count is written by a second session while the claim's
			// transaction holds the row, so only its holder counts it; no
			// RETURNING, so it is read back after.
			c := n.ClaimsTable
			s = b()
			s.w("INSERT INTO ", c, " (", id, ", claims) VALUES (", s.p(ArgID), ", 1) ON DUPLICATE KEY UPDATE claims = claims + 1")
			st.ClaimsCount = s.stmt(false)
			s = b()
			s.w("SELECT claims FROM ", c, " WHERE ", id, " = ", s.p(ArgID))
			st.ClaimsRead = s.stmt(true)
			s = b()
			s.w("UPDATE ", c, " SET claims = claims - 1 WHERE ", id, " = ", s.p(ArgID), " AND claims > 0")
			st.ClaimsGiveBack = s.stmt(false)
			s = b()
			s.w("DELETE FROM ", c, " WHERE ", id, " = ", s.p(ArgID))
			st.ClaimsClear = s.stmt(false)
		}
		if n.Dead != "" {
			st.DeadInsert, st.DeadDelete = deadMove(n, b, tok, false)
		}
	case Advisory:
		st.Candidates, st.CandidatesAfter = candidates(n, b, ready)
		// Under the lock: re-read the row, if it still has the attempt the
		// candidate read saw, then count the attempt, which commits at once
		// so that a crash spends it. The count checks attempt and
		// not-before again: a caller's transaction that settled the row
		// (RetryTx) may have committed between the two.
		s := b()
		s.w("SELECT ", id, ", ", att, data, " FROM ", t, " WHERE ", id, " = ", s.p(ArgID), " AND ", att, " = ", s.p(ArgDelivered), ready(s, " AND "))
		st.ClaimSelect = s.stmt(true)
		s = b()
		s.w("UPDATE ", t, " SET ", att, " = ", att, " + 1 WHERE ", id, " = ", s.p(ArgID), " AND ", att, " = ", s.p(ArgDelivered), ready(s, " AND "))
		st.ClaimMark = s.stmt(false)
		tok := func(s *sqlBuilder) string {
			return id + " = " + s.p(ArgID) + " AND " + att + " = " + s.p(ArgAttempt)
		}
		s = b()
		s.w("DELETE FROM ", t, " WHERE ", tok(s))
		st.Ack = s.stmt(false)
		s = b()
		s.w("UPDATE ", t, " SET ", att, " = ", att, " - 1 WHERE ", tok(s))
		st.Release = s.stmt(false)
		if n.NotBefore != "" {
			s = b()
			s.w("UPDATE ", t, " SET ", n.NotBefore, " = ", s.p(ArgUntil), " WHERE ", tok(s))
			st.Retry = s.stmt(false)
		}
		if n.Dead != "" {
			st.DeadInsert, st.DeadDelete = deadMove(n, b, tok, false)
		}
	}
	enqueue(st, n, b, false)
	return st, nil
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
// ([BatchDialect]). The tokens are compared as row values, (id, attempt,
// expiry) IN ((…), …), which both MySQL and MariaDB plan as a range of
// primary-key lookups. MySQL 8 has no DELETE … RETURNING (MariaDB has), so
// one approach serves both: the statement runs in a transaction whose rows
// affected is checked against the number of tokens; when it falls short,
// Lock (SELECT … FOR UPDATE of the tokens still in place) names the rows
// first and the statement runs again under those locks.
func (mysql) BatchStatements(n *Names, size int) (*BatchStatements, error) {
	if n.Form != Lease {
		return nil, fmt.Errorf("batched settlement is for the lease form")
	}
	st := &BatchStatements{Size: size}
	tokens := func(s *batchBuilder) {
		if size == 1 {
			// MariaDB plans a row-value IN of one row, in a prepared
			// statement, as a table scan; plain conditions use the key.
			s.tokensOr(n, 1)
			return
		}
		s.tokensIn(n, size)
	}
	s := &batchBuilder{mark: question}
	s.w("DELETE FROM ", n.Table, " WHERE ")
	tokens(s)
	st.Ack = s.stmt(false)
	s = &batchBuilder{mark: question}
	s.w("UPDATE ", n.Table, " SET ", n.LockedUntil, " = NULL, ", n.Attempt, " = ", n.Attempt, " - 1 WHERE ")
	tokens(s)
	st.Release = s.stmt(false)
	// The new expiry is not returned, as the delivery ends here, so the
	// engine's clock can be read in place rather than first.
	s = &batchBuilder{mark: question}
	s.w("UPDATE ", n.Table, " SET ", n.LockedUntil, " = ")
	if n.DBClock {
		s.w("DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ", s.p(ArgMicros, 0), " MICROSECOND)")
	} else {
		s.w(s.p(ArgUntil, 0))
	}
	s.w(" WHERE ")
	tokens(s)
	st.Retry = s.stmt(false)
	s = &batchBuilder{mark: question}
	s.w("SELECT ", n.ID, " FROM ", n.Table, " WHERE ")
	tokens(s)
	s.w(" FOR UPDATE")
	st.Lock = s.stmt(true)
	return st, nil
}

// IsDeadlock reports InnoDB's deadlock victim (error 1213). Secondary
// indexes on the lease column make claims and acknowledgements take index
// locks in different orders, so a victim now and then is expected.
func (mysql) IsDeadlock(err error) bool {
	return strings.Contains(err.Error(), "Error 1213")
}

// TableIdentity is the table's database and name as the server stores them
// ([TableIdentifier]). GET_LOCK names are server-wide, so the database is
// part of them, and "jobs" and "test.jobs" lock the same keys.
func (mysql) TableIdentity(ctx context.Context, db *sql.DB, n *Names) (string, error) {
	var ident sql.NullString
	err := db.QueryRowContext(ctx, "SELECT (SELECT CONCAT(table_schema, '.', table_name) FROM information_schema.tables "+
		"WHERE table_schema = COALESCE(NULLIF(?, ''), DATABASE()) AND table_name = ?)", n.Schema, n.TableName).Scan(&ident)
	if err == nil && !ident.Valid {
		err = fmt.Errorf("no table %s", n.Table)
	}
	return ident.String, err
}
