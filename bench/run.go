package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// cell is one line of the table: a form on an engine with some workers and
// a batch size.
type cell struct {
	e       engine
	form    string
	workers int
	batch   int
}

func (c cell) String() string {
	return fmt.Sprintf("%s/%s/w%d/b%d", c.e.name, c.form, c.workers, c.batch)
}

// conns is the pool of a cell, the same for both sides: a connection per
// worker for the lease form (its statements hold none between them), plus
// two for the batcher and the pool's free one; a connection per job in work
// for the forms that hold one, capped so a cell stays within the server's
// connections shared with others (a claim then takes fewer jobs).
func (c cell) conns() int {
	if strings.HasPrefix(c.form, "lease") || c.e.family == "sqlite" {
		return c.workers + 2
	}
	return min(c.workers*c.batch+1, maxHeldConns)
}

// maxHeldConns caps the pool of the row lock and advisory cells.
const maxHeldConns = 40

// result is one side's measurement.
type result struct {
	jobs    int
	elapsed time.Duration
	err     error
	wal     int64     // PostgreSQL: bytes of WAL the server wrote while the side ran
	segs    []float64 // the rate of each interleaved segment
}

// median is the median of the segments' rates (the mean of the middle two
// of an even number), or the rate over all of them when there are none.
func (r result) median() float64 {
	if len(r.segs) == 0 {
		return r.rate()
	}
	rates := append([]float64(nil), r.segs...)
	sort.Float64s(rates)
	n := len(rates)
	if n%2 == 0 {
		return (rates[n/2-1] + rates[n/2]) / 2
	}
	return rates[n/2]
}

// walPerJob is the WAL written per job acknowledged, zero where unmeasured.
func (r result) walPerJob() float64 {
	if r.jobs == 0 {
		return 0
	}
	return float64(r.wal) / float64(r.jobs)
}

// walPosition reads the server's WAL insert position in bytes; zero off
// PostgreSQL. Everything the server writes counts, so the figure is only
// clean when nothing else writes to it meanwhile.
func walPosition(ctx context.Context, c cell, db *sql.DB) (int64, error) {
	if c.e.family != "postgres" {
		return 0, nil
	}
	var pos int64
	err := db.QueryRowContext(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint").Scan(&pos)
	return pos, err
}

func (r result) rate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.jobs) / r.elapsed.Seconds()
}

// measure runs workers rounds of s until the duration has passed (when
// positive) or total jobs were acknowledged. A round that finds nothing
// while jobs remain is repeated; after stall of that, the run fails: jobs
// are left that nothing can claim.
func measure(ctx context.Context, s side, workers, total int, duration, stall time.Duration) result {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var done atomic.Int64
	var first error
	var once sync.Once
	fail := func(err error) {
		once.Do(func() { first = err; cancel() })
	}
	start := time.Now()
	var deadline time.Time
	if duration > 0 {
		deadline = start.Add(duration)
	}
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var idleSince time.Time
			for ctx.Err() == nil {
				if !deadline.IsZero() && time.Now().After(deadline) || done.Load() >= int64(total) {
					return
				}
				n, err := s.round(ctx)
				done.Add(int64(n))
				if err != nil {
					if ctx.Err() == nil {
						fail(err)
					}
					return
				}
				if n > 0 {
					idleSince = time.Time{}
					continue
				}
				if done.Load() >= int64(total) {
					return
				}
				// Others hold what is left: look again shortly.
				if idleSince.IsZero() {
					idleSince = time.Now()
				} else if time.Since(idleSince) > stall {
					fail(fmt.Errorf("%d of %d jobs acknowledged and none claimable for %v", done.Load(), total, stall))
					return
				}
				time.Sleep(200 * time.Microsecond)
			}
		}()
	}
	wg.Wait()
	r := result{jobs: int(done.Load()), elapsed: time.Since(start), err: first}
	if r.err == nil && ctx.Err() != nil && !errors.Is(ctx.Err(), context.Canceled) {
		r.err = ctx.Err()
	}
	return r
}

// payload is every job's 128 bytes.
var payload = func() []byte {
	p := make([]byte, 128)
	for i := range p {
		p[i] = byte('a' + i%26)
	}
	return p
}()

// newSide returns one side of a cell on table.
func newSide(c cell, db *sql.DB, table string, hand bool) (side, error) {
	if hand {
		return newHandSide(c.e, db, table, c.form, c.batch)
	}
	return newInboxSide(c.e, db, table, c.form, c.batch)
}

// interleave measures the two sides of a cell, each on its table, in
// alternating segments (inbox, hand, hand, inbox, …), so that a change of
// load on the shared machine falls on both. A side's table is topped up
// before its segment whenever fewer than want jobs are left. total caps the jobs of each
// segment (the CI test's exact count); zero means none.
func interleave(ctx context.Context, c cell, db *sql.DB, tables [2]string, sides [2]side, segments int, seg time.Duration, want int, total int) ([2]result, error) {
	var out [2]result
	left := [2]int{want, want}
	for i := 0; i < segments; i++ {
		for k := 0; k < 2; k++ {
			which := k
			if i%2 == 1 {
				which = 1 - k
			}
			if left[which] < want {
				if err := c.e.fill(ctx, db, tables[which], want-left[which], payload); err != nil {
					return out, fmt.Errorf("fill: %w", err)
				}
				left[which] = want
			}
			limit := total
			if limit == 0 {
				limit = left[which]
			}
			before, err := walPosition(ctx, c, db)
			if err != nil {
				return out, err
			}
			r := measure(ctx, sides[which], c.workers, limit, seg, 10*time.Second)
			if r.err != nil {
				return out, fmt.Errorf("%s: %w", [2]string{"inbox", "hand-written"}[which], r.err)
			}
			after, err := walPosition(ctx, c, db)
			if err != nil {
				return out, err
			}
			left[which] -= r.jobs
			out[which].jobs += r.jobs
			out[which].elapsed += r.elapsed
			out[which].wal += after - before
			out[which].segs = append(out[which].segs, r.rate())
		}
	}
	return out, nil
}

// drain fills table with jobs pending and works through all of them with
// one side of cell c, reporting how many it acknowledged and how many rows
// are left: the check that the program's code does the work it measures.
func drain(ctx context.Context, c cell, db *sql.DB, table string, hand bool, jobs int) (done, left int, err error) {
	if err := c.e.empty(ctx, db, table); err != nil {
		return 0, 0, err
	}
	if err := c.e.fill(ctx, db, table, jobs, payload); err != nil {
		return 0, 0, err
	}
	s, err := newSide(c, db, table, hand)
	if err != nil {
		return 0, 0, err
	}
	r := measure(ctx, s, c.workers, jobs, 0, 10*time.Second)
	s.close()
	if r.err != nil {
		return r.jobs, 0, r.err
	}
	left, err = count(ctx, db, table)
	return r.jobs, left, err
}
