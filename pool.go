package inbox

import (
	"database/sql"
	"database/sql/driver"
	"runtime"
	"sync"
)

// poolHolds counts, per *sql.DB, the connections held by jobs in work and the
// advisory keys in work, shared by every queue on that pool: the pool rule
// holds across queues, so the count cannot live in one queue.
type poolHolds struct {
	db     *sql.DB
	queues int // queues sharing it (guarded by holdsMu)

	mu   sync.Mutex
	n    int
	keys keySet
}

// holdsFor finds a pool's count from a queue's New. An entry lives as long
// as a queue on its pool does: each queue's finalizer gives its share back,
// and the last one removes the entry, so the registry never keeps a pool
// reachable that the caller has let go of.
var (
	holdsMu  sync.Mutex
	holdsFor = map[*sql.DB]*poolHolds{}
)

// holdsOf returns db's count for q, released when q is collected.
func holdsOf(q *Queue, db *sql.DB) *poolHolds {
	holdsMu.Lock()
	defer holdsMu.Unlock()
	h := holdsFor[db]
	if h == nil {
		h = &poolHolds{db: db}
		holdsFor[db] = h
	}
	h.queues++
	runtime.SetFinalizer(q, func(*Queue) { h.release() })
	return h
}

// release gives back one queue's share of h.
func (h *poolHolds) release() {
	holdsMu.Lock()
	defer holdsMu.Unlock()
	if h.queues--; h.queues == 0 && holdsFor[h.db] == h {
		delete(holdsFor, h.db)
	}
}

// reserve takes up to want connections for jobs in work, leaving the pool's
// last connection free, and returns how many it took.
func (h *poolHolds) reserve(want int) (int, error) {
	max := h.db.Stats().MaxOpenConnections
	h.mu.Lock()
	defer h.mu.Unlock()
	if max == 1 {
		return 0, ErrPoolTooSmall
	}
	if max > 0 && h.n+want > max-1 {
		want = max - 1 - h.n
		if want < 0 {
			want = 0
		}
	}
	h.n += want
	return want, nil
}

func (h *poolHolds) unreserve(n int) {
	h.mu.Lock()
	h.n -= n
	h.mu.Unlock()
}

// discard closes conn instead of returning it to the pool: its session may
// still hold a lock.
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
}
