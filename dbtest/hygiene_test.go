package dbtest

// The suite's end checks (TestMain): the tables registered by the crash,
// load, cut and partition tests must be left with no session in a
// transaction and no advisory lock held, and no table of this process left.

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/dbtest/internal/procsock"
)

// hygieneRegistry holds the tables the end of the suite checks: the row-lock
// and advisory tables of the crash, load and cut tests.
var hygieneRegistry struct {
	sync.Mutex
	tables []hygieneTable
}

type hygieneTable struct {
	engine Engine
	table  string // as described to inbox
	maxID  int64  // advisory keys on id: 1..maxID; 0 for none
}

// checkAtEnd adds table to the suite-end checks: no session left in a
// transaction on it and, when maxID > 0, no advisory lock held on its keys,
// its ids 1..maxID.
func checkAtEnd(e Engine, table string, maxID int64) {
	hygieneRegistry.Lock()
	defer hygieneRegistry.Unlock()
	hygieneRegistry.tables = append(hygieneRegistry.tables, hygieneTable{e, table, maxID})
}

// suiteHygiene returns what the suite left behind on the databases.
//
// Sessions: a shared server also serves other test processes, whose
// sessions may legitimately sit in a transaction (a row-lock job in work is
// one). The check therefore looks only at sessions this process holds,
// matched by client port (procsock), and, on PostgreSQL, at any session whose
// last statement named a registered table (those names carry this process's
// id): that also catches a session of a killed child still open. After the
// run every pool is closed, so a session of this process still open in a
// transaction belongs to a transaction or connection never given back.
//
// Advisory locks: every registered table's keys, whoever holds them.
func suiteHygiene(ctx context.Context) []string {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var problems []string
	if dsn := os.Getenv("INBOX_POSTGRES_DSN"); dsn != "" {
		problems = append(problems, pgHygiene(ctx, dsn)...)
	}
	if dsn := os.Getenv("INBOX_MYSQL_DSN"); dsn != "" {
		problems = append(problems, myHygiene(ctx, dsn)...)
	}
	return problems
}

// hygieneTablesOf returns the registered tables of one engine family.
func hygieneTablesOf(d inbox.Dialect) []hygieneTable {
	hygieneRegistry.Lock()
	defer hygieneRegistry.Unlock()
	var out []hygieneTable
	for _, r := range hygieneRegistry.tables {
		if r.engine.Dialect == d {
			out = append(out, r)
		}
	}
	return out
}

// dsnPort returns the port a DSN names (URL or key=value form for
// PostgreSQL, tcp(host:port) for MySQL), or def.
func dsnPort(dsn string, def int) int {
	host := ""
	if u, err := url.Parse(dsn); err == nil && u.Host != "" {
		host = u.Host
	} else if i := strings.Index(dsn, "tcp("); i >= 0 {
		if j := strings.IndexByte(dsn[i:], ')'); j > 0 {
			host = dsn[i+4 : i+j]
		}
	} else {
		for _, kv := range strings.Fields(dsn) {
			if v, ok := strings.CutPrefix(kv, "port="); ok {
				if p, err := strconv.Atoi(v); err == nil {
					return p
				}
			}
		}
	}
	if _, port, err := net.SplitHostPort(host); err == nil {
		if p, err := strconv.Atoi(port); err == nil {
			return p
		}
	}
	return def
}

func pgHygiene(ctx context.Context, dsn string) []string {
	ports, err := procsock.LocalPorts(dsnPort(dsn, 5432))
	if err != nil {
		return []string{"postgres: listing this process's sockets: " + err.Error()}
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return []string{"postgres: " + err.Error()}
	}
	defer db.Close()
	regs := hygieneTablesOf(inbox.Postgres)
	problems, err := pgSessions(ctx, db, ports, regs)
	if err != nil {
		problems = append(problems, "postgres: listing sessions: "+err.Error())
	}
	locks, err := pgHeldKeys(ctx, db, regs)
	if err != nil {
		problems = append(problems, "postgres: listing advisory locks: "+err.Error())
	}
	problems = append(problems, locks...)
	return append(problems, leftTables(ctx, db, "postgres",
		`SELECT schemaname || '.' || tablename FROM pg_tables WHERE tablename ~ ('_' || $1 || '(_|$)')`)...)
}

// leftTables lists the tables named with this process's id (the
// suites' way of naming tables of their own) that are still there: a suite
// must drop what it made, claims and effects tables included, or a user's
// database fills up with them run after run.
func leftTables(ctx context.Context, db *sql.DB, engine, query string) []string {
	rows, err := db.QueryContext(ctx, query, strconv.Itoa(os.Getpid()))
	if err != nil {
		return []string{engine + ": listing tables: " + err.Error()}
	}
	defer rows.Close()
	var problems []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return append(problems, engine+": listing tables: "+err.Error())
		}
		problems = append(problems, fmt.Sprintf("%s: table %s, named by this run, was not dropped", engine, name))
	}
	if err := rows.Err(); err != nil {
		problems = append(problems, engine+": listing tables: "+err.Error())
	}
	return problems
}

func myHygiene(ctx context.Context, dsn string) []string {
	ports, err := procsock.LocalPorts(dsnPort(dsn, 3306))
	if err != nil {
		return []string{"mysql: listing this process's sockets: " + err.Error()}
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return []string{"mysql: " + err.Error()}
	}
	defer db.Close()
	problems, err := mySessions(ctx, db, ports)
	if err != nil {
		problems = append(problems, "mysql: listing sessions: "+err.Error())
	}
	locks, err := myHeldKeys(ctx, db, hygieneTablesOf(inbox.MySQL))
	if err != nil {
		problems = append(problems, "mysql: checking named locks: "+err.Error())
	}
	problems = append(problems, locks...)
	return append(problems, leftTables(ctx, db, "mysql",
		"SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name REGEXP CONCAT('_', ?, '(_|$)')")...)
}

// TestCrashHygieneDetects shows that the suite-end checks can fail: a
// session of this process left in a transaction, and a held advisory lock of
// a registered key, are reported; once let go, they are not.
func TestCrashHygieneDetects(t *testing.T) {
	for _, e := range Engines {
		if e.IsSQLite() || e.Name == "pgx" {
			continue // one run per server suffices
		}
		t.Run(e.Name, func(t *testing.T) {
			ctx := context.Background()
			dsn := e.DSN(t, "")
			db := e.OpenDSN(t, dsn, 4)
			table := fmt.Sprintf("crash_hyg_%s_%d", e.Name, os.Getpid())
			e.CreateTable(t, db, table)
			t.Cleanup(func() { dropNow(t, db, table, table+"_dead", table+"_claims") })
			reg := []hygieneTable{{e, table, 3}}
			conn, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			tx, err := conn.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			// A locking read opens the InnoDB transaction (MariaDB lists a
			// transaction only once it touched something) and names the table.
			if _, err := tx.ExecContext(ctx, "SELECT id FROM "+table+" FOR UPDATE"); err != nil {
				t.Fatal(err)
			}
			port := dsnPort(dsn, 0)
			var sessions, locks func() []string
			key := "2"
			ident, err := schemaIdent(ctx, e, db, table)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case e.IsPostgres():
				if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_lock($1)", inbox.PostgresLockKey(ident, key)); err != nil {
					t.Fatal(err)
				}
				sessions = func() []string {
					ports, err := procsock.LocalPorts(port)
					if err != nil {
						t.Fatal(err)
					}
					p, err := pgSessions(ctx, db, ports, reg)
					if err != nil {
						t.Fatal(err)
					}
					return p
				}
				locks = func() []string {
					p, err := pgHeldKeys(ctx, db, reg)
					if err != nil {
						t.Fatal(err)
					}
					return p
				}
			default:
				if _, err := tx.ExecContext(ctx, "SELECT GET_LOCK(?, 0)", inbox.MySQLLockName(ident, key)); err != nil {
					t.Fatal(err)
				}
				sessions = func() []string {
					ports, err := procsock.LocalPorts(port)
					if err != nil {
						t.Fatal(err)
					}
					p, err := mySessions(ctx, db, ports)
					if err != nil {
						t.Fatal(err)
					}
					return p
				}
				locks = func() []string {
					p, err := myHeldKeys(ctx, db, reg)
					if err != nil {
						t.Fatal(err)
					}
					return p
				}
			}
			var pid int64
			if e.IsPostgres() {
				err = tx.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid)
			} else {
				err = tx.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&pid)
			}
			if err != nil {
				t.Fatal(err)
			}
			mention := func(ps []string, what string) bool {
				for _, p := range ps {
					if strings.Contains(p, what) {
						return true
					}
				}
				return false
			}
			// MariaDB serves INNODB_TRX from a cache it refreshes only when
			// the last read is over 100 ms old, and another test may just
			// have read it: poll, slower than the cache's age.
			eventuallyEvery(t, 30*time.Second, 150*time.Millisecond, "the session open in a transaction to be reported", func() error {
				if s := sessions(); !mention(s, fmt.Sprintf("session %d ", pid)) {
					return fmt.Errorf("session %d open in a transaction not reported; reported: %q", pid, s)
				}
				return nil
			})
			if l := locks(); !mention(l, "key "+key) {
				t.Errorf("held lock of key %s not reported; reported: %q", key, l)
			}
			if err := tx.Rollback(); err != nil {
				t.Fatal(err)
			}
			// Session locks outlive the transaction: let go on the session.
			if e.IsPostgres() {
				_, err = conn.ExecContext(ctx, "SELECT pg_advisory_unlock_all()")
			} else {
				_, err = conn.ExecContext(ctx, "SELECT RELEASE_ALL_LOCKS()")
			}
			if err != nil {
				t.Fatal(err)
			}
			if l := locks(); len(l) > 0 {
				t.Errorf("locks still reported after unlocking: %q", l)
			}
			// The same cache: poll for the rollback to show.
			eventuallyEvery(t, 30*time.Second, 150*time.Millisecond, "the rolled back session to leave the report", func() error {
				if s := sessions(); mention(s, fmt.Sprintf("session %d ", pid)) {
					return fmt.Errorf("session %d still reported after its rollback: %q", pid, s)
				}
				return nil
			})
		})
	}
}
