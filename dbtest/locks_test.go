package dbtest

// Sessions and advisory locks as the server sees them: which session holds
// a table's keys, whether a session is still alive, the sessions of a pool.

import (
	"context"
	"database/sql"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"net"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
)

// tableIdentity returns the identity the advisory form names table's locks by,
// as the engine resolves it (Postgres: schema.table; MySQL: database.table).
func tableIdentity(t testing.TB, e Engine, db *sql.DB, table string) string {
	t.Helper()
	ti, ok := e.Dialect.(dialect.TableIdentifier)
	if !ok {
		return table
	}
	n := dialect.Names{Raw: dialect.Table{Name: table}}
	var quoted []string
	parts := strings.Split(table, ".")
	for _, p := range parts {
		qp, err := e.Dialect.QuoteIdent(p)
		if err != nil {
			t.Fatal(err)
		}
		quoted = append(quoted, qp)
	}
	n.Table, n.TableName = strings.Join(quoted, "."), parts[len(parts)-1]
	if len(parts) == 2 {
		n.Schema = parts[0]
	}
	ident, err := ti.TableIdentity(context.Background(), db, &n)
	if err != nil {
		t.Fatalf("identity of %s: %v", table, err)
	}
	return ident
}

// locksHeld returns how many of the advisory locks of table's keys any
// session of the server holds (Postgres: pg_locks; MySQL/MariaDB:
// IS_FREE_LOCK). SQLite has no session locks: it must not be asked.
func locksHeld(t testing.TB, e Engine, db *sql.DB, table string, keys []string) int {
	t.Helper()
	n := 0
	if !e.IsSQLite() {
		table = tableIdentity(t, e, db, table)
	}
	switch {
	case e.IsPostgres():
		// A 64-bit key shows as classid (high half), objid (low half) and
		// objsubid 1.
		rows, err := db.Query("SELECT classid::bigint, objid::bigint FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		held := map[[2]int64]bool{}
		for rows.Next() {
			var hi, lo int64
			if err := rows.Scan(&hi, &lo); err != nil {
				t.Fatal(err)
			}
			held[[2]int64{hi, lo}] = true
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			u := uint64(inbox.PostgresLockKey(table, k))
			if held[[2]int64{int64(u >> 32), int64(u & 0xffffffff)}] {
				n++
			}
		}
	case e.IsMySQL():
		for _, k := range keys {
			var free sql.NullInt64
			if err := db.QueryRow("SELECT IS_FREE_LOCK(?)", inbox.MySQLLockName(table, k)).Scan(&free); err != nil {
				t.Fatal(err)
			}
			if !free.Valid {
				t.Fatalf("IS_FREE_LOCK(%q) returned NULL", inbox.MySQLLockName(table, k))
			}
			if free.Int64 == 0 {
				n++
			}
		}
	default:
		t.Fatalf("%s has no session locks to look at", e.Name)
	}
	return n
}

// noLocks fails the test if any advisory lock of table's keys is held.
// On SQLite the keys live in the process; the tests check them with a claim.
func noLocks(t testing.TB, e Engine, db *sql.DB, table string, keys []string) {
	t.Helper()
	if e.IsSQLite() {
		return
	}
	if n := locksHeld(t, e, db, table, keys); n != 0 {
		t.Errorf("%d advisory locks of %s left held", n, table)
	}
}

// noPoolLocks is noLocks for the moments after a cancellation. A
// connection cut mid-statement is discarded, but its session lives on in
// the server a moment longer, and may even run a lock call it had already
// received; it holds nothing once it ends. So: no lock of the keys may be
// held by a session of the pool (one that will be reused), and every other
// holder must end, within a deadline.
func noPoolLocks(t testing.TB, e Engine, db *sql.DB, table string, keys []string) {
	t.Helper()
	if e.IsSQLite() {
		return
	}
	pool := poolSessions(t, e, db)
	for _, pid := range lockHolders(t, e, db, table, keys) {
		if pool[pid] {
			t.Errorf("session %d of the pool holds an advisory lock of %s", pid, table)
			continue
		}
		deadline := time.Now().Add(10 * time.Second)
		for sessionAlive(t, e, db, pid) {
			if time.Now().After(deadline) {
				t.Errorf("discarded session %d still holds an advisory lock of %s after 10s", pid, table)
				break
			}
			time.Sleep(5 * time.Millisecond) // polling the server's session list, with a deadline
		}
	}
}

// poolSessions returns the server's session ids of every connection
// the pool holds; none may be in use.
func poolSessions(t testing.TB, e Engine, db *sql.DB) map[int64]bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q := "SELECT CONNECTION_ID()"
	if e.IsPostgres() {
		q = "SELECT pg_backend_pid()"
	}
	ids := map[int64]bool{}
	var conns []*sql.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range db.Stats().OpenConnections {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		var id int64
		if err := c.QueryRowContext(ctx, q).Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids[id] = true
	}
	return ids
}

// lockHolders returns the sessions holding advisory locks of table's
// keys.
func lockHolders(t testing.TB, e Engine, db *sql.DB, table string, keys []string) []int64 {
	t.Helper()
	var out []int64
	table = tableIdentity(t, e, db, table)
	if e.IsMySQL() {
		for _, k := range keys {
			var id sql.NullInt64
			if err := db.QueryRow("SELECT IS_USED_LOCK(?)", inbox.MySQLLockName(table, k)).Scan(&id); err != nil {
				t.Fatal(err)
			}
			if id.Valid {
				out = append(out, id.Int64)
			}
		}
		return out
	}
	want := map[[2]int64]bool{}
	for _, k := range keys {
		u := uint64(inbox.PostgresLockKey(table, k))
		want[[2]int64{int64(u >> 32), int64(u & 0xffffffff)}] = true
	}
	rows, err := db.Query("SELECT pid, classid::bigint, objid::bigint FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var pid, hi, lo int64
		if err := rows.Scan(&pid, &hi, &lo); err != nil {
			t.Fatal(err)
		}
		if want[[2]int64{hi, lo}] {
			out = append(out, pid)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// sessionAlive tells whether the server still has session id.
func sessionAlive(t testing.TB, e Engine, db *sql.DB, id int64) bool {
	t.Helper()
	q := "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?"
	if e.IsPostgres() {
		q = "SELECT COUNT(*) FROM pg_stat_activity WHERE pid = $1"
	}
	var n int
	if err := db.QueryRow(q, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// sessionID returns the server's id of the session ex runs on.
func sessionID(ctx context.Context, e Engine, ex interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}) (string, error) {
	q := "SELECT pg_backend_pid()"
	if e.IsMySQL() {
		q = "SELECT CONNECTION_ID()"
	}
	var id int64
	err := ex.QueryRowContext(ctx, q).Scan(&id)
	return strconv.FormatInt(id, 10), err
}

// pgSessions lists the sessions idle in a transaction that are
// this process's (client port in ports) or whose last statement named one
// of regs' tables.
func pgSessions(ctx context.Context, db *sql.DB, ports map[int]bool, regs []hygieneTable) ([]string, error) {
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

// pgHeldKeys lists the advisory locks held on the keys of regs.
func pgHeldKeys(ctx context.Context, db *sql.DB, regs []hygieneTable) ([]string, error) {
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
		ident, err := schemaIdent(ctx, r.engine, db, r.table)
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

// mySessions lists this process's sessions (client port in ports)
// that are idle (Sleep) with an InnoDB transaction open. MariaDB keeps no
// last statement of an idle session, so sessions are matched by port only.
func mySessions(ctx context.Context, db *sql.DB, ports map[int]bool) ([]string, error) {
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

// myHeldKeys lists the named locks held on the keys of regs.
func myHeldKeys(ctx context.Context, db *sql.DB, regs []hygieneTable) ([]string, error) {
	var problems []string
	for _, r := range regs {
		if r.maxID == 0 {
			continue
		}
		ident, err := schemaIdent(ctx, r.engine, db, r.table)
		if err != nil {
			return problems, err
		}
		found, err := myUsedLocks(ctx, db, ident, r.maxID)
		if err != nil {
			return problems, err
		}
		problems = append(problems, found...)
	}
	return problems, nil
}

// schemaIdent is the identity the advisory form names an unqualified
// table's locks by: schema and name on PostgreSQL, database and name on
// MariaDB (inbox.TableIdentifier).
func schemaIdent(ctx context.Context, e Engine, db *sql.DB, table string) (string, error) {
	q := "SELECT current_schema()"
	if e.IsMySQL() {
		q = "SELECT DATABASE()"
	}
	var schema string
	err := db.QueryRowContext(ctx, q).Scan(&schema)
	return schema + "." + table, err
}

// myUsedLocks asks IS_USED_LOCK for the keys 1..maxID of table, a
// few hundred per statement.
func myUsedLocks(ctx context.Context, db interface {
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

// noKeyLocks fails t when an advisory lock of one of the keys
// 1..maxID of table is held by anyone (PostgreSQL, MariaDB; SQLite holds
// keys in the process).
func noKeyLocks(t testing.TB, e Engine, db *sql.DB, table string, maxID int64) {
	t.Helper()
	ctx := context.Background()
	reg := []hygieneTable{{e, table, maxID}}
	var problems []string
	var err error
	switch {
	case e.IsPostgres():
		problems, err = pgHeldKeys(ctx, db, reg)
	case e.IsMySQL():
		problems, err = myHeldKeys(ctx, db, reg)
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

// terminateSession ends session id from admin, a pool of its own.
func terminateSession(t testing.TB, e Engine, admin *sql.DB, id string) {
	t.Helper()
	if e.IsPostgres() {
		var ok bool
		if err := admin.QueryRow("SELECT pg_terminate_backend($1)", id).Scan(&ok); err != nil || !ok {
			t.Fatalf("pg_terminate_backend(%s): %v, %v", id, ok, err)
		}
		return
	}
	if _, err := admin.Exec("KILL CONNECTION " + id); err != nil {
		t.Fatalf("KILL CONNECTION %s: %v", id, err)
	}
}
