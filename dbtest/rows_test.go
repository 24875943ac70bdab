package dbtest

// Reading and writing a table's rows by hand, beside the queue: the
// placeholders of each engine (bind), counts, a row's attempt and lease,
// dumps to compare a table before and after.

import (
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// bind rewrites ? placeholders as $n for Postgres.
func bind(e Engine, q string) string {
	if !e.IsPostgres() {
		return q
	}
	var b strings.Builder
	n := 0
	for _, c := range q {
		if c == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

func mustExec(t testing.TB, e Engine, db *sql.DB, q string, args ...any) {
	t.Helper()
	if _, err := db.Exec(bind(e, q), args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// countRows counts the rows of table.
func countRows(t testing.TB, db *sql.DB, table string) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM " + table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// attemptOf returns the stored attempt of row id, failing when it is gone.
func attemptOf(t testing.TB, e Engine, db *sql.DB, table string, id any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(bind(e, "SELECT attempt FROM "+table+" WHERE id = ?"), id).Scan(&n); err != nil {
		t.Fatalf("attempt of %s %v: %v", table, id, err)
	}
	return n
}

// lockedUntilOf returns the stored lease of row id, the zero time for NULL.
func lockedUntilOf(t testing.TB, e Engine, db *sql.DB, table string, id any) time.Time {
	t.Helper()
	var raw any
	if err := db.QueryRow(bind(e, "SELECT locked_until FROM "+table+" WHERE id = ?"), id).Scan(&raw); err != nil {
		t.Fatalf("locked_until of %s %v: %v", table, id, err)
	}
	if raw == nil {
		return time.Time{}
	}
	tm, err := e.Dialect.ScanTime(raw)
	if err != nil {
		t.Fatal(err)
	}
	return tm
}

// dumpRows returns every row of table as text, in id order, to compare a
// table before and after something that must change nothing.
func dumpRows(t testing.TB, db *sql.DB, table string) []string {
	t.Helper()
	rows, err := db.Query("SELECT * FROM " + table + " ORDER BY 1")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for i, v := range vals {
			if i > 0 {
				b.WriteString(" | ")
			}
			b.WriteString(cols[i] + "=")
			switch x := v.(type) {
			case nil:
				b.WriteString("NULL")
			case []byte:
				b.WriteString(strconv.Quote(string(x)))
			case time.Time:
				b.WriteString(x.UTC().Format(time.RFC3339Nano))
			default:
				fmt.Fprint(&b, x)
			}
		}
		out = append(out, b.String())
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func sameRows(t testing.TB, what string, before, after []string) {
	t.Helper()
	if strings.Join(before, "\n") != strings.Join(after, "\n") {
		t.Errorf("%s changed the table:\nbefore:\n%s\nafter:\n%s", what, strings.Join(before, "\n"), strings.Join(after, "\n"))
	}
}

// emptyTables empties table, its dead table and its claims table.
func emptyTables(t testing.TB, db *sql.DB, table string) {
	t.Helper()
	for _, tb := range []string{table, table + "_dead", table + "_claims"} {
		if _, err := db.Exec("DELETE FROM " + tb); err != nil {
			t.Fatal(err)
		}
	}
}

// rowFields splits a row of dumpRows into its columns.
func rowFields(row string) map[string]string {
	m := map[string]string{}
	for _, f := range strings.Split(row, " | ") {
		k, v, _ := strings.Cut(f, "=")
		m[k] = v
	}
	return m
}

// dbNow reads the clock the queue decides by: the server's for
// PostgreSQL and MariaDB, the process's for SQLite.
func dbNow(t testing.TB, e Engine, db *sql.DB) time.Time {
	t.Helper()
	var raw any
	switch {
	case e.IsPostgres():
		if err := db.QueryRow("SELECT clock_timestamp()").Scan(&raw); err != nil {
			t.Fatal(err)
		}
	case e.IsMySQL():
		if err := db.QueryRow("SELECT UTC_TIMESTAMP(6)").Scan(&raw); err != nil {
			t.Fatal(err)
		}
	default:
		return time.Now().UTC()
	}
	tm, err := e.Dialect.ScanTime(raw)
	if err != nil {
		t.Fatal(err)
	}
	return tm.UTC()
}

// rowOf reads a job's attempt and lease expiry (zero when NULL), and
// whether the row exists.
func rowOf(t testing.TB, e Engine, db *sql.DB, table string, id any) (attempt int, lockedUntil time.Time, ok bool) {
	t.Helper()
	var raw any
	err := db.QueryRow(bind(e, "SELECT attempt, locked_until FROM "+table+" WHERE id = ?"), id).Scan(&attempt, &raw)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, time.Time{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	if raw != nil {
		if lockedUntil, err = e.Dialect.ScanTime(raw); err != nil {
			t.Fatal(err)
		}
	}
	return attempt, lockedUntil.UTC(), true
}

// countWhere returns the rows of table matching where (with args).
func countWhere(t testing.TB, e Engine, db *sql.DB, table, where string, args ...any) int {
	t.Helper()
	q := "SELECT COUNT(*) FROM " + table
	if where != "" {
		q += " WHERE " + where
	}
	var n int
	if err := db.QueryRow(bind(e, q), args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// effectsTableSQL creates the table a row-lock handler writes to.
func effectsTableSQL(e Engine, table string) []string {
	return []string{"DROP TABLE IF EXISTS " + table, "CREATE TABLE " + table + " (job_id bigint NOT NULL, note varchar(20) NOT NULL)"}
}

// claimsCounted returns the claims counted for job id in table's claims
// table, 0 when it has no row.
func claimsCounted(t testing.TB, e Engine, db *sql.DB, table string, id any) int {
	t.Helper()
	var n int
	err := db.QueryRow(bind(e, "SELECT claims FROM "+table+"_claims WHERE id = ?"), id).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// firstID returns the smallest id of table.
func firstID(t testing.TB, db *sql.DB, table string) any {
	t.Helper()
	var id int64
	if err := db.QueryRow("SELECT MIN(id) FROM " + table).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}
