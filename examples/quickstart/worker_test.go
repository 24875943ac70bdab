package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/sqlinbox/inbox"
)

// newMockQueue returns the quick start's queue on a sqlmock database, with a
// stopped clock so that every time the queue writes is known in advance.
func newMockQueue(t *testing.T) (*inbox.Queue, sqlmock.Sqlmock, time.Time) {
	db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	now := time.Date(2025, 3, 14, 9, 26, 53, 0, time.UTC)
	q, err := inbox.New(db, inbox.Config{
		Dialect: inbox.SQLite,
		Table:   reportTable,
		Lease:   30 * time.Second,
		Now:     func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	return q, mock, now
}

// expectClaim expects the claim of one job and returns the lease's expiry
// as stored: the third part of the delivery's token. Claim.For gives the
// text a claim of n jobs sends, on every engine (SQLite claims one job with
// Claim.TakeOne, several with Claim).
func expectClaim(mock sqlmock.Sqlmock, q *inbox.Queue, now time.Time, id int64, attempt int, payload string) string {
	until := now.Add(q.Lease()).Format(inbox.SQLiteTimeFormat)
	mock.ExpectQuery(q.Statements().Claim.For(1).SQL).
		WithArgs(until, now.Format(inbox.SQLiteTimeFormat), 1, 1, 1).
		WillReturnRows(sqlmock.NewRows([]string{"id", "attempt", "locked_until", "payload"}).
			AddRow(id, attempt, until, []byte(payload)))
	return until
}

// claimAndHandle claims one job from q and runs the worker's handler on it.
func claimAndHandle(t *testing.T, q *inbox.Queue) string {
	t.Helper()
	ctx := context.Background()
	ds, err := q.Claim(ctx, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Claim: %d deliveries, %v", len(ds), err)
	}
	outcome, err := handle(ctx, ds[0])
	if err != nil {
		t.Fatalf("handle: %v", err)
	}
	return outcome
}

func TestHandleAcks(t *testing.T) {
	q, mock, now := newMockQueue(t)
	until := expectClaim(mock, q, now, 7, 1, "Q3 sales")
	// Ack deletes the row only while it carries the delivery's token: id,
	// attempt as stored (the delivered one plus one) and expiry.
	mock.ExpectExec(q.Statements().Settle.Ack.SQL).
		WithArgs(7, 2, until).
		WillReturnResult(sqlmock.NewResult(0, 1))

	if got := claimAndHandle(t, q); got != "acked" {
		t.Errorf("outcome %q, want acked", got)
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Error(err)
	}
}

func TestHandleRetries(t *testing.T) {
	q, mock, now := newMockQueue(t)
	until := expectClaim(mock, q, now, 7, 1, "broken")
	// A retry delay is a lease: locked_until moves to now + delay.
	later := now.Add(retryDelay).Format(inbox.SQLiteTimeFormat)
	mock.ExpectExec(q.Statements().Settle.Retry.SQL).
		WithArgs(later, 7, 2, until).
		WillReturnResult(sqlmock.NewResult(0, 1))

	if got := claimAndHandle(t, q); got != "retry: the data source is down" {
		t.Errorf("outcome %q, want a retry", got)
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Error(err)
	}
}

func TestHandleDeadLetters(t *testing.T) {
	q, mock, now := newMockQueue(t)
	until := expectClaim(mock, q, now, 7, maxAttempts, "broken")
	// The move to the dead table: a copy then a delete, in one transaction.
	st := q.Statements()
	mock.ExpectBegin()
	mock.ExpectExec(st.Settle.Dead.SQL).
		WithArgs(maxAttempts, 7, maxAttempts+1, until).
		WillReturnResult(sqlmock.NewResult(0, 1))
	mock.ExpectExec(st.Settle.DeadDelete.SQL).
		WithArgs(7, maxAttempts+1, until).
		WillReturnResult(sqlmock.NewResult(0, 1))
	mock.ExpectCommit()

	if got := claimAndHandle(t, q); got != "dead: the data source is down" {
		t.Errorf("outcome %q, want dead", got)
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Error(err)
	}
}

// TestHandleLeaseLost: an ack whose token no longer matches (the lease ran
// out and another claim took the job) changes nothing and reports
// inbox.ErrLeaseLost.
func TestHandleLeaseLost(t *testing.T) {
	q, mock, now := newMockQueue(t)
	until := expectClaim(mock, q, now, 7, 1, "Q3 sales")
	mock.ExpectExec(q.Statements().Settle.Ack.SQL).
		WithArgs(7, 2, until).
		WillReturnResult(sqlmock.NewResult(0, 0))

	ctx := context.Background()
	ds, err := q.Claim(ctx, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Claim: %d deliveries, %v", len(ds), err)
	}
	if _, err := handle(ctx, ds[0]); !errors.Is(err, inbox.ErrLeaseLost) {
		t.Errorf("handle: %v, want inbox.ErrLeaseLost", err)
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Error(err)
	}
}

// TestClaimSQL pins the text of the SQLite lease claim: one UPDATE …
// RETURNING, which SQLite runs under its single write lock. Expired rows
// (longest expired first) and free ones (in id order) are read apart, each
// up to the limit, and the two cut at the limit.
func TestClaimSQL(t *testing.T) {
	q, _, _ := newMockQueue(t)
	const want = "UPDATE `report_jobs` SET `attempt` = `attempt` + 1, `locked_until` = ? " +
		"WHERE `id` IN (SELECT `id` FROM (SELECT `id` FROM `report_jobs` WHERE `locked_until` <= ? ORDER BY `locked_until` LIMIT ?) " +
		"UNION ALL SELECT `id` FROM (SELECT `id` FROM `report_jobs` WHERE `locked_until` IS NULL ORDER BY `id` LIMIT ?) " +
		"LIMIT ?) " +
		"RETURNING `id`, `attempt` - 1, `locked_until`, `payload`"
	if got := q.Statements().Claim.Take.SQL; got != want {
		t.Errorf("claim SQL:\n got %s\nwant %s", got, want)
	}
	// A claim of one names its row with "=", which SQLite updates in one
	// pass.
	if got, one := q.Statements().Claim.TakeOne.SQL, strings.Replace(want, "WHERE `id` IN (", "WHERE `id` = (", 1); got != one {
		t.Errorf("claim-one SQL:\n got %s\nwant %s", got, one)
	}
}
