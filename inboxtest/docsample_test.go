package inboxtest_test

import (
	"context"
	"testing"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/inboxtest"
)

// handleNext is the worker under test in docs/testing.md's sample: it claims one
// job and acks it.
func handleNext(ctx context.Context, q *inbox.Queue) error {
	ds, err := q.Claim(ctx, 1)
	if err != nil {
		return err
	}
	for _, d := range ds {
		if err := d.Ack(ctx); err != nil {
			return err
		}
	}
	return nil
}

// TestWorkerAcks is docs/testing.md's first sample, run as written
// (examples/quickstart/readme_test.go checks the doc still copies it).
func TestWorkerAcks(t *testing.T) {
	db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	cfg := inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "jobs", LockedUntil: "locked_until"}}
	q, err := inbox.New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}

	m := inboxtest.New(mock, q, cfg)
	m.ExpectClaim(1, inboxtest.Job{ID: 7, Data: []any{[]byte("a.png")}})
	m.ExpectAck(7)

	if err := handleNext(context.Background(), q); err != nil { // the worker under test
		t.Fatal(err)
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Error(err)
	}
}
