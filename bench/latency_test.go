package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// TestLatencyWakeModes: the in-process wake-up lines, the lease's (on the
// recommended description, beside another queue running flat out, and on a
// shallow one) and the row lock's, each measure every sample on a real
// server.
func TestLatencyWakeModes(t *testing.T) {
	e := needEngine(t, "pgx")
	defer func(m string, n int) { latencyModes, latencySamples = m, n }(latencyModes, latencySamples)
	latencyModes, latencySamples = "wake,wake-loaded,wake-shallow,wake-rowlock", 5
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := runLatency(ctx, &out, io.Discard, []engine{e}, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(l, "| postgres") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 4 || strings.Contains(lines[0], "row lock") || !strings.Contains(lines[1], "8 workers draining another table") ||
		!strings.Contains(lines[2], "shallow lease") || !strings.Contains(lines[3], "row lock") {
		t.Fatalf("want a lease line, a loaded lease line, a shallow lease line, then a row-lock line:\n%s", out.String())
	}
	for _, l := range lines {
		if f := strings.Split(l, "|"); strings.TrimSpace(f[4]) != "5" {
			t.Errorf("want 5 samples: %s", l)
		}
	}
}
