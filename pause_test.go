package inbox_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/dialect"
)

// TestControlSQL (issue 37 item 4) pins, per engine, the control table's
// statements (Statements.Control): Pause an upsert keeping the first
// pause's time and author, Resume and Read a primary-key probe, each
// keyed by the table's name as described; none without a control table.
func TestControlSQL(t *testing.T) {
	tb := inbox.Table{Name: "app.jobs", LockedUntil: "locked_until", ControlTable: "app.queues"}
	args := []dialect.Arg{dialect.ArgQueue, dialect.ArgNow, dialect.ArgBy}
	for _, w := range []struct {
		name                string
		d                   inbox.Dialect
		now                 bool // the caller's clock
		pause, resume, read string
		pauseArgs           []dialect.Arg
	}{
		{"postgres", inbox.Postgres, false,
			`INSERT INTO "app"."queues" AS c (queue, paused_at, paused_by) VALUES ($1, statement_timestamp(), $2) ON CONFLICT (queue) DO UPDATE SET paused_at = COALESCE(c.paused_at, EXCLUDED.paused_at), paused_by = CASE WHEN c.paused_at IS NULL THEN EXCLUDED.paused_by ELSE c.paused_by END`,
			`UPDATE "app"."queues" SET paused_at = NULL, paused_by = NULL WHERE queue = $1`,
			`SELECT paused_at, paused_by FROM "app"."queues" WHERE queue = $1`,
			[]dialect.Arg{dialect.ArgQueue, dialect.ArgBy}},
		{"postgres clock", inbox.Postgres, true,
			`INSERT INTO "app"."queues" AS c (queue, paused_at, paused_by) VALUES ($1, $2, $3) ON CONFLICT (queue) DO UPDATE SET paused_at = COALESCE(c.paused_at, EXCLUDED.paused_at), paused_by = CASE WHEN c.paused_at IS NULL THEN EXCLUDED.paused_by ELSE c.paused_by END`,
			`UPDATE "app"."queues" SET paused_at = NULL, paused_by = NULL WHERE queue = $1`,
			`SELECT paused_at, paused_by FROM "app"."queues" WHERE queue = $1`,
			args},
		{"mysql", inbox.MySQL, false,
			"INSERT INTO `app`.`queues` (queue, paused_at, paused_by) VALUES (?, UTC_TIMESTAMP(6), ?) ON DUPLICATE KEY UPDATE paused_by = IF(paused_at IS NULL, VALUES(paused_by), paused_by), paused_at = COALESCE(paused_at, VALUES(paused_at))",
			"UPDATE `app`.`queues` SET paused_at = NULL, paused_by = NULL WHERE queue = ?",
			"SELECT paused_at, paused_by FROM `app`.`queues` WHERE queue = ?",
			[]dialect.Arg{dialect.ArgQueue, dialect.ArgBy}},
		{"mariadb clock", inbox.MariaDB, true,
			"INSERT INTO `app`.`queues` (queue, paused_at, paused_by) VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE paused_by = IF(paused_at IS NULL, VALUES(paused_by), paused_by), paused_at = COALESCE(paused_at, VALUES(paused_at))",
			"UPDATE `app`.`queues` SET paused_at = NULL, paused_by = NULL WHERE queue = ?",
			"SELECT paused_at, paused_by FROM `app`.`queues` WHERE queue = ?",
			args},
		{"sqlite", inbox.SQLite, false,
			"INSERT INTO `app`.`queues` (queue, paused_at, paused_by) VALUES (?, ?, ?) ON CONFLICT (queue) DO UPDATE SET paused_at = COALESCE(paused_at, excluded.paused_at), paused_by = CASE WHEN paused_at IS NULL THEN excluded.paused_by ELSE paused_by END",
			"UPDATE `app`.`queues` SET paused_at = NULL, paused_by = NULL WHERE queue = ?",
			"SELECT paused_at, paused_by FROM `app`.`queues` WHERE queue = ?",
			args},
	} {
		m := newMock(t)
		cfg := inbox.Config{Dialect: w.d, Table: tb}
		if w.now {
			cfg.Now = func() time.Time { return t0 }
		}
		c := newQueue(t, m, cfg).Statements().Control
		for _, s := range []struct {
			field string
			got   dialect.Stmt
			sql   string
			args  []dialect.Arg
			rows  bool
		}{{"Pause", c.Pause, w.pause, w.pauseArgs, false}, {"Resume", c.Resume, w.resume, []dialect.Arg{dialect.ArgQueue}, false},
			{"Read", c.Read, w.read, []dialect.Arg{dialect.ArgQueue}, true}} {
			if s.got.SQL != s.sql || !slices.Equal(s.got.Args, s.args) || s.got.Rows != s.rows {
				t.Errorf("%s %s:\n got %s %v rows %v\nwant %s %v rows %v", w.name, s.field, s.got.SQL, s.got.Args, s.got.Rows, s.sql, s.args, s.rows)
			}
		}
		tb := tb
		tb.ControlTable = ""
		if c := newQueue(t, newMock(t), inbox.Config{Dialect: w.d, Table: tb}).Statements().Control; c.Pause.SQL != "" || c.Resume.SQL != "" || c.Read.SQL != "" {
			t.Errorf("%s without a control table: Control = %+v, want empty", w.name, c)
		}
	}
}

// TestPauseResume: Pause sends its upsert with the table's name, the
// clock and who paused; Paused reads the row (none, a NULL time: running);
// Resume clears it; Stats reads the state after its counts; a Pause or
// Resume closes PauseChanged's channel and wakes the idle loops.
func TestPauseResume(t *testing.T) {
	m := newMock(t)
	tb := inbox.Table{Name: "jobs", LockedUntil: "locked_until", EnqueuedAt: "enqueued_at", ControlTable: "queues"}
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: tb, Now: func() time.Time { return t0 }})
	c := q.Statements().Control
	ctx := context.Background()

	m.ExpectQuery(c.Read.SQL).WithArgs("jobs").WillReturnRows(sqlmock.NewRows([]string{"paused_at", "paused_by"}))
	if ps, err := q.Paused(ctx); err != nil || ps != (inbox.PauseState{}) {
		t.Errorf("Paused without a row = %+v, %v; want running", ps, err)
	}
	changed, woken := q.PauseChanged(), q.NextWake()
	m.ExpectExec(c.Pause.SQL).WithArgs("jobs", at(utc0), "ops").WillReturnResult(affected(1))
	if err := q.Pause(ctx, "ops"); err != nil {
		t.Fatal(err)
	}
	for name, ch := range map[string]<-chan struct{}{"PauseChanged": changed, "NextWake": woken} {
		select {
		case <-ch:
		default:
			t.Errorf("Pause left the %s channel open", name)
		}
	}
	m.ExpectQuery(c.Read.SQL).WithArgs("jobs").WillReturnRows(sqlmock.NewRows([]string{"paused_at", "paused_by"}).AddRow(utc0, "ops"))
	if ps, err := q.Paused(ctx); err != nil || !ps.Paused || !ps.Since.Equal(utc0) || ps.By != "ops" {
		t.Errorf("Paused = %+v, %v; want paused since %v by ops", ps, err, utc0)
	}
	m.ExpectQuery(q.Statements().Jobs.Stats.SQL).WillReturnRows(sqlmock.NewRows([]string{"ready", "waiting", "in_work", "dead", "age"}).AddRow(3, 0, 0, -1, nil))
	m.ExpectQuery(c.Read.SQL).WithArgs("jobs").WillReturnRows(sqlmock.NewRows([]string{"paused_at", "paused_by"}).AddRow(utc0, nil))
	if st, err := q.Stats(ctx); err != nil || !st.Paused || !st.PausedSince.Equal(utc0) || st.Ready != 3 {
		t.Errorf("Stats = %+v, %v; want 3 ready, paused since %v", st, err, utc0)
	}
	changed = q.PauseChanged()
	m.ExpectExec(c.Resume.SQL).WithArgs("jobs").WillReturnResult(affected(1))
	if err := q.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	default:
		t.Error("Resume left the PauseChanged channel open")
	}
	m.ExpectQuery(c.Read.SQL).WithArgs("jobs").WillReturnRows(sqlmock.NewRows([]string{"paused_at", "paused_by"}).AddRow(nil, nil))
	if ps, err := q.Paused(ctx); err != nil || ps.Paused {
		t.Errorf("Paused after Resume = %+v, %v; want running", ps, err)
	}
	m.Met(t)
}

// TestPauseRefused: without a control table Pause and Resume return
// ErrNoControlTable and send nothing, and Paused reports a queue that
// runs, sending nothing; New refuses a control table that is the queue
// table, and one a dialect has no statements for.
func TestPauseRefused(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "jobs", LockedUntil: "locked_until"}})
	ctx := context.Background()
	before := m.Sent()
	if err := q.Pause(ctx, "ops"); !errors.Is(err, inbox.ErrNoControlTable) || err.Error() != "inbox: pause: pausing a queue needs Table.ControlTable" {
		t.Errorf("Pause = %v, want ErrNoControlTable", err)
	}
	if err := q.Resume(ctx); !errors.Is(err, inbox.ErrNoControlTable) {
		t.Errorf("Resume = %v, want ErrNoControlTable", err)
	}
	if ps, err := q.Paused(ctx); err != nil || ps.Paused {
		t.Errorf("Paused = %+v, %v; want running", ps, err)
	}
	if n := m.Sent() - before; n != 0 {
		t.Errorf("%d calls reached the driver, want none", n)
	}
	for _, w := range []struct {
		d    inbox.Dialect
		tb   inbox.Table
		want string
	}{
		{inbox.Postgres, inbox.Table{Name: "jobs", LockedUntil: "locked_until", ControlTable: "jobs"}, `Table.ControlTable "jobs" must be a table of its own`},
		{inbox.Postgres, inbox.Table{Name: "jobs", LockedUntil: "locked_until", ControlTable: "bad name"}, `Table.ControlTable "bad name"`},
		{noControl{inbox.Postgres}, inbox.Table{Name: "jobs", LockedUntil: "locked_until", ControlTable: "queues"}, `Table.ControlTable "queues" needs Statements.Control`},
	} {
		if _, err := inbox.New(m.DB, inbox.Config{Dialect: w.d, Table: w.tb}); err == nil || !strings.Contains(err.Error(), w.want) {
			t.Errorf("New(%+v) = %v, want an error with %q", w.tb, err, w.want)
		}
	}
}

// noControl is a dialect written before the control statements.
type noControl struct{ inbox.Dialect }

func (d noControl) Statements(n *dialect.Names) (*inbox.Statements, error) {
	st, err := d.Dialect.Statements(n)
	if err == nil {
		st.Control = dialect.ControlStatements{}
	}
	return st, err
}

func (d noControl) Unwrap() inbox.Dialect { return d.Dialect }
