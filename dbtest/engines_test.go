package dbtest

import (
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"
	_ "github.com/mattn/go-sqlite3"
	_ "modernc.org/sqlite"

	"github.com/sqlinbox/inbox"
)

// Engine is one database and driver the suites run on.
type Engine struct {
	Name    string // pq, pgx, mysql, mariadb, mattn, modernc
	Driver  string // the database/sql driver name
	Dialect inbox.Dialect
	// dsn returns the data source name; for SQLite a file in dir.
	dsn func(dir string) string
	env string // the environment variable naming the DSN, empty for SQLite
}

// Engines lists every engine and driver, in a fixed order.
var Engines = []Engine{
	{Name: "pq", Driver: "postgres", Dialect: inbox.Postgres, env: "INBOX_POSTGRES_DSN"},
	{Name: "pgx", Driver: "pgx", Dialect: inbox.Postgres, env: "INBOX_POSTGRES_DSN"},
	{Name: "mysql", Driver: "mysql", Dialect: inbox.MySQL, env: "INBOX_MYSQL_DSN"},
	// The same server through inbox.MariaDB; skipped on MySQL (see OpenDSN).
	{Name: "mariadb", Driver: "mysql", Dialect: inbox.MariaDB, env: "INBOX_MYSQL_DSN"},
	{Name: "mattn", Driver: "sqlite3", Dialect: inbox.SQLite, dsn: func(dir string) string {
		return "file:" + filepath.Join(dir, "inbox.db") + "?_busy_timeout=10000&_journal_mode=WAL&_txlock=immediate"
	}},
	{Name: "modernc", Driver: "sqlite", Dialect: inbox.SQLite, dsn: func(dir string) string {
		return "file:" + filepath.Join(dir, "inbox.db") + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate"
	}},
}

// IsSQLite, IsPostgres and IsMySQL tell the engine's family; MySQL's
// includes inbox.MariaDB.
func (e Engine) IsSQLite() bool   { return e.Dialect == inbox.SQLite }
func (e Engine) IsPostgres() bool { return e.Dialect == inbox.Postgres }
func (e Engine) IsMySQL() bool    { return e.Dialect == inbox.MySQL || e.Dialect == inbox.MariaDB }

// DSN returns the engine's data source name, skipping the test (or failing
// it under INBOX_REQUIRE_DBS=1) when the environment names none. dir is the
// directory of a SQLite file.
func (e Engine) DSN(t testing.TB, dir string) string {
	t.Helper()
	if e.dsn != nil {
		return e.dsn(dir)
	}
	v := os.Getenv(e.env)
	if v == "" {
		if os.Getenv("INBOX_REQUIRE_DBS") == "1" {
			t.Fatalf("%s is not set and INBOX_REQUIRE_DBS=1: the %s suite must run", e.env, e.Name)
		}
		t.Skipf("%s is not set: skipping the %s suite (set INBOX_REQUIRE_DBS=1 to make this a failure)", e.env, e.Name)
	}
	if e.Driver == "mysql" && !strings.Contains(v, "?") {
		v += "?parseTime=true"
	}
	return v
}

// Open opens the engine's database with a pool of maxConns connections,
// closed when the test ends. SQLite files live in a directory of the test's.
func (e Engine) Open(t testing.TB, maxConns int) *sql.DB {
	t.Helper()
	return e.OpenDSN(t, e.DSN(t, t.TempDir()), maxConns)
}

// OpenDSN opens dsn with the engine's driver.
func (e Engine) OpenDSN(t testing.TB, dsn string, maxConns int) *sql.DB {
	t.Helper()
	db, err := sql.Open(e.Driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	openedBy(t)
	if err := db.Ping(); err != nil {
		t.Fatalf("%s: %v", e.Name, err)
	}
	t.Cleanup(func() { db.Close() })
	if e.Dialect == inbox.MariaDB {
		var v string
		if err := db.QueryRow("SELECT VERSION()").Scan(&v); err != nil {
			t.Fatalf("%s: %v", e.Name, err)
		}
		if !strings.Contains(strings.ToLower(v), "mariadb") {
			t.Skipf("%s: the server is %s, not MariaDB: inbox.MariaDB's suite runs on MariaDB only", e.Name, v)
		}
	}
	return db
}

// Schema returns the statements that (re)create a queue table named table,
// its dead table table_dead and the side table of the row-lock claims
// counter table_claims for the engine. The queue table has the columns id,
// attempt, payload, locked_until, k (an advisory key, text) and not_before;
// its ids are never reused (SQLite: AUTOINCREMENT), so that no job takes the
// id, and with it the token, of one deleted before it.
func (e Engine) Schema(table string) []string {
	dead, claims := table+"_dead", table+"_claims"
	drop := []string{"DROP TABLE IF EXISTS " + table, "DROP TABLE IF EXISTS " + dead, "DROP TABLE IF EXISTS " + claims}
	switch {
	case e.IsPostgres():
		return append(drop,
			"CREATE TABLE "+table+" (id bigserial PRIMARY KEY, attempt integer NOT NULL DEFAULT 1, locked_until timestamptz, "+
				"payload bytea NOT NULL, k text NOT NULL DEFAULT '', not_before timestamptz)",
			"CREATE TABLE "+dead+" (id bigint PRIMARY KEY, attempt integer NOT NULL, payload bytea NOT NULL)",
			"CREATE TABLE "+claims+" (id bigint PRIMARY KEY, claims integer NOT NULL)",
		)
	case e.IsMySQL():
		return append(drop,
			"CREATE TABLE "+table+" (id bigint AUTO_INCREMENT PRIMARY KEY, attempt integer NOT NULL DEFAULT 1, locked_until DATETIME(6) NULL, "+
				"payload blob NOT NULL, k varchar(64) NOT NULL DEFAULT '', not_before DATETIME(6) NULL)",
			"CREATE TABLE "+dead+" (id bigint PRIMARY KEY, attempt integer NOT NULL, payload blob NOT NULL)",
			"CREATE TABLE "+claims+" (id bigint PRIMARY KEY, claims integer NOT NULL)",
		)
	default:
		return append(drop,
			"CREATE TABLE "+table+" (id INTEGER PRIMARY KEY AUTOINCREMENT, attempt INTEGER NOT NULL DEFAULT 1, locked_until TEXT, "+
				"payload BLOB NOT NULL, k TEXT NOT NULL DEFAULT '', not_before TEXT)",
			"CREATE TABLE "+dead+" (id INTEGER PRIMARY KEY, attempt INTEGER NOT NULL, payload BLOB NOT NULL)",
			"CREATE TABLE "+claims+" (id INTEGER PRIMARY KEY, claims INTEGER NOT NULL)",
		)
	}
}

// CreateTable runs Schema(table) on db.
func (e Engine) CreateTable(t testing.TB, db *sql.DB, table string) {
	t.Helper()
	for _, s := range e.Schema(table) {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("%s: %s: %v", e.Name, s, err)
		}
	}
}

// Table describes table (made by CreateTable) in the given form: "lease",
// "lease-shallow" (Table.Shallow: CreateTable makes no claim index),
// "rowlock", "rowlock-claims" (with the claims counter in table_claims and
// MaxClaims [ClaimsLimit]), "advisory" (key on id) or "advisory-k" (key on
// column k).
func Table(table, form string) inbox.Table {
	tb := inbox.Table{Name: table, DeadTable: table + "_dead"}
	switch form {
	case "lease":
		tb.LockedUntil = "locked_until"
	case "lease-shallow":
		tb.LockedUntil, tb.Shallow = "locked_until", true
	case "rowlock":
		tb.NotBefore = "not_before"
	case "rowlock-claims":
		tb.NotBefore = "not_before"
		tb.ClaimsTable, tb.MaxClaims = table+"_claims", ClaimsLimit
	case "advisory":
		tb.AdvisoryKey = "id"
		tb.NotBefore = "not_before"
	case "advisory-k":
		tb.AdvisoryKey = "k"
		tb.NotBefore = "not_before"
	default:
		panic(fmt.Sprintf("unknown form %q", form))
	}
	return tb
}

// ClaimsLimit is the MaxClaims of the "rowlock-claims" form.
const ClaimsLimit = 3

// Forms lists the forms an engine supports; SQLite has no row lock.
func (e Engine) Forms() []string {
	if e.IsSQLite() {
		return []string{"lease", "advisory"}
	}
	return []string{"lease", "rowlock", "advisory"}
}
