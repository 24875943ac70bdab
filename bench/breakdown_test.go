//go:build unix

package main

// The CI check of -run breakdown: each form, both sides, a batch of one and
// of sixteen, at a tiny size on one driver per engine family. Every job must
// be acknowledged once, the timing wrapper must see the calls the counting
// one counts, and the counts that are known exactly must come out exactly.
// Speed is not looked at.

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

func TestBreakdown(t *testing.T) {
	const jobs = 64
	for _, name := range []string{"pq", "mysql", "mattn"} {
		t.Run(name, func(t *testing.T) {
			e := needEngine(t, name)
			for _, form := range loopForms {
				if !contains(e.forms(), form) {
					continue
				}
				for _, batch := range []int{1, 16} {
					c := cell{e: e, form: form, workers: 2, batch: batch}
					// MySQL's lease of one a claim runs both ways: its
					// statements prepared once (-prepare auto, without
					// interpolateParams) and as text.
					modes := []string{"auto"}
					if name == "mysql" && form == "lease" && batch == 1 {
						modes = append(modes, "off")
					}
					for _, mode := range modes {
						t.Run(strings.TrimPrefix(c.String(), name+"/")+"/prepare-"+mode, func(t *testing.T) {
							defer func(p string) { prepareInbox = p }(prepareInbox)
							prepareInbox = mode
							ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
							defer cancel()
							l, err := breakdownCell(ctx, c, t.TempDir(), jobs, false)
							if err != nil {
								t.Fatal(err)
							}
							checkBreakdown(t, l, jobs)
						})
					}
				}
			}
		})
	}
}

func checkBreakdown(t *testing.T, l breakdownLine, jobs int) {
	t.Helper()
	e := l.c.e
	for k, sb := range l.sides {
		side := sideNames[k]
		if sb.jobs != jobs || sb.left != 0 {
			t.Errorf("%s: %d of %d jobs acknowledged, %d rows left", side, sb.jobs, jobs, sb.left)
		}
		if sb.calls.statements <= 0 || sb.perJob(float64(sb.allCalls())) <= 0 {
			t.Errorf("%s: no driver calls counted: %+v", side, sb.calls)
		}
		// The timing wrapper saw every call the counting one counted.
		if n := sb.callsOf("query", "") + sb.callsOf("exec", ""); n != sb.calls.statements {
			t.Errorf("%s: %d statements timed, %d counted", side, n, sb.calls.statements)
		}
		if n := sb.callsOf("prepare", ""); n != sb.calls.prepares {
			t.Errorf("%s: %d prepares timed, %d counted", side, n, sb.calls.prepares)
		}
		if n := sb.callsOf("tx", ""); n != sb.calls.tx {
			t.Errorf("%s: %d BEGIN/COMMIT/ROLLBACK timed, %d counted", side, n, sb.calls.tx)
		}
		if sb.driverTime() <= 0 {
			t.Errorf("%s: no time inside driver calls", side)
		}
		switch e.family {
		case "postgres":
			if len(sb.server) != 1 || sb.server[0].name != "WAL bytes" || sb.serverPerJob(0) <= 0 {
				t.Errorf("%s: WAL per job not above zero: %+v", side, sb.server)
			}
		case "mysql":
			if len(sb.server) == 0 || sb.serverPerJob(0) <= 0 {
				t.Errorf("%s: redo per job not above zero: %+v", side, sb.server)
			}
		}
	}
	inbox := l.sides[0]
	lease1 := l.c.form == "lease" && l.c.batch == 1
	if e.family == "postgres" && lease1 {
		// One claim and one ack a job; a round that found every job left
		// held by the other worker sent its claim alone.
		if want := 2*int64(jobs) + inbox.empty; inbox.calls.statements != want {
			t.Errorf("inbox, PostgreSQL lease, batch 1: %d statements for %d jobs and %d empty claims, want %d", inbox.calls.statements, jobs, inbox.empty, want)
		}
		if n := inbox.callsOf("tx", "BEGIN"); n != 0 || inbox.calls.tx != 0 {
			t.Errorf("inbox, PostgreSQL lease, batch 1: %d BEGINs, %d transaction calls, want none", n, inbox.calls.tx)
		}
	}
	interpolated := strings.Contains(e.dsn(""), "interpolateParams=true")
	if e.family == "mysql" && lease1 && !interpolated && !prepareFor(e) {
		// go-sql-driver/mysql prepares, runs and closes each statement with
		// arguments; one without (inbox.MariaDB's walk under the engine's
		// clock, when the claim of one in one statement missed) goes as
		// text.
		var text int64
		for k, v := range inbox.stmts {
			if (k.kind == "query" || k.kind == "exec") && countParams(k.text) == 0 {
				text += v.calls
			}
		}
		p, closes := inbox.calls.prepares, inbox.callsOf("close", "")
		if want := inbox.calls.statements - text; p != want || closes != p {
			t.Errorf("inbox, MariaDB lease, batch 1: %d prepares and %d closes for %d statements, %d of them without arguments, want %d", p, closes, inbox.calls.statements, text, want)
		}
		var takes int64
		for k, v := range inbox.stmts {
			if strings.HasPrefix(k.text, "BEGIN NOT ATOMIC") {
				takes += v.calls
			}
		}
		if e.dialect.Name() == "mariadb" && takes == 0 {
			t.Errorf("inbox, MariaDB lease, batch 1: no claim in one statement, want Claim.WalkTake")
		}
	}
	if e.family == "mysql" && lease1 && !interpolated && prepareFor(e) {
		// Config.Prepare: each statement prepared once on each connection
		// it runs on (a few kinds, a pool of a few), then run again.
		if p := inbox.calls.prepares; p == 0 || 4*p > inbox.calls.statements {
			t.Errorf("inbox, MariaDB lease, batch 1, Config.Prepare: %d prepares for %d statements, want some and at most a quarter", p, inbox.calls.statements)
		}
	}
	if e.family == "mysql" && lease1 && !interpolated {
		// A claim of one is a transaction from Go (inbox.MySQL) or one
		// compound statement (inbox.MariaDB's Claim.WalkTake).
		var claims int64
		for k, v := range inbox.stmts {
			if k.kind == "query" && strings.HasPrefix(k.text, "BEGIN NOT ATOMIC") {
				claims += v.calls
			}
		}
		what := "compound statements"
		if e.dialect.Name() != "mariadb" {
			claims, what = inbox.callsOf("tx", "BEGIN"), "BEGINs"
		}
		if claims < int64(jobs)/2 {
			t.Errorf("inbox, %s lease, batch 1: %d %s for %d jobs", e.dialect.Name(), claims, what, jobs)
		}
	}
	var out bytes.Buffer
	printBreakdown(&out, l)
	for _, want := range []string{"| statements |", "| wall µs", "| inbox | ", "| hand-written | "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the block lacks %q:\n%s", want, out.String())
		}
	}
	if t.Failed() {
		t.Log(out.String())
	}
}

// The whole mode on SQLite, which needs no server: header, notes, a block
// per line and the summary.
func TestBreakdownOutput(t *testing.T) {
	e := needEngine(t, "mattn")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := runBreakdown(ctx, &out, io.Discard, []engine{e}, []string{"lease", "lease-async", "rowlock"}, []int{2}, []int{1, 16}, 40, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	if n := strings.Count(s, "#### SQLite, "); n != 2 {
		t.Errorf("%d blocks, want 2 (lease, batches 1 and 16; no lease-async, no row lock on SQLite):\n%s", n, s)
	}
	for _, want := range []string{"SQLite: page writes are not measured", "#### Summary", "| SQLite | mattn/go-sqlite3 | lease | 16 | 2 |"} {
		if !strings.Contains(s, want) {
			t.Errorf("the output lacks %q:\n%s", want, s)
		}
	}
}

func TestStmtLabel(t *testing.T) {
	for _, c := range []struct{ sql, want string }{
		{`WITH picked AS MATERIALIZED (SELECT "id" FROM (SELECT "id" FROM "t" WHERE "locked_until" IS NULL ORDER BY "id" LIMIT $1 FOR UPDATE SKIP LOCKED) AS free) UPDATE "t" AS j SET "attempt" = j."attempt" + 1 WHERE j."id" = ANY (ARRAY(SELECT "id" FROM picked)) RETURNING j."id", j."payload"`,
			"WITH … UPDATE t WHERE locked_until IS NULL SKIP LOCKED RETURNING (1 arg)"},
		{"UPDATE `t` SET `attempt` = `attempt` + 1, `locked_until` = ? WHERE (`id`, `attempt`) IN ((?, ?), (?, ?)) AND (`locked_until` <= ? OR `locked_until` IS NULL)",
			"UPDATE t WHERE (id, attempt) IN (…) … (6 args)"},
		{"UPDATE t SET attempt = attempt + 1 WHERE id = (SELECT id FROM t ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id, attempt, payload",
			"UPDATE t WHERE id = (…) SKIP LOCKED RETURNING"},
		{`DELETE FROM "t" WHERE ("id" = ? AND "attempt" = ? AND "locked_until" = ?) OR ("id" = ? AND "attempt" = ? AND "locked_until" = ?) RETURNING "id"`,
			"DELETE FROM t WHERE (id = ? AND attempt = ? AND locked_until = ?) … RETURNING (6 args)"},
		{"SELECT `id`, `attempt`, `payload`, UTC_TIMESTAMP(6) FROM `t` WHERE `locked_until` <= UTC_TIMESTAMP(6) ORDER BY `locked_until` DESC LIMIT ? FOR UPDATE SKIP LOCKED",
			"SELECT … FROM t WHERE locked_until <= UTC_TIMESTAMP(6) SKIP LOCKED (1 arg)"},
		{"SELECT pg_try_advisory_lock($1)", "SELECT pg_try_advisory_lock($1)"},
	} {
		if got := stmtLabel(c.sql); got != c.want {
			t.Errorf("stmtLabel(%q)\n got %q\nwant %q", c.sql, got, c.want)
		}
	}
}
