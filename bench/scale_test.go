package main

// The CI check of -run scale: its plan parses, and one line of each form
// runs in two worker processes (this test binary started again) on
// PostgreSQL and reports jobs done. Speed is not looked at.

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

func TestScalePlan(t *testing.T) {
	plan, err := parseScalePlan("1x1, 4x16:9")
	if err != nil || len(plan) != 2 || plan[1] != (scalePlanEntry{procs: 4, workers: 16, pool: 9}) {
		t.Fatalf("parseScalePlan = %v, %v", plan, err)
	}
	for _, bad := range []string{"4", "0x16", "4x", "4x16:1", "4x16:x"} {
		if _, err := parseScalePlan(bad); err == nil {
			t.Errorf("parseScalePlan(%q) accepted", bad)
		}
	}
	c := scaleChild{engine: "pgx", table: "t", form: "lease", batch: 16, workers: 4, pool: 6, hold: 20 * time.Millisecond, duration: time.Second, claims: 8}
	if got, err := decodeScaleChild(c.encode()); err != nil || got != c {
		t.Errorf("decodeScaleChild(encode(%+v)) = %+v, %v", c, got, err)
	}
	if scaleConns("rowlock", 16, 1) != 17 || scaleConns("lease", 16, 16) != 18 {
		t.Error("scaleConns: the held forms need a connection per job plus one, the lease one per worker plus two")
	}
}

func TestScaleRun(t *testing.T) {
	e := needEngine(t, "pgx")
	defer func(p string, r int) { scalePlan, scaleReps = p, r }(scalePlan, scaleReps)
	scalePlan, scaleReps = "2x2", 1
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := runScale(ctx, &out, io.Discard, []engine{e}, []string{"lease", "rowlock", "advisory", "advisory-walk"}, 300*time.Millisecond, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(l, "| pgx") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 5 { // lease batch 1 and 16, row lock, advisory, advisory walked from Go
		t.Fatalf("%d lines in the table, want 5:\n%s", len(lines), out.String())
	}
	for _, l := range lines {
		f := strings.Split(l, "|")
		if rate := strings.TrimSpace(f[6]); rate == "0" || rate == "" {
			t.Errorf("no jobs done: %s", l)
		}
	}
}
