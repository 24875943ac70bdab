package dbtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
)

// TestUsersCheckSchemaPools: Queue.CheckSchema (with its clock check where
// the engine's clock decides a lease) on a pool of one connection, the
// table named qualified, passes and gives its connection back; with that
// one connection held elsewhere it ends with its context instead of
// waiting for ever; with three of a pool's four held it passes on the
// fourth; under contexts cut at random moments, on a pool of one
// and a pool of four, it either passes or fails for the context, never
// reports a problem the schema does not have, and leaves no connection in
// use.
func TestUsersCheckSchemaPools(t *testing.T) {
	eachEngine(t, nil, func(t *testing.T, e Engine) {
		dsn := e.DSN(t, t.TempDir())
		one, four := e.OpenDSN(t, dsn, 1), e.OpenDSN(t, dsn, 4)
		table := newTable(t, e, one, "ucs")
		tb := Table(concQualified(t, e, one, table), "lease")
		tb.DeadTable = concQualified(t, e, one, table+"_dead")
		qs := []*inbox.Queue{newQueue(t, one, queueConfig(e, tb, nil)), newQueue(t, four, queueConfig(e, tb, nil))}
		ctx := context.Background()
		bounded := func(q *inbox.Queue, d time.Duration) error {
			c, cancel := context.WithTimeout(ctx, d)
			defer cancel()
			return q.CheckSchema(c)
		}
		if err := bounded(qs[0], time.Minute); err != nil {
			t.Fatalf("CheckSchema on a pool of one: %v", err)
		}
		usersIdle(t, one, four)

		held, err := one.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := bounded(qs[0], 200*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("CheckSchema with the pool's one connection held: %v, want its deadline", err)
		}
		held.Close()

		// Three of the four connections held by others: the check reads
		// the clock on the one left and passes.
		var others []*sql.Conn
		for i := 0; i < 3; i++ {
			c, err := four.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			others = append(others, c)
		}
		if err := bounded(qs[1], time.Minute); err != nil {
			t.Errorf("CheckSchema with three of four connections held: %v", err)
		}
		for _, c := range others {
			c.Close()
		}

		passed := usersCutChecks(t, qs)
		usersIdle(t, one, four)
		for i, q := range qs {
			if err := bounded(q, time.Minute); err != nil {
				t.Errorf("CheckSchema on pool %d after the cuts: %v", i, err)
			}
		}
		t.Logf("%d of 40 cut checks passed", passed)
	})
}

// usersCutChecks runs CheckSchema 40 times on the queues in turn, each
// under a context cut after up to 20 ms: it passes or fails for its
// context, and never reports problems. It returns how many passed.
func usersCutChecks(t *testing.T, qs []*inbox.Queue) int {
	t.Helper()
	ctx := context.Background()
	rnd := rand.New(rand.NewSource(time.Now().UnixNano()))
	passed := 0
	for i := 0; i < 40; i++ {
		q := qs[i%2]
		c, cancel := context.WithTimeout(ctx, time.Duration(rnd.Intn(20000))*time.Microsecond)
		err := q.CheckSchema(c)
		dl, _ := c.Deadline()
		cut := c.Err() != nil || !time.Now().Before(dl)
		cancel()
		var se *inbox.SchemaError
		switch {
		case err == nil:
			passed++
		case errors.As(err, &se):
			t.Errorf("cut CheckSchema reported problems: %v", err)
		case !cut:
			t.Errorf("CheckSchema failed with its context alive: %v", err)
		}
	}
	return passed
}

// usersIdle waits until no pool has a connection in use.
func usersIdle(t *testing.T, dbs ...interface{ Stats() sql.DBStats }) {
	t.Helper()
	eventually(t, 10*time.Second, "the pools' connections back", func() error {
		for i, db := range dbs {
			if n := db.Stats().InUse; n != 0 {
				return fmt.Errorf("pool %d: %d connections in use", i, n)
			}
		}
		return nil
	})
}
