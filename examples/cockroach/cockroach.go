// Package cockroach is a dialect of CockroachDB for inbox's lease form,
// written from outside package inbox on package
// [github.com/sqlinbox/inbox/dialect] alone: how a distributed engine that
// speaks PostgreSQL's protocol, but not all of its semantics, gets
// statements of its own. It implements [dialect.Dialect] and three of the
// optional interfaces, and writes its statements with [dialect.Template]
// (a [dialect.Builder] for the insert, whose data parameters a template
// cannot name). See docs/scaling.md.
//
// Only the lease form: CockroachDB's session advisory-lock functions are
// stubs that always grant the lock (cockroachdb/cockroach#13546), and its
// SELECT … FOR UPDATE locks are best-effort under SERIALIZABLE isolation,
// dropped on a lease transfer or a range split (CockroachDB's "SELECT FOR
// UPDATE" page, known limitations), so neither can hold a job for a whole
// handler. A lease is a value in the row, and a serializable write either
// commits it or retries: nothing else needs to hold.
//
// The statements use only what CockroachDB's documentation and logic tests
// show it has: UPDATE … RETURNING, FOR UPDATE SKIP LOCKED in a subquery
// (v22.2 and later), data-modifying statements in a top-level WITH,
// statement_timestamp() and INTERVAL arithmetic. Nothing here has run on a
// CockroachDB server: the tests pin the SQL with sqlmock, and run it on
// PostgreSQL when INBOX_POSTGRES_DSN is set, which shows it well formed and
// the ownership tokens sound, not what CockroachDB plans.
package cockroach

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sqlinbox/inbox/dialect"
)

// Dialect is the dialect value to put in inbox.Config.Dialect.
var Dialect dialect.Dialect = crdb{}

// crdb implements dialect.Dialect, and of the optional interfaces
// DeadlockDetector (CockroachDB's retry errors), BatchDialect (the
// Batcher's statements) and SchemaChecker: every one the lease form reads.
// Not Locker, so that nothing would ever take an advisory lock here; not
// TableIdentifier, which only the advisory form reads. It has no Unwrap
// either: unwrapping to inbox.Postgres would hand the package that
// dialect's Locker, which was not written for CockroachDB.
type crdb struct{}

// The optional interfaces this dialect implements, checked by the compiler.
var (
	_ dialect.DeadlockDetector = crdb{}
	_ dialect.BatchDialect     = crdb{}
	_ dialect.SchemaChecker    = crdb{}
)

func (crdb) Name() string { return "cockroachdb" }

// QuoteIdent quotes as PostgreSQL does; the core has already refused
// anything but letters, digits and underscores.
func (crdb) QuoteIdent(s string) (string, error) {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`, nil
}

// TimeArg passes a time as itself: pgx and lib/pq send it as timestamptz,
// which CockroachDB keeps to the microsecond, the precision of the
// package's tokens.
func (crdb) TimeArg(t time.Time) any { return t }

func (crdb) ScanTime(src any) (time.Time, error) {
	if t, ok := src.(time.Time); ok {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("cockroachdb: time column returned %T, want time.Time (is the column TIMESTAMPTZ?)", src)
}

// Statements refuses every form but the lease, naming what to use instead,
// and Config.NotifyChannel: CockroachDB has no LISTEN/NOTIFY. The optional
// columns (LastError, Priority, EnqueuedAt, which Queue.Stats needs) are
// written.
func (crdb) Statements(n *dialect.Names) (*dialect.Statements, error) {
	switch n.Form {
	case dialect.Advisory:
		return nil, errors.New("cockroachdb: the advisory form needs session locks, and CockroachDB's advisory-lock functions " +
			"always grant them (cockroachdb/cockroach#13546): use the lease form (Table.LockedUntil)")
	case dialect.RowLock:
		return nil, errors.New("cockroachdb: the row-lock form holds a transaction for a whole handler, and CockroachDB keeps " +
			"FOR UPDATE locks best-effort under SERIALIZABLE: use the lease form (Table.LockedUntil)")
	}
	if n.NotifyChannel != "" {
		return nil, fmt.Errorf("cockroachdb: this dialect has no statements for NotifyChannel (%s): CockroachDB has no LISTEN/NOTIFY", n.NotifyChannel)
	}
	return leaseStatements(n), nil
}

// templates returns the templates of n, placeholders numbered $1, $2, …
// in the order the text takes them. The clock ({now}, {until}): by default
// the gateway node's, statement_timestamp(), one reading for the whole
// statement. CockroachDB keeps its nodes' clocks within --max-offset (500
// ms by default: a node whose clock is off from half the others by 80 % of
// it shuts itself down), so a lease must be much longer than that, and the
// keeper's margin (a tenth of the lease) larger. With Config.Now the
// caller's clock comes as parameters instead. The lease's length is cast:
// CockroachDB multiplies an INTERVAL by an int, a float or a decimal, and
// its type inference would have nothing to choose by.
func templates(n *dialect.Names) *dialect.Template {
	if n.DBClock {
		return dialect.NewTemplate(n, dialect.Dollar, "statement_timestamp()",
			"statement_timestamp() + $micros::INT8 * INTERVAL '1 microsecond'")
	}
	return dialect.NewTemplate(n, dialect.Dollar, "$now", "$until")
}

// token is the ownership token of a lease: every settlement is a
// compare-and-set on the whole of it, so a holder whose lease ran out
// changes nothing.
const token = "{id} = $id AND {attempt} = $attempt AND {lease} = $expiry"

// BatchStatements settles size lease tokens in one statement each
// ([dialect.BatchDialect]): the tokens as a list of row values, each row
// settled only if it still carries its whole token, and the ids settled
// returned, so that each delivery learns its own result.
func (crdb) BatchStatements(n *dialect.Names, size int) (*dialect.BatchStatements, error) {
	if n.Form != dialect.Lease {
		return nil, errors.New("cockroachdb: batched settlement is for the lease form")
	}
	t := templates(n)
	tokens := make([]string, size)
	for i := range tokens {
		tokens[i] = "($id, $attempt, $expiry)"
	}
	in := " WHERE ({id}, {attempt}, {lease}) IN (" + strings.Join(tokens, ", ") + ") RETURNING {id}"
	return &dialect.BatchStatements{
		Size:    size,
		Ack:     t.Query("DELETE FROM {table}" + in),
		Release: t.Query("UPDATE {table} SET {lease} = NULL, {attempt} = {attempt} - 1" + in),
		// One delay for the whole statement: the Batcher groups retries by it.
		Retry: t.Query("UPDATE {table} SET {lease} = {until}" + in),
	}, nil
}

// leaseStatements writes the lease form's statements for n.
func leaseStatements(n *dialect.Names) *dialect.Statements {
	t := templates(n)
	st := &dialect.Statements{}
	st.Jobs.Enqueue, st.Jobs.EnqueueID = insert(n, false, false), insert(n, true, false)
	st.Jobs.EnqueueAt, st.Jobs.EnqueueIDAt = insert(n, false, true), insert(n, true, true)
	if n.EnqueuedAt != "" {
		st.Jobs.Stats = stats(t, n)
	}
	// The optional last error: a claim returns it after the data ({, extra},
	// before the priority), and a Retry or Dead that records none keeps the
	// row's. Its parameter is cast, as the template's {, set error} does
	// not: NULL for none has no type of its own.
	setError, deadError := "", ""
	if n.LastError != "" {
		setError = ", {lastError} = COALESCE($error::TEXT, {lastError})"
		deadError = ", COALESCE($error::TEXT, {lastError})"
	}

	// Claim: one statement, an implicit transaction, which CockroachDB
	// retries by itself on a conflict while its result stays under 16 KiB
	// (the "Automatic retries" of its transactions page); past that a retry
	// error (40001) reaches the client, and IsDeadlock has the queue send
	// the claim again. SKIP LOCKED lets concurrent claims pass each
	// other's rows; the write then checks the lease again, so that the
	// claim is a compare-and-set of its own whatever the lock did. Rows
	// free and expired are read in one condition, not in the two ordered
	// branches of inbox.Postgres: a UNION of locking subqueries is nowhere
	// in CockroachDB's documentation, so this claim walks the rows under a
	// lease in force at the head of the id order. {order} is the id, or
	// the priority (highest first) then the id.
	st.Claim.Take = t.Query("UPDATE {table} SET {attempt} = {attempt} + 1, {lease} = {until}" +
		" WHERE {id} IN (SELECT {id} FROM {table} WHERE {lease} IS NULL OR {lease} <= {now}" +
		" ORDER BY {order} LIMIT $limit FOR UPDATE SKIP LOCKED) AND ({lease} IS NULL OR {lease} <= {now})" +
		" RETURNING {id}, {attempt} - 1, {lease}{, data}{, extra}")

	// Extend: with the engine's clock the new expiry is the engine's to
	// choose, so it comes back as the token; with the caller's, the
	// package wrote it.
	if n.DBClock {
		st.Settle.Extend = t.Query("UPDATE {table} SET {lease} = {until} WHERE " + token + " RETURNING {lease}")
	} else {
		st.Settle.Extend = t.Exec("UPDATE {table} SET {lease} = {until} WHERE " + token)
	}
	st.Settle.Ack = t.Exec("DELETE FROM {table} WHERE " + token)
	st.Settle.Retry = t.Exec("UPDATE {table} SET {lease} = {until}" + setError + " WHERE " + token)
	st.Settle.Release = t.Exec("UPDATE {table} SET {lease} = NULL, {attempt} = {attempt} - 1 WHERE " + token)

	if n.Dead != "" {
		// Dead: one statement, atomic alone and retried like the others
		// (a move in two statements would need an explicit transaction,
		// whose retry error reaches the caller), so DeadDelete stays
		// empty. CockroachDB takes a data-modifying WITH at the top level
		// of a query. The delivered attempt is cast: in a SELECT list it
		// has no column to take a type from.
		st.Settle.Dead = t.Exec("WITH gone AS (DELETE FROM {table} WHERE " + token + " RETURNING {id}{, data}{, extra})" +
			" INSERT INTO {dead} ({id}, {attempt}{, data}{, lastError}) SELECT {id}, $delivered::INT8{, data}" + deadError + " FROM gone")
	}

	return st
}

// stats writes Stats' statement for n (Queue.Stats needs Table.EnqueuedAt):
// jobs ready (free, or their lease run out), waiting (a lease or a delay
// beyond one lease from now), in work (a lease ending within one), dead (-1
// without a dead table), and the age in microseconds of the oldest ready
// job, read in one condition rather than as the least of two minimums.
func stats(t *dialect.Template, n *dialect.Names) dialect.Stmt {
	const ready = "{lease} IS NULL OR {lease} <= {now}"
	dead := "-1"
	if n.Dead != "" {
		dead = "(SELECT count(*) FROM {dead})"
	}
	return t.Query("SELECT (SELECT count(*) FROM {table} WHERE " + ready + ")," +
		" (SELECT count(*) FROM {table} WHERE {lease} > {until})," +
		" (SELECT count(*) FROM {table} WHERE {lease} > {now} AND {lease} <= {until}), " + dead + "," +
		" CAST(EXTRACT(EPOCH FROM ({now} - (SELECT min({enqueuedAt}) FROM {table} WHERE " + ready + "))) * 1000000 AS INT8)")
}

// insert writes Enqueue's statement for n, with an id given (withID) and a
// not-before time (withAt) or not, on a Builder: a template has no name
// for the data columns' parameters (dialect.ArgData+i). RETURNING gives
// the id, whatever generates it (unique_rowid() in the schema below). A
// lease-form job delayed by Job.NotBefore is written with that time as its
// lease. The optional priority is the job's; the optional enqueue time the
// clock's.
func insert(n *dialect.Names, withID, withAt bool) dialect.Stmt {
	s := dialect.NewBuilder(dialect.Dollar)
	var cols, vals []string
	if withID {
		cols, vals = append(cols, n.ID), append(vals, s.Param(dialect.ArgID))
	}
	for i, col := range n.Data {
		cols, vals = append(cols, col), append(vals, s.Param(dialect.ArgData+dialect.Arg(i)))
	}
	if withAt {
		cols, vals = append(cols, n.LockedUntil), append(vals, s.Param(dialect.ArgNotBefore))
	}
	if n.Priority != "" {
		cols, vals = append(cols, n.Priority), append(vals, s.Param(dialect.ArgPriority))
	}
	if n.EnqueuedAt != "" {
		now := "statement_timestamp()"
		if !n.DBClock {
			now = s.Param(dialect.ArgNow)
		}
		cols, vals = append(cols, n.EnqueuedAt), append(vals, now)
	}
	if len(cols) == 0 {
		return s.Write("INSERT INTO ", n.Table, " DEFAULT VALUES RETURNING ", n.ID).Stmt(true)
	}
	return s.Write("INSERT INTO ", n.Table, " (", strings.Join(cols, ", "), ") VALUES (", strings.Join(vals, ", "), ") RETURNING ", n.ID).Stmt(true)
}

// IsDeadlock reports CockroachDB's transaction retry errors (SQLSTATE
// 40001, "restart transaction"), from the error's SQLState method (pgx,
// lib/pq) or its text. The package sends such a statement again: it was
// rolled back whole. Not 40003, "result is ambiguous": that statement may
// have committed, and sending it again is for the caller to decide.
func (crdb) IsDeadlock(err error) bool {
	var st interface{ SQLState() string }
	if errors.As(err, &st) {
		return st.SQLState() == "40001"
	}
	return strings.Contains(err.Error(), "restart transaction")
}

// minVersion is the first CockroachDB release with SKIP LOCKED.
var minVersion = [2]int{22, 2}

// CheckSchema checks that the server is CockroachDB 22.2 or later and that
// the queue table (and the dead table, if named) have the description's
// columns, the lease column a TIMESTAMPTZ ([dialect.SchemaChecker]). It does
// not look at column families: SKIP LOCKED refuses a table with more than
// one, so create the table without FAMILY clauses.
func (crdb) CheckSchema(ctx context.Context, db *sql.DB, n *dialect.Names) ([]string, error) {
	var version string
	if err := db.QueryRowContext(ctx, "SELECT version()").Scan(&version); err != nil {
		return nil, err
	}
	var problems []string
	if v, ok := parseVersion(version); !ok {
		problems = append(problems, fmt.Sprintf("the server is not CockroachDB (version() = %q): use inbox.Postgres for PostgreSQL", version))
	} else if v[0] < minVersion[0] || v[0] == minVersion[0] && v[1] < minVersion[1] {
		problems = append(problems, fmt.Sprintf("CockroachDB v%d.%d is older than v22.2, which brought SKIP LOCKED", v[0], v[1]))
	}
	// The columns as the description names them (Names.Raw), which is
	// how the catalog spells them.
	r := n.Raw
	tables := []struct {
		schema, name string
		cols         []string
	}{{n.Schema, n.TableName, append([]string{r.ID, r.Attempt, r.LockedUntil}, r.Data...)}}
	if n.Dead != "" {
		tables = append(tables, struct {
			schema, name string
			cols         []string
		}{n.DeadSchema, n.DeadName, append([]string{r.ID, r.Attempt}, r.Data...)})
	}
	if r.LastError != "" {
		for i := range tables {
			tables[i].cols = append(tables[i].cols, r.LastError)
		}
	}
	const q = "SELECT column_name, data_type FROM information_schema.columns " +
		"WHERE table_schema = COALESCE(NULLIF($1, ''), current_schema()) AND table_name = $2"
	for _, tb := range tables {
		types, err := columns(ctx, db, q, tb.schema, tb.name)
		if err != nil {
			return nil, err
		}
		if len(types) == 0 {
			problems = append(problems, fmt.Sprintf("table %s not found", tb.name))
			continue
		}
		for _, col := range tb.cols {
			typ, ok := types[col]
			switch {
			case !ok:
				problems = append(problems, fmt.Sprintf("table %s has no column %s", tb.name, col))
			case col == r.LockedUntil && !isTimestampTZ(typ):
				problems = append(problems, fmt.Sprintf("column %s.%s is %s, want TIMESTAMPTZ", tb.name, col, typ))
			}
		}
	}
	return problems, nil
}

// columns reads a table's column types by name.
func columns(ctx context.Context, db *sql.DB, q, schema, table string) (map[string]string, error) {
	rows, err := db.QueryContext(ctx, q, schema, table)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			return nil, err
		}
		out[name] = strings.ToLower(typ)
	}
	return out, rows.Err()
}

func isTimestampTZ(typ string) bool {
	return typ == "timestamptz" || typ == "timestamp with time zone"
}

// parseVersion reads the release of a version() text such as
// "CockroachDB CCL v23.1.11 (x86_64-pc-linux-gnu, …)".
func parseVersion(v string) ([2]int, bool) {
	rest, ok := strings.CutPrefix(v, "CockroachDB ")
	if !ok {
		return [2]int{}, false
	}
	_, rest, ok = strings.Cut(rest, " v")
	if !ok {
		return [2]int{}, false
	}
	parts := strings.SplitN(rest, ".", 3)
	if len(parts) < 2 {
		return [2]int{}, false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(strings.TrimRightFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	if err1 != nil || err2 != nil {
		return [2]int{}, false
	}
	return [2]int{major, minor}, true
}

// Schema is a queue table for this dialect, with a dead table. The id is
// unique_rowid(): the insert time at 10 µs granularity and the node, so
// that claims in id order take jobs roughly oldest first, where a random
// UUID would take them in no order. One column family, for SKIP LOCKED.
const Schema = `CREATE TABLE jobs (
  id INT8 PRIMARY KEY DEFAULT unique_rowid(),
  attempt INT4 NOT NULL DEFAULT 1,
  locked_until TIMESTAMPTZ,
  payload BYTES NOT NULL
);
CREATE TABLE jobs_dead (
  id INT8 PRIMARY KEY,
  attempt INT4 NOT NULL,
  payload BYTES NOT NULL
)`
