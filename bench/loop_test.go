package main

// The CI check of -run work's Work side, as TestDrain checks the table's:
// Work loops drain a small table of each form on one driver per engine
// family, every job handled and none left. Speed is not looked at.

import (
	"context"
	"database/sql"
	"testing"
)

func TestWorkDrain(t *testing.T) {
	forms := func(e engine) []string {
		var out []string
		for _, form := range loopForms {
			if contains(e.forms(), form) {
				out = append(out, form)
			}
		}
		return out
	}
	eachCell(t, "bench_ci_work_", 4, forms, func(ctx context.Context, t *testing.T, c cell, db *sql.DB, table string) {
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
