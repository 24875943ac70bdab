package main

// -run idle: what idle workers cost the database. For each engine, on a
// table of its own with nothing to do, and all at once for the measuring
// window: 1 and 16 worker.Run loops with their default fallback interval
// (1 s) and wake-ups on, against 16 hand-written loops that claim and sleep
// 100 ms when they found nothing (the README's loop). Each configuration has
// its pool, wrapped by a driver that counts what reaches the real driver:
// statements (queries and execs, prepared or not), BEGIN, COMMIT and
// ROLLBACK, and prepares (go-sql-driver/mysql prepares each statement with
// arguments, then runs and closes it). A PostgreSQL listener would hold one
// more connection, outside the pool, idle but for a ping every 30 s.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/connhook"
	"github.com/sqlinbox/inbox/worker"
)

// Flags of -run idle.
var idleWindow time.Duration

func init() {
	flag.DurationVar(&idleWindow, "idle-window", 20*time.Second, "idle: measuring window")
}

// idleConfig is one configuration of idle workers.
type idleConfig struct {
	name  string
	loops int
	hand  bool
}

var idleConfigs = []idleConfig{
	{"Work ×1, wake-up on", 1, false},
	{"Work ×16, wake-up on", 16, false},
	{"16 hand-written loops polling every 100 ms", 16, true},
}

func runIdle(ctx context.Context, out, log io.Writer, es []engine, dir string) error {
	if _, err := headerOf(out, es, dir, nil); err != nil {
		return err
	}
	fmt.Fprintf(out, "Driver calls per second of idle workers on an empty lease table, counted over %v after a 2 s start; every engine and configuration at once, each on its own pool and table. Fallback interval: %v (the default).\n\n", idleWindow, worker.DefaultPoll)
	fmt.Fprintln(out, "| engine | driver | workers | statements/s | BEGIN+COMMIT+ROLLBACK/s | prepares/s | all calls/s |")
	fmt.Fprintln(out, "|---|---|---|---:|---:|---:|---:|")
	type cellResult struct {
		e   engine
		cfg idleConfig
		c   *callCounter
		err error
	}
	var results []*cellResult
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := make(chan struct{})
	stop := make(chan struct{})
	for _, e := range es {
		for k, cfg := range idleConfigs {
			r := &cellResult{e: e, cfg: cfg, c: &callCounter{}}
			results = append(results, r)
			table := fmt.Sprintf("bench_idle_%s_%d", e.name, k)
			// A SQLite file per driver: two SQLite libraries in one process
			// must not share a file (their POSIX locks would mix).
			edir := filepath.Join(dir, "idle-"+e.name)
			if err := os.MkdirAll(edir, 0o755); err != nil {
				return err
			}
			db, err := openCounted(e, edir, r.c, cfg.loops+2)
			if err != nil {
				return err
			}
			defer db.Close()
			if err := e.createTable(ctx, db, table); err != nil {
				return err
			}
			defer e.drop(context.WithoutCancel(ctx), db, table)
			q, err := inbox.New(db, inbox.Config{Dialect: e.dialect, Table: benchTable(table, "lease")})
			if err != nil {
				return err
			}
			wctx, wcancel := context.WithCancel(ctx)
			go func() { <-stop; wcancel() }()
			for range cfg.loops {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					var err error
					if cfg.hand {
						err = idleHandLoop(wctx, q)
					} else {
						err = worker.Run(wctx, q, worker.Config{NoDelay: true, RetryForever: true}, func(_ context.Context, d *inbox.Delivery) error { return handle(d) })
					}
					if err != nil && wctx.Err() == nil {
						r.err = err
					}
				}()
			}
		}
	}
	close(start)
	time.Sleep(2 * time.Second)
	for _, r := range results {
		r.c.reset()
	}
	began := time.Now()
	time.Sleep(idleWindow)
	elapsed := time.Since(began)
	snaps := make([]callCounts, len(results))
	for i, r := range results {
		snaps[i] = r.c.snapshot()
	}
	close(stop)
	wg.Wait()
	for i, r := range results {
		if r.err != nil {
			return fmt.Errorf("%s %s: %w", r.e.name, r.cfg.name, r.err)
		}
		s := snaps[i]
		per := func(n int64) string { return fmt.Sprintf("%.2f", float64(n)/elapsed.Seconds()) }
		fmt.Fprintf(out, "| %s | %s | %s | %s | %s | %s | %s |\n", r.e.family, r.e.label, r.cfg.name,
			per(s.statements), per(s.tx), per(s.prepares), per(s.statements+s.tx+s.prepares))
		fmt.Fprintf(log, "%s %s: %+v in %v\n", r.e.name, r.cfg.name, s, elapsed.Round(time.Millisecond))
	}
	return nil
}

// idleHandLoop is the README's loop: claim one, or sleep 100 ms.
func idleHandLoop(ctx context.Context, q *inbox.Queue) error {
	for {
		ds, err := q.Claim(ctx, 1)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		for _, d := range ds {
			if err := d.Ack(ctx); err != nil {
				return err
			}
		}
		if len(ds) == 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// callCounter counts the calls that reach a driver. It is safe for
// concurrent use.
type callCounter struct {
	statements, tx, prepares atomic.Int64
}

type callCounts struct{ statements, tx, prepares int64 }

func (c *callCounter) reset() {
	c.statements.Store(0)
	c.tx.Store(0)
	c.prepares.Store(0)
}

func (c *callCounter) snapshot() callCounts {
	return callCounts{c.statements.Load(), c.tx.Load(), c.prepares.Load()}
}

// openCounted opens e through a driver wrapper counting into c.
func openCounted(e engine, dir string, c *callCounter, maxConns int) (*sql.DB, error) {
	inner, err := connhook.Connector(e.driver, e.dsn(dir))
	if err != nil {
		return nil, err
	}
	return e.ready(sql.OpenDB(connhook.Wrap(inner, connhook.Hooks{Before: c.before, After: c.after})), maxConns)
}

// before counts the calls that reach the driver as they are sent: each run
// of a prepared statement, BEGIN, COMMIT and ROLLBACK, each prepare.
func (c *callCounter) before(_ context.Context, call connhook.Call) {
	switch call.Kind {
	case connhook.StmtQuery, connhook.StmtExec:
		c.statements.Add(1)
	case connhook.Begin, connhook.Commit, connhook.Rollback:
		c.tx.Add(1)
	case connhook.Prepare:
		c.prepares.Add(1)
	}
}

// after counts a statement that the driver took: one it answered with
// driver.ErrSkip is prepared by database/sql and counted as it runs.
func (c *callCounter) after(_ context.Context, call connhook.Call, err error, _ time.Duration) {
	if (call.Kind == connhook.Query || call.Kind == connhook.Exec) && !errors.Is(err, driver.ErrSkip) {
		c.statements.Add(1)
	}
}
