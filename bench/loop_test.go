package main

// The CI check of -run work's Work side, as TestDrain checks the table's:
// Work loops drain a small table of each form on one driver per engine
// family, every job handled and none left. Speed is not looked at.

import (
	"context"
	"os"
	"testing"
	"time"
)

func TestWorkDrain(t *testing.T) {
	for _, name := range []string{"pq", "mysql", "mattn"} {
		e, err := engineNamed(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(name, func(t *testing.T) {
			if e.env != "" && os.Getenv(e.env) == "" {
				if os.Getenv("INBOX_REQUIRE_DBS") == "1" {
					t.Fatalf("%s is not set and INBOX_REQUIRE_DBS=1", e.env)
				}
				t.Skipf("%s is not set: skipping %s (set INBOX_REQUIRE_DBS=1 to make this a failure)", e.env, name)
			}
			for _, form := range loopForms {
				if !contains(e.forms(), form) {
					continue
				}
				for _, batch := range []int{1, 16} {
					c := cell{e: e, form: form, workers: 4, batch: batch}
					t.Run(c.String()[len(name)+1:], func(t *testing.T) {
						ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
						defer cancel()
						db, err := e.open(t.TempDir(), c.conns())
						if err != nil {
							t.Fatal(err)
						}
						defer db.Close()
						table := "bench_ci_work_" + e.name
						if err := e.createTable(ctx, db, table); err != nil {
							t.Fatal(err)
						}
						defer e.drop(context.Background(), db, table)
						const jobs = 150
						done, left, err := workDrain(ctx, c, db, table, jobs)
						if err != nil {
							t.Fatal(err)
						}
						if done != jobs || left != 0 {
							t.Fatalf("%d of %d jobs handled, %d rows left", done, jobs, left)
						}
					})
				}
			}
		})
	}
}
