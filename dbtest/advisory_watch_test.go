package dbtest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
)

// TestAdvisorySessionLost: the keeper of an advisory delivery (Keep, and so
// worker.Run) pings the session holding its lock, and cancels the handler
// with ErrLeaseLost once that session is gone — killed here from another
// session, as a failover or a restarted server would end it — so the
// handler stops rather than run on beside the next claim of its job. A
// delivery whose session answers keeps its handler and settles.
func TestAdvisorySessionLost(t *testing.T) {
	eachForm(t, func(e Engine) []string {
		if e.IsSQLite() {
			return nil // no session holds SQLite's keys: they live in the process
		}
		return advisoryID(e)
	}, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, 6)
		table := newTable(t, e, db, "session_lost")
		q := newQueue(t, db, queueConfig(e, Table(table, form), nil))
		ctx := context.Background()
		lost := fmt.Sprint(enqueueOne(t, q, db, "lost"))
		kept := fmt.Sprint(enqueueOne(t, q, db, "kept"))
		ds, err := q.Claim(ctx, 2)
		if err != nil || len(ds) != 2 {
			t.Fatalf("claimed %d, %v; want 2", len(ds), err)
		}
		byKey := map[string]*inbox.Delivery{fmt.Sprint(ds[0].ID()): ds[0], fmt.Sprint(ds[1].ID()): ds[1]}
		lostCtx, stopLost := byKey[lost].Keep(ctx)
		defer stopLost()
		keptCtx, stopKept := byKey[kept].Keep(ctx)
		defer stopKept()

		holders := lockHolders(t, e, db, table, []string{lost})
		if len(holders) != 1 {
			t.Fatalf("%d sessions hold job %s's lock, want 1", len(holders), lost)
		}
		kill := "SELECT pg_terminate_backend($1)"
		if e.IsMySQL() {
			kill = "KILL ?"
		}
		if _, err := db.ExecContext(ctx, kill, holders[0]); err != nil {
			t.Fatalf("ending session %d: %v", holders[0], err)
		}
		eventually(t, 60*time.Second, "the handler of the job whose session ended is cancelled", func() error {
			if lostCtx.Err() == nil {
				return errors.New("still running")
			}
			return nil
		})
		if cause := context.Cause(lostCtx); !errors.Is(cause, inbox.ErrLeaseLost) {
			t.Fatalf("cancelled with cause %v, want ErrLeaseLost", cause)
		}
		// Its lock went with the session. Once the handler has given the
		// job up (in this process its key stays in work until then; its
		// Release meets the dead session: any outcome), another queue
		// takes it.
		stopLost()
		_ = byKey[lost].Release(ctx)
		q2 := newQueue(t, db, queueConfig(e, Table(table, form), nil))
		again := claimOne(t, q2)
		if fmt.Sprint(again.ID()) != lost {
			t.Fatalf("another queue claimed %v, want job %s", again.ID(), lost)
		}
		if err := again.Ack(ctx); err != nil {
			t.Fatal(err)
		}

		if e.IsPostgres() {
			// The kept job's session was pinged (pgx sends "-- ping",
			// lib/pq ";") and answered: its handler runs on.
			keptHolders := lockHolders(t, e, db, table, []string{kept})
			if len(keptHolders) != 1 {
				t.Fatalf("%d sessions hold job %s's lock, want 1", len(keptHolders), kept)
			}
			eventually(t, 60*time.Second, "a ping on the kept job's session", func() error {
				var query string
				if err := db.QueryRowContext(ctx, "SELECT query FROM pg_stat_activity WHERE pid = $1", keptHolders[0]).Scan(&query); err != nil {
					return err
				}
				if query != "-- ping" && query != ";" {
					return fmt.Errorf("last statement %q", query)
				}
				return nil
			})
		}
		if err := keptCtx.Err(); err != nil {
			t.Fatalf("the handler of a job whose session answers was cancelled: %v", context.Cause(keptCtx))
		}
		if err := byKey[kept].Ack(ctx); err != nil {
			t.Fatalf("Ack of the kept job: %v", err)
		}
	})
}
