package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"path/filepath"
	"strings"
	"time"
)

// The optional interfaces of package dialect that sqlite has.
var (
	_ dialect.TableIdentifier = sqlite{}
	_ dialect.InMemory        = sqlite{}
	_ dialect.BatchDialect    = sqlite{}
	_ dialect.BulkEnqueuer    = sqlite{}
	_ dialect.SchemaChecker   = sqlite{}
)

// SQLite is the dialect of SQLite 3.35 or later (RETURNING), through
// mattn/go-sqlite3 or modernc.org/sqlite. SQLite has no row locks: a SQLite
// table names the lease or the advisory form. Times are TEXT in one
// fixed-width UTC format ([SQLiteTimeFormat]) that the package writes and
// compares itself, so that both drivers agree; the clock is the caller's
// (time.Now unless [Config.Now] is set). Under the advisory form the process
// holds the keys in work, so one process serves a database file.
var SQLite Dialect = sqlite{}

type sqlite struct{}

func (sqlite) Name() string { return "sqlite" }

// QuoteIdent quotes with backticks. SQLite reads a double-quoted name that
// names no column as a string literal (its double-quoted-string fallback):
// with a missing column a claim would deliver "last_error" as the last
// error and Stats would compute an age from the text "enqueued_at". A name in
// backticks is always an identifier, so a missing column is an error ("no
// such column") in every statement; brackets would do as well but cannot
// hold a "]".
func (sqlite) QuoteIdent(s string) (string, error) { return quoteSQLite(s), nil }

// quoteSQLite quotes one SQLite identifier in backticks, doubling any inside.
func quoteSQLite(s string) string { return "`" + strings.ReplaceAll(s, "`", "``") + "`" }

// SQLiteTimeFormat is the text of a time in a SQLite table: UTC, microseconds,
// fixed width, so that text order is time order.
const SQLiteTimeFormat = "2006-01-02T15:04:05.000000Z"

func (sqlite) TimeArg(t time.Time) any { return t.UTC().Format(SQLiteTimeFormat) }

func (sqlite) ScanTime(src any) (time.Time, error) {
	switch s := src.(type) {
	case string:
		return time.Parse(SQLiteTimeFormat, s)
	case []byte:
		return time.Parse(SQLiteTimeFormat, string(s))
	case time.Time:
		// mattn/go-sqlite3 parses columns declared DATETIME or TIMESTAMP;
		// the schema check asks for TEXT.
		return s.UTC(), nil
	}
	return time.Time{}, fmt.Errorf("sqlite: time column returned %T, want TEXT", src)
}

// Statements: SQLite has UPDATE … RETURNING but no row locks and no SKIP
// LOCKED; a write holds the database's one write lock from its first read to
// its end, so one UPDATE … RETURNING claims atomically. The clock is always
// the caller's, passed as parameters.
func (sqlite) Statements(n *dialect.Names) (*Statements, error) {
	if n.NotifyChannel != "" {
		return nil, fmt.Errorf("Config.NotifyChannel %q: SQLite has no notifications; idle workers of other processes find jobs by polling", n.NotifyChannel)
	}
	t := dialect.NewTemplate(n, dialect.Question, "$now", "$until")
	var st *Statements
	switch n.Form {
	case Lease:
		st = sqliteLease(t, n)
	case Advisory:
		st = sqliteAdvisory(t, n)
	default:
		return nil, fmt.Errorf("SQLite has no row locks: name Table.LockedUntil for the lease form or Table.AdvisoryKey for the advisory form")
	}
	enqueue(st, n, dialect.Question, true, "")
	st.Unique = uniqueStatements(t, n, false)
	deadJobs(t, n, st, true, true)
	st.Browse = browseStatements(t, n, "$now", "$until")
	// In work under the advisory form is the process's own count.
	free, due := statsOldest(n, "$now")
	st.Jobs.Stats = t.Query("SELECT " + statsCounts(n, "$now", "$until", "-1") +
		", CAST((julianday($now) - julianday(COALESCE(MIN(" + free + ", " + due + "), " + free + ", " + due + "))) * 86400000000 AS INTEGER)")
	st.Settle.Verdict = verdictRead(t, n)
	st.Control = sqliteControl(t, n)
	return st, nil
}

// sqliteLease: one statement claims, holding the write lock throughout.
func sqliteLease(t *dialect.Template, n *dialect.Names) *Statements {
	st := &Statements{}
	// Expired rows and free ones are read apart, each an ordered, limited
	// read of the index on (lease, id), so that a head of rows under lease
	// in force is never walked: the expired ones longest expired first, then
	// free ones in id order, the compound cut at the limit as it reads. An
	// ORDER BY over the compound (lowest ids of both) made SQLite sort each
	// branch in a temporary B-tree and cost the claim two to three times a
	// hand-written one; as it stands it sorts nothing. The rows come back in
	// id order, as the UPDATE visits them.
	claim := "UPDATE {table} SET {attempt} = {attempt} + 1, {lease} = {until} WHERE {id} IN (" +
		"SELECT {id} FROM (SELECT {id} FROM {table} WHERE {lease} <= {now} ORDER BY {lease} LIMIT $limit)" +
		" UNION ALL " +
		"SELECT {id} FROM (SELECT {id} FROM {table} WHERE {lease} IS NULL ORDER BY {id} LIMIT $limit)" +
		" LIMIT $limit)" +
		" RETURNING {id}, {attempt} - 1, {lease}{, data}{, extra}"
	if n.Priority != "" {
		// The compound read carries the priority to order by; IN takes
		// its ids alone.
		claim = "UPDATE {table} SET {attempt} = {attempt} + 1, {lease} = {until} WHERE {id} IN (SELECT {id} FROM (" +
			"SELECT {pick} FROM (SELECT {pick} FROM {table} WHERE {lease} IS NULL ORDER BY {order} LIMIT $limit)" +
			" UNION ALL " +
			"SELECT {pick} FROM (SELECT {pick} FROM {table} WHERE {lease} <= {now} ORDER BY {priority} DESC, +{id} LIMIT $limit)" +
			" ORDER BY {order} LIMIT $limit))" +
			" RETURNING {id}, {attempt} - 1, {lease}{, data}{, extra}"
	}
	if n.Shallow {
		// No index on the lease: one read in claim order through the
		// rowid (or the priority's index) steps over the few rows under
		// lease, and a lease written updates no index.
		claim = "UPDATE {table} SET {attempt} = {attempt} + 1, {lease} = {until} WHERE {id} IN (" +
			"SELECT {id} FROM {table} WHERE {lease} IS NULL OR {lease} <= {now} ORDER BY {order} LIMIT $limit)" +
			" RETURNING {id}, {attempt} - 1, {lease}{, data}{, extra}"
	}
	// A claim of one names its row with "=": SQLite then updates in one
	// pass, where IN collects the rows in a temporary table first.
	st.Claim.Take = t.Query(claim)
	st.Claim.TakeOne = t.Query(strings.Replace(claim, " IN (", " = (", 1))
	st.Settle.Extend = t.Exec("UPDATE {table} SET {lease} = {until} WHERE " + leaseToken)
	st.Settle.Ack = t.Exec("DELETE FROM {table} WHERE " + leaseToken)
	st.Settle.Retry = t.Exec("UPDATE {table} SET {lease} = {until}{, set error} WHERE " + leaseToken)
	st.Settle.Release = t.Exec("UPDATE {table} SET {lease} = NULL, {attempt} = {attempt} - 1 WHERE " + leaseToken)
	if n.Dead != "" {
		st.Settle.Dead, st.Settle.DeadDelete = deadCopy(t, leaseToken)
	}
	return st
}

// sqliteAdvisory: the process holds the keys (no session locks); the claim
// re-reads the row after the key is taken and commits the attempt, if it is
// still the one the candidate read saw.
func sqliteAdvisory(t *dialect.Template, n *dialect.Names) *Statements {
	st := &Statements{}
	st.Advisory.Candidates, st.Advisory.CandidatesAfter = candidates(t)
	st.Claim.Take = t.Query("UPDATE {table} SET {attempt} = {attempt} + 1 WHERE {id} = $id AND {attempt} = $delivered{and ready}" +
		" RETURNING {id}, {attempt} - 1{, data}{, extra}")
	advisorySettlements(t, n, st)
	if n.Dead != "" {
		st.Settle.Dead, st.Settle.DeadDelete = deadCopy(t, advisoryToken)
	}
	return st
}

// CheckSchema checks the version (3.35, for RETURNING), the tables' columns,
// that a rowid id cannot be reused, and an advisory key Enqueue leaves
// without a value ([dialect.SchemaChecker]). A server reached with this dialect is
// named, with the dialect to use.
func (sqlite) CheckSchema(ctx context.Context, db *sql.DB, n *dialect.Names) ([]string, error) {
	var problems []string
	s, err := probeServer(ctx, db, askSQLite, askPostgres, askMySQL)
	if err != nil {
		return nil, err
	}
	if s.engine != engineSQLite {
		return []string{wrongDialect(s, "inbox.SQLite", engineSQLite)}, nil
	}
	version := s.version
	if versionBelow(version, 3, 35) {
		problems = append(problems, fmt.Sprintf("SQLite %s is older than 3.35, which brought RETURNING", version))
	}
	check := func(schema, table string, role tableRole) error {
		// xinfo: pragma_table_info leaves generated columns out.
		q := "SELECT name, type FROM pragma_table_xinfo(?)"
		args := []any{table}
		if schema != "" {
			q = "SELECT name, type FROM pragma_table_xinfo(?, ?)"
			args = append(args, schema)
		}
		cols, err := readColumns(ctx, db, q, args...)
		if err != nil {
			return err
		}
		// TEXT holds any length, whatever the declared type says.
		problems = append(problems, compareColumns(schema, table, cols, wantedColumns(n, role), columnRules{fits: sqliteKind, timeType: "TEXT"})...)
		return nil
	}
	for _, tb := range checkedTables(n) {
		if err := check(tb.schema, tb.name, tb.role); err != nil {
			return nil, err
		}
	}
	found, err := sqliteKeyProblems(ctx, db, n)
	if err != nil {
		return nil, err
	}
	return append(problems, found...), nil
}

// sqliteKeyProblems checks what the columns' types cannot tell: a
// nullable priority, ids reused, the unique key's index, an advisory key
// no enqueue writes.
func sqliteKeyProblems(ctx context.Context, db *sql.DB, n *dialect.Names) ([]string, error) {
	var problems []string
	found, err := priorityNullable(ctx, db, n, sqlitePriorityNullable, n.TableName, sqliteSchema(n), n.Raw.Priority)
	if err != nil {
		return nil, err
	}
	problems = append(problems, found...)
	reuse, err := sqliteReusesIDs(ctx, db, n)
	if err != nil {
		return nil, err
	}
	if reuse {
		problems = append(problems, fmt.Sprintf("table %s: its id is INTEGER PRIMARY KEY without AUTOINCREMENT, so a new job takes the id of a deleted one (a stale holder's token could match it): declare it INTEGER PRIMARY KEY AUTOINCREMENT", n.Raw.Name))
	}
	if p, err := sqliteUniqueProblem(ctx, db, n); err != nil {
		return nil, err
	} else if p != "" {
		problems = append(problems, p)
	}
	if keyUnwritten(n) {
		var filled bool
		err := db.QueryRowContext(ctx, sqliteKeyFilled, n.TableName, sqliteSchema(n), n.Raw.AdvisoryKey).Scan(&filled)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			// Reported as a missing column.
		case err != nil:
			return nil, err
		case !filled:
			problems = append(problems, keyValueProblem(n))
		}
	}
	return problems, nil
}

// sqlitePriorityNullable tells whether the priority column accepts NULL
// (priorityNullable).
const sqlitePriorityNullable = `SELECT "notnull" = 0 FROM pragma_table_xinfo(?, ?) WHERE name = ? COLLATE NOCASE`

// sqliteKeyFilled tells whether SQLite fills a column an insert leaves out
// (the advisory key, when Enqueue does not write it): a default or a
// generated column (hidden 2 or 3; pragma_table_info omits those).
const sqliteKeyFilled = "SELECT dflt_value IS NOT NULL OR hidden IN (2, 3) FROM pragma_table_xinfo(?, ?) WHERE name = ? COLLATE NOCASE"

// sqliteSchema is the schema of the queue table: main unless named.
func sqliteSchema(n *dialect.Names) string {
	if n.Schema == "" {
		return "main"
	}
	return strings.ToLower(n.Schema)
}

// sqliteReusesIDs reports whether the queue table's id is SQLite's rowid
// without AUTOINCREMENT: SQLite then gives a new row the highest id in use
// plus one, which is the id of the job deleted last when it was the highest.
func sqliteReusesIDs(ctx context.Context, db *sql.DB, n *dialect.Names) (bool, error) {
	schema := sqliteSchema(n)
	var typ string
	var pk, pks int
	err := db.QueryRowContext(ctx, "SELECT type, pk, (SELECT COUNT(*) FROM pragma_table_info(?, ?) WHERE pk > 0)"+
		" FROM pragma_table_info(?, ?) WHERE name = ? COLLATE NOCASE",
		n.TableName, schema, n.TableName, schema, n.Raw.ID).Scan(&typ, &pk, &pks)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil // reported as a missing column
	}
	// Only a lone INTEGER PRIMARY KEY is the rowid.
	if err != nil || pk != 1 || pks != 1 || !strings.EqualFold(typ, "INTEGER") {
		return false, err
	}
	var ddl string
	q := "SELECT sql FROM " + quoteSQLite(schema) + ".sqlite_master WHERE type = 'table' AND name = ? COLLATE NOCASE"
	if err := db.QueryRowContext(ctx, q, n.TableName).Scan(&ddl); err != nil {
		return false, err
	}
	// The DDL as written: AUTOINCREMENT is a keyword SQLite keeps there,
	// and a WITHOUT ROWID table has no rowid to reuse.
	ddl = strings.ToUpper(ddl)
	return !strings.Contains(ddl, "AUTOINCREMENT") && !strings.Contains(ddl, "WITHOUT ROWID"), nil
}

// sqliteKind tells whether a declared SQLite type fits a column kind.
func sqliteKind(k colKind, declared string) bool {
	d := strings.ToUpper(declared)
	switch k {
	case kindID:
		return strings.Contains(d, "INT") || strings.Contains(d, "TEXT") || strings.Contains(d, "CHAR") || d == "BLOB" || d == ""
	case kindInt:
		return strings.Contains(d, "INT")
	case kindString:
		return strings.Contains(d, "TEXT") || strings.Contains(d, "CHAR") || d == ""
	case kindTime:
		// TEXT affinity keeps the package's format as written; mattn would
		// turn DATETIME into Go times.
		return d == "TEXT"
	}
	return true
}

// BatchStatements builds the lease settlements of size tokens at once
// ([dialect.BatchDialect]): those of Postgres, with the tokens as an OR of per-token
// conditions, each searched by rowid, where a row-value IN would scan the
// table.
func (sqlite) BatchStatements(n *dialect.Names, size int) (*dialect.BatchStatements, error) {
	if n.Form != Lease {
		return nil, fmt.Errorf("batched settlement is for the lease form")
	}
	t := dialect.NewTemplate(n, dialect.Question, "", "$until")
	where := " WHERE " + tokensOr(size) + " RETURNING {id}"
	return &dialect.BatchStatements{
		Size:    size,
		Ack:     t.Query("DELETE FROM {table}" + where),
		Release: t.Query("UPDATE {table} SET {lease} = NULL, {attempt} = {attempt} - 1" + where),
		Retry:   t.Query("UPDATE {table} SET {lease} = {until}" + where),
	}, nil
}

// sqliteMemory stands for the file of a database in memory, which is its
// pool's alone: the queue keeps such a table's keys with the pool, not the
// process.
const sqliteMemory = ":memory:"

// TableIdentity is the table's database file and its name in lower case, as
// SQLite's names are ([dialect.TableIdentifier]): every pool of the process on one
// file shares the keys in work, however the table is spelled ("jobs",
// "main.jobs", "JOBS"). A database with no file (in memory) is its pool's
// alone.
func (sqlite) TableIdentity(ctx context.Context, db *sql.DB, n *dialect.Names) (string, error) {
	schema := n.Schema
	if schema == "" {
		schema = "main"
	}
	var file sql.NullString
	err := db.QueryRowContext(ctx, "SELECT (SELECT file FROM pragma_database_list WHERE name = ? COLLATE NOCASE)", schema).Scan(&file)
	if err != nil {
		return "", err
	}
	if !file.Valid {
		return "", fmt.Errorf("no attached database %q", schema)
	}
	path := file.String
	if path == "" {
		path = sqliteMemory
	} else if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	}
	return path + "\x00" + strings.ToLower(n.TableName), nil
}

// EnqueueMany is Enqueue's insert with a row per job; RETURNING lists the
// rows in no set order, and the core sorts the integer ids SQLite assigns
// (each one larger than the table's largest). SQLite takes 32,766
// parameters since 3.32 (mattn/go-sqlite3 and modernc.org/sqlite bundle
// later ones); an older library linked in takes 999.
// IsInMemory reports whether identity names a table of a database in
// memory ([dialect.InMemory]).
func (sqlite) IsInMemory(identity string) bool {
	return strings.HasPrefix(identity, sqliteMemory+"\x00")
}

func (sqlite) EnqueueMany(n *dialect.Names, rows int, withID, withAt bool) dialect.ManyStatements {
	return dialect.ManyStatements{Insert: enqueueRows(n, dialect.Question, true, "", rows, withID, withAt)}
}

func (sqlite) MaxEnqueueParams() int { return 32766 }

// sqliteUniqueProblem checks the unique key's index, when one is named.
func sqliteUniqueProblem(ctx context.Context, db *sql.DB, n *dialect.Names) (string, error) {
	if n.UniqueKey == "" {
		return "", nil
	}
	var unique bool
	err := db.QueryRowContext(ctx, sqliteUniqueIndexed, n.TableName, sqliteSchema(n), n.Raw.UniqueKey).Scan(&unique)
	if err != nil || unique {
		return "", err
	}
	return uniqueKeyProblem(n), nil
}

// sqliteUniqueIndexed tells whether column ?3 of table ?1 (schema ?2) has
// a unique index of its own, whole: a UNIQUE constraint or index.
const sqliteUniqueIndexed = "SELECT EXISTS (SELECT 1 FROM pragma_index_list(?1, ?2) AS l WHERE l.\"unique\" AND NOT l.partial " +
	"AND (SELECT COUNT(*) FROM pragma_index_info(l.name, ?2)) = 1 " +
	"AND (SELECT name FROM pragma_index_info(l.name, ?2)) = ?3 COLLATE NOCASE)"

// sqliteControl pauses and resumes (Statements.Control). Pause is one
// upsert (SQLite 3.24) whose unqualified columns are the stored row's,
// read before any assignment, as PostgreSQL's; the time is the caller's
// clock in the TEXT format of every time column.
func sqliteControl(t *dialect.Template, n *dialect.Names) dialect.ControlStatements {
	if n.ControlTable == "" {
		return dialect.ControlStatements{}
	}
	return dialect.ControlStatements{
		Pause: t.Exec("INSERT INTO {control} (queue, paused_at, paused_by) VALUES ($queue, $now, $by) ON CONFLICT (queue) DO UPDATE " +
			"SET paused_at = COALESCE(paused_at, excluded.paused_at), paused_by = CASE WHEN paused_at IS NULL THEN excluded.paused_by ELSE paused_by END"),
		Resume: t.Exec(controlResume),
		Read:   t.Query(controlRead),
	}
}
