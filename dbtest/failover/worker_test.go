package failover

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/dbtest/internal/ledger"
	"github.com/sqlinbox/inbox/worker"
)

// run is what the harness shares with every worker goroutine.
type run struct {
	ctx    context.Context // ends the workers
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// killing is set just before the primary is killed: from then on a
	// failed Ack is the kill's doing. killed is set once every process of
	// the old primary is gone: a claim that begins later can only run on
	// the new primary (the "post" epoch); one that began earlier ran on the
	// old one or failed (the "pre" epoch).
	killing, killed atomic.Bool
	holding         atomic.Int64  // holders holding a job
	released        chan struct{} // closed after the kill: held handlers go on
}

// wait pauses a worker for d or until the run ends: the worker loop's own
// back-off between claims, not a test waiting for an event.
func (r *run) wait(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.ctx.Done():
	}
}

// group is one queue (one form, one driver, one kind of worker) and its
// workers: goroutines of this process on one pool, whose multi-host DSN
// follows the primary.
type group struct {
	driver string // database/sql driver name: "postgres" (lib/pq) or "pgx"
	label  string // pq or pgx
	form   string // rowlock, lease, advisory
	// loop: the workers are the package's own loop, worker.Run; otherwise
	// they call Claim, Keep and Ack themselves.
	loop    bool
	table   string
	effects string // rowlock: written through Delivery.Tx
	jobs    int64
	holders int // workers that hold a job midway
	runners int // workers that never do (Claim workers only)
	batch   int
	// holdAfter is how many pre-epoch handlers run in full: every later
	// one holds its job until the kill (midway through the jobs).
	holdAfter int64

	db *sql.DB
	q  *inbox.Queue
	// Two ledgers: deliveries claimed before the kill (on the old primary,
	// whose sessions the kill ended: a "killed" process to the checker)
	// and after (on the new primary).
	prePath, postPath string
	pre, post         *ledger.Writer

	started    atomic.Int64 // pre-epoch handlers started by holders
	preClaims  atomic.Int64 // pre-epoch claims in flight
	preInWork  atomic.Int64 // pre-epoch deliveries not yet settled or stopped
	ackFails   atomic.Int64 // pre-epoch Acks that failed once the kill began
	cutOff     atomic.Int64 // pre-epoch handlers whose own writes failed once the kill began
	claimErrs  atomic.Int64
	firstClaim atomic.Int64 // unix nanoseconds of the first claim after the kill

	mu          sync.Mutex
	firstErr    string // the first claim error, for the figures
	stops       []leaseStop
	stale       map[int64]time.Time // lease: stopped job → its holder's last known expiry
	reclaimedAt map[int64]time.Time // lease: stopped job → when (server clock) it was claimed again
	fatal       error
}

// leaseStop is a lease holder in work at the kill, stopped by its keeper.
type leaseStop struct {
	d      *inbox.Delivery
	id     int64
	at     time.Time // when its handler's context ended
	cause  error
	expiry time.Time // the last expiry the holder knew of
}

// cancelClock notes when a handler's context ends, as it ends
// (context.AfterFunc), not when the handler next looks: a handler waiting
// behind others of its claim would look late.
type cancelClock struct {
	done chan struct{}
	at   time.Time
	stop func() bool
}

func watchCancel(ctx context.Context) *cancelClock {
	c := &cancelClock{done: make(chan struct{})}
	c.stop = context.AfterFunc(ctx, func() {
		c.at = time.Now()
		close(c.done)
	})
	return c
}

func (g *group) name() string {
	if g.loop {
		return g.label + "/" + g.form + "/Work"
	}
	return g.label + "/" + g.form + "/Claim"
}

func (g *group) fail(err error) {
	g.mu.Lock()
	if g.fatal == nil {
		g.fatal = err
	}
	g.mu.Unlock()
}

func (g *group) err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.fatal
}

// work claims and handles jobs until the run ends. A holder holds a job
// midway (see handle); a runner never does, so that its claims, effects and
// Acks are in flight when the kill comes. A failure stops this goroutine and
// is reported through g.err.
func (g *group) work(r *run, holder bool) {
	defer r.wg.Done()
	idle, backoff := 5*time.Millisecond, 10*time.Millisecond
	held := false
	for r.ctx.Err() == nil {
		pre := !r.killed.Load()
		if pre {
			g.preClaims.Add(1)
		}
		ds, err := g.q.Claim(r.ctx, g.batch)
		if pre {
			// Counted in work before the claim stops counting in flight,
			// so that the harness never sees neither.
			g.preInWork.Add(int64(len(ds)))
			g.preClaims.Add(-1)
		}
		if err != nil {
			if r.ctx.Err() != nil {
				return
			}
			// While no primary answers, every claim fails: counted, and
			// tried again after a short back-off.
			if g.claimErrs.Add(1) == 1 {
				g.mu.Lock()
				g.firstErr = err.Error()
				g.mu.Unlock()
			}
			r.wait(backoff)
			backoff = min(2*backoff, 100*time.Millisecond)
			continue
		}
		backoff = 10 * time.Millisecond
		if len(ds) == 0 {
			r.wait(idle)
			idle = min(2*idle, 50*time.Millisecond)
			continue
		}
		idle = 5 * time.Millisecond
		w := g.post
		if pre {
			w = g.pre
		} else {
			g.firstClaim.CompareAndSwap(0, time.Now().UnixNano())
		}
		// Every job of the claim is delivered, and kept, from the claim on.
		ctxs := make([]context.Context, len(ds))
		stops := make([]func(), len(ds))
		clocks := make([]*cancelClock, len(ds))
		for i, d := range ds {
			if err := w.Write(ledger.OpClaim, d.ID().(int64), d.Attempt()); err != nil {
				g.fail(err)
				return
			}
			ctxs[i], stops[i] = d.Keep(context.Background())
			if pre && g.form == "lease" {
				clocks[i] = watchCancel(ctxs[i])
			}
			if !pre && g.form == "lease" {
				g.noteReclaim(d)
			}
		}
		for i, d := range ds {
			err := g.handle(r, w, pre, d, ctxs[i], clocks[i], holder, &held)
			if clocks[i] != nil {
				clocks[i].stop()
			}
			stops[i]()
			if err != nil {
				for _, stop := range stops[i+1:] {
					stop()
				}
				g.fail(err)
				return
			}
		}
	}
}

// workLoop runs the package's own worker loop, worker.Run, with the same
// handler, until the run ends. Its workers all hold a job at the kill, so
// that none has a claim in flight: a handler that starts before killed is
// set handles a claim of the old primary, one that starts after a claim of
// the new. The handler settles its delivery itself, so that the ledger
// records each Ack's result; Work's own settlement then finds it settled
// and changes nothing. A lease holder stopped by its keeper returns the
// cause, as a handler would, and Work retries the job (which fails while
// no primary answers).
func (g *group) workLoop(r *run) {
	defer r.wg.Done()
	held := false
	err := worker.Run(r.ctx, g.q, worker.Config{Batch: g.batch}, func(hctx context.Context, d *inbox.Delivery) error {
		pre := !r.killed.Load()
		w := g.post
		if pre {
			w = g.pre
			g.preInWork.Add(1)
		} else {
			g.firstClaim.CompareAndSwap(0, time.Now().UnixNano())
			if g.form == "lease" {
				g.noteReclaim(d)
			}
		}
		if err := w.Write(ledger.OpClaim, d.ID().(int64), d.Attempt()); err != nil {
			g.fail(err)
			return err
		}
		var clock *cancelClock
		if pre && g.form == "lease" {
			clock = watchCancel(hctx)
			defer clock.stop()
		}
		if err := g.handle(r, w, pre, d, hctx, clock, true, &held); err != nil {
			g.fail(err)
			return err
		}
		if cause := context.Cause(hctx); pre && g.form == "lease" && errors.Is(cause, inbox.ErrLeaseLost) {
			return cause
		}
		return nil
	})
	if err != nil {
		g.fail(err)
	}
}

// handle runs one delivery: the row-lock form writes an effect through the
// claim's transaction; a holder's pre-epoch handler past holdAfter holds its
// job until the kill; then it acknowledges, except a lease holder cut off
// from every primary, which stops when its keeper says the lease is lost.
//
// clock, for a pre-epoch lease delivery, tells when its context ended.
func (g *group) handle(r *run, w *ledger.Writer, pre bool, d *inbox.Delivery, kctx context.Context, clock *cancelClock, holder bool, held *bool) error {
	id := d.ID().(int64)
	if tx := d.Tx(); tx != nil {
		if _, err := tx.Exec("INSERT INTO "+g.effects+" (job_id) VALUES ($1)", id); err != nil {
			if pre && r.killing.Load() {
				// A runner's write caught by the kill: the handler gives
				// up, and the job is back on the old primary's standby.
				_ = d.Release(context.Background())
				g.preInWork.Add(-1)
				g.cutOff.Add(1)
				return nil
			}
			return fmt.Errorf("job %d: writing its effect: %w", id, err)
		}
	}
	if holder && pre && g.started.Add(1) > g.holdAfter {
		if !*held {
			*held = true
			r.holding.Add(1)
		}
		select {
		case <-r.released:
		case <-kctx.Done():
			if !r.killing.Load() {
				return fmt.Errorf("job %d: the handler's context ended before the kill: %v", id, context.Cause(kctx))
			}
		case <-r.ctx.Done():
			return nil
		}
	}
	if pre && g.form == "lease" && r.killing.Load() {
		// No primary answers the keeper: it must stop this handler, before
		// the lease it last wrote runs out.
		select {
		case <-clock.done:
		case <-r.ctx.Done():
			return nil
		}
		s := leaseStop{d: d, id: id, at: clock.at, cause: context.Cause(kctx), expiry: d.Expiry()}
		g.mu.Lock()
		g.stops = append(g.stops, s)
		g.stale[id] = s.expiry
		g.mu.Unlock()
		g.preInWork.Add(-1)
		return nil
	}
	if err := w.Write(ledger.OpAck, id, d.Attempt()); err != nil {
		return err
	}
	err := d.Ack(context.Background())
	if pre {
		g.preInWork.Add(-1)
	}
	if err != nil {
		if werr := w.Write(ledger.OpAckFail, id, d.Attempt()); werr != nil {
			return werr
		}
		if pre && r.killing.Load() {
			// Caught by the kill: its transaction or advisory session
			// died with the old primary (the job is back there), or its
			// answer did (the Ack may have committed: the ledger tells).
			g.ackFails.Add(1)
			return nil
		}
		return fmt.Errorf("job %d attempt %d: %w", id, d.Attempt(), err)
	}
	return w.Write(ledger.OpAcked, id, d.Attempt())
}

// noteReclaim records when a lease job stopped at the kill was claimed again,
// by the server's clock: its new expiry less the lease.
func (g *group) noteReclaim(d *inbox.Delivery) {
	id := d.ID().(int64)
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.stale[id]; ok {
		if _, seen := g.reclaimedAt[id]; !seen {
			g.reclaimedAt[id] = d.Expiry().Add(-g.q.Lease())
		}
	}
}

// lateAcks acknowledges, on the new primary, every lease delivery stopped
// at the kill: each must find its lease lost and change nothing. (Claim
// workers only: Work has settled its stopped deliveries its own way.)
func (g *group) lateAcks() []string {
	if g.loop {
		return nil
	}
	g.mu.Lock()
	stops := append([]leaseStop(nil), g.stops...)
	g.mu.Unlock()
	var problems []string
	for _, s := range stops {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := s.d.Ack(ctx)
		cancel()
		if !errors.Is(err, inbox.ErrLeaseLost) {
			problems = append(problems, fmt.Sprintf("%s: late Ack of job %d attempt %d, stopped at the kill: %v, want ErrLeaseLost", g.name(), s.id, s.d.Attempt(), err))
		}
	}
	return problems
}
