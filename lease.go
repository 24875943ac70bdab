package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"sort"
	"time"
)

// leaseHold is what holds a lease delivery: its token's expiry as stored,
// and when the statement that set it was sent (monoNow), both guarded by
// Delivery.mu.
type leaseHold struct {
	expiry, sentAt time.Time
}

// leaseForm holds a job by an expiry written into its row ([form]).
type leaseForm struct{}

// claim: a lease claim is one statement or one transaction: as a deadlock's
// victim it claimed nothing and may run again.
func (leaseForm) claim(ctx context.Context, q *Queue, max int) (ds []*Delivery, err error) {
	err = q.retryDeadlock(func() (err error) {
		ds, err = q.claimLease(ctx, max)
		return err
	})
	return ds, err
}

// refuse: a lease carries a Retry's delay as its expiry, and its
// settlements run in the caller's transaction too.
func (leaseForm) refuse(*Queue, *sql.Tx, outcome, time.Duration) error { return nil }

func (leaseForm) settle(ctx context.Context, d *Delivery, tx *sql.Tx, o outcome, after time.Duration) error {
	return d.settleLease(ctx, tx, o, after)
}

func (leaseForm) leased() bool { return true }

// watch: nothing; a keeper extends the lease instead (Keep).
func (leaseForm) watch(*Delivery, context.CancelCauseFunc) (func(), bool) { return nil, false }

func (leaseForm) holdsConn(*Queue) bool { return false }

// held: until its lease could have run out, measured from when its expiry
// was sent.
func (leaseForm) held(d *Delivery) bool { return d.q.monoNow().Before(d.lease.sentAt.Add(d.q.lease)) }

func (leaseForm) finished(context.Context, *Delivery) {}

// unconfirmed: the keeper's deadline, armed while the settlement is
// pending, stops the handler should the commit never come.
func (leaseForm) unconfirmed(*Delivery) {}

// shutdown: the job keeps its lease and may still settle: the keeper
// extends no more, and stops the handler by the lease's end.
func (leaseForm) shutdown(_ context.Context, d *Delivery) error {
	d.pauseKeeper()
	return nil
}

// claimLease claims up to max jobs by writing their leases: one statement
// where the engine returns what it wrote, else a locking SELECT and one
// UPDATE per claimMarkIDs rows in a READ COMMITTED transaction.
func (q *Queue) claimLease(ctx context.Context, max int) ([]*Delivery, error) {
	sent := q.monoNow()
	v := values{limit: max, micros: q.lease.Microseconds()}
	if q.st.Claim.Take.SQL == "" {
		return q.claimLeaseSelectMark(ctx, &v, sent)
	}
	return q.takeClaimed(ctx, q.st.Claim.For(max), &v, sent)
}

// takeClaimed claims by claim, one statement returning the rows it leased
// (Claim.Take and its forms, Claim.WalkTake).
func (q *Queue) takeClaimed(ctx context.Context, claim dialect.Stmt, v *values, sent time.Time) ([]*Delivery, error) {
	max := v.limit
	if err := q.fillTimes(ctx, q.db, claim, v, q.lease); err != nil {
		return nil, err
	}
	rows, err := q.query(ctx, q.db, claim, v)
	if err != nil {
		return nil, err
	}
	ds, err := q.scanClaimed(rows, true, nil, max, nil, claim.Level)
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
		d.lease.sentAt = sent
	}
	return ds, nil
}

// claimLeaseSelectMark is the lease claim of engines without UPDATE …
// RETURNING (MySQL): the rows are locked by Claim.Select, then marked.
func (q *Queue) claimLeaseSelectMark(ctx context.Context, v *values, sent time.Time) ([]*Delivery, error) {
	walked := false
	if take := q.st.Claim.WalkTake; v.limit == 1 && take.SQL != "" && q.walkPast.Load() <= 0 && !endsSoon(ctx) {
		q.warm(ctx, take)
		tv := *v
		ds, err := q.takeClaimed(ctx, take, &tv, sent)
		if len(ds) > 0 && q.takeMissed.Load() != 0 {
			// Read first: a write at every claim would pass this
			// cache line between the claiming goroutines' cores.
			q.takeMissed.Store(0)
		}
		if err != nil || len(ds) > 0 {
			return ds, err
		}
		// Nothing claimed: the claim goes on from here without the walk.
		walked = true
	}
	first := *v
	ds, err := q.claimLeaseTx(ctx, v, sent, walked)
	if errors.Is(err, errOtherLevel) {
		*v = first
		ds, err = q.claimLeaseTx(ctx, v, sent, walked)
	}
	if walked && len(ds) > 0 && q.takeMissed.Add(1) >= 2 {
		// The walk missed a job the reads found, twice running: the
		// next claims leave it out for a span, as they would after
		// Claim.WalkFirst. Once may be a job enqueued between the two
		// (a race a queue fed while its claims run meets often); twice
		// is the head: leases in force or run out, jobs not yet ready.
		q.takeMissed.Store(0)
		q.walkPast.Store(walkPastSpan)
	}
	return ds, err
}

// endsSoon reports whether ctx ends within a second. Such a claim is not
// sent as one statement that commits at the server (Claim.WalkTake), which
// runs on when its context cuts it and may lease a job nobody runs until
// the lease ends; from the client, a cut claim rolls back.
func endsSoon(ctx context.Context) bool {
	deadline, ok := ctx.Deadline()
	return ok && time.Until(deadline) < time.Second
}

// claimLeaseTx claims in a READ COMMITTED transaction of the client's:
// Claim.Select and the reads after it, then the mark. walked: a
// Claim.WalkTake of this claim found nothing, so Claim.WalkFirst is not
// sent.
func (q *Queue) claimLeaseTx(ctx context.Context, v *values, sent time.Time, walked bool) ([]*Delivery, error) {
	more, free := q.freeReads(v.limit)
	walk := dialect.Stmt{}
	if v.limit == 1 && !walked {
		walk = q.st.Claim.WalkFirst
	}
	q.warm(ctx, walk, q.st.Claim.Select, more, free, q.st.Claim.Pick, q.st.Claim.PickAfter, q.st.Claim.PickMore, q.st.Claim.PickMoreAfter, q.st.Claim.PickLock, q.leaseMark(v.limit))
	clocked := q.st.Claim.Select.Clock || q.st.Claim.PickLock.Clock
	if !clocked {
		q.warm(ctx, q.st.Now)
	}
	opts, atSession := q.claimTxOptions()
	tx, err := q.db.BeginTx(ctx, opts)
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
	ds, err := q.selectClaimed(ctx, ex, v, walked)
	if err != nil {
		return nil, err
	}
	if atSession && q.readAtOtherLevel(ds...) {
		return nil, errOtherLevel
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
	claimed, err := q.markClaimed(ctx, ex, ds, v, sent)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	return claimed, nil
}

// leaseMark is the mark a lease claim of up to limit jobs sends (and warms):
// Claim.MarkOne for a claim of one where the dialect has it, else
// Claim.Mark.
func (q *Queue) leaseMark(limit int) dialect.Stmt {
	if limit == 1 && q.st.Claim.MarkOne.SQL != "" {
		return q.st.Claim.MarkOne
	}
	return q.st.Claim.Mark
}

// markClaimed marks the rows of ds with the claim's expiry by Claim.Mark, as
// many a statement as it names (a claim of one by Claim.MarkOne where the
// dialect has it), and returns the deliveries whose rows it marked.
func (q *Queue) markClaimed(ctx context.Context, ex Executor, ds []*Delivery, v *values, sent time.Time) ([]*Delivery, error) {
	mark := q.leaseMark(v.limit)
	per := 0 // rows one mark marks
	for _, a := range mark.Args {
		if a == dialect.ArgID {
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
			d.lease.expiry, d.lease.sentAt = v.until, sent
		}
		mv := values{tokens: toks, now: v.now, until: v.until}
		n, err := q.exec(ctx, ex, mark, &mv)
		if err != nil {
			return nil, err
		}
		if n < int64(len(chunk)) {
			// Some rows changed since they were read: only a lock the engine
			// does not hold cluster-wide lets that happen. The rows carrying
			// this claim's expiry are its own.
			if q.st.Claim.Marked.SQL == "" {
				return nil, fmt.Errorf("inbox: claim: Claim.Mark changed %d of %d rows and the dialect has no Claim.Marked to tell which: the claim was rolled back", n, len(chunk))
			}
			if chunk, err = q.claimMarked(ctx, ex, chunk, &mv); err != nil {
				return nil, err
			}
		}
		claimed = append(claimed, chunk...)
	}
	return claimed, nil
}

// claimMarked keeps, of the chunk a Claim.Mark named, the deliveries whose
// rows it wrote, as Claim.Marked reads them back.
func (q *Queue) claimMarked(ctx context.Context, tx Executor, chunk []*Delivery, mv *values) ([]*Delivery, error) {
	rows, err := q.query(ctx, tx, q.st.Claim.Marked, mv)
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

// selectClaimed locks the rows of a lease claim by Claim.Select and, for the
// places left, Claim.SelectMore (SelectMoreOne for a claim of one); where
// the dialect has Claim.SelectFree, that is sent first, and its rows, when
// it returns any, are the claim. With a priority both reads read the whole
// claim and the best are kept, by priority then id: the rows locked beyond
// it are let go when the claim's transaction commits.
func (q *Queue) selectClaimed(ctx context.Context, tx Executor, v *values, walked bool) ([]*Delivery, error) {
	max := v.limit
	if q.st.Claim.PickLock.SQL != "" {
		var reading time.Time
		var clock *time.Time
		if q.st.Claim.PickLock.Clock {
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
	if walk := q.st.Claim.WalkFirst; max == 1 && walk.SQL != "" && !walked && !spend(&q.walkPast) {
		// The walk returns no row past its bound of rows it could not
		// claim: the reads below follow, and the next claims leave it
		// out for a span.
		var err error
		if ds, err = q.readClaimed(ctx, tx, walk, v, ds); err != nil || len(ds) > 0 {
			return ds, err
		}
		q.walkPast.Store(walkPastSpan)
	}
	more, free := q.freeReads(max)
	if free.SQL != "" {
		// Free rows, unless some lease has run out: then none, and the
		// claim reads the due rows first as below. Rows here are all
		// the free ones there were, or max of them.
		var err error
		if ds, err = q.readClaimed(ctx, tx, free, v, ds); err != nil {
			return nil, err
		}
		if len(ds) > 0 {
			return ds, nil
		}
	}
	for _, s := range []dialect.Stmt{q.st.Claim.Select, more} {
		if s.SQL == "" || (len(ds) == max && q.names.Priority == "") {
			continue
		}
		v.limit = max - len(ds)
		if q.names.Priority != "" {
			v.limit = max
		}
		var err error
		if ds, err = q.readClaimed(ctx, tx, s, v, ds); err != nil {
			return nil, err
		}
	}
	if q.names.Priority != "" {
		sortClaimOrder(ds)
		ds = ds[:min(len(ds), max)]
	}
	return ds, nil
}

// freeReads returns the reads of free rows a lease claim of max jobs sends
// (Claim.SelectMore and Claim.SelectFree, or their One forms for a claim of
// one where the dialect has them), so that it prepares no other.
func (q *Queue) freeReads(max int) (more, free dialect.Stmt) {
	if max == 1 && q.st.Claim.SelectMoreOne.SQL != "" {
		return q.st.Claim.SelectMoreOne, q.st.Claim.SelectFreeOne
	}
	return q.st.Claim.SelectMore, q.st.Claim.SelectFree
}

// readClaimed appends to ds the rows s locks, reading the engine's clock
// from them where s returns it (into v.now, from the first that came with
// rows).
func (q *Queue) readClaimed(ctx context.Context, tx Executor, s dialect.Stmt, v *values, ds []*Delivery) ([]*Delivery, error) {
	rows, err := q.query(ctx, tx, s, v)
	if err != nil {
		return ds, err
	}
	var reading time.Time
	var clock *time.Time
	if s.Clock {
		clock = &reading
	}
	if ds, err = q.scanClaimed(rows, false, ds, 0, clock, s.Level); err != nil {
		return ds, err
	}
	if v.now.IsZero() {
		v.now = reading
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
	if !d.q.form.leased() {
		return nil
	}
	if err := d.extendLocked(ctx); err != nil {
		return opErr("extend", err)
	}
	return nil
}

func (d *Delivery) extendLocked(ctx context.Context) error {
	q := d.q
	s := q.st.Settle.Extend
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
		d.lease.expiry, d.lease.sentAt, d.pending = micro(t), sent, nil
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
	d.lease.expiry, d.lease.sentAt, d.pending = v.until, sent, nil
	return nil
}

// unchanged tells, after a token statement affected no row, whether the row
// is still there with the token it would have written: engines that count
// only changed rows (MySQL) report zero for a write of the value a row
// already holds, which is not a lost lease.
func (q *Queue) unchanged(ctx context.Context, ex Executor, v *values) (bool, error) {
	if q.st.Settle.Exists.SQL == "" || !v.until.Equal(v.expiry) {
		return false, nil
	}
	var n int64
	err := q.queryRow(ctx, ex, q.st.Settle.Exists, v).Scan(&n)
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
		return q.exec(ctx, ex, q.st.Settle.Ack, v)
	case outRelease:
		return q.exec(ctx, ex, q.st.Settle.Release, v)
	case outDead:
		return q.moveDead(ctx, ex, v)
	}
	v.micros = after.Microseconds()
	if err := q.fillTimes(ctx, ex, q.st.Settle.Retry, v, after); err != nil {
		return 0, err
	}
	n, err := q.exec(ctx, ex, q.st.Settle.Retry, v)
	if err == nil && n == 0 {
		var held bool
		if held, err = q.unchanged(ctx, ex, v); held {
			n = 1
		}
	}
	return n, err
}
