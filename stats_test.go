package inbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqlinbox/inbox"
)

// TestStatsInWorkSQL (issue 23) pins, per dialect and form, the statement
// that reads the jobs in work from the server's lock tables where Stats'
// own returns -1: MySQL 8's data_locks and MariaDB's metadata_lock_info
// view under the row lock, for a plain and a schema-qualified table; none
// elsewhere (PostgreSQL counts in Stats itself, the advisory form's keys
// cannot be told apart, the lease counts its leases).
func TestStatsInWorkSQL(t *testing.T) {
	rowLock := func(name string) inbox.Table { return inbox.Table{Name: name, EnqueuedAt: "enqueued_at"} }
	for _, w := range []struct {
		name    string
		dialect inbox.Dialect
		table   inbox.Table
		sql     string
	}{
		{"mysql row lock", inbox.MySQL, rowLock("jobs"), "SELECT CASE WHEN @@performance_schema = 1 THEN (SELECT COUNT(DISTINCT ENGINE_TRANSACTION_ID) FROM performance_schema.data_locks WHERE OBJECT_SCHEMA = DATABASE() AND OBJECT_NAME = 'jobs' AND LOCK_TYPE = 'TABLE' AND LOCK_MODE = 'IX' AND LOCK_STATUS = 'GRANTED') ELSE -1 END"},
		{"mysql row lock qualified", inbox.MySQL, rowLock("app.jobs"), "SELECT CASE WHEN @@performance_schema = 1 THEN (SELECT COUNT(DISTINCT ENGINE_TRANSACTION_ID) FROM performance_schema.data_locks WHERE OBJECT_SCHEMA = 'app' AND OBJECT_NAME = 'jobs' AND LOCK_TYPE = 'TABLE' AND LOCK_MODE = 'IX' AND LOCK_STATUS = 'GRANTED') ELSE -1 END"},
		{"mariadb row lock", inbox.MariaDB, rowLock("jobs"), "SELECT COUNT(DISTINCT THREAD_ID) FROM information_schema.METADATA_LOCK_INFO WHERE LOCK_TYPE = 'Table metadata lock' AND LOCK_MODE = 'MDL_SHARED_WRITE' AND TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'jobs'"},
		{"mariadb row lock qualified", inbox.MariaDB, rowLock("app.jobs"), "SELECT COUNT(DISTINCT THREAD_ID) FROM information_schema.METADATA_LOCK_INFO WHERE LOCK_TYPE = 'Table metadata lock' AND LOCK_MODE = 'MDL_SHARED_WRITE' AND TABLE_SCHEMA = 'app' AND TABLE_NAME = 'jobs'"},
		{"mariadb advisory", inbox.MariaDB, inbox.Table{Name: "jobs", AdvisoryKey: "id"}, ""},
		{"mariadb lease", inbox.MariaDB, inbox.Table{Name: "jobs", LockedUntil: "locked_until"}, ""},
		{"mysql advisory", inbox.MySQL, inbox.Table{Name: "jobs", AdvisoryKey: "id"}, ""},
		{"postgres row lock", inbox.Postgres, rowLock("jobs"), ""},
		{"postgres advisory", inbox.Postgres, inbox.Table{Name: "jobs", AdvisoryKey: "id"}, ""},
		{"sqlite advisory", inbox.SQLite, inbox.Table{Name: "jobs", AdvisoryKey: "id"}, ""},
	} {
		m := newMock(t)
		q := newQueue(t, m, inbox.Config{Dialect: w.dialect, Table: w.table})
		st := q.Statements().Jobs.InWork
		if st.SQL != w.sql || len(st.Args) != 0 || (w.sql != "" && !st.Rows) {
			t.Errorf("%s: InWork = %q (args %v, rows %v), want %q, no args, rows", w.name, st.SQL, st.Args, st.Rows, w.sql)
		}
	}
}

// TestStatsInWorkRead (issue 23): Stats sends the lock view's statement
// after its own when its own cannot count the jobs in work, and takes the
// jobs held out of the ready ones; a view the server lacks (MariaDB without
// the plugin: error 1109) or a performance_schema that is off leaves -1 with
// the reason in InWorkErr and is no error of Stats'; a cancelled context is.
func TestStatsInWorkRead(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	cfg := func(d inbox.Dialect) inbox.Config {
		return inbox.Config{Dialect: d, Table: inbox.Table{Name: "jobs", EnqueuedAt: "enqueued_at"}, Now: func() time.Time { return now }}
	}
	statsRow := func() *sqlmock.Rows {
		return sqlmock.NewRows([]string{"ready", "waiting", "in_work", "dead", "age"}).AddRow(10, 2, -1, -1, 5000000)
	}
	for _, w := range []struct {
		name      string
		dialect   inbox.Dialect
		answer    func(e *sqlmock.ExpectedQuery)
		inWork    int64
		ready     int64
		errSubstr string
	}{
		{"mariadb three held", inbox.MariaDB, func(e *sqlmock.ExpectedQuery) {
			e.WillReturnRows(sqlmock.NewRows([]string{"n"}).AddRow(3))
		}, 3, 7, ""},
		{"mariadb no plugin", inbox.MariaDB, func(e *sqlmock.ExpectedQuery) {
			e.WillReturnError(errors.New("Error 1109 (42S02): Unknown table 'METADATA_LOCK_INFO' in information_schema"))
		}, -1, 10, "METADATA_LOCK_INFO"},
		{"mysql none held", inbox.MySQL, func(e *sqlmock.ExpectedQuery) {
			e.WillReturnRows(sqlmock.NewRows([]string{"n"}).AddRow(0))
		}, 0, 10, ""},
		{"mysql performance_schema off", inbox.MySQL, func(e *sqlmock.ExpectedQuery) {
			e.WillReturnRows(sqlmock.NewRows([]string{"n"}).AddRow(-1))
		}, -1, 10, "performance_schema is off"},
	} {
		t.Run(w.name, func(t *testing.T) {
			m := newMock(t)
			q := newQueue(t, m, cfg(w.dialect))
			m.ExpectQuery(q.Statements().Jobs.Stats.SQL).WillReturnRows(statsRow())
			w.answer(m.ExpectQuery(q.Statements().Jobs.InWork.SQL).WithArgs())
			st, err := q.Stats(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if st.InWork != w.inWork || st.Ready != w.ready || st.Waiting != 2 || st.OldestReady != 5*time.Second {
				t.Errorf("Stats = %+v, want in work %d, ready %d, waiting 2, oldest 5s", st, w.inWork, w.ready)
			}
			if w.errSubstr == "" && st.InWorkErr != nil || w.errSubstr != "" && (st.InWorkErr == nil || !strings.Contains(st.InWorkErr.Error(), w.errSubstr)) {
				t.Errorf("InWorkErr = %v, want one naming %q", st.InWorkErr, w.errSubstr)
			}
			m.Met(t)
		})
	}
	t.Run("cancelled", func(t *testing.T) {
		m := newMock(t)
		q := newQueue(t, m, cfg(inbox.MariaDB))
		ctx, cancel := context.WithCancel(context.Background())
		m.ExpectQuery(q.Statements().Jobs.Stats.SQL).WillReturnRows(statsRow())
		m.ExpectQuery(q.Statements().Jobs.InWork.SQL).WillDelayFor(time.Minute).WillReturnRows(sqlmock.NewRows([]string{"n"}).AddRow(1))
		before := m.Sent()
		go func() {
			// Cancel once the lock read reached the driver (the second
			// call), where it waits.
			for deadline := time.Now().Add(10 * time.Second); m.Sent() < before+2 && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
			cancel()
		}()
		st, err := q.Stats(ctx)
		if err == nil || !strings.Contains(err.Error(), "inbox: stats") || st.InWorkErr != nil {
			t.Errorf("Stats with its context cancelled during the lock read = %v (InWorkErr %v), want Stats' error", err, st.InWorkErr)
		}
		if m.Sent() != before+2 {
			t.Errorf("%d calls reached the driver, want the two statements", m.Sent()-before)
		}
	})
}
