package dbtest

// Table.Shallow: the lease claim through the primary key, on a table with
// no claim index (the tables of this suite have none).

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/fakeclock"
)

// TestShallowClaimOrder: the one ordered read takes free rows and expired
// leases in id order, steps over live leases and delayed jobs, and fences
// the holder of a lease that ran out; claims of one (SQLite's Claim.TakeOne)
// and of several alike. CheckSchema accepts the table without claim
// indexes, described either way.
func TestShallowClaimOrder(t *testing.T) {
	eachEngine(t, nil, func(t *testing.T, e Engine) {
		ctx := context.Background()
		db := e.Open(t, 4)
		table := newTable(t, e, db, "shallow_order")
		clk := fakeclock.New(time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC))
		q := newQueue(t, db, queueConfig(e, Table(concQualified(t, e, db, table), "lease-shallow"), clk))
		for _, tb := range []inbox.Table{Table(table, "lease-shallow"), Table(table, "lease")} {
			if err := newQueue(t, db, queueConfig(e, tb, clk)).CheckSchema(ctx); err != nil {
				t.Errorf("CheckSchema, Shallow %v: %v", tb.Shallow, err)
			}
		}
		for _, p := range []string{"a", "b", "c", "d", "e"} {
			enqueueOne(t, q, db, p)
		}
		first := shallowClaim(t, q, 3, "a", "b", "c")
		if err := first[1].Retry(ctx, 10*time.Minute); err != nil {
			t.Fatalf("retry of b: %v", err)
		}
		// a and c held, b delayed: d and e are next, one at a time too.
		shallowClaim(t, q, 1, "d")
		held := shallowClaim(t, q, 5, "e")
		shallowClaim(t, q, 3)

		// Past the minute's lease a, c, d and e are claimable again; b waits.
		clk.Advance(2 * time.Minute)
		again := shallowClaim(t, q, 5, "a", "c", "d", "e")
		for _, d := range again {
			if d.Attempt() != 2 {
				t.Errorf("job %v delivered again as attempt %d, want 2", d.ID(), d.Attempt())
			}
		}
		if err := first[0].Ack(ctx); !errors.Is(err, inbox.ErrLeaseLost) {
			t.Errorf("the first holder of a acknowledged after its lease ran out: %v, want ErrLeaseLost", err)
		}
		if err := held[0].Ack(ctx); !errors.Is(err, inbox.ErrLeaseLost) {
			t.Errorf("the first holder of e acknowledged after its lease ran out: %v, want ErrLeaseLost", err)
		}
		for _, d := range again {
			if err := d.Ack(ctx); err != nil {
				t.Errorf("ack of job %v: %v", d.ID(), err)
			}
		}
		shallowClaim(t, q, 1)
		clk.Advance(10 * time.Minute)
		b := shallowClaim(t, q, 1, "b")
		if err := b[0].Ack(ctx); err != nil {
			t.Errorf("ack of b: %v", err)
		}
		if n := countRows(t, db, table); n != 0 {
			t.Errorf("%d jobs left", n)
		}
	})
}

// shallowClaim claims up to max jobs and checks their payloads, in order.
func shallowClaim(t *testing.T, q *inbox.Queue, max int, want ...string) []*inbox.Delivery {
	t.Helper()
	ds, err := q.Claim(context.Background(), max)
	if err != nil {
		t.Fatalf("claim of %d: %v", max, err)
	}
	var got []string
	for _, d := range ds {
		var p []byte
		if err := d.Scan(&p); err != nil {
			t.Fatal(err)
		}
		got = append(got, string(p))
	}
	if len(got) != len(want) {
		t.Fatalf("claim of %d delivered %q, want %q", max, got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("claim of %d delivered %q, want %q", max, got, want)
		}
	}
	return ds
}
