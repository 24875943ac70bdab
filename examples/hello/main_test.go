package main

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// TestHello runs the README's quick start: it returns, once its three jobs
// are handled, well within a minute.
func TestHello(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, filepath.Join(t.TempDir(), "jobs.db")); err != nil {
		t.Fatal(err)
	}
	if ctx.Err() != nil {
		t.Fatal("the quick start ran until its deadline: the workers did not return once the jobs were handled")
	}
}
