package worker

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/fakedb"
)

// TestRunRefusesSmallPool (issue 22 item 7): under the row lock, Workers ×
// Batch jobs need a pool of one more; one short is refused before any
// statement is sent, with an error matching ErrPoolTooSmall that names the
// call to make; the pool Run asks for passes the check.
func TestRunRefusesSmallPool(t *testing.T) {
	m := fakedb.New(t)
	q, err := inbox.New(m.DB, inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "jobs", DeadTable: "jobs_dead", NotBefore: "not_before"}})
	if err != nil {
		t.Fatal(err)
	}
	m.DB.SetMaxOpenConns(12)
	cfg := Config{Workers: 4, Batch: 3}
	err = Run(context.Background(), q, cfg, func(context.Context, *inbox.Delivery) error { return nil })
	if !errors.Is(err, inbox.ErrPoolTooSmall) || !strings.Contains(err.Error(), "4 loop(s) of Config.Batch 3 may hold 12 jobs in work") ||
		!strings.Contains(err.Error(), "db.SetMaxOpenConns(13) or more (the pool allows 12)") {
		t.Errorf("Run: %v", err)
	}
	if n := m.Sent(); n != 0 {
		t.Errorf("%d calls sent before the refusal, want none", n)
	}
	m.DB.SetMaxOpenConns(13)
	if err := fits(q, cfg, cfg.Batch); err != nil {
		t.Errorf("a pool of 13 for 4 x 3: %v", err)
	}
}
