package worker

import (
	"errors"
	"fmt"
	"time"
)

// The causes and verdicts a handler meets or returns, besides nil and an
// error that retries.
var (
	// ErrShutdown is the cause ([context.Cause]) of a handler's context
	// ended because its loop is shutting down and [Config.Grace] has
	// passed: the job goes back without spending its attempt unless the
	// handler returns nil.
	ErrShutdown = errors.New("worker: shutting down")
	// ErrTimeout is the cause of a handler's context ended by
	// [Config.Timeout]; the handler's error then matches it too.
	ErrTimeout = errors.New("worker: handler timed out")
	// ErrNoRetry is matched by the errors [Permanent] makes: the job is
	// not retried.
	ErrNoRetry = errors.New("worker: do not retry")
)

// Permanent wraps err, which must not be nil, to say that the job cannot
// succeed, whatever its attempt: the loop moves it to the dead table at once
// ([OutcomeDead]), or, on a table without one ([Config.RetryForever]),
// deletes it ([OutcomeDropped]) rather than retry it. The result matches
// [ErrNoRetry] and err, and reads as err; wrapping it again keeps its
// meaning.
func Permanent(err error) error {
	if err == nil {
		err = errors.New("worker: Permanent(nil)")
	}
	return permanentError{err}
}

type permanentError struct{ err error }

func (e permanentError) Error() string        { return e.err.Error() }
func (e permanentError) Unwrap() []error      { return []error{e.err, ErrNoRetry} }
func (e permanentError) Is(target error) bool { return target == ErrNoRetry }

// Snooze returns the error a handler returns to put its job off for after
// (River's JobSnooze): the loop retries it after that delay without
// recording an error ([OutcomeSnoozed]), whatever its attempt: a snooze
// never sends a job to the dead table. The attempt is spent, as by
// [inbox.Delivery.Retry] (inbox has no delayed release): a job snoozed n
// times comes back at attempt n + 1 and, past Config.MaxAttempts, goes dead
// on its next failure; a handler that snoozes often counts its own
// attempts against a bound of its own. Under the row lock and advisory
// forms a delay needs a not-before column: without one (Config.NoDelay) the
// job is claimable again at once. A negative after counts as zero.
func Snooze(after time.Duration) error { return &snoozeError{after: after} }

type snoozeError struct{ after time.Duration }

func (e *snoozeError) Error() string { return fmt.Sprintf("worker: snoozed for %v", e.after) }
