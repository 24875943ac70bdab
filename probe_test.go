package inbox_test

// Queue.Probe, the one statement an idle loop sends when its fallback
// interval runs out, and the probe statement of each engine and form.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
)

// Probe sends the dialect's probe and reports a row; a failure is wrapped
// as "inbox: probe: …" with the driver's error in its chain; a dialect
// whose claim is one statement has no probe, and Probe reports true without
// sending anything.
func TestProbe(t *testing.T) {
	const probe = "SELECT 1 FROM `jobs` WHERE `locked_until` IS NULL OR `locked_until` <= UTC_TIMESTAMP(6) LIMIT 1"
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: leaseTable})
	down := errors.New("server gone")
	m.ExpectQuery(probe).WithoutArgs().WillReturnRows(rows("1", row(int64(1))))
	m.ExpectQuery(probe).WithoutArgs().WillReturnRows(rows("1"))
	m.ExpectQuery(probe).WithoutArgs().WillReturnError(down)
	ctx := context.Background()
	for _, want := range []bool{true, false} {
		found, err := q.Probe(ctx)
		if err != nil || found != want {
			t.Errorf("Probe = %v, %v; want %v, nil", found, err, want)
		}
	}
	if found, err := q.Probe(ctx); found || !errors.Is(err, down) || !strings.HasPrefix(err.Error(), "inbox: probe: ") {
		t.Errorf("Probe = %v, %v; want false and the driver's error as inbox: probe", found, err)
	}
	pg := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable})
	if found, err := pg.Probe(ctx); !found || err != nil {
		t.Errorf("Probe without a probe statement = %v, %v; want true, nil", found, err)
	}
	m.Met(t)
	if n := m.Sent(); n != 3 {
		t.Errorf("%d statements sent, want the three probes", n)
	}
}

// TestProbeSQL pins the probe of each engine and form: set where the claim
// is a transaction of several statements (MySQL's lease, every row lock),
// empty where it is one statement already, under both clocks.
func TestProbeSQL(t *testing.T) {
	tables := map[string]inbox.Table{
		"lease":    {Name: "jobs", LockedUntil: "locked_until"},
		"row lock": {Name: "jobs", NotBefore: "not_before"},
		"plain":    {Name: "jobs"},
		"advisory": {Name: "jobs", AdvisoryKey: "id", NotBefore: "not_before"},
	}
	dialects := map[string]inbox.Dialect{"postgres": inbox.Postgres, "mysql": inbox.MySQL, "mariadb": inbox.MariaDB, "sqlite": inbox.SQLite}
	for _, w := range []struct {
		engine, form string
		callerClock  bool
		sql          string
	}{
		{"postgres", "lease", false, ""},
		{"postgres", "row lock", false, `SELECT 1 FROM "jobs" WHERE ("not_before" IS NULL OR "not_before" <= statement_timestamp()) LIMIT 1`},
		{"postgres", "row lock", true, `SELECT 1 FROM "jobs" WHERE ("not_before" IS NULL OR "not_before" <= $1) LIMIT 1`},
		{"postgres", "plain", false, `SELECT 1 FROM "jobs" LIMIT 1`},
		{"postgres", "advisory", false, ""},
		{"mysql", "lease", false, "SELECT 1 FROM `jobs` WHERE `locked_until` IS NULL OR `locked_until` <= UTC_TIMESTAMP(6) LIMIT 1"},
		{"mysql", "lease", true, "SELECT 1 FROM `jobs` WHERE `locked_until` IS NULL OR `locked_until` <= ? LIMIT 1"},
		{"mariadb", "lease", false, "SELECT 1 FROM `jobs` WHERE `locked_until` IS NULL OR `locked_until` <= UTC_TIMESTAMP(6) LIMIT 1"},
		{"mysql", "row lock", false, "SELECT 1 FROM `jobs` WHERE (`not_before` IS NULL OR `not_before` <= UTC_TIMESTAMP(6)) LIMIT 1"},
		{"mysql", "plain", true, "SELECT 1 FROM `jobs` LIMIT 1"},
		{"mysql", "advisory", false, ""},
		{"sqlite", "lease", true, ""},
		{"sqlite", "advisory", true, ""},
	} {
		cfg := inbox.Config{Dialect: dialects[w.engine], Table: tables[w.form]}
		if w.callerClock {
			cfg.Now = time.Now
		}
		q := newQueue(t, newMock(t), cfg)
		if got := q.Statements().Jobs.Probe.SQL; got != w.sql {
			t.Errorf("%s %s, caller's clock %v:\n got %s\nwant %s", w.engine, w.form, w.callerClock, got, w.sql)
		}
	}
}
