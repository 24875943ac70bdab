package inbox

import (
	"context"
	"runtime"
	"sync"
	"time"
)

// The Batcher's group commit: the pending settlements, the flights that
// gather and send them, and Close.

// batchItem is one settlement: a copy of its delivery's token, pending until
// a flight takes it. Items are never reused.
type batchItem struct {
	id          any
	attempt     int64 // delivered
	expiry      time.Time
	o           outcome
	after       time.Duration
	cancellable bool  // its caller's context can end
	sent        bool  // a flight took it: its statement may have run
	err         error // the verdict, written by the flight that took it
	// Guarded by Batcher.mu:
	fl        *flight // the flight that took it; nil while pending
	done      bool    // fl has ended: err is final
	abandoned bool    // its caller's context ended while fl was in flight
	// Its caller's alone, once run returns:
	out error
}

// flight is one batch being gathered or sent. Its context is
// context.Background unless a caller of one of its items can give up: a
// context that can end costs database/sql and drivers a watcher per
// statement. The statements are cancelled when every caller has given up.
type flight struct {
	ctx     context.Context
	cancel  context.CancelFunc
	waiting int           // guarded by Batcher.mu: items not abandoned
	done    chan struct{} // closed when every item has its verdict
}

// run makes own pending and waits until each has a result in its out: the
// verdict of its batch, or ctx's error when ctx ended first. While one of
// own is pending and a slot is free, the caller takes the slot and sends a
// batch itself. It returns ErrBatcherClosed, queueing nothing, after Close.
//
// Every pending item belongs to a caller waiting here, and a caller leaves
// only once none of its items is pending (withdrawn when ctx ends): so when
// a slot frees, some caller with a pending item is woken to take it.
func (b *Batcher) run(ctx context.Context, own []*batchItem) error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return ErrBatcherClosed
	}
	cancellable := ctx.Done() != nil
	for _, it := range own {
		it.cancellable = cancellable
	}
	b.pending = append(b.pending, own...)
	if b.wait > 0 && len(b.pending) >= b.max {
		b.wakeLocked() // senders waiting for MaxWait may go now
	}
	for {
		pending := false
		var flying <-chan struct{} // the end of a flight holding one of own
		for _, it := range own {
			switch {
			case it.fl == nil:
				pending = true
			case !it.done:
				flying = it.fl.done
			}
		}
		if !pending && flying == nil {
			break
		}
		if ctx.Err() != nil {
			b.giveUpLocked(own)
			break
		}
		if pending && b.flying < b.lanes {
			b.flying++
			b.mu.Unlock()
			b.send(ctx, own)
			b.mu.Lock()
			continue
		}
		var wake <-chan struct{}
		if pending {
			wake = b.wake
		}
		b.mu.Unlock()
		select {
		case <-wake:
		case <-flying:
		case <-ctx.Done():
		}
		b.mu.Lock()
	}
	answerLocked(ctx, own)
	b.mu.Unlock()
	return nil
}

// answerLocked gives each of own its answer: the verdict, or ctx's error
// when it was withdrawn or in flight as ctx ended (no verdict known; an
// error of the batch's own cancellation is the caller's).
func answerLocked(ctx context.Context, own []*batchItem) {
	for _, it := range own {
		it.sent = it.fl != nil
		if !it.done || it.abandoned && !verdict(it.err) {
			it.out = ctx.Err()
		} else {
			it.out = it.err
		}
	}
}

// giveUpLocked withdraws the pending items of own and abandons those in
// flight, cancelling a flight nobody waits for any more.
func (b *Batcher) giveUpLocked(own []*batchItem) {
	for _, it := range own {
		switch {
		case it.done:
		case it.fl == nil:
			b.removeLocked(it)
		default:
			b.abandonLocked(it)
		}
	}
}

func (b *Batcher) abandonLocked(it *batchItem) {
	if it.abandoned {
		return
	}
	it.abandoned = true
	fl := it.fl
	if fl.waiting--; fl.waiting == 0 && fl.cancel != nil {
		fl.cancel()
	}
}

func (b *Batcher) removeLocked(it *batchItem) {
	for i, p := range b.pending {
		if p == it {
			copy(b.pending[i:], b.pending[i+1:])
			b.pending[len(b.pending)-1] = nil
			b.pending = b.pending[:len(b.pending)-1]
			b.idle.Broadcast()
			return
		}
	}
}

func (b *Batcher) wakeLocked() {
	close(b.wake)
	b.wake = make(chan struct{})
}

// Close refuses new settlements and waits until those already queued have
// been sent (or withdrawn) and no batch is in flight. Close is idempotent.
func (b *Batcher) Close() {
	b.mu.Lock()
	if !b.closed {
		b.closed = true
		close(b.closing)
	}
	for b.flying > 0 || len(b.pending) > 0 {
		b.idle.Wait()
	}
	b.mu.Unlock()
}

// flusher is the scratch of one batch being sent, reused so that a batch
// allocates little. It holds items only between Get and Put.
type flusher struct {
	items             []*batchItem // the batch in flight
	ids               deliveryIDs  // the ids of items, for batches past smallSet
	todo, group, rest []*batchItem // flush's scratch
	toks              []token      // the group's tokens
}

var flusherPool = sync.Pool{New: func() any { return &flusher{} }}

// send holds one of the Flushers slots, taken by run: it gathers a batch,
// sends it, gives each item its verdict, and frees the slot, whatever
// happens meanwhile. own are the sender's items, whose waiting it stands
// for while it is busy sending.
func (b *Batcher) send(ctx context.Context, own []*batchItem) {
	f := flusherPool.Get().(*flusher)
	fl := &flight{ctx: context.Background(), done: make(chan struct{})}
	defer func() {
		b.mu.Lock()
		for _, it := range f.items {
			it.done = true
		}
		close(fl.done)
		b.flying--
		b.wakeLocked()
		b.idle.Broadcast()
		b.mu.Unlock()
		if fl.cancel != nil {
			fl.cancel()
		}
		clear(f.items)
		f.items = f.items[:0]
		flusherPool.Put(f)
	}()
	if !b.gather(ctx, f, fl) {
		return
	}
	if ctx.Done() != nil {
		// When ctx ends during the flush, the sender gives up its items as
		// a waiting caller would, so that a batch nobody waits for any more
		// is cancelled. A late call finds them done and does nothing.
		stop := context.AfterFunc(ctx, func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			for _, it := range own {
				if it.fl == fl && !it.done {
					b.abandonLocked(it)
				}
			}
		})
		defer stop()
	}
	b.flush(f, fl)
}

// gather takes up to max pending settlements into f.items, marking them as
// in flight fl. Before it takes them it yields while more arrive, and with
// MaxWait it waits that long for max of them. It returns false when it took
// nothing: others took what was pending, or their callers withdrew, or ctx
// ended while it waited (the slot is better taken by a caller still there).
func (b *Batcher) gather(ctx context.Context, f *flusher, fl *flight) bool {
	seen := 0
	waited := false
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	b.mu.Lock()
	for {
		n := len(b.pending)
		if n > seen && n < b.max && !b.closed {
			// Settlements already on their way (goroutines that are
			// runnable, a worker's handlers finishing together) join this
			// batch if the sender yields before taking it, for as long as
			// yielding brings more: a lone settlement is delayed by a
			// scheduler pass, never by a timer.
			seen = n
			b.mu.Unlock()
			runtime.Gosched()
			b.mu.Lock()
			continue
		}
		if n > 0 && n < b.max && b.wait > 0 && !b.closed && !waited {
			if timer == nil {
				timer = time.NewTimer(b.wait)
			}
			wake := b.wake
			b.mu.Unlock()
			select {
			case <-wake:
			case <-b.closing:
			case <-timer.C:
				waited = true
			case <-ctx.Done():
				return false
			}
			b.mu.Lock()
			continue
		}
		b.takeLocked(f, fl)
		b.mu.Unlock()
		return len(f.items) > 0
	}
}

// takeLocked moves pending items into f.items, up to max, skipping an item
// whose id is in the batch already (another delivery of the same job, one
// of them stale): a statement returning ids could not tell their results
// apart, so the later waits for the next batch.
func (b *Batcher) takeLocked(f *flusher, fl *flight) {
	// A batch of hundreds finds its ids in a map: a scan of the batch per
	// item taken cost a claim of 256 some 33,000 comparisons.
	var ids deliveryIDs
	if b.max > smallSet {
		if f.ids == nil {
			f.ids = make(deliveryIDs, b.max)
		}
		ids = f.ids
		clear(ids)
		for _, it := range f.items {
			ids[it.id] = struct{}{}
		}
	}
	kept := b.pending[:0]
	for _, it := range b.pending {
		if len(f.items) == b.max || ids.has(f, it.id) {
			kept = append(kept, it)
			continue
		}
		if ids != nil {
			ids[it.id] = struct{}{}
		}
		it.fl = fl
		fl.waiting++
		if it.cancellable && fl.cancel == nil {
			fl.ctx, fl.cancel = context.WithCancel(context.Background())
		}
		f.items = append(f.items, it)
	}
	clear(b.pending[len(kept):])
	b.pending = kept
	if b.wait > 0 && len(f.items) > 0 {
		// Senders waiting for MaxWait look again: what they waited for
		// may be gone.
		b.wakeLocked()
	}
}

// deliveryIDs are the ids of a flusher's items; nil for small batches,
// which are scanned.
type deliveryIDs map[any]struct{}

// has tells whether an item of f has id.
func (ids deliveryIDs) has(f *flusher, id any) bool {
	if ids != nil {
		_, ok := ids[id]
		return ok
	}
	for _, it := range f.items {
		if it.id == id {
			return true
		}
	}
	return false
}

// flush runs the batch, one statement per outcome and delay present in it,
// in the order of their first arrival, setting each item's err.
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
	clear(f.todo[:cap(f.todo)])
	clear(f.rest[:cap(f.rest)])
}

// settleGroup settles items, which share outcome o and delay after, in one
// statement of the smallest set that holds them, setting each item's err.
func (b *Batcher) settleGroup(ctx context.Context, f *flusher, o outcome, after time.Duration, items []*batchItem) {
	set := b.sets[len(b.sets)-1]
	for _, s := range b.sets {
		if s.Size >= len(items) {
			set = s
			break
		}
	}
	f.toks = f.toks[:0]
	for _, it := range items {
		f.toks = append(f.toks, token{id: it.id, attempt: it.attempt, expiry: it.expiry})
	}
	for i, err := range b.q.settleMany(ctx, set, o, after, f.toks) {
		items[i].err = err
	}
}
