// Package cockroach is a dialect of CockroachDB for inbox's lease form,
// written from outside the package with its exported API alone: how a
// distributed engine that speaks PostgreSQL's protocol, but not all of its
// semantics, gets statements of its own. See docs/scaling.md.
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

	"github.com/sqlinbox/inbox"
)

// Dialect is the dialect value to put in inbox.Config.Dialect.
var Dialect inbox.Dialect = dialect{}

// dialect implements inbox.Dialect, and of the optional interfaces
// DeadlockDetector (CockroachDB's retry errors), BatchDialect (the
// Batcher's statements) and SchemaChecker: every one the lease form reads.
// Not Locker, so that nothing would ever take an advisory lock here; not
// TableIdentifier, which only the advisory form reads. It has no Unwrap
// either: unwrapping to inbox.Postgres would hand the package that
// dialect's Locker, which was not written for CockroachDB.
type dialect struct{}

// The optional interfaces this dialect implements, checked by the compiler.
var (
	_ inbox.DeadlockDetector = dialect{}
	_ inbox.BatchDialect     = dialect{}
	_ inbox.SchemaChecker    = dialect{}
)

func (dialect) Name() string { return "cockroachdb" }

// QuoteIdent quotes as PostgreSQL does; the core has already refused
// anything but letters, digits and underscores.
func (dialect) QuoteIdent(s string) (string, error) {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`, nil
}

// TimeArg passes a time as itself: pgx and lib/pq send it as timestamptz,
// which CockroachDB keeps to the microsecond, the precision of the
// package's tokens.
func (dialect) TimeArg(t time.Time) any { return t }

func (dialect) ScanTime(src any) (time.Time, error) {
	if t, ok := src.(time.Time); ok {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("cockroachdb: time column returned %T, want time.Time (is the column TIMESTAMPTZ?)", src)
}

// Statements refuses every form but the lease, naming what to use instead,
// and Config.NotifyChannel: CockroachDB has no LISTEN/NOTIFY. The optional
// columns (LastError, Priority, EnqueuedAt, which Queue.Stats needs) are
// written.
func (dialect) Statements(n *inbox.Names) (*inbox.Statements, error) {
	switch n.Form {
	case inbox.Advisory:
		return nil, errors.New("cockroachdb: the advisory form needs session locks, and CockroachDB's advisory-lock functions " +
			"always grant them (cockroachdb/cockroach#13546): use the lease form (Table.LockedUntil)")
	case inbox.RowLock:
		return nil, errors.New("cockroachdb: the row-lock form holds a transaction for a whole handler, and CockroachDB keeps " +
			"FOR UPDATE locks best-effort under SERIALIZABLE: use the lease form (Table.LockedUntil)")
	}
	if n.NotifyChannel != "" {
		return nil, fmt.Errorf("cockroachdb: this dialect has no statements for NotifyChannel (%s): CockroachDB has no LISTEN/NOTIFY", n.NotifyChannel)
	}
	return leaseStatements(n), nil
}

// stmt builds one statement, numbering its placeholders $1, $2, … in the
// order the text takes them and recording what each one is.
type stmt struct {
	b    strings.Builder
	args []inbox.Arg
}

// sql writes text; arg writes the placeholder of a.
func (s *stmt) sql(parts ...string) *stmt {
	for _, p := range parts {
		s.b.WriteString(p)
	}
	return s
}

func (s *stmt) arg(a inbox.Arg) *stmt {
	s.args = append(s.args, a)
	s.b.WriteString("$" + strconv.Itoa(len(s.args)))
	return s
}

// cast writes the placeholder of a with a type, for the places where
// CockroachDB's type inference would have nothing to go by.
func (s *stmt) cast(a inbox.Arg, typ string) *stmt {
	return s.arg(a).sql("::", typ)
}

func (s *stmt) query() inbox.Stmt { return inbox.Stmt{SQL: s.b.String(), Args: s.args, Rows: true} }
func (s *stmt) exec() inbox.Stmt  { return inbox.Stmt{SQL: s.b.String(), Args: s.args} }

// clock returns the writers of the clock and of the ownership token of n.
// The clock: by default the gateway node's, statement_timestamp(), one
// reading for the whole statement. CockroachDB keeps its nodes' clocks
// within --max-offset (500 ms by default: a node whose clock is off from
// half the others by 80 % of it shuts itself down), so a lease must be
// much longer than that, and the keeper's margin (a tenth of the lease)
// larger. With Config.Now the caller's clock comes as parameters instead.
// The token: every settlement is a compare-and-set on the whole of it, so
// a holder whose lease ran out changes nothing.
func clock(n *inbox.Names) (now, until, token func(*stmt) *stmt) {
	now = func(s *stmt) *stmt {
		if n.DBClock {
			return s.sql("statement_timestamp()")
		}
		return s.arg(inbox.ArgNow)
	}
	until = func(s *stmt) *stmt {
		if n.DBClock {
			return s.sql("statement_timestamp() + ").cast(inbox.ArgMicros, "INT8").sql(" * INTERVAL '1 microsecond'")
		}
		return s.arg(inbox.ArgUntil)
	}
	token = func(s *stmt) *stmt {
		return s.sql(n.ID, " = ").arg(inbox.ArgID).sql(" AND ", n.Attempt, " = ").arg(inbox.ArgAttempt).
			sql(" AND ", n.LockedUntil, " = ").arg(inbox.ArgExpiry)
	}
	return now, until, token
}

// BatchStatements settles size lease tokens in one statement each
// ([inbox.BatchDialect]): the tokens as a list of row values, each row
// settled only if it still carries its whole token, and the ids settled
// returned, so that each delivery learns its own result.
func (dialect) BatchStatements(n *inbox.Names, size int) (*inbox.BatchStatements, error) {
	if n.Form != inbox.Lease {
		return nil, errors.New("cockroachdb: batched settlement is for the lease form")
	}
	_, until, _ := clock(n)
	in := func(s *stmt) inbox.Stmt {
		s.sql(" WHERE (", n.ID, ", ", n.Attempt, ", ", n.LockedUntil, ") IN (")
		for i := 0; i < size; i++ {
			if i > 0 {
				s.sql(", ")
			}
			s.sql("(").arg(inbox.ArgID).sql(", ").arg(inbox.ArgAttempt).sql(", ").arg(inbox.ArgExpiry).sql(")")
		}
		return s.sql(") RETURNING ", n.ID).query()
	}
	return &inbox.BatchStatements{
		Size:    size,
		Ack:     in((&stmt{}).sql("DELETE FROM ", n.Table)),
		Release: in((&stmt{}).sql("UPDATE ", n.Table, " SET ", n.LockedUntil, " = NULL, ", n.Attempt, " = ", n.Attempt, " - 1")),
		// One delay for the whole statement: the Batcher groups retries by it.
		Retry: in(until((&stmt{}).sql("UPDATE ", n.Table, " SET ", n.LockedUntil, " = "))),
	}, nil
}

// leaseStatements writes the lease form's statements for n.
func leaseStatements(n *inbox.Names) *inbox.Statements {
	t, id, att, lease := n.Table, n.ID, n.Attempt, n.LockedUntil
	data := ""
	if len(n.Data) > 0 {
		data = ", " + strings.Join(n.Data, ", ")
	}
	now, until, token := clock(n)
	st := &inbox.Statements{}
	st.Enqueue, st.EnqueueID = insert(n, false, false), insert(n, true, false)
	st.EnqueueAt, st.EnqueueIDAt = insert(n, false, true), insert(n, true, true)
	if n.EnqueuedAt != "" {
		st.Stats = stats(n)
	}
	// The optional last error: a claim returns it after the data, and a
	// Retry or Dead that records none keeps the row's. Its parameter is
	// cast: NULL for none has no type of its own.
	extra, setError, deadError := "", func(s *stmt) *stmt { return s }, ""
	if le := n.LastError; le != "" {
		extra, deadError = ", "+le, ", "+le
		setError = func(s *stmt) *stmt {
			return s.sql(", ", le, " = COALESCE(").cast(inbox.ArgError, "TEXT").sql(", ", le, ")")
		}
	}
	// The optional priority: claimed highest first, then by id, and
	// returned after the last error.
	order := id
	if n.Priority != "" {
		order = n.Priority + " DESC, " + id
		extra += ", " + n.Priority
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
	// lease in force at the head of the id order.
	c := &stmt{}
	c.sql("UPDATE ", t, " SET ", att, " = ", att, " + 1, ", lease, " = ")
	until(c).sql(" WHERE ", id, " IN (SELECT ", id, " FROM ", t, " WHERE ", lease, " IS NULL OR ", lease, " <= ")
	now(c).sql(" ORDER BY ", order, " LIMIT ").arg(inbox.ArgLimit).sql(" FOR UPDATE SKIP LOCKED) AND (", lease, " IS NULL OR ", lease, " <= ")
	now(c).sql(") RETURNING ", id, ", ", att, " - 1, ", lease, data, extra)
	st.Claim = c.query()

	// Extend: with the engine's clock the new expiry is the engine's to
	// choose, so it comes back as the token; with the caller's, the
	// package wrote it.
	e := &stmt{}
	until(e.sql("UPDATE ", t, " SET ", lease, " = "))
	token(e.sql(" WHERE "))
	if n.DBClock {
		st.Extend = e.sql(" RETURNING ", lease).query()
	} else {
		st.Extend = e.exec()
	}

	st.Ack = token((&stmt{}).sql("DELETE FROM ", t, " WHERE ")).exec()
	r := &stmt{}
	setError(until(r.sql("UPDATE ", t, " SET ", lease, " = ")))
	st.Retry = token(r.sql(" WHERE ")).exec()
	st.Release = token((&stmt{}).sql("UPDATE ", t, " SET ", lease, " = NULL, ", att, " = ", att, " - 1 WHERE ")).exec()

	if n.Dead != "" {
		// Dead: one statement, atomic alone and retried like the others
		// (a move in two statements would need an explicit transaction,
		// whose retry error reaches the caller). CockroachDB takes a
		// data-modifying WITH at the top level of a query. The delivered
		// attempt is cast: in a SELECT list it has no column to take a
		// type from.
		d := &stmt{}
		token(d.sql("WITH gone AS (DELETE FROM ", t, " WHERE "))
		d.sql(" RETURNING ", id, data, extra, ") INSERT INTO ", n.Dead, " (", id, ", ", att, data, deadError, ") SELECT ", id, ", ")
		d.cast(inbox.ArgDelivered, "INT8").sql(data)
		if n.LastError != "" {
			d.sql(", COALESCE(").cast(inbox.ArgError, "TEXT").sql(", ", n.LastError, ")")
		}
		st.DeadInsert = d.sql(" FROM gone").exec()
	}

	return st
}

// stats writes Stats' statement for n (Queue.Stats needs Table.EnqueuedAt):
// jobs ready (free, or their lease run out), waiting (a lease or a delay
// beyond one lease from now), in work (a lease ending within one), dead (-1
// without a dead table), and the age in microseconds of the oldest ready
// job, read in one condition rather than as the least of two minimums.
func stats(n *inbox.Names) inbox.Stmt {
	t, lease := n.Table, n.LockedUntil
	now, until, _ := clock(n)
	s := &stmt{}
	s.sql("SELECT (SELECT count(*) FROM ", t, " WHERE ", lease, " IS NULL OR ", lease, " <= ")
	now(s).sql("), (SELECT count(*) FROM ", t, " WHERE ", lease, " > ")
	until(s).sql("), (SELECT count(*) FROM ", t, " WHERE ", lease, " > ")
	now(s).sql(" AND ", lease, " <= ")
	until(s).sql("), ")
	if n.Dead != "" {
		s.sql("(SELECT count(*) FROM ", n.Dead, "), ")
	} else {
		s.sql("-1, ")
	}
	s.sql("CAST(EXTRACT(EPOCH FROM (")
	now(s).sql(" - (SELECT min(", n.EnqueuedAt, ") FROM ", t, " WHERE ", lease, " IS NULL OR ", lease, " <= ")
	now(s).sql("))) * 1000000 AS INT8)")
	return s.query()
}

// insert writes Enqueue's statement for n, with an id given (withID) and a
// not-before time (withAt) or not. RETURNING gives the id, whatever
// generates it (unique_rowid() in the schema below). A lease-form job
// delayed by Job.NotBefore is written with that time as its lease. The
// optional priority is the job's; the optional enqueue time the clock's.
func insert(n *inbox.Names, withID, withAt bool) inbox.Stmt {
	var cols []string
	var args []inbox.Arg
	if withID {
		cols, args = append(cols, n.ID), append(args, inbox.ArgID)
	}
	for i, col := range n.Data {
		cols, args = append(cols, col), append(args, inbox.ArgData+inbox.Arg(i))
	}
	if withAt {
		cols, args = append(cols, n.LockedUntil), append(args, inbox.ArgNotBefore)
	}
	if n.Priority != "" {
		cols, args = append(cols, n.Priority), append(args, inbox.ArgPriority)
	}
	s := (&stmt{}).sql("INSERT INTO ", n.Table)
	if len(cols) == 0 && n.EnqueuedAt == "" {
		return s.sql(" DEFAULT VALUES RETURNING ", n.ID).query()
	}
	if n.EnqueuedAt != "" {
		cols = append(cols, n.EnqueuedAt)
	}
	s.sql(" (", strings.Join(cols, ", "), ") VALUES (")
	for i, a := range args {
		if i > 0 {
			s.sql(", ")
		}
		s.arg(a)
	}
	if n.EnqueuedAt != "" {
		if len(args) > 0 {
			s.sql(", ")
		}
		now, _, _ := clock(n)
		now(s)
	}
	return s.sql(") RETURNING ", n.ID).query()
}

// IsDeadlock reports CockroachDB's transaction retry errors (SQLSTATE
// 40001, "restart transaction"), from the error's SQLState method (pgx,
// lib/pq) or its text. The package sends such a statement again: it was
// rolled back whole. Not 40003, "result is ambiguous": that statement may
// have committed, and sending it again is for the caller to decide.
func (dialect) IsDeadlock(err error) bool {
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
// columns, the lease column a TIMESTAMPTZ ([inbox.SchemaChecker]). It does
// not look at column families: SKIP LOCKED refuses a table with more than
// one, so create the table without FAMILY clauses.
func (dialect) CheckSchema(ctx context.Context, db *sql.DB, n *inbox.Names) ([]string, error) {
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
	tables := []struct {
		schema, name string
		cols         []string
	}{{n.Schema, n.TableName, append([]string{n.ID, n.Attempt, n.LockedUntil}, n.Data...)}}
	if n.Dead != "" {
		tables = append(tables, struct {
			schema, name string
			cols         []string
		}{n.DeadSchema, n.DeadName, append([]string{n.ID, n.Attempt}, n.Data...)})
	}
	if n.LastError != "" {
		for i := range tables {
			tables[i].cols = append(tables[i].cols, n.LastError)
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
		for _, quoted := range tb.cols {
			col := unquote(quoted)
			typ, ok := types[col]
			switch {
			case !ok:
				problems = append(problems, fmt.Sprintf("table %s has no column %s", tb.name, col))
			case quoted == n.LockedUntil && !isTimestampTZ(typ):
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

// unquote reverses QuoteIdent.
func unquote(q string) string {
	return strings.ReplaceAll(strings.TrimSuffix(strings.TrimPrefix(q, `"`), `"`), `""`, `"`)
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
