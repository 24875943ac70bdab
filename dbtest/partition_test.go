package dbtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/dbtest/internal/proxy"
)

// partXLease is the partitioned holder's real lease; partXMargin is how long
// before its last known expiry its keeper gives up, so that the holder has
// stopped by the time anyone else may start.
const (
	partXLease  = 4 * time.Second
	partXMargin = 1500 * time.Millisecond
)

// partXVia rewrites dsn to reach the server through addr, returning the
// server's own address too.
func partXVia(t *testing.T, e Engine, dsn, addr string) (string, string) {
	t.Helper()
	if e.IsPostgres() {
		u, err := url.Parse(dsn)
		if err != nil || u.Host == "" {
			t.Fatalf("INBOX_POSTGRES_DSN must be a URL with a host for the partition test: %q", dsn)
		}
		server := u.Host
		if _, _, err := net.SplitHostPort(server); err != nil {
			server = net.JoinHostPort(server, "5432")
		}
		u.Host = addr
		return u.String(), server
	}
	i := strings.Index(dsn, "tcp(")
	j := strings.Index(dsn, ")/")
	if i < 0 || j < i {
		t.Fatalf("INBOX_MYSQL_DSN must name tcp(host:port) for the partition test: %q", dsn)
	}
	return dsn[:i] + "tcp(" + addr + dsn[j:], dsn[i+4 : j]
}

// TestPartitionLeaseHolder cuts a lease holder off from the database without
// closing its sockets (a loopback proxy stops forwarding): its keeper cannot
// extend, so the handler's context is cancelled with ErrLeaseLost before the
// lease runs out; another worker, on a direct connection, claims the job
// once it has; and when the link is back, the holder's late Ack fails with
// ErrLeaseLost and changes nothing.
func TestPartitionLeaseHolder(t *testing.T) {
	logWall(t)
	for _, e := range serverEngines() {
		t.Run(e.Name, func(t *testing.T) {
			t.Parallel()
			logWall(t)
			ctx := context.Background()
			dsn := e.DSN(t, "")
			_, server := partXVia(t, e, dsn, "")
			p, err := proxy.New(server)
			if err != nil {
				t.Fatal(err)
			}
			// Closing the proxy also ends whatever the partition left stuck.
			t.Cleanup(func() { p.Close() })
			via, _ := partXVia(t, e, dsn, p.Addr())
			hdb := e.OpenDSN(t, via, 4)
			wdb := e.Open(t, 4)
			table := fmt.Sprintf("part_%s_lease_%d", e.Name, os.Getpid())
			e.CreateTable(t, wdb, table)
			t.Cleanup(func() { dropNow(t, wdb, table, table+"_dead", table+"_claims") })
			cfg := formConfig(e, table, "lease", partXLease)
			cfg.KeepMargin = partXMargin
			hq, err := inbox.New(hdb, cfg)
			if err != nil {
				t.Fatal(err)
			}
			wq, err := inbox.New(wdb, cfg)
			if err != nil {
				t.Fatal(err)
			}
			id, err := wq.Enqueue(ctx, wdb, inbox.Job{Data: []any{[]byte("partition")}})
			if err != nil {
				t.Fatal(err)
			}
			ds, err := hq.Claim(ctx, 1)
			if err != nil || len(ds) != 1 {
				t.Fatalf("holder's claim: %d, %v", len(ds), err)
			}
			d := ds[0]
			expiry := d.Expiry()
			hctx, stop := d.Keep(ctx)
			defer stop()
			// Should the test fail during the partition, heal it first: a
			// keeper stuck on the link would hold stop up.
			defer p.Heal()
			p.Partition()
			partitioned := time.Now()

			// The keeper gives up before the lease runs out, by the server's
			// clock read on the direct connection once the cancel is seen.
			select {
			case <-hctx.Done():
			case <-time.After(partXLease + time.Minute):
				t.Fatalf("the handler's context was not cancelled %v into the partition (lease %v)", time.Since(partitioned), partXLease)
			}
			serverNow := dbNow(t, e, wdb)
			if cause := context.Cause(hctx); !errors.Is(cause, inbox.ErrLeaseLost) {
				t.Errorf("handler cancelled with cause %v, want ErrLeaseLost", cause)
			}
			if !serverNow.Before(expiry) {
				t.Errorf("handler cancelled no earlier than %v, when the lease ran out at %v", serverNow, expiry)
			}
			early := expiry.Sub(serverNow)

			// Another worker claims the job only once the lease has run out.
			d2, _ := claimSoon(t, wq, partXLease+time.Minute)
			if fmt.Sprint(d2.ID()) != fmt.Sprint(id) || d2.Attempt() != 2 {
				t.Fatalf("other worker claimed job %v attempt %d, want job %v attempt 2", d2.ID(), d2.Attempt(), id)
			}
			if claimedAt := d2.Expiry().Add(-partXLease); claimedAt.Before(expiry) {
				t.Errorf("other worker claimed at %v, before the holder's lease ran out at %v", claimedAt, expiry)
			}

			// The link is back: the holder's late Ack must find its lease
			// lost. Its pool may still hold a connection the partition left
			// mid-statement; if the Ack fails on that without a verdict (its
			// deadline, a broken connection), the delivery stays open and
			// a second Ack, on a working connection, must give the verdict.
			p.Heal()
			stop()
			actx, cancel := context.WithTimeout(ctx, 20*time.Second)
			err = d.Ack(actx)
			cancel()
			tries := 1
			if !errors.Is(err, inbox.ErrLeaseLost) && !errors.Is(err, inbox.ErrSettled) && err != nil {
				t.Logf("first late Ack failed without a verdict: %v; trying again", err)
				actx, cancel := context.WithTimeout(ctx, 20*time.Second)
				err = d.Ack(actx)
				cancel()
				tries++
			}
			if errors.Is(err, inbox.ErrSettled) && e.Name == "pq" {
				// lib/pq ignores the deadline of the extension the
				// partition caught and waits for the server's answer; once
				// the link is back the extension finds the token gone,
				// which finishes the delivery (ErrLeaseLost to the keeper,
				// ErrSettled to every later call). Either way the late
				// holder changes nothing, as checked below.
				t.Logf("late Ack: %v: the keeper's held extension, answered once the link was back, found the lease lost first", err)
			} else if !errors.Is(err, inbox.ErrLeaseLost) {
				t.Fatalf("holder's late Ack: %v, want ErrLeaseLost", err)
			}
			// Nothing changed: the row carries the other worker's token.
			att, lu, ok := rowOf(t, e, wdb, table, id)
			if !ok || att != 3 || !lu.Equal(d2.Expiry()) {
				t.Errorf("row after the late Ack: present %v attempt %d lease %v; want present, attempt 3, lease %v", ok, att, lu, d2.Expiry())
			}
			if err := d2.Ack(ctx); err != nil {
				t.Fatal(err)
			}
			t.Logf("FIGURE: partition %s lease %v (keeper margin %v): handler cancelled %v before the lease ran out; other worker claimed attempt 2 after it; late Ack -> %v (%d tries)",
				e.Name, partXLease, partXMargin, early.Round(time.Millisecond), err, tries)
		})
	}
}
