package periodic

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/sqlinbox/inbox"
)

// read returns the last ticks of the entries named, by name, in one
// statement per maxBatch names; an entry without a row is absent.
func (s *Scheduler) read(ctx context.Context, names []string) (map[string]time.Time, error) {
	out := make(map[string]time.Time, len(names))
	for len(names) > 0 {
		chunk := names[:min(len(names), maxBatch)]
		names = names[len(chunk):]
		args := make([]any, len(chunk))
		for i, n := range chunk {
			args[i] = n
		}
		if err := s.readChunk(ctx, chunk, args, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (s *Scheduler) readChunk(ctx context.Context, chunk []string, args []any, out map[string]time.Time) error {
	rows, err := s.db.QueryContext(ctx, s.sql.read(len(chunk)), args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var raw any
		if err := rows.Scan(&name, &raw); err != nil {
			return err
		}
		t, err := s.scan(raw)
		if err != nil {
			return fmt.Errorf("entry %q: last_tick: %w", name, err)
		}
		out[name] = t.UTC()
	}
	return rows.Err()
}

// register inserts a row for each entry named that has none, with last tick
// at, in name order: two processes registering the same entries lock their
// rows in one order.
func (s *Scheduler) register(ctx context.Context, names []string, at time.Time) error {
	names = append([]string(nil), names...)
	sort.Strings(names)
	for len(names) > 0 {
		chunk := names[:min(len(names), maxBatch)]
		names = names[len(chunk):]
		args := make([]any, 0, 2*len(chunk))
		for _, n := range chunk {
			args = append(args, n, s.timeArg(at))
		}
		if _, err := s.db.ExecContext(ctx, s.sql.register(len(chunk)), args...); err != nil {
			return err
		}
	}
	return nil
}

// movedError is advance's error when a row no longer held the last tick
// read: another process moved it first. Nothing was written.
type movedError struct{ affected, want int64 }

func (e *movedError) Error() string {
	return fmt.Sprintf("%d of %d rows moved by another process first", e.want-e.affected, e.want)
}

// advance moves each plan's row from its from to its to, by compare-and-set,
// and enqueues the plans' jobs, in one transaction, committed only when
// every row moved (else a *movedError). The plans are in name order, which
// is the order their rows are locked in.
func (s *Scheduler) advance(ctx context.Context, plans []plan) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // after Commit, a no-op
	var affected int64
	for rest := plans; len(rest) > 0; {
		chunk := rest[:min(len(rest), maxBatch)]
		rest = rest[len(chunk):]
		res, err := tx.ExecContext(ctx, s.sql.advance(len(chunk)), s.advanceArgs(chunk)...)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		affected += n
	}
	if affected != int64(len(plans)) {
		return &movedError{affected: affected, want: int64(len(plans))}
	}
	all := plans[0].jobs
	if len(plans) > 1 {
		all = nil
		for _, p := range plans {
			all = append(all, p.jobs...)
		}
	}
	// A job whose unique key is held was skipped, the others inserted: the
	// holder stands for its tick, which is done. Sent again, it would
	// fail again as long as the key is held, for ever when two ticks'
	// jobs of one backfill share the key.
	if _, err := s.q.EnqueueMany(ctx, tx, all); err != nil && !errors.As(err, new(*inbox.DuplicateError)) {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	s.q.Wake()
	return nil
}

// advanceArgs are the arguments of statements.advance for plans.
func (s *Scheduler) advanceArgs(plans []plan) []any {
	name := func(p plan) string { return s.entries[p.i].Name }
	if len(plans) == 1 {
		p := plans[0]
		return []any{s.timeArg(p.to), name(p), s.timeArg(p.from)}
	}
	args := make([]any, 0, 5*len(plans))
	for _, p := range plans {
		args = append(args, name(p), s.timeArg(p.to))
	}
	for _, p := range plans {
		args = append(args, name(p))
	}
	for _, p := range plans {
		args = append(args, name(p), s.timeArg(p.from))
	}
	return args
}
