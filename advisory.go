package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// advisoryHold is what holds an advisory delivery: the key value, the
// table's identity, the two joined as the key set names the key in work,
// and the pinned connection holding the lock.
type advisoryHold struct {
	key, ident, inProcess string
	conn                  *sql.Conn
	watched               bool // a keeper watches conn's session (advisory_watch.go)
}

// advisoryForm holds a job by a session lock on its key ([form]).
type advisoryForm struct{}

func (advisoryForm) claim(ctx context.Context, q *Queue, max int) ([]*Delivery, error) {
	return q.claimAdvisory(ctx, max)
}

// refuse: a delay needs the not-before column.
func (advisoryForm) refuse(q *Queue, _ *sql.Tx, o outcome, after time.Duration) error {
	return refuseDelay(q, o, after)
}

func (advisoryForm) settle(ctx context.Context, d *Delivery, tx *sql.Tx, o outcome, after time.Duration) error {
	return d.settleAdvisory(ctx, tx, o, after)
}

func (advisoryForm) leased() bool { return false }

// watch: the session holding the key's lock, pinged (advisory_watch.go),
// once per delivery.
func (advisoryForm) watch(d *Delivery, lost context.CancelCauseFunc) (func(), bool) {
	if d.adv.conn == nil || d.settled || d.adv.watched {
		return nil, false
	}
	d.adv.watched = true
	return d.watchSession(lost), true
}

// holdsConn: the session of the key's lock, where the engine has session
// locks; SQLite's keys are held by the process alone.
func (advisoryForm) holdsConn(q *Queue) bool { return q.locker != nil }

// held: the delivery holds the key's lock until it lets it go.
func (advisoryForm) held(*Delivery) bool { return true }

// unconfirmed: the delivery holds a lock and a connection out of the pool
// until it is known to be settled: the queue's next claim looks.
func (advisoryForm) unconfirmed(d *Delivery) { d.awaitCommit() }

// finished lets the key's lock and the connection go.
func (advisoryForm) finished(ctx context.Context, d *Delivery) { d.unlock(ctx) }

// shutdown lets the lock and connection go, as Release does.
func (advisoryForm) shutdown(ctx context.Context, d *Delivery) error { return d.Release(ctx) }

// claimAdvisory claims up to max jobs whose keys no one holds: candidates are
// read without locks, a page at a time, and each is locked by one call from
// Go, re-read and its attempt counted. A lock function beside a LIMIT in one
// statement would take locks on rows the LIMIT then throws away.
//
// Pages follow one another in id order, each twice as long as the last, until
// max jobs are claimed or the table ends: a claimable job is found whatever
// waits ahead of it, in a number of reads that grows with the logarithm of
// the rows ahead, and one lock call per key not yet known to be busy.
func (q *Queue) claimAdvisory(ctx context.Context, max int) ([]*Delivery, error) {
	q.sweepUnconfirmed(ctx)
	got := max
	if q.locker != nil {
		var err error
		if got, err = q.holds.reserve(max); err != nil {
			return nil, err
		}
	}
	ds := make([]*Delivery, 0, got)
	defer func() {
		if q.locker != nil {
			q.holds.unreserve(got - len(ds))
		}
	}()
	if got == 0 {
		return ds, nil
	}
	ident, err := q.identity(ctx)
	if err != nil {
		return ds, err
	}
	now, err := q.claimNow(ctx, q.st.Advisory.Candidates, q.st.Claim.Take, q.st.Claim.Select)
	if err != nil {
		return ds, err
	}
	if q.locker != nil && q.st.Advisory.LockFirst.SQL != "" && q.lockFirstNow() {
		var walk bool
		ds, walk, err = q.claimLockingFirst(ctx, ident, ds, got, now)
		if err != nil || !walk {
			return ds, err
		}
	}
	ds, err = q.walkCandidates(ctx, ident, ds, got, now)
	return ds, err
}

// lockFirstSpan is how many claims lock in SQL after a walk from Go found a
// key held by another session, where the dialect asks for LockFirst under
// contention only (LockFirstContended); the next walk looks again.
const lockFirstSpan = 64

// lockFirstNow reports whether this claim sends LockFirst: always, unless
// the dialect sends it under contention only; then while claims are left
// of the span the last contended walk started.
func (q *Queue) lockFirstNow() bool {
	return !q.st.Advisory.LockFirstContended || spend(&q.contended)
}

// spend takes one claim of the span left in left, reporting false when
// none is left.
func spend(left *atomic.Int64) bool {
	for {
		n := left.Load()
		if n <= 0 {
			return false
		}
		if left.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// heldElsewhere records that a walk found key held by another session on
// row id: the walk passes it over for a while, and claims lock in SQL.
func (q *Queue) heldElsewhere(key, id string) {
	q.elsewhere.add(key, id)
	q.contended.Store(lockFirstSpan)
}

// walkCandidates claims up to got jobs into ds, reading candidates a page
// at a time and taking each one's key from Go.
func (q *Queue) walkCandidates(ctx context.Context, ident string, ds []*Delivery, got int, now time.Time) ([]*Delivery, error) {
	busy := map[string]bool{} // keys found held during this claim
	base := 2*got + q.keys.size() + 8
	v := values{limit: max(base, int(q.lockPage.Load())), now: now}
	page := q.st.Advisory.Candidates
	after := false // a page past the first full one
	defer func() { q.rememberPage(v.limit, base, after) }()
	rereads := 0
walk:
	for {
		read := q.gone.mark()
		cands, err := q.readCandidates(ctx, q.db, page, &v)
		if err != nil {
			return ds, err
		}
		for _, c := range cands {
			if len(ds) == got {
				return ds, nil
			}
			if busy[c.key] || q.gone.since(c.id, read) {
				continue
			}
			if q.elsewhere.held(c.key, keyString(c.id)) {
				busy[c.key] = true // its later rows wait for the same key
				q.contended.Store(lockFirstSpan)
				continue
			}
			d, held, err := q.lockOne(ctx, ident, c, now)
			if err != nil {
				return ds, err
			}
			switch {
			case d != nil:
				ds = append(ds, d)
			case held:
				busy[c.key] = true
			case rereads < maxRereads:
				// Its row was gone once its key was locked: another
				// process claimed and settled it since the page was
				// read, and most of the page's other free rows likely
				// went the same way. A fresh first page costs one read
				// where each stale row costs a lock, a re-read and an
				// unlock.
				rereads++
				v.id, v.priority, page = nil, 0, q.st.Advisory.Candidates
				continue walk
			}
		}
		if len(ds) == got || len(cands) < v.limit {
			return ds, nil
		}
		v.id, v.priority = cands[len(cands)-1].id, cands[len(cands)-1].priority
		v.limit = min(2*v.limit, maxCandidatePage)
		page, after = q.st.Advisory.CandidatesAfter, true
	}
}

// claimLockingFirst claims up to got jobs into ds with LockFirst: one
// statement a job, which the server answers with the first candidate whose
// key it could lock. A full page without one sends the walk on to the next,
// as walkCandidates's does, past the last row the statement returned. It
// asks for the walk from Go (walk) when the server gave it twice running a
// key this process holds without its session lock (a delivery whose session
// ended under it): the statement would give that key again and again,
// where the walk passes it over.
func (q *Queue) claimLockingFirst(ctx context.Context, ident string, ds []*Delivery, got int, now time.Time) (_ []*Delivery, walk bool, err error) {
	base := 2*got + q.keys.size() + 8
	v := values{limit: max(base, int(q.lockPage.Load())), now: now, identity: ident}
	lock := q.st.Advisory.LockFirst
	// A row settled or claimed between the statement's read and its lock
	// was locked for nothing; each such miss is a race lost by a few
	// microseconds, and a bound keeps a claim from chasing them forever.
	misses := 0
	var heldHere *string // the key last found held in this process
	after := false       // a page past the first full one
	for len(ds) < got && misses <= got+8 {
		d, res, last, err := q.lockFirst(ctx, ident, lock, &v)
		switch {
		case err != nil:
			return ds, false, err
		case d != nil:
			ds = append(ds, d)
			q.rememberPage(v.limit, base, after)
			// The keys before this one were held a moment ago: the
			// claim's next job is looked for past it, as the walk does.
			v.id, v.priority = last.id, last.priority
			lock = q.st.Advisory.LockFirstAfter
			continue
		case res == lockedHeldHere && heldHere != nil && *heldHere == last.key:
			return ds, true, nil
		case res == lockedHeldHere:
			// Most often a race with a delivery of this process taking
			// or letting go of the key; the same key twice is one held
			// here without its session.
			heldHere = &last.key
			misses++
			continue
		case res == lockedGone:
			misses++
			continue
		case last == nil:
			return ds, false, nil // a short page: the table's end
		}
		v.id, v.priority = last.id, last.priority
		v.limit = min(2*v.limit, maxCandidatePage)
		lock, after = q.st.Advisory.LockFirstAfter, true
	}
	return ds, false, nil
}

// rememberPage keeps the page a claim needed (limit) for the next claim to
// start from: all of it when it took a page past the first full one
// (after), half of it when it did not, and none (each claim's own base)
// once half is no more than base. Keys held by other processes stand ahead
// of the free ones, and this spares each claim the reads that would double
// its way past them again.
func (q *Queue) rememberPage(limit, base int, after bool) {
	switch {
	case after:
		q.lockPage.Store(int64(limit))
	case limit/2 > base:
		q.lockPage.Store(int64(limit / 2))
	default:
		q.lockPage.Store(0)
	}
}

// lockResult is what a LockFirst statement came to when it delivered
// nothing.
type lockResult int

const (
	lockedNone     lockResult = iota // no key of the page was free
	lockedGone                       // the row was settled or claimed again before its key was locked
	lockedHeldHere                   // the key is held in this process
)

// lockFirst runs s on a connection of its own and claims the row whose key
// it locked, or says why not: with lockedNone, last is the candidate
// delivered, or the full page's last, nil when the page was short; with
// lockedHeldHere, the candidate whose key this process holds.
func (q *Queue) lockFirst(ctx context.Context, ident string, s dialect.Stmt, v *values) (_ *Delivery, _ lockResult, last *candidate, err error) {
	conn, err := q.db.Conn(ctx)
	if err != nil {
		return nil, lockedNone, nil, err
	}
	c, locked, found, err := q.readLockFirst(ctx, conn, s, v)
	if err != nil {
		// The statement may have taken a lock before failing: the
		// session ends, and the lock with it.
		discard(conn)
		return nil, lockedNone, nil, err
	}
	if !locked {
		conn.Close()
		if found {
			return nil, lockedNone, &c, nil
		}
		return nil, lockedNone, nil, nil
	}
	inProcess := ident + "\x00" + c.key
	if !q.keys.take(inProcess) {
		q.keys.linger(inProcess)
		q.letGo(ctx, conn, ident, c.key)
		q.keys.unlinger(inProcess)
		return nil, lockedHeldHere, &c, nil
	}
	d, err := q.claimLocked(ctx, conn, ident, c, v.now, inProcess)
	if d == nil && err == nil {
		return nil, lockedGone, nil, nil
	}
	return d, lockedNone, &c, err
}

// readLockFirst runs a LockFirst statement and reads its row, if any: a
// candidate, and whether its key is now locked.
func (q *Queue) readLockFirst(ctx context.Context, ex Executor, s dialect.Stmt, v *values) (c candidate, locked, found bool, err error) {
	rows, err := q.query(ctx, ex, s, v)
	if err != nil {
		return c, false, false, err
	}
	defer rows.Close()
	var id, key any
	dest := []any{&id, &key, &c.attempt, &c.priority, &locked}
	if q.names.Priority == "" {
		dest = append(dest[:3], &locked)
	}
	if rows.Next() {
		if err = rows.Scan(dest...); err != nil {
			return c, false, false, err
		}
		c.id, c.key, found = normID(id), keyString(key), true
	}
	if err = rows.Err(); err != nil {
		return c, false, false, err
	}
	// A failed close leaves the session's state unknown: the caller
	// discards it, and a lock it took with it.
	return c, locked, found, rows.Close()
}

// maxRereads bounds the fresh first pages one walk reads after rows found
// gone under their lock (MariaDB, 4 processes of 16 workers: 563-585 jobs/s
// without, 713-769 with up to 3; bench/README.md).
const maxRereads = 3

// maxCandidatePage bounds one read of advisory candidates.
const maxCandidatePage = 1 << 16

// candidate is a row an advisory claim may lock: id, key and the attempt
// read, which the claim requires unchanged.
type candidate struct {
	id       any
	key      string
	attempt  int64
	priority int64 // Table.Priority, for the next page's start
}

func (q *Queue) readCandidates(ctx context.Context, ex Executor, s dialect.Stmt, v *values) ([]candidate, error) {
	rows, err := q.query(ctx, ex, s, v)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	cands := make([]candidate, 0, min(v.limit, 64))
	// One set of destinations for the page: a page is read at every claim
	// and holds a few rows per job in work, each of which would otherwise
	// cost its own.
	var id, key any
	var c candidate
	dest := []any{&id, &key, &c.attempt, &c.priority}
	if q.names.Priority == "" {
		dest = dest[:3]
	}
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		c.id, c.key = normID(id), keyString(key)
		cands = append(cands, c)
	}
	return cands, rows.Err()
}

// keyString turns a key value as a driver returned it into the text locks
// are named by.
func keyString(v any) string {
	switch x := v.(type) {
	case []byte:
		return string(x)
	case string:
		return x
	case int64:
		return strconv.FormatInt(x, 10)
	case nil:
		return ""
	}
	return fmt.Sprint(v)
}

// lockOne takes the key of candidate c and claims its row. It returns nil
// and held=true when the key is held elsewhere, and nil alone when the row
// was settled or claimed again since the candidates were read.
func (q *Queue) lockOne(ctx context.Context, ident string, c candidate, now time.Time) (d *Delivery, held bool, err error) {
	inProcess := ident + "\x00" + c.key
	if !q.keys.take(inProcess) {
		return nil, true, nil
	}
	var conn *sql.Conn
	if q.locker != nil {
		if conn, err = q.db.Conn(ctx); err != nil {
			q.keys.drop(inProcess)
			return nil, false, err
		}
		// A key a session of this process holds (another pool's delivery,
		// or one letting go of it) fails the lock call too: that is no
		// holder elsewhere, and the process's own loops are woken when it
		// is let go.
		here := q.keys.heldHere(inProcess)
		ok, err := q.locker.TryLock(ctx, conn, ident, c.key)
		if err != nil || !ok {
			// A failed lock call leaves the session's state unknown.
			if err != nil {
				discard(conn)
			} else {
				conn.Close()
			}
			if err == nil && !here && !q.keys.heldHere(inProcess) {
				q.heldElsewhere(c.key, keyString(c.id))
			}
			q.keys.drop(inProcess)
			return nil, err == nil, err
		}
	}
	d, err = q.claimLocked(ctx, conn, ident, c, now, inProcess)
	return d, false, err
}

// claimLocked claims candidate c, whose key this process holds (inProcess)
// and, on engines with session locks, conn's session. It returns nil when
// the row was settled or claimed again since the candidate was read; then,
// as on an error, the key and conn are let go.
func (q *Queue) claimLocked(ctx context.Context, conn *sql.Conn, ident string, c candidate, now time.Time, inProcess string) (d *Delivery, err error) {
	var ex Executor = q.db
	if conn != nil {
		ex = conn
	}
	// Re-read under the lock: the row may have been settled meanwhile.
	d, err = q.claimOne(ctx, ex, &values{id: c.id, attempt: c.attempt, limit: 1, now: now})
	var unread *claimReadError
	if err != nil && q.st.Claim.Take.SQL != "" && errors.As(err, &unread) {
		// Claim counted the attempt in the statement that returned the row
		// it could not read: the attempt is given back, under the lock, so
		// that an error means nothing was claimed. (Claim.Select wrote
		// nothing yet.)
		for _, u := range unread.rows {
			_, _ = q.exec(context.WithoutCancel(ctx), ex, q.st.Settle.Release, &values{id: u.id, attempt: u.attempt})
		}
	}
	if err != nil || d == nil {
		q.release(ctx, conn, ident, c.key, inProcess)
		return nil, err
	}
	d.adv.key, d.adv.inProcess, d.adv.ident, d.adv.conn = c.key, inProcess, ident, conn
	q.track(d)
	return d, nil
}

// letGo unlocks key on conn and returns conn to the pool, or discards conn
// (ending its session, and the lock with it) when the unlock fails or ctx
// has ended: a session whose lock state is unknown never goes back.
func (q *Queue) letGo(ctx context.Context, conn *sql.Conn, ident, key string) {
	if ctx.Err() != nil || q.locker.Unlock(ctx, conn, ident, key) != nil {
		discard(conn)
		return
	}
	_ = conn.Close()
}

// settleAdvisory runs the settlement fenced by the attempt, on the pinned
// connection (then lets the lock go) or in the caller's transaction. In tx
// it is a settlement only once tx is known to have committed
// ([Delivery.Committed], or a later touch that finds the row so): until
// then the delivery keeps its lock and may be settled again. Outside a
// transaction the verdict is the statement's, or the row's as read back
// when the statement's outcome is unknown; trouble letting the lock go
// discards the connection, which ends the lock with the session.
func (d *Delivery) settleAdvisory(ctx context.Context, tx *sql.Tx, o outcome, after time.Duration) error {
	q := d.q
	var ex Executor = q.db
	if d.adv.conn != nil {
		ex = d.adv.conn
	}
	if tx != nil {
		ex = tx
	}
	v := values{id: d.id, attempt: d.attempt, micros: after.Microseconds(), errText: d.errText}
	// A context that has ended already sends nothing: no outcome to learn.
	ended := ctx.Err() != nil
	n, sent, err := d.sendAdvisory(ctx, ex, o, after, &v)
	if err != nil && v.errText != nil && (o == outRetry || o == outDead) && textRejected(err) {
		// The database refused the error text: the settlement goes again
		// without it, so that no text can keep a job from settling.
		v.errText = nil
		n, sent, err = d.sendAdvisory(ctx, ex, o, after, &v)
	}
	if tx != nil {
		return d.settledInTx(ctx, tx, o, n, sent, err)
	}
	switch {
	case err != nil && ended:
	case err != nil:
		var again func(ctx context.Context) (int64, error)
		if o == outRetry {
			again = func(ctx context.Context) (int64, error) {
				n, _, err := d.sendAdvisory(ctx, q.db, o, after, &v)
				return n, err
			}
		}
		// Read before the lock goes, while no one else can claim the row.
		err = d.readBack(ctx, o, v.until, err, again)
	case n == 0:
		err = d.learn(ctx, ex)
	default:
		d.pending = nil
		if o == outAck || o == outDead {
			q.gone.add(d.id)
		}
	}
	// The lock is let go whatever happened: a job whose settlement failed is
	// given back rather than held by a worker that has moved on.
	d.unlock(ctx)
	return err
}

// settledInTx is settleAdvisory's end in the caller's transaction tx,
// after statements that settled n rows (sent: any were sent) or failed
// with err.
func (d *Delivery) settledInTx(ctx context.Context, tx *sql.Tx, o outcome, n int64, sent bool, err error) error {
	switch {
	case err != nil:
		// What the statement did is the transaction's, which the caller
		// ends: the delivery keeps its lock.
		return err
	case n == 0:
		err = d.learn(ctx, tx)
	case sent:
		d.setPending(o, tx, time.Time{})
		return nil
	}
	// A verdict, or nothing written (a Retry without delay or error text):
	// the transaction cannot change it.
	d.unlock(ctx)
	return err
}

// sendAdvisory sends the statements of outcome o with v through ex and
// returns the rows it settled, and whether it sent any (a Retry writes only
// a delay or an error text, where the table has their columns).
func (d *Delivery) sendAdvisory(ctx context.Context, ex Executor, o outcome, after time.Duration, v *values) (int64, bool, error) {
	q := d.q
	var n int64
	var err error
	switch o {
	case outAck:
		n, err = q.exec(ctx, ex, q.st.Settle.Ack, v)
	case outRelease:
		n, err = q.exec(ctx, ex, q.st.Settle.Release, v)
	case outDead:
		n, err = q.moveDead(ctx, ex, v)
	case outRetry:
		if q.st.Settle.Retry.SQL == "" || (after <= 0 && v.errText == nil) {
			return 1, false, nil
		}
		if err = q.fillTimes(ctx, ex, q.st.Settle.Retry, v, after); err == nil {
			n, err = q.exec(ctx, ex, q.st.Settle.Retry, v)
		}
		if err == nil && n == 0 && q.st.Settle.Exists.SQL != "" {
			// MySQL: the time written may be the one the row holds.
			err = q.queryRow(ctx, ex, q.st.Settle.Exists, v).Scan(&n)
		}
	}
	return n, true, err
}

// unlock finishes the delivery: its key is let go and its connection
// returned to the pool, or discarded when the unlock fails.
func (d *Delivery) unlock(ctx context.Context) {
	q := d.q
	d.settled = true
	q.release(ctx, d.adv.conn, d.adv.ident, d.adv.key, d.adv.inProcess)
	if d.adv.conn != nil {
		d.adv.conn = nil
		q.holds.unreserve(1)
	}
	q.untrack(d)
}

// release lets go of a key held in this process (inProcess) and, where
// conn is not nil, by conn's session. The process's hold goes before the
// session's, so that whoever takes the session lock next finds the key free
// in the process too; until the session's goes, the key lingers, so that a
// lock call of this process failing on it meanwhile does not take it for
// one held elsewhere.
func (q *Queue) release(ctx context.Context, conn *sql.Conn, ident, key, inProcess string) {
	if conn == nil {
		q.keys.drop(inProcess)
		return
	}
	q.keys.dropLingering(inProcess)
	q.letGo(ctx, conn, ident, key)
	q.keys.unlinger(inProcess)
}

// identity returns the table's identity as the engine resolves it, read
// once per queue (the first advisory claim) and kept.
func (q *Queue) identity(ctx context.Context) (string, error) {
	q.identMu.Lock()
	defer q.identMu.Unlock()
	if q.ident != "" {
		return q.ident, nil
	}
	ti, ok := capability[dialect.TableIdentifier](q.dialect)
	if !ok {
		q.ident = q.names.Raw.Name
		return q.ident, nil
	}
	ident, err := ti.TableIdentity(ctx, q.db, &q.names)
	if err != nil {
		return "", fmt.Errorf("resolving table %s: %w", q.names.Raw.Name, err)
	}
	if mem, ok := capability[dialect.InMemory](q.dialect); ok && q.locker == nil && mem.IsInMemory(ident) {
		// A database in memory is its pool's: so are its keys. (Set
		// before ident, which every reader of q.keys waits for.)
		q.keys = keySet{scope: q.db}
	}
	q.ident = ident
	return ident, nil
}

// goneSet remembers the ids of the rows a queue deleted lately (an Ack or a
// dead move outside a transaction), so that the walk from Go passes over a
// candidate read before the delete reached it, rather than spend a lock
// call, a re-read finding nothing and an unlock on it. With many workers in
// one process most stale candidates are rows its own workers just acked.
//
// A candidate is passed over only when its page was read before the delete
// was known (since): an id used again by a later row (SQLite reuses the
// highest) is tried as usual by any read after. Passing a row over never
// claims anything wrongly; the lock and the re-read still decide. The ids
// are kept in a ring of goneRing; one forgotten costs those calls again.
type goneSet struct {
	mu   sync.Mutex
	seq  uint64         // counts the page reads that marked
	ids  map[any]uint64 // id → seq when its delete was known
	ring []any
	next int
}

// goneRing bounds the ids a goneSet keeps.
const goneRing = 1024

// mark is taken before a page of candidates is read.
func (g *goneSet) mark() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.seq++
	return g.seq
}

// add records that the row id is deleted.
func (g *goneSet) add(id any) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ids == nil {
		g.ids, g.ring = make(map[any]uint64, goneRing), make([]any, goneRing)
	}
	if old := g.ring[g.next]; old != nil {
		delete(g.ids, old)
	}
	g.ring[g.next], g.next = id, (g.next+1)%goneRing
	g.ids[id] = g.seq
}

// since reports whether the row id was deleted after a page marked read
// was begun, so that the page's copy of it is stale.
func (g *goneSet) since(id any, read uint64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	at, ok := g.ids[id]
	return ok && at >= read
}

// heldSet remembers the keys a walk found locked by another process's
// session, so that this queue's next claims pass them over for a while
// instead of spending a lock call each on them. With workers in several
// processes the head of every page is mostly keys the other processes
// hold: without it, every claim of every worker tried each of them again
// (measured: 4 processes of 16 workers on MariaDB at 0.14 of one process's
// rate).
//
// A key is recorded only when no session of this process held it during
// the failed lock call ([keySet.heldHere]): a key this process lets go of
// wakes its own loops, which must find it. (A session closed rather than
// unlocked may hold its lock on the server a moment longer: such a key may
// be passed over too.) A key is passed over while its first row in the
// page is the row whose lock failed, for heldFor at most; a page without
// that row (its holder deleted it: an Ack, a dead move) tries the key's
// next row at once. Passing a key over never claims anything wrongly; a key
// another process let go with its row kept (a Release, a Retry, a holder
// gone) waits at most heldFor for this queue, while that process's own
// loops, which its settlement woke, may take it at once. The keys are kept
// in a ring of goneRing; one forgotten is tried again.
type heldSet struct {
	mu   sync.Mutex
	rows map[string]heldRow // key → the row whose lock failed
	ring []string
	next int
	// clock is nil for time.Now (tests set their own). Not Config.Now: the
	// set measures contention, and a frozen test clock would pass a key
	// over for ever.
	clock func() time.Time
}

type heldRow struct {
	id    string // keyString of the row's id
	until time.Time
}

// heldFor bounds how long a key found held elsewhere is passed over.
const heldFor = 100 * time.Millisecond

func (h *heldSet) now() time.Time {
	if h.clock != nil {
		return h.clock()
	}
	return time.Now()
}

// add records that key was found held elsewhere just now, on the row id.
func (h *heldSet) add(key, id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.rows == nil {
		h.rows, h.ring = make(map[string]heldRow, goneRing), make([]string, goneRing)
	}
	if _, known := h.rows[key]; !known {
		if old := h.ring[h.next]; old != "" {
			delete(h.rows, old)
		}
		h.ring[h.next], h.next = key, (h.next+1)%goneRing
	}
	h.rows[key] = heldRow{id: id, until: h.now().Add(heldFor)}
}

// held reports whether key's candidate row id is the one found held
// elsewhere less than heldFor ago.
func (h *heldSet) held(key, id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	r, ok := h.rows[key]
	return ok && r.id == id && h.now().Before(r.until)
}
