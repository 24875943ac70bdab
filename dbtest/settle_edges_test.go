package dbtest

// The edges of a settlement (issue 21, items 3 to 6): a settlement in the
// caller's transaction that rolls back or whose COMMIT fails, a settlement
// whose context ends mid-statement, a claim that fails while reading its
// rows, an error text the database refuses.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"math/rand"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/fakeclock"
)

// The package's API for these edges, in one place.
var edgeOutcomeUnknown = inbox.ErrOutcomeUnknown

func edgeCommitted(d *inbox.Delivery, tx *sql.Tx) error { return d.Committed(tx) }

func leaseAndAdvisory(Engine) []string { return []string{"lease", "advisory"} }

// edgeRow is a job's row as the test reads it: whether it is there, its
// attempt, its lease (lease form) or not-before time (advisory), and
// whether the dead table holds it.
type edgeRow struct {
	found   bool
	attempt int
	at      time.Time
	dead    bool
}

func edgeRead(t testing.TB, e Engine, db *sql.DB, table, form string, id any) edgeRow {
	t.Helper()
	col := "locked_until"
	if form != "lease" {
		col = "not_before"
	}
	var r edgeRow
	var raw any
	err := db.QueryRow(bind(e, "SELECT attempt, "+col+" FROM "+table+" WHERE id = ?"), id).Scan(&r.attempt, &raw)
	switch {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		t.Fatalf("reading job %v: %v", id, err)
	default:
		r.found = true
		if raw != nil {
			tm, err := e.Dialect.ScanTime(raw)
			if err != nil {
				t.Fatal(err)
			}
			r.at = tm.UTC().Truncate(time.Microsecond)
		}
	}
	var n int
	if err := db.QueryRow(bind(e, "SELECT COUNT(*) FROM "+table+"_dead WHERE id = ?"), id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	r.dead = n > 0
	return r
}

// TestSettleTxUnconfirmed (issue 21, item 4): a settlement in the caller's
// transaction is not one until the transaction is known to have committed.
// Lease and advisory, every engine and driver, every …Tx settlement: the
// transaction rolls back, or its COMMIT fails (its context ended), and the
// delivery is still held: another pool cannot claim the job, the keeper
// still cancels the handler at the lease's deadline (lease), and the
// delivery can be acknowledged again. Committed after a commit finishes it,
// and a settlement after an unconfirmed commit learns it (ErrSettled).
func TestSettleTxUnconfirmed(t *testing.T) {
	eachForm(t, leaseAndAdvisory, func(t *testing.T, e Engine, form string) {
		db1, db2 := openTwo(t, e, 6)
		table := concTable(t, e, db1, "txunconf_"+form)
		clock := fakeclock.New(clockStart)
		q := newQueue(t, db1, queueConfig(e, Table(table, form), clock))
		other := newQueue(t, db2, queueConfig(e, Table(concQualified(t, e, db1, table), form), clock))
		lease := form == "lease"
		ctx := context.Background()
		ops := map[string]func(d *inbox.Delivery, tx *sql.Tx) error{
			"AckTx":     func(d *inbox.Delivery, tx *sql.Tx) error { return d.AckTx(ctx, tx) },
			"RetryTx":   func(d *inbox.Delivery, tx *sql.Tx) error { return d.RetryTx(ctx, tx, time.Hour) },
			"ReleaseTx": func(d *inbox.Delivery, tx *sql.Tx) error { return d.ReleaseTx(ctx, tx) },
			"DeadTx":    func(d *inbox.Delivery, tx *sql.Tx) error { return d.DeadTx(ctx, tx) },
		}
		for _, name := range []string{"AckTx", "RetryTx", "ReleaseTx", "DeadTx"} {
			op := ops[name]
			for _, end := range []string{"rollback", "commit-fails", "commit-confirmed", "commit-learned", "commit-swept"} {
				if end == "commit-swept" && (lease || name == "RetryTx") {
					// Only an advisory delivery holds a connection until it
					// learns; an advisory Retry leaves the row looking the
					// same committed or not.
					continue
				}
				t.Run(name+"/"+end, func(t *testing.T) {
					emptyTables(t, db1, table)
					id := enqueueOne(t, q, db1, name)
					d := claimOne(t, q)
					claimed := clock.Now()
					kctx, stop := d.Keep(ctx)
					defer stop()
					txCtx, cancelTx := context.WithCancel(ctx)
					defer cancelTx()
					tx, err := db1.BeginTx(txCtx, nil)
					if err != nil {
						t.Fatal(err)
					}
					defer tx.Rollback()
					if err := op(d, tx); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					switch end {
					case "rollback":
						err = tx.Rollback()
					case "commit-fails":
						// The transaction's context ends: database/sql rolls
						// it back and the COMMIT fails.
						cancelTx()
						if err = tx.Commit(); err == nil {
							t.Fatal("COMMIT after the transaction's context ended succeeded")
						}
						err = nil
					default:
						err = tx.Commit()
					}
					if err != nil {
						t.Fatal(err)
					}
					switch end {
					case "commit-confirmed":
						if err := edgeCommitted(d, tx); err != nil {
							t.Fatalf("Committed: %v", err)
						}
						if err := d.Ack(ctx); !errors.Is(err, inbox.ErrSettled) {
							t.Fatalf("Ack after Committed: %v, want ErrSettled", err)
						}
						stop()
						if kctx.Err() != nil && errors.Is(context.Cause(kctx), inbox.ErrLeaseLost) {
							t.Fatalf("the keeper cancelled the handler of a settled delivery: %v", context.Cause(kctx))
						}
						idleSoon(t, db1, q)
						return
					case "commit-swept":
						// Nobody confirmed and the delivery is not touched
						// again: the queue's next claim finds it committed
						// and lets its lock and connection go.
						ds, err := q.Claim(ctx, 5)
						if err != nil {
							t.Fatal(err)
						}
						for _, x := range ds {
							if err := x.Ack(ctx); err != nil {
								t.Fatal(err)
							}
						}
						idleSoon(t, db1, q)
						if !e.IsSQLite() {
							noLocks(t, e, db1, table, []string{concKey(id)})
						}
						if err := d.Ack(ctx); !errors.Is(err, inbox.ErrSettled) {
							t.Fatalf("Ack after the claim found %s committed: %v, want ErrSettled", name, err)
						}
						return
					case "commit-learned":
						// Nobody confirmed: the next settlement reads the row.
						// An advisory Retry leaves the token (id, attempt) in
						// place: a later settlement then takes effect.
						err := d.Ack(ctx)
						if !lease && name == "RetryTx" {
							if err != nil {
								t.Fatalf("Ack after an advisory RetryTx committed: %v, want it to take effect", err)
							}
						} else if !errors.Is(err, inbox.ErrSettled) {
							t.Fatalf("Ack after %s committed: %v, want ErrSettled", name, err)
						}
						idleSoon(t, db1, q)
						return
					}
					// Not settled: the job is still this delivery's.
					if r := edgeRead(t, e, db1, table, form, id); !r.found || r.attempt != 2 || r.dead {
						t.Fatalf("after %s and %s the row is %+v, want it held at attempt 2", name, end, r)
					}
					claimNone(t, other, "a job whose "+name+" did not commit")
					if kctx.Err() != nil {
						t.Fatalf("the handler's context ended: %v", context.Cause(kctx))
					}
					if lease {
						// The keeper's deadline is still armed: the handler is
						// stopped by the expiry less the margin.
						clock.Advance(time.Minute - time.Minute/10 - time.Second)
						if kctx.Err() != nil {
							t.Fatalf("the handler was stopped %v after the claim, before the deadline", clock.Now().Sub(claimed))
						}
						clock.Advance(time.Second)
						select {
						case <-kctx.Done():
						case <-time.After(time.Minute):
							t.Fatal("the keeper did not cancel the handler at the deadline")
						}
						if cause := context.Cause(kctx); !errors.Is(cause, inbox.ErrLeaseLost) {
							t.Fatalf("cause %v, want ErrLeaseLost", cause)
						}
					}
					// And it can be settled again. (A failed COMMIT's
					// rollback runs in database/sql's own goroutine: the
					// pool gets its connection back soon after.)
					if err := d.Ack(ctx); err != nil {
						t.Fatalf("Ack after %s and %s: %v, want it to take effect", name, end, err)
					}
					if r := edgeRead(t, e, db1, table, form, id); r.found || r.dead {
						t.Fatalf("after the Ack the row is %+v, want it gone", r)
					}
					stop()
					idleSoon(t, db1, q)
					if !lease && !e.IsSQLite() {
						noLocks(t, e, db1, table, []string{concKey(id)})
					}
				})
			}
		}
	})
}

// TestSettleTxCommitCancelled (issue 21, item 4): a COMMIT whose
// transaction's context ends at a random point 0–2 ms after it was sent,
// for AckTx, lease and advisory, every engine and driver, 8 workers on two
// pools and both spellings of the table. Whatever COMMIT returns, the
// delivery must agree with the database: acknowledged again it takes
// effect (the job was still held) or answers ErrSettled (the commit took
// effect), never anything else.
func TestSettleTxCommitCancelled(t *testing.T) {
	eachForm(t, leaseAndAdvisory, func(t *testing.T, e Engine, form string) {
		db1, db2 := openTwo(t, e, 12)
		table := concTable(t, e, db1, "txcancel_"+form)
		qs := []*inbox.Queue{
			newQueue(t, db1, queueConfig(e, Table(table, form), nil)),
			newQueue(t, db2, queueConfig(e, Table(concQualified(t, e, db1, table), form), nil)),
		}
		dbs := []*sql.DB{db1, db2}
		const workers, rounds = 8, 12
		var counts [3]atomic.Int64 // commit failed and acked again, committed, committed but Ack answered ErrSettled
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				q, db := qs[w%2], dbs[w%2]
				rnd := rand.New(rand.NewSource(int64(w)))
				for range rounds {
					if t.Failed() {
						return
					}
					if _, err := q.Enqueue(context.Background(), db, inbox.Job{Data: []any{[]byte("c")}}); err != nil {
						t.Error(err)
						return
					}
					ds, err := q.Claim(context.Background(), 1)
					if err != nil {
						t.Error(err)
						return
					}
					if len(ds) == 0 {
						continue
					}
					d := ds[0]
					txCtx, cancel := context.WithCancel(context.Background())
					tx, err := db.BeginTx(txCtx, nil)
					if err != nil {
						cancel()
						t.Error(err)
						return
					}
					if err := d.AckTx(context.Background(), tx); err != nil {
						cancel()
						t.Errorf("AckTx: %v", err)
						return
					}
					timer := time.AfterFunc(time.Duration(rnd.Int63n(int64(2*time.Millisecond))), cancel)
					cerr := tx.Commit()
					timer.Stop()
					cancel()
					aerr := d.Ack(context.Background())
					switch {
					case cerr != nil && aerr == nil:
						counts[0].Add(1)
					case cerr == nil && errors.Is(aerr, inbox.ErrSettled):
						counts[1].Add(1)
					case cerr != nil && errors.Is(aerr, inbox.ErrSettled):
						// The COMMIT reached the server though it reported an error.
						counts[2].Add(1)
					default:
						t.Errorf("COMMIT: %v; Ack after it: %v", cerr, aerr)
						return
					}
					if r := edgeRead(t, e, db, table, form, d.ID()); r.found {
						t.Errorf("job %v still there after COMMIT %v and Ack %v: %+v", d.ID(), cerr, aerr, r)
						return
					}
				}
			}()
		}
		wg.Wait()
		t.Logf("commit failed, acked again: %d; committed: %d; commit reported failure but took effect: %d",
			counts[0].Load(), counts[1].Load(), counts[2].Load())
		idleSoon(t, db1, qs[0])
		idleSoon(t, db2, qs[1])
	})
}

// TestSettleOutcomeReadBack (issue 21, item 5): Ack, Retry(1h) and Dead with
// a context that ends at a random point 0–2 ms into the call, lease and
// advisory, every engine and driver, 8 workers on two pools and both
// spellings. Every reported result must match the database: nil when the
// settlement took effect, an error when it did not (a lease delivery can
// then be acknowledged), and ErrOutcomeUnknown only when the read failed too.
func TestSettleOutcomeReadBack(t *testing.T) {
	eachForm(t, leaseAndAdvisory, func(t *testing.T, e Engine, form string) {
		db1, db2 := openTwo(t, e, 12)
		lease := form == "lease"
		const workers, rounds = 8, 30
		// A table per worker, so that what a worker reads of its job is its
		// own doing: a failed advisory settlement gives the job back.
		tables := make([]string, workers)
		qs := make([]*inbox.Queue, workers)
		dbs := make([]*sql.DB, workers)
		for w := range workers {
			tables[w] = concTable(t, e, db1, fmt.Sprintf("outcome_%s_%d", form, w))
			dbs[w] = []*sql.DB{db1, db2}[w%2]
			name := tables[w]
			if w%4 >= 2 {
				name = concQualified(t, e, db1, tables[w])
			}
			qs[w] = newQueue(t, dbs[w], queueConfig(e, Table(name, form), nil))
		}
		var mismatches, unknown, cancelled, done atomic.Int64
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				q, db, table := qs[w], dbs[w], tables[w]
				rnd := rand.New(rand.NewSource(int64(w) + 1))
				bg := context.Background()
				for i := range rounds {
					if t.Failed() {
						return
					}
					id, err := q.Enqueue(bg, db, inbox.Job{Data: []any{[]byte("o")}})
					if err != nil {
						t.Error(err)
						return
					}
					ds, err := q.Claim(bg, 1)
					if err != nil || len(ds) != 1 {
						t.Errorf("claim: %d jobs, %v", len(ds), err)
						return
					}
					d := ds[0]
					before := edgeRead(t, e, db, table, form, id)
					op := []string{"Ack", "Retry", "Dead"}[i%3]
					ctx, cancel := context.WithCancel(bg)
					timer := time.AfterFunc(time.Duration(rnd.Int63n(int64(2*time.Millisecond))), cancel)
					switch op {
					case "Ack":
						err = d.Ack(ctx)
					case "Retry":
						err = d.Retry(ctx, time.Hour)
					case "Dead":
						err = d.Dead(ctx)
					}
					timer.Stop()
					cancel()
					after := edgeRead(t, e, db, table, form, id)
					var took bool
					switch op {
					case "Ack":
						took = !after.found && !after.dead
					case "Dead":
						took = !after.found && after.dead
					case "Retry":
						// An hour on: a failed settlement's read-back may
						// extend a lease by its minute.
						took = after.found && after.at.After(before.at.Add(30*time.Minute))
					}
					switch {
					case err == nil:
						done.Add(1)
						if !took {
							mismatches.Add(1)
							t.Errorf("%s of job %v returned nil, but the row is %+v (was %+v)", op, id, after, before)
						}
					case errors.Is(err, edgeOutcomeUnknown):
						unknown.Add(1)
					default:
						cancelled.Add(1)
						if took {
							mismatches.Add(1)
							t.Errorf("%s of job %v returned %v, but it took effect: the row is %+v (was %+v)", op, id, err, after, before)
						}
					}
					// Clean up: a lease delivery not settled is acknowledged
					// (and must be able to be); the rest is deleted.
					if lease && err != nil && !took {
						aerr := d.Ack(bg)
						if aerr != nil && !(errors.Is(err, edgeOutcomeUnknown) && errors.Is(aerr, inbox.ErrSettled)) {
							t.Errorf("Ack after %s failed with %v: %v, want it to take effect", op, err, aerr)
						}
					}
					if _, err := db.Exec(bind(e, "DELETE FROM "+table+" WHERE id = ?"), id); err != nil {
						t.Error(err)
					}
				}
			}()
		}
		wg.Wait()
		t.Logf("%d settled, %d reported failed, %d unknown, %d mismatches", done.Load(), cancelled.Load(), unknown.Load(), mismatches.Load())
		for w := range workers {
			idleSoon(t, dbs[w], qs[w])
		}
	})
}

// edgeTable creates table with a priority column and a last_error column
// of width (0: the engine's unbounded text) in it and its dead table.
func edgeTable(t *testing.T, e Engine, db *sql.DB, what string, width int) string {
	t.Helper()
	table := concTable(t, e, db, what)
	text := "text"
	if width > 0 {
		text = fmt.Sprintf("varchar(%d)", width)
	}
	for _, s := range []string{
		"ALTER TABLE " + table + " ADD COLUMN priority integer NULL",
		"ALTER TABLE " + table + " ADD COLUMN last_error " + text + " NULL",
		"ALTER TABLE " + table + "_dead ADD COLUMN last_error " + text + " NULL",
	} {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	return table
}

// TestClaimReadFailsGivesBack (issue 21, item 6): a claim that fails while
// reading its rows (a NULL priority on PostgreSQL and MySQL, text in the
// integer column on SQLite) claims nothing: lease and advisory, every
// engine and driver, the rows are claimable at once afterwards, at the
// attempt they had. The advisory claim's re-read is reached by a row whose
// priority goes NULL between the candidate read and the lock.
func TestClaimReadFailsGivesBack(t *testing.T) {
	eachForm(t, leaseAndAdvisory, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, 6)
		table := edgeTable(t, e, db, "readfail_"+form, 0)
		tb := Table(table, form)
		tb.Priority = "priority"
		cfg := queueConfig(e, tb, nil)
		bad := "NULL"
		if e.IsSQLite() {
			bad = "'high'"
		}
		spoil := func() {
			mustExec(t, e, db, "UPDATE "+table+" SET priority = "+bad+" WHERE id = (SELECT MIN(id) FROM (SELECT id FROM "+table+") AS m)")
		}
		hooked := false
		if !lease(form) && !e.IsSQLite() {
			// The candidate read sees a readable priority; the row the
			// claim re-reads under the lock has none.
			l, _ := e.Dialect.(dialect.Locker)
			cfg.Dialect = &hookDialect{Dialect: e.Dialect, locker: l, before: spoil}
			hooked = true
		}
		q := newQueue(t, db, cfg)
		plain := newQueue(t, db, queueConfig(e, Table(table, form), nil))
		ctx := context.Background()
		var ids []any
		for p := range 3 {
			id, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte("r")}, Priority: 1 + p%2})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		if !hooked {
			spoil()
		}
		ds, err := q.Claim(ctx, 3)
		if err == nil {
			for _, d := range ds {
				_ = d.Release(ctx)
			}
			t.Fatalf("a claim reading an unreadable priority succeeded with %d jobs", len(ds))
		}
		t.Logf("claim: %v", err)
		if len(ds) != 0 {
			t.Fatalf("a failed claim returned %d jobs", len(ds))
		}
		for _, id := range ids {
			if r := edgeRead(t, e, db, table, form, id); !r.found || r.attempt != 1 || (lease(form) && !r.at.IsZero()) {
				t.Errorf("after the failed claim job %v is %+v, want it at attempt 1, not leased", id, r)
			}
		}
		// Claimable at once, at the attempt they had.
		got, err := plain.Claim(ctx, 3)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 3 {
			t.Errorf("after the failed claim %d of 3 jobs are claimable at once", len(got))
		}
		for _, d := range got {
			if d.Attempt() != 1 {
				t.Errorf("job %v delivered at attempt %d, want 1", d.ID(), d.Attempt())
			}
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
		mustBeIdle(t, db, q, plain)
	})
}

func lease(form string) bool { return form == "lease" }

// TestSettleErrorTextRefused (issue 21, item 3, the lease and advisory
// settlements): a Retry or Dead whose error text the database refuses is
// sent again without it. A last_error varchar(100) with a 5,000-byte error on
// PostgreSQL and MariaDB (strict mode), and errors with NUL bytes and
// invalid UTF-8 on every engine, which land sanitized.
func TestSettleErrorTextRefused(t *testing.T) {
	eachForm(t, leaseAndAdvisory, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, 6)
		ctx := context.Background()
		type textCase struct {
			name  string
			width int
			err   string
			want  func(stored string) bool
		}
		long := strings.Repeat("x", 5000)
		cases := []textCase{
			{"nul", 0, "bad\x00byte", func(s string) bool { return s == "bad\uFFFDbyte" }},
			{"invalid-utf8", 0, "raw \xff\xfe input", func(s string) bool { return s == "raw \uFFFD\uFFFD input" }},
			{"5000-bytes", 0, long, func(s string) bool { return len(s) == inbox.MaxErrorText && strings.Trim(s, "x") == "" }},
		}
		if !e.IsSQLite() {
			// The narrow column refuses the text (SQLite keeps any length).
			cases = append(cases, textCase{"varchar100-5000-bytes", 100, long, func(s string) bool { return s == "" }})
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				table := edgeTable(t, e, db, "errtext_"+form+"_"+strings.ReplaceAll(c.name, "-", "_"), c.width)
				if e.IsMySQL() && c.width > 0 {
					var mode string
					if err := db.QueryRow("SELECT @@SESSION.sql_mode").Scan(&mode); err != nil {
						t.Fatal(err)
					}
					if !strings.Contains(mode, "STRICT") {
						t.Fatalf("the server's sql_mode %q is not strict: the test needs a refused text", mode)
					}
				}
				tb := Table(table, form)
				tb.LastError = "last_error"
				q := newQueue(t, db, queueConfig(e, tb, nil))
				stored := func(tab string, id any) string {
					var s sql.NullString
					if err := db.QueryRow(bind(e, "SELECT last_error FROM "+tab+" WHERE id = ?"), id).Scan(&s); err != nil {
						t.Fatalf("last_error of %v in %s: %v", id, tab, err)
					}
					return s.String
				}
				// Retry carries the text into the row.
				id := enqueueOne(t, q, db, "t")
				d := claimOne(t, q)
				d.SetError(errors.New(c.err))
				if err := d.Retry(ctx, time.Hour); err != nil {
					t.Fatalf("Retry with the error %q: %v", c.name, err)
				}
				if r := edgeRead(t, e, db, table, form, id); !r.found || r.attempt != 2 || r.at.IsZero() {
					t.Fatalf("after Retry the row is %+v, want attempt 2 delayed", r)
				}
				if s := stored(table, id); !c.want(s) {
					t.Errorf("Retry stored last_error %q (%d bytes)", concFirst([]string{s}, 1), len(s))
				}
				// Dead carries it into the dead table.
				mustExec(t, e, db, "UPDATE "+table+" SET locked_until = NULL, not_before = NULL WHERE id = ?", id)
				d = claimOne(t, q)
				d.SetError(errors.New(c.err))
				if err := d.Dead(ctx); err != nil {
					t.Fatalf("Dead with the error %q: %v", c.name, err)
				}
				if r := edgeRead(t, e, db, table, form, id); r.found || !r.dead {
					t.Fatalf("after Dead the row is %+v, want it in the dead table", r)
				}
				if s := stored(table+"_dead", id); !c.want(s) {
					t.Errorf("Dead stored last_error %q (%d bytes)", concFirst([]string{s}, 1), len(s))
				}
				mustBeIdle(t, db, q)
			})
		}
	})
}
