package inboxtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/inboxtest"
	"github.com/sqlinbox/inbox/worker"
)

// An idle Work loop on each queue whose claim is a transaction: its first
// claim finds nothing, its probes find nothing then a job, which it claims
// and acknowledges; every statement as the expectations say, in order.
func TestExpectProbe(t *testing.T) {
	fixed := time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name string
		cfg  inbox.Config
	}{
		{"mysql lease", inbox.Config{Dialect: inbox.MySQL, Table: inbox.Table{Name: "jobs", LockedUntil: "locked_until"}}},
		{"mariadb lease, caller's clock", inbox.Config{Dialect: inbox.MariaDB, Table: inbox.Table{Name: "jobs", LockedUntil: "locked_until"},
			Now: func() time.Time { return fixed }}},
		{"postgres row lock", inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "jobs", NotBefore: "not_before"}}},
		{"mysql row lock, caller's clock", inbox.Config{Dialect: inbox.MySQL, Table: inbox.Table{Name: "tenant.jobs"},
			Now: func() time.Time { return fixed }}},
	} {
		t.Run(c.name, func(t *testing.T) {
			db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			q, err := inbox.New(db, c.cfg)
			if err != nil {
				t.Fatal(err)
			}
			m := inboxtest.New(mock, q, c.cfg)
			m.ExpectEmptyClaim(1)
			m.ExpectProbe(false)
			m.ExpectProbe(true)
			m.ExpectClaim(1, inboxtest.Job{ID: 7, Data: []any{[]byte("a.png")}})
			m.ExpectAck(7)

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var handled []any
			err = worker.Run(ctx, q, worker.Config{Poll: time.Millisecond, NoDelay: true, RetryForever: true, OnError: func(err error) { t.Errorf("OnError: %v", err) }},
				func(_ context.Context, d *inbox.Delivery) error {
					handled = append(handled, d.ID())
					cancel() // the loop returns once the job is acknowledged
					return nil
				})
			if err != nil {
				t.Fatal(err)
			}
			if len(handled) != 1 || handled[0] != int64(7) {
				t.Errorf("handled %v, want job 7", handled)
			}
			if err := mock.ExpectationsWereMet(); err != nil {
				t.Error(err)
			}
		})
	}
}
