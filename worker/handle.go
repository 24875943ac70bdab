package worker

import (
	"context"
	"errors"

	"github.com/sqlinbox/inbox"
)

// Handle runs handle on d, a delivery the caller claimed from q, as one of
// [Run]'s loops would, and settles d by the result under the same rules and
// by the same code: the keeper, [Config.Timeout], the recovery of a panic,
// [Permanent], [Snooze], a handler's own settlement, the retry's backoff
// and the dead table past MaxAttempts. ctx is the loop's: its end is a
// shutdown, and [Config.Grace] after it the handler's context ends with
// cause [ErrShutdown]. It returns the job's [EventEnd], which Config.OnEvent
// is told too; a failed settlement is in its SettleErr. When the grace
// period had ended already, the job goes back unrun and the Event is the
// zero one. It returns an
// error, and runs nothing, for a nil queue, delivery or handler and for a
// Config that Run refuses; it does not check the pool's size. A loop of
// your own can settle by it; package inboxtest's RunHandler tests a
// handler with it.
func Handle(ctx context.Context, q *inbox.Queue, cfg Config, d *inbox.Delivery, handle Handler) (Event, error) {
	switch {
	case q == nil:
		return Event{}, errors.New("worker: handle: the queue is nil")
	case d == nil:
		return Event{}, errors.New("worker: handle: the delivery is nil")
	case handle == nil:
		return Event{}, errors.New("worker: handle: the handler is nil")
	}
	w, err := newLoop(ctx, q, cfg, handle)
	if err != nil {
		return Event{}, err
	}
	var end Event
	tell := cfg.OnEvent
	w.onEvent = func(e Event) {
		if e.Kind == EventEnd {
			end = e
		}
		if tell != nil {
			tell(e)
		}
	}
	var stop func()
	w.hard, stop = w.graceful(ctx)
	defer stop()
	w.handleAll([]*inbox.Delivery{d})
	return end, nil
}
