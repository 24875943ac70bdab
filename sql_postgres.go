package inbox

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Postgres is the dialect of PostgreSQL (12 or later, for MATERIALIZED; SKIP
// LOCKED needs 9.5), through lib/pq or pgx/v5/stdlib. Times are timestamptz;
// the engine's clock is statement_timestamp(), fixed for one statement, and
// never now(), which would stand still for a whole held transaction.
var Postgres Dialect = postgres{}

type postgres struct{}

func (postgres) Name() string { return "postgres" }

func (postgres) QuoteIdent(s string) (string, error) {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`, nil
}

func (postgres) TimeArg(t time.Time) any { return t }

func (postgres) ScanTime(src any) (time.Time, error) {
	if t, ok := src.(time.Time); ok {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("postgres: time column returned %T, want time.Time (is the column timestamptz?)", src)
}

func (postgres) Statements(n *Names) (*Statements, error) {
	return pgLike(n, dollar, "statement_timestamp()", true)
}

// pgLike builds the statements of engines with UPDATE … RETURNING and
// FOR UPDATE SKIP LOCKED. clock is the engine's clock expression (empty: the
// caller's); skipLocked is false for SQLite, whose single writer needs none.
func pgLike(n *Names, mark func(int) string, clock string, skipLocked bool) (*Statements, error) {
	st := &Statements{}
	b := func() *sqlBuilder { return &sqlBuilder{mark: mark} }
	dbClock := n.DBClock && clock != ""
	// now and until write the current time and a time after it: the engine's
	// clock, or the caller's passed as parameters.
	now := func(s *sqlBuilder) string {
		if dbClock {
			return clock
		}
		return s.p(ArgNow)
	}
	until := func(s *sqlBuilder) string {
		if dbClock {
			return "(" + clock + " + " + s.p(ArgMicros) + " * interval '1 microsecond')"
		}
		return s.p(ArgUntil)
	}
	t, id, att, data := n.Table, n.ID, n.Attempt, n.Data
	ready := func(s *sqlBuilder, prefix string) string {
		if n.NotBefore == "" {
			return ""
		}
		return prefix + "(" + n.NotBefore + " IS NULL OR " + n.NotBefore + " <= " + now(s) + ")"
	}
	lock := ""
	if skipLocked {
		// SKIP LOCKED lets concurrent claims pass each other's rows instead
		// of queueing on them.
		lock = " FOR UPDATE SKIP LOCKED"
	}
	switch n.Form {
	case Lease:
		lu := n.LockedUntil
		// Free rows (no lease) and expired ones are read apart, each an
		// ordered, limited index read (free: a partial index on id WHERE the
		// lease is NULL; expired: an index on the lease column), so that a
		// head of rows under lease in force is never walked. A single
		// "NULL OR <= now" ORDER BY id must step over all of them.
		s := b()
		if skipLocked {
			// The candidate ids are MATERIALIZED so the planner runs the
			// locking subqueries once, rather than per joined row. Rows a
			// branch locked beyond the LIMIT are let go at statement end.
			s.w("WITH picked AS MATERIALIZED (SELECT ", id, " FROM (",
				"SELECT ", id, " FROM (SELECT ", id, " FROM ", t, " WHERE ", lu, " IS NULL ORDER BY ", id, " LIMIT ", s.p(ArgLimit), lock, ") AS free",
				" UNION ALL ",
				"SELECT ", id, " FROM (SELECT ", id, " FROM ", t, " WHERE ", lu, " <= ", now(s), " ORDER BY ", id, " LIMIT ", s.p(ArgLimit), lock, ") AS expired",
				") AS c ORDER BY ", id, " LIMIT ", s.p(ArgLimit), ") ",
				"UPDATE ", t, " AS j SET ", att, " = j.", att, " + 1, ", lu, " = ", until(s),
				" FROM picked WHERE j.", id, " = picked.", id,
				" RETURNING j.", id, ", j.", att, " - 1, j.", lu)
		} else {
			// SQLite: the statement holds the single write lock from its
			// subquery to its end, so no other claim can interleave. "+id"
			// keeps the planner from walking rowid order through the head.
			set := until(s)
			s.w("UPDATE ", t, " SET ", att, " = ", att, " + 1, ", lu, " = ", set,
				" WHERE ", id, " IN (",
				"SELECT ", id, " FROM (SELECT ", id, " FROM ", t, " WHERE ", lu, " IS NULL ORDER BY ", id, " LIMIT ", s.p(ArgLimit), ")",
				" UNION ALL ",
				"SELECT ", id, " FROM (SELECT ", id, " FROM ", t, " WHERE ", lu, " <= ", now(s), " ORDER BY +", id, " LIMIT ", s.p(ArgLimit), ")",
				" ORDER BY ", id, " LIMIT ", s.p(ArgLimit), ")",
				" RETURNING ", id, ", ", att, " - 1, ", lu)
		}
		if len(data) > 0 {
			if skipLocked {
				s.w(", ", joinCols("j.", data))
			} else {
				s.w(", ", joinCols("", data))
			}
		}
		st.Claim = s.stmt(true)

		tok := func(s *sqlBuilder) string {
			return id + " = " + s.p(ArgID) + " AND " + att + " = " + s.p(ArgAttempt) + " AND " + lu + " = " + s.p(ArgExpiry)
		}
		s = b()
		set := until(s)
		s.w("UPDATE ", t, " SET ", lu, " = ", set, " WHERE ", tok(s))
		if dbClock {
			// The engine chose the new expiry: it comes back as the token.
			s.w(" RETURNING ", lu)
		}
		st.Extend = s.stmt(dbClock)
		s = b()
		s.w("DELETE FROM ", t, " WHERE ", tok(s))
		st.Ack = s.stmt(false)
		s = b()
		set = until(s)
		s.w("UPDATE ", t, " SET ", lu, " = ", set, " WHERE ", tok(s))
		st.Retry = s.stmt(false)
		s = b()
		s.w("UPDATE ", t, " SET ", lu, " = NULL, ", att, " = ", att, " - 1 WHERE ", tok(s))
		st.Release = s.stmt(false)
		if n.Dead != "" {
			st.DeadInsert, st.DeadDelete = deadMove(n, b, tok, skipLocked)
		}
	case RowLock, Advisory:
		if n.Form == RowLock && !skipLocked {
			return nil, fmt.Errorf("SQLite has no row locks: name Table.LockedUntil for the lease form or Table.AdvisoryKey for the advisory form")
		}
		s := b()
		if n.Form == RowLock {
			// The attempt is counted inside the held transaction, so a
			// crash rolls it back with everything else.
			s.w("UPDATE ", t, " SET ", att, " = ", att, " + 1 WHERE ", id, " = (SELECT ", id, " FROM ", t, ready(s, " WHERE "), " ORDER BY ", id, " LIMIT 1", lock, ")")
		} else {
			// The lock was taken from Go; this re-reads the row under it and
			// commits the attempt, so a crash spends it. The attempt must
			// still be the one the candidate read saw: a row settled and
			// claimed again meanwhile is another delivery's.
			s.w("UPDATE ", t, " SET ", att, " = ", att, " + 1 WHERE ", id, " = ", s.p(ArgID), " AND ", att, " = ", s.p(ArgDelivered), ready(s, " AND "))
		}
		s.w(" RETURNING ", id, ", ", att, " - 1")
		if len(data) > 0 {
			s.w(", ", joinCols("", data))
		}
		st.Claim = s.stmt(true)

		// Row lock: the held transaction is the fence. Advisory: the
		// attempt is, against a holder whose session was cut.
		tok := func(s *sqlBuilder) string {
			if n.Form == RowLock {
				return id + " = " + s.p(ArgID)
			}
			return id + " = " + s.p(ArgID) + " AND " + att + " = " + s.p(ArgAttempt)
		}
		s = b()
		s.w("DELETE FROM ", t, " WHERE ", tok(s))
		st.Ack = s.stmt(false)
		if n.NotBefore != "" {
			s = b()
			set := until(s)
			s.w("UPDATE ", t, " SET ", n.NotBefore, " = ", set, " WHERE ", tok(s))
			st.Retry = s.stmt(false)
		}
		if n.Form == Advisory {
			s = b()
			s.w("UPDATE ", t, " SET ", att, " = ", att, " - 1 WHERE ", tok(s))
			st.Release = s.stmt(false)
			s = b()
			st.Candidates, st.CandidatesAfter = candidates(n, b, ready)
		}
		if n.ClaimsTable != "" {
			st.ClaimsCount, st.ClaimsGiveBack, st.ClaimsClear = pgClaims(n, b)
		}
		if n.Dead != "" {
			st.DeadInsert, st.DeadDelete = deadMove(n, b, tok, skipLocked)
		}
	}
	enqueue(st, n, b, true)
	return st, nil
}

// pgClaims builds the claims counter's statements on the side table. The
// count is an upsert committed on its own, by a second session while the
// claim's transaction holds the row: only the holder of the row writes its
// count, so no two workers ever count one delivery.
func pgClaims(n *Names, b func() *sqlBuilder) (count, giveBack, clear Stmt) {
	c, id := n.ClaimsTable, n.ID
	s := b()
	s.w("INSERT INTO ", c, " AS c (", id, ", claims) VALUES (", s.p(ArgID), ", 1)",
		" ON CONFLICT (", id, ") DO UPDATE SET claims = c.claims + 1 RETURNING claims")
	count = s.stmt(true)
	s = b()
	s.w("UPDATE ", c, " SET claims = claims - 1 WHERE ", id, " = ", s.p(ArgID), " AND claims > 0")
	giveBack = s.stmt(false)
	s = b()
	s.w("DELETE FROM ", c, " WHERE ", id, " = ", s.p(ArgID))
	clear = s.stmt(false)
	return count, giveBack, clear
}

// candidates builds the advisory form's unlocked reads of claimable rows:
// id, key and attempt, in id order, the first page and the pages after an
// id. The attempt lets the claim refuse a row that changed since.
func candidates(n *Names, b func() *sqlBuilder, ready func(*sqlBuilder, string) string) (first, after Stmt) {
	t, id := n.Table, n.ID
	s := b()
	s.w("SELECT ", id, ", ", n.Key, ", ", n.Attempt, " FROM ", t, ready(s, " WHERE "), " ORDER BY ", id, " LIMIT ", s.p(ArgLimit))
	first = s.stmt(true)
	s = b()
	s.w("SELECT ", id, ", ", n.Key, ", ", n.Attempt, " FROM ", t, " WHERE ", id, " > ", s.p(ArgID), ready(s, " AND "), " ORDER BY ", id, " LIMIT ", s.p(ArgLimit))
	after = s.stmt(true)
	return first, after
}

// deadMove builds the move to the dead table: on Postgres one statement
// (DELETE … RETURNING feeding the INSERT), elsewhere a copy then a delete.
func deadMove(n *Names, b func() *sqlBuilder, tok func(*sqlBuilder) string, oneStatement bool) (ins, del Stmt) {
	cols := n.ID + ", " + n.Attempt
	src := n.ID + ", "
	if len(n.Data) > 0 {
		cols += ", " + joinCols("", n.Data)
	}
	s := b()
	if oneStatement {
		s.w("WITH gone AS (DELETE FROM ", n.Table, " WHERE ", tok(s), " RETURNING ", n.ID)
		if len(n.Data) > 0 {
			s.w(", ", joinCols("", n.Data))
		}
		s.w(") INSERT INTO ", n.Dead, " (", cols, ") SELECT ", src, s.p(ArgDelivered))
		if len(n.Data) > 0 {
			s.w(", ", joinCols("", n.Data))
		}
		s.w(" FROM gone")
		return s.stmt(false), Stmt{}
	}
	s.w("INSERT INTO ", n.Dead, " (", cols, ") SELECT ", src, s.p(ArgDelivered))
	if len(n.Data) > 0 {
		s.w(", ", joinCols("", n.Data))
	}
	s.w(" FROM ", n.Table, " WHERE ", tok(s))
	ins = s.stmt(false)
	s = b()
	s.w("DELETE FROM ", n.Table, " WHERE ", tok(s))
	return ins, s.stmt(false)
}

// enqueue builds the four inserts. returning is false for engines without
// INSERT … RETURNING (MySQL), which read LastInsertId instead.
func enqueue(st *Statements, n *Names, b func() *sqlBuilder, returning bool) {
	at := n.NotBefore
	if n.Form == Lease {
		// A lease form delays a job the way it delays a retry: an expiry.
		at = n.LockedUntil
	}
	build := func(withID, withAt bool) Stmt {
		s := b()
		var cols, vals []string
		if withID {
			cols, vals = append(cols, n.ID), append(vals, s.p(ArgID))
		}
		for i, c := range n.Data {
			cols, vals = append(cols, c), append(vals, s.p(ArgData+Arg(i)))
		}
		if withAt {
			cols, vals = append(cols, at), append(vals, s.p(ArgNotBefore))
		}
		if len(cols) == 0 {
			s.w("INSERT INTO ", n.Table, " DEFAULT VALUES")
		} else {
			s.w("INSERT INTO ", n.Table, " (", strings.Join(cols, ", "), ") VALUES (", strings.Join(vals, ", "), ")")
		}
		if returning {
			s.w(" RETURNING ", n.ID)
		}
		return s.stmt(returning)
	}
	st.Enqueue = build(false, false)
	st.EnqueueID = build(true, false)
	if at != "" {
		st.EnqueueAt = build(false, true)
		st.EnqueueIDAt = build(true, true)
	}
}

// PostgresLockKey is the 64-bit advisory lock key of one key value of a
// table: the first eight bytes of SHA-256 over the table name, a zero byte and
// the value. Hashing the table in keeps queues on different tables apart.
func PostgresLockKey(table, key string) int64 {
	h := sha256.Sum256([]byte(table + "\x00" + key))
	return int64(binary.BigEndian.Uint64(h[:8]))
}

func (postgres) TryLock(ctx context.Context, conn *sql.Conn, table, key string) (bool, error) {
	var ok bool
	err := conn.QueryRowContext(ctx, "SELECT pg_try_advisory_lock($1)", PostgresLockKey(table, key)).Scan(&ok)
	return ok, err
}

func (postgres) Unlock(ctx context.Context, conn *sql.Conn, table, key string) error {
	var ok bool
	if err := conn.QueryRowContext(ctx, "SELECT pg_advisory_unlock($1)", PostgresLockKey(table, key)).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("pg_advisory_unlock: the session did not hold the lock")
	}
	return nil
}

// BatchStatements builds the lease settlements of size tokens at once
// ([BatchDialect]).
func (postgres) BatchStatements(n *Names, size int) (*BatchStatements, error) {
	return pgLikeBatch(n, size, dollar, "statement_timestamp()", false)
}

// pgLikeBatch builds the batch statements of engines with DELETE/UPDATE …
// RETURNING: RETURNING names the rows settled, so one statement, committed
// on its own, gives every token its own verdict. Postgres compares the
// tokens as row values, (id, attempt, expiry) IN ((…), …), which the planner
// expands into one primary-key probe per token (a BitmapOr of index scans);
// orForm writes the same test as an OR of per-token conditions for SQLite,
// whose planner scans the table for a row-value IN (its right side must be
// a subquery) but searches each disjunct by rowid. clock is the engine's
// clock expression, empty for the caller's.
func pgLikeBatch(n *Names, size int, mark func(int) string, clock string, orForm bool) (*BatchStatements, error) {
	if n.Form != Lease {
		return nil, fmt.Errorf("batched settlement is for the lease form")
	}
	st := &BatchStatements{Size: size}
	where := func(s *batchBuilder) {
		s.w(" WHERE ")
		if orForm {
			s.tokensOr(n, size)
		} else {
			s.tokensIn(n, size)
		}
		s.w(" RETURNING ", n.ID)
	}
	s := &batchBuilder{mark: mark}
	s.w("DELETE FROM ", n.Table)
	where(s)
	st.Ack = s.stmt(true)
	s = &batchBuilder{mark: mark}
	s.w("UPDATE ", n.Table, " SET ", n.LockedUntil, " = NULL, ", n.Attempt, " = ", n.Attempt, " - 1")
	where(s)
	st.Release = s.stmt(true)
	// One delay for the whole statement: the batcher groups retries by
	// delay. The new expiry is not returned, as the delivery ends here.
	s = &batchBuilder{mark: mark}
	s.w("UPDATE ", n.Table, " SET ", n.LockedUntil, " = ")
	if n.DBClock && clock != "" {
		s.w("(", clock, " + ", s.p(ArgMicros, 0), " * interval '1 microsecond')")
	} else {
		s.w(s.p(ArgUntil, 0))
	}
	where(s)
	st.Retry = s.stmt(true)
	return st, nil
}

// IsDeadlock reports PostgreSQL's deadlock victim (SQLSTATE 40P01), from
// the error's SQLState method (pgx, lib/pq) or its text.
func (postgres) IsDeadlock(err error) bool {
	var st interface{ SQLState() string }
	if errors.As(err, &st) {
		return st.SQLState() == "40P01"
	}
	return strings.Contains(err.Error(), "deadlock detected")
}

// TableIdentity is the table's schema and name as the server resolves the
// description's name through the session's search_path ([TableIdentifier]),
// so that "jobs" and "public.jobs" lock the same keys.
func (postgres) TableIdentity(ctx context.Context, db *sql.DB, n *Names) (string, error) {
	var ident sql.NullString
	err := db.QueryRowContext(ctx, "SELECT (SELECT ns.nspname || '.' || c.relname FROM pg_catalog.pg_class c "+
		"JOIN pg_catalog.pg_namespace ns ON ns.oid = c.relnamespace WHERE c.oid = to_regclass($1))", n.Table).Scan(&ident)
	if err == nil && !ident.Valid {
		err = fmt.Errorf("no table %s", n.Table)
	}
	return ident.String, err
}
