package inbox

import (
	"context"
	"database/sql"
	"slices"
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
	if !q.form.holdsConn(q) {
		return -1
	}
	max := q.db.Stats().MaxOpenConnections
	if max <= 0 {
		return -1
	}
	return max - 1
}

// Probe reports whether a claim may find a job, in one statement
// (Statements.Jobs.Probe) where the dialect has one, so that an idle loop's
// fallback poll costs a statement, not a claim's transaction. Without a
// probe statement (a claim of one statement already) it reports true and
// sends nothing. It returns the statement's error, wrapped as
// "inbox: probe: …"; a row it finds may be gone by the claim.
func (q *Queue) Probe(ctx context.Context) (bool, error) {
	if q.st.Jobs.Probe.SQL == "" {
		return true, nil
	}
	v := &values{}
	now, err := q.claimNow(ctx, q.st.Jobs.Probe)
	if err != nil {
		return false, opErr("probe", err)
	}
	v.now = now
	var rows *sql.Rows
	if rows, err = q.query(ctx, q.db, q.st.Jobs.Probe, v); err != nil {
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

// ReleaseAll is [Batcher.Release] of several deliveries queued together, as
// [Batcher.AckAll] is for Ack: jobs a loop claimed and will not run go back
// in one statement, their attempts not spent. The errors are in ds's order.
func (b *Batcher) ReleaseAll(ctx context.Context, ds []*Delivery) []error {
	return b.settleAll(ctx, ds, outRelease)
}
