package main

// The CI check of -run enqueue: the mode runs at a tiny size through the
// program's own command line on one driver per engine family (and River on
// pgx), and prints a line whose every rate is above zero. Speed is not
// looked at.

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

func TestEnqueueRun(t *testing.T) {
	defer func(prefix, schema string, jobs int) { enqueuePrefix, riverSchema, enqueueJobs = prefix, schema, jobs }(enqueuePrefix, riverSchema, enqueueJobs)
	enqueuePrefix, riverSchema, enqueueJobs = "bench_ci_enq_", "river_bench_ci_enq", 50
	for _, name := range []string{"pgx", "mysql", "mattn"} {
		t.Run(name, func(t *testing.T) {
			e := needEngine(t, name)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var out, log bytes.Buffer
			o := options{run: "enqueue", engines: name, duration: 100 * time.Millisecond, segments: 2}
			if err := run(ctx, &out, &log, o); err != nil {
				t.Fatalf("%v\n%s", err, log.String())
			}
			var line string
			for _, l := range strings.Split(out.String(), "\n") {
				if strings.HasPrefix(l, "| "+e.family+" | "+e.label+" |") {
					line = l
				}
			}
			f := strings.Split(line, "|")
			rates := []int{3, 4} // the loop's, EnqueueMany's
			if name == "pgx" {
				rates = append(rates, 6, 8) // River's two
			}
			if len(f) < 10 {
				t.Fatalf("no line for %s in:\n%s", name, out.String())
			}
			for _, i := range rates {
				if r := strings.TrimSpace(f[i]); r == "" || r == "0" {
					t.Errorf("column %d empty: %s\n%s", i, line, log.String())
				}
			}
		})
	}
}
