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
	plan, err = parseScalePlan("4x16@2,1x16:9@8")
	if err != nil || plan[0] != (scalePlanEntry{procs: 4, workers: 16, claims: 2}) || plan[1] != (scalePlanEntry{procs: 1, workers: 16, pool: 9, claims: 8}) {
		t.Fatalf("parseScalePlan with bounds = %v, %v", plan, err)
	}
	defer func(c int) { scaleClaims = c }(scaleClaims)
	scaleClaims = 3
	if plan[0].claimsAtOnce() != 2 || (scalePlanEntry{procs: 1, workers: 1}).claimsAtOnce() != 3 {
		t.Error("claimsAtOnce: a line's own bound comes first, then -scale-claims")
	}
	if got := (scaleLine{form: "advisory", batch: 1, scalePlanEntry: plan[0]}).layout(); got != "4 × 16, 2 claims at once" {
		t.Errorf("layout of inbox's line = %q", got)
	}
	if got := (scaleLine{form: "advisory-floor", batch: 1, scalePlanEntry: plan[0]}).layout(); got != "4 × 16" {
		t.Errorf("layout of a baseline, which takes no bound = %q", got)
	}
	for _, bad := range []string{"4", "0x16", "4x", "4x16:1", "4x16:x", "4x16@0", "4x16@x", "4x16@"} {
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

func TestScaleSlot(t *testing.T) {
	if i, n, err := parseScaleSlot("3/4"); i != 3 || n != 4 || err != nil {
		t.Errorf("parseScaleSlot(3/4) = %d, %d, %v", i, n, err)
	}
	for _, bad := range []string{"", "4", "4/4", "-1/4", "0/0", "a/4"} {
		if _, _, err := parseScaleSlot(bad); err == nil || !strings.Contains(err.Error(), scaleSlotEnv) {
			t.Errorf("parseScaleSlot(%q) = %v, want an error naming %s", bad, err, scaleSlotEnv)
		}
	}
}

// The baselines run on both server families in two processes: every
// job of the floor is its own process's (a key found held fails the run),
// and the hand-written queue drains as the table line's does.
func TestScaleBaselines(t *testing.T) {
	defer func(p string, r int) { scalePlan, scaleReps = p, r }(scalePlan, scaleReps)
	scalePlan, scaleReps = "2x3", 1
	for _, name := range []string{"pgx", "mysql"} {
		e := needEngine(t, name)
		var out bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		err := runScale(ctx, &out, io.Discard, []engine{e}, []string{"advisory-minimal", "advisory-floor"}, 300*time.Millisecond, t.TempDir())
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var lines []string
		for _, l := range strings.Split(out.String(), "\n") {
			if strings.HasPrefix(l, "| "+e.label) {
				lines = append(lines, l)
			}
		}
		if len(lines) != 2 {
			t.Fatalf("%s: %d lines in the table, want 2:\n%s", name, len(lines), out.String())
		}
		for _, l := range lines {
			f := strings.Split(l, "|")
			if rate := strings.TrimSpace(f[6]); rate == "0" || rate == "" {
				t.Errorf("%s: no jobs done: %s", name, l)
			}
		}
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
