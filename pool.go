package inbox

import (
	"database/sql"
	"database/sql/driver"
	"strings"
	"sync"
)

// inWork is what the jobs in work of this process hold, shared by every
// queue: per *sql.DB the connections they hold (the pool rule holds across
// queues, so the count cannot live in one queue), and per scope the
// advisory keys in work. An entry lives while it counts something: the
// last unreserve or drop removes it, so a pool or a table no job holds is
// in neither map, however many queues were made on it.
var inWork = struct {
	mu    sync.Mutex
	conns map[*sql.DB]int
	keys  map[any]map[string]struct{}
}{conns: map[*sql.DB]int{}, keys: map[any]map[string]struct{}{}}

// poolHolds counts the connections of one pool held by jobs in work.
type poolHolds struct{ db *sql.DB }

// reserve takes up to want connections for jobs in work, leaving the pool's
// last connection free, and returns how many it took.
func (h poolHolds) reserve(want int) (int, error) {
	limit := h.db.Stats().MaxOpenConnections
	if limit == 1 {
		return 0, ErrPoolTooSmall
	}
	inWork.mu.Lock()
	defer inWork.mu.Unlock()
	n := inWork.conns[h.db]
	if limit > 0 && n+want > limit-1 {
		want = max(limit-1-n, 0)
	}
	if want > 0 {
		inWork.conns[h.db] = n + want
	}
	return want, nil
}

func (h poolHolds) unreserve(n int) {
	if n == 0 {
		return
	}
	inWork.mu.Lock()
	defer inWork.mu.Unlock()
	if left := inWork.conns[h.db] - n; left > 0 {
		inWork.conns[h.db] = left
	} else {
		delete(inWork.conns, h.db)
	}
}

// MaxInWork returns how many jobs the queue's pool can hold in work at once,
// for every queue on the pool together, or -1 when nothing bounds it. Under
// the row lock, and the advisory form where the engine has session locks
// (PostgreSQL, MySQL), a job in work holds a connection and the pool keeps
// one for the rest: it is the pool's SetMaxOpenConns less one, read now (0
// for a pool of one, where Claim returns [ErrPoolTooSmall]). The lease form,
// SQLite's advisory form and a pool without a limit are unbounded. A loop
// reads it to refuse more workers than the pool can serve.
func (q *Queue) MaxInWork() int {
	if !q.form.holdsConn(q) {
		return -1
	}
	max := q.db.Stats().MaxOpenConnections
	if max <= 0 {
		return -1
	}
	return max - 1
}

// keySet is a set of advisory keys in work in this process: per pool for
// engines with session locks (the server arbitrates between pools, the set
// only spares a lock call) and for a SQLite database in memory, which is
// its pool's; for the whole process (processKeys) for SQLite files, where
// it is the whole mechanism, its keys led by the table's identity.
type keySet struct{ scope any }

// processKeys is the scope of the keys shared by every pool of the process.
var processKeys = keySet{scope: processScope{}}

type processScope struct{}

// take marks key in work, reporting false when it already was.
func (s keySet) take(key string) bool {
	inWork.mu.Lock()
	defer inWork.mu.Unlock()
	m := inWork.keys[s.scope]
	if _, busy := m[key]; busy {
		return false
	}
	if m == nil {
		m = map[string]struct{}{}
		inWork.keys[s.scope] = m
	}
	m[key] = struct{}{}
	return true
}

func (s keySet) drop(key string) {
	inWork.mu.Lock()
	defer inWork.mu.Unlock()
	m := inWork.keys[s.scope]
	delete(m, key)
	if len(m) == 0 {
		delete(inWork.keys, s.scope)
	}
}

func (s keySet) size() int {
	inWork.mu.Lock()
	defer inWork.mu.Unlock()
	return len(inWork.keys[s.scope])
}

// count counts the keys in work that begin with prefix.
func (s keySet) count(prefix string) int {
	inWork.mu.Lock()
	defer inWork.mu.Unlock()
	n := 0
	for k := range inWork.keys[s.scope] {
		if strings.HasPrefix(k, prefix) {
			n++
		}
	}
	return n
}

// discard closes conn instead of returning it to the pool: its session may
// still hold a lock.
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
}
