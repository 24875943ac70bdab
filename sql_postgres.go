package inbox

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"strconv"
	"strings"
	"time"
)

// The optional interfaces of package dialect that postgres has.
var (
	_ dialect.Locker           = postgres{}
	_ dialect.LockWaiter       = postgres{}
	_ dialect.TableIdentifier  = postgres{}
	_ dialect.DeadlockDetector = postgres{}
	_ dialect.BatchDialect     = postgres{}
	_ dialect.BulkEnqueuer     = postgres{}
	_ dialect.SchemaChecker    = postgres{}
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

func (postgres) Statements(n *dialect.Names) (*Statements, error) {
	// The engine's clock, fixed for one statement, or the caller's.
	now, until := "statement_timestamp()", "(statement_timestamp() + $micros * interval '1 microsecond')"
	if !n.DBClock {
		now, until = "$now", "$until"
	}
	t := dialect.NewTemplate(n, dialect.Dollar, now, until)
	var st *Statements
	switch n.Form {
	case Lease:
		st = pgLease(t, n)
	case RowLock:
		st = pgRowLock(t, n)
	case Advisory:
		st = pgAdvisory(t, n)
	}
	enqueue(st, n, dialect.Dollar, true, pgEnqueueClock(n))
	st.Unique = uniqueStatements(t, n, false)
	st.Jobs.Stats = pgStats(t, n)
	deadJobs(t, n, st, true, true)
	st.Browse = browseStatements(t, n, "CAST({now} AS timestamptz)", "{until}")
	st.Settle.Verdict = verdictRead(t, n)
	st.Control = pgControl(t, n)
	return st, nil
}

// pgLease: the claim writes the leases in one statement that returns what it
// wrote; every settlement is a compare-and-set on the token.
func pgLease(t *dialect.Template, n *dialect.Names) *Statements {
	st := &Statements{}
	// Free rows (no lease) and expired ones are read apart, each an
	// ordered, limited index read (free: a partial index on id WHERE the
	// lease is NULL; expired: an index on the lease column), so that a head
	// of rows under lease in force is never walked; a single "NULL OR <=
	// now" ORDER BY id would step over all of them. SKIP LOCKED lets
	// concurrent claims pass each other's rows; rows a branch locked beyond
	// the LIMIT are let go at statement end. MATERIALIZED makes the planner
	// run the locking subqueries once, rather than per joined row. The rows
	// are updated by "= ANY (ARRAY(…))", a primary-key probe per id in every
	// plan: a driver that prepares statements (pgx) gets a generic plan after
	// five runs, which cannot see the limits, and joined with "FROM picked"
	// that plan hashed the whole table (a sequential scan per claim).
	// Without a priority the rows whose lease ran out are taken longest
	// expired first, in the order of the index on the lease: a plan made
	// without statistics (a table autovacuum has not analyzed yet, or a
	// generic plan) then still reads that index from its start, where
	// ordered by id it walked the primary key through every row under a
	// lease (28 ms against 0.2 ms at 200,000 rows). The claim as a whole
	// still hands out its rows in id order.
	//
	// Each locking read is bounded by a number written in the text, the
	// claim's own limit ($limit) applied outside it: a driver that prepares
	// statements (pgx, lib/pq with Config.Prepare) then gets the generic
	// plan after five runs, planned once. With the limit a parameter alone
	// the generic plan's estimate (a tenth of the table) cost more than
	// every custom plan, so the server planned each claim anew: 80 µs of a
	// 500 µs claim of 16. The bound is the smallest of 1, 2, 4, …, 512 and
	// MaxClaim at or above the limit (Claim.TakeBounded), so the generic plan
	// always expects fewer rows than a custom one. The rows are locked as
	// the outer LIMIT pulls them, so no row beyond $limit is locked.
	claim := func(bound string) dialect.Stmt { return pgLeaseClaim(t, n, bound) }
	if n.Shallow {
		// A shallow table has no lease index to read apart: one ordered
		// read through the primary key (or the priority's index) steps
		// over the few rows under lease, and the leases written leave
		// every index as it was (a HOT update, where the page has room).
		claim = func(bound string) dialect.Stmt {
			return t.Query("WITH picked AS MATERIALIZED (SELECT {id} FROM (SELECT {id} FROM {table} WHERE {lease} IS NULL OR {lease} <= {now}" +
				" ORDER BY {order} LIMIT " + bound + " FOR UPDATE SKIP LOCKED) AS bounded LIMIT $limit) " +
				pgMarkPicked)
		}
	}
	st.Claim.TakeBounded = boundedClaims(claim)
	st.Claim.Take = st.Claim.TakeBounded[len(st.Claim.TakeBounded)-1]
	if n.DBClock {
		// The engine chose the new expiry: it comes back as the token.
		st.Settle.Extend = t.Query("UPDATE {table} SET {lease} = {until} WHERE " + leaseToken + " RETURNING {lease}")
	} else {
		st.Settle.Extend = t.Exec("UPDATE {table} SET {lease} = {until} WHERE " + leaseToken)
	}
	st.Settle.Ack = t.Exec("DELETE FROM {table} WHERE " + leaseToken)
	st.Settle.Retry = t.Exec("UPDATE {table} SET {lease} = {until}{, set error} WHERE " + leaseToken)
	st.Settle.Release = t.Exec("UPDATE {table} SET {lease} = NULL, {attempt} = {attempt} - 1 WHERE " + leaseToken)
	if n.Dead != "" {
		st.Settle.Dead = pgDeadMove(t, leaseToken)
	}
	return st
}

// pgLeaseClaim is the lease claim on the recommended indexes: free rows and
// expired ones read apart (see pgLease).
func pgLeaseClaim(t *dialect.Template, n *dialect.Names, bound string) dialect.Stmt {
	dueOrder := "{lease}"
	if n.Priority != "" {
		dueOrder = "{order}"
	}
	return t.Query("WITH picked AS MATERIALIZED (SELECT {id} FROM (" +
		"(SELECT {pick} FROM (SELECT {pick} FROM {table} WHERE {lease} IS NULL ORDER BY {order} LIMIT " + bound + " FOR UPDATE SKIP LOCKED) AS free LIMIT $limit)" +
		" UNION ALL " +
		"(SELECT {pick} FROM (SELECT {pick} FROM {table} WHERE {lease} <= {now} ORDER BY " + dueOrder + " LIMIT " + bound + " FOR UPDATE SKIP LOCKED) AS expired LIMIT $limit)" +
		") AS c ORDER BY {order} LIMIT $limit) " +
		pgMarkPicked)
}

// pgMarkPicked ends both lease claims: the rows of picked get their
// attempt counted and their lease, and come back with what was written.
const pgMarkPicked = "UPDATE {table} AS j SET {attempt} = j.{attempt} + 1, {lease} = {until} WHERE j.{id} = ANY (ARRAY(SELECT {id} FROM picked))" +
	" RETURNING j.{id}, j.{attempt} - 1, j.{lease}{, j.data}{, j.extra}"

// boundedClaims is claim bounded by 1, 2, 4, …, 512 and MaxClaim: the
// statements of Statements.Claim.TakeBounded.
func boundedClaims(claim func(bound string) dialect.Stmt) []dialect.Stmt {
	var sts []dialect.Stmt
	for b := 1; ; b *= 2 {
		if b > MaxClaim {
			b = MaxClaim
		}
		sts = append(sts, claim(strconv.Itoa(b)))
		if b == MaxClaim {
			return sts
		}
	}
}

// pgRowLock: the claim locks the row and writes nothing: the held
// transaction is the hold, and only a committed Retry counts the attempt
// (Dead records the one delivered), so a crash or a Release leaves the row
// as it was, and an acknowledged job costs one write, its delete.
// pgRelockWait is how long a row-lock Retry or Dead whose held transaction
// was lost waits for the row's lock (recordAnew).
const pgRelockWait = "30s"

func pgRowLock(t *dialect.Template, n *dialect.Names) *Statements {
	st := &Statements{}
	st.Claim.Take = t.Query("SELECT {id}, {attempt}{, data}{, extra} FROM {table}{where ready} ORDER BY {order} LIMIT 1 FOR UPDATE SKIP LOCKED")
	// The claim is a transaction: an idle loop asks first.
	st.Jobs.Probe = t.Query(rowLockProbe)
	st.Settle.Ack = t.Exec("DELETE FROM {table} WHERE " + rowLockToken)
	st.Settle.Retry = rowLockRetry(t, n)
	// lock_timeout, set for the transaction by the subquery (OFFSET 0
	// keeps it one), bounds the wait on the server: a client that gave up
	// instead would leave its backend waiting, then holding the row.
	rowLockUndo(t, st, "SELECT j.{id} FROM (SELECT set_config('lock_timeout', '"+pgRelockWait+"', true) OFFSET 0) AS bounded, {table} AS j"+
		" WHERE j.{id} = $id AND j.{attempt} = $delivered FOR UPDATE OF j")
	if n.ClaimsTable != "" {
		// Written by a second session once the held transaction has the
		// row, so only the row's holder counts it; an upsert committed on
		// its own, whatever becomes of the claim.
		st.RowLock.ClaimsCount = t.Query("INSERT INTO {claims} AS c ({id}, claims) VALUES ($id, 1)" +
			" ON CONFLICT ({id}) DO UPDATE SET claims = c.claims + 1 RETURNING claims")
		st.RowLock.ClaimsGiveBack = t.Exec("UPDATE {claims} SET claims = claims - 1 WHERE {id} = $id AND claims > 0")
		st.RowLock.ClaimsClear = t.Exec("DELETE FROM {claims} WHERE {id} = $id")
	}
	if n.Dead != "" {
		st.Settle.Dead = pgDeadMove(t, rowLockToken)
	}
	return st
}

// pgAdvisory: the lock is taken by LockFirst, which walks a page of
// candidates on the server and stops at the first key it locks; the claim
// then re-reads the row under it and commits the attempt, so a crash spends
// it. The attempt must still be the one the candidate read saw: a row
// settled and claimed again meanwhile is another delivery's.
func pgAdvisory(t *dialect.Template, n *dialect.Names) *Statements {
	st := &Statements{}
	st.Advisory.Candidates, st.Advisory.CandidatesAfter = candidates(t)
	first, after := candidateTemplates(t)
	st.Advisory.LockFirst, st.Advisory.LockFirstAfter = pgLockFirst(t, first), pgLockFirst(t, after)
	st.Claim.Take = t.Query("UPDATE {table} SET {attempt} = {attempt} + 1 WHERE {id} = $id AND {attempt} = $delivered{and ready}" +
		" RETURNING {id}, {attempt} - 1{, data}{, extra}")
	advisorySettlements(t, n, st)
	if n.Dead != "" {
		st.Settle.Dead = pgDeadMove(t, advisoryToken)
	}
	return st
}

// pgStats counts a queue by indexed reads. In work under the row lock: the
// transactions holding a row lock or a write lock on the table, which the
// engine lists (open claims, and the short writes of settlements and
// enqueues). Under the advisory form pg_locks lists the keys held, but a key
// is a hash of table and key value (PostgresLockKey) with no part that
// names the table: telling this table's apart means hashing every row's
// key, a full scan (1.1 s on a million rows, PostgreSQL 15), so in work is
// -1 there.
func pgStats(t *dialect.Template, n *dialect.Names) dialect.Stmt {
	now := "CAST({now} AS timestamptz)"
	inWork := "-1"
	if n.Form == RowLock {
		inWork = "(SELECT COUNT(DISTINCT pid) FROM pg_catalog.pg_locks WHERE relation = '{table}'::regclass AND mode IN ('RowShareLock', 'RowExclusiveLock') AND granted)"
	}
	free, due := statsOldest(n, now)
	return t.Query("SELECT " + statsCounts(n, now, "{until}", inWork) +
		", CAST(EXTRACT(EPOCH FROM (" + now + " - LEAST(" + free + ", " + due + "))) * 1000000 AS bigint)")
}

// pgDeadMove moves a row to the dead table in one statement, atomic alone:
// DELETE … RETURNING feeds the INSERT.
func pgDeadMove(t *dialect.Template, token string) dialect.Stmt {
	return t.Exec("WITH gone AS (DELETE FROM {table} WHERE " + token + " RETURNING {id}{, data}{, lastError})" +
		" INSERT INTO {dead} ({id}, {attempt}{, data}{, lastError}{, deadAt}) SELECT {id}, $delivered{, data}{, error}{, deadAt now} FROM gone")
}

// pgLockFirst wraps a candidates read so that the server tries each key's
// lock in claim order and stops at the first it takes. The order holds
// because nothing above the page sorts or gathers: the subquery's rows reach
// the filter one at a time and the LIMIT stops pulling at the first that
// passes, so no key past it is tried (an ORDER BY above would sort after
// filtering, trying every key). The key is PostgresLockKey's, hashed in
// SQL: the first eight bytes of SHA-256 over the identity, a zero byte and
// the key as text, the text every driver returns for the integer, text and
// uuid keys CheckSchema accepts (and none for NULL, as keyString).
//
// The last column tells a locked row (true) from the page's last row
// (false), which the second branch returns only when no key was taken and
// the page is full: the walk goes on past it, and an idle claim of an empty
// or short page costs this one statement. UNION ALL runs its branches in
// turn, and the outer LIMIT ends the statement at the first row, so the
// second branch runs only when the first found nothing.
func pgLockFirst(t *dialect.Template, page string) dialect.Stmt {
	// The page's columns renamed: the key may be the id column itself.
	cols := "id, k, a"
	if t.Fragment("priority") != "" {
		cols += ", p"
	}
	from := " FROM (" + page + ") AS c (" + cols + ")"
	return t.Query("(SELECT " + cols + ", true" + from + " WHERE pg_try_advisory_lock(" + pgLockKeySQL("k") + ") LIMIT 1)" +
		" UNION ALL (SELECT " + cols + ", false" + from + " OFFSET CAST($limit AS bigint) - 1) LIMIT 1")
}

// pgLockKeySQL is PostgresLockKey in SQL, of the key column col and the
// table's identity.
func pgLockKeySQL(col string) string {
	return "CAST(CAST('x' || encode(substring(sha256(convert_to($identity, 'UTF8') || decode('00', 'hex') || convert_to(COALESCE(CAST(" +
		col + " AS text), ''), 'UTF8')) FROM 1 FOR 8), 'hex') AS bit(64)) AS bigint)"
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
// ([dialect.BatchDialect]). RETURNING names the rows settled, so one statement,
// committed on its own, gives every token its own verdict. The tokens come
// as three arrays (ids, stored attempts, expiries), one statement text for
// every size: the ids are probed by the primary key, and each row found
// must carry the attempt and expiry at its id's place. Against 48 scalar
// parameters for 16 tokens (row values), this costs the server less to
// parse and plan, and the client fewer allocations.
func (postgres) BatchStatements(n *dialect.Names, size int) (*dialect.BatchStatements, error) {
	if n.Form != Lease {
		return nil, fmt.Errorf("batched settlement is for the lease form")
	}
	until := "(statement_timestamp() + $micros * interval '1 microsecond')"
	if !n.DBClock {
		until = "$until"
	}
	t := dialect.NewTemplate(n, dialect.Dollar, "", until)
	where := " WHERE " + pgTokensArray + " RETURNING {id}"
	return &dialect.BatchStatements{
		Size:    size,
		Ack:     t.Query("DELETE FROM {table}" + where),
		Release: t.Query("UPDATE {table} SET {lease} = NULL, {attempt} = {attempt} - 1" + where),
		// One delay for the whole statement: retries are grouped by delay.
		Retry: t.Query("UPDATE {table} SET {lease} = {until}" + where),
	}, nil
}

// pgTokensArray finds the rows by "= ANY ($ids)", which also gives $ids
// the id column's array type (bigint[], text[], uuid[]...), then keeps
// those whose token is among the tokens unnested from the three arrays: a
// hashed set or a join, where looking up each row's place in the arrays
// (array_position) cost a scan of them per row, 0.83 ms against 0.45 ms
// for the 256 rows of a claim.
const pgTokensArray = "{id} = ANY ($ids)" +
	" AND ({id}, {attempt}, {lease}) IN (SELECT * FROM unnest($^ids, CAST($attempts AS bigint[]), CAST($expiries AS timestamptz[])))"

// pgTokenArray is one of ArgIDs, ArgAttempts or ArgExpiries of toks (of the
// single token when toks is empty) as a PostgreSQL array literal, text that
// lib/pq and pgx both send as it is, the server reading it as the array
// type the statement gives its parameter. An expiry is written in UTC with
// its offset, so that the session's time zone cannot shift it.
func pgTokenArray(a dialect.Arg, toks []token, single token) string {
	if len(toks) == 0 {
		toks = []token{single}
	}
	b := make([]byte, 0, 32*len(toks))
	b = append(b, '{')
	for i, t := range toks {
		if i > 0 {
			b = append(b, ',')
		}
		switch a {
		case dialect.ArgIDs:
			b = pgArrayID(b, t.id)
		case dialect.ArgAttempts:
			b = strconv.AppendInt(b, t.attempt+1, 10)
		case dialect.ArgExpiries:
			b = append(t.expiry.UTC().AppendFormat(append(b, '"'), "2006-01-02 15:04:05.000000"), `+00"`...)
		}
	}
	return string(append(b, '}'))
}

// pgArrayID writes an id as an array element: an integer as it is, text
// quoted with its quotes and backslashes escaped.
func pgArrayID(b []byte, id any) []byte {
	switch x := id.(type) {
	case int64:
		return strconv.AppendInt(b, x, 10)
	case string:
		b = append(b, '"')
		for i := 0; i < len(x); i++ {
			if x[i] == '"' || x[i] == '\\' {
				b = append(b, '\\')
			}
			b = append(b, x[i])
		}
		return append(b, '"')
	}
	return pgArrayID(b, fmt.Sprint(id))
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
// description's name through the session's search_path ([dialect.TableIdentifier]),
// so that "jobs" and "public.jobs" lock the same keys.
func (postgres) TableIdentity(ctx context.Context, db *sql.DB, n *dialect.Names) (string, error) {
	var ident sql.NullString
	err := db.QueryRowContext(ctx, "SELECT (SELECT ns.nspname || '.' || c.relname FROM pg_catalog.pg_class c "+
		"JOIN pg_catalog.pg_namespace ns ON ns.oid = c.relnamespace WHERE c.oid = to_regclass($1))", n.Table).Scan(&ident)
	if err == nil && !ident.Valid {
		err = fmt.Errorf("no table %s", n.Table)
	}
	return ident.String, err
}

// pgLookalike refuses a form that an engine speaking PostgreSQL's protocol
// cannot hold, naming the engine, the form and what to use instead.
func pgLookalike(s server, f Form) string {
	if s.engine != engineCockroach {
		return ""
	}
	switch f {
	case Advisory:
		return "CockroachDB's session advisory-lock functions are stubs that always grant the lock " +
			"(cockroachdb/cockroach#13546), so the advisory form would run the jobs of one key side by side: use the lease form (Table.LockedUntil)"
	case RowLock:
		return "CockroachDB keeps SELECT … FOR UPDATE locks best-effort under SERIALIZABLE (a lease transfer drops them) " +
			"and retries a transaction held for a whole handler, so the row-lock form cannot hold a job there: use the lease form (Table.LockedUntil)"
	}
	return ""
}

// pgMajor reads PostgreSQL's major version from version() ("PostgreSQL
// 15.20 (Debian …)", YugabyteDB's "PostgreSQL 11.2-YB-2.18.0.0-b0 …"),
// ok false when the text does not start so.
func pgMajor(version string) (int, bool) {
	rest, ok := strings.CutPrefix(version, "PostgreSQL ")
	if !ok {
		return 0, false
	}
	end := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(rest)
	}
	major, err := strconv.Atoi(rest[:end])
	return major, err == nil
}

// pgKind tells whether a PostgreSQL column type (data_type, with the
// length of a limited varchar: "character varying(100)") fits a kind.
func pgKind(k colKind, t string) bool {
	if i := strings.IndexByte(t, '('); i >= 0 {
		t = t[:i]
	}
	switch k {
	case kindID:
		return t == "bigint" || t == "integer" || t == "smallint" || t == "text" || t == "uuid" || t == "character varying"
	case kindInt:
		return t == "bigint" || t == "integer" || t == "smallint"
	case kindTime:
		return t == "timestamp with time zone"
	case kindString:
		return t == "text" || t == "character varying"
	}
	return true
}

// pgTextCap is how many characters a varchar(n) holds; text and an
// unlimited varchar are not limited.
func pgTextCap(t string) (int, bool) {
	n, ok := strings.CutPrefix(t, "character varying(")
	if !ok {
		return 0, false
	}
	c, err := strconv.Atoi(strings.TrimSuffix(n, ")"))
	return c, err == nil
}

// pgRules judge PostgreSQL's columns.
var pgRules = columnRules{fits: pgKind, timeType: "timestamptz", exactNames: true, textCap: pgTextCap,
	widen: func(table, column string) string {
		return "ALTER TABLE " + table + " ALTER COLUMN " + column + " TYPE text"
	}}

// pgColumns reads each column's type, a limited varchar with its length.
const pgColumns = "SELECT column_name, COALESCE(data_type || '(' || CAST(character_maximum_length AS text) || ')', data_type) FROM information_schema.columns " +
	"WHERE table_schema = COALESCE(NULLIF($1, ''), current_schema()) AND table_name = $2"

// CheckSchema checks the server (PostgreSQL 12, for MATERIALIZED; the
// engines that only speak like it), the tables' columns through
// information_schema, a LastError column too narrow for MaxErrorText and
// the claims table's key, and an advisory key Enqueue leaves without a
// value ([dialect.SchemaChecker]). Its first statement (pgProbe) tells a server of
// another engine, which is named with the dialect to use.
func (postgres) CheckSchema(ctx context.Context, db *sql.DB, n *dialect.Names) ([]string, error) {
	s, err := probeServer(ctx, db, askPostgres, askMySQL, askSQLite)
	if err != nil {
		return nil, err
	}
	if s.engine != "" && !s.speaksPostgres() {
		return []string{wrongDialect(s, "inbox.Postgres", enginePostgres)}, nil
	}
	var problems []string
	if p := pgLookalike(s, n.Form); p != "" {
		problems = append(problems, p)
	} else if major, ok := pgMajor(s.version); ok && major < 12 {
		p := fmt.Sprintf("PostgreSQL %d is older than 12, which brought MATERIALIZED", major)
		if s.engine == engineYugabyte {
			p = fmt.Sprintf("YugabyteDB %s is built on %s", s.version, p)
		}
		problems = append(problems, p)
	}
	found, err := pgTableProblems(ctx, db, n)
	if err != nil {
		return nil, err
	}
	problems = append(problems, found...)
	if n.ClaimsTable == "" {
		return problems, nil
	}
	// The count's upsert needs the id to be a key of its own.
	var exists, keyed bool
	err = db.QueryRowContext(ctx, "SELECT to_regclass($1) IS NOT NULL, EXISTS (SELECT 1 FROM pg_catalog.pg_index i "+
		"JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] "+
		"WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indnatts = 1 AND a.attname = $2)", n.ClaimsTable, n.Raw.ID).Scan(&exists, &keyed)
	if err == nil && exists && !keyed {
		problems = append(problems, claimsKeyProblem(n))
	}
	return problems, err
}

// pgTableProblems compares the tables with the description: their
// columns, a nullable priority, an advisory key no enqueue writes, and the
// unique key's index.
func pgTableProblems(ctx context.Context, db *sql.DB, n *dialect.Names) ([]string, error) {
	problems, err := checkTables(ctx, db, n, pgColumns, pgRules)
	if err != nil {
		return nil, err
	}
	found, err := priorityNullable(ctx, db, n, pgPriorityNullable, n.Schema, n.TableName, n.Raw.Priority)
	if err != nil {
		return nil, err
	}
	problems = append(problems, found...)
	if keyUnwritten(n) {
		var filled bool
		err := db.QueryRowContext(ctx, pgKeyFilled, n.Schema, n.TableName, n.Raw.AdvisoryKey).Scan(&filled)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			// Reported as a missing column.
		case err != nil:
			return nil, err
		case !filled:
			problems = append(problems, keyValueProblem(n))
		}
	}
	if n.UniqueKey != "" {
		var unique bool
		err := db.QueryRowContext(ctx, pgUniqueIndexed, n.Table, n.Raw.UniqueKey).Scan(&unique)
		if err != nil {
			return nil, err
		}
		if !unique {
			problems = append(problems, uniqueKeyProblem(n))
		}
	}
	return problems, nil
}

// pgPriorityNullable tells whether the priority column accepts NULL
// (priorityNullable).
const pgPriorityNullable = "SELECT is_nullable = 'YES' FROM information_schema.columns " +
	"WHERE table_schema = COALESCE(NULLIF($1, ''), current_schema()) AND table_name = $2 AND column_name = $3"

// pgKeyFilled tells whether the server fills a column an insert leaves out
// (the advisory key, when Enqueue does not write it): a default, an
// identity or a generated column.
const pgKeyFilled = "SELECT column_default IS NOT NULL OR is_identity = 'YES' OR is_generated = 'ALWAYS' FROM information_schema.columns " +
	"WHERE table_schema = COALESCE(NULLIF($1, ''), current_schema()) AND table_name = $2 AND column_name = $3"

// EnqueueMany is Enqueue's insert with a row per job. PostgreSQL's protocol
// counts a statement's parameters in 16 bits.
func (postgres) EnqueueMany(n *dialect.Names, rows int, withID, withAt bool) dialect.ManyStatements {
	return dialect.ManyStatements{Insert: enqueueRows(n, dialect.Dollar, true, pgEnqueueClock(n), rows, withID, withAt)}
}

func (postgres) MaxEnqueueParams() int { return 65535 }

// pgEnqueueClock is the enqueue time's SQL: the engine's clock, or empty
// for the caller's, passed as a parameter.
func pgEnqueueClock(n *dialect.Names) string {
	if n.DBClock {
		return "statement_timestamp()"
	}
	return ""
}

// WaitLock has the server end the wait (lock_timeout, set for this
// statement alone) a tenth before ctx's deadline ([dialect.LockWaiter]).
// pgx gives up at a deadline by closing its socket, and a backend waiting
// for a lock does not notice: it took the lock once its holder let go and
// held it until it found its client gone (a key seen held after the
// holder's Ack, in TestCutAdvisory).
func (postgres) WaitLock(ctx context.Context, conn *sql.Conn, table, key string) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		_, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock($1)", PostgresLockKey(table, key))
		return err
	}
	wait := max(time.Until(deadline)*9/10, time.Millisecond)
	// OFFSET 0 keeps the subquery, and so the setting, ahead of the lock.
	_, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock($1) FROM (SELECT set_config('lock_timeout', $2, true) OFFSET 0) AS bounded",
		PostgresLockKey(table, key), strconv.FormatInt(wait.Milliseconds(), 10)+"ms")
	return err
}

// pgUniqueIndexed tells whether column $2 of table $1 has a unique index
// of its own, whole (ON CONFLICT names it by the column alone).
const pgUniqueIndexed = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_index i " +
	"JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] " +
	"WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indnatts = 1 AND i.indpred IS NULL AND a.attname = $2)"

// pgControl pauses and resumes (Statements.Control). Pause is one upsert,
// so that a missing row is made and two operators pausing at once both
// succeed; the first pause's time and author stand, as the DO UPDATE
// reads the stored row (c) before any of its assignments.
func pgControl(t *dialect.Template, n *dialect.Names) dialect.ControlStatements {
	if n.ControlTable == "" {
		return dialect.ControlStatements{}
	}
	return dialect.ControlStatements{
		Pause: t.Exec("INSERT INTO {control} AS c (queue, paused_at, paused_by) VALUES ($queue, {now}, $by) ON CONFLICT (queue) DO UPDATE " +
			"SET paused_at = COALESCE(c.paused_at, EXCLUDED.paused_at), paused_by = CASE WHEN c.paused_at IS NULL THEN EXCLUDED.paused_by ELSE c.paused_by END"),
		Resume: t.Exec(controlResume),
		Read:   t.Query(controlRead),
	}
}
