package main

// The CI check of -run sustained: a short run of every form on every engine
// family enqueues, claims and acknowledges in most windows without an
// error, and reports ten windows with what stands for dead rows read. Speed
// is not looked at.

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestSustainedRun(t *testing.T) {
	defer func(d, v time.Duration, w int, h bool, f []string) {
		sustainFor, sustainVacuum, sustainWorkers, sustainHold, sustainForms = d, v, w, h, f
	}(sustainFor, sustainVacuum, sustainWorkers, sustainHold, sustainForms)
	sustainFor, sustainVacuum, sustainWorkers = 3*time.Second, time.Second, 2
	// lease-async is taken as lease, and the repeat dropped.
	sustainForms = []string{"lease", "lease-async", "rowlock", "advisory"}
	for _, c := range []struct {
		engine string
		hold   bool
	}{
		{"pgx", true}, {"pq", false}, {"mysql", true}, {"mattn", true}, {"modernc", false},
	} {
		t.Run(c.engine, func(t *testing.T) {
			e := needEngine(t, c.engine)
			sustainHold = c.hold
			var out, log bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			if err := runSustained(ctx, &out, &log, []engine{e}, t.TempDir()); err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			want := []string{"Lease", "Row-lock", "Advisory"}
			if e.family == "sqlite" {
				want = []string{"Lease", "Advisory"}
				if !strings.Contains(log.String(), "no rowlock form on sqlite, skipped") {
					t.Errorf("the skipped row lock is not said:\n%s", log.String())
				}
			}
			blocks := sustainedBlocks(t, out.String())
			if len(blocks) != len(want) {
				t.Fatalf("%d runs reported, want %d:\n%s", len(blocks), len(want), out.String())
			}
			for i, b := range blocks {
				if heading := want[i] + " form on " + e.name + " ("; !strings.HasPrefix(b.heading, heading) {
					t.Errorf("heading %q, want it to begin %q", b.heading, heading)
				}
				checkSustainedBlock(t, e, c.hold, b, out.String())
			}
			t.Log(out.String())
		})
	}
}

// sustainedBlock is one run of the output: its heading, its window rows
// split into cells, and its last-over-first line.
type sustainedBlock struct {
	heading string
	rows    [][]string
	last    string
}

func sustainedBlocks(t *testing.T, out string) []sustainedBlock {
	var bs []sustainedBlock
	for _, l := range strings.Split(out, "\n") {
		switch {
		case strings.Contains(l, " form on "):
			bs = append(bs, sustainedBlock{heading: l})
		case len(bs) == 0:
			t.Fatalf("a line before any heading: %q", l)
		case strings.HasPrefix(l, "| ") && !strings.HasPrefix(l, "| window"):
			var cells []string
			for _, c := range strings.Split(strings.Trim(l, "| "), "|") {
				cells = append(cells, strings.TrimSpace(c))
			}
			bs[len(bs)-1].rows = append(bs[len(bs)-1].rows, cells)
		case strings.HasPrefix(l, "Last window over first"):
			bs[len(bs)-1].last = l
		case strings.HasPrefix(l, "Claims or acks failed"):
			t.Errorf("%s", l)
		}
	}
	return bs
}

func checkSustainedBlock(t *testing.T, e engine, hold bool, b sustainedBlock, out string) {
	t.Helper()
	if len(b.rows) != sustainWindows || b.last == "" {
		t.Fatalf("%s: %d windows reported, want %d, and the last-over-first line %q:\n%s", b.heading, len(b.rows), sustainWindows, b.last, out)
	}
	acked := 0
	var dead []int64
	for _, r := range b.rows {
		if len(r) != 7 {
			t.Fatalf("%s: row %q has %d cells, want 7", b.heading, r, len(r))
		}
		if n, err := strconv.Atoi(r[1]); err != nil {
			t.Fatalf("%s: acknowledged jobs/s %q: %v", b.heading, r[1], err)
		} else if n > 0 {
			acked++
		}
		// What stands for dead rows is read on every engine.
		d, err := strconv.ParseInt(r[5], 10, 64)
		if err != nil {
			t.Fatalf("%s: dead rows %q unread: %v", b.heading, r[5], err)
		}
		dead = append(dead, d)
		if (e.family == "postgres") != (r[6] != "-") {
			t.Errorf("%s: vacuums %q", b.heading, r[6])
		}
	}
	// A loaded machine may starve a window; most must see work.
	if acked < sustainWindows/2 {
		t.Fatalf("%s: only %d of %d windows acknowledged jobs:\n%s", b.heading, acked, sustainWindows, out)
	}
	last := dead[len(dead)-1]
	switch {
	case hold && e.family == "mysql" && last == 0:
		// Every commit since the held read view is history purge may not
		// remove: acknowledged jobs make it longer than nothing.
		t.Errorf("%s: history list length 0 at the end with a read view held", b.heading)
	case hold && e.family == "sqlite" && last == 0:
		// Every write since the held read is in the WAL, which no
		// checkpoint may reset.
		t.Errorf("%s: an empty WAL at the end with a read transaction held", b.heading)
	}
}
