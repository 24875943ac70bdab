package dbtest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
)

// The crash tests re-execute the test binary as a worker process (TestMain's
// INBOX_CHILD switch), let it claim a job and SIGKILL it mid-handler, then
// measure how the job comes back: at once with the same attempt and without
// the child's writes (row lock), at once with the attempt spent (advisory),
// only once the lease ran out with the attempt spent (lease).

// TestCrash kills a child process mid-handler for every form on every
// engine and driver that supports it, and checks how the job comes back.
func TestCrash(t *testing.T) {
	logWall(t)
	for _, e := range Engines {
		for _, form := range e.Forms() {
			t.Run(e.Name+"/"+form, func(t *testing.T) {
				t.Parallel()
				runCrash(t, e, form)
			})
		}
	}
}

func runCrash(t *testing.T, e Engine, form string) {
	ctx := context.Background()
	logWall(t)
	dir := t.TempDir()
	dsn := e.DSN(t, dir)
	db := e.OpenDSN(t, dsn, 4)
	table := fmt.Sprintf("crash_%s_%s_%d", e.Name, form, os.Getpid())
	effects := fmt.Sprintf("crash_fx_%s_%d", e.Name, os.Getpid())
	e.CreateTable(t, db, table)
	t.Cleanup(func() { dropNow(t, db, table, table+"_dead", table+"_claims") })
	if form == "rowlock" {
		for _, s := range effectsTableSQL(e, effects) {
			if _, err := db.Exec(s); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() { dropNow(t, db, effects) })
	}
	q, err := inbox.New(db, formConfig(e, table, form, realLease))
	if err != nil {
		t.Fatal(err)
	}
	idAny, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte("crash")}})
	if err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprint(idAny)
	switch form {
	case "advisory":
		checkAtEnd(e, table, 1)
	case "rowlock":
		checkAtEnd(e, table, 0)
		checkAtEnd(e, effects, 0)
	}

	child := startChild(t, "child", "crash", childConfig{Engine: e.Name, DSN: dsn, Table: table, Form: form,
		Lease: realLease, Effects: effects, Conns: 4})
	f := strings.Fields(child.Line(t, 2*time.Minute))
	if len(f) != 4 || f[0] != "CLAIMED" {
		t.Fatalf("child said %q, want CLAIMED id attempt session", f)
	}
	if f[1] != id || f[2] != "1" {
		t.Fatalf("child claimed job %s attempt %s, want job %s attempt 1", f[1], f[2], id)
	}
	// While the child lives, the job is held; except that SQLite's
	// advisory keys are held in the process that claimed them, so this
	// process cannot see them (one process serves a SQLite file).
	if !(e.IsSQLite() && form == "advisory") {
		if ds, err := q.Claim(ctx, 1); err != nil || len(ds) != 0 {
			t.Fatalf("claim while the child holds the job: %d deliveries, %v; want none", len(ds), err)
		}
	}

	child.Kill()
	killed := time.Now()
	// The lease the child last wrote, and the clock then: the job may come
	// back no earlier than that expiry.
	var expiry, nowAtKill time.Time
	if form == "lease" {
		var ok bool
		_, expiry, ok = rowOf(t, e, db, table, idAny)
		nowAtKill = dbNow(t, e, db)
		if !ok || expiry.IsZero() {
			t.Fatalf("job %s: no lease in its row after the kill", id)
		}
	}
	var d *inbox.Delivery
	polls := 0
	deadline := killed.Add(inbox.DefaultLease)
	for d == nil {
		ds, err := q.Claim(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		polls++
		if len(ds) == 1 {
			d = ds[0]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s not claimable %v after the kill (%d claims tried)", id, inbox.DefaultLease, polls)
		}
		time.Sleep(2 * time.Millisecond)
	}
	delay := time.Since(killed)
	if fmt.Sprint(d.ID()) != id {
		t.Fatalf("claimed job %v, want %s", d.ID(), id)
	}
	wantAttempt := 2
	if form == "rowlock" {
		wantAttempt = 1
	}
	if d.Attempt() != wantAttempt {
		t.Errorf("after the crash: attempt %d, want %d (%s)", d.Attempt(), wantAttempt, map[bool]string{true: "a crash spends none under the row lock", false: "a crash spends one"}[form == "rowlock"])
	}
	switch form {
	case "lease":
		// The claim happened at its expiry less the lease, by the queue's
		// clock: never before the lease the killed child held ran out.
		claimedAt := d.Expiry().Add(-realLease)
		if claimedAt.Before(expiry) {
			t.Errorf("claimed at %v, before the killed child's lease ran out at %v", claimedAt, expiry)
		}
		t.Logf("FIGURE: crash %s lease: redelivered %v after the kill (lease %v, %v of it left at the kill), attempt 1 -> %d, %d claims tried",
			e.Name, delay.Round(time.Millisecond), realLease, expiry.Sub(nowAtKill).Round(time.Millisecond), d.Attempt(), polls)
	default:
		// At once: nothing in these forms waits on a clock, so the job is
		// back as soon as the server has ended the dead process's session,
		// long before anything lease-like (DefaultLease/3).
		if delay > inbox.DefaultLease/3 {
			t.Errorf("redelivered %v after the kill; the %s form returns a job at once", delay, form)
		}
		t.Logf("FIGURE: crash %s %s: redelivered %v after the kill, attempt 1 -> %d, %d claims tried",
			e.Name, form, delay.Round(time.Millisecond), d.Attempt(), polls)
	}
	if form == "rowlock" {
		if n := countWhere(t, e, db, effects, "job_id = ?", idAny); n != 0 {
			t.Errorf("%d rows the killed child wrote through its transaction survived", n)
		}
		// The child's session is gone, not left idle in its transaction.
		eventually(t, 30*time.Second, "the killed child's session to end", func() error {
			q := "SELECT COUNT(*) FROM pg_stat_activity WHERE pid = $1"
			if e.IsMySQL() {
				q = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?"
			}
			var n int
			if err := db.QueryRow(q, f[3]).Scan(&n); err != nil {
				return err
			}
			if n != 0 {
				return fmt.Errorf("session %s still listed", f[3])
			}
			return nil
		})
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if n := countWhere(t, e, db, table, ""); n != 0 {
		t.Errorf("%d rows left after the ack", n)
	}
	noKeyLocks(t, e, db, table, 1)
}
