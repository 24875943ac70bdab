package inbox

import (
	"context"
	"errors"
	"sync"
	"time"
)

// A lease delivery's keeper: Keep, the keepers of one claim on one start
// timer (KeepGroup), and the pause and end the settlements and Shutdown
// drive.

// KeepGroup keeps the deliveries of one [Queue.Claim], each under its own
// keeper as [Delivery.Keep] does. One claim made the first extension of all
// its leases due at one instant, so their keepers start on one timer, not
// one each; and [KeepGroup.Pause] stops them together. Under the row lock
// nothing needs keeping and Keep only derives the context; under the
// advisory form each delivery's keeper watches its session, as
// [Delivery.Keep] says.
// Its methods are safe for concurrent use.
type KeepGroup struct {
	starter *keepStarter // nil: each keeper times its own start

	mu     sync.Mutex
	kept   []*Delivery
	paused bool
}

// NewKeepGroup returns a group for ds, the deliveries of one Claim call.
func NewKeepGroup(ds []*Delivery) *KeepGroup {
	g := &KeepGroup{}
	if len(ds) > 1 && ds[0].q.form.leased() {
		g.starter = newKeepStarter(ds[0].q, ds[0].lease.sentAt, len(ds))
		g.kept = make([]*Delivery, 0, len(ds))
	}
	return g
}

// Keep is [Delivery.Keep] for d, a delivery of the group's claim; a
// delivery of another claim gets a keeper of its own timing. After Pause,
// the keeper starts paused.
func (g *KeepGroup) Keep(ctx context.Context, d *Delivery) (context.Context, func()) {
	kctx, stop := d.keep(ctx, g.starter)
	if !d.q.form.leased() {
		return kctx, stop
	}
	g.mu.Lock()
	paused := g.paused
	if !paused {
		g.kept = append(g.kept, d)
	}
	g.mu.Unlock()
	if paused {
		// Pause may have looked before this keeper existed.
		d.pauseKeeper()
	}
	return kctx, stop
}

// Pause stops the extensions of the group's keepers, those to come
// included, as [Queue.Shutdown] does for a lease delivery: each job keeps
// its lease and may still settle, and its keeper still cancels its handler
// by the lease's end. A loop calls it when it shuts down and leaves its
// lease handlers running.
func (g *KeepGroup) Pause() {
	g.mu.Lock()
	g.paused = true
	kept := g.kept
	g.kept = nil
	g.mu.Unlock()
	for _, d := range kept {
		d.pauseKeeper()
	}
}

// Stop disarms the group's shared timer. Call it once every keeper of the
// group has been stopped.
func (g *KeepGroup) Stop() {
	if g.starter != nil {
		g.starter.stop()
	}
}

// keeper extends one delivery's lease while its handler runs, and stops the
// handler before anyone else may take the job.
//
// With the real clock its goroutine starts only when the first extension is
// due (the timer start): most handlers return well within half a lease, and
// their keepers then cost a timer, not a goroutine and two hand-offs with it.
// A keeper paused before it started moves its start timer to its deadline.
type keeper struct {
	d      *Delivery
	ctx    context.Context
	cancel context.CancelCauseFunc
	sentAt time.Time // when the expiry the keeper starts from was sent

	mu     sync.Mutex
	state  keeperState
	start  *time.Timer // waiting: starts run when the first extension is due; held: cancels at giveUp
	giveUp time.Time   // held: the deadline

	// Made when run starts.
	pause  chan struct{} // closed by pauseKeeper: extend no more
	paused chan struct{} // closed by run once paused, no extension in flight
	end    chan struct{} // closed by endKeeper: return
	done   chan struct{} // closed when run returns

	pauseOnce sync.Once
}

type keeperState int

const (
	keeperWaiting keeperState = iota // run not started, start armed
	keeperRunning                    // run started: the channels speak for it
	keeperHeld                       // paused before run started: start moved to the deadline
	keeperEnded
)

// Keep starts a keeper for the delivery and returns the context the handler
// should run under. Under the lease form the keeper extends the lease every
// half lease; it cancels the returned context with cause [ErrLeaseLost] when
// an extension finds the lease gone ([ErrCancelled], which matches
// ErrLeaseLost, when the row is gone within the lease: [Queue.Cancel]), or
// when no extension has succeeded by
// the last expiry it knows of, less [Config.KeepMargin], measured from when
// that extension was sent: the holder stops before anyone else may start.
// That deadline holds in every path where nobody extends the lease any more
// and no verdict is known: extensions failing, [Queue.Shutdown], or a
// settlement that failed without one (a cancelled context, a broken
// connection), or a settlement in the caller's transaction not yet known to
// have committed ([Delivery.AckTx]). A settlement with a verdict, or
// [Delivery.Committed], ends the keeper. The stop
// function ends the keeper, waits for it, and cancels the context, as a
// deferred call should once the handler returns. No goroutine runs until
// the first extension is due (with [Config.After] set, at once).
//
// Under the advisory form the job's lock lives with the session pinned to
// the delivery: the keeper pings that session every second and cancels the
// context with cause ErrLeaseLost when a ping fails before the delivery
// settled (the session ended: a failover, a killed connection), so that
// the handler stops rather than run on beside the next claim of its job,
// which any other session may now make. A session that ends between two
// pings leaves the handler running until the next. Under the row lock
// nothing needs keeping: the held transaction dies with its session, and
// the handler's writes with it.
func (d *Delivery) Keep(ctx context.Context) (context.Context, func()) {
	return d.keep(ctx, nil)
}

// keep is Keep, its keeper started by s when s is not nil: the deliveries of
// one claim share the instant their first extension is due, and so one
// timer for it.
func (d *Delivery) keep(ctx context.Context, s *keepStarter) (context.Context, func()) {
	kctx, cancel := context.WithCancelCause(ctx)
	d.mu.Lock()
	if stop, ok := d.q.form.watch(d, cancel); ok {
		d.mu.Unlock()
		return kctx, func() {
			stop()
			cancel(context.Canceled)
		}
	}
	if !d.q.form.leased() || d.settled || d.keeper != nil {
		d.mu.Unlock()
		return kctx, func() { cancel(context.Canceled) }
	}
	k := &keeper{d: d, ctx: ctx, cancel: cancel, sentAt: d.lease.sentAt}
	// Published with k.mu held, so that a settlement or pause from another
	// goroutine finds the keeper's timer or goroutine in place.
	k.mu.Lock()
	d.keeper = k
	d.q.track(d)
	d.mu.Unlock()
	switch {
	case d.q.after != nil:
		// A test clock's timers are channels: a goroutine must wait on
		// them from the start.
		k.startLocked()
	case s.add(k):
	default:
		k.start = time.AfterFunc(k.sentAt.Add(d.q.lease/2).Sub(d.q.monoNow()), k.started)
	}
	k.mu.Unlock()
	return kctx, func() {
		d.pauseKeeper()
		d.mu.Lock()
		d.endKeeper()
		d.mu.Unlock()
		cancel(context.Canceled)
	}
}

// keepStarter is the start timer of the keepers of deliveries claimed
// together, which share the instant their first extension is due, and
// their deadline: a batch of quick handlers then arms one timer, not one
// per job. When it runs, each keeper still waiting starts (started); a
// keeper paused before it (held) stays on, and the timer runs again at
// their deadline, where started cancels them. Keepers added once it has run
// arm timers of their own.
type keepStarter struct {
	sentAt time.Time // the claim's
	q      *Queue

	mu      sync.Mutex
	ks      []*keeper
	timer   *time.Timer
	started bool // the start is past: add refuses
	stopped bool
}

func newKeepStarter(q *Queue, sentAt time.Time, n int) *keepStarter {
	return &keepStarter{sentAt: sentAt, q: q, ks: make([]*keeper, 0, n)}
}

// add takes k, reporting false when k is not the starter's to start: a
// nil starter, another claim's instant, or a start already past.
func (s *keepStarter) add(k *keeper) bool {
	if s == nil || !k.sentAt.Equal(s.sentAt) {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started || s.stopped {
		return false
	}
	if s.timer == nil {
		s.timer = time.AfterFunc(s.sentAt.Add(s.q.lease/2).Sub(s.q.monoNow()), s.fire)
	}
	s.ks = append(s.ks, k)
	return true
}

// fire runs started on every keeper it holds, and again at the deadline on
// those held and not past it. The keepers' locks are taken after s.mu is
// let go: Keep holds a keeper's while it adds it.
func (s *keepStarter) fire() {
	s.mu.Lock()
	s.started = true
	ks := s.ks
	s.ks = nil
	s.mu.Unlock()
	held := ks[:0]
	var first time.Time
	for _, k := range ks {
		k.started()
		if until, ok := k.heldUntil(); ok {
			held = append(held, k)
			if first.IsZero() || until.Before(first) {
				first = until
			}
		}
	}
	if len(held) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.stopped {
		s.ks = held
		s.timer.Reset(first.Sub(s.q.monoNow()))
	}
}

// stop disarms the timer once every keeper it holds has ended.
func (s *keepStarter) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.timer != nil {
		s.timer.Stop()
	}
	s.stopped, s.ks = true, nil
}

// heldUntil reports the deadline of a keeper paused before it started,
// while that deadline is still ahead.
func (k *keeper) heldUntil() (time.Time, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.giveUp, k.state == keeperHeld && k.d.q.monoNow().Before(k.giveUp)
}

// startLocked makes run's channels and starts it in a goroutine of its own.
func (k *keeper) startLocked() {
	k.pause, k.paused = make(chan struct{}), make(chan struct{})
	k.end, k.done = make(chan struct{}), make(chan struct{})
	k.state = keeperRunning
	go k.run(k.ctx, k.sentAt)
}

// started runs in the start timer's goroutine when the first extension is
// due, unless the keeper was paused or ended first.
func (k *keeper) started() {
	k.mu.Lock()
	defer k.mu.Unlock()
	switch k.state {
	case keeperWaiting:
		k.startLocked()
	case keeperHeld:
		// The timer now stands for the deadline. A run of it that fired
		// for the start while the pause moved it is early: the moved
		// timer runs this again at the deadline.
		if !k.d.q.monoNow().Before(k.giveUp) {
			k.cancel(ErrLeaseLost)
		}
	}
}

// pauseKeeper stops the delivery's extensions, waiting for one in flight, so
// that a settlement reads a token no extension will move; the keeper's
// deadline stays armed until endKeeper. It must be called without d.mu held:
// an extension in flight holds it.
func (d *Delivery) pauseKeeper() {
	d.mu.Lock()
	k := d.keeper
	d.mu.Unlock()
	if k == nil {
		return
	}
	k.mu.Lock()
	switch k.state {
	case keeperWaiting:
		// Nothing was extended yet: the deadline is the claim's. The start
		// timer is moved to it (started cancels a held keeper), which
		// spares a settlement a timer of its own; a keeper started by a
		// keepStarter gets its first timer here.
		k.state = keeperHeld
		q := d.q
		k.giveUp = k.sentAt.Add(q.lease - q.margin)
		if k.start != nil {
			k.start.Reset(k.giveUp.Sub(q.monoNow()))
		}
		// Else its keepStarter runs started again at the deadline.
		k.mu.Unlock()
		return
	case keeperHeld, keeperEnded:
		k.mu.Unlock()
		return
	}
	k.mu.Unlock()
	k.pauseOnce.Do(func() { close(k.pause) })
	select {
	case <-k.paused:
	case <-k.done:
	}
}

// endKeeper ends the delivery's keeper, once a verdict is known or its
// handler has returned, and waits for it. d.mu must be held, and the keeper
// paused first (a paused keeper never takes d.mu).
func (d *Delivery) endKeeper() {
	k := d.keeper
	if k == nil {
		return
	}
	d.keeper = nil
	k.mu.Lock()
	running := k.state == keeperRunning
	if !running {
		if k.start != nil {
			k.start.Stop()
		}
	}
	k.state = keeperEnded
	k.mu.Unlock()
	if running {
		close(k.end)
		<-k.done
	}
	d.q.untrack(d)
}

func (k *keeper) wait(d time.Duration) <-chan time.Time {
	if k.d.q.after != nil {
		return k.d.q.after(d)
	}
	return time.After(d)
}

func (k *keeper) run(ctx context.Context, sentAt time.Time) {
	defer close(k.done)
	q := k.d.q
	next := sentAt.Add(q.lease / 2)
	giveUp := sentAt.Add(q.lease - q.margin)
	pause := k.pause
	paused, signalled := false, false
	for {
		now := q.monoNow()
		if !now.Before(giveUp) {
			k.cancel(ErrLeaseLost)
			return
		}
		wake := giveUp
		if !paused && next.Before(wake) {
			wake = next
		}
		timer := k.wait(wake.Sub(now))
		if paused && !signalled {
			// Signal only once the deadline timer is registered, so a
			// caller that moves the clock right after the pause returns
			// cannot slip past it.
			signalled = true
			close(k.paused)
		}
		select {
		case <-k.end:
			return
		case <-ctx.Done():
			return
		case <-pause:
			// From here on only the deadline is armed.
			pause, paused = nil, true
			continue
		case <-timer:
		}
		if paused || q.monoNow().Before(next) {
			continue
		}
		var more bool
		if next, giveUp, more = k.extendOnce(ctx, next, giveUp); !more {
			return
		}
	}
}

// extendOnce sends one extension and returns when the next is due and the
// deadline it moved; more is false when the keeper ends, its handler
// cancelled with the cause when the lease is lost or the job cancelled.
func (k *keeper) extendOnce(ctx context.Context, next, giveUp time.Time) (time.Time, time.Time, bool) {
	q := k.d.q
	sent, answered, err := k.extend(ctx, giveUp)
	switch {
	case !answered:
		k.cancel(ErrLeaseLost)
	case err == nil:
		return sent.Add(q.lease / 2), sent.Add(q.lease - q.margin), true
	case errors.Is(err, ErrSettled):
	case errors.Is(err, ErrCancelled):
		k.cancel(ErrCancelled)
	case errors.Is(err, ErrLeaseLost):
		k.cancel(ErrLeaseLost)
	default:
		// Retried a tenth of a lease later, the deadline unmoved.
		return q.monoNow().Add(q.lease / 10), giveUp, true
	}
	return next, giveUp, false
}

// extend runs one extension and returns when the expiry was sent, whether an
// answer came before giveUp, and the extension's error.
func (k *keeper) extend(ctx context.Context, giveUp time.Time) (sent time.Time, answered bool, err error) {
	q := k.d.q
	// The extension must not outlive the lease it defends: past giveUp
	// another worker may hold the job.
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), giveUp.Sub(q.monoNow()))
	type result struct {
		err  error
		sent time.Time
	}
	res := make(chan result, 1)
	// The extension runs apart so that the handler is stopped at giveUp
	// even when the driver ignores ectx: lib/pq waits for the server's
	// answer, which a network partition withholds. It ends on its own once
	// the driver returns.
	go func() {
		defer cancel()
		k.d.mu.Lock()
		defer k.d.mu.Unlock()
		if k.d.settled {
			res <- result{ErrSettled, k.d.lease.sentAt}
			return
		}
		err := k.d.extendLocked(ectx)
		res <- result{err, k.d.lease.sentAt}
	}()
	select {
	case r := <-res:
		return r.sent, true, r.err
	case <-ectx.Done():
		select {
		case r := <-res:
			return r.sent, true, r.err
		default:
			return time.Time{}, false, nil
		}
	}
}
