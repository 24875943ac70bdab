package main

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/optin"
)

// TestListen runs the worker process and, in the same test, the enqueuing
// one, each with a pool of its own. The jobs are enqueued in a transaction,
// so no in-process wake-up reaches the loops, and their fallback poll is a
// minute: the three are handled within the deadline because the listener
// relayed the notification. The worker then returns nil when its context
// ends.
func TestListen(t *testing.T) {
	dsn := optin.DSN(t, "INBOX_POSTGRES_DSN", "the listen example")
	dropTables(t, dsn)
	t.Cleanup(func() { dropTables(t, dsn) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	handled := make(chan any, 8)
	served := make(chan error, 1)
	go func() {
		served <- run(ctx, dsn, 0, func(_ context.Context, d *inbox.Delivery) error {
			handled <- d.ID()
			return nil
		})
	}()
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	// Once the listener listens, the loops' first claims, which start with
	// it, have found the queue empty: the jobs enqueued now reach them
	// through the listener only.
	waitListening(t, dsn, served)
	if err := run(ctx, dsn, 3, nil); err != nil {
		t.Fatal(err)
	}
	seen := map[any]bool{}
	for len(seen) < 3 {
		select {
		case id := <-handled:
			if seen[id] {
				t.Fatalf("job %v handled twice", id)
			}
			seen[id] = true
		case err := <-served:
			t.Fatalf("the worker returned early: %v", err)
		case <-timeout.C:
			t.Fatalf("handled %d of 3 jobs in 30 s, with a fallback poll of a minute", len(seen))
		}
	}
	cancel()
	if err := <-served; err != nil {
		t.Errorf("the worker returned %v when its context ended", err)
	}
}

// waitListening polls the server, with a deadline, until a session
// listens on the example's channel.
func waitListening(t *testing.T, dsn string, served <-chan error) {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	end := time.Now().Add(30 * time.Second)
	for {
		var n int
		err := db.QueryRow(`SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND state = 'idle' AND query LIKE 'LISTEN %listen_jobs_ready%'`).Scan(&n)
		switch {
		case err != nil:
			t.Fatal(err)
		case n > 0:
			return
		case time.Now().After(end):
			t.Fatal("no session listens on listen_jobs_ready after 30 s")
		}
		select {
		case err := <-served:
			t.Fatalf("the worker returned early: %v", err)
		case <-time.After(10 * time.Millisecond): // polling the server, with a deadline
		}
	}
}

func dropTables(t *testing.T, dsn string) {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, s := range []string{"DROP TABLE IF EXISTS listen_jobs", "DROP TABLE IF EXISTS listen_jobs_dead"} {
		if _, err := db.Exec(s); err != nil {
			t.Fatal(err)
		}
	}
}
