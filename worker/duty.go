package worker

import (
	"sync"
	"time"

	"github.com/sqlinbox/inbox"
)

// pollDuty makes one idle loop at a time poll, among the loops of one queue
// with one fallback interval. It is keyed by the interval too: loops that
// shared one whatever their intervals had a 200 ms loop wait behind a 30 s
// sibling's poll (the lost interval cost more than the probe a second
// polling loop sends). It is keyed by the *inbox.Queue, not the table: two
// queues on one table each poll (a statement more per interval), and two
// tables never share one, so that a loop of one holding the polling cannot
// leave the other's jobs from other processes unclaimed.
type pollDuty struct {
	key   dutyKey
	loops int // loops holding it (guarded by dutiesMu)
	due   *dueWaker
	pause *pauseWatch

	mu      sync.Mutex
	polling bool          // an idle loop holds the fallback interval
	free    chan struct{} // closed when that loop stops polling
}

type dutyKey struct {
	q    *inbox.Queue
	poll time.Duration
}

// duties holds the poll duties of running loops; the last loop of one
// removes it, so that no queue is kept reachable after its loops return.
var (
	dutiesMu sync.Mutex
	duties   = map[dutyKey]*pollDuty{}
)

// acquireDuty returns the poll duty of q and poll for a loop, which
// releases it when it returns.
func acquireDuty(q *inbox.Queue, poll time.Duration) *pollDuty {
	key := dutyKey{q, poll}
	dutiesMu.Lock()
	defer dutiesMu.Unlock()
	d := duties[key]
	if d == nil {
		d = &pollDuty{key: key, due: &dueWaker{q: q}, pause: newPauseWatch(q, poll)}
		duties[key] = d
	}
	d.loops++
	return d
}

func (d *pollDuty) release() {
	dutiesMu.Lock()
	defer dutiesMu.Unlock()
	if d.loops--; d.loops == 0 {
		delete(duties, d.key)
		d.due.stop()
	}
}

// take makes the caller the idle loop that polls, unless one is; then it
// returns a channel closed when that loop stops polling.
func (d *pollDuty) take() (bool, <-chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.polling {
		return false, d.free
	}
	d.polling = true
	d.free = make(chan struct{})
	return true, nil
}

// drop ends the caller's polling and wakes the loops waiting to take it
// over.
func (d *pollDuty) drop() {
	d.mu.Lock()
	d.polling = false
	close(d.free)
	d.mu.Unlock()
}
