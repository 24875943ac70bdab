package cockroach_test

import (
	"context"
	"database/sql"
	"log"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/examples/cockroach"
)

// render stands for the job's work.
func render(ctx context.Context, payload []byte) error { return ctx.Err() }

// A worker host's loop on CockroachDB: the dialect is the only change from
// PostgreSQL. It needs a cluster (cockroach.Schema creates its tables), so
// it is compiled, not run.
func Example() {
	db, err := sql.Open("pgx", "postgres://worker@localhost:26257/jobs?sslmode=verify-full")
	if err != nil {
		log.Fatal(err)
	}
	// The lease form takes a connection per statement, not per job in
	// work: a few connections serve every worker of the host.
	db.SetMaxOpenConns(8)
	db.SetMaxIdleConns(8)
	q, err := inbox.New(db, inbox.Config{
		Dialect: cockroach.Dialect,
		Table:   inbox.Table{Name: "jobs", LockedUntil: "locked_until", DeadTable: "jobs_dead"},
		Lease:   time.Minute, // far above the cluster's --max-offset (500 ms by default)
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	if err := q.CheckSchema(ctx); err != nil {
		log.Fatal(err) // not CockroachDB, older than v22.2, or a column missing
	}
	ds, err := q.Claim(ctx, 16)
	if err != nil {
		log.Fatal(err)
	}
	for _, d := range ds {
		var payload []byte
		if err := d.Scan(&payload); err != nil {
			log.Fatal(err)
		}
		hctx, stop := d.Keep(ctx) // extends the lease every half lease
		err := render(hctx, payload)
		stop()
		settle := context.WithoutCancel(ctx)
		if err != nil {
			err = d.Retry(settle, time.Minute)
		} else {
			err = d.Ack(settle)
		}
		if err != nil {
			log.Print(err) // ErrLeaseLost: another claim has the job now
		}
	}
}
