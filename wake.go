package inbox

import (
	"strings"
	"sync"
)

// bell wakes the idle loops of one table in this process. Ringing closes
// the channel idle loops wait on and puts a new one in its place, so a ring
// costs the same whatever the number of loops and rings, and a loop that
// read the channel before a ring sees it.
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

// Wake wakes the loops of q's table in this process that wait on
// [Queue.NextWake], as Enqueue does through a *sql.DB or *sql.Conn. Call it
// after committing a transaction that enqueued jobs through a *sql.Tx: the
// loops would not see them before the commit. A wake-up with nothing to
// claim costs each waiting loop a claim.
func (q *Queue) Wake() { q.bell.ring() }

// NextWake returns a channel that the next wake-up of q's table in this
// process closes: [Queue.Wake], or [Queue.Enqueue] through a *sql.DB or
// *sql.Conn, by any queue on a table of the same name. A loop reads it
// before it claims and waits on it after a claim that found nothing, so
// that a job enqueued during the claim is not missed. Waiting is the
// caller's: the package starts no timer for it.
func (q *Queue) NextWake() <-chan struct{} { return q.bell.next() }
