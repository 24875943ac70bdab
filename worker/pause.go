package worker

import (
	"context"
	"sync"
	"time"

	"github.com/sqlinbox/inbox"
)

// pauseWatch is whether a queue is paused ([inbox.Queue.Pause]) as the
// loops of one poll duty last read it: one statement
// ([inbox.Queue.Paused]) serves them all, sent when the reading is a poll
// interval old, when the interval of the loop that polls ran out, and when
// a Pause or Resume of this process changed the state
// ([inbox.Queue.PauseChanged]); never per claim. So a pause from another
// process stops the loops within an interval (and the claim then under
// way), one from this process at once.
//
// Rejected: reading the state in Claim (a statement per claim, or a
// second engine statement joined to every claim's), and a state kept in
// the process alone (other processes would claim on).
type pauseWatch struct {
	q    *inbox.Queue
	poll time.Duration
	on   bool // the description names a control table

	mu      sync.Mutex
	paused  bool
	readAt  time.Time       // zero before the first reading
	changed <-chan struct{} // closed by this process's next Pause or Resume since the reading
}

func newPauseWatch(q *inbox.Queue, poll time.Duration) *pauseWatch {
	return &pauseWatch{q: q, poll: poll, on: q.Config().Table.ControlTable != ""}
}

// held reports whether the loops must claim nothing, reading the state
// again when it is due; interval is true for the loop whose fallback
// interval just ran out. A reading that fails goes to report and leaves
// the state as it was (running, before any reading): a pause is an
// operator's wish, which a database that cannot be read cannot tell, and
// the claim that follows meets the same failure.
func (p *pauseWatch) held(ctx context.Context, interval bool, report func(error)) bool {
	if !p.on {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !interval && !p.readAt.IsZero() && time.Since(p.readAt) < p.poll && !closed(p.changed) {
		return p.paused
	}
	// The channel is taken before the reading, so that a change during it
	// is not lost.
	changed := p.q.PauseChanged()
	st, err := p.q.Paused(ctx)
	p.readAt = time.Now()
	if err != nil {
		if ctx.Err() == nil {
			report(err)
		}
		return p.paused
	}
	p.paused, p.changed = st.Paused, changed
	return p.paused
}

// next returns the channel this process's next Pause or Resume closes, for
// a loop about to claim (pausedDuring); nil without a control table.
func (p *pauseWatch) next() <-chan struct{} {
	if !p.on {
		return nil
	}
	return p.q.PauseChanged()
}

// pausedDuring reports whether the queue was paused in this process since
// the loop took changed (next), before its claim: a claim under way when
// Pause returns may deliver jobs enqueued after it, which the loop then
// gives back, so that no handler starts after this process's Pause.
func (p *pauseWatch) pausedDuring(ctx context.Context, changed <-chan struct{}, report func(error)) bool {
	return closed(changed) && p.held(ctx, false, report)
}

// closed reports whether ch is closed; a nil ch is not.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
