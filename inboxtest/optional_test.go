package inboxtest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/inboxtest"
)

// A table with the optional columns (last error, priority, enqueue time):
// the claim delivers the job's last error and priority, and a Retry and a
// Dead that record an error are expected as plain ones.
func TestWorkerOptionalColumns(t *testing.T) {
	each(t, func(t *testing.T, cfg inbox.Config) {
		cfg.Table.LastError, cfg.Table.Priority, cfg.Table.EnqueuedAt = "last_error", "priority", "enqueued_at"
		if cfg.Table.DeadTable == "" {
			cfg.Table.DeadTable = "jobs_dead"
		}
		q, m, mock := setup(t, cfg)
		ctx := context.Background()
		m.ExpectClaim(1, inboxtest.Job{ID: 7, Data: []any{[]byte("p")}, LastError: "timeout", Priority: 3})
		m.ExpectRetryWithError(7, 0)
		m.ExpectClaim(1, inboxtest.Job{ID: 7, Attempt: 2, Data: []any{[]byte("p")}, LastError: "boom"})
		m.ExpectDead(7)
		for i, want := range []string{"timeout", "boom"} {
			ds, err := q.Claim(ctx, 1)
			if err != nil || len(ds) != 1 {
				t.Fatalf("claim: %d, %v", len(ds), err)
			}
			d := ds[0]
			if d.LastError() != want {
				t.Errorf("LastError() = %q, want %q", d.LastError(), want)
			}
			if i == 0 && d.Priority() != 3 {
				t.Errorf("Priority() = %d, want 3", d.Priority())
			}
			d.SetError(errors.New("boom"))
			if i == 0 {
				err = d.Retry(ctx, 0)
			} else {
				err = d.Dead(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		met(t, mock)
	})
}
