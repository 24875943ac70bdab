package inbox

import (
	"context"
	"database/sql"
	"strings"
	"sync"
)

// bell wakes the idle loops of one table in this process. Ringing closes
// the channel idle loops wait on, so a ring costs the same whatever the
// number of loops, and a loop that read the channel before a ring sees it.
// Tables are matched by their bare name, in lower case, so that "jobs" and
// "public.jobs" share one: two tables of one name in different schemas
// share it too, which costs their loops a claim that finds nothing, never a
// missed wake-up.
type bell struct{ key string }

func bellOf(table string) bell { return bell{strings.ToLower(table)} }

// waits holds a channel per table only from the first wait after a ring to
// the next ring, which closes and removes it: a table nobody waits on is
// not in it, whatever the number of tables and queues made.
var waits = struct {
	mu sync.Mutex
	ch map[string]chan struct{}
}{ch: map[string]chan struct{}{}}

// next returns the channel the next ring closes.
func (b bell) next() <-chan struct{} {
	waits.mu.Lock()
	defer waits.mu.Unlock()
	ch := waits.ch[b.key]
	if ch == nil {
		ch = make(chan struct{})
		waits.ch[b.key] = ch
	}
	return ch
}

func (b bell) ring() {
	waits.mu.Lock()
	defer waits.mu.Unlock()
	if ch := waits.ch[b.key]; ch != nil {
		close(ch)
		delete(waits.ch, b.key)
	}
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

// Probe reports whether a claim may find a job, in one statement
// ([Statements.Probe]) where the dialect has one, so that an idle loop's
// fallback poll costs a statement, not a claim's transaction. Without a
// probe statement (a claim of one statement already) it reports true and
// sends nothing. It returns the statement's error, wrapped as
// "inbox: probe: …"; a row it finds may be gone by the claim.
func (q *Queue) Probe(ctx context.Context) (bool, error) {
	if q.st.Jobs.Probe.SQL == "" {
		return true, nil
	}
	v := &values{}
	now, err := q.claimNow(ctx, q.st.Jobs.Probe)
	if err != nil {
		return false, opErr("probe", err)
	}
	v.now = now
	var rows *sql.Rows
	if rows, err = q.query(ctx, q.db, q.st.Jobs.Probe, v); err != nil {
		return false, opErr("probe", err)
	}
	found := rows.Next()
	if err = rows.Close(); err == nil {
		err = rows.Err()
	}
	if err != nil {
		return false, opErr("probe", err)
	}
	return found, nil
}
