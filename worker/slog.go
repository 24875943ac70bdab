package worker

import (
	"context"
	"log/slog"
)

// SlogEvents returns a [Config.OnEvent] that logs each event to l: a job's
// start at Debug; its end at Info when acked, released, snoozed or settled
// by its handler, at Warn when retried, at Error when it went dead, was
// dropped or its settlement failed; the loop's errors at Error. The attributes are queue,
// id, attempt, outcome, duration, delay (a retry or snooze), error (the handler's or
// the loop's) and settle_error. Nothing is formatted for a level l does not
// enable.
func SlogEvents(l *slog.Logger) func(Event) {
	return func(e Event) {
		level, msg := eventLevel(e)
		ctx := context.Background()
		if !l.Enabled(ctx, level) {
			return
		}
		attrs := make([]slog.Attr, 0, 8)
		attrs = append(attrs, slog.String("queue", e.Queue))
		if e.Kind != EventError {
			attrs = append(attrs, slog.Any("id", e.ID), slog.Int("attempt", e.Attempt))
		}
		if e.Kind == EventEnd {
			attrs = append(attrs, slog.String("outcome", e.Outcome.String()), slog.Duration("duration", e.Duration))
			if e.Outcome == OutcomeRetried || e.Outcome == OutcomeSnoozed {
				attrs = append(attrs, slog.Duration("delay", e.Delay))
			}
		}
		if e.Err != nil {
			attrs = append(attrs, slog.String("error", e.Err.Error()))
		}
		if e.SettleErr != nil {
			attrs = append(attrs, slog.String("settle_error", e.SettleErr.Error()))
		}
		l.LogAttrs(ctx, level, msg, attrs...)
	}
}

// eventLevel is the level and message SlogEvents logs e with.
func eventLevel(e Event) (slog.Level, string) {
	switch {
	case e.Kind == EventStart:
		return slog.LevelDebug, "job started"
	case e.Kind == EventError:
		return slog.LevelError, "worker loop error"
	case e.SettleErr != nil:
		return slog.LevelError, "job settlement failed"
	case e.Outcome == OutcomeDead:
		return slog.LevelError, "job dead"
	case e.Outcome == OutcomeDropped:
		return slog.LevelError, "job dropped: it cannot succeed and no dead table is named"
	case e.Outcome == OutcomeSnoozed:
		return slog.LevelInfo, "job snoozed"
	case e.Outcome == OutcomeRetried:
		return slog.LevelWarn, "job retried"
	case e.Outcome == OutcomeReleased:
		return slog.LevelInfo, "job released"
	case e.Outcome == OutcomeSettled:
		return slog.LevelInfo, "job settled by its handler"
	}
	return slog.LevelInfo, "job acked"
}
