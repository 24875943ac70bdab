package inbox

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"runtime"
	"time"
)

// A Handler handles one job. Returning nil acknowledges it; an error retries
// it after a backoff, or moves it to the dead table once its attempts run
// out. ctx ends when the lease is lost (cause [ErrLeaseLost]) or, under the
// row lock and advisory forms, when the loop shuts down.
type Handler func(ctx context.Context, d *Delivery) error

// WorkConfig configures [Queue.Work]. Its zero value means the defaults.
type WorkConfig struct {
	// Batch is how many jobs one claim takes, each handled in a goroutine
	// of its own (a job is never held without its handler running). Zero
	// means 1; at most [MaxClaim].
	Batch int
	// Poll is the fallback interval: an idle process claims again after it
	// even when no wake-up came (jobs enqueued by another process without
	// a notification, retry delays and leases running out), jittered by up
	// to a tenth either way. One idle loop per table in a process polls; the others
	// wait for a wake-up, and one of them takes the polling over when that
	// loop stops idling. Zero means one second.
	Poll time.Duration
	// MaxAttempts is the attempt whose failure moves a job to the dead
	// table, where one is named; without one it is retried on. Zero means
	// 25.
	MaxAttempts int
	// Backoff is the delay before the next attempt after attempt n failed.
	// Nil means one second doubled each attempt, capped at an hour, less up
	// to a fifth at random. The row lock and advisory forms delay only with
	// a not-before column ([Table.NotBefore]); without one a failed job is
	// claimable again at once.
	Backoff func(attempt int) time.Duration
	// OnError, when set, is told what the loop meets and cannot return: a
	// claim that failed (the loop waits its fallback interval and claims
	// again) and a settlement that failed (the job comes back as its form
	// says). The package never logs; this is where to. It runs in the
	// loop's goroutine, or a batch handler's.
	OnError func(error)
}

// Defaults of [WorkConfig].
const (
	DefaultPoll        = time.Second
	DefaultMaxAttempts = 25
)

// Work claims jobs and runs handle on each, in the caller's goroutine (and
// one more per job of a batch), until ctx ends; then it returns nil once
// its handlers have returned. It settles each job by handle's result: nil
// acks, an error retries after [WorkConfig.Backoff] or, past MaxAttempts,
// moves the job to the dead table; a panic is recovered into a retry whose
// error carries the panic's text. Each handler runs under [Delivery.Keep].
//
// When ctx ends, row-lock and advisory jobs are given back at once: their
// handlers' contexts end, and a job whose handler then fails is released,
// its attempt not spent. Lease jobs keep their leases: their handlers run
// on, stopped only by the lease's end, and settle if they can.
//
// An idle loop waits for a wake-up: [Queue.Enqueue] through a *sql.DB or
// *sql.Conn wakes the loops of the same table in the process, [Queue.Wake]
// does after a transaction that enqueued commits, and a [Listener] relays
// other processes' notifications. Without one, the fallback interval.
// Start as many loops as you want workers, with errgroup for instance.
func (q *Queue) Work(ctx context.Context, cfg WorkConfig, handle Handler) error {
	if handle == nil {
		return errors.New("inbox: work: the handler is nil")
	}
	w, err := newWorker(ctx, q, cfg, handle)
	if err != nil {
		return err
	}
	defer func() {
		for _, b := range w.batchers {
			b.Close()
		}
	}()
	for ctx.Err() == nil {
		// The bell is read before the claim, so that a wake-up during the
		// claim is not lost.
		rang := q.bell.next()
		ds, err := w.claim(ctx)
		if err != nil && ctx.Err() == nil {
			w.report(err)
		}
		if err == nil && len(ds) > 0 {
			if len(ds) == w.batch {
				// There may be more: idle loops lend a hand.
				q.bell.ring()
			}
			w.handleAll(ctx, ds)
			continue
		}
		w.idle(ctx, rang)
	}
	return nil
}

// claim claims a batch. The claim runs to its end even when ctx ends
// meanwhile (bounded by claimTimeout): a claim cut off by its context may
// still commit at the server, leaving leases that hold jobs nobody runs
// until they run out. Jobs claimed after ctx ended are given back at once.
func (w *worker) claim(ctx context.Context) ([]*Delivery, error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
	defer cancel()
	ds, err := w.q.Claim(cctx, w.batch)
	if err == nil && ctx.Err() != nil {
		for _, d := range ds {
			w.report(d.Release(cctx))
		}
		return nil, nil
	}
	return ds, err
}

// claimTimeout bounds a claim that outlives its loop's context.
const claimTimeout = 30 * time.Second

// worker is one Work loop's settings.
type worker struct {
	q        *Queue
	handle   Handler
	batch    int
	poll     time.Duration
	attempts int
	backoff  func(int) time.Duration
	onError  func(error)
	// batchers settle the lease jobs of a claim of n (their key) together,
	// where the dialect has batched statements; nil otherwise.
	batchers  map[int]*Batcher
	batchWait time.Duration // how long a batch's settlements wait for their siblings
	// detached is Work's ctx without its cancellation: lease handlers and
	// every settlement run under it.
	detached context.Context
}

func (w *worker) report(err error) {
	if err != nil && w.onError != nil {
		w.onError(err)
	}
}

func newWorker(ctx context.Context, q *Queue, cfg WorkConfig, handle Handler) (*worker, error) {
	switch {
	case cfg.Batch < 0 || cfg.Batch > MaxClaim:
		return nil, fmt.Errorf("inbox: work: WorkConfig.Batch %d must be from 1 to %d (0 for 1)", cfg.Batch, MaxClaim)
	case cfg.Poll < 0:
		return nil, fmt.Errorf("inbox: work: WorkConfig.Poll %v is negative", cfg.Poll)
	case cfg.MaxAttempts < 0:
		return nil, fmt.Errorf("inbox: work: WorkConfig.MaxAttempts %d is negative", cfg.MaxAttempts)
	}
	w := &worker{q: q, handle: handle, batch: cfg.Batch, poll: cfg.Poll, attempts: cfg.MaxAttempts, backoff: cfg.Backoff, onError: cfg.OnError,
		detached: context.WithoutCancel(ctx)}
	if w.batch == 0 {
		w.batch = 1
	}
	if w.poll == 0 {
		w.poll = DefaultPoll
	}
	if w.attempts == 0 {
		w.attempts = DefaultMaxAttempts
	}
	if w.backoff == nil {
		w.backoff = DefaultBackoff
	}
	if _, ok := q.dialect.(BatchDialect); ok && w.batch > 1 && q.names.Form == Lease {
		w.batchers, w.batchWait = map[int]*Batcher{}, workBatchWait
	}
	return w, nil
}

// DefaultBackoff is the delay after attempt n failed when
// [WorkConfig.Backoff] is nil: one second doubled each attempt, capped at an
// hour, less up to a fifth at random so that jobs that failed together do
// not come back together.
func DefaultBackoff(attempt int) time.Duration {
	d := time.Hour
	if attempt >= 1 && attempt <= 12 {
		d = min(time.Second<<(attempt-1), time.Hour)
	}
	return d - time.Duration(rand.Int63n(int64(d/5)+1))
}

// idle waits for a wake-up, or, for the one idle loop that polls, for the
// fallback interval; ctx ending ends the wait.
//
// The polling loop stops polling when its interval runs out, when it is
// woken and when its ctx ends; it may then find jobs and handle them for a
// long time. One of the loops still idle takes the polling over at once,
// without a claim, so that while any loop is idle one of them polls. (A ring
// instead would cost a claim per idle loop; and without a handover, a job
// enqueued by another process while the loop that polled is busy would wait
// for that loop's handlers, not for the interval.)
func (w *worker) idle(ctx context.Context, rang <-chan struct{}) {
	for {
		polls, free := w.q.bell.takePoll()
		if polls {
			break
		}
		select {
		case <-rang:
			return
		case <-ctx.Done():
			return
		case <-free:
		}
	}
	defer w.q.bell.dropPoll()
	// Up to a tenth either way, so that processes idle together do not
	// poll in step.
	jitter := time.Duration(rand.Int63n(int64(w.poll/5) + 1))
	t := time.NewTimer(w.poll - w.poll/10 + jitter)
	defer t.Stop()
	select {
	case <-rang:
	case <-t.C:
	case <-ctx.Done():
	}
}

// handleAll runs the handler of each delivery in a goroutine of its own and
// waits for them. The jobs of a lease batch whose handlers succeed are
// acknowledged by this goroutine, together (see ackBatch).
func (w *worker) handleAll(ctx context.Context, ds []*Delivery) {
	if len(ds) == 1 {
		w.handleOne(ctx, ds[0], nil, nil, false)
		return
	}
	lease := w.q.names.Form == Lease
	if lease {
		// One hook for the batch pauses the keepers at shutdown, in place
		// of one per job; a job whose keeper starts after it ran pauses
		// its own (handleOne).
		stop := context.AfterFunc(ctx, func() {
			for _, d := range ds {
				d.pauseKeeper()
			}
		})
		defer stop()
	}
	b := w.batcherFor(len(ds))
	done := make(chan succeeded, len(ds))
	for _, d := range ds {
		go w.handleOne(ctx, d, b, done, lease)
	}
	if b == nil {
		for range ds {
			<-done
		}
		return
	}
	w.ackBatch(b, done, len(ds))
}

// succeeded is what a handler's goroutine of a batch hands back: a lease job
// whose handler returned nil, its keeper still extending until release is
// called after the ack; or, with d nil, a job its goroutine settled itself.
type succeeded struct {
	d          *Delivery
	stopKeeper func()
}

// ackBatch acknowledges the jobs of a lease batch as their handlers succeed,
// in groups: those that finish together, or within w.batchWait of the first
// of a group, share one statement, sent from this goroutine, so that a batch
// of no-op handlers costs one AckAll and no hand-off to a flusher.
// It returns once all n handlers' goroutines have reported.
func (w *worker) ackBatch(b *Batcher, done <-chan succeeded, n int) {
	group := make([]succeeded, 0, n)
	ds := make([]*Delivery, 0, n)
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	take := func(s succeeded) {
		n--
		if s.d != nil {
			group = append(group, s)
		}
	}
	for n > 0 {
		take(<-done)
		// Goroutines that are runnable join this group if this one yields
		// first, for as long as yielding brings more; then what is still
		// running gets workBatchWait from here.
		for yielded := false; n > 0; {
			select {
			case s := <-done:
				take(s)
				yielded = false
				continue
			default:
			}
			if !yielded {
				runtime.Gosched()
				yielded = true
				continue
			}
			break
		}
		if n > 0 && len(group) > 0 {
			if timer == nil {
				timer = time.NewTimer(w.batchWait)
			} else {
				timer.Reset(w.batchWait)
			}
		wait:
			for n > 0 {
				select {
				case s := <-done:
					take(s)
				case <-timer.C:
					break wait
				}
			}
			timer.Stop()
		}
		if len(group) == 0 {
			continue
		}
		ds = ds[:0]
		for _, s := range group {
			ds = append(ds, s.d)
		}
		for i, err := range b.AckAll(w.detached, ds) {
			group[i].stopKeeper()
			w.report(err)
		}
		clear(group)
		group = group[:0]
	}
}

// workBatchWait is how long the settlement of a job of a lease batch waits
// for its siblings' before it is sent: a batch whose handlers finish
// together goes in one statement, and one that finishes apart costs each
// settlement at most this much more time.
const workBatchWait = time.Millisecond

// batcherFor returns the batcher settling the jobs of a claim of n, nil
// when they are settled one by one. Its batches are full at n, so that the
// settlements of a claim whose handlers all succeed go at once.
func (w *worker) batcherFor(n int) *Batcher {
	if w.batchers == nil {
		return nil
	}
	n = min(n, maxBatch)
	b := w.batchers[n]
	if b == nil {
		var err error
		if b, err = w.q.NewBatcher(BatchConfig{MaxBatch: n, MaxWait: w.batchWait, Flushers: 1}); err != nil {
			return nil
		}
		w.batchers[n] = b
	}
	return b
}

// handleOne runs the handler on d under a keeper and settles d by its
// result, through b when b is not nil. Settlements outlive ctx: a job is
// settled or given back even while the loop shuts down. When done is not
// nil, handleOne reports on it once: a lease job of b whose handler
// succeeded is handed over with its keeper on, for ackBatch to acknowledge;
// any other job is settled here first. hooked says that the caller pauses
// d's keeper when ctx ends (handleAll's hook).
func (w *worker) handleOne(ctx context.Context, d *Delivery, b *Batcher, done chan<- succeeded, hooked bool) {
	lease := w.q.names.Form == Lease
	base := ctx
	if lease {
		// A lease job keeps its lease at shutdown: its handler runs on,
		// and the keeper stops extending, its deadline still armed.
		base = w.detached
	}
	hctx, stopKeeper := d.Keep(base)
	switch {
	case lease && hooked:
		// The batch's hook may have run before this keeper existed.
		if ctx.Err() != nil {
			d.pauseKeeper()
		}
	case lease:
		// Armed once the keeper exists: a ctx that ended before would
		// find no keeper to pause, and the lease would be extended on.
		defer context.AfterFunc(ctx, d.pauseKeeper)()
	}
	err := runHandler(hctx, w.handle, d)
	if err == nil && b != nil && done != nil {
		done <- succeeded{d: d, stopKeeper: stopKeeper}
		return
	}
	w.settle(ctx, d, b, err)
	stopKeeper()
	if done != nil {
		done <- succeeded{}
	}
}

// settle settles d by its handler's result err, through b when b is not nil.
func (w *worker) settle(ctx context.Context, d *Delivery, b *Batcher, err error) {
	settle := w.detached
	switch {
	case err == nil && b != nil:
		w.report(b.Ack(settle, d))
	case err == nil:
		w.report(d.Ack(settle))
	case ctx.Err() != nil && w.q.names.Form != Lease:
		w.report(d.Release(settle))
	case d.Attempt() >= w.attempts && w.q.names.Dead != "":
		d.SetError(err)
		w.report(d.Dead(settle))
	default:
		d.SetError(err)
		after := w.backoff(d.Attempt())
		if w.q.names.Form != Lease && w.q.names.NotBefore == "" {
			after = 0
		}
		if b != nil {
			w.report(b.Retry(settle, d, max(after, 0)))
		} else {
			w.report(d.Retry(settle, max(after, 0)))
		}
	}
}

// runHandler runs handle, turning a panic into an error that carries its
// text.
func runHandler(ctx context.Context, handle Handler, d *Delivery) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("inbox: handler panicked: %v", r)
		}
	}()
	return handle(ctx, d)
}
