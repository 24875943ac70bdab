package dbtest

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/fakeclock"
)

// TestLeaseStaleToken: once a lease ran out and another worker claimed the
// job, the first delivery's extension and every settlement, plain or inside
// the caller's transaction, return ErrLeaseLost and leave the new holder's
// row as it is.
func TestLeaseStaleToken(t *testing.T) {
	eachForm(t, leaseOnly, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, 4)
		table := newTable(t, e, db, "stale")
		clock := fakeclock.New(clockStart)
		tb := Table(table, form)
		q1 := newQueue(t, db, queueConfig(e, tb, clock))
		q2 := newQueue(t, db, queueConfig(e, tb, clock))
		ctx := context.Background()
		inTx := func(f func(tx *sql.Tx) error) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			return f(tx)
		}
		ops := []struct {
			name string
			f    func(d *inbox.Delivery) error
		}{
			{"Extend", func(d *inbox.Delivery) error { return d.Extend(ctx) }},
			{"Ack", func(d *inbox.Delivery) error { return d.Ack(ctx) }},
			{"Retry(0)", func(d *inbox.Delivery) error { return d.Retry(ctx, 0) }},
			{"Retry(1m)", func(d *inbox.Delivery) error { return d.Retry(ctx, time.Minute) }},
			{"Release", func(d *inbox.Delivery) error { return d.Release(ctx) }},
			{"Dead", func(d *inbox.Delivery) error { return d.Dead(ctx) }},
			{"AckTx", func(d *inbox.Delivery) error {
				return inTx(func(tx *sql.Tx) error { return d.AckTx(ctx, tx) })
			}},
			{"RetryTx", func(d *inbox.Delivery) error {
				return inTx(func(tx *sql.Tx) error { return d.RetryTx(ctx, tx, time.Second) })
			}},
			{"ReleaseTx", func(d *inbox.Delivery) error {
				return inTx(func(tx *sql.Tx) error { return d.ReleaseTx(ctx, tx) })
			}},
			{"DeadTx", func(d *inbox.Delivery) error {
				return inTx(func(tx *sql.Tx) error { return d.DeadTx(ctx, tx) })
			}},
		}
		for _, op := range ops {
			emptyTables(t, db, table)
			id := enqueueOne(t, q1, db, op.name)
			stale := claimOne(t, q1)
			clock.Advance(time.Minute + time.Second)
			d := claimOne(t, q2)
			if d.ID() != id || d.Attempt() != 2 {
				t.Fatalf("%s: the second claim got %v attempt %d, want %v attempt 2", op.name, d.ID(), d.Attempt(), id)
			}
			before := append(dumpRows(t, db, table), dumpRows(t, db, table+"_dead")...)
			if err := op.f(stale); !errors.Is(err, inbox.ErrLeaseLost) {
				t.Errorf("%s with a stale token: %v, want ErrLeaseLost", op.name, err)
			}
			sameRows(t, op.name+" with a stale token", before, append(dumpRows(t, db, table), dumpRows(t, db, table+"_dead")...))
			if err := d.Ack(ctx); err != nil {
				t.Fatalf("%s: the new holder's Ack: %v", op.name, err)
			}
		}
		mustBeIdle(t, db, q1, q2)
	})
}

// TestLeaseKeeper is the reference guide's first test: a job that renders for
// five minutes on a one-minute lease is kept by its keeper as the clock
// advances and delivered once.
func TestLeaseKeeper(t *testing.T) {
	eachForm(t, leaseOnly, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, 4)
		table := newTable(t, e, db, "keeper")
		clock := fakeclock.New(clockStart)
		tb := Table(table, form)
		q := newQueue(t, db, queueConfig(e, tb, clock))
		other := newQueue(t, db, queueConfig(e, tb, clock))
		ctx := context.Background()
		id := enqueueOne(t, q, db, "report")
		d := claimOne(t, q)
		kctx, stop := d.Keep(ctx)
		defer stop()
		clock.WaitAfters(t, 1)
		for step := 1; step <= 10; step++ { // ten half leases: five minutes
			clock.Advance(30 * time.Second)
			clock.WaitAfters(t, step+1) // the keeper extended and waits again
			if err := kctx.Err(); err != nil {
				t.Fatalf("after %v the handler's context ended: %v (%v)", time.Duration(step)*30*time.Second, err, context.Cause(kctx))
			}
			want := clock.Now().Add(time.Minute).Truncate(time.Microsecond)
			if got := d.Expiry(); !got.Equal(want) {
				t.Fatalf("after %v the delivery's expiry is %v, want %v", time.Duration(step)*30*time.Second, got, want)
			}
			if got := lockedUntilOf(t, e, db, table, id); !got.Equal(want) {
				t.Fatalf("after %v the stored expiry is %v, want %v", time.Duration(step)*30*time.Second, got, want)
			}
			claimNone(t, other, "a job its keeper holds")
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatalf("ack after five minutes: %v", err)
		}
		if err := kctx.Err(); err != nil {
			t.Fatalf("the handler's context ended before stop: %v", err)
		}
		stop()
		if cause := context.Cause(kctx); !errors.Is(cause, context.Canceled) || errors.Is(cause, inbox.ErrLeaseLost) {
			t.Fatalf("cause after stop: %v, want context.Canceled", cause)
		}
		if n := countRows(t, db, table); n != 0 {
			t.Fatalf("%d rows after Ack", n)
		}
		mustBeIdle(t, db, q, other)
	})
}

// TestLeaseKeeperLost: a keeper whose extension finds the lease gone cancels
// the handler's context with cause ErrLeaseLost; one whose extensions keep
// failing does so before the last expiry it knows of, less the margin.
func TestLeaseKeeperLost(t *testing.T) {
	eachForm(t, leaseOnly, func(t *testing.T, e Engine, form string) {
		dsn := e.DSN(t, t.TempDir())
		db := e.OpenDSN(t, dsn, 4)
		table := newTable(t, e, db, "keeplost")
		clock := fakeclock.New(clockStart)
		tb := Table(table, form)
		q := newQueue(t, db, queueConfig(e, tb, clock))
		ctx := context.Background()
		cancelled := func(t *testing.T, kctx context.Context, what string) {
			t.Helper()
			if kctx.Err() == nil {
				t.Fatalf("%s: the handler's context was not cancelled", what)
			}
			if cause := context.Cause(kctx); !errors.Is(cause, inbox.ErrLeaseLost) {
				t.Fatalf("%s: cause %v, want ErrLeaseLost", what, cause)
			}
		}

		t.Run("taken", func(t *testing.T) {
			emptyTables(t, db, table)
			id := enqueueOne(t, q, db, "taken")
			d := claimOne(t, q)
			n := clock.Afters()
			kctx, stop := d.Keep(ctx)
			defer stop()
			clock.WaitAfters(t, n+1)
			// Another claim counted an attempt meanwhile: the token is gone.
			mustExec(t, e, db, "UPDATE "+table+" SET attempt = attempt + 1 WHERE id = ?", id)
			clock.Advance(30 * time.Second)
			// Either the keeper cancels, or it extended and waits again.
			clock.WaitAftersOr(t, n+2, kctx.Done())
			cancelled(t, kctx, "lease taken")
			if cause := context.Cause(kctx); errors.Is(cause, inbox.ErrCancelled) {
				t.Fatalf("lease taken: cause %v: the row is there, another's", cause)
			}
			if err := d.Ack(ctx); !errors.Is(err, inbox.ErrSettled) && !errors.Is(err, inbox.ErrLeaseLost) {
				t.Fatalf("ack after the keeper lost the lease: %v", err)
			}
			if n := countRows(t, db, table); n != 1 {
				t.Fatalf("%d rows, want the other holder's job", n)
			}
			stop()
			mustBeIdle(t, db, q)
		})
		t.Run("cancelled", func(t *testing.T) {
			// Queue.Cancel deletes the job in work: the keeper's next
			// extension finds the row gone within the lease, a cause of
			// its own that reads as a lost lease too.
			emptyTables(t, db, table)
			id := enqueueOne(t, q, db, "cancelled")
			d := claimOne(t, q)
			n := clock.Afters()
			kctx, stop := d.Keep(ctx)
			defer stop()
			clock.WaitAfters(t, n+1)
			if err := q.Cancel(ctx, id); err != nil {
				t.Fatal(err)
			}
			clock.Advance(30 * time.Second)
			clock.WaitAftersOr(t, n+2, kctx.Done())
			cancelled(t, kctx, "cancelled")
			if cause := context.Cause(kctx); !errors.Is(cause, inbox.ErrCancelled) {
				t.Fatalf("cancelled: cause %v, want ErrCancelled", cause)
			}
			if err := d.Ack(ctx); !errors.Is(err, inbox.ErrCancelled) || !errors.Is(err, inbox.ErrSettled) {
				t.Fatalf("ack after the keeper found the job cancelled = %v, want ErrSettled and ErrCancelled", err)
			}
			stop()
			mustBeIdle(t, db, q)
		})
		t.Run("gone after expiry", func(t *testing.T) {
			// Past the lease the job may have been claimed and acked by
			// another: a row gone is then a lost lease, not a cancel.
			emptyTables(t, db, table)
			enqueueOne(t, q, db, "expired")
			d := claimOne(t, q)
			clock.Advance(time.Minute + time.Second)
			other := claimOne(t, q)
			if err := other.Ack(ctx); err != nil {
				t.Fatal(err)
			}
			if err := d.Extend(ctx); !errors.Is(err, inbox.ErrLeaseLost) || errors.Is(err, inbox.ErrCancelled) {
				t.Fatalf("extend after another acked the job = %v, want ErrLeaseLost alone", err)
			}
			mustBeIdle(t, db, q)
		})
		t.Run("unreachable", func(t *testing.T) {
			emptyTables(t, db, table)
			cut := e.OpenDSN(t, dsn, 2)
			qc := newQueue(t, cut, queueConfig(e, tb, clock))
			enqueueOne(t, q, db, "cut")
			d := claimOne(t, qc)
			claimed := clock.Now()
			n := clock.Afters()
			kctx, stop := d.Keep(ctx)
			defer stop()
			clock.WaitAfters(t, n+1)
			// The keeper's pool goes away: every extension fails.
			if err := cut.Close(); err != nil {
				t.Fatal(err)
			}
			// The keeper retries every tenth of the lease and gives up at
			// the expiry less the margin, a tenth of the lease.
			giveUp := claimed.Add(time.Minute - time.Minute/10)
			step := 30 * time.Second
			for kctx.Err() == nil {
				if !clock.Now().Before(giveUp) {
					t.Fatalf("%v after the claim the handler still runs", clock.Now().Sub(claimed))
				}
				n := clock.Afters()
				clock.Advance(step)
				step = 6 * time.Second
				clock.WaitAftersOr(t, n+1, kctx.Done())
			}
			if now := clock.Now(); now.After(giveUp) || now.Before(claimed.Add(30*time.Second)) {
				t.Fatalf("the keeper gave up %v after the claim, want after its first extension and by %v", now.Sub(claimed), giveUp.Sub(claimed))
			}
			cancelled(t, kctx, "database unreachable")
			stop()
			mustBeIdle(t, cut, qc)
		})
	})
}

// TestLeaseForeignClaims is the reference guide's second test: of two rows
// another process claimed, the one whose lease ran out comes back, at the
// attempt that process left, and the one in force does not.
func TestLeaseForeignClaims(t *testing.T) {
	eachForm(t, leaseOnly, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, 4)
		table := newTable(t, e, db, "foreign")
		clock := fakeclock.New(clockStart)
		q := newQueue(t, db, queueConfig(e, Table(table, form), clock))
		now := clock.Now().Truncate(time.Microsecond)
		ins := "INSERT INTO " + table + " (id, attempt, locked_until, payload) VALUES (?, 2, ?, ?)"
		mustExec(t, e, db, ins, 1, e.Dialect.TimeArg(now.Add(-time.Second)), []byte("expired"))
		mustExec(t, e, db, ins, 2, e.Dialect.TimeArg(now.Add(time.Minute)), []byte("in force"))
		inForce := dumpRows(t, db, table)[1]

		d := claimOne(t, q)
		if d.ID() != int64(1) || d.Attempt() != 2 || payloadOf(t, d) != "expired" {
			t.Fatalf("claimed %v attempt %d %q, want 1 attempt 2 \"expired\"", d.ID(), d.Attempt(), payloadOf(t, d))
		}
		if a := attemptOf(t, e, db, table, 1); a != 3 {
			t.Fatalf("stored attempt %d, want 3", a)
		}
		if got := dumpRows(t, db, table)[1]; got != inForce {
			t.Fatalf("the row in force changed:\n%s\n%s", inForce, got)
		}
		if err := d.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
		mustBeIdle(t, db, q)
	})
}

// TestLeaseDatabaseClock: without Config.Now, Postgres and MySQL lease by the
// server's clock, in UTC whatever the session's time zone.
func TestLeaseDatabaseClock(t *testing.T) {
	eachForm(t, func(e Engine) []string {
		if e.IsSQLite() {
			return nil
		}
		return []string{"lease"}
	}, func(t *testing.T, e Engine, form string) {
		dsn := e.DSN(t, "")
		if e.IsMySQL() {
			// A session five hours east of UTC: NOW() would be five hours
			// off UTC_TIMESTAMP().
			dsn += "&time_zone=%27%2B05%3A00%27"
		}
		db := e.OpenDSN(t, dsn, 4)
		table := newTable(t, e, db, "dbclock")
		q := newQueue(t, db, queueConfig(e, Table(table, form), nil))
		ctx := context.Background()
		id := enqueueOne(t, q, db, "clock")
		// ahead is how far the stored expiry lies ahead of the server's
		// clock, and stored the expiry as the server writes it.
		ahead := func() (time.Duration, time.Time) {
			t.Helper()
			var micros int64
			var text string
			var err error
			if e.IsPostgres() {
				err = db.QueryRow("SELECT (EXTRACT(EPOCH FROM locked_until - clock_timestamp()) * 1000000)::bigint, "+
					"to_char(locked_until AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') FROM "+table+" WHERE id = $1", id).Scan(&micros, &text)
			} else {
				err = db.QueryRow("SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), locked_until), "+
					"DATE_FORMAT(locked_until, '%Y-%m-%d %H:%i:%s.%f') FROM "+table+" WHERE id = ?", id).Scan(&micros, &text)
			}
			if err != nil {
				t.Fatal(err)
			}
			stored, err := time.Parse("2006-01-02 15:04:05.000000", text)
			if err != nil {
				t.Fatal(err)
			}
			return time.Duration(micros) * time.Microsecond, stored
		}
		check := func(what string, d *inbox.Delivery) {
			t.Helper()
			a, stored := ahead()
			// Loose: the statements ran a moment ago on a loaded machine.
			if a <= 45*time.Second || a > time.Minute+time.Second {
				t.Fatalf("%s: the stored expiry is %v ahead of the server's clock, want about the one-minute lease", what, a)
			}
			if !d.Expiry().Equal(stored) {
				t.Fatalf("%s: the delivery's expiry %v is not the stored %v", what, d.Expiry(), stored)
			}
		}
		d := claimOne(t, q)
		check("claim", d)
		first := d.Expiry()
		if err := d.Extend(ctx); err != nil {
			t.Fatal(err)
		}
		check("extend", d)
		if d.Expiry().Before(first) {
			t.Fatalf("extend moved the expiry back from %v to %v", first, d.Expiry())
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
		mustBeIdle(t, db, q)
	})
}

// TestLeaseSameInstant: under a clock that does not move, an extension or a
// retry writes the expiry the row already holds; MySQL counts that as no
// changed row, which must not read as a lost lease.
func TestLeaseSameInstant(t *testing.T) {
	eachForm(t, leaseOnly, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, 4)
		table := newTable(t, e, db, "instant")
		clock := fakeclock.New(clockStart)
		q := newQueue(t, db, queueConfig(e, Table(table, form), clock))
		ctx := context.Background()
		id := enqueueOne(t, q, db, "frozen")
		d := claimOne(t, q)
		want := clock.Now().Add(time.Minute).Truncate(time.Microsecond)
		for i := range 2 {
			if err := d.Extend(ctx); err != nil {
				t.Fatalf("extend %d at the claim's instant: %v", i+1, err)
			}
		}
		if got := lockedUntilOf(t, e, db, table, id); !got.Equal(want) || !d.Expiry().Equal(want) {
			t.Fatalf("expiry stored %v, delivered %v; want %v", got, d.Expiry(), want)
		}
		if err := d.Retry(ctx, time.Minute); err != nil {
			t.Fatalf("retry writing the expiry the row holds: %v", err)
		}
		if a := attemptOf(t, e, db, table, id); a != 2 {
			t.Fatalf("stored attempt %d, want 2", a)
		}
		claimNone(t, q, "a retried job before its delay")
		clock.Advance(time.Minute)
		d = claimOne(t, q)
		if d.Attempt() != 2 {
			t.Fatalf("attempt %d, want 2", d.Attempt())
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
		mustBeIdle(t, db, q)
	})
}

// TestSQLiteLeaseText: the lease column holds the package's fixed-width UTC
// text, and mattn/go-sqlite3 and modernc.org/sqlite, on one file, read what
// the other wrote the same way, to the microsecond.
func TestSQLiteLeaseText(t *testing.T) {
	var lite []Engine
	for _, e := range Engines {
		if e.IsSQLite() {
			lite = append(lite, e)
		}
	}
	if len(lite) != 2 {
		t.Fatalf("want two SQLite drivers, have %d", len(lite))
	}
	dir := t.TempDir()
	dbs := []*sql.DB{lite[0].OpenDSN(t, lite[0].DSN(t, dir), 2), lite[1].OpenDSN(t, lite[1].DSN(t, dir), 2)}
	table := "conf_text_sqlite"
	lite[0].CreateTable(t, dbs[0], table)
	// Half a second past the second: a format that dropped trailing zeros
	// would write .5 and sort wrong against .499999.
	clock := fakeclock.New(time.Date(2031, 3, 4, 5, 6, 7, 500_000_000, time.UTC))
	const layout = "2006-01-02T15:04:05.000000Z"
	ctx := context.Background()
	for w := range 2 {
		r := 1 - w
		t.Run(lite[w].Name+"-to-"+lite[r].Name, func(t *testing.T) {
			tb := Table(table, "lease")
			qw := newQueue(t, dbs[w], queueConfig(lite[w], tb, clock))
			qr := newQueue(t, dbs[r], queueConfig(lite[r], tb, clock))
			id := enqueueOne(t, qw, dbs[w], "text")
			d := claimOne(t, qw)
			want := clock.Now().Add(time.Minute).Format(layout)
			if !strings.HasSuffix(want, ":07.500000Z") {
				t.Fatalf("test setup: %q", want)
			}
			if got := d.Expiry().UTC().Format(layout); got != want {
				t.Fatalf("delivery expiry %s, want %s", got, want)
			}
			for i, db := range dbs {
				var text, typ string
				if err := db.QueryRow("SELECT locked_until, typeof(locked_until) FROM "+table+" WHERE id = ?", id).Scan(&text, &typ); err != nil {
					t.Fatal(err)
				}
				if text != want || typ != "text" {
					t.Fatalf("%s reads locked_until %q (%s), want the text %q", lite[i].Name, text, typ, want)
				}
			}
			// The other driver compares against that text to the microsecond.
			clock.Advance(time.Minute - time.Microsecond)
			claimNone(t, qr, "a microsecond before the other driver's lease ends")
			clock.Advance(time.Microsecond)
			d2 := claimOne(t, qr)
			if d2.ID() != id || d2.Attempt() != 2 {
				t.Fatalf("claimed %v attempt %d, want %v attempt 2", d2.ID(), d2.Attempt(), id)
			}
			if err := d.Ack(ctx); !errors.Is(err, inbox.ErrLeaseLost) {
				t.Fatalf("the first driver's stale ack: %v, want ErrLeaseLost", err)
			}
			// And the first reads the second's token back exactly.
			if err := d2.Extend(ctx); err != nil {
				t.Fatal(err)
			}
			var text string
			if err := dbs[w].QueryRow("SELECT locked_until FROM "+table+" WHERE id = ?", id).Scan(&text); err != nil {
				t.Fatal(err)
			}
			if exp := d2.Expiry().UTC().Format(layout); text != exp {
				t.Fatalf("%s reads %q, %s wrote %q", lite[w].Name, text, lite[r].Name, exp)
			}
			if err := d2.Ack(ctx); err != nil {
				t.Fatal(err)
			}
			mustBeIdle(t, dbs[w], qw)
			mustBeIdle(t, dbs[r], qr)
		})
	}
}

// TestLeaseKeeperRealClock: with the real clock the keeper's goroutine starts
// only when the first extension is due. A handler running past its first
// lease is kept, and another queue cannot take its job; a keeper paused
// before it ever started (Shutdown) extends nothing and still stops its
// handler, with ErrLeaseLost, no sooner than the lease less the margin
// after the claim. The engines run side by side, as each waits on real time.
func TestLeaseKeeperRealClock(t *testing.T) {
	const lease = 3 * time.Second
	eachForm(t, leaseOnly, func(t *testing.T, e Engine, form string) {
		t.Parallel()
		db := e.Open(t, 4)
		table := newTable(t, e, db, "realkeep")
		cfg := queueConfig(e, Table(table, form), nil)
		cfg.Lease = lease
		if e.IsSQLite() {
			cfg.Now = time.Now
		}
		q := newQueue(t, db, cfg)
		other := newQueue(t, db, cfg)
		ctx := context.Background()

		id := enqueueOne(t, q, db, "long")
		d := claimOne(t, q)
		first := d.Expiry()
		kctx, stop := d.Keep(ctx)
		// Two extensions: the job is then held past its first expiry.
		extended := first
		for n := 0; n < 2; {
			select {
			case <-kctx.Done():
				t.Fatalf("the handler's context ended after %d extensions: %v", n, context.Cause(kctx))
			default:
			}
			if got := d.Expiry(); got.After(extended) {
				extended, n = got, n+1
				continue
			}
			if time.Now().After(first.Add(time.Minute)) {
				t.Fatalf("the keeper extended the lease %d times in a minute, want 2", n)
			}
			time.Sleep(10 * time.Millisecond) // polling the expiry, with a deadline
		}
		if got := lockedUntilOf(t, e, db, table, id); !got.Equal(extended) {
			t.Fatalf("stored expiry %v, want the keeper's %v", got, extended)
		}
		claimNone(t, other, "a job its keeper holds past its first lease")
		if err := d.Ack(ctx); err != nil {
			t.Fatalf("ack: %v", err)
		}
		stop()

		enqueueOne(t, q, db, "held")
		claimed := time.Now()
		d = claimOne(t, q)
		first = d.Expiry()
		kctx, stop = d.Keep(ctx)
		defer stop()
		if err := q.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case <-kctx.Done():
		case <-time.After(time.Minute):
			t.Fatal("the handler's context did not end within a minute of Shutdown")
		}
		if cause := context.Cause(kctx); !errors.Is(cause, inbox.ErrLeaseLost) {
			t.Fatalf("cause %v, want ErrLeaseLost", cause)
		}
		if since, giveUp := time.Since(claimed), lease-lease/10; since < giveUp {
			t.Fatalf("the handler was stopped %v after the claim, before the lease less the margin (%v)", since, giveUp)
		}
		if got := d.Expiry(); !got.Equal(first) {
			t.Fatalf("a paused keeper extended the lease from %v to %v", first, got)
		}
		// The lease itself may have run out by now on a loaded machine.
		if err := d.Ack(ctx); err != nil && !errors.Is(err, inbox.ErrLeaseLost) {
			t.Fatalf("ack after the deadline: %v", err)
		}
		stop()
		mustBeIdle(t, db, q, other)
	})
}
