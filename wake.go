package inbox

import (
	"context"
	"errors"
	"strings"
	"sync"
)

// bell wakes the idle Work loops of one table in this process. Ringing
// closes the channel idle loops wait on and puts a new one in its place, so
// a ring costs the same whatever the number of loops and rings, and a loop
// that read the channel before a ring sees it.
type bell struct {
	mu      sync.Mutex
	ch      chan struct{}
	polling bool          // an idle loop holds the fallback interval
	free    chan struct{} // closed when that loop stops polling
}

// next returns the channel the next ring closes.
func (b *bell) next() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ch
}

func (b *bell) ring() {
	b.mu.Lock()
	close(b.ch)
	b.ch = make(chan struct{})
	b.mu.Unlock()
}

// takePoll makes the caller the idle loop that polls, unless one is; then
// it returns a channel closed when that loop stops polling.
func (b *bell) takePoll() (bool, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.polling {
		return false, b.free
	}
	b.polling = true
	b.free = make(chan struct{})
	return true, nil
}

// dropPoll ends the caller's polling and wakes the loops waiting to take
// it over.
func (b *bell) dropPoll() {
	b.mu.Lock()
	b.polling = false
	close(b.free)
	b.mu.Unlock()
}

// bells holds one bell per table name in the process. Tables are matched by
// their bare name, in lower case, so that "jobs" and "public.jobs" share one:
// two tables of one name in different schemas share it too, which costs
// their loops a claim that finds nothing, never a missed wake-up. It holds
// no pool.
var (
	bellsMu sync.Mutex
	bells   = map[string]*bell{}
)

func bellOf(table string) *bell {
	bellsMu.Lock()
	defer bellsMu.Unlock()
	key := strings.ToLower(table)
	b := bells[key]
	if b == nil {
		b = &bell{ch: make(chan struct{})}
		bells[key] = b
	}
	return b
}

// Wake wakes the idle [Queue.Work] loops of q's table in this process, as
// Enqueue does through a *sql.DB or *sql.Conn. Call it after committing a
// transaction that enqueued jobs through a *sql.Tx: the loops would not see
// them before the commit. A wake-up with nothing to claim costs a claim.
func (q *Queue) Wake() { q.bell.ring() }

// A Listener relays wake-ups from other processes: on PostgreSQL, the
// notifications that Enqueue sends when [Config.NotifyChannel] is set.
// Listening needs the driver's own API (pgx's WaitForNotification, lib/pq's
// Listener), so the package defines only this; examples/listen has a
// listener for each driver.
type Listener interface {
	// Listen calls wake for every notification on channel until ctx ends,
	// reconnecting when its connection is lost, and then returns. A
	// notification lost while it reconnects costs at most the loops'
	// fallback interval.
	Listen(ctx context.Context, channel string, wake func()) error
}

// Listen runs l on q's notification channel, waking q's idle Work loops,
// until ctx ends. Run it in a goroutine of your own, one per process.
func (q *Queue) Listen(ctx context.Context, l Listener) error {
	if q.cfg.NotifyChannel == "" {
		return errors.New("inbox: listen: Config.NotifyChannel is empty")
	}
	return l.Listen(ctx, q.cfg.NotifyChannel, q.Wake)
}
