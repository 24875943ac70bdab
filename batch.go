package inbox

import (
	"context"
	"errors"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"sync"
	"time"
)

// ErrBatcherClosed is returned by the settlements of a [Batcher] after
// [Batcher.Close]; nothing was changed and the delivery may still be settled
// another way.
var ErrBatcherClosed = errors.New("inbox: batcher closed")

// maxBatch bounds [BatchConfig.MaxBatch]: past a few hundred tokens a longer
// statement saves nothing, and every engine's parameter limit stays far away.
const maxBatch = 256

// BatchConfig configures a [Batcher]. Its zero value means the defaults.
type BatchConfig struct {
	// MaxBatch is the most settlements one statement carries. Zero means 16;
	// at most 256.
	MaxBatch int
	// MaxWait, when positive, is how long a batch with fewer than MaxBatch
	// settlements waits for more before it is sent. Zero sends a batch as
	// soon as a flush may start ("group commit"): a lone worker is never
	// slowed, and settlements arriving while flushes are in flight form
	// the next batch.
	MaxWait time.Duration
	// Flushers is how many batches may be in flight at once. Zero means 4:
	// the engine shares one flush of its log between the commits waiting
	// together, so batches side by side cost little more than one, where a
	// single one would queue every worker behind one statement.
	Flushers int
}

// Batcher settles lease deliveries of one queue in batches: settlements
// from many goroutines share one statement, each still a compare-and-set on
// its own token, and each caller gets its own result, the one the same
// settlement called on the delivery would return. Its methods are safe for
// concurrent use. Dead has no batched form: use [Delivery.Dead].
//
// A Batcher starts no goroutine of its own (context.AfterFunc runs one when
// a sender's context ends mid-batch). Up to Flushers batches are in flight at
// once, each gathered and sent by one of the callers waiting (group commit):
// a caller with a settlement still pending takes a free slot, sends what is
// pending with its own, and frees the slot; every caller still pending is
// woken then, and the first to look takes it.
//
// The designs rejected on the way, and the figures that decided them, are in
// docs/design/batcher.md.
type Batcher struct {
	q     *Queue
	max   int
	wait  time.Duration
	lanes int
	sets  []*dialect.BatchStatements // by increasing Size; the last has Size max

	mu      sync.Mutex
	pending []*batchItem // each belongs to a caller waiting in run
	flying  int          // batches being gathered or sent: at most lanes
	closed  bool
	idle    *sync.Cond    // on mu: flying or pending dropped
	wake    chan struct{} // closed and replaced when a slot frees, or (MaxWait) a batch fills or is taken
	closing chan struct{} // closed by Close
}

// NewBatcher returns a batcher settling the lease deliveries of q. It does
// no I/O and starts no goroutine. It returns an error when q is not of the
// lease form, when q's dialect is not a [dialect.BatchDialect], or when cfg is out of
// range.
func (q *Queue) NewBatcher(cfg BatchConfig) (*Batcher, error) {
	if !q.form.leased() {
		return nil, fmt.Errorf("inbox: new batcher: batched settlement is for the lease form, not the %s form", q.names.Form)
	}
	bd, ok := capability[dialect.BatchDialect](q.dialect)
	if !ok {
		return nil, fmt.Errorf("inbox: new batcher: dialect %s has no batched statements (BatchDialect)", q.dialect.Name())
	}
	switch {
	case cfg.MaxBatch < 0 || cfg.MaxBatch > maxBatch:
		return nil, fmt.Errorf("inbox: new batcher: BatchConfig.MaxBatch %d must be from 1 to %d (0 for 16)", cfg.MaxBatch, maxBatch)
	case cfg.MaxWait < 0:
		return nil, fmt.Errorf("inbox: new batcher: BatchConfig.MaxWait %v is negative", cfg.MaxWait)
	case cfg.Flushers < 0:
		return nil, fmt.Errorf("inbox: new batcher: BatchConfig.Flushers %d is negative", cfg.Flushers)
	}
	b := &Batcher{q: q, max: cfg.MaxBatch, wait: cfg.MaxWait, lanes: cfg.Flushers,
		wake: make(chan struct{}), closing: make(chan struct{})}
	b.idle = sync.NewCond(&b.mu)
	if b.max == 0 {
		b.max = 16
	}
	if b.lanes == 0 {
		b.lanes = 4
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
			return nil, fmt.Errorf("inbox: new batcher: %s: %w", q.dialect.Name(), err)
		}
		if st.Size != size || st.Ack.SQL == "" || st.Release.SQL == "" || st.Retry.SQL == "" ||
			(!st.Ack.Rows || !st.Release.Rows || !st.Retry.Rows) && st.Lock.SQL == "" {
			return nil, fmt.Errorf("inbox: new batcher: %s: incomplete batch statements for size %d", q.dialect.Name(), size)
		}
		b.sets = append(b.sets, st)
		if size == b.max {
			break
		}
	}
	return b, nil
}

// Ack is [Delivery.Ack] in a batch and returns what it would: nil when the
// row was deleted, [ErrLeaseLost] when the row no longer carried d's token,
// an error matching [ErrSettled] (and ErrLeaseLost after a lost lease) when
// d was settled before (a settlement in the caller's transaction, such as
// [Delivery.AckTx], that committed without [Delivery.Committed] included:
// when the token is gone the row is read back, as Delivery.Ack does), or a
// driver error, which fails the whole batch and
// leaves d to be settled again. After Close it returns [ErrBatcherClosed].
// When ctx ends before d's batch is sent, it returns ctx's error at once.
// When ctx ends while d's batch is in flight, or the batch fails, the
// outcome is read back as for [Delivery.Ack], on a short context of its
// own: nil or ErrLeaseLost when the row tells, the error when d still holds
// the lease (d may be settled again), an error matching
// [ErrOutcomeUnknown] when the read fails too.
func (b *Batcher) Ack(ctx context.Context, d *Delivery) error {
	return b.settle(ctx, d, outAck, 0)
}

// Retry is [Delivery.Retry] in a batch: the lease is set to end after
// after. Results and errors are those of [Batcher.Ack].
func (b *Batcher) Retry(ctx context.Context, d *Delivery, after time.Duration) error {
	if d.q == b.q && b.q.names.LastError != "" && d.recordedError() {
		// The batch statement writes no error text: a Retry that records
		// one is settled alone.
		return d.Retry(ctx, after)
	}
	return b.settle(ctx, d, outRetry, after)
}

// Release is [Delivery.Release] in a batch: the lease is cleared and the
// attempt given back. Results and errors are those of [Batcher.Ack].
func (b *Batcher) Release(ctx context.Context, d *Delivery) error {
	return b.settle(ctx, d, outRelease, 0)
}

// AckAll is [Batcher.Ack] of several deliveries queued together, such as
// the jobs of one Claim, so that they share a statement. It returns each
// delivery's error in the order of ds; a delivery given twice gets an error
// the second time.
func (b *Batcher) AckAll(ctx context.Context, ds []*Delivery) []error {
	return b.settleAll(ctx, ds, outAck)
}

// ReleaseAll is [Batcher.Release] of several deliveries queued together, as
// [Batcher.AckAll] is for Ack: jobs a loop claimed and will not run go back
// in one statement, their attempts not spent. The errors are in ds's order.
func (b *Batcher) ReleaseAll(ctx context.Context, ds []*Delivery) []error {
	return b.settleAll(ctx, ds, outRelease)
}

// settleAll settles ds together by o (acknowledgement or release).
func (b *Batcher) settleAll(ctx context.Context, ds []*Delivery, o outcome) []error {
	errs := make([]error, len(ds))
	items := make([]*batchItem, len(ds))
	held := make([]*Delivery, 0, len(ds))
	seen := newDeliverySet(len(ds))
	for i, d := range ds {
		switch {
		case seen.add(ds[:i], d):
			errs[i] = fmt.Errorf("inbox: %s: the delivery is given twice", o)
		default:
			errs[i] = batched{b}.admit(ctx, d, o, 0)
		}
		if errs[i] == nil {
			d.pauseKeeper()
			held = append(held, d)
		}
	}
	lockAll(held)
	defer func() {
		for _, d := range held {
			d.mu.Unlock()
		}
	}()
	own := make([]*batchItem, 0, len(held))
	slab := make([]batchItem, len(held)) // one allocation for all
	for i, d := range ds {
		if errs[i] != nil {
			continue
		}
		if errs[i] = recheck(ctx, d, o); errs[i] == nil {
			items[i] = &slab[len(own)]
			*items[i] = itemOf(d, o, 0)
			own = append(own, items[i])
		}
	}
	if len(own) == 0 {
		return errs
	}
	if err := b.run(ctx, own); err != nil {
		for i, it := range items {
			if it != nil {
				errs[i] = opErr(o.String(), err)
			}
		}
		return errs
	}
	for i, it := range items {
		if it != nil {
			errs[i] = ds[i].close(o, verdictOf(ctx, ds[i], it))
		}
	}
	return errs
}

// deliverySet finds a delivery given twice to AckAll or ReleaseAll: by a
// scan of those before it for a few, by a map for a claim's hundreds, where
// the scan cost a claim of 256 some 33,000 comparisons.
type deliverySet map[*Delivery]struct{}

func newDeliverySet(n int) deliverySet {
	if n <= smallSet {
		return nil
	}
	return make(deliverySet, n)
}

// smallSet is the size up to which a scan beats a map.
const smallSet = 16

// add tells whether d is among before (the deliveries already added), and
// adds it.
func (s deliverySet) add(before []*Delivery, d *Delivery) bool {
	if s == nil {
		for _, x := range before {
			if x == d {
				return true
			}
		}
		return false
	}
	if _, ok := s[d]; ok {
		return true
	}
	s[d] = struct{}{}
	return false
}

// lockAll locks every delivery without ever waiting while it holds one, so
// that two callers locking overlapping sets in different orders cannot
// deadlock: when a lock is taken, it lets go of what it holds, waits for
// that one, and starts over.
func lockAll(ds []*Delivery) {
	for {
		n := 0
		for n < len(ds) && ds[n].mu.TryLock() {
			n++
		}
		if n == len(ds) {
			return
		}
		for _, d := range ds[:n] {
			d.mu.Unlock()
		}
		ds[n].mu.Lock()
		ds[n].mu.Unlock()
	}
}

func errForeign(o outcome) error {
	return fmt.Errorf("inbox: %v: the delivery belongs to another queue than the batcher's", o)
}

// settle is Delivery.settle's protocol with the statements sent in a
// batch.
func (b *Batcher) settle(ctx context.Context, d *Delivery, o outcome, after time.Duration) error {
	return d.settleBy(ctx, o, after, batched{b})
}

// batched sends a settlement in one of b's batches.
type batched struct{ b *Batcher }

// admit refuses a settlement before the keeper is paused, so that a
// refused one changes nothing: as a delivery alone is refused, and a
// delivery of another queue, a finished one, an ended context and a
// closed batcher too, before it is queued.
func (s batched) admit(ctx context.Context, d *Delivery, o outcome, after time.Duration) error {
	b := s.b
	if d.q != b.q {
		return errForeign(o)
	}
	if err := d.refuse(nil, o, after); err != nil {
		return opErr(o.String(), err)
	}
	d.mu.Lock()
	settled := d.settled
	d.mu.Unlock()
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	switch {
	case settled:
		return opErr(o.String(), d.finishedErr())
	case ctx.Err() != nil:
		return opErr(o.String(), ctx.Err())
	case closed:
		return opErr(o.String(), ErrBatcherClosed)
	}
	return nil
}

// send queues d's token in a batch and waits for its verdict; d is open
// and d.mu held, so a context that ended meanwhile is the last refusal.
func (s batched) send(ctx context.Context, d *Delivery, o outcome, after time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	it := itemOf(d, o, after)
	own := [1]*batchItem{&it}
	if err := s.b.run(ctx, own[:]); err != nil {
		return err
	}
	return verdictOf(ctx, d, own[0])
}

// recheck looks again once the keeper is paused and d.mu held: a
// settlement may have finished d meanwhile, or ctx ended.
func recheck(ctx context.Context, d *Delivery, o outcome) error {
	if err := d.open(o); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return opErr(o.String(), err)
	}
	return nil
}

// itemOf copies d's token; d.mu is held.
func itemOf(d *Delivery, o outcome, after time.Duration) batchItem {
	return batchItem{id: d.id, attempt: d.attempt, expiry: d.lease.expiry, o: o, after: after}
}

// verdictOf returns the result of it for d and finishes d on a verdict;
// d.mu is held. An item sent without a verdict (its caller's context ended
// while its batch was in flight, or the batch failed) reads its outcome
// back as a settlement of the delivery does: the lease extended by its
// token, which also fences the batch's statement should it still run, and
// the row read when the token is gone. A token found gone while a
// settlement of d was pending (one in the caller's transaction that
// committed without Committed) may be that settlement's doing: the row
// tells, as for a settlement of d alone (learn).
func verdictOf(ctx context.Context, d *Delivery, it *batchItem) error {
	err := it.out
	if !verdict(err) && it.sent {
		err = d.readBack(ctx, it.o, time.Time{}, err, nil)
	}
	if err != nil && d.pending != nil && errors.Is(err, ErrLeaseLost) {
		err = learnPending(ctx, d)
	}
	switch {
	case err == ErrSettled:
		d.settled, d.pending = true, nil
	case verdict(err):
		d.settled, d.lost, d.pending = true, err != nil, nil
	}
	return err
}

// learnPending reads d's row, d.mu held, after a batch found d's token gone
// while a settlement of d was pending: ErrSettled when the row shows that
// settlement's effect, else ErrLeaseLost (a cancel included, as for the
// rest of a batch). The read runs on a short context of its own, as the
// batch's verdict is known even when ctx has ended.
func learnPending(ctx context.Context, d *Delivery) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), verdictTimeout)
	defer cancel()
	p := d.pending
	if r, err := d.readRow(rctx, d.q.db); err == nil && d.judge(p.o, r, p.until) == applied {
		return ErrSettled
	}
	return ErrLeaseLost
}

// verdict tells whether err settles a delivery: done, or the lease lost.
func verdict(err error) bool {
	return err == nil || errors.Is(err, ErrLeaseLost)
}
