package periodic_test

import (
	"context"
	"database/sql"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/periodic"
)

// A scheduler enqueueing a cleanup job every ten minutes into a SQLite
// queue, until interrupted. Every process of the application may run the
// same code: each tick is enqueued once among them.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	db, err := sql.Open("sqlite", "file:app.db?_pragma=busy_timeout(5000)")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	q, err := inbox.New(db, inbox.Config{
		Dialect: inbox.SQLite,
		Table:   inbox.Table{Name: "jobs", LockedUntil: "locked_until"},
	})
	if err != nil {
		log.Fatal(err)
	}
	// The state table, once: one row per entry.
	ddl, err := periodic.CreateTableSQL(inbox.SQLite, periodic.DefaultTable)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, ddl); err != nil {
		log.Fatal(err)
	}

	tenMinutes, err := periodic.Every(10 * time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	s, err := periodic.New(q, db, periodic.Config{
		Entries: []periodic.Entry{{
			Name:     "cleanup",
			Schedule: tenMinutes,
			Job: func(tick time.Time) inbox.Job {
				return inbox.Job{Data: []any{[]byte("cleanup " + tick.Format(time.RFC3339))}}
			},
		}},
		OnError: func(err error) { log.Print(err) },
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := s.Run(ctx); err != nil {
		log.Fatal(err) // the table is missing, or the database out of reach
	}
}
