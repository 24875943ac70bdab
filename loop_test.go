package inbox_test

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

// ReleaseAll gives a claim's lease jobs back in one statement, their
// attempts restored, each token checked.
func TestReleaseAll(t *testing.T) {
	batchRelease := `UPDATE "jobs" SET "locked_until" = NULL, "attempt" = "attempt" - 1 WHERE ` + inbox.PgBatchWhere(1) + ` RETURNING "id"`
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable, Lease: time.Minute})
	exp := utc0.Add(time.Minute)
	m.ExpectQuery(pgClaimUpTo(2, false)).WithArgs(2, 2, 2, minute).WillReturnRows(rows("id,attempt,locked_until,payload",
		row(int64(1), int64(1), exp, []byte("p")), row(int64(2), int64(1), exp, []byte("p"))))
	m.ExpectQuery(batchRelease).WithArgs(inbox.PgBatchArgs("{1,2}", "{2,2}", `{"2024-03-01 12:01:00.123456+00","2024-03-01 12:01:00.123456+00"}`)...).
		WillReturnRows(rows("id", row(int64(1))))
	ds := claim(t, q, 2, 1, 2)
	b, err := q.NewBatcher(inbox.BatchConfig{MaxBatch: 2})
	ok(t, "NewBatcher", err)
	defer b.Close()
	errs := b.ReleaseAll(context.Background(), ds)
	if len(errs) != 2 || errs[0] != nil || !errors.Is(errs[1], inbox.ErrLeaseLost) {
		t.Errorf("ReleaseAll = %v, want nil and ErrLeaseLost for the job whose token no longer matched", errs)
	}
	m.Met(t)
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
