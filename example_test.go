package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqlinbox/inbox"
)

// New validates the description and prepares every statement, without
// touching the database. Naming the lease column selects the lease form.
func ExampleNew() {
	db, _, _ := sqlmock.New() // any *sql.DB: New sends nothing
	defer db.Close()

	q, err := inbox.New(db, inbox.Config{
		Dialect: inbox.SQLite,
		Table:   inbox.Table{Name: "report_jobs", LockedUntil: "locked_until"},
		Lease:   time.Minute,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(q.Form(), q.Lease())
	fmt.Println(q.Statements().Claim.Take.SQL)
	// Output:
	// lease 1m0s
	// UPDATE `report_jobs` SET `attempt` = `attempt` + 1, `locked_until` = ? WHERE `id` IN (SELECT `id` FROM (SELECT `id` FROM `report_jobs` WHERE `locked_until` <= ? ORDER BY `locked_until` LIMIT ?) UNION ALL SELECT `id` FROM (SELECT `id` FROM `report_jobs` WHERE `locked_until` IS NULL ORDER BY `id` LIMIT ?) LIMIT ?) RETURNING `id`, `attempt` - 1, `locked_until`, `payload`
}

// SQLite has no row locks: a table that names neither a lease column nor an
// advisory key is refused there.
func ExampleNew_sqliteRowLock() {
	db, _, _ := sqlmock.New()
	defer db.Close()

	_, err := inbox.New(db, inbox.Config{Dialect: inbox.SQLite, Table: inbox.Table{Name: "jobs"}})
	fmt.Println(err)
	// Output:
	// inbox: new: sqlite: SQLite has no row locks: name Table.LockedUntil for the lease form or Table.AdvisoryKey for the advisory form
}

// A worker claims what is waiting and settles each job: Ack when done,
// Retry to try again later.
func ExampleQueue_Claim() {
	db, mock, _ := sqlmock.New()
	defer db.Close()
	// The database holds two jobs; the second failed twice before.
	mock.ExpectQuery("UPDATE").WillReturnRows(sqlmock.NewRows([]string{"id", "attempt", "locked_until", "payload"}).
		AddRow(1, 1, "2024-03-01T12:00:30.000000Z", "resize a.png").
		AddRow(2, 3, "2024-03-01T12:00:30.000000Z", "resize b.png"))
	mock.ExpectExec("DELETE").WillReturnResult(sqlmock.NewResult(0, 1))
	mock.ExpectExec("UPDATE").WillReturnResult(sqlmock.NewResult(0, 1))

	q, err := inbox.New(db, inbox.Config{
		Dialect: inbox.SQLite,
		Table:   inbox.Table{Name: "jobs", LockedUntil: "locked_until"},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	jobs, err := q.Claim(ctx, 10)
	if err != nil {
		log.Fatal(err)
	}
	for _, job := range jobs {
		var payload string
		if err := job.Scan(&payload); err != nil {
			log.Fatal(err)
		}
		outcome := "done"
		if job.Attempt() < 3 {
			err = job.Ack(ctx)
		} else {
			outcome = "retry in an hour"
			err = job.Retry(ctx, time.Hour)
		}
		if err != nil {
			log.Print(err) // inbox.ErrLeaseLost: another worker has it now
			continue
		}
		fmt.Printf("job %v, attempt %d, %s: %s\n", job.ID(), job.Attempt(), payload, outcome)
	}
	// Output:
	// job 1, attempt 1, resize a.png: done
	// job 2, attempt 3, resize b.png: retry in an hour
}

// Keep extends the lease while a long handler runs and cancels the
// handler's context if the lease is lost; stop ends it once the handler
// returns.
func ExampleDelivery_Keep() {
	db, mock, _ := sqlmock.New()
	defer db.Close()
	mock.ExpectQuery("UPDATE").WillReturnRows(sqlmock.NewRows([]string{"id", "attempt", "locked_until", "payload"}).
		AddRow(7, 1, "2024-03-01T12:00:30.000000Z", "quarterly report"))
	mock.ExpectExec("DELETE").WillReturnResult(sqlmock.NewResult(0, 1))

	q, err := inbox.New(db, inbox.Config{
		Dialect: inbox.SQLite,
		Table:   inbox.Table{Name: "jobs", LockedUntil: "locked_until"},
		Lease:   time.Minute,
	})
	if err != nil {
		log.Fatal(err)
	}
	render := func(ctx context.Context, job *inbox.Delivery) error {
		var title string
		if err := job.Scan(&title); err != nil {
			return err
		}
		fmt.Println("rendering", title)
		return ctx.Err() // a long handler checks ctx as it goes
	}

	ctx := context.Background()
	jobs, err := q.Claim(ctx, 1)
	if err != nil {
		log.Fatal(err)
	}
	for _, job := range jobs {
		hctx, stop := job.Keep(ctx)
		err := render(hctx, job)
		stop()
		if err != nil {
			log.Print(err)
			continue
		}
		if err := job.Ack(ctx); err != nil {
			log.Print(err)
			continue
		}
		fmt.Println("done", job.ID())
	}
	// Output:
	// rendering quarterly report
	// done 7
}

// Enqueue inserts through a *sql.DB, a *sql.Tx or a *sql.Conn, so that a
// job can commit with the caller's own writes.
func ExampleQueue_Enqueue() {
	db, mock, _ := sqlmock.New()
	defer db.Close()
	mock.ExpectBegin()
	mock.ExpectQuery("INSERT").WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(42))
	mock.ExpectCommit()

	q, err := inbox.New(db, inbox.Config{
		Dialect: inbox.SQLite,
		Table:   inbox.Table{Name: "jobs", LockedUntil: "locked_until"},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	// ... the caller's own writes through tx ...
	id, err := q.Enqueue(ctx, tx, inbox.Job{Data: []any{"resize c.png"}})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	fmt.Println("enqueued", id)
	// Output:
	// enqueued 42
}

// A handler's writes and the acknowledgement commit together in the
// caller's transaction; the delivery counts as settled once the commit is
// confirmed with Committed. Had the transaction rolled back, the job would
// still be the delivery's, to be acknowledged again.
func ExampleDelivery_AckTx() {
	db, mock, _ := sqlmock.New()
	defer db.Close()
	mock.ExpectQuery("UPDATE").WillReturnRows(sqlmock.NewRows([]string{"id", "attempt", "locked_until", "payload"}).
		AddRow(7, 1, "2024-03-01T12:00:30.000000Z", "invoice 7"))
	mock.ExpectBegin()
	mock.ExpectExec("INSERT").WillReturnResult(sqlmock.NewResult(0, 1))
	mock.ExpectExec("DELETE").WillReturnResult(sqlmock.NewResult(0, 1))
	mock.ExpectCommit()

	q, err := inbox.New(db, inbox.Config{
		Dialect: inbox.SQLite,
		Table:   inbox.Table{Name: "jobs", LockedUntil: "locked_until"},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	jobs, err := q.Claim(ctx, 1)
	if err != nil {
		log.Fatal(err)
	}
	d := jobs[0]
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "INSERT INTO invoices_sent (job) VALUES (?)", d.ID()); err != nil {
		log.Fatal(err)
	}
	if err := d.AckTx(ctx, tx); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err) // not settled: d may be settled again
	}
	if err := d.Committed(tx); err != nil {
		log.Fatal(err)
	}
	fmt.Println(errors.Is(d.Ack(ctx), inbox.ErrSettled))
	// Output:
	// true
}
