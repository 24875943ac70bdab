package inbox

import (
	"context"
	"errors"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"time"
)

// pick claims up to want rows through ex in two steps (Statements.Claim.Pick):
// candidates are read without locks, in claim order, a page at a time, and
// PickLock locks them by primary key, skipping rows others hold. A locking
// read that sorts (InnoDB's, when no index gives the claim order over the
// claimable rows) keeps the lock of every row it read, returned or not, for
// as long as the claim's transaction: under the row lock, as long as the
// handler runs, while every other claim finds those rows taken.
//
// PickLock takes candidates of one priority at a time, whose id order is
// the claim order, and stops at its LIMIT: it locks the rows it returns and
// no others. Pages follow one another in claim order, each twice as long as
// the last, until want rows are locked or the candidates end, so that a
// free job is found whatever number of held ones come before it. The
// candidates in hand are tried before the next page is read. With PickMore
// (the lease's free rows beside its expired ones), the two sets are merged
// in claim order. clock, when set, receives the engine's clock from the
// first PickLock that returned rows.
func (q *Queue) pick(ctx context.Context, ex Executor, want int, now time.Time, clock *time.Time) ([]*Delivery, error) {
	ds := make([]*Delivery, 0, want)
	srcs := q.pickSources(want)
	per := 0 // candidates one PickLock names
	for _, a := range q.st.Claim.PickLock.Args {
		if a == dialect.ArgID {
			per++
		}
	}
	chunk := make([]token, 0, per)
	var priority int64 // the chunk's
	lock := func() error {
		v := values{tokens: chunk, limit: want - len(ds), now: now}
		chunk = chunk[:0]
		rows, err := q.query(ctx, ex, q.st.Claim.PickLock, &v)
		if err != nil {
			return err
		}
		ds, err = q.scanClaimed(rows, false, ds, 0, clock, q.st.Claim.PickLock.Level)
		return err
	}
	for len(ds) < want {
		if len(chunk) > 0 && needRead(srcs) {
			// The candidates in hand first: a page read costs a round
			// trip that a free job among them makes needless.
			if err := lock(); err != nil {
				return ds, err
			}
			continue
		}
		c, ok, err := q.nextPick(ctx, ex, srcs, now)
		if err != nil {
			return ds, err
		}
		if !ok {
			if len(chunk) > 0 {
				err = lock()
			}
			return ds, err
		}
		if len(chunk) > 0 && (len(chunk) == per || c.priority != priority) {
			if err := lock(); err != nil || len(ds) == want {
				return ds, err
			}
		}
		chunk = append(chunk, token{id: c.id})
		priority = c.priority
	}
	return ds, nil
}

// pickSources returns the sources of a pick's candidates, each read from
// its first page (firstPage).
func (q *Queue) pickSources(want int) []*pickSource {
	srcs := []*pickSource{{first: q.st.Claim.Pick, after: q.st.Claim.PickAfter}}
	if q.st.Claim.PickMore.SQL != "" {
		srcs = append(srcs, &pickSource{first: q.st.Claim.PickMore, after: q.st.Claim.PickMoreAfter})
	}
	for _, s := range srcs {
		s.limit = q.firstPage(want)
	}
	return srcs
}

// firstPage is the size of a pick's first page of candidates: it passes
// the rows this queue's jobs in work hold (row lock), which are at the
// head of the queue, in one read, and the row each other claim under way
// may have locked and not yet tracked: with many workers, a page of the
// jobs in work alone was now and then all held, each time sending the
// claims after it down the two-statement pick (pickPastSpan).
func (q *Queue) firstPage(want int) int {
	first := 2*want + 8
	if q.names.Form == RowLock {
		first += q.InWork() + int(max(q.picking.Load()-1, 0))
	}
	return first
}

// pickPastSpan is how many claims pick without Claim.PickFirst after one
// whose page was all held found a job past it; the next PickFirst looks
// again.
const pickPastSpan = 64

// walkPastSpan is how many claims go without Claim.WalkFirst after one
// that returned no row: it read its bound of rows not yet ready (or the
// queue was empty), and claims page through the not-before index instead.
const walkPastSpan = 64

// errWalkEnded: Claim.WalkFirst returned no row, and may have left a row
// it could not claim locked; the claim's transaction rolls back and the
// claim begins again without it.
var errWalkEnded = errors.New("inbox: the walk ended before a claimable row")

// pickOne claims one row under the row lock: by Claim.WalkFirst, where the
// dialect has it and no walk came back empty within the last walkPastSpan
// claims; else by Claim.PickFirst, one
// statement, where the dialect has it; when that finds the first page's
// rows all held, or there is none, by a pick, which pages on. The page
// passes the rows this queue's jobs hold, not those of other processes:
// when they fill it, PickFirst is a statement more per claim, and is left
// out for a span of claims.
func (q *Queue) pickOne(ctx context.Context, ex Executor, now time.Time) ([]*Delivery, error) {
	if walk := q.st.Claim.WalkFirst; walk.SQL != "" && !spend(&q.walkPast) {
		rows, err := q.query(ctx, ex, walk, &values{limit: 1, now: now})
		if err != nil {
			return nil, err
		}
		ds, err := q.scanClaimed(rows, false, nil, 0, nil, walk.Level)
		if err != nil || len(ds) > 0 {
			return ds, err
		}
		q.walkPast.Store(walkPastSpan)
		return nil, errWalkEnded
	}
	first := q.st.Claim.PickFirst
	if first.SQL == "" || spend(&q.pickPast) {
		return q.pick(ctx, ex, 1, now, nil)
	}
	rows, err := q.query(ctx, ex, first, &values{limit: q.firstPage(1), now: now})
	if err != nil {
		return nil, err
	}
	ds, err := q.scanClaimed(rows, false, nil, 0, nil, first.Level)
	if err != nil || len(ds) > 0 {
		return ds, err
	}
	if ds, err = q.pick(ctx, ex, 1, now, nil); len(ds) > 0 {
		q.pickPast.Store(pickPastSpan)
	}
	return ds, err
}

func needRead(srcs []*pickSource) bool {
	for _, s := range srcs {
		if s.needsRead() {
			return true
		}
	}
	return false
}

// nextPick takes the next candidate in claim order among srcs, reading the
// next page of those that need one; ok is false once they are all spent.
func (q *Queue) nextPick(ctx context.Context, ex Executor, srcs []*pickSource, now time.Time) (c pickCandidate, ok bool, err error) {
	var best *pickSource
	for _, s := range srcs {
		if s.needsRead() {
			if err := q.readPicks(ctx, ex, s, now); err != nil {
				return c, false, err
			}
		}
		if s.pos < len(s.buf) && (best == nil || s.buf[s.pos].before(best.buf[best.pos])) {
			best = s
		}
	}
	if best == nil {
		return c, false, nil
	}
	best.pos++
	return best.buf[best.pos-1], true, nil
}

// pickSource is one set of candidates of a pick: the page in hand and
// where the next one starts.
type pickSource struct {
	first, after dialect.Stmt
	buf          []pickCandidate
	pos          int
	limit        int  // the size of the next page
	read, more   bool // a page was read; it was full, so rows may follow
}

func (s *pickSource) needsRead() bool {
	return s.pos == len(s.buf) && (!s.read || s.more)
}

// pickCandidate is a row a pick may lock.
type pickCandidate struct {
	id       any
	priority int64
}

// before reports whether c comes before o in the claim order: the highest
// priority first, then the lowest id.
func (c pickCandidate) before(o pickCandidate) bool {
	return claimBefore(c.priority, c.id, o.priority, o.id)
}

// claimBefore reports whether the row (ap, aid) comes before (bp, bid) in
// the claim order: the highest priority first, then the lowest id. Text
// ids compare by their bytes, which the table's collation may not.
func claimBefore(ap int64, aid any, bp int64, bid any) bool {
	if ap != bp {
		return ap > bp
	}
	switch a := aid.(type) {
	case int64:
		if b, ok := bid.(int64); ok {
			return a < b
		}
	case string:
		if b, ok := bid.(string); ok {
			return a < b
		}
	}
	return fmt.Sprint(aid) < fmt.Sprint(bid)
}

// readPicks reads the next page of s: its first, or the one after the last
// candidate read, twice as long.
func (q *Queue) readPicks(ctx context.Context, ex Executor, s *pickSource, now time.Time) error {
	st := s.first
	v := values{limit: s.limit, now: now}
	if s.read {
		last := s.buf[len(s.buf)-1]
		st, v.id, v.priority = s.after, last.id, last.priority
		s.limit = min(2*s.limit, maxCandidatePage)
		v.limit = s.limit
	}
	rows, err := q.query(ctx, ex, st, &v)
	if err != nil {
		return err
	}
	defer rows.Close()
	s.buf, s.pos, s.read = s.buf[:0], 0, true
	var id any
	var c pickCandidate
	dest := []any{&id, &c.priority}
	if q.names.Priority == "" {
		dest = dest[:1]
	}
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return err
		}
		c.id = normID(id)
		s.buf = append(s.buf, c)
	}
	s.more = len(s.buf) == v.limit
	return rows.Err()
}
