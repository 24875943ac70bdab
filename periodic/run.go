package periodic

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/sqlinbox/inbox"
)

const (
	// maxWait is the longest Run waits without reading the clock again, so
	// that a wall clock set forward is noticed within it: a timer measures
	// the time that passes, not what the clock says.
	maxWait = time.Minute
	// minBackoff and maxBackoff bound the wait before an entry whose
	// statement failed is tried again.
	minBackoff = 100 * time.Millisecond
	maxBackoff = time.Minute
)

// Run enqueues the ticks of the scheduler's entries as they come due, in the
// caller's goroutine, until ctx ends; then it returns nil. Run it in every
// process that should keep the entries going: each tick is enqueued once
// among all of them, by the first to reach it.
//
// Run starts by reading the state table and registering the entries missing
// from it, with the time as their last tick, so that a new entry's first
// tick is its next one. An error there is returned at once (a missing table,
// a database out of reach), as "periodic: start: …".
//
// Then it waits for the earliest next tick of its entries and, at each
// wake-up, reads the rows of the entries due (one statement), which tells
// it whether another process enqueued those ticks. For the ticks still to
// enqueue it builds the jobs (Entry.Job), and in one transaction moves each
// entry's row from the last tick it read to the latest tick due, by a
// compare-and-set, and enqueues the jobs with [inbox.Queue.EnqueueMany]:
// entries and jobs a thousand to a statement. Should another process have
// moved some of the rows first, or the transaction fail, each entry is tried
// in a transaction of its own, so that one entry's failing job holds up no
// other. After a commit it wakes the queue's loops in this process
// ([inbox.Queue.Wake]). Entry.Missed says which of the ticks due are
// enqueued when more than one is: a process that was down, a clock set
// forward. A tick whose job has a UniqueKey held by a job in the queue
// (an earlier tick's, not run yet) is done without a job of its own: the
// holder stands for it, and nothing is reported.
//
// A clock set back enqueues nothing until it reaches the ticks not yet
// done: a tick is done once an entry's row has moved past it. Errors met
// once started go to Config.OnError, and the entries concerned are tried
// again after a backoff.
func (s *Scheduler) Run(ctx context.Context) error {
	r := &runner{s: s, slots: make([]slot, len(s.entries))}
	if err := r.start(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("periodic: start: %w", err)
	}
	for ctx.Err() == nil {
		now := s.now()
		wake, ok := r.wake()
		if ok && !wake.After(now) {
			r.fire(ctx, now)
			continue
		}
		d := maxWait
		if ok && wake.Sub(now) < d {
			d = wake.Sub(now)
		}
		select {
		case <-ctx.Done():
		case <-s.after(d):
		}
	}
	return nil
}

// runner is the state of one Run.
type runner struct {
	s     *Scheduler
	slots []slot // by entry
}

// slot is what a Run knows of one entry.
type slot struct {
	// last is the entry's last tick as the table held it when read or
	// written by this Run.
	last time.Time
	// next is the schedule's tick after last; zero when there is none.
	next time.Time
	// retry, after an error, is when the entry may be tried again.
	retry   time.Time
	backoff time.Duration
	// lost is the last tick a compare-and-set of this Run expected and
	// did not find. Reading that same value back means the row did not
	// move, so that its value does not compare equal to itself in SQL (a
	// column of another type than CreateTableSQL's): an error, not a race.
	lost time.Time
	// stopped marks an entry whose schedule misbehaved.
	stopped bool
}

// start reads the entries' rows and registers those missing.
func (r *runner) start(ctx context.Context) error {
	all := make([]int, len(r.slots))
	for i := range all {
		all[i] = i
	}
	return r.load(ctx, all, r.s.now())
}

// load reads the rows of the entries idx, registering with the time now
// those that have none, and takes their last ticks.
func (r *runner) load(ctx context.Context, idx []int, now time.Time) error {
	lasts, err := r.s.read(ctx, r.names(idx))
	if err != nil {
		return err
	}
	var missing []int
	for _, i := range idx {
		if last, ok := lasts[r.s.entries[i].Name]; ok {
			r.take(i, last)
		} else {
			missing = append(missing, i)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if err := r.s.register(ctx, r.names(missing), now.UTC().Truncate(time.Microsecond)); err != nil {
		return err
	}
	// Another process may have registered an entry first, with its time.
	if lasts, err = r.s.read(ctx, r.names(missing)); err != nil {
		return err
	}
	for _, i := range missing {
		last, ok := lasts[r.s.entries[i].Name]
		if !ok {
			return fmt.Errorf("entry %q: no row in the table after registering it", r.s.entries[i].Name)
		}
		r.take(i, last)
	}
	return nil
}

// take records last as entry i's last tick and computes its next.
func (r *runner) take(i int, last time.Time) {
	sl := &r.slots[i]
	sl.last = last
	next, err := nextTick(r.s.entries[i].Schedule, last)
	if err != nil {
		sl.stopped = true
		r.report(fmt.Errorf("periodic: entry %q stopped: %w", r.s.entries[i].Name, err))
		return
	}
	sl.next = next
}

// wake returns when the earliest entry comes due; false when none will.
func (r *runner) wake() (time.Time, bool) {
	var first time.Time
	for _, sl := range r.slots {
		if sl.stopped || sl.next.IsZero() {
			continue
		}
		at := sl.next
		if sl.retry.After(at) {
			at = sl.retry
		}
		if first.IsZero() || at.Before(first) {
			first = at
		}
	}
	return first, !first.IsZero()
}

// plan is what one entry's transaction writes: its row from from to to, and
// the jobs of ticks.
type plan struct {
	i        int
	from, to time.Time
	ticks    []time.Time
	jobs     []inbox.Job
}

// fire enqueues the ticks due at now.
func (r *runner) fire(ctx context.Context, now time.Time) {
	due := r.due(now)
	lasts, err := r.s.read(ctx, r.names(due))
	if err != nil {
		r.fail(ctx, due, now, fmt.Errorf("periodic: read: %w", err))
		return
	}
	plans, missing := r.planDue(ctx, due, lasts, now)
	if len(missing) > 0 {
		if err := r.load(ctx, missing, now); err != nil {
			r.fail(ctx, missing, now, fmt.Errorf("periodic: register: %w", err))
		}
	}
	if len(plans) == 0 {
		return
	}
	sort.Slice(plans, func(a, b int) bool { return r.s.entries[plans[a].i].Name < r.s.entries[plans[b].i].Name })
	if len(plans) == 1 {
		r.advanceEach(ctx, plans, now, nil)
		return
	}
	err = r.s.advance(ctx, plans)
	var moved *movedError
	switch {
	case err == nil:
		for _, p := range plans {
			r.won(p)
		}
	case ctx.Err() != nil:
	case errors.As(err, &moved) && moved.affected == 0:
		// Another process enqueued them all: the next round reads their
		// rows.
		for _, p := range plans {
			r.slots[p.i].lost = p.from
		}
	case moved != nil:
		// Some rows moved under us: each entry on its own, so that one
		// holds up no other.
		r.advanceEach(ctx, plans, now, nil)
	default:
		r.advanceEach(ctx, plans, now, err)
	}
}

// due lists the entries due at now.
func (r *runner) due(now time.Time) []int {
	var due []int
	for i, sl := range r.slots {
		if !sl.stopped && !sl.next.IsZero() && !sl.next.After(now) && !sl.retry.After(now) {
			due = append(due, i)
		}
	}
	return due
}

// planDue turns the due entries and their rows' last ticks into what each
// transaction writes; missing are the entries whose row was deleted.
func (r *runner) planDue(ctx context.Context, due []int, lasts map[string]time.Time, now time.Time) (plans []plan, missing []int) {
	for _, i := range due {
		e, sl := &r.s.entries[i], &r.slots[i]
		last, ok := lasts[e.Name]
		if !ok {
			missing = append(missing, i) // the row was deleted
			continue
		}
		if !sl.lost.IsZero() && last.Equal(sl.lost) {
			sl.lost = time.Time{}
			r.fail(ctx, []int{i}, now, fmt.Errorf("periodic: entry %q: the compare-and-set of its row failed, yet the row still holds the last tick read, %s: is last_tick of the type CreateTableSQL gives?", e.Name, last.Format(time.RFC3339Nano)))
			continue
		}
		sl.lost = time.Time{}
		r.take(i, last)
		if sl.stopped || sl.next.IsZero() || sl.next.After(now) {
			continue // done by another process
		}
		ticks, err := dueTicks(e.Schedule, last, now, e.Missed.max())
		if err != nil {
			sl.stopped = true
			r.report(fmt.Errorf("periodic: entry %q stopped: %w", e.Name, err))
			continue
		}
		p := plan{i: i, from: last, to: ticks[len(ticks)-1], ticks: ticks, jobs: make([]inbox.Job, len(ticks))}
		for k, t := range ticks {
			p.jobs[k] = e.Job(t)
		}
		plans = append(plans, p)
	}
	return plans, missing
}

// advanceEach enqueues each plan in a transaction of its own; batchErr is
// why the plans failed together, if it was no moved row.
func (r *runner) advanceEach(ctx context.Context, plans []plan, now time.Time, batchErr error) {
	failed := false
	for _, p := range plans {
		err := r.s.advance(ctx, []plan{p})
		failed = failed || err != nil
		switch {
		case err == nil:
			r.won(p)
		case ctx.Err() != nil:
			return
		case errors.As(err, new(*movedError)):
			// Another process moved the row: the next round reads it.
			r.slots[p.i].lost = p.from
		default:
			e := &r.s.entries[p.i]
			r.fail(ctx, []int{p.i}, now, fmt.Errorf("periodic: entry %q, ticks %s to %s: %w", e.Name,
				p.ticks[0].Format(time.RFC3339Nano), p.to.Format(time.RFC3339Nano), err))
		}
	}
	if batchErr != nil && !failed && ctx.Err() == nil {
		// No entry explains why the batch failed, and each costs a
		// transaction of its own until it no longer does.
		r.report(fmt.Errorf("periodic: %d entries in one transaction: %w (each enqueued in a transaction of its own)", len(plans), batchErr))
	}
}

// won records that p committed.
func (r *runner) won(p plan) {
	sl := &r.slots[p.i]
	sl.retry, sl.backoff = time.Time{}, 0
	r.take(p.i, p.to)
}

// fail reports err, unless ctx ended, and puts the entries idx off for
// their backoff.
func (r *runner) fail(ctx context.Context, idx []int, now time.Time, err error) {
	if ctx.Err() != nil {
		return
	}
	r.report(err)
	for _, i := range idx {
		sl := &r.slots[i]
		sl.backoff = min(max(2*sl.backoff, minBackoff), maxBackoff)
		sl.retry = now.Add(sl.backoff)
	}
}

func (r *runner) report(err error) {
	if r.s.onError != nil {
		r.s.onError(err)
	}
}

func (r *runner) names(idx []int) []string {
	out := make([]string, len(idx))
	for k, i := range idx {
		out[k] = r.s.entries[i].Name
	}
	return out
}
