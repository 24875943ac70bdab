package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestMain lets the test binary play the worker process that run re-executes
// and kills, as the example's own binary does under `go run`.
func TestMain(m *testing.M) {
	if os.Getenv(envChild) != "" {
		os.Exit(child())
	}
	os.Exit(m.Run())
}

// syncBuffer is a buffer the example's goroutines may share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// TestReport runs the example as `go run ./examples/report` does, with its
// default lease and render time, and checks the story it prints: a worker
// process killed mid-report, its report back with attempt 2, leases extended
// while reports render longer than the lease, every report acked once.
func TestReport(t *testing.T) {
	o := defaultOptions()
	o.db = filepath.Join(t.TempDir(), "reports.db")
	var out syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := run(ctx, &out, o)
	text := out.b.String()
	t.Logf("output:\n%s", text)
	if err != nil {
		t.Fatalf("run: %v", err)
	}

	// The worker process claimed report 1 and was killed holding it.
	if !regexp.MustCompile(`(?m)^\S+ +pid \d+ +claimed report 1 \(Q1 sales\), attempt 1,`).MatchString(text) {
		t.Error("no worker process claimed report 1 with attempt 1")
	}
	kill := strings.Index(text, "CRASH: killed pid")
	if kill < 0 {
		t.Fatal("no crash in the output")
	}
	back := regexp.MustCompile(`(?m)^\S+ +worker \d +claimed report 1 \(Q1 sales\), attempt 2,.*lost attempt`).FindStringIndex(text)
	if back == nil {
		t.Fatal("report 1 never came back with attempt 2")
	}
	if back[0] < kill {
		t.Error("report 1 came back before its worker was killed")
	}
	for _, id := range []string{"1", "2", "3"} {
		acks := regexp.MustCompile(`(?m)^\S+ +worker \d +report `+id+` rendered .*, acked$`).FindAllString(text, -1)
		if len(acks) != 1 {
			t.Errorf("report %s acked %d times in the output, want once", id, len(acks))
		}
	}
	// Every report renders for 2.5 leases: its keeper must have extended it.
	if n := len(regexp.MustCompile(`keeper extended the lease`).FindAllString(text, -1)); n < 3 {
		t.Errorf("%d lease extensions shown, want at least one per report", n)
	}
	// A live worker losing a lease would take a stall of 0.4 s on this
	// machine; the example copes (the report comes back and is acked once,
	// as checked above), so it is reported, not failed.
	if strings.Contains(text, "lease lost") {
		t.Log("a live worker lost its lease: the machine stalled the keeper")
	}
}
