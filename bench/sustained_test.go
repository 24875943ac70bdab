package main

// The CI check of -run sustained: a short run on PostgreSQL enqueues,
// claims and acknowledges in every window, and reports ten windows. Speed
// is not looked at.

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

func TestSustainedRun(t *testing.T) {
	e := needEngine(t, "pgx")
	defer func(d, v time.Duration, w int, h bool) {
		sustainFor, sustainVacuum, sustainWorkers, sustainHold = d, v, w, h
	}(sustainFor, sustainVacuum, sustainWorkers, sustainHold)
	sustainFor, sustainVacuum, sustainWorkers, sustainHold = 3*time.Second, time.Second, 2, true
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := runSustained(ctx, &out, io.Discard, []engine{e}, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	var rows []string
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(l, "| ") && !strings.HasPrefix(l, "| window") {
			rows = append(rows, l)
		}
	}
	if len(rows) != sustainWindows {
		t.Fatalf("%d windows reported, want %d:\n%s", len(rows), sustainWindows, out.String())
	}
	acked := 0
	for _, r := range rows {
		if !strings.HasPrefix(strings.Fields(r)[3], "0") {
			acked++
		}
	}
	// A loaded machine may starve a window; most must see work.
	if acked < sustainWindows/2 {
		t.Fatalf("only %d of %d windows acknowledged jobs:\n%s", acked, sustainWindows, out.String())
	}
	t.Log(out.String())
}
