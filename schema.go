package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"strconv"
	"strings"
)

// colKind is what a column of the description must hold.
type colKind int

const (
	kindID     colKind = iota // integer or text
	kindInt                   // integer
	kindTime                  // the engine's time representation
	kindAny                   // data: whatever the caller stores
	kindString                // text
)

var kindText = map[colKind]string{kindID: "an integer or text type", kindInt: "an integer type", kindAny: "any type", kindString: "a text type"}

type colWant struct {
	field, name string
	kind        colKind
}

// tableRole is which of a description's tables a check reads.
type tableRole int

const (
	queueTable tableRole = iota
	deadTable
	claimsTable
)

// checkedTable is one table a schema check reads: schema (empty when not
// qualified), name, and its role.
type checkedTable struct {
	schema, name string
	role         tableRole
}

// checkedTables lists the tables the description names.
func checkedTables(n *dialect.Names) []checkedTable {
	ts := []checkedTable{{n.Schema, n.TableName, queueTable}}
	if n.Dead != "" {
		ts = append(ts, checkedTable{n.DeadSchema, n.DeadName, deadTable})
	}
	if n.ClaimsTable != "" {
		ts = append(ts, checkedTable{n.ClaimsSchema, n.ClaimsName, claimsTable})
	}
	return ts
}

// wantedColumns lists the columns the description names, unquoted; for the
// dead table, the ones a move copies; for the claims table, id and claims.
func wantedColumns(n *dialect.Names, role tableRole) []colWant {
	r := n.Raw
	if role == claimsTable {
		return []colWant{{"ID", r.ID, kindID}, {"ClaimsTable", "claims", kindInt}}
	}
	w := []colWant{{"ID", r.ID, kindID}, {"Attempt", r.Attempt, kindInt}}
	for i, c := range r.Data {
		w = append(w, colWant{"Data[" + strconv.Itoa(i) + "]", c, kindAny})
	}
	if r.LastError != "" {
		w = append(w, colWant{"LastError", r.LastError, kindString})
	}
	if role == deadTable {
		// The time of death is the dead table's own column.
		if r.DeadAt != "" {
			w = append(w, colWant{"DeadAt", r.DeadAt, kindTime})
		}
		return w
	}
	if r.Priority != "" {
		w = append(w, colWant{"Priority", r.Priority, kindInt})
	}
	if r.EnqueuedAt != "" {
		w = append(w, colWant{"EnqueuedAt", r.EnqueuedAt, kindTime})
	}
	if r.LockedUntil != "" {
		w = append(w, colWant{"LockedUntil", r.LockedUntil, kindTime})
	}
	if r.AdvisoryKey != "" && r.AdvisoryKey != r.ID {
		w = append(w, colWant{"AdvisoryKey", r.AdvisoryKey, kindID})
	}
	if r.NotBefore != "" {
		w = append(w, colWant{"NotBefore", r.NotBefore, kindTime})
	}
	if r.UniqueKey != "" {
		w = append(w, colWant{"UniqueKey", r.UniqueKey, kindString})
	}
	return w
}

// uniqueKeyProblem says the unique key's column lacks its index.
func uniqueKeyProblem(n *dialect.Names) string {
	return fmt.Sprintf("table %s: Table.UniqueKey %q has no unique index of its own (a unique index on that column alone, not partial): "+
		"without it two jobs could hold one key; see docs/unique.md", n.Raw.Name, n.Raw.UniqueKey)
}

// priorityNullable reports a Table.Priority column that accepts NULL, asked
// of the engine's catalog by query with args (true when it does; no row
// when there is no such column, reported as missing). A column added
// without NOT NULL DEFAULT 0 holds NULL in the rows from before, which a
// claim cannot read into the delivery's priority: every claim that meets
// one fails, and where NULLs sort first (PostgreSQL's DESC) every claim.
func priorityNullable(ctx context.Context, db *sql.DB, n *dialect.Names, query string, args ...any) ([]string, error) {
	if n.Priority == "" {
		return nil, nil
	}
	var nullable bool
	err := db.QueryRowContext(ctx, query, args...).Scan(&nullable)
	if errors.Is(err, sql.ErrNoRows) || err == nil && !nullable {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return []string{fmt.Sprintf("table %s: Table.Priority %q accepts NULL, which a claim cannot read (the rows from before the column "+
		"was added hold it): set them to 0 (UPDATE %s SET %s = 0 WHERE %s IS NULL) and declare the column NOT NULL DEFAULT 0",
		n.Raw.Name, n.Raw.Priority, n.Raw.Name, n.Raw.Priority, n.Raw.Priority)}, nil
}

// readColumns runs a query returning (name, type) rows, keyed by name.
func readColumns(ctx context.Context, db *sql.DB, query string, args ...any) (map[string]string, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	cols := map[string]string{}
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			return nil, err
		}
		cols[name] = typ
	}
	return cols, rows.Err()
}

// columnRules are how one engine's column types are judged.
type columnRules struct {
	// fits tells whether a column type fits a column kind.
	fits func(colKind, string) bool
	// timeType names the time type the engine wants, for messages.
	timeType string
	// exactNames is true for engines whose quoted names are
	// case-sensitive (PostgreSQL); MySQL and SQLite column names are not.
	exactNames bool
	// textCap returns how many characters a text type holds, ok false
	// when the engine does not limit it; nil where no type is limited
	// (SQLite).
	textCap func(typ string) (n int, ok bool)
	// widen is the statement that makes a text column hold MaxErrorText.
	widen func(table, column string) string
}

// compareColumns reports the wanted columns that are missing or of a type
// the rules refuse, and a LastError column too narrow for MaxErrorText.
func compareColumns(schema, table string, cols map[string]string, want []colWant, r columnRules) []string {
	name := table
	if schema != "" {
		name = schema + "." + table
	}
	if len(cols) == 0 {
		return []string{fmt.Sprintf("table %s does not exist", name)}
	}
	var problems []string
	for _, w := range want {
		typ, ok := cols[w.name]
		if !ok && !r.exactNames {
			for c, t := range cols {
				if strings.EqualFold(c, w.name) {
					typ, ok = t, true
				}
			}
		}
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("table %s has no column %s (Table.%s)", name, w.name, w.field))
		case !r.fits(w.kind, typ):
			wantText := kindText[w.kind]
			if w.kind == kindTime {
				wantText = r.timeType
			}
			problems = append(problems, fmt.Sprintf("column %s.%s (Table.%s) is %s, want %s", name, w.name, w.field, typ, wantText))
		case w.field == "LastError" && r.textCap != nil:
			// A text cut to MaxErrorText bytes still has up to as many
			// characters; a narrower column refuses it, and each
			// settlement carrying it is sent again without it.
			if n, limited := r.textCap(typ); limited && n < MaxErrorText {
				problems = append(problems, fmt.Sprintf("column %s.%s (Table.LastError) is %s, which holds %d characters: an error text is kept up to "+
					"MaxErrorText (%d bytes), and a longer one than the column holds is refused and dropped; widen it: %s",
					name, w.name, typ, n, MaxErrorText, r.widen(name, w.name)))
			}
		}
	}
	return problems
}

// versionBelow reports whether a version string ("10.11.19-MariaDB",
// "8.0.36", "3.46.1") is below major.minor.
func versionBelow(v string, major, minor int) bool {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return true
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(strings.TrimFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	if err1 != nil || err2 != nil {
		return true
	}
	return ma < major || (ma == major && mi < minor)
}

// checkTables compares the queue table and the dead table with the
// description, reading each table's columns with query (schema, table).
func checkTables(ctx context.Context, db *sql.DB, n *dialect.Names, query string, r columnRules) ([]string, error) {
	var problems []string
	for _, tb := range checkedTables(n) {
		cols, err := readColumns(ctx, db, query, tb.schema, tb.name)
		if err != nil {
			return nil, err
		}
		problems = append(problems, compareColumns(tb.schema, tb.name, cols, wantedColumns(n, tb.role), r)...)
	}
	return problems, nil
}

// SchemaError lists every problem a schema check found.
type SchemaError struct {
	Table    string
	Problems []string
}

func (e *SchemaError) Error() string {
	return fmt.Sprintf("inbox: schema of %s: %s", e.Table, strings.Join(e.Problems, "; "))
}

// CheckSchema verifies the table against the description: the table and
// every column exist with fitting types (a LastError column holding
// [MaxErrorText]; InnoDB tables on MySQL and MariaDB), the dead table too,
// and the server supports the form (its version; an engine that only
// speaks like PostgreSQL or MySQL, told by what it answers). On PostgreSQL,
// for the advisory form and [Config.Prepare], it also checks that each
// connection of the pool keeps one server session, which a transaction
// pooler (PgBouncer's pool_mode = transaction) does not: the lease and the
// row lock need no session and are not asked. For the lease form under the
// engine's clock (no [Config.Now]) on MySQL and MariaDB it reads that clock
// on up to four connections of the pool at once and reports a server whose
// clock differs from this process's, or from another's, by more than
// [Config.KeepMargin], the skew between servers a lease tolerates
// (docs/scaling.md, "Clocks that disagree"). It reports every problem at
// once in a [*SchemaError]; a dialect that does not match the database is
// one problem naming the engine found and the dialect to use. Any other
// error means the check could not run. It changes nothing.
func (q *Queue) CheckSchema(ctx context.Context) error {
	c, ok := capability[dialect.SchemaChecker](q.dialect)
	if !ok {
		return fmt.Errorf("inbox: check schema: dialect %s has no schema check", q.dialect.Name())
	}
	problems, err := c.CheckSchema(ctx, q.db, &q.names)
	if err != nil {
		return opErr("check schema", err)
	}
	// Sessions are asked about only on a server the check found fit (not
	// one that is not PostgreSQL at all, whose answer would be an error).
	if p, ok := capability[sessionProber](q.dialect); ok && len(problems) == 0 && (q.names.Form == Advisory || q.cfg.Prepare) {
		found, err := q.checkSessions(ctx, p)
		if err != nil {
			return opErr("check schema", err)
		}
		problems = append(problems, found...)
	}
	// The clocks are read only on a server the check found fit, and only
	// where the engine's clock decides a lease (clock.go).
	if q.names.Form == Lease && q.names.DBClock && q.st.Now.SQL != "" && len(problems) == 0 {
		rs, err := q.readClocks(ctx)
		if err != nil {
			return opErr("check schema: read the engine's clock", err)
		}
		if p := clockProblem(rs, q.margin, q.lease); p != "" {
			problems = append(problems, p)
		}
	}
	if len(problems) > 0 {
		return &SchemaError{Table: q.names.Raw.Name, Problems: problems}
	}
	return nil
}

// keyUnwritten reports whether Enqueue leaves the advisory key column out
// of its insert: a key other than the id, not among the data columns. The
// database must then fill it (a default, a generated column), which only
// the schema check can tell: New accepts such a description.
func keyUnwritten(n *dialect.Names) bool {
	r := n.Raw
	if r.AdvisoryKey == "" || strings.EqualFold(r.AdvisoryKey, r.ID) {
		return false
	}
	for _, c := range r.Data {
		if strings.EqualFold(c, r.AdvisoryKey) {
			return false
		}
	}
	return true
}

// keyValueProblem says that the advisory key column gets no value: Enqueue
// does not write it and the database does not fill it.
func keyValueProblem(n *dialect.Names) string {
	return fmt.Sprintf("column %s.%s (Table.AdvisoryKey) is not in Table.Data %q and has no default, so Enqueue would insert each job "+
		"without a key (refused where the column is NOT NULL: MySQL's error 1364, PostgreSQL's 23502): list it in Table.Data and "+
		"give each Job its key, or give the column a default", n.Raw.Name, n.Raw.AdvisoryKey, n.Raw.Data)
}

// claimsKeyProblem says that the claims table's id is not a key of its own.
func claimsKeyProblem(n *dialect.Names) string {
	return fmt.Sprintf("table %s: column %s is not its primary key (nor alone in a unique index), which the claims count's upsert needs",
		n.Raw.ClaimsTable, n.Raw.ID)
}

// The schema check's first statement tells which engine answers, by what a
// user can neither create nor set, so that a look-alike is told apart even
// where its version string was set to another's, and a schema, database or
// function a user named after a look-alike's (crdb_internal, _vt,
// yb_servers) misleads nothing. Each family has its own, as what tells is
// each family's syntax:
//
//   - pgProbe: pg_catalog's version(), built into the server and qualified
//     so that no function on the search_path stands in for it, and set by
//     no setting: "CockroachDB CCL v…" (its build, as the read-only
//     crdb_version), "PostgreSQL 11.2-YB-…" (YugabyteDB's build),
//     "PostgreSQL …".
//   - myProbe: version() and version_comment, a variable no session or
//     statement sets: TiDB's is "TiDB Server …" (a ScopeNone variable,
//     whatever server-version says), vtgate answers it itself with its
//     build line "Version: … (Git revision …)" (vitess go/vt/sysvars, a
//     read-only variable, whatever --mysql_server_version says). The
//     version string stays a second signal: "…-TiDB-…", "…-Vitess",
//     "…-vitess-…", "…-MariaDB…".
//   - sqliteProbe: SQLite has no version() and no @@, the servers no
//     sqlite_version().
//
// A dialect sends its own first, one round trip on its engine; when that
// fails, the database is of another family, and the others' ask in turn,
// so that a dialect sent to the wrong server names the server instead of
// failing on its syntax.
const (
	pgProbe     = "SELECT pg_catalog.version()"
	myProbe     = "SELECT version(), @@version_comment"
	sqliteProbe = "SELECT sqlite_version()"
)

// Engines the schema check can tell apart.
const (
	enginePostgres  = "PostgreSQL"
	engineCockroach = "CockroachDB"
	engineYugabyte  = "YugabyteDB"
	engineMySQL     = "MySQL"
	engineMariaDB   = "MariaDB"
	engineTiDB      = "TiDB"
	engineVitess    = "Vitess"
	engineSQLite    = "SQLite"
)

// A server is what the schema check's first statement found: the engine
// ("" when its answers name none the check knows), its version string, and
// what told the engine apart.
type server struct {
	engine, version, by string
}

func (s server) String() string {
	if s.engine == "" {
		return fmt.Sprintf("a server whose version is %q", s.version)
	}
	return fmt.Sprintf("%s (version %q, told by %s)", s.engine, s.version, s.by)
}

// speaksPostgres and speaksMySQL tell the protocol family of the engine.
func (s server) speaksPostgres() bool {
	return s.engine == enginePostgres || s.engine == engineCockroach || s.engine == engineYugabyte
}

func (s server) speaksMySQL() bool {
	return s.engine == engineMySQL || s.engine == engineMariaDB || s.engine == engineTiDB || s.engine == engineVitess
}

// classifyPostgres tells the engine from pgProbe's answer.
func classifyPostgres(version string) server {
	switch {
	case strings.HasPrefix(version, "CockroachDB"):
		return server{engineCockroach, version, "its pg_catalog.version()"}
	case strings.Contains(version, "-YB-"):
		return server{engineYugabyte, version, "its pg_catalog.version()"}
	case strings.HasPrefix(version, "PostgreSQL"):
		return server{enginePostgres, version, "its pg_catalog.version()"}
	}
	return server{"", version, ""}
}

// classifyMySQL tells the engine from myProbe's answers: version_comment
// first, then the version string.
func classifyMySQL(version, comment string) server {
	v := strings.ToLower(version)
	switch {
	case strings.HasPrefix(comment, "TiDB"):
		return server{engineTiDB, version, "its version_comment"}
	case strings.HasPrefix(comment, "Version: ") && strings.Contains(comment, "(Git revision "):
		return server{engineVitess, version, "its version_comment, vtgate's build line"}
	case strings.Contains(v, "tidb"):
		return server{engineTiDB, version, "its version string"}
	case strings.Contains(v, "vitess"):
		return server{engineVitess, version, "its version string"}
	case strings.Contains(v, "mariadb"):
		return server{engineMariaDB, version, "its version string"}
	case version != "" && version[0] >= '0' && version[0] <= '9':
		return server{engineMySQL, version, "its version string"}
	}
	return server{"", version, ""}
}

// A prober sends one family's first statement and tells the engine.
type prober func(context.Context, *sql.DB) (server, error)

func askPostgres(ctx context.Context, db *sql.DB) (server, error) {
	var version string
	if err := db.QueryRowContext(ctx, pgProbe).Scan(&version); err != nil {
		return server{}, err
	}
	return classifyPostgres(version), nil
}

func askMySQL(ctx context.Context, db *sql.DB) (server, error) {
	var version string
	var comment sql.NullString
	if err := db.QueryRowContext(ctx, myProbe).Scan(&version, &comment); err != nil {
		return server{}, err
	}
	return classifyMySQL(version, comment.String), nil
}

func askSQLite(ctx context.Context, db *sql.DB) (server, error) {
	var version string
	if err := db.QueryRowContext(ctx, sqliteProbe).Scan(&version); err != nil {
		return server{}, err
	}
	return server{engineSQLite, version, "sqlite_version()"}, nil
}

// probeServer asks with each prober in turn, the dialect's own first: the
// first that answers tells the engine; when none does, the first one's
// error is returned.
func probeServer(ctx context.Context, db *sql.DB, probes ...prober) (server, error) {
	var first error
	for _, p := range probes {
		s, err := p(ctx, db)
		if err == nil {
			return s, nil
		}
		if first == nil {
			first = err
		}
	}
	return server{}, first
}

// dialectFor names the dialect to use on an engine.
var dialectFor = map[string]string{
	enginePostgres:  "inbox.Postgres",
	engineCockroach: "inbox.Postgres (lease form) or the dialect of examples/cockroach",
	engineYugabyte:  "inbox.Postgres",
	engineMySQL:     "inbox.MySQL",
	engineMariaDB:   "inbox.MariaDB or inbox.MySQL",
	engineTiDB:      "inbox.MySQL (advisory form)",
	engineVitess:    "inbox.MySQL (advisory form)",
	engineSQLite:    "inbox.SQLite",
}

// wrongDialect is the problem of a dialect sent to a server of another
// engine: every other statement would fail on the server's syntax.
func wrongDialect(s server, dialect, speaks string) string {
	use := dialectFor[s.engine]
	if use == "" {
		use = "the dialect of that engine"
	}
	return fmt.Sprintf("the database is %s, not %s: the dialect %s cannot run there; use %s", s, speaks, dialect, use)
}
