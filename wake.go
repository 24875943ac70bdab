package inbox

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
)

// bell wakes the idle Work loops of one table in this process. Ringing
// closes the channel idle loops wait on and puts a new one in its place, so
// a ring costs the same whatever the number of loops and rings, and a loop
// that read the channel before a ring sees it.
type bell struct {
	mu sync.Mutex
	ch chan struct{}
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

// pollDuty makes one idle Work loop at a time poll, among the loops of one
// table on one pool. Unlike the bell it is never shared by two tables: a
// loop of one that held the polling would leave the other table's jobs
// from other processes unclaimed until it let go, and with many loops on
// one table against a few on the other, that was many intervals. The
// table is matched as described, so "jobs" and "public.jobs" each poll (one
// statement more per interval), as do two pools on one table.
type pollDuty struct {
	key   dutyKey
	loops int // Work loops holding it (guarded by dutiesMu)

	mu      sync.Mutex
	polling bool          // an idle loop holds the fallback interval
	free    chan struct{} // closed when that loop stops polling
}

type dutyKey struct {
	db    *sql.DB
	table string
}

// duties holds the poll duties of running Work loops; the last loop of
// one removes it, so that no pool is kept reachable after its loops return.
var (
	dutiesMu sync.Mutex
	duties   = map[dutyKey]*pollDuty{}
)

// acquireDuty returns the poll duty of q's table on q's pool for a Work
// loop, which releases it when it returns.
func acquireDuty(q *Queue) *pollDuty {
	key := dutyKey{q.db, q.names.Raw.Name}
	dutiesMu.Lock()
	defer dutiesMu.Unlock()
	d := duties[key]
	if d == nil {
		d = &pollDuty{key: key}
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
