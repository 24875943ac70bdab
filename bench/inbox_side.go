package main

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"time"

	"github.com/sqlinbox/inbox"
)

// The batcher's configuration on the inbox side: by default MaxBatch is the
// line's batch and Flushers the package's default.
var batchFlushers, batchMax int

// side is one way of doing the work of a cell: through inbox, or by
// hand-written SQL. round claims up to the cell's batch of jobs, runs the
// no-op handler on each and acknowledges them, and returns how many it
// acknowledged. Rounds run from several workers at once.
type side interface {
	round(ctx context.Context) (int, error)
	close()
}

// table describes a bench table in one form.
func benchTable(name, form string) inbox.Table {
	t := inbox.Table{Name: name}
	switch form {
	case "lease":
		t.LockedUntil = "locked_until"
	case "lease-shallow":
		t.LockedUntil, t.Shallow = "locked_until", true
	case "advisory":
		t.AdvisoryKey = "id"
	}
	return t
}

// inboxSide claims with Queue.Claim(batch) and acknowledges the jobs:
//   - lease with a batch over one: the jobs of a claim, handled in turn,
//     with one Batcher.AckAll, through a Batcher shared by the line's
//     workers;
//   - "lease-async": each job handled in a goroutine of its own that calls
//     Batcher.Ack, as handlers running side by side would, so that
//     acknowledgements of all workers share statements (MaxBatch 16 even
//     with a batch of one);
//   - otherwise one plain Delivery.Ack per job.
type inboxSide struct {
	q     *inbox.Queue
	b     *inbox.Batcher
	async bool
	batch int
}

// sideConfig is the Config of inbox's side in a line that measures it
// beside another queue: prepared as -prepare says, bounded by
// -claims-at-once.
func sideConfig(e engine, t inbox.Table) inbox.Config {
	return inbox.Config{Dialect: e.dialect, Table: t, Prepare: prepareFor(e), ClaimsAtOnce: claimsAtOnce}
}

func newInboxSide(e engine, db *sql.DB, table, form string, batch int) (*inboxSide, error) {
	async := form == "lease-async"
	if async {
		form = "lease"
	}
	q, err := inbox.New(db, sideConfig(e, benchTable(table, form)))
	if form == "lease-shallow" {
		form = "lease"
	}
	if err != nil {
		return nil, err
	}
	s := &inboxSide{q: q, batch: batch, async: async}
	if form == "lease" && (batch > 1 || async) {
		cfg := inbox.BatchConfig{MaxBatch: max(batch, 16), Flushers: batchFlushers}
		if batchMax > 0 {
			cfg.MaxBatch = batchMax
		}
		if s.b, err = q.NewBatcher(cfg); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// handle is the no-op handler: it reads the payload, as any handler would.
func handle(d *inbox.Delivery) error {
	var p []byte
	return d.Scan(&p)
}

func (s *inboxSide) round(ctx context.Context) (int, error) {
	ds, err := s.q.Claim(ctx, s.batch)
	if err != nil {
		return 0, err
	}
	switch {
	case s.b == nil:
		for i, d := range ds {
			if err := handle(d); err != nil {
				return i, err
			}
			if err := d.Ack(ctx); err != nil {
				return i, fmt.Errorf("ack %v: %w", d.ID(), err)
			}
		}
		return len(ds), nil
	case !s.async:
		for _, d := range ds {
			if err := handle(d); err != nil {
				return 0, err
			}
		}
		for i, err := range s.b.AckAll(ctx, ds) {
			if err != nil {
				return 0, fmt.Errorf("ack %v: %w", ds[i].ID(), err)
			}
		}
		return len(ds), nil
	}
	errs := make(chan error, len(ds))
	var wg sync.WaitGroup
	for _, d := range ds {
		wg.Add(1)
		go func(d *inbox.Delivery) {
			defer wg.Done()
			if err := handle(d); err != nil {
				errs <- err
				return
			}
			if err := s.b.Ack(ctx, d); err != nil {
				errs <- fmt.Errorf("batched ack %v: %w", d.ID(), err)
			}
		}(d)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return 0, err
	}
	return len(ds), nil
}

func (s *inboxSide) close() {
	if s.b != nil {
		s.b.Close()
	}
	// Jobs a stopped worker still held go back, as they would at exit.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = s.q.Shutdown(ctx)
}
