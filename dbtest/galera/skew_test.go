package galera

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/dbtest/internal/cluster"
	"github.com/sqlinbox/inbox/internal/optin"
)

// skewLease is the lease of TestGaleraSkew: short, so that each skew is
// measured in seconds; its margin is the default, a tenth.
const skewLease = 4 * time.Second

// faketimeLibs is where Debian's faketime package puts libfaketime; the
// multi-threaded one suits mariadbd (package libfaketime, which faketime
// depends on).
var faketimeLibs = []string{"/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1", "/usr/lib/faketime/libfaketimeMT.so.1"}

// requireFaketime returns libfaketimeMT's path, or skips t saying what is
// missing (a failure under INBOX_REQUIRE_DBS=1).
func requireFaketime(t *testing.T) string {
	for _, p := range faketimeLibs {
		if cluster.FileExists(p) {
			return p
		}
	}
	suite.Require(t, errors.New("libfaketimeMT.so.1 not found at "+strings.Join(faketimeLibs, ", ")+"; on Debian: apt-get install libfaketime"))
	return ""
}

// TestGaleraSkew boots a two-node cluster whose node2 runs under
// libfaketime, its clock ahead of node1's by an offset read from a file
// (reread each second), and measures what each skew S does to a lease of
// skewLease held through node1 while node2's queue claims as fast as it
// can: when node2 first claims a job held without a keeper (in theory
// L − S after its claim, against the holder's deadline L − KeepMargin
// that its keeper would stop it at), and whether node2 claims a job whose
// keeper extends it every half lease (in theory once S > L/2, less the
// extension's round trip). Each side of each bound is asserted with a
// safety factor: at 0.05 L node2 claims only after the holder's deadline,
// from 0.45 L (a second or more before it) before it; at 0.2 L node2 never
// claims the kept job, at 0.8 L it does; 0.45 L and 0.6 L are measured and
// logged. Then CheckSchema through node2 alone reports the skew, and
// through node1 it does not.
func TestGaleraSkew(t *testing.T) {
	optin.Require(t, "the Galera clock-skew test (a two-node MariaDB Galera cluster, one node under libfaketime)")
	lib := requireFaketime(t)
	h := newHarness(t, 2, true)
	offsetFile := filepath.Join(h.base, "faketime")
	writeSkew(t, offsetFile, 0)
	// The monotonic clock stays true: Galera's timers run on it.
	h.nodes[1].env = []string{"LD_PRELOAD=" + lib, "FAKETIME_TIMESTAMP_FILE=" + offsetFile, "FAKETIME_CACHE_DURATION=1", "DONT_FAKE_MONOTONIC=1"}
	boot := h.bootCluster()
	t.Logf("FIGURE: skew boot: two nodes synced in %v", boot.Round(100*time.Millisecond))
	margin := skewLease / 10
	for i, c := range []struct {
		frac            float64
		keptHolds       bool // asserted: node2 never claims the kept job
		keptLost        bool // asserted: node2 claims the kept job
		stopPromiseHeld bool // asserted: node2 claims the dropped job only after the holder's deadline
	}{
		{frac: 0.05, keptHolds: true, stopPromiseHeld: true},
		{frac: 0.2, keptHolds: true},
		{frac: 0.45},
		{frac: 0.6},
		{frac: 0.8, keptLost: true},
	} {
		s := time.Duration(c.frac * float64(skewLease))
		t.Run(fmt.Sprintf("S=%.2fL", c.frac), func(t *testing.T) {
			setSkew(t, h, offsetFile, s)
			r := measureSkew(t, h, i, s)
			theory := skewLease - s
			t.Logf("FIGURE: skew S=%v (%.2f L, L=%v, margin %v): node2 measured %v ahead; job without keeper claimed through node2 %v after node1's claim "+
				"(theory L-S=%v; holder's deadline L-margin=%v); job with keeper claimed through node2: %s",
				s, c.frac, skewLease, margin, r.measured.Round(time.Millisecond), r.dropped.Round(time.Millisecond), theory, skewLease-margin, r.keptText())
			if r.dropped < theory-100*time.Millisecond {
				t.Errorf("job without keeper claimed through node2 %v after node1's claim, before L-S=%v", r.dropped, theory)
			}
			if c.stopPromiseHeld && r.dropped < skewLease-margin {
				t.Errorf("S=%v < margin %v, yet node2 claimed a job %v after node1's claim, before the holder's deadline %v", s, margin, r.dropped, skewLease-margin)
			}
			// Asserted where node2 has a second or more to claim before the
			// holder's deadline, so that a loaded host does not fail it.
			if s-margin >= time.Second && r.dropped >= skewLease-margin {
				t.Errorf("S=%v > margin %v, yet node2 claimed only %v after node1's claim, not before the holder's deadline %v", s, margin, r.dropped, skewLease-margin)
			}
			if c.keptHolds && r.kept >= 0 {
				t.Errorf("S=%v: node2 claimed the job whose keeper extends it through node1 (%s): a double delivery", s, r.keptText())
			}
			if c.keptLost && r.kept < 0 {
				t.Errorf("S=%v > L/2: node2 never claimed the job whose keeper extends it, within %v", s, skewObserve)
			}
		})
	}
	t.Run("CheckSchema", func(t *testing.T) { testSkewCheck(t, h) })
}

// skewObserve is how long node2 tries to claim the kept job: past the
// claim's own expiry (L) and two extensions.
const skewObserve = skewLease * 5 / 4

type skewResult struct {
	measured time.Duration // node2's clock less node1's
	dropped  time.Duration // node2's claim of the job without keeper, after node1's claim
	kept     time.Duration // node2's claim of the kept job after node1's claim; -1: none
	keptLoss time.Duration // the holder's context cancelled (lease lost) after node1's claim; -1: not
}

func (r skewResult) keptText() string {
	if r.kept < 0 {
		return fmt.Sprintf("never within %v", skewObserve)
	}
	s := fmt.Sprintf("%v after node1's claim (a double delivery)", r.kept.Round(time.Millisecond))
	if r.keptLoss >= 0 {
		s += fmt.Sprintf(", the holder's handler cancelled %v after", r.keptLoss.Round(time.Millisecond))
	}
	return s
}

// measureSkew holds two jobs through node1, one with a keeper and one
// without, and claims through node2 every 20 ms until it has both or
// skewObserve has passed.
func measureSkew(t *testing.T, h *harness, i int, s time.Duration) skewResult {
	ctx := context.Background()
	n1, n2 := h.nodes[0], h.nodes[1]
	r := skewResult{kept: -1, keptLoss: -1}
	r.measured = clockOffset(t, n2) - clockOffset(t, n1)
	setup := openDB(t, n1.DSN(), 2)
	queues := map[string][2]*inbox.Queue{}
	for _, name := range []string{"kept", "dropped"} {
		table := fmt.Sprintf("skew_%s_%d", name, i)
		createQueue(t, setup, table)
		t.Cleanup(func() { _, _ = setup.Exec("DROP TABLE IF EXISTS " + table + ", " + table + "_dead") })
		fill(t, setup, table, 1)
		if got := count(t, n2, table); got != 1 {
			t.Fatalf("%s: %s has %d jobs, want 1", n2.name, table, got)
		}
		var qs [2]*inbox.Queue
		for j, nd := range []*node{n1, n2} {
			q, err := inbox.New(openDB(t, nd.DSN(), 2), queueConfig(table, "lease", skewLease))
			if err != nil {
				t.Fatal(err)
			}
			qs[j] = q
		}
		queues[name] = qs
	}
	claim := func(q *inbox.Queue) *inbox.Delivery {
		t.Helper()
		ds, err := q.Claim(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) == 0 {
			return nil
		}
		return ds[0]
	}
	start := time.Now()
	if claim(queues["dropped"][0]) == nil {
		t.Fatal("node1 claimed nothing")
	}
	held := claim(queues["kept"][0])
	if held == nil {
		t.Fatal("node1 claimed nothing")
	}
	hctx, stop := held.Keep(ctx)
	defer stop()
	lost := make(chan time.Duration, 1)
	context.AfterFunc(hctx, func() { lost <- time.Since(start) })
	for deadline := start.Add(skewObserve); (r.dropped == 0 || r.kept < 0) && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if r.dropped == 0 && claim(queues["dropped"][1]) != nil {
			r.dropped = time.Since(start)
		}
		if r.kept < 0 && claim(queues["kept"][1]) != nil {
			r.kept = time.Since(start)
		}
	}
	if r.dropped == 0 {
		t.Fatalf("node2 never claimed the job without keeper within %v", skewObserve)
	}
	if r.kept >= 0 {
		// The holder's next extension finds the lease gone and cancels its
		// handler; its Ack then fails.
		select {
		case r.keptLoss = <-lost:
		case <-time.After(skewLease):
			t.Errorf("node2 holds the kept job, yet the holder's handler was not cancelled within a lease")
		}
		if err := held.Ack(ctx); !errors.Is(err, inbox.ErrLeaseLost) {
			t.Errorf("the holder's Ack after node2's claim = %v, want ErrLeaseLost", err)
		}
	} else if err := held.Ack(ctx); err != nil {
		t.Errorf("the holder's Ack = %v, want nil", err)
	}
	return r
}

// writeSkew writes libfaketime's offset, s ahead, to the file node2 reads.
func writeSkew(t *testing.T, file string, s time.Duration) {
	t.Helper()
	if err := os.WriteFile(file, []byte(fmt.Sprintf("%+.6f\n", s.Seconds())), 0o644); err != nil {
		t.Fatal(err)
	}
}

// setSkew sets node2's offset to s and waits until node2's clock is s
// ahead of node1's, within 50 ms (libfaketime rereads the file each second).
func setSkew(t *testing.T, h *harness, file string, s time.Duration) {
	t.Helper()
	writeSkew(t, file, s)
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := clockOffset(t, h.nodes[1]) - clockOffset(t, h.nodes[0])
		if d := got - s; d > -50*time.Millisecond && d < 50*time.Millisecond {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node2's clock is %v ahead of node1's 30s after asking libfaketime for %v", got, s)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// clockOffset is nd's UTC_TIMESTAMP(6) less the midpoint of this process's
// send and receive times.
func clockOffset(t *testing.T, nd *node) time.Duration {
	t.Helper()
	var at time.Time
	sent := time.Now()
	if err := nd.admin.QueryRow("SELECT UTC_TIMESTAMP(6)").Scan(&at); err != nil {
		t.Fatalf("%s: reading its clock: %v", nd.name, err)
	}
	got := time.Now()
	return at.Sub(sent.Add(got.Sub(sent) / 2))
}

// testSkewCheck: with node2 0.8 L ahead, CheckSchema through node2 alone
// reports the skew, naming it and the margin; through node1 it passes.
func testSkewCheck(t *testing.T, h *harness) {
	ctx := context.Background()
	createQueue(t, openDB(t, h.nodes[0].DSN(), 1), "skew_check")
	for _, nd := range h.nodes {
		q, err := inbox.New(openDB(t, nd.DSN(), 4), queueConfig("skew_check", "lease", skewLease))
		if err != nil {
			t.Fatal(err)
		}
		err = q.CheckSchema(ctx)
		var se *inbox.SchemaError
		switch {
		case nd == h.nodes[0] && err != nil:
			t.Errorf("%s: CheckSchema = %v, want nil", nd.name, err)
		case nd == h.nodes[1] && (!errors.As(err, &se) || !strings.Contains(err.Error(), "ahead") || !strings.Contains(err.Error(), "Config.KeepMargin (400ms)")):
			t.Errorf("%s, %.2f L ahead: CheckSchema = %v, want a *SchemaError naming the skew and Config.KeepMargin (400ms)", nd.name, 0.8, err)
		default:
			t.Logf("%s: CheckSchema = %v", nd.name, err)
		}
	}
}
