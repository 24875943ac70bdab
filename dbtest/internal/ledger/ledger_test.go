package ledger

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// write makes a ledger file holding text and returns its proc.
func write(t *testing.T, name, text string, killed bool) Proc {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return Proc{Name: name, Path: p, Killed: killed}
}

func TestWriter(t *testing.T) {
	p := filepath.Join(t.TempDir(), "l")
	w, err := Create(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range []string{OpClaim, OpAck, OpAcked} {
		if err := w.Write(op, 7, 2); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(p)
	if want := "claim 7 2\nack 7 2\nacked 7 2\n"; string(got) != want {
		t.Fatalf("ledger = %q, want %q", got, want)
	}
}

func TestCheck(t *testing.T) {
	clean := "claim 1 1\nack 1 1\nacked 1 1\nclaim 2 1\nack 2 1\nacked 2 1\n"
	cases := []struct {
		name  string
		rule  Rule
		procs func(t *testing.T) []Proc
		jobs  int64
		want  string // a violation containing this, or "" for none
		check func(t *testing.T, r Report)
	}{
		{name: "clean", rule: SpendAttempt, jobs: 2,
			procs: func(t *testing.T) []Proc { return []Proc{write(t, "a", clean, false)} },
			check: func(t *testing.T, r Report) {
				if r.Deliveries != 2 || r.Acked != 2 || r.Duplicates != 0 {
					t.Errorf("report %+v", r)
				}
			}},
		{name: "lost", rule: SpendAttempt, jobs: 3, want: "job 3 lost",
			procs: func(t *testing.T) []Proc { return []Proc{write(t, "a", clean, false)} },
			check: func(t *testing.T, r Report) {
				if r.Lost != 1 {
					t.Errorf("Lost = %d, want 1", r.Lost)
				}
			}},
		{name: "claimed never acked", rule: SpendAttempt, jobs: 1, want: "job 1 lost",
			procs: func(t *testing.T) []Proc { return []Proc{write(t, "a", "claim 1 1\n", true)} }},
		{name: "duplicate without kill", rule: SpendAttempt, jobs: 1, want: "was not killed",
			procs: func(t *testing.T) []Proc {
				return []Proc{write(t, "a", "claim 1 1\n", false), write(t, "b", "claim 1 2\nack 1 2\nacked 1 2\n", false)}
			}},
		{name: "duplicate after kill", rule: SpendAttempt, jobs: 1,
			procs: func(t *testing.T) []Proc {
				return []Proc{write(t, "a", "claim 1 1\n", true), write(t, "b", "claim 1 2\nack 1 2\nacked 1 2\n", false)}
			},
			check: func(t *testing.T, r Report) {
				if r.Duplicates != 1 || r.AttemptGaps != 0 || r.KilledInWork != 1 {
					t.Errorf("report %+v", r)
				}
			}},
		{name: "killed between deliveries", rule: SpendAttempt, jobs: 2,
			procs: func(t *testing.T) []Proc { return []Proc{write(t, "a", clean, true)} },
			check: func(t *testing.T, r Report) {
				if r.KilledInWork != 0 || r.Acked != 2 {
					t.Errorf("report %+v", r)
				}
			}},
		{name: "delivered again after ack", rule: SpendAttempt, jobs: 1, want: "acknowledged twice",
			procs: func(t *testing.T) []Proc {
				return []Proc{write(t, "a", "claim 1 1\nack 1 1\nacked 1 1\n", true), write(t, "b", "claim 1 2\nack 1 2\nacked 1 2\n", false)}
			}},
		{name: "attempt not spent", rule: SpendAttempt, jobs: 1, want: "delivered twice with attempt 1",
			procs: func(t *testing.T) []Proc {
				return []Proc{write(t, "a", "claim 1 1\n", true), write(t, "b", "claim 1 1\nack 1 1\nacked 1 1\n", false)}
			}},
		{name: "attempt spent under row lock", rule: KeepAttempt, jobs: 1, want: "spends no attempt",
			procs: func(t *testing.T) []Proc {
				return []Proc{write(t, "a", "claim 1 1\n", true), write(t, "b", "claim 1 2\nack 1 2\nacked 1 2\n", false)}
			}},
		{name: "row lock kill", rule: KeepAttempt, jobs: 1,
			procs: func(t *testing.T) []Proc {
				return []Proc{write(t, "a", "claim 1 1\nack 1 1\n", true), write(t, "b", "claim 1 1\nack 1 1\nacked 1 1\n", false)}
			}},
		{name: "gap", rule: SpendAttempt, jobs: 1,
			procs: func(t *testing.T) []Proc { return []Proc{write(t, "b", "claim 1 3\nack 1 3\nacked 1 3\n", false)} },
			check: func(t *testing.T, r Report) {
				if r.AttemptGaps != 2 || r.MaxAttempt != 3 {
					t.Errorf("report %+v", r)
				}
			}},
		{name: "unrecorded ack", rule: SpendAttempt, jobs: 1,
			procs: func(t *testing.T) []Proc { return []Proc{write(t, "a", "claim 1 1\nack 1 1\nacked 1", true)} },
			check: func(t *testing.T, r Report) {
				if r.UnrecordedAcks != 1 || len(r.Violations) != 0 {
					t.Errorf("report %+v", r)
				}
			}},
		{name: "cut line in a live process", rule: SpendAttempt, jobs: 1, want: "unterminated",
			procs: func(t *testing.T) []Proc { return []Proc{write(t, "a", "claim 1 1\nack 1 1\nacked 1 1\ncla", false)} }},
		{name: "stranger", rule: SpendAttempt, jobs: 1, want: "unexpected delivery of job 9",
			procs: func(t *testing.T) []Proc {
				return []Proc{write(t, "a", "claim 1 1\nack 1 1\nacked 1 1\nclaim 9 1\n", false)}
			}},
		{name: "ack of a job not in work", rule: SpendAttempt, jobs: 1, want: "did not have in work",
			procs: func(t *testing.T) []Proc { return []Proc{write(t, "a", "acked 1 1\n", false)} }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := Check(c.procs(t), c.jobs, c.rule)
			if err != nil {
				t.Fatal(err)
			}
			all := strings.Join(r.Violations, "\n")
			switch {
			case c.want == "" && len(r.Violations) > 0:
				t.Errorf("unexpected violations:\n%s", all)
			case c.want != "" && !strings.Contains(all, c.want):
				t.Errorf("violations %q, want one containing %q", r.Violations, c.want)
			}
			if c.check != nil {
				c.check(t, r)
			}
		})
	}
}
