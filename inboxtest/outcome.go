package inboxtest

// The words of a failing test: what an expectation stands for, and what the
// code under test did instead, in the package's terms (which call, which
// job, what delay and error), the SQL after them.

import (
	"database/sql/driver"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"runtime"
	"strings"
	"time"
)

// delayWords is a delay as the messages write it.
func delayWords(d time.Duration) string {
	if d == AnyDelay {
		return "any delay"
	}
	return d.String()
}

// errorWords is an error's text as the messages write it.
func errorWords(text string) string { return fmt.Sprintf("error %q", text) }

// what names the call c on the job id as the expectation op sets it:
// "Ack of job 7", "Retry(after 1m0s) of job 7", "Ack of job 7 finding its
// hold gone".
func (c Call) what(id any, o op) string {
	name := c.String()
	if c.kind == callRetry {
		details := []string{"after " + delayWords(c.after)}
		if c.withText {
			details = append(details, "an error recorded")
		}
		name = "Retry(" + strings.Join(details, ", ") + ")"
	}
	w := fmt.Sprintf("%s of job %v", name, id)
	switch o {
	case opLost:
		w += " finding its hold gone"
	case opSessionLost:
		w += " finding its session gone"
	case opCancelled:
		w += " finding the job cancelled"
	}
	return w
}

// claimWhat names a claim of at most max jobs that returns jobs.
func claimWhat(max int, jobs []job) string {
	w := fmt.Sprintf("Claim(ctx, %d)", max)
	switch len(jobs) {
	case 0:
		return w + " finding no job"
	case 1:
		return fmt.Sprintf("%s returning job %v", w, jobs[0].id)
	}
	ids := make([]string, len(jobs))
	for i, j := range jobs {
		ids[i] = fmt.Sprint(j.id)
	}
	return fmt.Sprintf("%s returning jobs %s and %s", w, strings.Join(ids[:len(ids)-1], ", "), ids[len(ids)-1])
}

// sameID reports whether two ids are the same job's.
func sameID(a, b any) bool {
	if a == nil || b == nil {
		return false
	}
	na, err1 := normID(a)
	nb, err2 := normID(b)
	return err1 == nil && err2 == nil && na == nb
}

// inboxPrefix begins the name of a function of the package itself (not of
// one of its subpackages).
const inboxPrefix = "github.com/sqlinbox/inbox."

// apiCall returns the method of the package the goroutine is in, the
// outermost of those between the caller and the driver: "Retry" for
// Delivery.Retry, "Claim" for Queue.Claim; "" when the call does not come
// from the package, or from its own goroutines (a Batcher's flush).
func apiCall() string {
	pcs := make([]uintptr, 64)
	n := runtime.Callers(3, pcs)
	frames := runtime.CallersFrames(pcs[:n])
	fn, in := "", false
	for {
		f, more := frames.Next()
		switch {
		case strings.HasPrefix(f.Function, inboxPrefix):
			in, fn = true, f.Function[len(inboxPrefix):]
		case in:
			more = false
		}
		if !more {
			break
		}
	}
	if fn == "" {
		return ""
	}
	// "(*Delivery).Retry", "(*Delivery).Keep.func1", "New"
	if i := strings.LastIndex(fn, ")."); i >= 0 {
		fn = fn[i+2:]
	}
	if i := strings.IndexByte(fn, '.'); i >= 0 {
		fn = fn[:i]
	}
	if fn == "" || fn[0] < 'A' || fn[0] > 'Z' {
		return ""
	}
	return fn
}

// sent is one call that reached a database made with NewDB.
type sent struct {
	kind string // prepare, query, exec, begin, commit, rollback
	sql  string
	args []driver.Value
	api  string // the package's method that sent it (apiCall)
	held any    // the job the connection holds, from the claim it returned

	// Set by name, from the Mock that knows the statement.
	m       *Mock
	k       *known
	dialect string // identity, lock, unlock: the dialect's own calls
}

func (s *sent) is(names ...string) bool {
	if s.k == nil {
		return false
	}
	for _, n := range s.k.names {
		for _, w := range names {
			if n == w {
				return true
			}
		}
	}
	return false
}

// arg returns the value of the statement's first parameter a, nil when it
// takes none.
func (s *sent) arg(a dialect.Arg) driver.Value {
	if s.k == nil {
		return nil
	}
	for i, x := range s.k.stmt.Args {
		if x == a && i < len(s.args) {
			return s.args[i]
		}
	}
	return nil
}

// preamble reports whether s only prepares what its call does next: a
// begin, a prepare, a read of the clock, the rollback to the savepoint, the
// row lock's relock. Past a call the expectations did not match, the
// database answers these itself to learn what the call was.
func (s *sent) preamble() bool {
	switch s.kind {
	case "begin", "prepare":
		return true
	case "query", "exec":
		return s.is("Now", "RowLock.RollbackToSavepoint", "RowLock.Relock")
	}
	return false
}

// line is s as sqlmock would show it: "exec UPDATE … [7 2]".
func (s *sent) line() string {
	l := s.kind
	if s.sql != "" {
		l += " " + s.sql
	}
	if len(s.args) > 0 {
		l += fmt.Sprintf(" %v", s.args)
	}
	return l
}

// opOf names the call s is part of: the package's method that sent it, or
// else what its statement is for.
func (s *sent) opOf() string {
	if s.api != "" {
		return s.api
	}
	switch {
	case s.is("Settle.Dead"):
		return "Dead"
	case s.is("Settle.Ack", "Settle.Retry", "Settle.Release", "Settle.Extend", "Jobs.Probe"):
		for _, n := range []string{"Settle.Ack", "Settle.Retry", "Settle.Release", "Settle.Extend", "Jobs.Probe"} {
			if s.is(n) {
				return n[strings.IndexByte(n, '.')+1:]
			}
		}
	case s.dialect == "identity" || s.dialect == "lock" ||
		s.is("Claim.Take", "Claim.TakeOne", "Claim.Select", "Claim.SelectMore", "Claim.SelectMoreOne", "Claim.SelectFree", "Claim.SelectFreeOne", "Claim.Mark", "Claim.MarkOne", "Claim.Pick", "Claim.PickMore", "Claim.PickLock", "Claim.PickFirst", "Claim.WalkFirst", "Claim.WalkTake",
			"Advisory.Candidates", "Advisory.LockFirst"):
		return "Claim"
	case s.k != nil:
		return "the queue's " + s.k.names[0]
	}
	return ""
}

// what names what the code under test did with s: the call and its
// details ("Retry(after 2s, error \"carrier down\")"), and the job it was
// for (nil when unknown or none).
func (r *tap) what(s *sent) (string, any) {
	op := s.opOf()
	if op == "" {
		if s.kind == "commit" || s.kind == "rollback" || s.kind == "begin" {
			return "a " + s.kind + " not the queue's", nil
		}
		return "a statement not the queue's (" + s.line() + ")", nil
	}
	var id any
	if v := s.arg(dialect.ArgID); v != nil {
		id, _ = normID(v)
	} else if s.held != nil && op != "Claim" {
		id = s.held
	}
	switch op {
	case "Retry", "RetryTx":
		var details []string
		if d, exact, ok := r.delay(s); ok && exact {
			details = append(details, "after "+d.String())
		} else if ok {
			details = append(details, "after about "+d.String())
		}
		if t := textOf(s.arg(dialect.ArgError)); t != "" {
			details = append(details, errorWords(t))
		}
		if len(details) > 0 {
			op += "(" + strings.Join(details, ", ") + ")"
		}
	case "Dead", "DeadTx", "Drop":
		if t := textOf(s.arg(dialect.ArgError)); t != "" {
			op += "(" + errorWords(t) + ")"
		}
	case "Claim":
		if v := s.arg(dialect.ArgLimit); v != nil && s.is("Claim.Take", "Claim.TakeOne", "Claim.Select", "Claim.SelectFree", "Claim.SelectFreeOne") {
			op = fmt.Sprintf("Claim(ctx, %v)", v)
		}
	}
	return op, id
}

// delay is the delay of the retry s sends, when its arguments tell
// (ok), and whether exactly: where the queue read time.Now, only about.
func (r *tap) delay(s *sent) (d time.Duration, exact, ok bool) {
	if v := s.arg(dialect.ArgMicros); v != nil {
		n, ok := v.(int64)
		return time.Duration(n) * time.Microsecond, true, ok
	}
	u := s.arg(dialect.ArgUntil)
	if u == nil || s.m == nil {
		return 0, false, false
	}
	dl := s.m.db.d
	until, err := dl.ScanTime(u)
	if err != nil {
		return 0, false, false
	}
	var now time.Time
	switch {
	case s.arg(dialect.ArgNow) != nil:
		if now, err = dl.ScanTime(s.arg(dialect.ArgNow)); err != nil {
			return 0, false, false
		}
	case s.m.now != nil:
		now = s.m.now()
	case s.m.q.Statements().Now.SQL != "":
		if r.lastNow.IsZero() {
			return 0, false, false
		}
		now = r.lastNow
	default:
		// time.Now, read by the queue a moment ago.
		d = time.Until(until)
		if d >= time.Second {
			return d.Round(100 * time.Millisecond), false, true
		}
		return d.Round(time.Millisecond), false, true
	}
	return until.Sub(now.Truncate(time.Microsecond)), true, true
}

// textOf is the text of a string argument, "" for another.
func textOf(v driver.Value) string {
	switch x := v.(type) {
	case string:
		return x
	case []byte:
		return string(x)
	}
	return ""
}
