package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The sweep: jobs whose de-duplication ids the stream may have forgotten.
//
// While relays run, a job is claimed again at most Reach after a publish
// of it, and the stream's window is longer (Check). When no relay claims
// for a while (all down, the broker or the database away), a job's lease
// or retry delay can have ended longer ago than the window allows, and a
// publish of it now would be stored as new beside the message stored
// before. The table's lease column is the only trace of when it was last
// in the hands of a relay: a claim overwrites it. So the relay reads it
// before it claims, at the start of Run and then every quarter of the slack
// (the window less Reach), the claims held off meanwhile. A job whose lease
// ended L, with a slack S, was published, if ever, no earlier than
// L - Reach; its id is in the window until L - Reach + window = L + S. A
// sweep at t takes the jobs with L < t - S/2, which leaves those it does
// not take at least S/2 to be claimed before they come to the edge, and
// the next sweep comes S/4 later.

// scanMargin is how much earlier than the earliest possible publish the
// scan starts, for the database's clock (the leases) against the
// broker's (the stored messages' times).
const scanMargin = time.Minute

// riskRow is a job whose lease ended long enough ago that the stream may
// have forgotten its id: the lease token as read (to delete it only as it
// is), and the lease's end.
type riskRow struct {
	id, attempt, lease any
	until              time.Time
}

// sweep runs a sweep when one is due, with the claims held off.
func (r *Relay) sweep(ctx context.Context) error {
	if time.Now().UnixNano() < r.nextSweep.Load() {
		return nil
	}
	r.gate.Lock()
	defer r.gate.Unlock()
	if time.Now().UnixNano() < r.nextSweep.Load() {
		return nil // another loop swept
	}
	st := r.stream.Load()
	slack := st.window - r.Reach()
	if err := r.sweepOnce(ctx, st, slack/2); err != nil {
		return err
	}
	r.nextSweep.Store(time.Now().Add(max(slack/4, time.Millisecond)).UnixNano())
	return nil
}

// sweepOnce reads the jobs whose lease ended more than age ago, scans the
// stream for their ids, and deletes the jobs whose own messages it finds.
func (r *Relay) sweepOnce(ctx context.Context, st *streamState, age time.Duration) error {
	rows, err := r.atRisk(ctx, age)
	if err != nil || len(rows) == 0 {
		return err
	}
	want := make(map[string]int, len(rows))
	earliest := rows[0].until
	for i, row := range rows {
		want[r.cfg.MsgIDPrefix+idText(row.id)] = i
		if row.until.Before(earliest) {
			earliest = row.until
		}
	}
	found, err := r.scan(ctx, st.s, earliest.Add(-r.Reach()-scanMargin), want)
	if err != nil {
		return err
	}
	if len(found) == 0 {
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, r.cfg.ProofTimeout)
	idx := make([]int, 0, len(found))
	seqs := make([]uint64, 0, len(found))
	for i, seq := range found {
		idx = append(idx, i)
		seqs = append(seqs, seq)
	}
	got, gerrs := r.readMsgs(pctx, seqs)
	cancel()
	for k, i := range idx {
		if errors.Is(gerrs[k], jetstream.ErrMsgNotFound) {
			continue // removed since the scan: not proven, published as usual
		}
		if gerrs[k] != nil {
			return fmt.Errorf("relay: sweep: reading message %d: %w", seqs[k], gerrs[k])
		}
		n, err := r.deleteStored(ctx, rows[i], got[k].Subject, got[k].Data)
		if err != nil {
			return err
		}
		r.recovered.Add(uint64(n))
	}
	return nil
}

// sweepSQL returns the table's statements: the jobs whose lease ended
// before a time, and the deletion of one by its token, subject and
// payload. byArg says the time is a parameter (the caller's clock, as the
// queue's on SQLite or under Config.Now) rather than the server's now()
// less a number of microseconds.
func (r *Relay) sweepSQL() (sel, del string, byArg bool, err error) {
	qc := r.q.Config()
	d := qc.Dialect
	t := qc.Table
	names := []string{cmp.Or(t.ID, "id"), cmp.Or(t.Attempt, "attempt"), t.LockedUntil, t.Data[0], t.Data[1]}
	q := make([]string, len(names))
	for i, n := range names {
		if q[i], err = d.QuoteIdent(n); err != nil {
			return "", "", false, err
		}
	}
	var table []string
	for _, part := range strings.Split(t.Name, ".") {
		qp, err := d.QuoteIdent(part)
		if err != nil {
			return "", "", false, err
		}
		table = append(table, qp)
	}
	tb := strings.Join(table, ".")
	id, attempt, lease, subject, payload := q[0], q[1], q[2], q[3], q[4]
	if d.Name() == "sqlite" {
		return "SELECT " + id + ", " + attempt + ", " + lease + " FROM " + tb + " WHERE " + lease + " < ?",
			"DELETE FROM " + tb + " WHERE " + id + " = ? AND " + attempt + " = ? AND " + lease + " = ? AND " + subject + " = ? AND " + payload + " = ?",
			true, nil
	}
	sel = "SELECT " + id + ", " + attempt + ", " + lease + " FROM " + tb + " WHERE " + lease + " < now() - CAST($1 AS bigint) * interval '1 microsecond'"
	if qc.Now != nil {
		sel = "SELECT " + id + ", " + attempt + ", " + lease + " FROM " + tb + " WHERE " + lease + " < $1"
	}
	return sel, "DELETE FROM " + tb + " WHERE " + id + " = $1 AND " + attempt + " = $2 AND " + lease + " = $3 AND " + subject + " = $4 AND " + payload + " = $5",
		qc.Now != nil, nil
}

// atRisk reads the jobs whose lease or retry delay ended more than age
// ago.
func (r *Relay) atRisk(ctx context.Context, age time.Duration) ([]riskRow, error) {
	sel, _, byArg, err := r.sweepSQL()
	if err != nil {
		return nil, err
	}
	qctx, cancel := context.WithTimeout(ctx, r.cfg.AckTimeout)
	defer cancel()
	qc := r.q.Config()
	var arg any = age.Microseconds()
	if byArg {
		now := time.Now()
		if qc.Now != nil {
			now = qc.Now()
		}
		arg = qc.Dialect.TimeArg(now.Add(-age))
	}
	rows, err := r.cfg.DB.QueryContext(qctx, sel, arg)
	if err != nil {
		return nil, fmt.Errorf("relay: sweep: %w", err)
	}
	defer rows.Close()
	var out []riskRow
	for rows.Next() {
		var row riskRow
		if err := rows.Scan(&row.id, &row.attempt, &row.lease); err != nil {
			return nil, fmt.Errorf("relay: sweep: %w", err)
		}
		if b, ok := row.id.([]byte); ok {
			row.id = string(b)
		}
		if row.until, err = qc.Dialect.ScanTime(row.lease); err != nil {
			return nil, fmt.Errorf("relay: sweep: %w", err)
		}
		out = append(out, row)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("relay: sweep: %w", err)
	}
	return out, nil
}

// deleteStored deletes row if its lease token is still the one read, and
// its subject and payload are the stored message's: the comparison is the
// database's. It returns the rows deleted, 0 or 1.
func (r *Relay) deleteStored(ctx context.Context, row riskRow, subject string, payload []byte) (int64, error) {
	_, del, _, err := r.sweepSQL()
	if err != nil {
		return 0, err
	}
	dctx, cancel := context.WithTimeout(ctx, r.cfg.AckTimeout)
	defer cancel()
	res, err := r.cfg.DB.ExecContext(dctx, del, row.id, row.attempt, row.lease, subject, payload)
	if err != nil {
		return 0, fmt.Errorf("relay: sweep: deleting job %v: %w", row.id, err)
	}
	return res.RowsAffected()
}

// scan reads the stream's messages stored since start (their headers
// only, through an ephemeral consumer) up to the last one stored when it
// begins, and returns the stream sequence of the first message of this
// table carrying each id of want, by want's index. Each request to the
// broker has ProofTimeout; a scan cut short is an error, never "not
// stored".
func (r *Relay) scan(ctx context.Context, s jetstream.Stream, start time.Time, want map[string]int) (map[int]uint64, error) {
	found := map[int]uint64{}
	cctx, cancel := context.WithTimeout(ctx, r.cfg.ProofTimeout)
	c, err := s.CreateConsumer(cctx, jetstream.ConsumerConfig{
		DeliverPolicy:     jetstream.DeliverByStartTimePolicy,
		OptStartTime:      &start,
		AckPolicy:         jetstream.AckNonePolicy,
		HeadersOnly:       true,
		MemoryStorage:     true,
		InactiveThreshold: time.Minute,
	})
	cancel()
	if err != nil {
		return nil, fmt.Errorf("relay: sweep: a consumer on stream %s: %w", r.cfg.Stream, err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.ProofTimeout)
		defer cancel()
		_ = s.DeleteConsumer(dctx, c.CachedInfo().Name)
	}()
	// The messages from start to the last one now: a fetch of exactly
	// what is left returns as soon as it has them.
	pending := c.CachedInfo().NumPending
	for read := uint64(0); read < pending; {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		b, err := c.Fetch(int(min(pending-read, 1000)), jetstream.FetchMaxWait(r.cfg.ProofTimeout))
		if err != nil {
			return nil, fmt.Errorf("relay: sweep: scanning stream %s: %w", r.cfg.Stream, err)
		}
		n, done := uint64(0), false
		for m := range b.Messages() {
			n++
			meta, err := m.Metadata()
			if err != nil {
				return nil, fmt.Errorf("relay: sweep: scanning stream %s: %w", r.cfg.Stream, err)
			}
			h := m.Headers()
			if i, ok := want[h.Get(jetstream.MsgIDHeader)]; ok && h.Get(SourceHeader) == r.cfg.Source {
				if _, seen := found[i]; !seen {
					found[i] = meta.Sequence.Stream
				}
			}
			done = done || meta.NumPending == 0
		}
		if err := b.Error(); err != nil {
			return nil, fmt.Errorf("relay: sweep: scanning stream %s: %w", r.cfg.Stream, err)
		}
		if done {
			break
		}
		if n == 0 {
			return nil, fmt.Errorf("relay: sweep: scanning stream %s: no message within %v, %d of %d read", r.cfg.Stream, r.cfg.ProofTimeout, read, pending)
		}
		read += n
	}
	return found, nil
}
