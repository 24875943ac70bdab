package inbox

import (
	"context"
	"database/sql"
	"slices"
	"sync"
)

// What a worker loop written on the package needs besides Claim and the
// settlements: the configuration, the probe of an idle poll, a keeper for
// each job of a claim on one timer, and giving a claim back in one
// statement. Waiting for a wake-up is [Queue.NextWake] (wake.go).

// Config returns the configuration q was made with, the Table's defaults
// filled in: a loop reads there whether a dead table or a not-before column
// is named, and the notification channel.
func (q *Queue) Config() Config {
	c := q.cfg
	c.Table.Data = slices.Clone(c.Table.Data)
	return c
}

// MaxInWork returns how many jobs the queue's pool can hold in work at once,
// for every queue on the pool together, or -1 when nothing bounds it. Under
// the row lock, and the advisory form where the engine has session locks
// (PostgreSQL, MySQL), a job in work holds a connection and the pool keeps
// one for the rest: it is the pool's SetMaxOpenConns less one, read now (0
// for a pool of one, where Claim returns [ErrPoolTooSmall]). The lease form,
// SQLite's advisory form and a pool without a limit are unbounded. A loop
// reads it to refuse more workers than the pool can serve.
func (q *Queue) MaxInWork() int {
	if q.names.Form == Lease || (q.names.Form == Advisory && q.locker == nil) {
		return -1
	}
	max := q.db.Stats().MaxOpenConnections
	if max <= 0 {
		return -1
	}
	return max - 1
}

// Probe reports whether a claim may find a job, in one statement
// ([Statements.Probe]) where the dialect has one, so that an idle loop's
// fallback poll costs a statement, not a claim's transaction. Without a
// probe statement (a claim of one statement already) it reports true and
// sends nothing. It returns the statement's error, wrapped as
// "inbox: probe: …"; a row it finds may be gone by the claim.
func (q *Queue) Probe(ctx context.Context) (bool, error) {
	if q.st.Probe.SQL == "" {
		return true, nil
	}
	v := &values{}
	now, err := q.claimNow(ctx, q.st.Probe)
	if err != nil {
		return false, opErr("probe", err)
	}
	v.now = now
	var rows *sql.Rows
	if rows, err = q.query(ctx, q.db, q.st.Probe, v); err != nil {
		return false, opErr("probe", err)
	}
	found := rows.Next()
	if err = rows.Close(); err == nil {
		err = rows.Err()
	}
	if err != nil {
		return false, opErr("probe", err)
	}
	return found, nil
}

// KeepGroup keeps the deliveries of one [Queue.Claim], each under its own
// keeper as [Delivery.Keep] does. One claim made the first extension of all
// its leases due at one instant, so their keepers start on one timer, not
// one each; and [KeepGroup.Pause] stops them together. Under the row lock and
// advisory forms nothing needs keeping and Keep only derives the context.
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
	if len(ds) > 1 && ds[0].q.names.Form == Lease {
		g.starter = newKeepStarter(ds[0].q, ds[0].sentAt, len(ds))
		g.kept = make([]*Delivery, 0, len(ds))
	}
	return g
}

// Keep is [Delivery.Keep] for d, a delivery of the group's claim; a
// delivery of another claim gets a keeper of its own timing. After Pause,
// the keeper starts paused.
func (g *KeepGroup) Keep(ctx context.Context, d *Delivery) (context.Context, func()) {
	kctx, stop := d.keep(ctx, g.starter)
	if d.q.names.Form != Lease {
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

// ReleaseAll is [Batcher.Release] of several deliveries queued together, as
// [Batcher.AckAll] is for Ack: jobs a loop claimed and will not run go back
// in one statement, their attempts not spent. The errors are in ds's order.
func (b *Batcher) ReleaseAll(ctx context.Context, ds []*Delivery) []error {
	return b.settleAll(ctx, ds, outRelease)
}
