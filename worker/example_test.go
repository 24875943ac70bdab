package worker_test

import (
	"errors"
	"log/slog"
	"os"
	"time"

	"github.com/sqlinbox/inbox/worker"
)

// SlogEvents as a loop's OnEvent logs each job's end, here a retry (the
// time left out so that the output is stable): worker.Config{OnEvent: onEvent}.
func ExampleSlogEvents() {
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
	onEvent := worker.SlogEvents(logger)
	onEvent(worker.Event{Kind: worker.EventEnd, Queue: "mail", ID: int64(7), Attempt: 3, Duration: 1500 * time.Millisecond,
		Outcome: worker.OutcomeRetried, Delay: time.Minute, Err: errors.New("smtp: 451 greylisted")})
	// Output: level=WARN msg="job retried" queue=mail id=7 attempt=3 outcome=retried duration=1.5s delay=1m0s error="smtp: 451 greylisted"
}
