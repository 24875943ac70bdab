package main

// The CI check of -run peers: the mode runs at a tiny size through the
// program's own command line on each engine with a peer, River on pgx and
// goqite on both SQLite drivers, and prints a line with jobs done on both
// sides for each worker count. peerCell itself checks that every job
// counted was acknowledged once and no other was. Speed is not looked at.

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

func TestPeers(t *testing.T) {
	defer func(table, schema string) { peersTable, riverSchema = table, schema }(peersTable, riverSchema)
	peersTable, riverSchema = "bench_ci_peers_", "river_bench_ci"
	defer func(b int, w, sh bool) { peerBatch, peerWork, peerShallow = b, w, sh }(peerBatch, peerWork, peerShallow)
	// "pgx/work-shallow": inbox's side through worker.Run loops with a
	// batch, on a shallow table (-peer-work -peer-shallow -peer-batch 8).
	for _, name := range []string{"pgx", "pgx/work-shallow", "mattn", "modernc"} {
		t.Run(name, func(t *testing.T) {
			variant := strings.HasSuffix(name, "/work-shallow")
			peerBatch, peerWork, peerShallow = 16, variant, variant
			if variant {
				peerBatch = 8
			}
			name := strings.TrimSuffix(name, "/work-shallow")
			e := needEngine(t, name)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var out, log bytes.Buffer
			o := options{run: "peers", engines: name, workers: "1,4", duration: 200 * time.Millisecond, segments: 2}
			if err := run(ctx, &out, &log, o); err != nil {
				t.Fatalf("%v\n%s", err, log.String())
			}
			var lines []string
			for _, l := range strings.Split(out.String(), "\n") {
				if strings.HasPrefix(l, "| "+e.family+" | "+e.label+" |") {
					lines = append(lines, l)
				}
			}
			if len(lines) != 2 { // 1 and 4 workers
				t.Fatalf("%d lines in the table, want 2:\n%s", len(lines), out.String())
			}
			if variant && !strings.Contains(out.String(), "shallow table") || variant && !strings.Contains(out.String(), "Workers loops with Batch 8") {
				t.Errorf("the header does not name the shallow table and the worker.Run loops:\n%s", out.String())
			}
			for _, l := range lines {
				f := strings.Split(l, "|")
				for _, rate := range []string{strings.TrimSpace(f[5]), strings.TrimSpace(f[6])} {
					if rate == "0" || rate == "" {
						t.Errorf("no jobs done: %s\n%s", l, log.String())
					}
				}
			}
		})
	}
}

// The figure of a line is the median of its segments' rates; with an even
// number of segments, the mean of the middle two.
func TestMedianRate(t *testing.T) {
	seg := func(jobs ...int) []result {
		var rs []result
		for _, n := range jobs {
			rs = append(rs, result{jobs: n, elapsed: time.Second})
		}
		return rs
	}
	if m := medianRate(seg(10, 1, 3, 2)); m != 2.5 {
		t.Errorf("median of 10, 1, 3, 2 jobs/s = %v, want 2.5", m)
	}
	if m := medianRate(seg(10, 1, 3)); m != 3 {
		t.Errorf("median of 10, 1, 3 jobs/s = %v, want 3", m)
	}
}
