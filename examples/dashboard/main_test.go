package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRun (issue 23): the example serves the dashboard and the metrics at
// the URL it prints, while its workers make jobs that die: the dead count
// rises, the page lists them, and the metrics count them; it returns when
// its context ends.
func TestRun(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	urls := make(chan string, 1)
	done := make(chan error, 1)
	o := options{addr: "127.0.0.1:0", db: filepath.Join(t.TempDir(), "jobs.db"), workers: 4, every: 5 * time.Millisecond, fail: 0.6, attempts: 2}
	go func() { done <- run(ctx, o, func(u string) { urls <- u }) }()
	var base string
	select {
	case base = <-urls:
	case err := <-done:
		t.Fatal(err)
	}
	get := func(path string) string {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s = %d: %s", path, resp.StatusCode, b)
		}
		return string(b)
	}
	for deadline := time.Now().Add(time.Minute); ; {
		var body struct {
			Queues []struct {
				Dead *int64 `json:"dead"`
			} `json:"queues"`
		}
		if err := json.Unmarshal([]byte(get("api/queues")), &body); err != nil {
			t.Fatal(err)
		}
		if len(body.Queues) == 1 && body.Queues[0].Dead != nil && *body.Queues[0].Dead > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no job died within a minute")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if page := get(""); !strings.Contains(page, `class="inline requeue"`) {
		t.Errorf("the page lists no dead job to requeue")
	}
	if m := get("metrics"); !strings.Contains(m, `inbox_jobs{queue="jobs",state="dead"}`) || !strings.Contains(m, `inbox_worker_ended_total{queue="jobs",outcome="dead"}`) {
		t.Errorf("metrics lack the dead jobs:\n%s", m)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("run = %v, want context.Canceled", err)
	}
}
