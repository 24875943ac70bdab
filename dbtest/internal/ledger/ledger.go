// Package ledger records what a worker process claims and settles, one file
// per process, and checks the records of a whole run against the rules of a
// claim form: no job lost, every duplicate delivery explained by a killed
// process, attempts counted as the form says.
//
// A worker writes each line before it acts on what the line says ("claim"
// before the handler, "ack" before Ack) and "acked" after Ack returned, with
// one write call per line: a SIGKILL loses at most the line being written,
// never one already written, and no fsync is needed because the kernel keeps
// what a killed process wrote.
package ledger

import (
	"bufio"
	"database/sql"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// The operations a ledger line records.
const (
	OpClaim   = "claim"   // the job was delivered with this attempt; the handler starts
	OpAck     = "ack"     // Ack is about to be called
	OpAcked   = "acked"   // Ack returned nil
	OpAckFail = "ackfail" // Ack returned an error
)

// Writer appends lines to one process's ledger. It is safe for concurrent
// use.
type Writer struct {
	mu sync.Mutex
	f  *os.File
}

// Create creates (truncating) the ledger file at path.
func Create(path string) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &Writer{f: f}, nil
}

// Write appends one line, "op id attempt", in a single write call.
func (w *Writer) Write(op string, id int64, attempt int) error {
	line := op + " " + strconv.FormatInt(id, 10) + " " + strconv.Itoa(attempt) + "\n"
	w.mu.Lock()
	defer w.mu.Unlock()
	_, err := w.f.WriteString(line)
	return err
}

// Close closes the file.
func (w *Writer) Close() error { return w.f.Close() }

// Rule is how a form counts attempts across a crash.
type Rule int

const (
	// KeepAttempt: a crash spends no attempt (row lock: the increment rolls
	// back with the held transaction). Every delivery of a job that is never
	// retried carries attempt 1.
	KeepAttempt Rule = iota
	// SpendAttempt: a crash spends one attempt (lease, advisory: the
	// increment is committed at claim).
	SpendAttempt
)

// Proc is one worker process of a run.
type Proc struct {
	Name   string
	Path   string // its ledger file
	Killed bool   // ended by SIGKILL rather than asked to stop
}

// Report is what Check found.
type Report struct {
	Jobs       int // jobs expected
	Deliveries int // claim lines
	Acked      int // jobs with an acked line
	// Lost counts jobs that no delivery acknowledged.
	Lost int
	// Duplicates counts deliveries beyond the first of each job.
	Duplicates int
	// UnrecordedAcks counts jobs whose Ack committed in a process killed
	// before it could write "acked": the last delivery is in a killed
	// process that wrote "ack".
	UnrecordedAcks int
	// AttemptGaps counts attempts spent by claims no ledger recorded: a
	// process killed after the server committed its claim and before the
	// claim line was written (SpendAttempt only).
	AttemptGaps int
	// MaxAttempt is the highest attempt delivered.
	MaxAttempt int
	// AckFails counts ackfail lines.
	AckFails int
	// KilledInWork counts deliveries in work when their process was
	// killed: claimed and not settled by the end of a killed process's
	// ledger. A kill that lands mid-handler makes it positive.
	KilledInWork int
	// Violations lists every broken rule, one sentence each.
	Violations []string
}

type delivery struct {
	proc    int
	attempt int
	acking  bool // wrote "ack"
	acked   bool // wrote "acked"
}

// Check reads the ledgers of procs and checks them for the jobs with ids
// 1..jobs, all of which must be gone from the table (the caller checks the
// table): each job was acknowledged exactly once, every delivery but the one
// that acknowledged it happened in a process that was killed while the job
// was in work, and attempts follow rule.
func Check(procs []Proc, jobs int64, rule Rule) (Report, error) {
	r := Report{Jobs: int(jobs)}
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
			// A line cut short can only be the last one of a killed process.
			if !p.Killed {
				violate("%s: unterminated last line %q in a process that was not killed", p.Name, text[i+1:])
			}
			text = text[:i+1]
		}
		// open maps a job to its delivery in this process not yet finished.
		open := map[int64]*delivery{}
		sc := bufio.NewScanner(strings.NewReader(text))
		for ln := 1; sc.Scan(); ln++ {
			f := strings.Fields(sc.Text())
			if len(f) != 3 {
				violate("%s:%d: malformed line %q", p.Name, ln, sc.Text())
				continue
			}
			id, err1 := strconv.ParseInt(f[1], 10, 64)
			att, err2 := strconv.Atoi(f[2])
			if err1 != nil || err2 != nil {
				violate("%s:%d: malformed line %q", p.Name, ln, sc.Text())
				continue
			}
			if id < 1 || id > jobs {
				violate("%s:%d: unexpected delivery of job %d, not one of the run's", p.Name, ln, id)
				continue
			}
			switch f[0] {
			case OpClaim:
				if open[id] != nil {
					violate("%s:%d: job %d claimed again while this process still had it in work", p.Name, ln, id)
				}
				d := &delivery{proc: pi, attempt: att}
				open[id] = d
				byID[id] = append(byID[id], d)
				r.Deliveries++
				if att > r.MaxAttempt {
					r.MaxAttempt = att
				}
			case OpAck, OpAcked, OpAckFail:
				d := open[id]
				if d == nil || d.attempt != att {
					violate("%s:%d: %s of job %d attempt %d, which this process did not have in work", p.Name, ln, f[0], id, att)
					continue
				}
				switch f[0] {
				case OpAck:
					d.acking = true
				case OpAcked:
					d.acked = true
					delete(open, id)
				case OpAckFail:
					r.AckFails++
					delete(open, id)
				}
			default:
				violate("%s:%d: unknown operation %q", p.Name, ln, f[0])
			}
		}
		if err := sc.Err(); err != nil {
			return r, err
		}
		if p.Killed {
			r.KilledInWork += len(open)
		}
	}
	for id := int64(1); id <= jobs; id++ {
		ds := byID[id]
		if len(ds) > 1 {
			r.Duplicates += len(ds) - 1
		}
		// final is the delivery whose Ack removed the job.
		var final *delivery
		for _, d := range ds {
			if d.acked {
				if final != nil {
					violate("job %d acknowledged twice (%s and %s)", id, procs[final.proc].Name, procs[d.proc].Name)
				}
				final = d
			}
		}
		if final != nil {
			r.Acked++
		} else if final = unrecordedAck(procs, ds); final != nil {
			r.UnrecordedAcks++
		} else {
			r.Lost++
			violate("job %d lost: no delivery acknowledged it (%d deliveries)", id, len(ds))
			continue
		}
		for _, d := range ds {
			if d == final {
				continue
			}
			p := procs[d.proc]
			switch {
			case !p.Killed:
				violate("job %d delivered again although %s, which had it in work, was not killed", id, p.Name)
			case d.acked:
				violate("job %d delivered again after %s acknowledged it", id, p.Name)
			}
		}
		switch rule {
		case KeepAttempt:
			for _, d := range ds {
				if d.attempt != 1 {
					violate("job %d delivered with attempt %d in %s: under this form a crash spends no attempt", id, d.attempt, procs[d.proc].Name)
				}
			}
		case SpendAttempt:
			atts := make([]int, len(ds))
			for i, d := range ds {
				atts[i] = d.attempt
			}
			sort.Ints(atts)
			for i := 1; i < len(atts); i++ {
				if atts[i] == atts[i-1] {
					violate("job %d delivered twice with attempt %d: every crash must spend one", id, atts[i])
				}
			}
			if final.attempt != atts[len(atts)-1] {
				violate("job %d acknowledged with attempt %d although attempt %d was delivered", id, final.attempt, atts[len(atts)-1])
			}
			if gap := final.attempt - len(ds); gap < 0 {
				violate("job %d acknowledged with attempt %d after %d deliveries: an attempt was not spent", id, final.attempt, len(ds))
			} else {
				r.AttemptGaps += gap
			}
		}
	}
	return r, nil
}

// unrecordedAck returns the delivery, among those of a job that none
// recorded as acknowledged, whose Ack may have committed in a process killed
// before it wrote "acked": one that wrote "ack" in a killed process, the
// latest attempt if several did.
func unrecordedAck(procs []Proc, ds []*delivery) *delivery {
	var best *delivery
	for _, d := range ds {
		if d.acking && procs[d.proc].Killed && (best == nil || d.attempt > best.attempt) {
			best = d
		}
	}
	return best
}

// Fill inserts the jobs a run checks, ids 1..n, into table with payload, a
// few hundred rows per statement; bind rewrites its ? placeholders for the
// engine, nil for none.
func Fill(db *sql.DB, table string, n int64, payload []byte, bind func(string) string) error {
	const chunk = 500
	for lo := int64(1); lo <= n; lo += chunk {
		hi := min(lo+chunk-1, n)
		var b strings.Builder
		args := make([]any, 0, 2*chunk)
		b.WriteString("INSERT INTO " + table + " (id, payload) VALUES ")
		for id := lo; id <= hi; id++ {
			if id > lo {
				b.WriteString(", ")
			}
			b.WriteString("(?, ?)")
			args = append(args, id, payload)
		}
		q := b.String()
		if bind != nil {
			q = bind(q)
		}
		if _, err := db.Exec(q, args...); err != nil {
			return fmt.Errorf("filling %s: %w", table, err)
		}
	}
	return nil
}
