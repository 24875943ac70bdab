package galera

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/sqlinbox/inbox/dbtest/internal/ledger"
)

// ledgerProc is one worker process of a run, for check.
type ledgerProc struct {
	Name   string
	Path   string
	Victim bool // on the node that was killed
}

// report is what check found in the ledgers of one table.
type report struct {
	Jobs       int
	Deliveries int
	Acked      int // jobs with an acked delivery
	// UnknownAcks counts jobs that no delivery recorded as acknowledged but
	// whose acknowledgement was in flight on the killed node ("ack", then
	// "nodefail"): it committed on the cluster before the node died. The
	// caller proves it from the effects table.
	UnknownAcks int
	Lost        int
	// Duplicates counts deliveries beyond the first of each job, and the
	// By fields how the deliveries that did not settle their job ended.
	Duplicates int
	ByConflict int // 1213: a certification failure or brute-force abort
	ByNode     int // the node died under it
	ByLost     int // lease lost, on the killed node
	// Concurrent counts deliveries of a job claimed in a process whose
	// ledger still had it in work. On Galera a row-lock delivery whose
	// transaction lost to another node's commit (a certification failure
	// or a brute-force abort) frees the row on its own node too, and the
	// winner's delete may not be applied there yet: the row is claimable
	// again before the loser's handler wrote its ending, or noticed.
	Concurrent int
	// AttemptGaps counts attempts spent by claims no ledger recorded (lease
	// claims that committed on a node that died before answering).
	AttemptGaps int
	GapJobs     []int64 // the first few jobs with a gap, for the log
	// ConflictJobs are the first few jobs with a delivery ended by a
	// conflict, for the log.
	ConflictJobs []int64
	MaxAttempt   int
	// Final maps each settled job to the attempt of the delivery that
	// settled it.
	Final      map[int64]int
	Violations []string
}

type delivery struct {
	proc    int
	attempt int
	acking  bool   // wrote "ack"
	end     string // acked, conflict, nodefail, lost; "" while open
}

// check reads the ledgers of one table's workers for the jobs 1..jobs, all
// of which must be gone from the table (the caller checks every node), and
// checks the rules of a cluster run: each job acknowledged by exactly one
// delivery; every other delivery ended by a certification conflict, or by
// the death of its node (nodefail, or a lease lost there); no delivery left
// open by a process that was asked to stop; attempts as rule says (row
// lock: never spent, as every ending rolls the claim back; lease: spent by
// every delivery, the acknowledged one the last).
func check(procs []ledgerProc, jobs int64, rule ledger.Rule) (report, error) {
	r := report{Jobs: int(jobs), Final: make(map[int64]int, jobs)}
	byID := make(map[int64][]*delivery, jobs)
	violate := func(format string, args ...any) {
		if len(r.Violations) < 50 {
			r.Violations = append(r.Violations, fmt.Sprintf(format, args...))
		} else if len(r.Violations) == 50 {
			r.Violations = append(r.Violations, "… more violations left out")
		}
	}
	for pi, p := range procs {
		data, err := os.ReadFile(p.Path)
		if err != nil {
			return r, err
		}
		text := string(data)
		if i := strings.LastIndexByte(text, '\n'); i+1 < len(text) {
			violate("%s: unterminated last line %q: no worker is killed", p.Name, text[i+1:])
			text = text[:i+1]
		}
		// open holds this process's deliveries of each job not yet ended:
		// more than one after a lost row lock (see report.Concurrent).
		open := map[int64][]*delivery{}
		sc := bufio.NewScanner(strings.NewReader(text))
		for ln := 1; sc.Scan(); ln++ {
			f := strings.Fields(sc.Text())
			if len(f) != 3 {
				violate("%s:%d: malformed line %q", p.Name, ln, sc.Text())
				continue
			}
			id, err1 := strconv.ParseInt(f[1], 10, 64)
			att, err2 := strconv.Atoi(f[2])
			if err1 != nil || err2 != nil || id < 1 || id > jobs {
				violate("%s:%d: malformed line or unexpected job %q", p.Name, ln, sc.Text())
				continue
			}
			op := f[0]
			if op == ledger.OpClaim {
				if len(open[id]) > 0 {
					r.Concurrent++
				}
				d := &delivery{proc: pi, attempt: att}
				open[id] = append(open[id], d)
				byID[id] = append(byID[id], d)
				r.Deliveries++
				r.MaxAttempt = max(r.MaxAttempt, att)
				continue
			}
			// The delivery the line is about: of its attempt, not yet
			// acknowledging for "ack", acknowledging for "acked".
			i := slices.IndexFunc(open[id], func(d *delivery) bool {
				switch op {
				case ledger.OpAck:
					return d.attempt == att && !d.acking
				case ledger.OpAcked:
					return d.attempt == att && d.acking
				}
				return d.attempt == att
			})
			if i < 0 {
				violate("%s:%d: %s of job %d attempt %d, which this process did not have in work", p.Name, ln, op, id, att)
				continue
			}
			d := open[id][i]
			switch op {
			case ledger.OpAck:
				d.acking = true
				continue
			case ledger.OpAcked, opConflict:
			case opNodeFail, opLost:
				if !p.Victim {
					violate("%s:%d: job %d attempt %d ended %q on a node that was not killed", p.Name, ln, id, att, op)
				}
			default:
				violate("%s:%d: unknown operation %q", p.Name, ln, op)
				continue
			}
			d.end = op
			if open[id] = slices.Delete(open[id], i, i+1); len(open[id]) == 0 {
				delete(open, id)
			}
		}
		if err := sc.Err(); err != nil {
			return r, err
		}
		for id, ds := range open {
			for _, d := range ds {
				violate("%s: job %d attempt %d still in work when the process stopped", p.Name, id, d.attempt)
			}
		}
	}
	for id := int64(1); id <= jobs; id++ {
		ds := byID[id]
		r.Duplicates += max(len(ds)-1, 0)
		var final *delivery
		for _, d := range ds {
			if d.end == ledger.OpAcked {
				if final != nil {
					violate("job %d acknowledged twice (%s attempt %d and %s attempt %d)", id,
						procs[final.proc].Name, final.attempt, procs[d.proc].Name, d.attempt)
				}
				final = d
			}
		}
		switch {
		case final != nil:
			r.Acked++
		default:
			// An acknowledgement in flight when its node died; the latest
			// such delivery if several.
			for _, d := range ds {
				if d.acking && d.end == opNodeFail && procs[d.proc].Victim && (final == nil || d.attempt > final.attempt) {
					final = d
				}
			}
			if final == nil {
				r.Lost++
				violate("job %d lost: no delivery acknowledged it (%d deliveries)", id, len(ds))
				continue
			}
			r.UnknownAcks++
		}
		r.Final[id] = final.attempt
		for _, d := range ds {
			if d == final {
				continue
			}
			switch d.end {
			case opConflict:
				r.ByConflict++
				if len(r.ConflictJobs) < 5 && !slices.Contains(r.ConflictJobs, id) {
					r.ConflictJobs = append(r.ConflictJobs, id)
				}
			case opNodeFail:
				r.ByNode++
			case opLost:
				r.ByLost++
			}
		}
		atts := make([]int, len(ds))
		for i, d := range ds {
			atts[i] = d.attempt
		}
		sort.Ints(atts)
		switch rule {
		case ledger.KeepAttempt:
			for _, a := range atts {
				if a != 1 {
					violate("job %d delivered with attempt %d: under the row lock no ending spends an attempt", id, a)
					break
				}
			}
		case ledger.SpendAttempt:
			for i := 1; i < len(atts); i++ {
				if atts[i] == atts[i-1] {
					violate("job %d delivered twice with attempt %d: every lease claim spends one", id, atts[i])
				}
			}
			if last := atts[len(atts)-1]; final.attempt != last {
				violate("job %d settled by attempt %d although attempt %d was delivered", id, final.attempt, last)
			}
			if gap := final.attempt - len(ds); gap < 0 {
				violate("job %d settled by attempt %d after %d deliveries: an attempt was not spent", id, final.attempt, len(ds))
			} else if gap > 0 {
				r.AttemptGaps += gap
				if len(r.GapJobs) < 5 {
					r.GapJobs = append(r.GapJobs, id)
				}
			}
		}
	}
	return r, nil
}

// TestCheckFinds shows that check passes a run whose duplicates are all
// explained and reports each rule broken.
func TestCheckFinds(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := dir + "/" + name
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct {
		name   string
		rule   ledger.Rule
		a, b   string // a's and b's ledgers; b is on the killed node
		jobs   int64
		want   string // a violation containing this, or "" for none
		report func(r report) string
	}{
		{name: "explained", rule: ledger.KeepAttempt, jobs: 3,
			a: "claim 1 1\nack 1 1\nacked 1 1\nclaim 2 1\nack 2 1\nconflict 2 1\nclaim 3 1\nack 3 1\nacked 3 1\n",
			b: "claim 2 1\nack 2 1\nacked 2 1\nclaim 3 1\nnodefail 3 1\n",
			report: func(r report) string {
				if r.Duplicates != 2 || r.ByConflict != 1 || r.ByNode != 1 || r.Acked != 3 {
					return fmt.Sprintf("%+v", r)
				}
				return ""
			}},
		{name: "unknown ack", rule: ledger.SpendAttempt, jobs: 1,
			a: "", b: "claim 1 1\nack 1 1\nnodefail 1 1\n",
			report: func(r report) string {
				if r.UnknownAcks != 1 || r.Final[1] != 1 {
					return fmt.Sprintf("%+v", r)
				}
				return ""
			}},
		{name: "lease gap", rule: ledger.SpendAttempt, jobs: 1,
			a: "claim 1 3\nack 1 3\nacked 1 3\n", b: "claim 1 1\nnodefail 1 1\n",
			report: func(r report) string {
				if r.AttemptGaps != 1 || r.ByNode != 1 {
					return fmt.Sprintf("%+v", r)
				}
				return ""
			}},
		{name: "lost", rule: ledger.KeepAttempt, jobs: 2, a: "claim 1 1\nack 1 1\nacked 1 1\nclaim 2 1\nconflict 2 1\n", b: "",
			want: "job 2 lost"},
		{name: "twice", rule: ledger.KeepAttempt, jobs: 1, a: "claim 1 1\nack 1 1\nacked 1 1\n", b: "claim 1 1\nack 1 1\nacked 1 1\n",
			want: "acknowledged twice"},
		{name: "nodefail on a live node", rule: ledger.KeepAttempt, jobs: 1,
			a: "claim 1 1\nnodefail 1 1\n", b: "claim 1 1\nack 1 1\nacked 1 1\n", want: "on a node that was not killed"},
		{name: "same process", rule: ledger.KeepAttempt, jobs: 1,
			a: "claim 1 1\nclaim 1 1\nack 1 1\nacked 1 1\nconflict 1 1\n", b: "",
			report: func(r report) string {
				if r.Concurrent != 1 || r.ByConflict != 1 || r.Acked != 1 {
					return fmt.Sprintf("%+v", r)
				}
				return ""
			}},
		{name: "open", rule: ledger.KeepAttempt, jobs: 1, a: "claim 1 1\n", b: "claim 1 1\nack 1 1\nacked 1 1\n",
			want: "still in work"},
		{name: "row lock attempt", rule: ledger.KeepAttempt, jobs: 1, a: "claim 1 2\nack 1 2\nacked 1 2\n", b: "",
			want: "no ending spends an attempt"},
		{name: "lease attempt reused", rule: ledger.SpendAttempt, jobs: 1,
			a: "claim 1 1\nconflict 1 1\n", b: "claim 1 1\nack 1 1\nacked 1 1\n", want: "delivered twice with attempt 1"},
		{name: "unterminated", rule: ledger.KeepAttempt, jobs: 1, a: "claim 1 1\nack 1 1\nacked 1 1\ncla", b: "",
			want: "unterminated"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			procs := []ledgerProc{
				{Name: "a", Path: write(c.name+".a", c.a)},
				{Name: "b", Path: write(c.name+".b", c.b), Victim: true},
			}
			r, err := check(procs, c.jobs, c.rule)
			if err != nil {
				t.Fatal(err)
			}
			if c.want == "" {
				if len(r.Violations) > 0 {
					t.Errorf("violations: %q", r.Violations)
				}
				if msg := c.report(r); msg != "" {
					t.Errorf("report: %s", msg)
				}
				return
			}
			for _, v := range r.Violations {
				if strings.Contains(v, c.want) {
					return
				}
			}
			t.Errorf("no violation mentioning %q; got %q", c.want, r.Violations)
		})
	}
}

// trail returns every ledger line about job id, for a log.
func trail(procs []ledgerProc, id int64) string {
	var b strings.Builder
	want := strconv.FormatInt(id, 10)
	for _, p := range procs {
		data, _ := os.ReadFile(p.Path)
		for _, l := range strings.Split(string(data), "\n") {
			if f := strings.Fields(l); len(f) == 3 && f[1] == want {
				b.WriteString("  " + p.Name + ": " + l + "\n")
			}
		}
	}
	return b.String()
}
