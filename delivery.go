package inbox

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// A delivery's life, from this file:
//
//   - Claimed: Queue.Claim (inbox.go) asks the form (form.go) to claim;
//     each form's claim is in its own file (lease.go, rowlock.go,
//     advisory.go), sending its statements through exec.go, and the rows
//     it returns become deliveries here (scanClaimed), tracked by the queue
//     and, where a job holds a connection, by the pool's count (pool.go).
//   - Held: what holds it is one field per form (leaseHold, rowHold,
//     advisoryHold, each declared in its form's file); a keeper (keeper.go)
//     extends a lease or watches the hold until the settlement.
//   - Settled: every settlement runs one protocol (settleBy, below), its
//     statements sent alone by the form (direct) or in a batch (batched,
//     batch.go, which groups them in groupcommit.go and sends them in
//     settlemany.go).
//   - Read back: a settlement whose outcome is unknown, or one in the
//     caller's transaction, learns it from the row (verdict.go), and
//     Committed ends a settlement made in the caller's transaction.

// Delivery is one claimed job. Its methods are safe for concurrent use; a
// delivery settles once.
type Delivery struct {
	q       *Queue
	id      any
	attempt int64
	data    []any
	inline  [2]any // data's storage, when there are no more columns

	lastError string // Table.LastError as claimed
	priority  int64  // Table.Priority as claimed
	// otherLevel: its claim read found the session at another isolation
	// level than READ COMMITTED ([dialect.Stmt.Level]).
	otherLevel bool

	mu      sync.Mutex
	errText any // what SetError recorded: a string, or nil
	settled bool
	lost    bool               // settled by a verdict of ErrLeaseLost
	gone    bool               // lost, and by a cancel: ErrCancelled
	pending *pendingSettlement // lease, advisory: sent, not known to have taken effect
	keeper  *keeper

	// What the job is held by, one per form, each declared with its form.
	lease leaseHold    // lease.go
	row   rowHold      // rowlock.go
	adv   advisoryHold // advisory.go
}

// ID returns the job's id: an int64 for an integer key of any width, a
// string for any other (text, uuid), so that d.ID().(int64) is safe on an
// integer key.
func (d *Delivery) ID() any { return d.id }

// Attempt returns the number of this attempt, 1 for the first.
func (d *Delivery) Attempt() int { return int(d.attempt) }

// Expiry returns the lease's current expiry (lease form; zero otherwise).
func (d *Delivery) Expiry() time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lease.expiry
}

// LastError returns the error text the job's last Retry or Dead recorded
// (Table.LastError; empty without one).
func (d *Delivery) LastError() string { return d.lastError }

// Priority returns the job's priority (Table.Priority; zero without one).
func (d *Delivery) Priority() int { return int(d.priority) }

// SetError records err's text for the delivery's Retry or Dead to write
// into Table.LastError; without that column it is not kept. The text is
// made storable on every engine: invalid UTF-8 and NUL bytes become U+FFFD,
// and it is cut at a character boundary to [MaxErrorText] bytes. A nil err
// records nothing.
func (d *Delivery) SetError(err error) {
	if err == nil {
		return
	}
	text := storableText(err.Error())
	d.mu.Lock()
	d.errText = text
	d.mu.Unlock()
}

// recordedError reports whether SetError recorded an error.
func (d *Delivery) recordedError() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.errText != nil
}

// Key returns the advisory key the delivery holds (advisory form).
func (d *Delivery) Key() string { return d.adv.key }

// Scan copies the data columns into dest, in the order of Table.Data,
// converting as sql.Rows.Scan does for these destinations: *any, *string,
// *[]byte (copied), *bool, *int, *int8 … *int64, *uint … *uint64, *float32,
// *float64, *time.Time, and any sql.Scanner (sql.NullString and the like).
// Numbers and bools become text in *string and *[]byte, a time its RFC 3339
// text; text parses into numbers and bools; NULL goes only into *any,
// *[]byte or a Scanner. Other destinations are an error.
func (d *Delivery) Scan(dest ...any) error {
	if len(dest) != len(d.data) {
		return fmt.Errorf("inbox: scan: %d destinations for %d data columns", len(dest), len(d.data))
	}
	for i, v := range d.data {
		if err := convert(dest[i], v); err != nil {
			return opErr("scan data column "+strconv.Itoa(i), err)
		}
	}
	return nil
}

// scanClaimed reads the rows of a claim (id, delivered attempt, (lease)
// expiry, data columns, where clock is given the engine's clock, and with
// level whether the session runs at READ COMMITTED) into deliveries
// appended to into, or when into is nil to a new slice for up to max.
func (q *Queue) scanClaimed(rows *sql.Rows, withExpiry bool, into []*Delivery, max int, clock *time.Time, level bool) ([]*Delivery, error) {
	defer rows.Close()
	nd := len(q.names.Data)
	// One scratch for the whole claim, its destinations included: rows
	// differ only in where the attempt and data go. Without a slice to
	// append to, a claim of one job returns the scratch's own slot.
	sc := &claimScan{}
	if into == nil {
		into = sc.one[:0]
		if max > 1 {
			into = make([]*Delivery, 0, max)
		}
	}
	dest := sc.dest[:0]
	if n := nd + 7; n > len(sc.dest) {
		dest = make([]any, 0, n)
	}
	for rows.Next() {
		d := &Delivery{q: q}
		d.data = d.inline[:0]
		if nd > len(d.inline) {
			d.data = make([]any, 0, nd)
		}
		d.data = d.data[:nd]
		dest = append(dest[:0], &sc.id, &d.attempt)
		if withExpiry {
			dest = append(dest, &sc.exp)
		}
		for i := range d.data {
			dest = append(dest, &d.data[i])
		}
		if q.names.LastError != "" {
			dest = append(dest, &sc.lastErr)
		}
		if q.names.Priority != "" {
			dest = append(dest, &d.priority)
		}
		if clock != nil {
			dest = append(dest, &sc.clock)
		}
		if level {
			dest = append(dest, &sc.level)
		}
		if err := q.scanClaimedRow(rows, d, dest, sc, withExpiry, clock); err != nil {
			return into, q.unreadClaimed(rows, len(dest), withExpiry, err)
		}
		d.otherLevel = level && !sc.level
		into = append(into, d)
	}
	return into, rows.Err()
}

// scanClaimedRow reads the current row of a claim into d.
func (q *Queue) scanClaimedRow(rows *sql.Rows, d *Delivery, dest []any, sc *claimScan, withExpiry bool, clock *time.Time) error {
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	d.id, d.lastError = normID(sc.id), sc.lastErr.String
	if clock != nil && clock.IsZero() {
		// Read now: the driver may reuse the value's bytes at the next row.
		t, err := q.dialect.ScanTime(sc.clock.v)
		if err != nil {
			return err
		}
		*clock = micro(t)
	}
	if withExpiry {
		t, err := q.dialect.ScanTime(sc.exp.v)
		if err != nil {
			return err
		}
		d.lease.expiry = micro(t)
	}
	return nil
}

// claimReadError is a claim's failure to read a row it claimed (a value
// its destination cannot hold: a NULL priority, text in an integer
// column). rows are the deliveries of the rows not delivered, the failed
// one and those after it, holding their tokens alone, so that a claim that
// wrote them gives them back.
type claimReadError struct {
	err  error
	rows []*Delivery
}

func (e *claimReadError) Error() string { return e.err.Error() }
func (e *claimReadError) Unwrap() error { return e.err }

// unreadClaimed reads the tokens (id, delivered attempt and, withExpiry,
// expiry) of the current row, which failed with err, and of the rows after
// it, each column taken as the driver gives it, and returns err with them
// as a *claimReadError. Rows it cannot read either are left out.
func (q *Queue) unreadClaimed(rows *sql.Rows, ncols int, withExpiry bool, err error) error {
	raw := make([]rawValue, ncols)
	dest := make([]any, ncols)
	for i := range raw {
		dest[i] = &raw[i]
	}
	e := &claimReadError{err: err}
	for more := true; more; more = rows.Next() {
		// The current row may be scanned again, into other destinations.
		if rows.Scan(dest...) != nil {
			continue
		}
		attempt, aerr := int64Of(raw[1].v)
		if aerr != nil || raw[0].v == nil {
			continue
		}
		d := &Delivery{q: q, id: normID(raw[0].v), attempt: attempt}
		if withExpiry {
			t, terr := q.dialect.ScanTime(raw[2].v)
			if terr != nil {
				continue
			}
			d.lease.expiry = micro(t)
		}
		e.rows = append(e.rows, d)
	}
	return e
}

// int64Of reads an integer as a driver returns it.
func int64Of(v any) (int64, error) {
	switch x := v.(type) {
	case int64:
		return x, nil
	case int32:
		return int64(x), nil
	case int:
		return int64(x), nil
	case uint64:
		return int64(x), nil
	case []byte:
		return strconv.ParseInt(string(x), 10, 64)
	case string:
		return strconv.ParseInt(x, 10, 64)
	}
	return 0, fmt.Errorf("an attempt of type %T", v)
}

// claimScan is where a claim scans what it does not keep as read.
type claimScan struct {
	id      any
	exp     rawValue
	clock   rawValue
	level   bool
	lastErr sql.NullString
	dest    [9]any
	one     [1]*Delivery
}

// rawValue takes a column's value as the driver gave it: scanning into it
// neither converts nor copies, where a *any destination would box a time.
// Its bytes are the driver's until the next row.
type rawValue struct{ v any }

func (r *rawValue) Scan(src any) error {
	r.v = src
	return nil
}

// tokenValues are the parameters of a statement checking d's token.
func (d *Delivery) tokenValues() values {
	return values{id: d.id, attempt: d.attempt, expiry: d.lease.expiry, errText: d.errText}
}

// Ack settles the job as done: its row is deleted. Under the row lock the
// handler's writes through [Delivery.Tx] commit with it.
//
// Under the lease and advisory forms, a settlement whose statement fails
// (its context ends or its connection breaks mid-statement, so that its
// outcome is unknown) reads the row back, on a short context of its own,
// and reports what the database holds: nil when it took effect,
// [ErrLeaseLost] when the job is another's, its own error when the row
// still carries the delivery's token (a lease delivery may then be settled
// again), and an error matching [ErrOutcomeUnknown] when the read fails
// too.
func (d *Delivery) Ack(ctx context.Context) error { return d.settle(ctx, nil, outAck, 0) }

// Retry settles the job for a later attempt, not before after has passed.
// The attempt stays spent. Under the row lock and advisory forms a delay
// needs Table.NotBefore ([ErrNoNotBefore]). Under the row lock the
// handler's writes through [Delivery.Tx] are undone, and the attempt and
// the error are recorded even after a statement of the handler failed;
// should the held transaction be lost (a deadlock, a cut session), they
// are recorded in a new one, or not at all with [ErrLeaseLost] when
// another claim took the job meanwhile. An error text the database refuses
// is dropped rather than the Retry. Under the lease and advisory forms, an
// error text ([Delivery.SetError]) the database refuses (a Table.LastError
// column narrower than [MaxErrorText]) is dropped and the Retry sent again
// without it; an unknown outcome is read back as for [Delivery.Ack].
func (d *Delivery) Retry(ctx context.Context, after time.Duration) error {
	return d.settle(ctx, nil, outRetry, after)
}

// Release gives the job back at once without spending its attempt. An
// unknown outcome is read back as for [Delivery.Ack].
func (d *Delivery) Release(ctx context.Context) error {
	return d.settle(ctx, nil, outRelease, 0)
}

// Dead moves the job to Table.DeadTable, in one transaction, with the
// attempt it was delivered with. Without a dead table it returns
// [ErrNoDeadTable]. Under the row lock the handler's writes through
// [Delivery.Tx] are undone, as by [Delivery.Retry].
// A refused error text and an unknown outcome are handled as for
// [Delivery.Retry].
func (d *Delivery) Dead(ctx context.Context) error { return d.settle(ctx, nil, outDead, 0) }

// Drop deletes the job for good as a failed attempt's end, on a table
// without a dead table (the worker's [Permanent] errors there). Under the
// row lock the handler's writes through [Delivery.Tx] are undone first, as
// by [Delivery.Retry] and [Delivery.Dead], where [Delivery.Ack] would
// commit them; should the held transaction be lost, the row is deleted in a
// new one. Under the lease and advisory forms, whose handlers write in
// transactions of their own, it is [Delivery.Ack].
func (d *Delivery) Drop(ctx context.Context) error {
	if d.q.names.Form != RowLock {
		return d.settle(ctx, nil, outAck, 0)
	}
	return d.settle(ctx, nil, outDrop, 0)
}

// AckTx is Ack inside the caller's transaction, so that the handler's writes
// and the acknowledgement commit together; the token check fences a stale
// holder. Row-lock deliveries return [ErrOwnTx]: write through Tx instead.
//
// The settlement is one only once tx is known to have committed: call
// [Delivery.Committed] after a successful tx.Commit. Until then the
// delivery is not settled: its keeper extends no more but its deadline
// stays armed (the handler is cancelled with [ErrLeaseLost] by the last
// expiry it knows of, less [Config.KeepMargin]), an advisory delivery keeps
// its lock, and a settlement may be sent again, after tx has ended: if tx
// rolled back or its COMMIT failed, the job is still this delivery's and
// the new settlement takes effect; if tx committed, the new one finds the
// row settled and returns an error matching [ErrSettled] (the package
// learns the outcome from the row). An advisory delivery holds its lock and
// its pinned connection until one of these happens, or the queue's next
// Claim reads the row and finds the settlement committed (not for RetryTx,
// which leaves the row looking the same), or [Queue.Shutdown]. A nil
// error means the statement ran in tx; [ErrLeaseLost] means the row no
// longer carries the delivery's token, a verdict that ends the delivery
// whatever becomes of tx; any other error leaves the delivery as it was.
func (d *Delivery) AckTx(ctx context.Context, tx *sql.Tx) error {
	return d.settle(ctx, tx, outAck, 0)
}

// RetryTx is Retry inside the caller's transaction. It is a settlement
// only once tx is known to have committed: see [Delivery.AckTx] and
// [Delivery.Committed]. An advisory RetryTx that writes nothing (no delay
// and no error text recorded) settles at once.
func (d *Delivery) RetryTx(ctx context.Context, tx *sql.Tx, after time.Duration) error {
	return d.settle(ctx, tx, outRetry, after)
}

// ReleaseTx is Release inside the caller's transaction. It is a settlement
// only once tx is known to have committed: see [Delivery.AckTx] and
// [Delivery.Committed].
func (d *Delivery) ReleaseTx(ctx context.Context, tx *sql.Tx) error {
	return d.settle(ctx, tx, outRelease, 0)
}

// DeadTx is Dead inside the caller's transaction. It is a settlement only
// once tx is known to have committed: see [Delivery.AckTx] and
// [Delivery.Committed].
func (d *Delivery) DeadTx(ctx context.Context, tx *sql.Tx) error {
	return d.settle(ctx, tx, outDead, 0)
}

// finishedErr is what a finished delivery answers: ErrSettled, and
// ErrLeaseLost too when the verdict that finished it was a lost lease, so
// that a late settlement still reads as one.
func (d *Delivery) finishedErr() error {
	if d.gone {
		return errSettledCancelled
	}
	if d.lost {
		return errSettledLost
	}
	return ErrSettled
}

type outcome int

const (
	outAck outcome = iota
	outRetry
	outRelease
	outDead
	outDrop // row lock only: an Ack without the handler's writes
)

func (o outcome) String() string {
	return [...]string{"ack", "retry", "release", "dead", "drop"}[o]
}

// refuse returns why outcome o cannot run at all, before anything is sent.
func (d *Delivery) refuse(tx *sql.Tx, o outcome, after time.Duration) error {
	switch {
	case o == outDead && d.q.names.Dead == "":
		return ErrNoDeadTable
	case after < 0:
		return fmt.Errorf("delay %v is negative", after)
	}
	return d.q.form.refuse(d.q, tx, o, after)
}

// A settlement's protocol, written once (settleBy) for a delivery alone
// and for one in a batch; Batcher.settleAll runs the same steps for many
// deliveries with one send. It is refused before anything moves (admit,
// which leaves the keeper extending); the keeper's extensions stop
// (pauseKeeper); under d.mu, held until the verdict so that no extension
// moves the token meanwhile, a delivery already finished answers so
// (open); the statements go (send); and the result is recorded (close).

// A sender is how a settlement's statements go: alone (direct, the form's
// statements, in tx when not nil) or in a batch (batched, batch.go).
type sender interface {
	// admit refuses a settlement before anything moves.
	admit(ctx context.Context, d *Delivery, o outcome, after time.Duration) error
	// send runs the settlement, d.mu held and d open.
	send(ctx context.Context, d *Delivery, o outcome, after time.Duration) error
}

// settle runs outcome o, inside tx when not nil. A settlement that reached a
// verdict (done, or the lease lost) finishes the delivery; one that failed on
// the way (a cut connection) leaves it to be settled again where the form
// allows, once the row read back says it did not take effect; one in tx
// leaves it pending until tx is known to have committed.
func (d *Delivery) settle(ctx context.Context, tx *sql.Tx, o outcome, after time.Duration) error {
	return d.settleBy(ctx, o, after, direct{tx})
}

// settleBy is the protocol, its statements sent by s.
func (d *Delivery) settleBy(ctx context.Context, o outcome, after time.Duration, s sender) error {
	if err := s.admit(ctx, d, o, after); err != nil {
		return err
	}
	d.pauseKeeper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.open(o); err != nil {
		return err
	}
	return d.close(o, s.send(ctx, d, o, after))
}

// direct sends a settlement's statements alone, through its form.
type direct struct{ tx *sql.Tx }

func (s direct) admit(_ context.Context, d *Delivery, o outcome, after time.Duration) error {
	if err := d.refuse(s.tx, o, after); err != nil {
		return opErr(o.String(), err)
	}
	return nil
}

func (s direct) send(ctx context.Context, d *Delivery, o outcome, after time.Duration) error {
	return d.q.form.settle(ctx, d, s.tx, o, after)
}

// open refuses a settlement of a finished delivery, whose keeper it ends;
// d.mu is held.
func (d *Delivery) open(o outcome) error {
	if d.settled {
		d.endKeeper()
		return opErr(o.String(), d.finishedErr())
	}
	return nil
}

// close records the result err of a settlement; d.mu is held. With a
// verdict (the delivery settled) the keeper's work is over; without one its
// deadline stays armed, the lease perhaps still ours.
func (d *Delivery) close(o outcome, err error) error {
	if d.settled {
		d.endKeeper()
	}
	if err != nil {
		return opErr(o.String(), err)
	}
	return nil
}
