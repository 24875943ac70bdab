package dbtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/connhook"
)

// levelPool is a pool whose DSN sets the session's isolation level, and
// the level each transaction it began asked for.
type levelPool struct {
	db     *sql.DB
	mu     sync.Mutex
	begins []sql.IsolationLevel
}

// openAtLevel opens e's database with every session at level (a value of
// tx_isolation, MySQL 8's transaction_isolation), through a hook that
// notes each BeginTx's level.
func openAtLevel(t *testing.T, e Engine, level string, maxConns int) *levelPool {
	t.Helper()
	variable := "tx_isolation"
	var version string
	if err := e.Open(t, 1).QueryRow("SELECT VERSION()").Scan(&version); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.ToLower(version), "mariadb") {
		variable = "transaction_isolation"
	}
	inner, err := connhook.Connector(e.Driver, e.DSN(t, t.TempDir())+"&"+variable+"=%27"+level+"%27")
	if err != nil {
		t.Fatal(err)
	}
	p := &levelPool{}
	p.db = sql.OpenDB(connhook.Wrap(inner, connhook.Hooks{Before: func(_ context.Context, call connhook.Call) {
		if call.Kind == connhook.Begin {
			p.mu.Lock()
			p.begins = append(p.begins, sql.IsolationLevel(call.TxOptions.Isolation))
			p.mu.Unlock()
		}
	}}))
	p.db.SetMaxOpenConns(maxConns)
	t.Cleanup(func() { p.db.Close() })
	var got string
	if err := p.db.QueryRow("SELECT @@" + variable).Scan(&got); err != nil || got != level {
		t.Fatalf("session isolation %q (%v), want %s", got, err, level)
	}
	return p
}

// since returns the levels of the transactions begun from the n-th on.
func (p *levelPool) since(n int) []sql.IsolationLevel {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]sql.IsolationLevel(nil), p.begins[n:]...)
}

func (p *levelPool) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.begins)
}

// heldReadsCommitted reports whether d's held transaction (row lock) runs
// at READ COMMITTED: a row another session commits after the transaction's
// first read of a side table shows in its second read, which a snapshot
// (REPEATABLE READ) would keep out.
func heldReadsCommitted(t *testing.T, e Engine, other *sql.DB, d *inbox.Delivery, side string) bool {
	t.Helper()
	ctx := context.Background()
	var before, after int
	if err := d.Tx().QueryRowContext(ctx, "SELECT COUNT(*) FROM "+side).Scan(&before); err != nil {
		t.Fatal(err)
	}
	if _, err := other.ExecContext(ctx, "INSERT INTO "+side+" () VALUES ()"); err != nil {
		t.Fatal(err)
	}
	if err := d.Tx().QueryRowContext(ctx, "SELECT COUNT(*) FROM "+side).Scan(&after); err != nil {
		t.Fatal(err)
	}
	return after == before+1
}

// TestClaimSessionLevel: inbox.MariaDB's lease and row-lock claims begin at
// the session's own level where the session runs at READ COMMITTED (no SET
// TRANSACTION), and set the level where it does not: the first claim that
// reads a row at REPEATABLE READ is rolled back and made again, and every
// claim of that queue after it sets the level. Eight workers over a pool at
// each level (the table named plainly on one, schema-qualified on the
// other) acknowledge every job once. Under the row lock the held
// transaction reads committed rows on both pools. inbox.MySQL sets the
// level always.
func TestClaimSessionLevel(t *testing.T) {
	eachEngine(t, func(e Engine) bool { return e.IsMySQL() }, func(t *testing.T, e Engine) {
		for _, form := range []string{"lease", "rowlock"} {
			t.Run(form, func(t *testing.T) {
				ctx := context.Background()
				rc := openAtLevel(t, e, "READ-COMMITTED", 8)
				rr := openAtLevel(t, e, "REPEATABLE-READ", 8)
				table := "level_" + form
				e.CreateTable(t, rc.db, table)
				side := table + "_side"
				for _, s := range []string{"DROP TABLE IF EXISTS " + side, "CREATE TABLE " + side + " (id bigint AUTO_INCREMENT PRIMARY KEY)"} {
					if _, err := rc.db.ExecContext(ctx, s); err != nil {
						t.Fatal(err)
					}
				}
				qrc := newQueue(t, rc.db, queueConfig(e, Table(table, form), nil))
				qrr := newQueue(t, rr.db, queueConfig(e, Table(concQualified(t, e, rr.db, table), form), nil))
				sessionLevel := e.Dialect == inbox.MariaDB
				// inbox.MariaDB's lease claims one job in one statement
				// that sets its own level (Claim.WalkTake), with no
				// transaction of the client's, unless the claim's context
				// ends within a second.
				walkTakes := sessionLevel && form == "lease"

				// One job each, claimed alone: the row lock's held
				// transaction runs at READ COMMITTED either way.
				for _, c := range []struct {
					name string
					q    *inbox.Queue
					p    *levelPool
				}{{"READ COMMITTED", qrc, rc}, {"REPEATABLE READ", qrr, rr}} {
					if _, err := c.q.Enqueue(ctx, c.p.db, inbox.Job{Data: []any{[]byte("one")}}); err != nil {
						t.Fatal(err)
					}
					n := c.p.count()
					ds, err := claimFromClient(ctx, c.q, walkTakes)
					if err != nil || len(ds) != 1 {
						t.Fatalf("%s session: Claim = %d, %v", c.name, len(ds), err)
					}
					if form == "rowlock" && !heldReadsCommitted(t, e, rc.db, ds[0], side) {
						t.Errorf("%s session: the held transaction reads a snapshot: it runs at REPEATABLE READ", c.name)
					}
					if err := ds[0].Ack(ctx); err != nil {
						t.Fatal(err)
					}
					got := fmt.Sprint(c.p.since(n))
					want := fmt.Sprint([]sql.IsolationLevel{sql.LevelReadCommitted})
					switch {
					case sessionLevel && c.p == rc:
						want = fmt.Sprint([]sql.IsolationLevel{sql.LevelDefault})
					case sessionLevel:
						// Begun at the session's level, read at REPEATABLE
						// READ, rolled back, claimed again.
						want = fmt.Sprint([]sql.IsolationLevel{sql.LevelDefault, sql.LevelReadCommitted})
					}
					if got != want {
						t.Errorf("%s session: the claim began transactions at %s, want %s", c.name, got, want)
					}
				}

				// Claims cut at random points (mid-statement, mid-COMMIT)
				// on both pools: none delivers a job twice or loses one. A
				// lease claim cut after its mark committed leaves its job
				// leased for a second, then claimed again.
				cutCfg := func(name string) inbox.Config {
					cfg := queueConfig(e, Table(name, form), nil)
					if form == "lease" {
						cfg.Lease = time.Second
					}
					return cfg
				}
				crc, crr := newQueue(t, rc.db, cutCfg(table)), newQueue(t, rr.db, cutCfg(concQualified(t, e, rr.db, table)))
				const cutJobs = 60
				for i := 0; i < cutJobs; i++ {
					if _, err := crc.Enqueue(ctx, rc.db, inbox.Job{Data: []any{[]byte(fmt.Sprint("cut", i))}}); err != nil {
						t.Fatal(err)
					}
				}
				var cutMu sync.Mutex
				cutAcked := map[int64]int{}
				deadline := time.Now().Add(60 * time.Second)
				for _, err := range onTwoPools(8, crc, crr, func(q *inbox.Queue) error {
					for time.Now().Before(deadline) {
						cctx, cancel := context.WithTimeout(ctx, time.Duration(rand.IntN(3000))*time.Microsecond)
						ds, err := q.Claim(cctx, 1)
						cancel()
						if err != nil && cctx.Err() == nil {
							return err
						}
						for _, d := range ds {
							if err := d.Ack(ctx); err != nil {
								return fmt.Errorf("ack %v: %w", d.ID(), err)
							}
							cutMu.Lock()
							cutAcked[d.ID().(int64)]++
							cutMu.Unlock()
						}
						if countRows(t, rc.db, table) == 0 {
							return nil
						}
					}
					return fmt.Errorf("%d jobs left after 60 s of cut claims", countRows(t, rc.db, table))
				}) {
					t.Error(err)
				}
				for id, n := range cutAcked {
					if n != 1 {
						t.Errorf("job %d acknowledged %d times under cut claims", id, n)
					}
				}
				if len(cutAcked) != cutJobs {
					t.Errorf("%d jobs acknowledged under cut claims, want %d", len(cutAcked), cutJobs)
				}

				// The drain: 8 workers, the two pools.
				const jobs = 120
				for i := 0; i < jobs; i++ {
					if _, err := qrc.Enqueue(ctx, rc.db, inbox.Job{Data: []any{[]byte(fmt.Sprint(i))}}); err != nil {
						t.Fatal(err)
					}
				}
				nrc, nrr := rc.count(), rr.count()
				var mu sync.Mutex
				acked := map[int64]int{}
				for _, err := range onTwoPools(8, qrc, qrr, func(q *inbox.Queue) error {
					for {
						ds, err := q.Claim(ctx, 1)
						if err != nil || len(ds) == 0 {
							return err
						}
						if err := ds[0].Ack(ctx); err != nil {
							return err
						}
						mu.Lock()
						acked[ds[0].ID().(int64)]++
						mu.Unlock()
					}
				}) {
					t.Error(err)
				}
				for id, n := range acked {
					if n != 1 {
						t.Errorf("job %d acknowledged %d times", id, n)
					}
				}
				if len(acked) != jobs || countRows(t, rc.db, table) != 0 {
					t.Errorf("%d jobs acknowledged, want %d; %d rows left", len(acked), jobs, countRows(t, rc.db, table))
				}
				for _, c := range []struct {
					name string
					p    *levelPool
					n    int
					want sql.IsolationLevel
				}{{"READ COMMITTED", rc, nrc, sql.LevelReadCommitted}, {"REPEATABLE READ", rr, nrr, sql.LevelReadCommitted}} {
					if sessionLevel && c.p == rc {
						c.want = sql.LevelDefault
					}
					begins := c.p.since(c.n)
					if len(begins) == 0 && !walkTakes {
						t.Errorf("%s session: no claim transaction during the drain", c.name)
					}
					for _, l := range begins {
						if l != c.want {
							t.Errorf("%s session: a claim began at %v during the drain, want %v: %v", c.name, l, c.want, begins)
							break
						}
					}
				}
			})
		}
	})
}

// claimFromClient claims one job; nearDeadline, with a context that ends
// within a second, which makes inbox.MariaDB's lease claim in a
// transaction of the client's (not Claim.WalkTake). A claim that ran out
// of that time is made again.
func claimFromClient(ctx context.Context, q *inbox.Queue, nearDeadline bool) ([]*inbox.Delivery, error) {
	if !nearDeadline {
		return q.Claim(ctx, 1)
	}
	for {
		soon, cancel := context.WithTimeout(ctx, 900*time.Millisecond)
		ds, err := q.Claim(soon, 1)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			return ds, err
		}
	}
}
