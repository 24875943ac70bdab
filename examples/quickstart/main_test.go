package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is a buffer the workers' logger and run may share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// TestQuickstart runs the quick start: two reports acked on their first
// attempt, the broken one retried until its last attempt and moved to the
// dead table.
func TestQuickstart(t *testing.T) {
	t.Run("loop", func(t *testing.T) { quickstart(t, run) })
	t.Run("own loop", func(t *testing.T) {
		quickstart(t, func(ctx context.Context, w io.Writer) error { return runWith(ctx, w, work) })
	})
}

func quickstart(t *testing.T, run func(context.Context, io.Writer) error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out lockedBuffer
	err := run(ctx, &out)
	text := out.b.String()
	t.Logf("output:\n%s", text)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"report 1, attempt 1: acked\n",
		"report 2, attempt 1: acked\n",
		"report 3, attempt 1: retry: the data source is down\n",
		"report 3, attempt 2: retry: the data source is down\n",
		"report 3, attempt 3: dead: the data source is down\n",
		"queue empty; 1 report in report_jobs_dead, after attempt 3\n",
	} {
		if strings.Count(text, want) != 1 {
			t.Errorf("output holds %q %d times, want once", want, strings.Count(text, want))
		}
	}
}
