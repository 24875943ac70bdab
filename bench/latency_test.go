package main

import (
	"bytes"
	"context"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestLatencyWakeModes: the in-process wake-up lines, the lease's (on the
// recommended description, beside another queue running flat out, and on a
// shallow one) and the row lock's, and the bare round trip under the same
// load and a committed write under it, each measure every sample on a real
// server.
func TestLatencyWakeModes(t *testing.T) {
	e := needEngine(t, "pgx")
	defer func(m string, n int) { latencyModes, latencySamples = m, n }(latencyModes, latencySamples)
	latencyModes, latencySamples = "wake,wake-loaded,ping-loaded,write-loaded,wake-shallow,wake-rowlock", 5
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := runLatency(ctx, &out, io.Discard, []engine{e}, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	var lines []string
	table, _, _ := strings.Cut(out.String(), "Where the wake-ups' time went")
	for _, l := range strings.Split(table, "\n") {
		if strings.HasPrefix(l, "| postgres") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 6 || strings.Contains(lines[0], "row lock") || !strings.Contains(lines[1], "8 workers draining another table") ||
		!strings.Contains(lines[2], "one round trip (SELECT 1), 8 workers draining") ||
		!strings.Contains(lines[3], "the Enqueue alone (a row written and committed), 8 workers draining") ||
		!strings.Contains(lines[4], "shallow lease") || !strings.Contains(lines[5], "row lock") {
		t.Fatalf("want a lease line, a loaded lease line, a loaded round-trip line, a loaded write line, a shallow lease line, then a row-lock line:\n%s", out.String())
	}
	for _, l := range lines {
		if f := strings.Split(l, "|"); strings.TrimSpace(f[4]) != "5" {
			t.Errorf("want 5 samples: %s", l)
		}
	}
	checkWakeParts(t, out.String())
}

// checkWakeParts checks the split of the four lines' wake-ups on
// PostgreSQL: two rows a line (all five samples, the slowest one), each
// with the claim's statements in it; the lease's claim is one statement
// outside a transaction, the row lock's begins one and keeps it open past
// the handler's start.
func checkWakeParts(t *testing.T, out string) {
	t.Helper()
	_, parts, ok := strings.Cut(out, "Where the wake-ups' time went")
	if !ok {
		t.Fatalf("no split of the wake-ups' time:\n%s", out)
	}
	var rows [][]string
	for _, l := range strings.Split(parts, "\n") {
		if strings.HasPrefix(l, "| postgres") {
			rows = append(rows, strings.Split(l, "|"))
		}
	}
	if len(rows) != 8 {
		t.Fatalf("want 8 rows of the split, got %d:\n%s", len(rows), parts)
	}
	for i, f := range rows {
		which, rowlock := strings.TrimSpace(f[3]), strings.Contains(f[2], "row lock")
		if want := []string{"all 5", "slowest 1"}[i%2]; which != want {
			t.Errorf("row %d is %q, want %q", i, which, want)
		}
		n := make([]float64, 5) // total, outside, BEGIN, statements, COMMIT
		for j := range n {
			v, err := strconv.ParseFloat(strings.TrimSpace(f[4+j]), 64)
			if err != nil {
				t.Fatalf("row %d: %v", i, err)
			}
			n[j] = v
		}
		if n[3] <= 0 || n[0] < n[3] || n[1] < -0.01 {
			t.Errorf("row %d: want the claim's statements inside the total and the rest not below 0: %v", i, f)
		}
		if n[4] != 0 {
			t.Errorf("row %d: a COMMIT before the handler started, where PostgreSQL's claims commit none: %v", i, f)
		}
		if beginAt := n[2] > 0; beginAt != rowlock {
			t.Errorf("row %d: BEGIN %v, want one only in the row lock's claim: %v", i, n[2], f)
		}
	}
}
