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
	// lingering counts, per scope and key, the session locks of this
	// process's sessions on keys the set no longer (or not yet) holds.
	lingering map[any]map[string]int
}{conns: map[*sql.DB]int{}, keys: map[any]map[string]struct{}{}, lingering: map[any]map[string]int{}}

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
	s.dropLocked(key)
}

func (s keySet) dropLocked(key string) {
	m := inWork.keys[s.scope]
	delete(m, key)
	if len(m) == 0 {
		delete(inWork.keys, s.scope)
	}
}

// dropLingering drops key from the set and marks its session lock as
// still held by this process until [keySet.unlinger]: a key is dropped
// before its session lock goes, so that whoever takes the session lock next
// finds it free in the process too, and a lock call made meanwhile that
// finds the key held must not take the holder for another process's.
func (s keySet) dropLingering(key string) {
	inWork.mu.Lock()
	defer inWork.mu.Unlock()
	s.dropLocked(key)
	s.lingerLocked(key)
}

// linger marks a session lock on key that this process takes or holds
// without the set's entry (a read back under the key's lock, a lock that
// another delivery of the process holds the key of).
func (s keySet) linger(key string) {
	inWork.mu.Lock()
	defer inWork.mu.Unlock()
	s.lingerLocked(key)
}

func (s keySet) lingerLocked(key string) {
	m := inWork.lingering[s.scope]
	if m == nil {
		m = map[string]int{}
		inWork.lingering[s.scope] = m
	}
	m[key]++
}

// unlinger ends a mark of linger or dropLingering: the session lock is let
// go (or its session closed).
func (s keySet) unlinger(key string) {
	inWork.mu.Lock()
	defer inWork.mu.Unlock()
	m := inWork.lingering[s.scope]
	if m[key] > 1 {
		m[key]--
		return
	}
	delete(m, key)
	if len(m) == 0 {
		delete(inWork.lingering, s.scope)
	}
}

// heldHere reports whether a session of this process may hold key's lock
// besides the caller's entry in s: a lingering one, or an entry in another
// pool's set (two pools on one database, each arbitrated by the server).
// Keys name their table's identity, so a key of another database by the
// same name counts too; that only costs a pass-over not made.
func (s keySet) heldHere(key string) bool {
	inWork.mu.Lock()
	defer inWork.mu.Unlock()
	for _, m := range inWork.lingering {
		if m[key] > 0 {
			return true
		}
	}
	for scope, m := range inWork.keys {
		if _, ok := m[key]; ok && scope != s.scope {
			return true
		}
	}
	return false
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
