package inbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/worker"
)

// What the loop meets and does not return goes to Config.OnError: here a
// claim the driver fails, which may heal. The loop then checks the schema
// (which cannot run either) and claims again after a backoff, until its
// context ends.
func TestWorkOnError(t *testing.T) {
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: leaseTable})
	errDown := errors.New("connection refused")
	m.ExpectQuery(pgLeaseClaim).WillReturnError(errDown)
	// The failure has the loop check the schema, which fails too: the
	// server may come back, so the loop claims again.
	m.ExpectQuery(inbox.PgProbe).WillReturnError(errDown)
	m.ExpectQuery(inbox.MyProbe).WillReturnError(errDown)
	m.ExpectQuery(inbox.SQLiteProbe).WillReturnError(errDown)
	m.ExpectQuery(pgLeaseClaim).WillReturnError(errDown)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var seen []error
	cfg := worker.Config{Poll: time.Millisecond, OnError: func(err error) {
		seen = append(seen, err)
		if len(seen) == 2 {
			cancel()
		}
	}}
	if err := worker.Run(ctx, q, cfg, func(context.Context, *inbox.Delivery) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 2 || !errors.Is(seen[0], errDown) || !errors.Is(seen[1], errDown) {
		t.Fatalf("OnError saw %v, want the driver's error twice", seen)
	}
	m.Met(t)
}
