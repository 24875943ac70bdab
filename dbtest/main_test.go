package dbtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/dbtest/internal/optin"
	"github.com/sqlinbox/inbox/dbtest/internal/procsock"
)

// TestMain runs the suite, then checks its hygiene: no goroutine left
// running (goleak), no session of this process left open in a transaction,
// and no advisory lock left held on a key of the tables the crash, load,
// cut and partition tests registered. Each check runs only when the tests
// passed, so that a failure is not buried under its aftermath.
//
// Without a database's variable, its suites skip (Engine.DSN); TestMain then
// says so where a person running the README's test command will see it
// (skipNotice).
//
// With INBOX_CHILD set the binary is not a test run but a worker process of
// the crash and load tests (crash_test.go, load_test.go): the tests re-execute
// it with the role in INBOX_CHILD and its configuration in
// INBOX_CHILD_CONFIG, and kill it.
func TestMain(m *testing.M) {
	if role := os.Getenv("INBOX_CHILD"); role != "" {
		os.Exit(crashXChildMain(role))
	}
	code := m.Run()
	skipNotice()
	if code == 0 {
		if problems := crashXSuiteHygiene(context.Background()); len(problems) > 0 {
			fmt.Fprintf(os.Stderr, "hygiene: the suite left behind:\n  %s\n", strings.Join(problems, "\n  "))
			code = 1
		}
	}
	if code == 0 {
		// No driver needs an exception: every goroutine the drivers start
		// (database/sql's opener, go-sql-driver/mysql's watchers, lib/pq's
		// cancel watchers) ends when its pool or connection is closed, and
		// goleak retries for a while so that those still unwinding finish.
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: goroutines left running after a successful run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// skipNotice tells a person that the database suites skipped, in one line
// at the end of the package's run, with or without -v, unless
// INBOX_REQUIRE_DBS=1 (then a missing database failed the tests instead).
//
// The line goes to the controlling terminal, /dev/tty, when there is one:
// `go test` with several packages (the README's command) shows nothing a
// passing package printed, on stdout or stderr, so a skip said there, or by
// t.Skip, would go unseen. Without a terminal (CI, a pipe without one) the
// line goes to stderr, where `go test` shows it for a failing package or in
// a run of the current directory; under -v always to stderr, in order with
// the tests' output (optin.Notice). A result `go test` took from its cache
// runs no binary and says nothing: -count=1 runs the suites again.
//
// Rejected: printing from a test (swallowed like the rest) and failing the
// package (a newcomer without databases must see the command pass).
func skipNotice() {
	if os.Getenv("INBOX_REQUIRE_DBS") == "1" {
		return
	}
	var skipped []string
	for _, v := range []struct{ env, suites string }{
		{"INBOX_POSTGRES_DSN", "PostgreSQL (pq, pgx)"},
		{"INBOX_MYSQL_DSN", "MariaDB/MySQL (mysql)"},
	} {
		if os.Getenv(v.env) == "" {
			skipped = append(skipped, v.env+" is not set: skipped the "+v.suites+" tests")
		}
	}
	if len(skipped) == 0 {
		return
	}
	them := "it"
	if len(skipped) > 1 {
		them = "them"
	}
	optin.Notice("dbtest: " + strings.Join(skipped, "; ") + ". Set " + them +
		" to run those tests (see the README); INBOX_REQUIRE_DBS=1 makes a missing one fail.\n")
}

// crashXRegistry holds the tables the end of the suite checks: the row-lock
// and advisory tables of the crash, load and cut tests.
var crashXRegistry struct {
	sync.Mutex
	tables []crashXRegistered
}

type crashXRegistered struct {
	engine Engine
	table  string // as described to inbox
	maxID  int64  // advisory keys on id: 1..maxID; 0 for none
}

// crashXRegister adds table to the suite-end checks: no session left in a
// transaction on it and, when maxID > 0, no advisory lock held on its keys,
// its ids 1..maxID.
func crashXRegister(e Engine, table string, maxID int64) {
	crashXRegistry.Lock()
	defer crashXRegistry.Unlock()
	crashXRegistry.tables = append(crashXRegistry.tables, crashXRegistered{e, table, maxID})
}

// crashXSuiteHygiene returns what the suite left behind on the databases.
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
func crashXSuiteHygiene(ctx context.Context) []string {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var problems []string
	if dsn := os.Getenv("INBOX_POSTGRES_DSN"); dsn != "" {
		problems = append(problems, crashXPostgresHygiene(ctx, dsn)...)
	}
	if dsn := os.Getenv("INBOX_MYSQL_DSN"); dsn != "" {
		problems = append(problems, crashXMySQLHygiene(ctx, dsn)...)
	}
	return problems
}

// crashXRegisteredFor returns the registered tables of one engine family.
func crashXRegisteredFor(d inbox.Dialect) []crashXRegistered {
	crashXRegistry.Lock()
	defer crashXRegistry.Unlock()
	var out []crashXRegistered
	for _, r := range crashXRegistry.tables {
		if r.engine.Dialect == d {
			out = append(out, r)
		}
	}
	return out
}

// crashXServerPort returns the port a DSN names (URL or key=value form for
// PostgreSQL, tcp(host:port) for MySQL), or def.
func crashXServerPort(dsn string, def int) int {
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

func crashXPostgresHygiene(ctx context.Context, dsn string) []string {
	ports, err := procsock.LocalPorts(crashXServerPort(dsn, 5432))
	if err != nil {
		return []string{"postgres: listing this process's sockets: " + err.Error()}
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return []string{"postgres: " + err.Error()}
	}
	defer db.Close()
	regs := crashXRegisteredFor(inbox.Postgres)
	problems, err := crashXPostgresSessions(ctx, db, ports, regs)
	if err != nil {
		problems = append(problems, "postgres: listing sessions: "+err.Error())
	}
	locks, err := crashXPostgresHeldKeys(ctx, db, regs)
	if err != nil {
		problems = append(problems, "postgres: listing advisory locks: "+err.Error())
	}
	problems = append(problems, locks...)
	return append(problems, crashXLeftTables(ctx, db, "postgres",
		`SELECT schemaname || '.' || tablename FROM pg_tables WHERE tablename ~ ('_' || $1 || '(_|$)')`)...)
}

// crashXLeftTables lists the tables named with this process's id (the
// suites' way of naming tables of their own) that are still there: a suite
// must drop what it made, claims and effects tables included, or a user's
// database fills up with them run after run.
func crashXLeftTables(ctx context.Context, db *sql.DB, engine, query string) []string {
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

// crashXPostgresSessions lists the sessions idle in a transaction that are
// this process's (client port in ports) or whose last statement named one
// of regs' tables.
func crashXPostgresSessions(ctx context.Context, db *sql.DB, ports map[int]bool, regs []crashXRegistered) ([]string, error) {
	rows, err := db.QueryContext(ctx, `SELECT pid, coalesce(client_port, -1), state, left(query, 300)
		FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var problems []string
	for rows.Next() {
		var pid, port int
		var state, query string
		if err := rows.Scan(&pid, &port, &state, &query); err != nil {
			return problems, err
		}
		mine := ports[port]
		for _, r := range regs {
			mine = mine || strings.Contains(query, r.table)
		}
		if mine {
			problems = append(problems, fmt.Sprintf("postgres: session %d (client port %d) is %s after: %s", pid, port, state, query))
		}
	}
	return problems, rows.Err()
}

// crashXPostgresHeldKeys lists the advisory locks held on the keys of regs.
func crashXPostgresHeldKeys(ctx context.Context, db *sql.DB, regs []crashXRegistered) ([]string, error) {
	if len(regs) == 0 {
		return nil, nil
	}
	// A bigint advisory key shows in pg_locks as classid (high half), objid
	// (low half) and objsubid 1.
	rows, err := db.QueryContext(ctx, `SELECT classid::bigint, objid::bigint, pid FROM pg_locks
		WHERE locktype = 'advisory' AND objsubid = 1 AND granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	held := map[int64]int{}
	for rows.Next() {
		var hi, lo int64
		var pid int
		if err := rows.Scan(&hi, &lo, &pid); err != nil {
			return nil, err
		}
		held[int64(uint64(hi)<<32|uint64(lo))] = pid
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var problems []string
	for _, r := range regs {
		ident, err := crashXIdent(ctx, r.engine, db, r.table)
		if err != nil {
			return problems, err
		}
		for id := int64(1); id <= r.maxID && len(held) > 0; id++ {
			if pid, ok := held[inbox.PostgresLockKey(ident, strconv.FormatInt(id, 10))]; ok {
				problems = append(problems, fmt.Sprintf("postgres: session %d holds the advisory lock of %s key %d", pid, r.table, id))
			}
		}
	}
	return problems, nil
}

func crashXMySQLHygiene(ctx context.Context, dsn string) []string {
	ports, err := procsock.LocalPorts(crashXServerPort(dsn, 3306))
	if err != nil {
		return []string{"mysql: listing this process's sockets: " + err.Error()}
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return []string{"mysql: " + err.Error()}
	}
	defer db.Close()
	problems, err := crashXMySQLSessions(ctx, db, ports)
	if err != nil {
		problems = append(problems, "mysql: listing sessions: "+err.Error())
	}
	locks, err := crashXMySQLHeldKeys(ctx, db, crashXRegisteredFor(inbox.MySQL))
	if err != nil {
		problems = append(problems, "mysql: checking named locks: "+err.Error())
	}
	problems = append(problems, locks...)
	return append(problems, crashXLeftTables(ctx, db, "mysql",
		"SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name REGEXP CONCAT('_', ?, '(_|$)')")...)
}

// crashXMySQLSessions lists this process's sessions (client port in ports)
// that are idle (Sleep) with an InnoDB transaction open. MariaDB keeps no
// last statement of an idle session, so sessions are matched by port only.
func crashXMySQLSessions(ctx context.Context, db *sql.DB, ports map[int]bool) ([]string, error) {
	rows, err := db.QueryContext(ctx, `SELECT p.ID, p.HOST, t.trx_started FROM information_schema.PROCESSLIST p
		JOIN information_schema.INNODB_TRX t ON t.trx_mysql_thread_id = p.ID
		WHERE p.COMMAND = 'Sleep' AND p.ID <> CONNECTION_ID()`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var problems []string
	for rows.Next() {
		var id int64
		var host, started string
		if err := rows.Scan(&id, &host, &started); err != nil {
			return problems, err
		}
		_, port, _ := net.SplitHostPort(host)
		if p, err := strconv.Atoi(port); err == nil && ports[p] {
			problems = append(problems, fmt.Sprintf("mysql: session %d (%s) is idle in a transaction started %s", id, host, started))
		}
	}
	return problems, rows.Err()
}

// crashXMySQLHeldKeys lists the named locks held on the keys of regs.
func crashXMySQLHeldKeys(ctx context.Context, db *sql.DB, regs []crashXRegistered) ([]string, error) {
	var problems []string
	for _, r := range regs {
		if r.maxID == 0 {
			continue
		}
		ident, err := crashXIdent(ctx, r.engine, db, r.table)
		if err != nil {
			return problems, err
		}
		found, err := crashXMySQLUsedLocks(ctx, db, ident, r.maxID)
		if err != nil {
			return problems, err
		}
		problems = append(problems, found...)
	}
	return problems, nil
}

// crashXIdent is the identity the advisory form names an unqualified
// table's locks by: schema and name on PostgreSQL, database and name on
// MariaDB (inbox.TableIdentifier).
func crashXIdent(ctx context.Context, e Engine, db *sql.DB, table string) (string, error) {
	q := "SELECT current_schema()"
	if e.IsMySQL() {
		q = "SELECT DATABASE()"
	}
	var schema string
	err := db.QueryRowContext(ctx, q).Scan(&schema)
	return schema + "." + table, err
}

// crashXMySQLUsedLocks asks IS_USED_LOCK for the keys 1..maxID of table, a
// few hundred per statement.
func crashXMySQLUsedLocks(ctx context.Context, db interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, table string, maxID int64) ([]string, error) {
	const chunk = 500
	var problems []string
	for lo := int64(1); lo <= maxID; lo += chunk {
		hi := min(lo+chunk-1, maxID)
		var b strings.Builder
		args := make([]any, 0, chunk)
		b.WriteString("SELECT CONCAT_WS(',', NULL")
		for id := lo; id <= hi; id++ {
			b.WriteString(", IF(IS_USED_LOCK(?) IS NULL, NULL, CONCAT(?, ':', IS_USED_LOCK(?)))")
			name := inbox.MySQLLockName(table, strconv.FormatInt(id, 10))
			args = append(args, name, id, name)
		}
		b.WriteString(")")
		var used string
		if err := db.QueryRowContext(ctx, b.String(), args...).Scan(&used); err != nil {
			return problems, err
		}
		if used == "" {
			continue
		}
		for _, kv := range strings.Split(used, ",") {
			id, conn, _ := strings.Cut(kv, ":")
			problems = append(problems, fmt.Sprintf("mysql: connection %s holds the named lock of %s key %s", conn, table, id))
		}
	}
	return problems, nil
}

// crashXAssertNoLocks fails t when an advisory lock of one of the keys
// 1..maxID of table is held by anyone (PostgreSQL, MariaDB; SQLite holds
// keys in the process).
func crashXAssertNoLocks(t testing.TB, e Engine, db *sql.DB, table string, maxID int64) {
	t.Helper()
	ctx := context.Background()
	reg := []crashXRegistered{{e, table, maxID}}
	var problems []string
	var err error
	switch {
	case e.IsPostgres():
		problems, err = crashXPostgresHeldKeys(ctx, db, reg)
	case e.IsMySQL():
		problems, err = crashXMySQLHeldKeys(ctx, db, reg)
	default:
		return
	}
	if err != nil {
		t.Fatalf("%s: checking advisory locks of %s: %v", e.Name, table, err)
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		t.Fatalf("%s: advisory locks left held:\n%s", e.Name, strings.Join(problems, "\n"))
	}
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
			t.Cleanup(func() { crashXDrop(t, db, table, table+"_dead", table+"_claims") })
			reg := []crashXRegistered{{e, table, 3}}
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
			port := crashXServerPort(dsn, 0)
			var sessions, locks func() []string
			key := "2"
			switch {
			case e.IsPostgres():
				if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_lock($1)", inbox.PostgresLockKey(lockIdent(t, e, db, table), key)); err != nil {
					t.Fatal(err)
				}
				sessions = func() []string {
					ports, err := procsock.LocalPorts(port)
					if err != nil {
						t.Fatal(err)
					}
					p, err := crashXPostgresSessions(ctx, db, ports, reg)
					if err != nil {
						t.Fatal(err)
					}
					return p
				}
				locks = func() []string {
					p, err := crashXPostgresHeldKeys(ctx, db, reg)
					if err != nil {
						t.Fatal(err)
					}
					return p
				}
			default:
				if _, err := tx.ExecContext(ctx, "SELECT GET_LOCK(?, 0)", inbox.MySQLLockName(lockIdent(t, e, db, table), key)); err != nil {
					t.Fatal(err)
				}
				sessions = func() []string {
					ports, err := procsock.LocalPorts(port)
					if err != nil {
						t.Fatal(err)
					}
					p, err := crashXMySQLSessions(ctx, db, ports)
					if err != nil {
						t.Fatal(err)
					}
					return p
				}
				locks = func() []string {
					p, err := crashXMySQLHeldKeys(ctx, db, reg)
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
			crashXEventuallyEvery(t, 30*time.Second, 150*time.Millisecond, "the session open in a transaction to be reported", func() error {
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
			crashXEventuallyEvery(t, 30*time.Second, 150*time.Millisecond, "the rolled back session to leave the report", func() error {
				if s := sessions(); mention(s, fmt.Sprintf("session %d ", pid)) {
					return fmt.Errorf("session %d still reported after its rollback: %q", pid, s)
				}
				return nil
			})
		})
	}
}

// crashXWall logs, when t and its subtests are done, how long they took.
func crashXWall(t *testing.T) {
	start := time.Now()
	t.Cleanup(func() { t.Logf("FIGURE: wall %s: %v", t.Name(), time.Since(start).Round(time.Millisecond)) })
}

// crashXEventually polls f until it returns nil, failing t with f's last
// error after timeout.
func crashXEventually(t testing.TB, timeout time.Duration, what string, f func() error) {
	t.Helper()
	crashXEventuallyEvery(t, timeout, 20*time.Millisecond, what, f)
}

// crashXEventuallyEvery is crashXEventually polling every interval.
func crashXEventuallyEvery(t testing.TB, timeout, interval time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s: %v", timeout, what, err)
		}
		time.Sleep(interval)
	}
}

// crashXDrop drops tables, for a cleanup.
func crashXDrop(t testing.TB, db *sql.DB, tables ...string) {
	t.Helper()
	for _, tb := range tables {
		if _, err := db.Exec("DROP TABLE IF EXISTS " + tb); err != nil && !errors.Is(err, sql.ErrConnDone) {
			t.Errorf("dropping %s: %v", tb, err)
		}
	}
}
