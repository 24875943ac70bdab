package worker

import (
	"errors"
	"strconv"
	"time"

	"github.com/sqlinbox/inbox"
)

// An EventKind says what an [Event] reports.
type EventKind uint8

// The kinds of [Event].
const (
	// EventStart: a handler starts on a job.
	EventStart EventKind = iota + 1
	// EventEnd: a job's handler returned and the loop settled the job,
	// or tried to (Event.SettleErr).
	EventEnd
	// EventError: the loop met an error it does not return, a claim, a
	// probe or a give-back that failed (Event.Err); it goes on.
	EventError
)

var kindNames = [...]string{"", "start", "end", "error"}

// String is start, end or error.
func (k EventKind) String() string {
	if int(k) < len(kindNames) && k > 0 {
		return kindNames[k]
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// An Outcome is what the loop did with a job whose handler returned.
type Outcome uint8

// The outcomes of an [EventEnd].
const (
	// OutcomeAcked: the handler returned nil; the job was acknowledged.
	OutcomeAcked Outcome = iota + 1
	// OutcomeRetried: the handler failed; the job comes back after
	// Event.Delay, its attempt spent.
	OutcomeRetried
	// OutcomeDead: the handler failed on the last attempt; the job went
	// to the dead table.
	OutcomeDead
	// OutcomeReleased: the job was given back without spending its
	// attempt (its loop shut down while it ran).
	OutcomeReleased
	// OutcomeSettled: the handler settled the job itself (Ack, Retry,
	// Release or Dead on its delivery); the loop sent nothing.
	OutcomeSettled
	// OutcomeSnoozed: the handler returned [Snooze]; the job comes back
	// after Event.Delay, its attempt spent, no error recorded.
	OutcomeSnoozed
	// OutcomeDropped: the handler returned a [Permanent] error and no
	// dead table is named; the job was deleted.
	OutcomeDropped
)

var outcomeNames = [...]string{"", "acked", "retried", "dead", "released", "settled", "snoozed", "dropped"}

// String is acked, retried, dead, released, settled, snoozed or dropped.
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) && o > 0 {
		return outcomeNames[o]
	}
	return "outcome(" + strconv.Itoa(int(o)) + ")"
}

// An Event is what a loop tells [Config.OnEvent]: a job's start and end,
// and the errors the loop meets and does not return. Every job whose
// handler starts has one EventStart and, once the loop is done with the
// job, one EventEnd, in the handler's goroutine or the loop's. A job
// claimed after the loop's context ended goes back without either.
type Event struct {
	Kind EventKind
	// Queue is the name of the job's table ([inbox.Table.Name]).
	Queue string
	// ID and Attempt are the job's ([inbox.Delivery.ID], Attempt); nil
	// and 0 for EventError.
	ID      any
	Attempt int
	// Duration is how long the handler ran (EventEnd).
	Duration time.Duration
	// Outcome is what the loop did with the job (EventEnd). OutcomeDead
	// is the job going dead.
	Outcome Outcome
	// Delay is the wait before the next attempt (OutcomeRetried,
	// OutcomeSnoozed).
	Delay time.Duration
	// Err is the handler's error, nil when it returned nil (EventEnd), or
	// the loop's error (EventError).
	Err error
	// SettleErr is the error of the loop's settlement, nil when it
	// succeeded (EventEnd): then the outcome did not take effect and the
	// job comes back as its form says; [inbox.ErrLeaseLost] means another
	// holder may have it already. [Config.OnError] gets it too.
	SettleErr error
}

// began marks the start of d's handler and returns when it started; the
// zero time, and nothing sent or read, without Config.OnEvent.
func (w *loop) began(d *inbox.Delivery) time.Time {
	if w.onEvent == nil {
		return time.Time{}
	}
	w.onEvent(Event{Kind: EventStart, Queue: w.name, ID: d.ID(), Attempt: d.Attempt()})
	return time.Now()
}

// since is how long a handler that began at start ran; zero, and the
// clock not read, without Config.OnEvent.
func (w *loop) since(start time.Time) time.Duration {
	if w.onEvent == nil {
		return 0
	}
	return time.Since(start)
}

// ended reports what became of d, whose handler ran for took and returned
// herr: OnError gets the settlement's error, OnEvent the end. A settlement
// that finds d settled already was the handler's own, unless what settled
// it was a lost lease (the error matches ErrLeaseLost too).
func (w *loop) ended(d *inbox.Delivery, took time.Duration, herr error, o Outcome, delay time.Duration, serr error) {
	if errors.Is(serr, inbox.ErrSettled) && !errors.Is(serr, inbox.ErrLeaseLost) {
		o, delay, serr = OutcomeSettled, 0, nil
	}
	w.count(serr)
	if w.onEvent == nil {
		return
	}
	w.onEvent(Event{Kind: EventEnd, Queue: w.name, ID: d.ID(), Attempt: d.Attempt(),
		Duration: took, Outcome: o, Delay: delay, Err: herr, SettleErr: serr})
}
