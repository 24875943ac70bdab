package inbox_test

// Construction and the configuration a queue reports, the ownership rules
// of deliveries, the pool rule and MaxInWork, Scan and Enqueue's refusals,
// on sqlmock: no database needed.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/fakeclock"
)

var dialects = []inbox.Dialect{inbox.Postgres, inbox.MySQL, inbox.SQLite}

// New validates and quotes, and sends nothing.
func TestNewDoesNoIO(t *testing.T) {
	m := newMock(t)
	for _, d := range dialects {
		for _, tb := range []inbox.Table{leaseTable, advisoryTable, rowLockTable, claimsTable,
			{Name: "app.jobs", ID: "job_id", Attempt: "tries", Data: []string{"kind", "body"}, LockedUntil: "lease_end", DeadTable: "app.dead"}} {
			if d == inbox.SQLite && tb.LockedUntil == "" && tb.AdvisoryKey == "" {
				continue
			}
			q, err := inbox.New(m.DB, inbox.Config{Dialect: d, Table: tb})
			ok(t, d.Name()+" "+tb.Name, err)
			if tb.LockedUntil != "" && (q.Form() != inbox.Lease || q.Lease() != inbox.DefaultLease) {
				t.Errorf("%s: form %v lease %v", d.Name(), q.Form(), q.Lease())
			}
		}
	}
	if n := m.Sent(); n != 0 {
		t.Errorf("New sent %d calls: %q", n, m.Log(0))
	}
	m.Met(t)
}

// Every bad description or configuration is refused with an error naming
// the field and the value, and nothing is sent.
func TestNewRefuses(t *testing.T) {
	m := newMock(t)
	row := inbox.Config{Dialect: inbox.Postgres, Table: rowLockTable}
	lease := inbox.Config{Dialect: inbox.Postgres, Table: leaseTable}
	with := func(c inbox.Config, f func(*inbox.Config)) inbox.Config {
		c.Table.Data = append([]string(nil), c.Table.Data...)
		f(&c)
		return c
	}
	type refusal struct {
		name string
		cfg  inbox.Config
		want []string
	}
	cases := []refusal{
		{"nil dialect", inbox.Config{Table: leaseTable}, []string{"Config.Dialect is nil", "inbox.MariaDB"}},
		{"empty name", with(lease, func(c *inbox.Config) { c.Table.Name = "" }), []string{"Table.Name is empty"}},
		{"three-part name", with(lease, func(c *inbox.Config) { c.Table.Name = "db.app.jobs" }), []string{`Table.Name "db.app.jobs"`, "one dot"}},
		{"empty schema", with(lease, func(c *inbox.Config) { c.Table.Name = ".jobs" }), []string{`Table.Name ".jobs"`, "empty"}},
		{"three-part dead table", with(lease, func(c *inbox.Config) { c.Table.DeadTable = "a.b.c" }), []string{`Table.DeadTable "a.b.c"`}},
		{"empty data entry", with(lease, func(c *inbox.Config) { c.Table.Data = []string{"payload", ""} }), []string{"Table.Data[1] is empty"}},
		{"both forms", with(lease, func(c *inbox.Config) { c.Table.AdvisoryKey = "id" }), []string{`LockedUntil "locked_until"`, `AdvisoryKey "id"`}},
		{"claims without max", with(row, func(c *inbox.Config) { c.Table.ClaimsTable = "job_claims" }), []string{"Table.MaxClaims 0", `"job_claims"`}},
		{"max without claims", with(row, func(c *inbox.Config) { c.Table.MaxClaims = 3 }), []string{"Table.MaxClaims 3", "Table.ClaimsTable"}},
		{"claims without dead table", with(row, func(c *inbox.Config) { c.Table.ClaimsTable, c.Table.MaxClaims, c.Table.DeadTable = "job_claims", 3, "" }),
			[]string{`Table.ClaimsTable "job_claims"`, "Table.DeadTable"}},
		{"claims on lease", with(lease, func(c *inbox.Config) { c.Table.ClaimsTable, c.Table.MaxClaims = "job_claims", 3 }), []string{`Table.ClaimsTable "job_claims"`, "lease"}},
		{"claims on advisory", inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "jobs", AdvisoryKey: "id", ClaimsTable: "job_claims", MaxClaims: 3, DeadTable: "dead"}},
			[]string{`Table.ClaimsTable "job_claims"`, "advisory"}},
		{"claims table is the table", with(row, func(c *inbox.Config) { c.Table.ClaimsTable, c.Table.MaxClaims = "jobs", 3 }),
			[]string{`Table.ClaimsTable "jobs"`, "table of its own"}},
		{"claims table is the dead table", with(row, func(c *inbox.Config) { c.Table.ClaimsTable, c.Table.MaxClaims = "dead_jobs", 3 }),
			[]string{`Table.ClaimsTable "dead_jobs"`, "table of its own"}},
		{"three-part claims table", with(row, func(c *inbox.Config) { c.Table.ClaimsTable, c.Table.MaxClaims = "a.b.c", 3 }), []string{`Table.ClaimsTable "a.b.c"`}},
		{"not-before on lease", with(lease, func(c *inbox.Config) { c.Table.NotBefore = "not_before" }), []string{`Table.NotBefore "not_before"`}},
		{"negative lease", with(lease, func(c *inbox.Config) { c.Lease = -time.Second }), []string{"Config.Lease -1s"}},
		{"lease under a microsecond", with(lease, func(c *inbox.Config) { c.Lease = 500 * time.Nanosecond }), []string{"Config.Lease 500ns"}},
		{"lease on row lock", with(row, func(c *inbox.Config) { c.Lease = time.Minute }), []string{"Config.Lease 1m0s", "LockedUntil"}},
		{"lease on advisory", inbox.Config{Dialect: inbox.MySQL, Table: advisoryTable, Lease: time.Minute}, []string{"Config.Lease 1m0s"}},
		{"negative margin", with(lease, func(c *inbox.Config) { c.KeepMargin = -time.Second }), []string{"Config.KeepMargin -1s"}},
		{"margin of half the lease", with(lease, func(c *inbox.Config) { c.Lease, c.KeepMargin = time.Minute, 30*time.Second }), []string{"Config.KeepMargin 30s"}},
		{"SQLite row lock", inbox.Config{Dialect: inbox.SQLite, Table: rowLockTable}, []string{"SQLite", "LockedUntil", "lease", "AdvisoryKey", "advisory"}},
		{"same id and attempt", with(lease, func(c *inbox.Config) { c.Table.Attempt = "ID" }), []string{"Table.ID", "Table.Attempt", "same column"}},
		{"lease column is attempt", with(lease, func(c *inbox.Config) { c.Table.LockedUntil = "attempt" }), []string{"Table.Attempt", "Table.LockedUntil"}},
		{"data is attempt", with(lease, func(c *inbox.Config) { c.Table.Data = []string{"payload", "attempt"} }), []string{"Table.Data[1]", "Table.Attempt"}},
		{"not-before is attempt", with(row, func(c *inbox.Config) { c.Table.NotBefore = "attempt" }), []string{"Table.NotBefore", "Table.Attempt"}},
		{"dead table is the table", with(lease, func(c *inbox.Config) { c.Table.DeadTable = "jobs" }), []string{`Table.DeadTable "jobs"`, "queue table itself"}},
	}
	// Invalid identifiers, in every field that takes one.
	bad := []string{`jo"bs`, "jo`bs", "my jobs", "jobs;drop", "1jobs", "jöbs", "jo-bs", strings.Repeat("j", 64)}
	fields := []struct {
		field string
		base  inbox.Config
		set   func(*inbox.Config, string)
	}{
		{"Table.Name", lease, func(c *inbox.Config, v string) { c.Table.Name = v }},
		{"Table.Name", lease, func(c *inbox.Config, v string) { c.Table.Name = "app." + v }},
		{"Table.ID", lease, func(c *inbox.Config, v string) { c.Table.ID = v }},
		{"Table.Attempt", lease, func(c *inbox.Config, v string) { c.Table.Attempt = v }},
		{"Table.Data[1]", lease, func(c *inbox.Config, v string) { c.Table.Data = []string{"payload", v} }},
		{"Table.LockedUntil", lease, func(c *inbox.Config, v string) { c.Table.LockedUntil = v }},
		{"Table.AdvisoryKey", row, func(c *inbox.Config, v string) { c.Table.AdvisoryKey = v }},
		{"Table.NotBefore", row, func(c *inbox.Config, v string) { c.Table.NotBefore = v }},
		{"Table.ClaimsTable", row, func(c *inbox.Config, v string) { c.Table.ClaimsTable, c.Table.MaxClaims = v, 3 }},
		{"Table.ClaimsTable", row, func(c *inbox.Config, v string) { c.Table.ClaimsTable, c.Table.MaxClaims = "app."+v, 3 }},
		{"Table.DeadTable", lease, func(c *inbox.Config, v string) { c.Table.DeadTable = v }},
	}
	for _, f := range fields {
		for _, v := range bad {
			cfg := with(f.base, func(c *inbox.Config) { f.set(c, v) })
			quoted := fmt.Sprintf("%q", v)
			if f.field == "Table.Name" && strings.HasPrefix(cfg.Table.Name, "app.") {
				quoted = fmt.Sprintf("%q", cfg.Table.Name)
			}
			if f.field == "Table.ClaimsTable" && strings.HasPrefix(cfg.Table.ClaimsTable, "app.") {
				quoted = fmt.Sprintf("%q", cfg.Table.ClaimsTable)
			}
			cases = append(cases, refusal{f.field + " " + v, cfg, []string{f.field + " " + quoted}})
		}
	}
	// Every check precedes the dialect's statements, so each case but the
	// dialect's own refusals holds on every dialect.
	for _, c := range cases {
		ds := dialects
		if c.cfg.Dialect == nil || c.name == "SQLite row lock" {
			ds = []inbox.Dialect{c.cfg.Dialect}
		}
		for _, d := range ds {
			cfg := c.cfg
			cfg.Dialect = d
			q, err := inbox.New(m.DB, cfg)
			if err == nil || q != nil {
				t.Errorf("%v: %s: New = %v, %v; want an error", d, c.name, q, err)
				continue
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%v: %s: error %q does not name %s", d, c.name, err, w)
				}
			}
		}
	}
	if q, err := inbox.New(nil, lease); err == nil || q != nil || !strings.Contains(err.Error(), "db is nil") {
		t.Errorf("New(nil db) = %v, %v", q, err)
	}
	if n := m.Sent(); n != 0 {
		t.Errorf("refused constructions sent %d calls", n)
	}
	m.Met(t)
}

// Config returns the configuration with the Table's defaults, a copy the
// caller may change without changing the queue.
func TestQueueConfig(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "jobs", LockedUntil: "locked_until", DeadTable: "dead"},
		NotifyChannel: "jobs_ready", Lease: time.Minute})
	c := q.Config()
	if c.Table.ID != "id" || c.Table.Attempt != "attempt" || len(c.Table.Data) != 1 || c.Table.Data[0] != "payload" ||
		c.Table.DeadTable != "dead" || c.NotifyChannel != "jobs_ready" || c.Lease != time.Minute || c.Dialect != inbox.Postgres {
		t.Errorf("Config() = %+v", c)
	}
	c.Table.Data[0] = "changed"
	if q.Config().Table.Data[0] != "payload" {
		t.Error("changing Config()'s Table.Data changed the queue's")
	}
}

// Claim refuses a count outside 1 to MaxClaim and an ended context, before
// any I/O: nothing is sent, so nothing is claimed that a panic or an error
// could strand.
func TestClaimRefuses(t *testing.T) {
	m := newMock(t)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, d := range dialects {
		for _, tb := range []inbox.Table{leaseTable, rowLockTable, claimsTable, advisoryTable} {
			if d == inbox.SQLite && tb.LockedUntil == "" && tb.AdvisoryKey == "" {
				continue
			}
			q := newQueue(t, m, inbox.Config{Dialect: d, Table: tb})
			m.Quiet(t, "refused claims", func() {
				for _, max := range []int{0, -1, inbox.MaxClaim + 1, math.MaxInt, math.MinInt} {
					ds, err := q.Claim(context.Background(), max)
					if err == nil || ds != nil || !strings.Contains(err.Error(), fmt.Sprintf("max %d must be from 1 to %d", max, inbox.MaxClaim)) {
						t.Errorf("%s %v: Claim(%d) = %v, %v", d.Name(), q.Form(), max, ds, err)
					}
				}
				ds, err := q.Claim(cancelled, 1)
				if !errors.Is(err, context.Canceled) || ds != nil {
					t.Errorf("%s %v: Claim(cancelled) = %v, %v", d.Name(), q.Form(), ds, err)
				}
			})
		}
	}
	// MaxClaim itself is a claim like any other.
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable, Lease: time.Minute, Now: fakeclock.New(t0).Now})
	m.ExpectQuery(pgClaimUpTo(inbox.MaxClaim, true)).WithArgs(inbox.MaxClaim, at(utc0), inbox.MaxClaim, inbox.MaxClaim, at(utc0.Add(time.Minute))).
		WillReturnRows(rows("id,attempt,locked_until,payload"))
	claim(t, q, inbox.MaxClaim)
	m.Met(t)
}

// leaseFive claims jobs 1 to 5 (attempt 1) on a Postgres lease queue with
// the injected clock, each with expiry utc0 + 1m.
func leaseFive(t *testing.T, m *mock, tb inbox.Table) (*inbox.Queue, []*inbox.Delivery) {
	t.Helper()
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: tb, Lease: time.Minute, Now: fakeclock.New(t0).Now})
	r := rows("id,attempt,locked_until,payload")
	for id := int64(1); id <= 5; id++ {
		r.AddRow(id, int64(1), utc0.Add(time.Minute), nil)
	}
	m.ExpectQuery(pgClaimUpTo(8, true)).WithArgs(5, at(utc0), 5, 5, at(utc0.Add(time.Minute))).WillReturnRows(r)
	return q, claim(t, q, 5, 1, 2, 3, 4, 5)
}

// settleAll tries every settlement and Extend on d, none of which may send
// anything: each returns an error matching want.
func settleAll(t *testing.T, m *mock, d *inbox.Delivery, want error) {
	t.Helper()
	ctx := context.Background()
	m.ExpectBegin()
	tx, err := m.DB.Begin()
	ok(t, "Begin", err)
	m.Quiet(t, "settling a finished delivery", func() {
		for name, err := range map[string]error{
			"Ack": d.Ack(ctx), "Retry": d.Retry(ctx, time.Second), "Retry(0)": d.Retry(ctx, 0),
			"Release": d.Release(ctx), "Dead": d.Dead(ctx), "Extend": d.Extend(ctx),
			"AckTx": d.AckTx(ctx, tx), "RetryTx": d.RetryTx(ctx, tx, 0), "ReleaseTx": d.ReleaseTx(ctx, tx), "DeadTx": d.DeadTx(ctx, tx),
		} {
			if !errors.Is(err, want) {
				t.Errorf("%s = %v, want %v", name, err, want)
			}
		}
	})
	m.ExpectRollback()
	ok(t, "Rollback", tx.Rollback())
}

// Zero rows affected by a token statement is ErrLeaseLost, never success,
// and finishes the delivery: it then refuses everything with ErrSettled.
func TestLeaseLost(t *testing.T) {
	m := newMock(t)
	_, ds := leaseFive(t, m, leaseTable)
	exp := at(utc0.Add(time.Minute))
	ctx := context.Background()
	steps := []struct {
		name   string
		expect func()
		run    func(d *inbox.Delivery) error
	}{
		{"Extend", func() {
			m.ExpectExec(pgLeaseExtendInjected).WithArgs(exp, int64(1), int64(2), exp).WillReturnResult(affected(0))
		}, func(d *inbox.Delivery) error { return d.Extend(ctx) }},
		{"Ack", func() {
			m.ExpectExec(pgLeaseAck).WithArgs(int64(2), int64(2), exp).WillReturnResult(affected(0))
		}, func(d *inbox.Delivery) error { return d.Ack(ctx) }},
		{"Retry", func() {
			m.ExpectExec(pgLeaseRetryInjected).WithArgs(at(utc0.Add(time.Second)), int64(3), int64(2), exp).WillReturnResult(affected(0))
		}, func(d *inbox.Delivery) error { return d.Retry(ctx, time.Second) }},
		{"Release", func() {
			m.ExpectExec(pgLeaseRelease).WithArgs(int64(4), int64(2), exp).WillReturnResult(affected(0))
		}, func(d *inbox.Delivery) error { return d.Release(ctx) }},
		{"Dead", func() {
			m.ExpectExec(pgLeaseDead).WithArgs(int64(5), int64(2), exp, int64(1)).WillReturnResult(affected(0))
		}, func(d *inbox.Delivery) error { return d.Dead(ctx) }},
	}
	for i, s := range steps {
		s.expect()
		if err := s.run(ds[i]); !errors.Is(err, inbox.ErrLeaseLost) {
			t.Fatalf("%s with zero rows = %v, want ErrLeaseLost", s.name, err)
		}
		settleAll(t, m, ds[i], inbox.ErrSettled)
		// A late settlement of a lost delivery still reads as a lost lease.
		settleAll(t, m, ds[i], inbox.ErrLeaseLost)
	}
	m.Met(t)
}

// The same holds for Extend under the engine's clock (RETURNING finds no
// row), for MySQL's two-statement dead move, and inside the caller's
// transaction.
func TestLeaseLostOtherPaths(t *testing.T) {
	t.Run("postgres engine clock", func(t *testing.T) {
		m := newMock(t)
		q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable, Lease: time.Minute})
		exp := utc0.Add(time.Minute)
		m.ExpectQuery(pgLeaseClaim).WithArgs(1, 1, 1, minute).WillReturnRows(rows("id,attempt,locked_until,payload", row(int64(7), int64(1), exp, nil)))
		d := claim(t, q, 1, 7)[0]
		m.ExpectQuery(pgLeaseExtend).WithArgs(minute, int64(7), int64(2), at(exp)).WillReturnRows(rows("locked_until"))
		if err := d.Extend(context.Background()); !errors.Is(err, inbox.ErrLeaseLost) {
			t.Fatalf("Extend = %v, want ErrLeaseLost", err)
		}
		settleAll(t, m, d, inbox.ErrSettled)
		m.Met(t)
	})
	t.Run("mysql dead", func(t *testing.T) {
		m := newMock(t)
		q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: leaseTable, Lease: time.Minute, Now: fakeclock.New(t0).Now})
		const exp = "2024-03-01 12:01:00.123456"
		m.ExpectBegin()
		m.ExpectQuery(myLeaseFirst).WithArgs("2024-03-01 12:00:00.123456", 1).WillReturnRows(rows("id,attempt,payload", row(int64(7), int64(1), nil)))
		m.ExpectExec(myLeaseMarkOne).WithArgs(markOneArgs(exp, 7, 1)...).WillReturnResult(affected(1))
		m.ExpectCommit()
		d := claim(t, q, 1, 7)[0]
		// Nothing copied: nothing deleted, the transaction rolls back.
		m.ExpectBegin()
		m.ExpectExec(myLeaseDeadInsert).WithArgs(int64(1), int64(7), int64(2), exp).WillReturnResult(affected(0))
		m.ExpectRollback()
		if err := d.Dead(context.Background()); !errors.Is(err, inbox.ErrLeaseLost) {
			t.Fatalf("Dead = %v, want ErrLeaseLost", err)
		}
		settleAll(t, m, d, inbox.ErrSettled)
		m.Met(t)
	})
	t.Run("AckTx", func(t *testing.T) {
		m := newMock(t)
		_, ds := leaseFive(t, m, leaseTable)
		m.ExpectBegin()
		tx, err := m.DB.Begin()
		ok(t, "Begin", err)
		m.ExpectExec(pgLeaseAck).WithArgs(int64(1), int64(2), at(utc0.Add(time.Minute))).WillReturnResult(affected(0))
		if err := ds[0].AckTx(context.Background(), tx); !errors.Is(err, inbox.ErrLeaseLost) {
			t.Fatalf("AckTx = %v, want ErrLeaseLost", err)
		}
		m.ExpectRollback()
		ok(t, "Rollback", tx.Rollback())
		settleAll(t, m, ds[0], inbox.ErrSettled)
		m.Met(t)
	})
	t.Run("advisory", func(t *testing.T) {
		m := newMock(t)
		q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: advisoryTable})
		pgIdent(m, `"jobs"`)
		m.ExpectQuery(pgAdvLockFirst).WithArgs(10, "public.jobs", 10, 10).WillReturnRows(rows("id,k,a,locked", row(int64(3), int64(3), int64(1), true)))
		m.ExpectQuery(pgAdvClaim).WithArgs(int64(3), int64(1)).WillReturnRows(rows("id,attempt,payload", row(int64(3), int64(1), nil)))
		d := claim(t, q, 1, 3)[0]
		// The attempt moved on (a cut session's job claimed again): the
		// lock is let go all the same.
		m.ExpectExec(pgAdvAck).WithArgs(int64(3), int64(2)).WillReturnResult(affected(0))
		m.ExpectQuery(pgUnlock).WithArgs(pgKey["3"]).WillReturnRows(rows("ok", row(true)))
		if err := d.Ack(context.Background()); !errors.Is(err, inbox.ErrLeaseLost) {
			t.Fatalf("Ack = %v, want ErrLeaseLost", err)
		}
		settleAll(t, m, d, inbox.ErrSettled)
		m.Met(t)
	})
}

// Settling twice, or extending after settling, is ErrSettled and sends
// nothing, under every form.
func TestSettleTwice(t *testing.T) {
	t.Run("lease", func(t *testing.T) {
		m := newMock(t)
		_, ds := leaseFive(t, m, leaseTable)
		m.ExpectExec(pgLeaseAck).WithArgs(int64(1), int64(2), at(utc0.Add(time.Minute))).WillReturnResult(affected(1))
		ok(t, "Ack", ds[0].Ack(context.Background()))
		settleAll(t, m, ds[0], inbox.ErrSettled)
		m.Met(t)
	})
	t.Run("row lock", func(t *testing.T) {
		m := newMock(t)
		q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: rowLockTable})
		for id := int64(1); id <= 2; id++ {
			m.ExpectBegin()
			m.ExpectQuery(pgRowLockClaim).WithoutArgs().WillReturnRows(rows("id,attempt,payload", row(id, int64(1), nil)))
		}
		ds := claim(t, q, 2, 1, 2)
		m.ExpectRollback()
		ok(t, "Release", ds[0].Release(context.Background()))
		m.ExpectExec(pgRowLockAck).WithArgs(int64(2)).WillReturnResult(affected(1))
		m.ExpectCommit()
		ok(t, "Ack", ds[1].Ack(context.Background()))
		for _, d := range ds {
			m.Quiet(t, "settling again", func() {
				for name, err := range map[string]error{
					"Ack": d.Ack(context.Background()), "Release": d.Release(context.Background()),
					"Retry": d.Retry(context.Background(), 0), "Extend": d.Extend(context.Background()),
				} {
					if !errors.Is(err, inbox.ErrSettled) {
						t.Errorf("%s = %v, want ErrSettled", name, err)
					}
				}
			})
		}
		m.Met(t)
	})
	t.Run("advisory", func(t *testing.T) {
		m := newMock(t)
		q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: advisoryTable})
		pgIdent(m, `"jobs"`)
		m.ExpectQuery(pgAdvLockFirst).WithArgs(10, "public.jobs", 10, 10).WillReturnRows(rows("id,k,a,locked", row(int64(3), int64(3), int64(1), true)))
		m.ExpectQuery(pgAdvClaim).WithArgs(int64(3), int64(1)).WillReturnRows(rows("id,attempt,payload", row(int64(3), int64(1), nil)))
		d := claim(t, q, 1, 3)[0]
		m.ExpectQuery(pgUnlock).WithArgs(pgKey["3"]).WillReturnRows(rows("ok", row(true)))
		ok(t, "Retry(0)", d.Retry(context.Background(), 0))
		settleAll(t, m, d, inbox.ErrSettled)
		m.Met(t)
	})
}

// A driver error is no verdict: a lease delivery stays held and may settle
// again, and the error keeps its chain.
func TestDriverErrorLeavesLeaseHeld(t *testing.T) {
	m := newMock(t)
	_, ds := leaseFive(t, m, leaseTable)
	errDown := errors.New("connection reset by peer")
	exp := at(utc0.Add(time.Minute))
	m.ExpectExec(pgLeaseAck).WithArgs(int64(1), int64(2), exp).WillReturnError(errDown)
	err := ds[0].Ack(context.Background())
	if !errors.Is(err, errDown) || errors.Is(err, inbox.ErrLeaseLost) || !strings.HasPrefix(err.Error(), "inbox: ack: ") {
		t.Fatalf("Ack = %v, want the driver's error, wrapped", err)
	}
	m.ExpectExec(pgLeaseAck).WithArgs(int64(1), int64(2), exp).WillReturnResult(affected(1))
	ok(t, "Ack again", ds[0].Ack(context.Background()))
	m.Met(t)
}

// A row-lock settlement that fails ends its transaction: the job is back in
// the queue and the delivery is finished.
func TestRowLockFailedSettlement(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: rowLockTable})
	for id := int64(1); id <= 2; id++ {
		m.ExpectBegin()
		m.ExpectQuery(pgRowLockClaim).WithoutArgs().WillReturnRows(rows("id,attempt,payload", row(id, int64(1), nil)))
	}
	ds := claim(t, q, 2, 1, 2)
	m.ExpectExec(pgRowLockAck).WithArgs(int64(1)).WillReturnResult(affected(0))
	m.ExpectRollback()
	if err := ds[0].Ack(context.Background()); !errors.Is(err, inbox.ErrLeaseLost) || !strings.Contains(err.Error(), "deleted 0 rows") {
		t.Fatalf("Ack deleting nothing = %v", err)
	}
	errDown := errors.New("connection reset by peer")
	m.ExpectExec(pgRowLockAck).WithArgs(int64(2)).WillReturnError(errDown)
	m.ExpectRollback()
	if err := ds[1].Ack(context.Background()); !errors.Is(err, errDown) {
		t.Fatalf("Ack = %v, want the driver's error", err)
	}
	for _, d := range ds {
		m.Quiet(t, "Ack after a failed one", func() {
			if err := d.Ack(context.Background()); !errors.Is(err, inbox.ErrSettled) {
				t.Errorf("Ack = %v, want ErrSettled", err)
			}
		})
	}
	if q.InWork() != 0 {
		t.Errorf("InWork() = %d", q.InWork())
	}
	m.Met(t)
}

// Refusals that leave the delivery held: Dead without a dead table, a delay
// without a not-before column, a negative delay, and the Tx settlements of
// a row-lock delivery.
func TestSettleRefusals(t *testing.T) {
	ctx := context.Background()
	t.Run("lease without dead table", func(t *testing.T) {
		m := newMock(t)
		_, ds := leaseFive(t, m, inbox.Table{Name: "jobs", LockedUntil: "locked_until"})
		m.ExpectBegin()
		tx, err := m.DB.Begin()
		ok(t, "Begin", err)
		m.Quiet(t, "refusals", func() {
			if err := ds[0].Dead(ctx); !errors.Is(err, inbox.ErrNoDeadTable) {
				t.Errorf("Dead = %v, want ErrNoDeadTable", err)
			}
			if err := ds[0].DeadTx(ctx, tx); !errors.Is(err, inbox.ErrNoDeadTable) {
				t.Errorf("DeadTx = %v, want ErrNoDeadTable", err)
			}
			if err := ds[0].Retry(ctx, -time.Second); err == nil || !strings.Contains(err.Error(), "-1s") {
				t.Errorf("Retry(-1s) = %v", err)
			}
		})
		m.ExpectRollback()
		ok(t, "Rollback", tx.Rollback())
		m.ExpectExec(pgLeaseAck).WithArgs(int64(1), int64(2), at(utc0.Add(time.Minute))).WillReturnResult(affected(1))
		ok(t, "Ack after the refusals", ds[0].Ack(ctx))
		m.Met(t)
	})
	t.Run("row lock", func(t *testing.T) {
		m := newMock(t)
		q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "jobs"}})
		m.ExpectBegin()
		m.ExpectQuery(`SELECT "id", "attempt", "payload" FROM "jobs" ORDER BY "id" LIMIT 1 FOR UPDATE SKIP LOCKED`).
			WithoutArgs().WillReturnRows(rows("id,attempt,payload", row(int64(1), int64(1), nil)))
		d := claim(t, q, 1, 1)[0]
		m.ExpectBegin()
		tx, err := m.DB.Begin()
		ok(t, "Begin", err)
		m.Quiet(t, "refusals", func() {
			if err := d.Dead(ctx); !errors.Is(err, inbox.ErrNoDeadTable) {
				t.Errorf("Dead = %v, want ErrNoDeadTable", err)
			}
			if err := d.Retry(ctx, time.Second); !errors.Is(err, inbox.ErrNoNotBefore) {
				t.Errorf("Retry(1s) = %v, want ErrNoNotBefore", err)
			}
			for name, err := range map[string]error{
				"AckTx": d.AckTx(ctx, tx), "RetryTx": d.RetryTx(ctx, tx, 0), "ReleaseTx": d.ReleaseTx(ctx, tx),
			} {
				if !errors.Is(err, inbox.ErrOwnTx) {
					t.Errorf("%s = %v, want ErrOwnTx", name, err)
				}
			}
		})
		m.ExpectRollback()
		ok(t, "Rollback", tx.Rollback())
		m.ExpectExec(`UPDATE "jobs" SET "attempt" = "attempt" + 1 WHERE "id" = $1`).WithArgs(int64(1)).WillReturnResult(affected(1))
		m.ExpectCommit()
		ok(t, "Retry(0) after the refusals", d.Retry(ctx, 0))
		m.Met(t)
	})
	t.Run("advisory", func(t *testing.T) {
		m := newMock(t)
		q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: inbox.Table{Name: "jobs", AdvisoryKey: "id"}})
		myIdent(m, "", "jobs")
		m.ExpectQuery(myPlainCandidates).WithArgs(10).WillReturnRows(rows("id,id,attempt", row(int64(3), int64(3), int64(1))))
		myLocked(m, "3", 1)
		m.ExpectQuery(myPlainSelect).WithArgs(int64(3), int64(1)).WillReturnRows(rows("id,attempt,payload", row(int64(3), int64(1), nil)))
		m.ExpectExec(myPlainMark).WithArgs(int64(3), int64(1)).WillReturnResult(affected(1))
		d := claim(t, q, 1, 3)[0]
		m.Quiet(t, "refusals", func() {
			if err := d.Dead(ctx); !errors.Is(err, inbox.ErrNoDeadTable) {
				t.Errorf("Dead = %v, want ErrNoDeadTable", err)
			}
			if err := d.Retry(ctx, time.Second); !errors.Is(err, inbox.ErrNoNotBefore) {
				t.Errorf("Retry(1s) = %v, want ErrNoNotBefore", err)
			}
		})
		m.ExpectExec(myAdvAck).WithArgs(int64(3), int64(2)).WillReturnResult(affected(1))
		m.ExpectQuery(myReleaseLock).WithArgs(myLock["3"]).WillReturnRows(rows("released", row(int64(1))))
		ok(t, "Ack after the refusals", d.Ack(ctx))
		m.Met(t)
	})
}

// An advisory settlement's verdict is its statement's: an unlock that fails
// discards the connection, whose session may still hold the lock (closing
// it ends the session and the lock with it), and a committed Ack still
// returns nil. So does one whose context ends between the statement and
// the unlock, which is not even tried then.
func TestAdvisoryUnlockFailure(t *testing.T) {
	for _, tc := range []struct {
		name   string
		unlock func(m *mock, cancel context.CancelFunc)
	}{
		{"unlock refused", func(m *mock, _ context.CancelFunc) {
			m.ExpectQuery(pgUnlock).WithArgs(pgKey["3"]).WillReturnRows(rows("ok", row(false)))
		}},
		{"unlock error", func(m *mock, _ context.CancelFunc) {
			m.ExpectQuery(pgUnlock).WithArgs(pgKey["3"]).WillReturnError(errors.New("connection reset by peer"))
		}},
		{"context ends after the statement", func(m *mock, cancel context.CancelFunc) {
			m.After("exec "+pgAdvAck, cancel)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMock(t)
			q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: advisoryTable})
			pgIdent(m, `"jobs"`)
			m.ExpectQuery(pgAdvLockFirst).WithArgs(10, "public.jobs", 10, 10).WillReturnRows(rows("id,k,a,locked", row(int64(3), int64(3), int64(1), true)))
			m.ExpectQuery(pgAdvClaim).WithArgs(int64(3), int64(1)).WillReturnRows(rows("id,attempt,payload", row(int64(3), int64(1), nil)))
			d := claim(t, q, 1, 3)[0]
			pinned := m.ConnsOf(pgAdvClaim)[0]
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			m.ExpectExec(pgAdvAck).WithArgs(int64(3), int64(2)).WillReturnResult(affected(1))
			tc.unlock(m, cancel)
			ok(t, "Ack with trouble letting the lock go", d.Ack(ctx))
			if c := m.ClosedConns(); len(c) != 1 || c[0] != pinned {
				t.Errorf("connections closed: %v, want the pinned one, %d, discarded", c, pinned)
			}
			if q.InWork() != 0 {
				t.Errorf("InWork() = %d", q.InWork())
			}
			m.Quiet(t, "settling again", func() {
				if err := d.Ack(context.Background()); !errors.Is(err, inbox.ErrSettled) {
					t.Errorf("Ack again = %v, want ErrSettled", err)
				}
			})
			// The key is free in the process again: the next claim tries
			// its lock, on a new session.
			m.ExpectQuery(pgAdvLockFirst).WithArgs(10, "public.jobs", 10, 10).WillReturnRows(rows("id,k,a,locked")) // held elsewhere now
			claim(t, q, 1)
			if c := m.ConnsOf(pgAdvLockFirst); len(c) != 2 || c[1] == pinned {
				t.Errorf("lock calls on connections %v: the discarded %d came back", c, pinned)
			}
			m.Met(t)
		})
	}
}

// Forms that hold a connection never take the pool's last one.
func TestPoolRule(t *testing.T) {
	ctx := context.Background()
	t.Run("row lock", func(t *testing.T) {
		m := newMock(t)
		m.DB.SetMaxOpenConns(3)
		q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: rowLockTable})
		other := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "other_jobs"}})
		for id := int64(1); id <= 2; id++ {
			m.ExpectBegin()
			m.ExpectQuery(pgRowLockClaim).WithoutArgs().WillReturnRows(rows("id,attempt,payload", row(id, int64(1), nil)))
		}
		ds := claim(t, q, 10, 1, 2)
		m.Quiet(t, "claims on a full pool", func() {
			claim(t, q, 10)
			claim(t, other, 1) // the pool is shared by every queue on it
		})
		// Settling frees a slot.
		m.ExpectExec(pgRowLockAck).WithArgs(int64(1)).WillReturnResult(affected(1))
		m.ExpectCommit()
		ok(t, "Ack", ds[0].Ack(ctx))
		m.ExpectBegin()
		m.ExpectQuery(pgRowLockClaim).WithoutArgs().WillReturnRows(rows("id,attempt,payload", row(int64(3), int64(1), nil)))
		more := claim(t, q, 10, 3)
		m.ExpectRollback()
		m.ExpectRollback()
		ok(t, "Shutdown", q.Shutdown(ctx))
		if q.InWork() != 0 {
			t.Errorf("InWork() = %d after Shutdown", q.InWork())
		}
		for _, d := range []*inbox.Delivery{ds[1], more[0]} {
			m.Quiet(t, "Ack after Shutdown", func() {
				if err := d.Ack(ctx); !errors.Is(err, inbox.ErrSettled) {
					t.Errorf("Ack after Shutdown = %v, want ErrSettled", err)
				}
			})
		}
		m.DB.SetMaxOpenConns(1)
		m.Quiet(t, "a claim on a pool of one", func() {
			if ds, err := q.Claim(ctx, 1); !errors.Is(err, inbox.ErrPoolTooSmall) || ds != nil {
				t.Errorf("Claim = %v, %v; want ErrPoolTooSmall", ds, err)
			}
		})
		m.Met(t)
	})
	t.Run("advisory", func(t *testing.T) {
		m := newMock(t)
		m.DB.SetMaxOpenConns(3)
		q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: advisoryTable})
		myIdent(m, "", "jobs")
		m.ExpectQuery(myAdvCandidates).WithArgs(12).WillReturnRows(rows("id,id,attempt",
			row(int64(1), int64(1), int64(1)), row(int64(2), int64(2), int64(1)), row(int64(3), int64(3), int64(1))))
		for id := int64(1); id <= 2; id++ {
			myLocked(m, fmt.Sprint(id), 1)
			m.ExpectQuery(myAdvSelect).WithArgs(id, int64(1)).WillReturnRows(rows("id,attempt,payload", row(id, int64(1), nil)))
			m.ExpectExec(myAdvMark).WithArgs(id, int64(1)).WillReturnResult(affected(1))
		}
		ds := claim(t, q, 10, 1, 2)
		m.Quiet(t, "a claim on a full pool", func() { claim(t, q, 10) })
		// Settling frees a slot.
		m.ExpectExec(myAdvAck).WithArgs(int64(2), int64(2)).WillReturnResult(affected(1))
		m.ExpectQuery(myReleaseLock).WithArgs(myLock["2"]).WillReturnRows(rows("released", row(int64(1))))
		ok(t, "Ack", ds[1].Ack(ctx))
		m.ExpectQuery(myAdvCandidates).WithArgs(11).WillReturnRows(rows("id,id,attempt", row(int64(1), int64(1), int64(2)), row(int64(3), int64(3), int64(1))))
		myLocked(m, "3", 1)
		m.ExpectQuery(myAdvSelect).WithArgs(int64(3), int64(1)).WillReturnRows(rows("id,attempt,payload", row(int64(3), int64(1), nil)))
		m.ExpectExec(myAdvMark).WithArgs(int64(3), int64(1)).WillReturnResult(affected(1))
		claim(t, q, 10, 3)
		// Shutdown gives back what is held: here job 1 (its key, 1, was
		// passed over above), then job 3, in either order.
		m.MatchExpectationsInOrder(false)
		for _, id := range []int64{1, 3} {
			m.ExpectExec(myAdvRelease).WithArgs(id, int64(2)).WillReturnResult(affected(1))
			m.ExpectQuery(myReleaseLock).WithArgs(myLock[fmt.Sprint(id)]).WillReturnRows(rows("released", row(int64(1))))
		}
		ok(t, "Shutdown", q.Shutdown(ctx))
		m.MatchExpectationsInOrder(true)
		if q.InWork() != 0 {
			t.Errorf("InWork() = %d after Shutdown", q.InWork())
		}
		m.DB.SetMaxOpenConns(1)
		m.Quiet(t, "a claim on a pool of one", func() {
			if _, err := q.Claim(ctx, 1); !errors.Is(err, inbox.ErrPoolTooSmall) {
				t.Errorf("Claim = %v, want ErrPoolTooSmall", err)
			}
		})
		m.Met(t)
	})
}

// MaxInWork (issue 22 item 7) is the pool's limit less one where a job in
// work holds a connection (row lock; advisory with session locks), read at
// each call, and -1 where nothing bounds it: the lease, SQLite's advisory
// form (its keys live in the process), a pool without a limit.
func TestMaxInWork(t *testing.T) {
	m := newMock(t)
	for _, c := range []struct {
		cfg       inbox.Config
		open      int
		want      int
		unlimited int // with no limit on the pool
	}{
		{inbox.Config{Dialect: inbox.Postgres, Table: rowLockTable}, 9, 8, -1},
		{inbox.Config{Dialect: inbox.MySQL, Table: advisoryTable}, 5, 4, -1},
		{inbox.Config{Dialect: inbox.Postgres, Table: rowLockTable}, 1, 0, -1},
		{inbox.Config{Dialect: inbox.Postgres, Table: leaseTable}, 9, -1, -1},
		{inbox.Config{Dialect: inbox.SQLite, Table: advisoryTable}, 9, -1, -1},
	} {
		q := newQueue(t, m, c.cfg)
		m.DB.SetMaxOpenConns(c.open)
		if got := q.MaxInWork(); got != c.want {
			t.Errorf("%s %s, SetMaxOpenConns(%d): MaxInWork %d, want %d", c.cfg.Dialect.Name(), q.Form(), c.open, got, c.want)
		}
		m.DB.SetMaxOpenConns(0)
		if got := q.MaxInWork(); got != c.unlimited {
			t.Errorf("%s %s, no limit: MaxInWork %d, want %d", c.cfg.Dialect.Name(), q.Form(), got, c.unlimited)
		}
	}
}

// A claim that fails part way gives back what it took: an error means
// nothing was claimed.
func TestClaimErrorGivesBack(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: rowLockTable})
	errDown := errors.New("too many connections")
	m.ExpectBegin()
	m.ExpectQuery(pgRowLockClaim).WithoutArgs().WillReturnRows(rows("id,attempt,payload", row(int64(1), int64(1), nil)))
	m.ExpectBegin().WillReturnError(errDown)
	m.ExpectRollback()
	ds, err := q.Claim(context.Background(), 2)
	if !errors.Is(err, errDown) || ds != nil {
		t.Fatalf("Claim = %v, %v; want the driver's error and nothing", ds, err)
	}
	if q.InWork() != 0 {
		t.Errorf("InWork() = %d", q.InWork())
	}
	m.Met(t)
}

// Scan converts the data columns as sql.Row.Scan would.
func TestDeliveryScan(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Lease: time.Minute, Now: fakeclock.New(t0).Now,
		Table: inbox.Table{Name: "jobs", LockedUntil: "locked_until", Data: []string{"b", "s", "i", "t", "a", "ns", "nn", "f", "bo", "i32", "n", "sb"}}})
	when := time.Date(2024, 2, 29, 23, 59, 59, 0, time.UTC)
	m.ExpectQuery(`WITH picked AS MATERIALIZED (SELECT "id" FROM (`+
		`(SELECT "id" FROM (SELECT "id" FROM "jobs" WHERE "locked_until" IS NULL ORDER BY "id" LIMIT 1 FOR UPDATE SKIP LOCKED) AS free LIMIT $1) UNION ALL `+
		`(SELECT "id" FROM (SELECT "id" FROM "jobs" WHERE "locked_until" <= $2 ORDER BY "locked_until" LIMIT 1 FOR UPDATE SKIP LOCKED) AS expired LIMIT $3)`+
		`) AS c ORDER BY "id" LIMIT $4) `+
		`UPDATE "jobs" AS j SET "attempt" = j."attempt" + 1, "locked_until" = $5 WHERE j."id" = ANY (ARRAY(SELECT "id" FROM picked)) `+
		`RETURNING j."id", j."attempt" - 1, j."locked_until", j."b", j."s", j."i", j."t", j."a", j."ns", j."nn", j."f", j."bo", j."i32", j."n", j."sb"`).
		WithArgs(1, at(utc0), 1, 1, at(utc0.Add(time.Minute))).
		WillReturnRows(rows("id,attempt,locked_until,b,s,i,t,a,ns,nn,f,bo,i32,n,sb", row(int64(1), int64(1), utc0.Add(time.Minute),
			[]byte("bytes"), "text", int64(42), when, []byte("any"), "ns", nil, 1.5, true, int64(7), []byte("12"), []byte("sb"))))
	d := claim(t, q, 1, 1)[0]
	var (
		b      []byte
		s      string
		i      int64
		tm     time.Time
		a      any
		ns, nn sql.NullString
		f      float64
		bo     bool
		i32    int32
		n      int
		sb     string
	)
	ok(t, "Scan", d.Scan(&b, &s, &i, &tm, &a, &ns, &nn, &f, &bo, &i32, &n, &sb))
	if string(b) != "bytes" || s != "text" || i != 42 || !tm.Equal(when) || string(a.([]byte)) != "any" ||
		ns != (sql.NullString{String: "ns", Valid: true}) || nn.Valid || f != 1.5 || !bo || i32 != 7 || n != 12 || sb != "sb" {
		t.Fatalf("Scan = %q %q %d %v %v %v %v %v %v %d %d %q", b, s, i, tm, a, ns, nn, f, bo, i32, n, sb)
	}
	b[0] = 'X' // the delivery keeps its own copy
	var b2 []byte
	var skip any
	ok(t, "Scan again", d.Scan(&b2, &skip, &skip, &skip, &skip, &skip, &skip, &skip, &skip, &skip, &skip, &skip))
	if string(b2) != "bytes" {
		t.Errorf("Scan after changing a scanned slice = %q", b2)
	}
	if err := d.Scan(&b, &s); err == nil || !strings.Contains(err.Error(), "2 destinations for 12 data columns") {
		t.Errorf("Scan with 2 destinations = %v", err)
	}
	if err := d.Scan(&skip, &i, &skip, &skip, &skip, &skip, &skip, &skip, &skip, &skip, &skip, &skip); err == nil || !strings.Contains(err.Error(), "column 1") {
		t.Errorf("Scan of text into an int64 = %v", err)
	}
	m.Met(t)
}

// Enqueue refuses a wrong number of data values and a not-before time the
// table cannot hold, and sends nothing.
func TestEnqueueRefuses(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "jobs", Data: []string{"kind", "body"}}})
	m.Quiet(t, "refused enqueues", func() {
		if _, err := q.Enqueue(context.Background(), m.DB, inbox.Job{Data: []any{"x"}}); err == nil || !strings.Contains(err.Error(), "[kind body]") {
			t.Errorf("Enqueue of 1 value = %v", err)
		}
		if _, err := q.Enqueue(context.Background(), m.DB, inbox.Job{Data: []any{"k", "b"}, NotBefore: t0}); err == nil || !strings.Contains(err.Error(), "Table.NotBefore") {
			t.Errorf("Enqueue not before a time = %v", err)
		}
	})
	m.Met(t)
}
