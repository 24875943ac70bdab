package inboxtest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/inboxtest"
)

// resize is the worker the examples test: it claims one job and settles it
// by its payload, as a real handler would by its work's result.
func resize(ctx context.Context, q *inbox.Queue) (string, error) {
	jobs, err := q.Claim(ctx, 1)
	if err != nil || len(jobs) == 0 {
		return "idle", err
	}
	job := jobs[0]
	var file string
	if err := job.Scan(&file); err != nil {
		return "", err
	}
	switch {
	case strings.HasSuffix(file, ".png"):
		return "resized " + file, job.Ack(ctx)
	case strings.HasSuffix(file, ".tmp"):
		return "not yet: " + file, job.Retry(ctx, time.Minute)
	case strings.HasSuffix(file, ".part"):
		return "gave back " + file, job.Release(ctx)
	}
	return "gave up on " + file, job.Dead(ctx)
}

// A test of a worker on PostgreSQL under a lease: the claim of one job,
// then its acknowledgement, each in one line.
func Example() {
	db, mock, _ := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
	defer db.Close()
	cfg := inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "jobs", LockedUntil: "locked_until"}}
	q, _ := inbox.New(db, cfg)

	m := inboxtest.New(mock, q, cfg)
	m.ExpectClaim(1, inboxtest.Job{ID: 7, Data: []any{[]byte("a.png")}})
	m.ExpectAck(7)

	fmt.Println(resize(context.Background(), q))
	fmt.Println(mock.ExpectationsWereMet())
	// Output:
	// resized a.png <nil>
	// <nil>
}

// Under the row lock on MySQL the claim is a transaction per job, with the
// engine's clock read before the retry writes its not-before time: the
// same two lines expect all of it.
func Example_rowLock() {
	db, mock, _ := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
	defer db.Close()
	cfg := inbox.Config{Dialect: inbox.MySQL, Table: inbox.Table{Name: "jobs", NotBefore: "not_before"}}
	q, _ := inbox.New(db, cfg)

	m := inboxtest.New(mock, q, cfg)
	m.ExpectClaim(1, inboxtest.Job{ID: 7, Attempt: 2, Data: []any{[]byte("b.tmp")}})
	m.ExpectRetry(7, time.Minute)

	fmt.Println(resize(context.Background(), q))
	fmt.Println(mock.ExpectationsWereMet())
	// Output:
	// not yet: b.tmp <nil>
	// <nil>
}

// The advisory form on SQLite with the caller's clock, and a claim that
// finds nothing after the job was given back.
func Example_advisory() {
	db, mock, _ := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
	defer db.Close()
	now := time.Date(2025, 3, 14, 9, 26, 53, 0, time.UTC)
	cfg := inbox.Config{
		Dialect: inbox.SQLite,
		Table:   inbox.Table{Name: "jobs", AdvisoryKey: "id", DeadTable: "dead_jobs"},
		Now:     func() time.Time { return now },
	}
	q, _ := inbox.New(db, cfg)

	m := inboxtest.New(mock, q, cfg)
	m.ExpectClaim(1, inboxtest.Job{ID: 7, Data: []any{[]byte("c.part")}})
	m.ExpectRelease(7)
	m.ExpectEmptyClaim(1)

	ctx := context.Background()
	fmt.Println(resize(ctx, q))
	fmt.Println(resize(ctx, q))
	fmt.Println(mock.ExpectationsWereMet())
	// Output:
	// gave back c.part <nil>
	// idle <nil>
	// <nil>
}

// A lease that ran out while the handler worked: the move to the dead
// table finds the row no longer carries the delivery's token.
func ExampleMock_ExpectLeaseLost() {
	db, mock, _ := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
	defer db.Close()
	cfg := inbox.Config{
		Dialect: inbox.MySQL,
		Table:   inbox.Table{Name: "jobs", LockedUntil: "locked_until", DeadTable: "dead_jobs"},
	}
	q, _ := inbox.New(db, cfg)

	m := inboxtest.New(mock, q, cfg)
	m.ExpectClaim(1, inboxtest.Job{ID: 7, Attempt: 5, Data: []any{[]byte("d.svg")}})
	m.ExpectLeaseLost(7, inboxtest.Dead)

	outcome, err := resize(context.Background(), q)
	fmt.Println(outcome, errors.Is(err, inbox.ErrLeaseLost))
	fmt.Println(mock.ExpectationsWereMet())
	// Output:
	// gave up on d.svg true
	// <nil>
}

// A claim of up to ten jobs that finds two, under the row lock: one
// transaction per job, and one more attempt that finds none.
func ExampleMock_ExpectClaim() {
	db, mock, _ := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
	defer db.Close()
	cfg := inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "jobs"}}
	q, _ := inbox.New(db, cfg)

	m := inboxtest.New(mock, q, cfg)
	m.ExpectClaim(10,
		inboxtest.Job{ID: 1, Data: []any{[]byte("a.png")}},
		inboxtest.Job{ID: 2, Attempt: 3, Data: []any{[]byte("b.png")}})

	ctx := context.Background()
	jobs, err := q.Claim(ctx, 10)
	for _, j := range jobs {
		fmt.Println(j.ID(), j.Attempt())
		m.ExpectRelease(j.ID())
		_ = j.Release(ctx)
	}
	fmt.Println(err, mock.ExpectationsWereMet())
	// Output:
	// 1 1
	// 2 3
	// <nil> <nil>
}
