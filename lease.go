package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"
)

// claimLease claims up to max jobs by writing their leases: one statement
// where the engine returns what it wrote, else a locking SELECT and one
// UPDATE per claimMarkIDs rows in a READ COMMITTED transaction.
func (q *Queue) claimLease(ctx context.Context, max int) ([]*Delivery, error) {
	sent := q.monoNow()
	v := values{limit: max, micros: q.lease.Microseconds()}
	if q.st.Claim.SQL == "" {
		return q.claimLeaseSelectMark(ctx, &v, sent)
	}
	if err := q.fillTimes(ctx, q.db, q.st.Claim, &v, q.lease); err != nil {
		return nil, err
	}
	rows, err := q.query(ctx, q.db, q.st.Claim, &v)
	if err != nil {
		return nil, err
	}
	ds, err := q.scanClaimed(rows, true, nil, max, nil)
	if err != nil {
		// The statement claimed every row it returned: Claim gives back
		// those read and those it could not read.
		var unread *claimReadError
		if errors.As(err, &unread) {
			ds = append(ds, unread.rows...)
		}
		return ds, err
	}
	if q.names.Priority != "" {
		// The statement returns its rows in the order it updated them.
		sortClaimOrder(ds)
	}
	for _, d := range ds {
		d.sentAt = sent
	}
	return ds, nil
}

// claimLeaseSelectMark is the lease claim of engines without UPDATE …
// RETURNING (MySQL): the rows are locked by ClaimSelect, then marked.
func (q *Queue) claimLeaseSelectMark(ctx context.Context, v *values, sent time.Time) ([]*Delivery, error) {
	q.warm(ctx, q.st.ClaimSelect, q.st.ClaimSelectMore, q.st.Pick, q.st.PickAfter, q.st.PickMore, q.st.PickMoreAfter, q.st.PickLock, q.st.ClaimMark)
	clocked := q.st.ClaimSelect.Clock || q.st.PickLock.Clock
	if !clocked {
		q.warm(ctx, q.st.Now)
	}
	tx, err := q.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	ex := q.own(tx)
	if !clocked {
		now, err := q.readNow(ctx, ex)
		if err != nil {
			return nil, err
		}
		v.now = now
	}
	ds, err := q.selectClaimed(ctx, ex, v)
	if err != nil {
		return nil, err
	}
	if len(ds) == 0 {
		return ds, tx.Commit()
	}
	if v.now.IsZero() {
		// The reads that came with rows carried no clock.
		if v.now, err = q.readNow(ctx, ex); err != nil {
			return nil, err
		}
	}
	v.until = v.now.Add(q.lease)
	per := 0 // rows one ClaimMark marks
	for _, a := range q.st.ClaimMark.Args {
		if a == ArgID {
			per++
		}
	}
	toks := make([]token, 0, per)
	claimed := ds[:0]
	for i := 0; i < len(ds); i += per {
		chunk := ds[i:min(i+per, len(ds))]
		toks = toks[:0]
		for _, d := range chunk {
			toks = append(toks, token{id: d.id, attempt: d.attempt})
			d.expiry, d.sentAt = v.until, sent
		}
		mv := values{tokens: toks, now: v.now, until: v.until}
		n, err := q.exec(ctx, ex, q.st.ClaimMark, &mv)
		if err != nil {
			return nil, err
		}
		if n < int64(len(chunk)) {
			// Some rows changed since they were read: only a lock the engine
			// does not hold cluster-wide lets that happen. The rows carrying
			// this claim's expiry are its own.
			if q.st.ClaimMarked.SQL == "" {
				return nil, fmt.Errorf("inbox: claim: ClaimMark changed %d of %d rows and the dialect has no ClaimMarked to tell which: the claim was rolled back", n, len(chunk))
			}
			if chunk, err = q.claimMarked(ctx, ex, chunk, &mv); err != nil {
				return nil, err
			}
		}
		claimed = append(claimed, chunk...)
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	return claimed, nil
}

// claimMarked keeps, of the chunk a ClaimMark named, the deliveries whose
// rows it wrote, as ClaimMarked reads them back.
func (q *Queue) claimMarked(ctx context.Context, tx Executor, chunk []*Delivery, mv *values) ([]*Delivery, error) {
	rows, err := q.query(ctx, tx, q.st.ClaimMarked, mv)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	mine := map[any]bool{}
	for rows.Next() {
		var id any
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		mine[normID(id)] = true
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	kept := chunk[:0]
	for _, d := range chunk {
		if mine[d.id] {
			kept = append(kept, d)
		}
	}
	return kept, nil
}

// selectClaimed locks the rows of a lease claim by ClaimSelect and, for the
// places left, ClaimSelectMore. With a priority both read the whole claim
// and the best are kept, by priority then id: the rows locked beyond it are
// let go when the claim's transaction commits.
func (q *Queue) selectClaimed(ctx context.Context, tx Executor, v *values) ([]*Delivery, error) {
	max := v.limit
	if q.st.PickLock.SQL != "" {
		var reading time.Time
		var clock *time.Time
		if q.st.PickLock.Clock {
			clock = &reading
		}
		ds, err := q.pick(ctx, tx, max, v.now, clock)
		if v.now.IsZero() {
			v.now = reading
		}
		sortClaimOrder(ds)
		return ds, err
	}
	ds := make([]*Delivery, 0, max)
	for _, s := range []Stmt{q.st.ClaimSelect, q.st.ClaimSelectMore} {
		if s.SQL == "" || (len(ds) == max && q.names.Priority == "") {
			continue
		}
		v.limit = max - len(ds)
		if q.names.Priority != "" {
			v.limit = max
		}
		rows, err := q.query(ctx, tx, s, v)
		if err != nil {
			return nil, err
		}
		var reading time.Time
		var clock *time.Time
		if s.Clock {
			clock = &reading
		}
		if ds, err = q.scanClaimed(rows, false, ds, 0, clock); err != nil {
			return nil, err
		}
		if v.now.IsZero() {
			v.now = reading // the first that came with rows
		}
	}
	if q.names.Priority != "" {
		sortClaimOrder(ds)
		ds = ds[:min(len(ds), max)]
	}
	return ds, nil
}

// sortClaimOrder sorts a claim's deliveries in the claim order: the highest
// priority first, then the lowest id.
func sortClaimOrder(ds []*Delivery) {
	sort.Slice(ds, func(i, j int) bool { return claimBefore(ds[i].priority, ds[i].id, ds[j].priority, ds[j].id) })
}

// Extend moves the lease's expiry to now plus the lease, if the delivery
// still holds it, and adopts the new expiry as its token. It returns
// [ErrLeaseLost] when the row no longer carries the token, [ErrSettled]
// after a settlement; either way nothing changed. Under the other forms there
// is nothing to extend and it returns nil while the job is held.
func (d *Delivery) Extend(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.settled {
		return opErr("extend", d.finishedErr())
	}
	if d.q.names.Form != Lease {
		return nil
	}
	if err := d.extendLocked(ctx); err != nil {
		return opErr("extend", err)
	}
	return nil
}

func (d *Delivery) extendLocked(ctx context.Context) error {
	q := d.q
	s := q.st.Extend
	sent := q.monoNow()
	v := d.tokenValues()
	v.micros = q.lease.Microseconds()
	if err := q.fillTimes(ctx, q.db, s, &v, q.lease); err != nil {
		return err
	}
	if s.Rows {
		var raw any
		err := q.queryRow(ctx, q.db, s, &v).Scan(&raw)
		if errors.Is(err, sql.ErrNoRows) {
			return d.learn(ctx, q.db)
		}
		if err != nil {
			return err
		}
		t, err := q.dialect.ScanTime(raw)
		if err != nil {
			return err
		}
		// The token was in place: a settlement pending did not take effect.
		d.expiry, d.sentAt, d.pending = micro(t), sent, nil
		return nil
	}
	n, err := q.exec(ctx, q.db, s, &v)
	if err != nil {
		return err
	}
	if n == 0 {
		if held, err := q.unchanged(ctx, q.db, &v); err != nil || !held {
			if err == nil {
				err = d.learn(ctx, q.db)
			}
			return err
		}
	}
	d.expiry, d.sentAt, d.pending = v.until, sent, nil
	return nil
}

// unchanged tells, after a token statement affected no row, whether the row
// is still there with the token it would have written: engines that count
// only changed rows (MySQL) report zero for a write of the value a row
// already holds, which is not a lost lease.
func (q *Queue) unchanged(ctx context.Context, ex Executor, v *values) (bool, error) {
	if q.st.Exists.SQL == "" || !v.until.Equal(v.expiry) {
		return false, nil
	}
	var n int64
	err := q.queryRow(ctx, ex, q.st.Exists, v).Scan(&n)
	return n > 0, err
}

// settleLease runs a settlement as a compare-and-set on the token, through
// the pool or inside the caller's tx. In tx it is a settlement only once tx
// is known to have committed ([Delivery.Committed], or a later touch that
// finds the row so): until then the delivery stays unsettled, its keeper
// paused with its deadline armed.
func (d *Delivery) settleLease(ctx context.Context, tx *sql.Tx, o outcome, after time.Duration) error {
	var ex Executor = d.q.db
	if tx != nil {
		ex = tx
	}
	v := d.tokenValues()
	// A context that has ended already sends nothing: no outcome to learn.
	ended := ctx.Err() != nil
	n, err := d.sendLease(ctx, ex, o, after, &v)
	if err != nil && v.errText != nil && (o == outRetry || o == outDead) && textRejected(err) {
		// The database refused the error text (a last_error narrower than
		// MaxErrorText): the settlement goes again without it, so that no
		// text can keep a job from settling.
		v.errText = nil
		n, err = d.sendLease(ctx, ex, o, after, &v)
	}
	switch {
	case err != nil && (tx != nil || ended):
		// What the statement did is the transaction's, which the caller
		// ends: the delivery stays as it was.
		return err
	case err != nil:
		return d.readBack(ctx, o, v.until, err, nil)
	case n == 0:
		return d.learn(ctx, ex)
	case tx != nil:
		d.setPending(o, tx, v.until)
		return nil
	}
	d.settled, d.pending = true, nil
	return nil
}

// sendLease sends the statements of outcome o with v through ex and returns
// the rows it settled.
func (d *Delivery) sendLease(ctx context.Context, ex Executor, o outcome, after time.Duration, v *values) (int64, error) {
	q := d.q
	switch o {
	case outAck:
		return q.exec(ctx, ex, q.st.Ack, v)
	case outRelease:
		return q.exec(ctx, ex, q.st.Release, v)
	case outDead:
		return q.moveDead(ctx, ex, v)
	}
	v.micros = after.Microseconds()
	if err := q.fillTimes(ctx, ex, q.st.Retry, v, after); err != nil {
		return 0, err
	}
	n, err := q.exec(ctx, ex, q.st.Retry, v)
	if err == nil && n == 0 {
		var held bool
		if held, err = q.unchanged(ctx, ex, v); held {
			n = 1
		}
	}
	return n, err
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
// an extension finds the lease gone, or when no extension has succeeded by
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
// the first extension is due (with [Config.After] set, at once); under the
// other forms nothing needs extending and none ever does.
func (d *Delivery) Keep(ctx context.Context) (context.Context, func()) {
	return d.keep(ctx, nil)
}

// keep is Keep, its keeper started by s when s is not nil: the deliveries of
// one claim share the instant their first extension is due, and so one
// timer for it.
func (d *Delivery) keep(ctx context.Context, s *keepStarter) (context.Context, func()) {
	kctx, cancel := context.WithCancelCause(ctx)
	d.mu.Lock()
	if d.q.names.Form != Lease || d.settled || d.keeper != nil {
		d.mu.Unlock()
		return kctx, func() { cancel(context.Canceled) }
	}
	k := &keeper{d: d, ctx: ctx, cancel: cancel, sentAt: d.sentAt}
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
	half := q.lease / 2
	retry := q.lease / 10
	next := sentAt.Add(half)
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
		sent, answered, err := k.extend(ctx, giveUp)
		if !answered {
			k.cancel(ErrLeaseLost)
			return
		}
		switch {
		case err == nil:
			next, giveUp = sent.Add(half), sent.Add(q.lease-q.margin)
		case errors.Is(err, ErrSettled):
			return
		case errors.Is(err, ErrLeaseLost):
			k.cancel(ErrLeaseLost)
			return
		default:
			next = q.monoNow().Add(retry)
		}
	}
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
			res <- result{ErrSettled, k.d.sentAt}
			return
		}
		err := k.d.extendLocked(ectx)
		res <- result{err, k.d.sentAt}
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
