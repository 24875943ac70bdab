// Package worker runs handlers on the jobs of an [inbox.Queue]: a loop that
// claims, runs a handler under a keeper and settles by its result, and waits
// for a wake-up or its fallback interval when nothing is claimable.
//
// It is written on inbox's exported API alone, as a loop of your own would
// be (docs/worker.md), and imports the standard library and inbox only.
package worker

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqlinbox/inbox"
)

// A Handler handles one job. Returning nil acknowledges it; an error retries
// it after a backoff, or moves it to the dead table once its attempts run
// out; an error made by [Permanent] moves it there at once, and one made by
// [Snooze] delays it. A handler may also settle its delivery itself (Ack,
// Retry, Release, Dead or their Tx forms, committed): the loop then sends
// nothing ([OutcomeSettled]). ctx ends when the lease is lost, or under the
// advisory form the session holding the job's lock (cause
// [inbox.ErrLeaseLost]), when [Config.Timeout] runs out (cause [ErrTimeout])
// and when the loop's grace period ends at shutdown (cause [ErrShutdown]).
type Handler func(ctx context.Context, d *inbox.Delivery) error

// Config configures [Run]. Its zero value means the defaults.
type Config struct {
	// Workers is how many loops Run runs side by side on the queue, each
	// claiming up to Batch jobs at a time: up to Workers × Batch jobs in
	// work. Zero means 1. Under the row lock and advisory forms Run
	// refuses a pool too small for them (see Run); it counts the loops of
	// its own call, not those of other calls on the same pool. Under the
	// lease form the loops of one call take turns to claim, so that no more
	// than 1,024 jobs (and at least one claim) are being claimed at once:
	// large claims side by side would mostly skip each other's rows.
	Workers int
	// Batch is how many jobs one claim takes, handled side by side (see
	// Run; a job waits at most a millisecond for its handler to start).
	// Zero means 1; at most [inbox.MaxClaim].
	Batch int
	// Poll is the fallback interval: an idle loop claims again after it
	// even when no wake-up came (jobs enqueued by another process without
	// a notification, retry delays and leases running out), jittered by up
	// to a tenth either way. Of the idle loops of one queue with one Poll
	// in a process, one polls; the others wait for a wake-up, and one of
	// them takes the polling over when that loop stops idling. Loops with
	// different intervals poll each at their own. Zero means one second.
	Poll time.Duration
	// MaxAttempts is the attempt whose failure moves a job to the dead
	// table, where one is named; without one it is retried on. Zero means
	// 25.
	MaxAttempts int
	// Backoff is the delay before the next attempt after attempt n failed;
	// a negative one counts as zero. Nil means [DefaultBackoff]. The row
	// lock and advisory forms delay only with a not-before column
	// ([inbox.Table.NotBefore]): without one Run refuses to start unless
	// NoDelay is set.
	Backoff func(attempt int) time.Duration
	// NoDelay lets Run start on a row-lock or advisory table without a
	// not-before column, where a failed job is claimable again at once,
	// whatever Backoff says: a failing job then runs MaxAttempts times in
	// a row. Leave it unset unless handlers do not fail.
	NoDelay bool
	// RetryForever lets Run start on a table without a dead table
	// ([inbox.Table.DeadTable]), where a job whose attempts ran out is
	// retried on after its backoff instead of moved there. Without it Run
	// refuses such a table.
	RetryForever bool
	// OnError, when set, is told what the loop meets and does not return:
	// a claim or probe that failed (the loop claims again after a backoff)
	// and a settlement that failed (the job comes back as its form says).
	// This is where to log. It runs in the loop's goroutine, or a
	// batch handler's.
	OnError func(error)
	// OnEvent, when set, is told of each job's start and end and of the
	// errors OnError gets but for the settlements' (those are in the
	// job's end): see [Event]. It runs in the loop's goroutine or a
	// handler's, as many at once as jobs end together, and delays the
	// next job while it runs. [SlogEvents] logs them; package metrics
	// counts them. Unset, the loop reads no clock for it.
	OnEvent func(Event)
	// Grace is how long the handlers running when Run's context ends may
	// run on: the loops stop claiming at once, and once Grace has passed
	// the context of every handler still running ends with cause
	// [ErrShutdown]. A job whose handler then fails goes back at once
	// without spending its attempt, under every form; one whose handler
	// returns nil is acknowledged. Lease jobs keep being extended during
	// the grace period. Zero means [DefaultGrace]; a negative Grace ends
	// the handlers' contexts with Run's (River's StopAndCancel). Run
	// returns once the handlers have: one that ignores its context holds
	// it.
	Grace time.Duration
	// Timeout, when positive, bounds each run of the handler: its
	// context then ends with cause [ErrTimeout], and a handler that
	// returns an error has failed its attempt as any other (a retry after
	// Backoff, or the dead table past MaxAttempts), the error wrapped to
	// match ErrTimeout. Zero means no bound.
	Timeout time.Duration
}

// Defaults and bounds of [Config].
const (
	DefaultPoll        = time.Second
	DefaultMaxAttempts = 25
	// DefaultGrace is Config.Grace's default: under the 30 s a Kubernetes
	// pod or an ECS task gets from SIGTERM to SIGKILL, with room left for
	// the releases and the process's exit.
	DefaultGrace = 10 * time.Second
	// MinPoll is the shortest Config.Poll: a shorter one would make an
	// idle loop a hot one.
	MinPoll = time.Millisecond
)

// Run claims jobs of q and runs handle on each, in the caller's goroutine
// (or [Config.Workers] loops side by side), until ctx ends; then it returns
// nil once its handlers have returned.
//
// It returns an error at once, before any I/O, for a nil queue or handler, a
// Config out of range, and what it could not honour: a row-lock or advisory
// table without a not-before column (unless [Config.NoDelay]), a table
// without a dead table (unless [Config.RetryForever]), a pool too small for
// Workers × Batch jobs in work under the row lock and advisory forms
// ([inbox.Queue.MaxInWork]; the error matches [inbox.ErrPoolTooSmall] and
// names the SetMaxOpenConns to call). It returns an error
// that cannot heal once its handlers have returned: [inbox.ErrPoolTooSmall]
// (the pool cannot hold a job and settle it), and the [*inbox.SchemaError]
// of the schema check it runs after errors (a missing column or dead
// table). Other errors (a cut connection, a deadlock, a server restarting)
// go to [Config.OnError]; a failed claim is retried after a backoff from
// 10 ms doubled to 10 s.
//
// The jobs of a batch run side by side, a goroutine each,
// except for lease batches that settle together (dialects with batched
// statements, [inbox.BatchDialect]): those run one after the other in the
// caller's goroutine for the batch's first millisecond and side by side
// after it, so that quick handlers cost no goroutines. It settles each job
// by handle's result: nil acks, an error retries after [Config.Backoff] or,
// past MaxAttempts, moves the job to the dead table; a panic is recovered
// into a retry whose error carries the panic's text. Each handler runs under
// a keeper ([inbox.Delivery.Keep]).
//
// Shutdown takes two steps. When ctx ends the loops claim no more (a claim
// answered after it is given back), and the running handlers go on for
// [Config.Grace], lease jobs still extended, settling as usual. Then each
// handler still running has its context ended with cause [ErrShutdown], and
// its job, should the handler fail, goes back at once without spending its
// attempt (Release), under every form. A handler that had not started by
// then does not start: its job goes back the same way.
//
// An idle loop waits for a wake-up ([inbox.Queue.NextWake]):
// [inbox.Queue.Enqueue] through a *sql.DB or *sql.Conn wakes the loops of the
// same table in the process, [inbox.Queue.Wake] does after a transaction
// that enqueued commits, and [Listen] relays other processes'
// notifications. Without one, the fallback interval. A paused queue
// ([inbox.Queue.Pause], with a control table) is not claimed from: the
// loops read the state once per fallback interval, and at once after a
// Pause or Resume in this process, whose claim under way then gives its
// jobs back unrun. Config.Workers runs
// several loops in one call; one loop's error that cannot heal stops the
// others, as the end of ctx would, and Run returns it once all have
// returned.
func Run(ctx context.Context, q *inbox.Queue, cfg Config, handle Handler) error {
	if q == nil {
		return errors.New("worker: run: the queue is nil")
	}
	if handle == nil {
		return errors.New("worker: run: the handler is nil")
	}
	w, err := newLoop(ctx, q, cfg, handle)
	if err != nil {
		return err
	}
	if err := fits(q, cfg, w.batch); err != nil {
		return err
	}
	if cfg.Workers > 1 {
		return runLoops(ctx, q, cfg, handle)
	}
	return w.run(ctx)
}

// run is one loop of Run.
func (w *loop) run(ctx context.Context) error {
	q := w.q
	var stopGrace func()
	w.hard, stopGrace = w.graceful(ctx)
	defer stopGrace()
	w.duty = acquireDuty(q, w.poll)
	defer func() {
		w.duty.release()
		for _, b := range w.batchers {
			b.Close()
		}
	}()
	probe := false // the last wait ended with the fallback interval, no wake-up
	failed := 0    // claims failed in a row
	for ctx.Err() == nil {
		if err := w.unhealable(ctx); err != nil {
			return err
		}
		// The wake-up is read before the claim, so that one during the
		// claim is not lost.
		rang, paused := q.NextWake(), w.duty.pause.next()
		if w.duty.pause.held(ctx, probe, w.report) {
			// Paused: no claim, until a wake-up or the interval.
			probe = w.idle(ctx, rang)
			continue
		}
		if probe && !w.mayFind(ctx) {
			probe = w.idle(ctx, rang)
			continue
		}
		ds, err := w.claim(ctx)
		if w.heldBack(ctx, paused, ds) {
			continue
		}
		if err != nil && ctx.Err() == nil {
			if errors.Is(err, inbox.ErrPoolTooSmall) {
				return fmt.Errorf("worker: run: %w", err)
			}
			w.report(err)
			// A transient failure (a cut connection, a server restarting)
			// is retried after a backoff that wake-ups do not shorten.
			failed++
			probe = false
			sleep(ctx, claimBackoff(failed))
			continue
		}
		failed = 0
		if err == nil && len(ds) > 0 {
			if len(ds) == w.batch {
				// There may be more: idle loops lend a hand.
				q.Wake()
			}
			w.handleAll(ds)
			probe = false
			continue
		}
		probe = w.idle(ctx, rang)
	}
	return nil
}

// heldBack gives back unrun, their attempts not spent, the jobs of a claim
// during which this process paused the queue (changed closed since the
// claim began), and reports whether it did.
func (w *loop) heldBack(ctx context.Context, changed <-chan struct{}, ds []*inbox.Delivery) bool {
	if len(ds) == 0 || !w.duty.pause.pausedDuring(ctx, changed, w.report) {
		return false
	}
	w.giveBack(w.detached, ds)
	return true
}

// graceful returns the context the handlers run under: Run's without its
// cancellation, ended with cause ErrShutdown once w.grace has passed since
// ctx ended (at once for a negative grace). stop lets its timer go; the
// loop calls it once its handlers have returned.
func (w *loop) graceful(ctx context.Context) (hard context.Context, stop func()) {
	hard, cancel := context.WithCancelCause(w.detached)
	var (
		mu    sync.Mutex
		timer *time.Timer
	)
	shut := func() { cancel(ErrShutdown) }
	stopAfter := context.AfterFunc(ctx, func() {
		if w.grace < 0 {
			shut()
			return
		}
		mu.Lock()
		timer = time.AfterFunc(w.grace, shut)
		mu.Unlock()
	})
	if w.grace < 0 && ctx.Err() != nil {
		// AfterFunc runs its function in a goroutine of its own: a ctx
		// ended already ends hard before any handler may start.
		shut()
	}
	return hard, func() {
		stopAfter()
		mu.Lock()
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
		cancel(context.Canceled)
	}
}

// claimBackoff is the wait after the nth claim failed in a row: 10 ms
// doubled each time, up to 10 s.
func claimBackoff(n int) time.Duration {
	if n > 10 {
		return 10 * time.Second
	}
	return min(10*time.Millisecond<<(n-1), 10*time.Second)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// unhealable returns the error that ends the loop when the errors it met
// (claims, probes or settlements that failed) come from a table that cannot
// work as described: the schema check ([inbox.Queue.CheckSchema]) then
// reports what is wrong, such as a missing column or dead table. A check
// that fails itself (the server is away) leaves the loop retrying, as such
// failures may heal. The check runs after the 1st, 2nd, 4th, 8th … error,
// so that a loop meeting errors for long spends few statements on it.
func (w *loop) unhealable(ctx context.Context) error {
	if w.failures.Load() < w.nextCheck {
		return nil
	}
	w.nextCheck = 2 * w.failures.Load()
	cctx, cancel := context.WithTimeout(ctx, claimTimeout)
	defer cancel()
	var se *inbox.SchemaError
	if err := w.q.CheckSchema(cctx); errors.As(err, &se) {
		return fmt.Errorf("worker: run: the table cannot serve the loop: %w", se)
	}
	return nil
}

// mayFind reports whether a claim may find a job (inbox.Queue.Probe). A
// probe that fails is reported and counts as nothing found, so the loop
// waits its interval again.
func (w *loop) mayFind(ctx context.Context) bool {
	found, err := w.q.Probe(ctx)
	if err != nil && ctx.Err() == nil {
		w.report(err)
	}
	return found
}

// claim claims a batch. The claim runs to its end even when ctx ends
// meanwhile (bounded by claimTimeout): a claim cut off by its context may
// still commit at the server, leaving leases that hold jobs nobody runs
// until they run out. Jobs claimed after ctx ended are given back at once
// (giveBack).
func (w *loop) claim(ctx context.Context) ([]*inbox.Delivery, error) {
	if w.turns != nil {
		if !w.waitClaimTurn(ctx) {
			return nil, nil
		}
		defer func() { <-w.turns }()
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
	defer cancel()
	ds, err := w.q.Claim(cctx, w.batch)
	if err == nil && ctx.Err() != nil {
		w.giveBack(cctx, ds)
		return nil, nil
	}
	return ds, err
}

// waitClaimTurn waits until fewer than cap(w.turns) loops of the call are
// claiming, and takes a place; false when ctx ended first.
func (w *loop) waitClaimTurn(ctx context.Context) bool {
	select {
	case w.turns <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

// claimRowsAtOnce bounds the lease jobs a Run call's loops claim at once:
// claims side by side lock their rows as they read them and each skips the
// rows the others hold, so that many large claims at once mostly step over
// each other's rows. Measured on PostgreSQL (pgx, 2 cores, bench/README.md,
// "claims of 256 at once"): on a quiet machine loops of 256 ran 12-15 %
// faster four claims at a time than one (4 loops: 93-95k against 80-84k
// jobs/s; 16 loops: 84-86k against 75-76k), and sixteen at a time no
// faster than four; on a loaded one, sixteen claiming freely had fallen to
// 28k where one at a time ran at 49k. MariaDB and SQLite ran alike either
// way. Batches of 1 fell from 2.3k to 1.4k one claim at a time.
const claimRowsAtOnce = 1024

// claimTurns returns the places of a Run call's lease loops that claim at
// once (at least one claim of batch, up to claimRowsAtOnce jobs in all),
// nil when every loop has one.
func claimTurns(lease bool, workers, batch int) chan struct{} {
	places := max(1, claimRowsAtOnce/batch)
	if !lease || places >= workers {
		return nil
	}
	return make(chan struct{}, places)
}

// giveBack releases jobs no handler will run, a lease batch in one
// statement where the dialect has one.
func (w *loop) giveBack(ctx context.Context, ds []*inbox.Delivery) {
	if len(ds) > 1 {
		if b := w.batcherFor(len(ds)); b != nil {
			for _, err := range b.ReleaseAll(ctx, ds) {
				w.report(err)
			}
			return
		}
	}
	for _, d := range ds {
		w.report(d.Release(ctx))
	}
}

// dueMargin is how long after a delayed job is due by this process's clock
// its wake-up comes: the database's clock decides when it is claimable.
const dueMargin = 5 * time.Millisecond

// claimTimeout bounds a claim that outlives its loop's context.
const claimTimeout = 30 * time.Second

// loop is one Run loop's settings.
type loop struct {
	q        *inbox.Queue
	lease    bool // the lease form
	dead     bool // a dead table is named
	delays   bool // a retry may be delayed: the lease form, or a not-before column
	handle   Handler
	batch    int
	poll     time.Duration
	attempts int
	backoff  func(int) time.Duration
	onError  func(error)
	onEvent  func(Event)
	name     string // the table's name, for events
	// batchers settle the lease jobs of a claim of n (their key) together,
	// where the dialect has batched statements; nil otherwise.
	batchers  map[int]*inbox.Batcher
	batchWait time.Duration // how long a batch's acknowledgements wait for their siblings
	// afterFunc is time.AfterFunc, the clock of a batch's waits (the
	// spread, a group's wait in collect); tests replace it.
	afterFunc func(time.Duration, func()) *time.Timer
	// detached is Run's ctx without its cancellation: every settlement
	// runs under it.
	detached context.Context
	// hard is detached, ended with cause ErrShutdown once the grace
	// period after Run's ctx has passed: the handlers run under it.
	hard    context.Context
	grace   time.Duration
	timeout time.Duration // Config.Timeout
	duty    *pollDuty     // shared with the other loops of the queue and interval
	// failures counts the errors reported; at nextCheck of them the loop
	// checks the schema (unhealable).
	failures  atomic.Int64
	nextCheck int64
	// turns, shared by the loops of one Run call, bounds how many of them
	// claim at once (claimTurns); nil when each may claim when it likes.
	turns chan struct{}
}

// report tells OnError and OnEvent of an error of the loop's own.
func (w *loop) report(err error) {
	if err == nil {
		return
	}
	w.count(err)
	if w.onEvent != nil {
		w.onEvent(Event{Kind: EventError, Queue: w.name, Err: err})
	}
}

// count counts err towards the schema check and tells OnError.
func (w *loop) count(err error) {
	if err == nil {
		return
	}
	if !errors.Is(err, inbox.ErrLeaseLost) && !errors.Is(err, inbox.ErrSettled) {
		w.failures.Add(1)
	}
	if w.onError != nil {
		w.onError(err)
	}
}

func newLoop(ctx context.Context, q *inbox.Queue, cfg Config, handle Handler) (*loop, error) {
	switch {
	case cfg.Batch < 0 || cfg.Batch > inbox.MaxClaim:
		return nil, fmt.Errorf("worker: run: Config.Batch %d must be from 1 to %d (0 for 1)", cfg.Batch, inbox.MaxClaim)
	case cfg.Poll < 0:
		return nil, fmt.Errorf("worker: run: Config.Poll %v is negative", cfg.Poll)
	case cfg.Poll > 0 && cfg.Poll < MinPoll:
		return nil, fmt.Errorf("worker: run: Config.Poll %v is under %v (MinPoll): an idle loop would claim without rest", cfg.Poll, MinPoll)
	case cfg.MaxAttempts < 0:
		return nil, fmt.Errorf("worker: run: Config.MaxAttempts %d is negative", cfg.MaxAttempts)
	case cfg.Workers < 0:
		return nil, fmt.Errorf("worker: run: Config.Workers %d is negative", cfg.Workers)
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("worker: run: Config.Timeout %v is negative", cfg.Timeout)
	}
	if cfg.Grace == 0 {
		cfg.Grace = DefaultGrace
	}
	tb := q.Config().Table
	w := &loop{q: q, lease: q.Form() == inbox.Lease, dead: tb.DeadTable != "",
		handle: handle, batch: cfg.Batch, poll: cfg.Poll, attempts: cfg.MaxAttempts, backoff: cfg.Backoff, onError: cfg.OnError,
		onEvent: cfg.OnEvent, name: tb.Name, detached: context.WithoutCancel(ctx), grace: cfg.Grace, timeout: cfg.Timeout,
		afterFunc: time.AfterFunc}
	w.hard = w.detached
	w.delays = w.lease || tb.NotBefore != ""
	w.nextCheck = 1
	switch {
	case !w.delays && !cfg.NoDelay:
		return nil, fmt.Errorf("worker: run: table %s: the %s form delays a failed job's retry only with a not-before column, and it names none: name inbox.Table.NotBefore (or set Config.NoDelay to retry failed jobs at once)", tb.Name, q.Form())
	case !w.dead && !cfg.RetryForever:
		return nil, fmt.Errorf("worker: run: table %s names no dead table, so a job that keeps failing would be retried forever: name inbox.Table.DeadTable (or set Config.RetryForever)", tb.Name)
	}
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
	if w.lease && w.batch > 1 {
		// A dialect without batched statements settles one by one.
		if b, err := q.NewBatcher(inbox.BatchConfig{MaxBatch: 1, Flushers: 1}); err == nil {
			b.Close()
			w.batchers, w.batchWait = map[int]*inbox.Batcher{}, workBatchWait
		}
	}
	return w, nil
}

// DefaultBackoff is the delay after attempt n failed when [Config.Backoff]
// is nil: one second doubled each attempt, capped at an hour, less up to a
// fifth at random so that jobs that failed together do not come back
// together.
func DefaultBackoff(attempt int) time.Duration {
	d := time.Hour
	if attempt >= 1 && attempt <= 12 {
		d = min(time.Second<<(attempt-1), time.Hour)
	}
	return d - time.Duration(rand.Int63n(int64(d/5)+1))
}

// idle waits for a wake-up, or, for the one idle loop that polls, for the
// fallback interval; ctx ending ends the wait. It reports whether the wait
// ended with the interval alone: the claim that follows may probe first.
//
// The polling loop stops polling when its interval runs out, when it is
// woken and when its ctx ends; it may then find jobs and handle them for a
// long time. One of the loops still idle takes the polling over at once,
// without a claim, so that while any loop is idle one of them polls. (A ring
// instead would cost a claim per idle loop; and without a handover, a job
// enqueued by another process while the loop that polled is busy would wait
// for that loop's handlers, not for the interval.)
func (w *loop) idle(ctx context.Context, rang <-chan struct{}) (interval bool) {
	for {
		polls, free := w.duty.take()
		if polls {
			break
		}
		select {
		case <-rang:
			return false
		case <-ctx.Done():
			return false
		case <-free:
		}
	}
	defer w.duty.drop()
	// Up to a tenth either way, so that processes idle together do not
	// poll in step.
	jitter := time.Duration(rand.Int63n(int64(w.poll/5) + 1))
	t := time.NewTimer(w.poll - w.poll/10 + jitter)
	defer t.Stop()
	select {
	case <-rang:
	case <-t.C:
		return true
	case <-ctx.Done():
	}
	return false
}

// handleAll runs the handler of each delivery and waits for them: a lease
// batch through runBatch, other batches each job in a goroutine of its own.
func (w *loop) handleAll(ds []*inbox.Delivery) {
	var g *inbox.KeepGroup
	if w.lease {
		// One hook for the claim pauses its keepers when the grace period
		// ends, in place of one per job, those started after it included:
		// a handler that ignores its context then holds its job no longer
		// than its lease. One timer starts the keepers of a batch, claimed
		// together.
		g = inbox.NewKeepGroup(ds)
		defer g.Stop()
		defer context.AfterFunc(w.hard, g.Pause)()
	}
	if len(ds) == 1 {
		w.handleOne(ds[0], nil, g)
		return
	}
	if b := w.batcherFor(len(ds)); b != nil {
		w.runBatch(b, ds, g)
		return
	}
	done := make(chan struct{}, len(ds))
	for _, d := range ds {
		go func(d *inbox.Delivery) {
			w.handleOne(d, nil, g)
			done <- struct{}{}
		}(d)
	}
	for range ds {
		<-done
	}
}

// succeeded is a lease job of a batch whose handler returned nil, its keeper
// still extending until stopKeeper is called after the ack; d is nil for a
// job settled by the one who ran it.
type succeeded struct {
	d          *inbox.Delivery
	stopKeeper func()
	took       time.Duration // how long its handler ran (OnEvent)
}

// runBatch runs the handlers of a lease batch and acknowledges those that
// succeed, gathering the acknowledgements itself: b sends each group it is
// given at once (batcherFor sets no MaxWait). While the handlers are quick
// they run here, one after the other, and the batch costs no goroutine and
// one AckAll: a goroutine per job cost the loop a tenth of its throughput
// against a loop calling Claim and AckAll. Once w.batchWait has passed since
// the batch began (the spread), the jobs not started yet each get a
// goroutine of their own, the jobs already done are acknowledged at once,
// and the jobs ending after are gathered by collect. So no job waits longer
// than w.batchWait for a sibling's handler, before its own starts or before
// its acknowledgement is sent.
func (w *loop) runBatch(b *inbox.Batcher, ds []*inbox.Delivery, g *inbox.KeepGroup) {
	n := len(ds)
	var (
		next   atomic.Int32 // index of the next job to start
		mu     sync.Mutex
		spread bool                      // the timer ran: jobs ending after it report on done
		ended  bool                      // this goroutine ran the batch to its end first
		early  = make([]succeeded, 0, n) // ended before the spread, not acknowledged yet
		// Made by the spread, under mu: a batch of quick handlers needs
		// neither.
		done      chan succeeded // the jobs ending after the spread
		collected chan struct{}  // closed once collect has acknowledged them
	)
	timer := w.afterFunc(w.batchWait, func() {
		mu.Lock()
		if ended {
			mu.Unlock()
			return
		}
		spread = true
		done, collected = make(chan succeeded, n), make(chan struct{})
		acks, rest := early, n-len(early)
		early = nil
		mu.Unlock()
		w.startRest(ds, &next, done, b, g)
		w.ackGroup(b, acks...)
		w.collect(b, done, rest)
		close(collected)
	})
	for {
		i := int(next.Add(1)) - 1
		if i >= n {
			break
		}
		s := w.handleOne(ds[i], b, g)
		mu.Lock()
		if spread {
			mu.Unlock()
			done <- s
			break
		}
		early = append(early, s)
		mu.Unlock()
	}
	mu.Lock()
	if !spread {
		ended = true
		mu.Unlock()
		timer.Stop()
		w.ackGroup(b, early...)
		return
	}
	mu.Unlock()
	<-collected
}

// collect acknowledges the rest jobs of a spread batch as they report on
// done, in groups of one statement: a group waits up to w.batchWait from its
// first job for the others, and goes at once when no job of the batch is
// left running. (The Batcher's group commit gathers too, but by its MaxWait
// alone, blind to how many jobs are still running: docs/design/batcher.md.)
func (w *loop) collect(b *inbox.Batcher, done <-chan succeeded, rest int) {
	group := make([]succeeded, 0, rest)
	for rest > 0 {
		s := <-done
		rest--
		if s.d == nil {
			continue // settled by handleOne
		}
		group = append(group, s)
		if rest > 0 {
			waited := make(chan struct{})
			t := w.afterFunc(w.batchWait, func() { close(waited) })
		wait:
			for rest > 0 {
				select {
				case s := <-done:
					group = append(group, s)
					rest--
				case <-waited:
					break wait
				}
			}
			t.Stop()
		}
		w.ackGroup(b, group...)
		clear(group)
		group = group[:0]
	}
}

// startRest gives each job of ds not started yet a goroutine of its own,
// which reports the job's end on done.
func (w *loop) startRest(ds []*inbox.Delivery, next *atomic.Int32, done chan<- succeeded, b *inbox.Batcher, g *inbox.KeepGroup) {
	n := len(ds)
	for k := int(next.Load()); k < n; k++ {
		go func() {
			if i := int(next.Add(1)) - 1; i < n {
				done <- w.handleOne(ds[i], b, g)
			}
		}()
	}
}

// ackGroup acknowledges the jobs of group that succeeded in one statement
// and stops their keepers.
func (w *loop) ackGroup(b *inbox.Batcher, group ...succeeded) {
	group = slices.DeleteFunc(group, func(s succeeded) bool { return s.d == nil })
	if len(group) == 0 {
		return
	}
	ds := make([]*inbox.Delivery, len(group))
	for i, s := range group {
		ds[i] = s.d
	}
	for i, err := range b.AckAll(w.detached, ds) {
		group[i].stopKeeper()
		w.ended(ds[i], group[i].took, nil, OutcomeAcked, 0, err)
	}
}

// workBatchWait is how long the acknowledgement of a job of a lease batch
// waits for its siblings' before it is sent: a batch whose handlers finish
// together goes in one statement, and one that finishes apart costs each
// acknowledgement at most this much more time.
const workBatchWait = time.Millisecond

// maxBatcher is inbox's bound on BatchConfig.MaxBatch.
const maxBatcher = 256

// batcherFor returns the batcher settling the jobs of a claim of n, nil
// when they are settled one by one. Its batches are full at n, so that the
// settlements of a claim whose handlers all succeed go at once.
func (w *loop) batcherFor(n int) *inbox.Batcher {
	if w.batchers == nil {
		return nil
	}
	n = min(n, maxBatcher)
	b := w.batchers[n]
	if b == nil {
		// No MaxWait: runBatch gathers the acknowledgements itself, and a
		// wait here as well would hold each group it sends short of n (a
		// job failed, or the batch spread) for acknowledgements that
		// cannot come.
		var err error
		if b, err = w.q.NewBatcher(inbox.BatchConfig{MaxBatch: n, Flushers: 1}); err != nil {
			return nil
		}
		w.batchers[n] = b
	}
	return b
}

// handleOne runs the handler on d under a keeper of g (lease) and settles d
// by its result, through b when b is not nil. Settlements outlive ctx: a job
// is settled or given back even while the loop shuts down. A lease job of a
// batch (b not nil) whose handler succeeded is returned instead, its keeper
// on, for the caller to acknowledge with its siblings'; otherwise the result
// is empty.
func (w *loop) handleOne(d *inbox.Delivery, b *inbox.Batcher, g *inbox.KeepGroup) succeeded {
	if w.hard.Err() != nil {
		// The grace period ended before the handler started: the job goes
		// back unrun, as one claimed after the loop's context ended.
		w.report(d.Release(w.detached))
		return succeeded{}
	}
	var hctx context.Context
	var stopKeeper func()
	if w.lease {
		// The keeper extends the lease through the grace period, and
		// stops (g.Pause) when it ends, its deadline armed.
		hctx, stopKeeper = g.Keep(w.hard, d)
	} else {
		hctx, stopKeeper = d.Keep(w.hard)
	}
	start := w.began(d)
	err, cause := w.run1(hctx, d)
	took := w.since(start)
	if err == nil && b != nil {
		return succeeded{d: d, stopKeeper: stopKeeper, took: took}
	}
	o, delay := w.fate(d.Attempt(), err, cause)
	serr := w.settle(d, b, err, o, delay)
	stopKeeper()
	w.ended(d, took, err, o, delay, serr)
	return succeeded{}
}

// run1 runs the handler on d under ctx, bounded by Config.Timeout, and
// returns its error and the cause its context ended with (nil while it had
// not). A failure after the timeout matches ErrTimeout.
func (w *loop) run1(ctx context.Context, d *inbox.Delivery) (err, cause error) {
	if w.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, w.timeout, ErrTimeout)
		defer cancel()
	}
	err = runHandler(ctx, w.handle, d)
	cause = context.Cause(ctx)
	if err != nil && errors.Is(cause, ErrTimeout) && !errors.Is(err, ErrTimeout) {
		err = fmt.Errorf("%w after %v: %w", ErrTimeout, w.timeout, err)
	}
	return err, cause
}

// fate is what the loop does with a job delivered for its attempt-th time
// whose handler returned err, its context ended with cause (nil while it
// had not ended), and the retry's delay.
func (w *loop) fate(attempt int, err, cause error) (Outcome, time.Duration) {
	var sn *snoozeError
	switch {
	case err == nil:
		return OutcomeAcked, 0
	case errors.As(err, &sn):
		return OutcomeSnoozed, w.delay(sn.after)
	case errors.Is(err, ErrNoRetry) && w.dead:
		return OutcomeDead, 0
	case errors.Is(err, ErrNoRetry):
		return OutcomeDropped, 0
	case errors.Is(cause, ErrShutdown):
		// Stopped by the loop, not failed: the attempt is not spent.
		return OutcomeReleased, 0
	case attempt >= w.attempts && w.dead:
		return OutcomeDead, 0
	}
	return OutcomeRetried, w.delay(w.backoff(attempt))
}

// delay is the delay a retry can have: none under the row lock and
// advisory forms without a not-before column.
func (w *loop) delay(after time.Duration) time.Duration {
	if !w.delays {
		return 0
	}
	return max(after, 0)
}

// settle sends outcome o for d, whose handler returned err, through b when
// b is not nil, and returns the settlement's error.
func (w *loop) settle(d *inbox.Delivery, b *inbox.Batcher, err error, o Outcome, after time.Duration) error {
	ctx := w.detached
	switch o {
	case OutcomeAcked:
		return d.Ack(ctx)
	case OutcomeReleased:
		return d.Release(ctx)
	case OutcomeDead:
		d.SetError(err)
		return d.Dead(ctx)
	case OutcomeDropped:
		// Not Ack: under the row lock that would commit what the failed
		// handler wrote.
		return d.Drop(ctx)
	case OutcomeRetried:
		d.SetError(err)
	}
	var serr error
	if b != nil {
		serr = b.Retry(ctx, d, after)
	} else {
		serr = d.Retry(ctx, after)
	}
	if serr == nil && after > 0 && w.duty != nil {
		// The loops wake when the job is due, not at their next poll;
		// a few milliseconds late, for the database's clock.
		w.duty.due.add(time.Now().Add(after + dueMargin))
	}
	return serr
}

// runHandler runs handle, turning a panic into an error that carries its
// text.
func runHandler(ctx context.Context, handle Handler, d *inbox.Delivery) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("inbox: handler panicked: %v", r)
		}
	}()
	return handle(ctx, d)
}
