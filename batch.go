package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ErrBatcherClosed is returned by the settlements of a [Batcher] after
// [Batcher.Close]; nothing was changed and the delivery may still be settled
// another way.
var ErrBatcherClosed = errors.New("inbox: batcher closed")

// maxBatch bounds [BatchConfig.MaxBatch]: past a few hundred tokens a longer
// statement saves nothing, and every engine's parameter limit stays far away.
const maxBatch = 256

// BatchDialect is implemented by a [Dialect] that can settle many lease
// deliveries in one statement; [Queue.NewBatcher] needs it. Postgres, MySQL
// and SQLite implement it.
type BatchDialect interface {
	// BatchStatements returns the statements settling size lease tokens at
	// once. Called by NewBatcher only, for a few sizes, never per flush.
	BatchStatements(n *Names, size int) (*BatchStatements, error)
}

// BatchArg is one parameter of a [BatchStmt]: ArgID, ArgAttempt or ArgExpiry
// of the token numbered Token (from 0), or a value of the whole batch
// (ArgNow, ArgUntil, ArgMicros), whose Token is ignored.
type BatchArg struct {
	Arg   Arg
	Token int
}

// BatchStmt is one statement over a batch of tokens.
type BatchStmt struct {
	SQL  string
	Args []BatchArg
	// Rows is true when the statement returns the id of every row it
	// settled (RETURNING); otherwise it runs in a transaction checked by its
	// rows affected and, when that count falls short, by
	// [BatchStatements.Lock].
	Rows bool
}

// BatchStatements settle Size lease tokens (id, stored attempt, expiry) at
// once, each a compare-and-set on its own token as the single-job
// settlements are. The batcher fills unused token slots with copies of the
// last token, so a statement's size need not match the batch's exactly.
type BatchStatements struct {
	Size int
	// Ack deletes the rows; Release clears their leases and gives their
	// attempts back; Retry sets their expiry to ArgUntil, or to the engine's
	// clock plus ArgMicros.
	Ack, Release, Retry BatchStmt
	// Lock returns the ids of the rows still carrying their tokens and locks
	// them until the transaction ends. Engines whose statements cannot
	// return the rows they changed (MySQL) set it: when a statement affects
	// fewer rows than the batch has tokens, the batcher rolls back and runs
	// Lock then the statement again in a new transaction, so that each job
	// learns its own result.
	Lock BatchStmt
}

// BatchConfig configures a [Batcher]. Its zero value means the defaults.
type BatchConfig struct {
	// MaxBatch is the most settlements one statement carries. Zero means 16;
	// at most 256.
	MaxBatch int
	// MaxWait, when positive, is how long a flush that has fewer than
	// MaxBatch settlements waits for more before it is sent. Zero sends a
	// batch as soon as a flusher is free ("group commit"): a lone worker is
	// never slowed, and settlements arriving while a flush is in flight form
	// the next batch.
	MaxWait time.Duration
	// Flushers is how many batches may be in flight at once. Zero means 1.
	Flushers int
}

// Batcher settles lease deliveries of one queue in batches: settlements
// from many goroutines are grouped into one statement per batch, each still
// a compare-and-set on its own token, and each caller gets its own result.
// It runs the goroutines of its flushers from [Queue.NewBatcher] until
// [Batcher.Close]. Its methods are safe for concurrent use.
//
// A settlement through a Batcher ends the delivery as the same settlement
// called on the delivery would (its keeper is stopped first), and it costs
// the caller the wait for its batch: with the default group commit, the time
// of the flush in flight when it arrived, then of its own.
//
// Dead has no batched form: a job that goes to the dead table is rare
// enough to take [Delivery.Dead].
type Batcher struct {
	q        *Queue
	max      int
	wait     time.Duration
	sets     []*BatchStatements // by increasing Size; the last has Size max
	needsNow [3]bool            // per outcome: a statement takes ArgNow or ArgUntil

	mu      sync.Mutex
	pending []*batchItem
	closed  bool
	wake    chan struct{} // a settlement is pending (buffered, one)
	closing chan struct{} // closed by Close
	wg      sync.WaitGroup
}

// batchItem is one settlement waiting for its batch.
type batchItem struct {
	id      any
	attempt int64 // delivered
	expiry  time.Time
	o       outcome
	after   time.Duration
	err     error
	res     chan error // buffered, one: the flusher never waits on it
	fl      *flight    // the flight that took it; nil while pending
}

var itemPool = sync.Pool{New: func() any { return &batchItem{res: make(chan error, 1)} }}

// flight is one flush in progress: its statements are cancelled when every
// caller waiting for it has given up.
type flight struct {
	ctx     context.Context
	cancel  context.CancelFunc
	waiting atomic.Int32
}

func (f *flight) abandon() {
	if f.waiting.Add(-1) == 0 {
		f.cancel()
	}
}

// NewBatcher returns a batcher settling the lease deliveries of q, and starts
// its flushers; [Batcher.Close] stops them. It does no I/O. It returns an
// error when q is not of the lease form, when q's dialect is not a
// [BatchDialect], or when cfg is out of range.
func (q *Queue) NewBatcher(cfg BatchConfig) (*Batcher, error) {
	if q.names.Form != Lease {
		return nil, fmt.Errorf("inbox: NewBatcher: batched settlement is for the lease form, not the %s form", q.names.Form)
	}
	bd, ok := q.dialect.(BatchDialect)
	if !ok {
		return nil, fmt.Errorf("inbox: NewBatcher: dialect %s has no batched statements (BatchDialect)", q.dialect.Name())
	}
	switch {
	case cfg.MaxBatch < 0 || cfg.MaxBatch > maxBatch:
		return nil, fmt.Errorf("inbox: NewBatcher: BatchConfig.MaxBatch %d must be from 1 to %d (0 for 16)", cfg.MaxBatch, maxBatch)
	case cfg.MaxWait < 0:
		return nil, fmt.Errorf("inbox: NewBatcher: BatchConfig.MaxWait %v is negative", cfg.MaxWait)
	case cfg.Flushers < 0:
		return nil, fmt.Errorf("inbox: NewBatcher: BatchConfig.Flushers %d is negative", cfg.Flushers)
	}
	b := &Batcher{q: q, max: cfg.MaxBatch, wait: cfg.MaxWait,
		wake: make(chan struct{}, 1), closing: make(chan struct{})}
	if b.max == 0 {
		b.max = 16
	}
	flushers := cfg.Flushers
	if flushers == 0 {
		flushers = 1
	}
	// Sizes are powers of two up to MaxBatch, and MaxBatch itself: a few
	// statements built here cover every batch, padded with its last token,
	// instead of one per size or SQL assembled per flush.
	for size := 1; ; size *= 2 {
		if size > b.max {
			size = b.max
		}
		st, err := bd.BatchStatements(&q.names, size)
		if err != nil {
			return nil, fmt.Errorf("inbox: NewBatcher: %s: %w", q.dialect.Name(), err)
		}
		if st.Size != size || st.Ack.SQL == "" || st.Release.SQL == "" || st.Retry.SQL == "" ||
			(!st.Ack.Rows || !st.Release.Rows || !st.Retry.Rows) && st.Lock.SQL == "" {
			return nil, fmt.Errorf("inbox: NewBatcher: %s: incomplete batch statements for size %d", q.dialect.Name(), size)
		}
		b.sets = append(b.sets, st)
		if size == b.max {
			break
		}
	}
	for _, o := range []outcome{outAck, outRetry, outRelease} {
		for _, a := range batchStmt(b.sets[0], o).Args {
			if a.Arg == ArgNow || a.Arg == ArgUntil {
				b.needsNow[o] = true
			}
		}
	}
	b.wg.Add(flushers)
	for i := 0; i < flushers; i++ {
		go b.run()
	}
	return b, nil
}

func batchStmt(st *BatchStatements, o outcome) BatchStmt {
	switch o {
	case outRetry:
		return st.Retry
	case outRelease:
		return st.Release
	}
	return st.Ack
}

// Ack is [Delivery.Ack] in a batch: it returns when the batch holding d has
// been flushed, with nil when the row was deleted, [ErrLeaseLost] when it no
// longer carried d's token, [ErrSettled] when d was settled before, and
// [ErrBatcherClosed] after Close. A driver error fails every job of its
// batch, and leaves each delivery to be settled again. When ctx ends before
// the batch is sent, d is left as it was; when it ends while the batch is in
// flight, Ack returns ctx's error at once and the outcome is unknown, as
// when a plain settlement is cancelled: settling d again then returns
// [ErrLeaseLost] if the flush did delete the row.
func (b *Batcher) Ack(ctx context.Context, d *Delivery) error {
	return b.settle(ctx, d, outAck, 0)
}

// Retry is [Delivery.Retry] in a batch: the lease is set to end after
// after. Results and errors are those of [Batcher.Ack].
func (b *Batcher) Retry(ctx context.Context, d *Delivery, after time.Duration) error {
	return b.settle(ctx, d, outRetry, after)
}

// Release is [Delivery.Release] in a batch: the lease is cleared and the
// attempt given back. Results and errors are those of [Batcher.Ack].
func (b *Batcher) Release(ctx context.Context, d *Delivery) error {
	return b.settle(ctx, d, outRelease, 0)
}

// settle mirrors Delivery.settle: the keeper stops first, then d's lock is
// held until the verdict, so that no extension moves the token meanwhile.
func (b *Batcher) settle(ctx context.Context, d *Delivery, o outcome, after time.Duration) error {
	if d.q != b.q {
		return fmt.Errorf("inbox: %v: the delivery belongs to another queue than the batcher's", o)
	}
	d.stopKeeper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.settled {
		return fmt.Errorf("inbox: %v: %w", o, ErrSettled)
	}
	if after < 0 {
		return fmt.Errorf("inbox: %v: delay %v is negative", o, after)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("inbox: %v: %w", o, err)
	}
	it := itemPool.Get().(*batchItem)
	it.id, it.attempt, it.expiry, it.o, it.after, it.err, it.fl = d.id, d.attempt, d.expiry, o, after, nil, nil
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		itemPool.Put(it)
		return fmt.Errorf("inbox: %v: %w", o, ErrBatcherClosed)
	}
	b.pending = append(b.pending, it)
	b.mu.Unlock()
	b.signal()
	var err error
	select {
	case err = <-it.res:
	case <-ctx.Done():
		select {
		case err = <-it.res:
		default:
			if b.withdraw(it) {
				itemPool.Put(it)
				return fmt.Errorf("inbox: %v: %w", o, ctx.Err())
			}
			select {
			case err = <-it.res:
			default:
				// In flight: the flusher still owns the item and will
				// write its result into the buffered channel; it is not
				// reused.
				return fmt.Errorf("inbox: %v: %w", o, ctx.Err())
			}
		}
	}
	itemPool.Put(it)
	if err == nil || errors.Is(err, ErrLeaseLost) {
		d.settled = true
	}
	if err != nil {
		return fmt.Errorf("inbox: %v: %w", o, err)
	}
	return nil
}

// withdraw takes a pending item back, reporting false when a flush has taken
// it already (and then gives up waiting for that flush).
func (b *Batcher) withdraw(it *batchItem) bool {
	b.mu.Lock()
	fl := it.fl
	if fl == nil {
		for i, p := range b.pending {
			if p == it {
				b.pending = append(b.pending[:i], b.pending[i+1:]...)
				break
			}
		}
	}
	b.mu.Unlock()
	if fl != nil {
		fl.abandon()
		return false
	}
	return true
}

func (b *Batcher) signal() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// Close sends the settlements still pending, waits for every flush to end
// and stops the flushers. Settlements called after it return
// [ErrBatcherClosed]. Close is idempotent.
func (b *Batcher) Close() {
	b.mu.Lock()
	if !b.closed {
		b.closed = true
		close(b.closing)
	}
	b.mu.Unlock()
	b.wg.Wait()
}

// flusher is one flusher's reusable state, so a flush allocates little.
type flusher struct {
	items             []*batchItem // the batch in flight
	todo, group, rest []*batchItem // flush's scratch
	args              []any
	timer             *time.Timer
}

func (b *Batcher) run() {
	defer b.wg.Done()
	f := &flusher{items: make([]*batchItem, 0, b.max), args: make([]any, 0, 3*b.max+1)}
	for {
		fl := &flight{}
		fl.ctx, fl.cancel = context.WithCancel(context.Background())
		if !b.gather(f, fl) {
			fl.cancel()
			return
		}
		b.flush(f, fl)
		fl.cancel()
	}
}

// gather waits for pending settlements and takes up to max of them into
// f.items, marking them as in flight fl; with MaxWait it first waits that
// long for max to be pending. It returns false once the batcher is closed
// and drained. Items stay pending, where their callers may withdraw them,
// until the flush that sends them takes them.
func (b *Batcher) gather(f *flusher, fl *flight) bool {
	f.items = f.items[:0]
	var deadline <-chan time.Time
	for {
		b.mu.Lock()
		n, closed := len(b.pending), b.closed
		ready := n > 0 && (b.wait <= 0 || n >= b.max || closed || deadline != nil && expired(deadline))
		if ready {
			b.takeLocked(f, fl)
			n = len(b.pending)
		}
		b.mu.Unlock()
		if ready {
			if n > 0 {
				// Another flusher may serve what this batch could not
				// hold.
				b.signal()
			}
			if len(f.items) > 0 {
				b.stopTimer(f, deadline)
				return true
			}
		}
		if closed && n == 0 {
			b.stopTimer(f, deadline)
			return false
		}
		if n == 0 && deadline != nil {
			// Another flusher took what this one was waiting on.
			b.stopTimer(f, deadline)
			deadline = nil
		}
		if n > 0 && deadline == nil && b.wait > 0 {
			if f.timer == nil {
				f.timer = time.NewTimer(b.wait)
			} else {
				f.timer.Reset(b.wait)
			}
			deadline = f.timer.C
		}
		select {
		case <-b.wake:
		case <-b.closing:
		case <-deadline:
			deadline = closedTime
		}
	}
}

// closedTime is a channel that is always ready: a deadline that has passed.
var closedTime = func() <-chan time.Time {
	c := make(chan time.Time)
	close(c)
	return c
}()

func expired(c <-chan time.Time) bool { return c == closedTime }

// stopTimer stops f's timer if deadline is its still running channel.
func (b *Batcher) stopTimer(f *flusher, deadline <-chan time.Time) {
	if deadline == nil || deadline == closedTime {
		return
	}
	if !f.timer.Stop() {
		select {
		case <-f.timer.C:
		default:
		}
	}
}

// takeLocked moves pending items into f.items, up to max, skipping an item
// whose id is in the batch already (another delivery of the same job, one
// of them stale): a statement returning ids could not tell their results
// apart, so the later waits for the next batch.
func (b *Batcher) takeLocked(f *flusher, fl *flight) {
	kept := b.pending[:0]
	for _, it := range b.pending {
		if len(f.items) == b.max || f.has(it.id) {
			kept = append(kept, it)
			continue
		}
		it.fl = fl
		fl.waiting.Add(1)
		f.items = append(f.items, it)
	}
	for i := len(kept); i < len(b.pending); i++ {
		b.pending[i] = nil
	}
	b.pending = kept
}

func (f *flusher) has(id any) bool {
	for _, it := range f.items {
		if it.id == id {
			return true
		}
	}
	return false
}

// flush runs the batch, one statement per outcome and delay present in it,
// in the order of their first arrival, and hands each caller its result.
func (b *Batcher) flush(f *flusher, fl *flight) {
	f.todo = append(f.todo[:0], f.items...)
	for len(f.todo) > 0 {
		// Split stably: the items sharing the first one's outcome and
		// delay form the group; the others are left for the next round.
		o, after := f.todo[0].o, f.todo[0].after
		f.group, f.rest = f.group[:0], f.rest[:0]
		for _, it := range f.todo {
			if it.o == o && it.after == after {
				f.group = append(f.group, it)
			} else {
				f.rest = append(f.rest, it)
			}
		}
		b.settleGroup(fl.ctx, f, o, after, f.group)
		f.todo, f.rest = f.rest, f.todo
	}
	clear(f.group)
	for i, it := range f.items {
		it.res <- it.err
		f.items[i] = nil
	}
	f.items = f.items[:0]
}

// settleGroup settles items, which share outcome o and delay after, setting
// each item's err.
func (b *Batcher) settleGroup(ctx context.Context, f *flusher, o outcome, after time.Duration, items []*batchItem) {
	st := b.sets[len(b.sets)-1]
	for _, s := range b.sets {
		if s.Size >= len(items) {
			st = s
			break
		}
	}
	s := batchStmt(st, o)
	var now time.Time
	if b.needsNow[o] {
		var err error
		if now, err = b.q.readNow(ctx, b.q.db); err != nil {
			setErr(items, err)
			return
		}
	}
	args := b.args(f, s, items, now, after)
	q := b.q
	if s.Rows {
		for _, it := range items {
			it.err = ErrLeaseLost
		}
		rows, err := q.db.QueryContext(ctx, s.SQL, args...)
		if err != nil {
			setErr(items, err)
			return
		}
		if err := markReturned(rows, items); err != nil {
			setErr(items, err)
		}
		return
	}
	// The statement cannot say which rows it changed: when it changed as
	// many as there are tokens, every token matched; otherwise roll back
	// and ask under locks.
	tx, err := q.db.BeginTx(ctx, nil)
	if err != nil {
		setErr(items, err)
		return
	}
	res, err := tx.ExecContext(ctx, s.SQL, args...)
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if err != nil {
		_ = tx.Rollback()
		setErr(items, err)
		return
	}
	if n == int64(len(items)) {
		setErr(items, tx.Commit())
		return
	}
	_ = tx.Rollback()
	if tx, err = q.db.BeginTx(ctx, nil); err != nil {
		setErr(items, err)
		return
	}
	defer tx.Rollback()
	for _, it := range items {
		it.err = ErrLeaseLost
	}
	rows, err := tx.QueryContext(ctx, st.Lock.SQL, b.args(f, st.Lock, items, now, after)...)
	if err == nil {
		err = markReturned(rows, items)
	}
	if err == nil {
		args = b.args(f, s, items, now, after)
		_, err = tx.ExecContext(ctx, s.SQL, args...)
	}
	if err == nil {
		err = tx.Commit()
	}
	if err != nil {
		setErr(items, err)
	}
}

// markReturned reads the ids rows returns and clears the err of the items
// they name.
func markReturned(rows *sql.Rows, items []*batchItem) error {
	defer rows.Close()
	for rows.Next() {
		var id any
		if err := rows.Scan(&id); err != nil {
			return err
		}
		id = normID(id)
		for _, it := range items {
			if it.id == id {
				it.err = nil
			}
		}
	}
	return rows.Err()
}

func setErr(items []*batchItem, err error) {
	for _, it := range items {
		it.err = err
	}
}

// args fills f.args with the parameters of s for items, padding the token
// slots past the last item with the last item's token.
func (b *Batcher) args(f *flusher, s BatchStmt, items []*batchItem, now time.Time, after time.Duration) []any {
	d := b.q.dialect
	out := f.args[:0]
	for _, a := range s.Args {
		var it *batchItem
		if a.Token < len(items) {
			it = items[a.Token]
		} else {
			it = items[len(items)-1]
		}
		var v any
		switch a.Arg {
		case ArgID:
			v = it.id
		case ArgAttempt:
			v = it.attempt + 1
		case ArgExpiry:
			v = d.TimeArg(it.expiry)
		case ArgNow:
			v = d.TimeArg(now)
		case ArgUntil:
			v = d.TimeArg(now.Add(after))
		case ArgMicros:
			v = after.Microseconds()
		}
		out = append(out, v)
	}
	f.args = out
	return out
}

// batchBuilder writes one batch statement, recording its parameters. The
// dialects' BatchStatements use it.
type batchBuilder struct {
	b    strings.Builder
	args []BatchArg
	mark func(n int) string
}

func (s *batchBuilder) w(parts ...string) *batchBuilder {
	for _, p := range parts {
		s.b.WriteString(p)
	}
	return s
}

// p writes a placeholder for a of token (or of the batch).
func (s *batchBuilder) p(a Arg, token int) string {
	s.args = append(s.args, BatchArg{Arg: a, Token: token})
	return s.mark(len(s.args))
}

func (s *batchBuilder) stmt(rows bool) BatchStmt {
	return BatchStmt{SQL: s.b.String(), Args: s.args, Rows: rows}
}

// tokensIn writes "(id, attempt, expiry) IN ((…), …)" for size tokens, the
// row-value comparison engines with row-value IN lists plan as one primary
// key probe per token.
func (s *batchBuilder) tokensIn(n *Names, size int) {
	s.w("(", n.ID, ", ", n.Attempt, ", ", n.LockedUntil, ") IN (")
	for k := 0; k < size; k++ {
		if k > 0 {
			s.w(", ")
		}
		s.w("(", s.p(ArgID, k), ", ", s.p(ArgAttempt, k), ", ", s.p(ArgExpiry, k), ")")
	}
	s.w(")")
}

// tokensOr writes the same test as an OR of per-token conditions, for
// engines that search each disjunct by primary key but scan for a row-value
// IN (SQLite).
func (s *batchBuilder) tokensOr(n *Names, size int) {
	for k := 0; k < size; k++ {
		if k > 0 {
			s.w(" OR ")
		}
		s.w("(", n.ID, " = ", s.p(ArgID, k), " AND ", n.Attempt, " = ", s.p(ArgAttempt, k), " AND ", n.LockedUntil, " = ", s.p(ArgExpiry, k), ")")
	}
}
