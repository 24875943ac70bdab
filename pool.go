package inbox

import (
	"database/sql"
	"database/sql/driver"
	"sync"
)

// poolHolds counts, per *sql.DB, the connections held by jobs in work and the
// advisory keys in work, shared by every queue on that pool.
type poolHolds struct {
	db   *sql.DB
	mu   sync.Mutex
	n    int
	keys keySet
}

var (
	holdsMu  sync.Mutex
	holdsFor = map[*sql.DB]*poolHolds{}
)

func holdsOf(db *sql.DB) *poolHolds {
	holdsMu.Lock()
	defer holdsMu.Unlock()
	h := holdsFor[db]
	if h == nil {
		h = &poolHolds{db: db}
		holdsFor[db] = h
	}
	return h
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
