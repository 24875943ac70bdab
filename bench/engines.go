package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"
	_ "github.com/mattn/go-sqlite3"
	_ "modernc.org/sqlite"

	"github.com/sqlinbox/inbox"
)

// engine is one database and driver.
type engine struct {
	name    string // pq, pgx, mysql, mattn, modernc
	driver  string // database/sql driver name
	label   string // driver as printed
	family  string // postgres, mysql, sqlite
	dialect inbox.Dialect
	env     string // DSN variable; empty for SQLite
	def     string // DSN when env is unset
	file    func(dir string) string
}

// The DSN defaults are those of .ci/run.
const (
	pgDefault = "postgres://postgres@127.0.0.1:5432/inbox_test?sslmode=disable"
	myDefault = "root@tcp(127.0.0.1:3306)/inbox_test?parseTime=true"
)

var engines = []engine{
	{name: "pq", driver: "postgres", label: "lib/pq", family: "postgres", dialect: inbox.Postgres, env: "INBOX_POSTGRES_DSN", def: pgDefault},
	{name: "pgx", driver: "pgx", label: "pgx/v5/stdlib", family: "postgres", dialect: inbox.Postgres, env: "INBOX_POSTGRES_DSN", def: pgDefault},
	// mysql takes inbox.MariaDB when the server is MariaDB (see resolve);
	// mysqlplain keeps inbox.MySQL, MySQL 8's path, whatever the server.
	{name: "mysql", driver: "mysql", label: "go-sql-driver/mysql", family: "mysql", dialect: inbox.MySQL, env: "INBOX_MYSQL_DSN", def: myDefault},
	{name: "mysqlplain", driver: "mysql", label: "go-sql-driver/mysql, inbox.MySQL", family: "mysql", dialect: inbox.MySQL, env: "INBOX_MYSQL_DSN", def: myDefault},
	{name: "mattn", driver: "sqlite3", label: "mattn/go-sqlite3", family: "sqlite", dialect: inbox.SQLite, file: func(dir string) string {
		return "file:" + filepath.Join(dir, "bench.db") + "?_busy_timeout=10000&_journal_mode=WAL&_txlock=immediate"
	}},
	{name: "modernc", driver: "sqlite", label: "modernc.org/sqlite", family: "sqlite", dialect: inbox.SQLite, file: func(dir string) string {
		return "file:" + filepath.Join(dir, "bench.db") + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate"
	}},
}

func engineNamed(name string) (engine, error) {
	for _, e := range engines {
		if e.name == name {
			return e.resolve(), nil
		}
	}
	return engine{}, fmt.Errorf("unknown engine %q (want pq, pgx, mysql, mysqlplain, mattn or modernc)", name)
}

// resolve gives the mysql engine the dialect a user would choose for the
// server: inbox.MariaDB on MariaDB, whose batched Ack is one DELETE …
// RETURNING, inbox.MySQL otherwise, or when the server cannot be reached
// (opening it later says why).
func (e engine) resolve() engine {
	if e.name != "mysql" {
		return e
	}
	db, err := sql.Open(e.driver, e.dsn(""))
	if err != nil {
		return e
	}
	defer db.Close()
	var v string
	if db.QueryRow("SELECT VERSION()").Scan(&v) == nil && strings.Contains(strings.ToLower(v), "mariadb") {
		e.dialect = inbox.MariaDB
		e.label += ", inbox.MariaDB"
	}
	return e
}

// forms lists the claim forms of the engine: SQLite has no row lock.
func (e engine) forms() []string {
	if e.family == "sqlite" {
		return []string{"lease", "lease-async", "lease-shallow", "advisory"}
	}
	return []string{"lease", "lease-async", "lease-shallow", "rowlock", "advisory"}
}

// dsn is the engine's data source name: from its variable (with the tests'
// parseTime rule for MySQL), the default, or a file in dir for SQLite.
func (e engine) dsn(dir string) string {
	if e.file != nil {
		return e.file(dir)
	}
	v := os.Getenv(e.env)
	if v == "" {
		v = e.def
	}
	if e.family == "mysql" && !strings.Contains(v, "?") {
		v += "?parseTime=true"
	}
	return v
}

// open opens the engine with a pool of maxConns connections.
func (e engine) open(dir string, maxConns int) (*sql.DB, error) {
	return e.openDSN(e.dsn(dir), maxConns)
}

// ready sizes db's pool to maxConns, idle connections included, and
// checks that the server answers; db is closed when it does not.
func (e engine) ready(db *sql.DB, maxConns int) (*sql.DB, error) {
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	if err := db.Ping(); err != nil {
		db.Close()
		return nil, fmt.Errorf("%s: %w", e.name, err)
	}
	if e.family == "mysql" {
		var rc bool
		if err := db.QueryRow("SELECT @@tx_isolation = 'READ-COMMITTED'").Scan(&rc); err != nil {
			db.Close()
			return nil, fmt.Errorf("%s: %w", e.name, err)
		}
		sessionReadCommitted.Store(rc)
	}
	return db, nil
}

// sessionReadCommitted is true when the MySQL DSN runs sessions at READ
// COMMITTED (tx_isolation in the DSN, or the server's default).
var sessionReadCommitted atomic.Bool

// handTx is the level the hand-written MySQL loops begin their claims at:
// READ COMMITTED, which they set unless the session runs at it already, as
// a user who put it in the DSN would write them (and as inbox.MariaDB
// does).
func handTx() *sql.TxOptions {
	if sessionReadCommitted.Load() {
		return nil
	}
	return &sql.TxOptions{Isolation: sql.LevelReadCommitted}
}

func (e engine) openDSN(dsn string, maxConns int) (*sql.DB, error) {
	db, err := sql.Open(e.driver, dsn)
	if err != nil {
		return nil, err
	}
	return e.ready(db, maxConns)
}

// version names the server.
func (e engine) version(db *sql.DB) string {
	var v string
	var q string
	switch e.family {
	case "postgres":
		q = "SHOW server_version"
	case "mysql":
		q = "SELECT VERSION()"
	default:
		q = "SELECT 'SQLite ' || sqlite_version()"
	}
	if err := db.QueryRow(q).Scan(&v); err != nil {
		return "unknown (" + err.Error() + ")"
	}
	if e.family == "postgres" {
		v = "PostgreSQL " + v
	}
	return v
}

// createTable (re)creates a queue table: id, attempt, locked_until,
// payload; the advisory form keys on id.
func (e engine) createTable(ctx context.Context, db *sql.DB, table string) error {
	var create string
	switch e.family {
	case "postgres":
		create = "CREATE TABLE " + table + " (id bigserial PRIMARY KEY, attempt integer NOT NULL DEFAULT 1, locked_until timestamptz, payload bytea NOT NULL)"
	case "mysql":
		create = "CREATE TABLE " + table + " (id bigint AUTO_INCREMENT PRIMARY KEY, attempt integer NOT NULL DEFAULT 1, locked_until DATETIME(6) NULL, payload blob NOT NULL)"
	default:
		create = "CREATE TABLE " + table + " (id INTEGER PRIMARY KEY AUTOINCREMENT, attempt INTEGER NOT NULL DEFAULT 1, locked_until TEXT, payload BLOB NOT NULL)"
	}
	for _, s := range []string{"DROP TABLE IF EXISTS " + table, create} {
		if _, err := db.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("%s: %s: %w", e.name, s, err)
		}
	}
	return nil
}

// drop drops a table of the run.
func (e engine) drop(ctx context.Context, db *sql.DB, table string) error {
	_, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS "+table)
	return err
}

// empty deletes every row, fast, and restarts the ids.
func (e engine) empty(ctx context.Context, db *sql.DB, table string) error {
	var s string
	switch e.family {
	case "postgres":
		s = "TRUNCATE " + table + " RESTART IDENTITY"
	case "mysql":
		s = "TRUNCATE TABLE " + table
	default:
		// Without a WHERE, SQLite drops the table's pages at once.
		s = "DELETE FROM " + table
	}
	_, err := db.ExecContext(ctx, s)
	return err
}

// fill inserts n pending jobs with payload in one statement: Postgres from
// generate_series, MariaDB from its sequence engine (MySQL from a recursive
// CTE), SQLite from a recursive CTE.
func (e engine) fill(ctx context.Context, db *sql.DB, table string, n int, payload []byte) error {
	return e.fillUntil(ctx, db, table, n, payload, time.Time{})
}

// fillUntil is fill with every new row leased until until (none when zero).
func (e engine) fillUntil(ctx context.Context, db *sql.DB, table string, n int, payload []byte, until time.Time) error {
	if n <= 0 {
		return nil
	}
	var lu any // NULL
	switch {
	case until.IsZero():
	case e.family == "postgres":
		lu = until
	case e.family == "mysql":
		lu = until.UTC().Format("2006-01-02 15:04:05.000000")
	default:
		lu = until.UTC().Format(inbox.SQLiteTimeFormat)
	}
	switch e.family {
	case "postgres":
		_, err := db.ExecContext(ctx, "INSERT INTO "+table+" (payload, locked_until) SELECT $1::bytea, $3::timestamptz FROM generate_series(1, $2)", payload, n, lu)
		return err
	case "mysql":
		conn, err := db.Conn(ctx)
		if err != nil {
			return err
		}
		defer conn.Close()
		var version string
		if err := conn.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
			return err
		}
		if strings.Contains(strings.ToLower(version), "mariadb") {
			// seq_1_to_N is a table of the sequence engine; n is ours.
			_, err = conn.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s (payload, locked_until) SELECT ?, ? FROM seq_1_to_%d", table, n), payload, lu)
			return err
		}
		if _, err := conn.ExecContext(ctx, fmt.Sprintf("SET SESSION cte_max_recursion_depth = %d", n+1)); err != nil {
			return err
		}
		_, err = conn.ExecContext(ctx, "INSERT INTO "+table+" (payload, locked_until) WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < ?) SELECT ?, ? FROM s", n, payload, lu)
		return err
	default:
		_, err := db.ExecContext(ctx, "INSERT INTO "+table+" (payload, locked_until) WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < ?) SELECT ?, ? FROM s", n, payload, lu)
		return err
	}
}

// count returns the rows left in table.
func count(ctx context.Context, db *sql.DB, table string) (int, error) {
	var n int
	err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+table).Scan(&n)
	return n, err
}
