package worker

import (
	"context"
	"fmt"
	"sync"

	"github.com/sqlinbox/inbox"
)

// fits returns an error when q's pool cannot hold the jobs cfg's loops may
// have in work at once, each a connection under the row lock and advisory
// forms ([inbox.Queue.MaxInWork]): rather than claim fewer jobs than asked,
// without a word (eight loops on a pool of eight ran seven jobs at once),
// Run refuses to start.
func fits(q *inbox.Queue, cfg Config, batch int) error {
	limit := q.MaxInWork()
	need := max(cfg.Workers, 1) * batch
	if limit < 0 || need <= limit {
		return nil
	}
	return poolError{fmt.Sprintf("worker: run: table %s: %d loop(s) of Config.Batch %d may hold %d jobs in work, each with a connection under the %s form, "+
		"and the pool keeps one more for claims and enqueues: call db.SetMaxOpenConns(%d) or more (the pool allows %d), or lower Config.Workers or Config.Batch",
		q.Config().Table.Name, max(cfg.Workers, 1), batch, need, q.Form(), need+1, limit+1)}
}

// poolError is fits' error. It matches [inbox.ErrPoolTooSmall], whose text
// speaks of a pool of one.
type poolError struct{ msg string }

func (e poolError) Error() string { return e.msg }
func (e poolError) Unwrap() error { return inbox.ErrPoolTooSmall }

// runLoops runs cfg.Workers loops until ctx ends, or until one returns an
// error that cannot heal: the others then stop as at the end of ctx, and
// runLoops returns the first such error once every loop has returned.
func runLoops(ctx context.Context, q *inbox.Queue, cfg Config, handle Handler) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	loops := make([]*loop, cfg.Workers)
	for i := range loops {
		var err error
		if loops[i], err = newLoop(ctx, q, cfg, handle); err != nil {
			return err
		}
	}
	turns := claimTurns(loops[0].lease, cfg.Workers, loops[0].batch)
	for _, w := range loops {
		w.turns = turns
	}
	for _, w := range loops {
		wg.Add(1)
		go func(w *loop) {
			defer wg.Done()
			if err := w.run(ctx); err != nil {
				once.Do(func() { first = err })
				cancel()
			}
		}(w)
	}
	wg.Wait()
	return first
}
