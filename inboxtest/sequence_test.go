package inboxtest

// The sequences the helper records, checked where they are subtle, and
// written out as the reference in docs/testing-sequences.md, which must
// match them.

import (
	"bytes"
	"database/sql/driver"
	"flag"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
)

var update = flag.Bool("update", false, "rewrite the generated parts of docs/testing-sequences.md and docs/sql.md")

// recorder returns a record-only Mock (no sqlmock) for cfg.
func recorder(t testing.TB, cfg inbox.Config) *Mock {
	t.Helper()
	m := newMock(nil, nil, cfg)
	t.Cleanup(m.close)
	return m
}

// record runs f on m and returns the calls it recorded, one line each:
// "begin", "query <sql> [args]", and so on.
func record(m *Mock, f func()) []string {
	var out []string
	m.sm = nil
	f()
	for _, c := range m.last {
		line := c.op
		if c.sql != "" {
			line += " " + c.sql
		}
		if len(c.args) > 0 {
			line += fmt.Sprintf(" %v", c.args)
		}
		if c.err != nil {
			line += " ! " + c.err.Error()
		}
		out = append(out, line)
	}
	return out
}

// want fails the test unless got is want, line by line; a want line
// ending in "…" needs only to begin with the rest.
func want(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	same := len(got) == len(want)
	for i := 0; same && i < len(got); i++ {
		if w := strings.TrimSuffix(want[i], "…"); w != want[i] {
			same = strings.HasPrefix(got[i], w)
		} else {
			same = got[i] == w
		}
	}
	if !same {
		t.Errorf("%s:\n\t%s\nwant:\n\t%s", what, strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
	}
}

var (
	pgLease  = inbox.Table{Name: "jobs", LockedUntil: "locked_until", DeadTable: "dead_jobs"}
	rowLock  = inbox.Table{Name: "jobs", NotBefore: "not_before", DeadTable: "dead_jobs"}
	claims   = inbox.Table{Name: "jobs", NotBefore: "not_before", DeadTable: "dead_jobs", ClaimsTable: "job_claims", MaxClaims: 3}
	advisory = inbox.Table{Name: "jobs", AdvisoryKey: "id", NotBefore: "not_before", DeadTable: "dead_jobs"}
	job7     = Job{ID: 7, Data: []any{[]byte("p")}}
	t0       = time.Date(2024, 3, 1, 14, 0, 0, 123456789, time.FixedZone("CEST", 2*3600))
)

// marks16 is the 16 (id, attempt) places of a MySQL lease mark of one row.
func marks16(id, attempt int64) string {
	return strings.TrimSuffix(strings.Repeat(fmt.Sprint(id, " ", attempt, " "), 16), " ")
}

// MySQL has no UPDATE … RETURNING: under its own clock the claim's reads
// return UTC_TIMESTAMP(6) with their rows, and the mark sends the times
// computed from it as DATETIME(6) text in UTC; a settlement reads the clock
// first.
func TestSequenceMySQLClock(t *testing.T) {
	m := recorder(t, inbox.Config{Dialect: inbox.MySQL, Table: pgLease})
	st := m.q.Statements()
	want(t, "claim", record(m, func() { m.ExpectClaim(1, job7) }),
		"begin",
		"query "+st.Claim.SelectFreeOne.SQL+" [1]",
		"exec "+st.Claim.MarkOne.SQL+" [2024-01-01 12:00:30.000000 7 1 2024-01-01 12:00:00.000000]",
		"commit")
	want(t, "retry", record(m, func() { m.ExpectRetry(7, time.Minute) }),
		"query SELECT UTC_TIMESTAMP(6)",
		"exec "+st.Settle.Retry.SQL+" [2024-01-01 12:01:01.000000 7 2 2024-01-01 12:00:30.000000]")
	// The dead move is two statements in a transaction of its own. Each
	// reading of the engine's clock is a second after the last.
	m.ExpectClaim(1, job7)
	want(t, "dead", record(m, func() { m.ExpectDead(7) }),
		"begin",
		"exec "+st.Settle.Dead.SQL+" [1 7 2 2024-01-01 12:00:32.000000]",
		"exec "+st.Settle.DeadDelete.SQL+" [7 2 2024-01-01 12:00:32.000000]",
		"commit")
	m.ExpectClaim(1, job7)
	// Within the lease the row is read back: gone would be a cancel.
	want(t, "dead, lost", record(m, func() { m.ExpectLeaseLost(7, Dead) }),
		"begin",
		"exec "+st.Settle.Dead.SQL+" [1 7 2 2024-01-01 12:00:33.000000]",
		"rollback",
		"query "+st.Settle.Verdict.SQL+" [7]")

	// The caller's clock: no read, its reading in UTC to the microsecond.
	m = recorder(t, inbox.Config{Dialect: inbox.MySQL, Table: pgLease, Now: func() time.Time { return t0 }})
	st = m.q.Statements()
	want(t, "claim, injected clock", record(m, func() { m.ExpectClaim(1, job7) }),
		"begin",
		"query "+st.Claim.SelectFreeOne.SQL+" [2024-03-01 12:00:00.123456 1]",
		"exec "+st.Claim.MarkOne.SQL+" [2024-03-01 12:00:30.123456 7 1 2024-03-01 12:00:00.123456]",
		"commit")
}

// PostgreSQL moves a row to the dead table in one statement, and its lease
// token carries the expiry as the claim returned it.
func TestSequencePostgresLease(t *testing.T) {
	m := recorder(t, inbox.Config{Dialect: inbox.Postgres, Table: pgLease})
	st := m.q.Statements()
	exp := dbNow.Add(30 * time.Second)
	want(t, "claim", record(m, func() { m.ExpectClaim(4, job7) }),
		fmt.Sprintf("query %s [4 4 4 %d]", st.Claim.For(4).SQL, (30*time.Second).Microseconds()))
	want(t, "dead", record(m, func() { m.ExpectDead(7) }),
		fmt.Sprintf("exec %s [7 2 %v 1]", st.Settle.Dead.SQL, exp))
	if !strings.HasPrefix(st.Settle.Dead.SQL, `WITH gone AS (DELETE FROM "jobs"`) || st.Settle.DeadDelete.SQL != "" {
		t.Errorf("dead move: %q then %q, want one statement", st.Settle.Dead.SQL, st.Settle.DeadDelete.SQL)
	}
	// The engine's clock has moved on by the next claim.
	m.ExpectClaim(1, job7)
	want(t, "retry", record(m, func() { m.ExpectRetry(7, time.Minute) }),
		fmt.Sprintf("exec %s [%d 7 2 %v]", st.Settle.Retry.SQL, time.Minute.Microseconds(), exp.Add(time.Second)))

	m = recorder(t, inbox.Config{Dialect: inbox.Postgres, Table: pgLease, Now: func() time.Time { return t0 }})
	st = m.q.Statements()
	now := t0.UTC().Truncate(time.Microsecond)
	want(t, "claim, injected clock", record(m, func() { m.ExpectClaim(1, job7) }),
		fmt.Sprintf("query %s [1 %v 1 1 %v]", st.Claim.For(1).SQL, now, now.Add(30*time.Second)))
	want(t, "ack", record(m, func() { m.ExpectAck(7) }),
		fmt.Sprintf("exec %s [7 2 %v]", st.Settle.Ack.SQL, now.Add(30*time.Second)))
}

// The row lock: a transaction per job, open until the settlement; the
// claims counter written beside it on the pool, cleared in it.
func TestSequenceRowLock(t *testing.T) {
	m := recorder(t, inbox.Config{Dialect: inbox.Postgres, Table: claims})
	st := m.q.Statements()
	want(t, "claim of 2 finding 1", record(m, func() { m.ExpectClaim(2, job7) }),
		"begin",
		"query "+st.Claim.Take.SQL,
		"query "+st.RowLock.ClaimsCount.SQL+" [7]",
		"begin",
		"query "+st.Claim.Take.SQL,
		"rollback")
	want(t, "ack", record(m, func() { m.ExpectAck(7) }),
		"exec "+st.Settle.Ack.SQL+" [7]",
		"exec "+st.RowLock.ClaimsClear.SQL+" [7]",
		"commit")
	m.ExpectClaim(1, job7)
	want(t, "release", record(m, func() { m.ExpectRelease(7) }),
		"begin",
		"exec "+st.RowLock.ClaimsGiveBack.SQL+" [7]",
		"rollback",
		"commit")
	m.ExpectClaim(1, job7)
	want(t, "tx", record(m, func() { m.ExpectTx(7) }),
		"exec "+st.RowLock.Savepoint.SQL)
	want(t, "retry after tx", record(m, func() { m.ExpectRetry(7, 0) }),
		"exec "+st.RowLock.RollbackToSavepoint.SQL,
		"exec "+st.Settle.Retry.SQL+" [0 7]",
		"exec "+st.RowLock.ClaimsClear.SQL+" [7]",
		"commit")
	m.ExpectClaim(1, job7)
	want(t, "ack, session lost", record(m, func() { m.ExpectLeaseLost(7, Ack) }),
		"exec "+st.Settle.Ack.SQL+" [7] ! "+ErrSessionLost.Error(),
		"rollback")

	m = recorder(t, inbox.Config{Dialect: inbox.MySQL, Table: rowLock})
	st = m.q.Statements()
	// With a not-before column MySQL picks: the candidates, read without
	// locks, then the first free one locked by primary key.
	want(t, "mysql claim", record(m, func() { m.ExpectClaim(1, job7) }),
		"begin",
		"query "+st.Claim.Pick.SQL+" [10]",
		"query "+st.Claim.PickLock.SQL+" [7 7 7 7 7 7 7 7 7 7 7 7 7 7 7 7 7 7 7 7 7 7 7 7 7 7 7 7 7 7 7 7 1]")
	want(t, "mysql retry", record(m, func() { m.ExpectRetry(7, time.Minute) }),
		"query SELECT UTC_TIMESTAMP(6)",
		"exec "+st.Settle.Retry.SQL+" [2024-01-01 12:01:00.000000 7]",
		"commit")
}

// The advisory form reads the table's identity at its first claim. On
// PostgreSQL the server takes the first free candidate's lock (LockFirst,
// named by the identity); elsewhere each candidate's lock is a call of its
// own. Letting go is a call of its own everywhere.
func TestSequenceAdvisory(t *testing.T) {
	m := recorder(t, inbox.Config{Dialect: inbox.Postgres, Table: advisory})
	st := m.q.Statements()
	key := inbox.PostgresLockKey("jobs", "7")
	want(t, "first claim", record(m, func() { m.ExpectClaim(1, job7) }),
		`query SELECT (SELECT ns.nspname || '.' || c.relname FROM pg_catalog.pg_class c …`,
		"query "+st.Advisory.LockFirst.SQL+" [10 jobs 10 10]",
		"query "+st.Claim.Take.SQL+" [7 1]")
	want(t, "ack", record(m, func() { m.ExpectAck(7) }),
		"exec "+st.Settle.Ack.SQL+" [7 2]",
		fmt.Sprintf("query SELECT pg_advisory_unlock($1) [%d]", key))
	// No key free and no page's last row: nothing follows.
	want(t, "second claim", record(m, func() { m.ExpectEmptyClaim(1) }),
		"query "+st.Advisory.LockFirst.SQL+" [10 jobs 10 10]")

	m = recorder(t, inbox.Config{Dialect: inbox.MySQL, Table: advisory})
	st = m.q.Statements()
	name := inbox.MySQLLockName("jobs", "7")
	want(t, "mysql first claim", record(m, func() { m.ExpectClaim(1, job7) }),
		"query SELECT (SELECT CONCAT(table_schema, '.', table_name) FROM information_schema.tables …",
		"query "+st.Advisory.Candidates.SQL+" [10]",
		"query SELECT GET_LOCK(?, 0) ["+name+"]",
		"query "+st.Claim.Select.SQL+" [7 1]",
		"exec "+st.Claim.Mark.SQL+" [7 1]")
	want(t, "mysql dead", record(m, func() { m.ExpectDead(7) }),
		"begin",
		"exec "+st.Settle.Dead.SQL+" [1 7 2]",
		"exec "+st.Settle.DeadDelete.SQL+" [7 2]",
		"commit",
		"query SELECT RELEASE_LOCK(?) ["+name+"]")

	// SQLite: the process holds the keys; no lock calls.
	m = recorder(t, inbox.Config{Dialect: inbox.SQLite, Table: advisory, Now: func() time.Time { return t0 }})
	st = m.q.Statements()
	want(t, "sqlite first claim", record(m, func() { m.ExpectClaim(1, job7) }),
		"query SELECT (SELECT file FROM pragma_database_list …",
		"query "+st.Advisory.Candidates.SQL+" [2024-03-01T12:00:00.123456Z 10]",
		"query "+st.Claim.Take.SQL+" [7 1 2024-03-01T12:00:00.123456Z]")
	want(t, "sqlite retry", record(m, func() { m.ExpectRetry(7, time.Minute) }),
		"exec "+st.Settle.Retry.SQL+" [2024-03-01T12:01:00.123456Z 7 2]")
}

// The arguments expected: exact but for the page size of the advisory
// candidates and the times a queue took from time.Now, and the tokens
// built on them.
func TestSequenceMatchers(t *testing.T) {
	m := recorder(t, inbox.Config{Dialect: inbox.SQLite, Table: pgLease})
	m.ExpectClaim(1, job7)
	claim := m.last[0]
	got := m.db.matchers(claim)
	if _, ok := got[0].(anyTime); !ok { // until
		t.Errorf("claim's until matched by %T, want anyTime", got[0])
	}
	if _, ok := got[1].(anyTime); !ok { // now
		t.Errorf("claim's now matched by %T, want anyTime", got[1])
	}
	if got[2] != int64(1) {
		t.Errorf("claim's limit matched by %v, want 1", got[2])
	}
	a := anyTime{inbox.SQLite}
	for v, ok := range map[driver.Value]bool{"2024-03-01T12:00:00.123456Z": true, "2024-03-01 12:00:00": false, time.Now(): false, int64(1): false} {
		if a.Match(v) != ok {
			t.Errorf("anyTime(sqlite).Match(%v) = %v", v, !ok)
		}
	}
	if (above(3)).Match(int64(3)) || !(above(3)).Match(int64(4)) {
		t.Error("above(3) must match 4 and not 3")
	}
	if !timeEqual(t0).Match(t0.UTC()) || timeEqual(t0).Match(t0.Add(time.Microsecond)) {
		t.Error("timeEqual matches the instant alone")
	}
}

// docSections are the descriptions docs/testing-sequences.md shows.
var docSections = []struct {
	title string
	table inbox.Table
	forms string
}{
	{"Lease", pgLease, "lease"},
	{"Row lock", rowLock, "row lock"},
	{"Row lock with a claims counter", claims, "row lock"},
	{"Advisory lock", advisory, "advisory"},
}

// TestDocSequences checks that docs/testing-sequences.md shows the
// sequences the helper expects; -update rewrites its generated part.
func TestDocSequences(t *testing.T) {
	checkGenerated(t, "../docs/testing-sequences.md", "TestDocSequences", generate(t))
}

// checkGenerated checks that the part of the document at path between the
// markers of test is gen; with -update it writes gen there instead.
func checkGenerated(t *testing.T, path, test, gen string) {
	t.Helper()
	begin, end := "<!-- generated by inboxtest's "+test+": begin -->\n", "<!-- generated: end -->\n"
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	i, j := bytes.Index(doc, []byte(begin)), bytes.Index(doc, []byte(end))
	if i < 0 || j < i {
		t.Fatalf("%s: no generated part between %q and %q", path, begin, end)
	}
	if string(doc[i+len(begin):j]) == gen {
		return
	}
	if !*update {
		t.Fatalf("%s is stale: run go test ./inboxtest -run %s -update", path, test)
	}
	out := append(append(append([]byte{}, doc[:i+len(begin)]...), gen...), doc[j:]...)
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
}

func generate(t *testing.T) string {
	var b strings.Builder
	engines := []struct {
		name string
		d    inbox.Dialect
	}{{"PostgreSQL", inbox.Postgres}, {"MySQL and MariaDB", inbox.MySQL}, {"inbox.MariaDB, where it differs", inbox.MariaDB}, {"SQLite", inbox.SQLite}}
	clocks := []struct {
		name string
		now  func() time.Time
	}{{"the database's clock", nil}, {"Config.Now", func() time.Time { return t0 }}}
	for _, sec := range docSections {
		fmt.Fprintf(&b, "\n## %s\n", sec.title)
		for _, e := range engines {
			for _, c := range clocks {
				if e.d == inbox.SQLite && (sec.table.LockedUntil == "" && sec.table.AdvisoryKey == "") {
					continue
				}
				if sec.table.ClaimsTable != "" && c.now != nil {
					continue // the counter's statements take no time
				}
				clockName := c.name
				if e.d == inbox.SQLite {
					if c.now == nil {
						continue // the same statements as with Config.Now
					}
					clockName = "Config.Now or time.Now"
				}
				var body strings.Builder
				docSection(t, &body, inbox.Config{Dialect: e.d, Table: sec.table, Now: c.now})
				if e.d == inbox.MariaDB {
					var my strings.Builder
					docSection(t, &my, inbox.Config{Dialect: inbox.MySQL, Table: sec.table, Now: c.now})
					if my.String() == body.String() {
						continue // shown under MySQL and MariaDB
					}
				}
				fmt.Fprintf(&b, "\n### %s · %s · %s\n\n%s", sec.title, e.name, clockName, body.String())
			}
		}
	}
	return b.String()
}

// docSection writes the sequences of one form, engine and clock: what each
// call on the queue sends, then the text of each statement.
func docSection(t *testing.T, b *strings.Builder, cfg inbox.Config) {
	m := recorder(t, cfg)
	var stmts []string
	seen := map[string]bool{}
	names := map[string]string{}
	b.WriteString("```text\n")
	show := func(title, prefer string, f func()) {
		f()
		fmt.Fprintf(b, "%s\n", title)
		if len(m.last) == 0 {
			b.WriteString("  (nothing)\n")
		}
		for _, c := range m.last {
			name := docName(m, c, prefer)
			if c.sql != "" && !seen[c.sql] {
				seen[c.sql] = true
				stmts = append(stmts, c.sql)
				names[c.sql] = name
				if c.stmt != nil {
					names[c.sql] = strings.Join(c.names, ", ")
				}
			}
			fmt.Fprintf(b, "  %s\n", docLine(m, c, name, prefer))
		}
	}
	form := m.q.Form()
	show("Claim(ctx, 1), the queue's first, returning job 7:", "Claim", func() { m.ExpectClaim(1, job7) })
	m.ExpectAck(7)
	show("Claim(ctx, 1) finding none:", "Claim", func() { m.ExpectEmptyClaim(1) })
	if p := m.q.Statements().Jobs.Probe; p.SQL != "" {
		// Sent by an idle worker.Run loop, not by a call of the worker's: shown
		// as ExpectProbe expects it.
		arg := ""
		if len(p.Args) > 0 {
			arg = "now"
		}
		fmt.Fprintf(b, "worker.Run, idle, its fallback interval run out (ExpectProbe; a claim follows a row):\n  query Jobs.Probe(%s) → row (1) or no row\n", arg)
		stmts = append(stmts, p.SQL)
		seen[p.SQL], names[p.SQL] = true, "Jobs.Probe"
	}
	type settle struct {
		title, prefer string
		call          Call
	}
	settlements := []settle{
		{"Ack", "Ack", Ack}, {"Retry(ctx, d)", "Retry", Retry(time.Minute)}, {"Retry(ctx, 0)", "Retry", Retry(0)},
		{"Release", "Release", Release}, {"Dead", "Dead", Dead},
	}
	if form == inbox.Lease {
		settlements = append(settlements, settle{"Extend", "Extend", Extend})
	}
	for _, s := range settlements {
		if form == inbox.Lease && s.call.kind == callRetry && s.call.after == 0 {
			continue // a lease's retry is the same whatever the delay
		}
		m.ExpectClaim(1, job7)
		show(s.title+":", s.prefer, func() { m.expect(int64(7), s.call, false) })
		if s.call.kind == callExtend {
			m.expect(int64(7), Ack, false)
		}
		if form == inbox.Advisory && s.call.kind == callRetry && s.call.after == 0 {
			continue // nothing to find gone
		}
		lost := "its lease lost"
		if form == inbox.RowLock {
			lost = "its session lost"
		}
		m.ExpectClaim(1, job7)
		show(s.title+", "+lost+":", s.prefer, func() { m.expect(int64(7), s.call, true) })
	}
	b.WriteString("```\n\n```sql\n")
	for _, s := range stmts {
		fmt.Fprintf(b, "-- %s\n%s\n", names[s], s)
	}
	b.WriteString("```\n")
}

// docName names a call for the docs: the Statements field, preferring the
// one the operation is named after where several share the text.
func docName(m *Mock, c call, prefer string) string {
	switch {
	case c.dialect == "identity":
		return "TableIdentity"
	case c.dialect == "lock":
		return "TryLock"
	case c.dialect == "unlock":
		return "Unlock"
	case c.sql == "":
		return ""
	}
	for _, n := range c.names {
		leaf := n[strings.LastIndexByte(n, '.')+1:]
		if leaf == prefer || strings.HasPrefix(n, prefer+".") || (prefer == "Dead" && strings.HasPrefix(n, "Settle.Dead")) {
			return n
		}
	}
	return c.names[0]
}

// docLine is one call: what is sent, its arguments by meaning, the answer.
func docLine(m *Mock, c call, name, prefer string) string {
	if c.sql == "" {
		if c.err != nil {
			return c.op + " → fails"
		}
		return c.op
	}
	var args []string
	for i := 0; i < len(c.args); i++ {
		args = append(args, docArg(m, c, i, prefer))
		if c.stmt != nil && c.stmt.Args[i] == dialect.ArgID {
			n := 1
			for i+n < len(c.args) && c.stmt.Args[i+n] == dialect.ArgID {
				n++
			}
			if n > 1 {
				what := "the claimed ids"
				if c.is("Claim.PickLock") {
					what = "candidates of one priority"
				}
				args[len(args)-1] = fmt.Sprintf("%d ids (%s in order, the last repeated)", n, what)
				i += n - 1
			}
		}
	}
	line := fmt.Sprintf("%-5s %s(%s)", c.op, name, strings.Join(args, ", "))
	switch {
	case c.err != nil:
		return line + " → fails"
	case c.op == "exec":
		return line + fmt.Sprintf(" → %d affected", c.affected)
	case len(c.rows) == 0:
		return line + " → no row"
	case len(c.rows) == 1:
		return line + " → row (" + strings.Join(c.cols, ", ") + ")"
	}
	return line + fmt.Sprintf(" → %d rows (%s)", len(c.rows), strings.Join(c.cols, ", "))
}

func docArg(m *Mock, c call, i int, prefer string) string {
	v := c.args[i]
	if c.stmt == nil {
		switch c.dialect {
		case "lock", "unlock":
			if v == any(inbox.PostgresLockKey("jobs", "7")) {
				return "PostgresLockKey(identity, key)"
			}
			if v == any(inbox.MySQLLockName("jobs", "7")) {
				return "MySQLLockName(identity, key)"
			}
		}
		return fmt.Sprintf("%q", fmt.Sprint(v))
	}
	retry := prefer == "Retry"
	switch a := c.stmt.Args[i]; a {
	case dialect.ArgID:
		return "id"
	case dialect.ArgAttempt:
		return "attempt+1"
	case dialect.ArgDelivered:
		return "attempt"
	case dialect.ArgExpiry:
		return "expiry"
	case dialect.ArgIDs:
		return "{id, …}"
	case dialect.ArgAttempts:
		return "{attempt+1, …}"
	case dialect.ArgExpiries:
		return "{expiry, …}"
	case dialect.ArgNow:
		return "now"
	case dialect.ArgUntil:
		if retry {
			return "now+d"
		}
		return "now+lease"
	case dialect.ArgMicros:
		if retry {
			return "d in µs"
		}
		return "lease in µs"
	case dialect.ArgLimit:
		if c.is("Advisory.Candidates", "Advisory.CandidatesAfter", "Claim.Pick", "Claim.PickAfter", "Claim.PickMore", "Claim.PickMoreAfter", "Claim.PickFirst") {
			return "page"
		}
		return "max"
	default:
		return fmt.Sprintf("arg %d", a)
	}
}
