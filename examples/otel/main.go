// Command otel exports a queue's state and its workers' counters through
// OpenTelemetry metrics: the same figures as package metrics' Prometheus
// page, as observable instruments whose callback reads Queue.Stats at each
// collection. It runs workers on an SQLite file, failing some jobs, and
// prints the metrics with the stdout exporter every -every.
//
//	cd examples/otel && go run . [-for 20s] [-every 5s]
//
// A module of its own (OpenTelemetry's modules stay out of the repository's
// test command): `cd examples/otel && go test ./...`.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/rand"
	"os"
	"path/filepath"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/stdout/stdoutmetric"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	_ "modernc.org/sqlite"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/metrics"
	"github.com/sqlinbox/inbox/worker"
)

// Register makes the instruments of queue name on meter: inbox.jobs by state
// (ready, waiting, in_work, dead; a count the server cannot tell is not
// observed), inbox.oldest_ready in seconds, and, from counters when given,
// inbox.worker.started, inbox.worker.ended by outcome and
// inbox.worker.in_flight. Their callback reads q.Stats once per collection;
// its error is the collection's (OpenTelemetry reports it and goes on).
// Unregister the returned registration to stop.
func Register(meter metric.Meter, name string, q *inbox.Queue, counters *metrics.Counters) (metric.Registration, error) {
	jobs, err := meter.Int64ObservableGauge("inbox.jobs", metric.WithUnit("{job}"),
		metric.WithDescription("Jobs in the queue table by state, and in the dead table."))
	if err != nil {
		return nil, err
	}
	age, err := meter.Float64ObservableGauge("inbox.oldest_ready", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest ready job; 0 when none is ready."))
	if err != nil {
		return nil, err
	}
	started, err := meter.Int64ObservableCounter("inbox.worker.started", metric.WithUnit("{job}"),
		metric.WithDescription("Handlers this process's worker loops started."))
	if err != nil {
		return nil, err
	}
	ended, err := meter.Int64ObservableCounter("inbox.worker.ended", metric.WithUnit("{job}"),
		metric.WithDescription("Jobs whose handling ended, by outcome."))
	if err != nil {
		return nil, err
	}
	inFlight, err := meter.Int64ObservableGauge("inbox.worker.in_flight", metric.WithUnit("{job}"),
		metric.WithDescription("Handlers running in this process."))
	if err != nil {
		return nil, err
	}
	queue := attribute.String("queue", name)
	return meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		if counters != nil {
			s := counters.Snapshot()
			o.ObserveInt64(started, int64(s.Started), metric.WithAttributes(queue))
			for i, n := range s.Ended {
				o.ObserveInt64(ended, int64(n), metric.WithAttributes(queue, attribute.String("outcome", metrics.Outcome(i).String())))
			}
			o.ObserveInt64(inFlight, s.InFlight, metric.WithAttributes(queue))
		}
		st, err := q.Stats(ctx)
		if err != nil {
			return err
		}
		for _, c := range []struct {
			state string
			n     int64
		}{{"ready", st.Ready}, {"waiting", st.Waiting}, {"in_work", st.InWork}, {"dead", st.Dead}} {
			if c.n >= 0 {
				o.ObserveInt64(jobs, c.n, metric.WithAttributes(queue, attribute.String("state", c.state)))
			}
		}
		o.ObserveFloat64(age, st.OldestReady.Seconds(), metric.WithAttributes(queue))
		return nil
	}, jobs, age, started, ended, inFlight)
}

// Schema is the lease form's table with the columns the figures need.
const Schema = `
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    attempt INTEGER NOT NULL DEFAULT 1,
    locked_until TEXT,
    payload BLOB NOT NULL,
    last_error TEXT,
    enqueued_at TEXT
);
CREATE TABLE IF NOT EXISTS jobs_dead (
    id INTEGER PRIMARY KEY,
    attempt INTEGER NOT NULL,
    payload BLOB NOT NULL,
    last_error TEXT,
    dead_at TEXT
);
CREATE INDEX IF NOT EXISTS jobs_claimable ON jobs (locked_until, id);
CREATE INDEX IF NOT EXISTS jobs_age ON jobs (locked_until, enqueued_at);
`

// Table describes Schema's tables.
var Table = inbox.Table{Name: "jobs", LockedUntil: "locked_until", DeadTable: "jobs_dead",
	LastError: "last_error", EnqueuedAt: "enqueued_at", DeadAt: "dead_at"}

// open opens (creating) the SQLite file path and its queue.
func open(path string) (*sql.DB, *inbox.Queue, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
	if err != nil {
		return nil, nil, err
	}
	if _, err := db.Exec(Schema); err != nil {
		db.Close()
		return nil, nil, err
	}
	q, err := inbox.New(db, inbox.Config{Dialect: inbox.SQLite, Table: Table})
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return db, q, nil
}

func main() {
	runFor := flag.Duration("for", 20*time.Second, "how long to run")
	every := flag.Duration("every", 5*time.Second, "export interval")
	flag.Parse()
	dir, err := os.MkdirTemp("", "inbox-otel")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, q, err := open(filepath.Join(dir, "jobs.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	exp, err := stdoutmetric.New(stdoutmetric.WithPrettyPrint())
	if err != nil {
		log.Fatal(err)
	}
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp, sdkmetric.WithInterval(*every))))
	defer provider.Shutdown(context.Background())
	var counters metrics.Counters
	if _, err := Register(provider.Meter("github.com/sqlinbox/inbox"), "jobs", q, &counters); err != nil {
		log.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), *runFor)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 0; ctx.Err() == nil; n++ {
			q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte(fmt.Sprintf("job %d", n))}})
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			worker.Run(ctx, q, worker.Config{MaxAttempts: 2, Backoff: func(int) time.Duration { return time.Second }},
				counted(&counters, 2, func(ctx context.Context, d *inbox.Delivery) error {
					if rand.Intn(3) == 0 {
						return errors.New("smtp: 451 greylisted")
					}
					return nil
				}))
		}()
	}
	wg.Wait()
}

// counted wraps handle so that counters see each job start and end, the
// outcome told from the handler's result and the attempt (a failure on the
// last of maxAttempts buries the job), as a worker loop's per-job events
// would report them.
func counted(c *metrics.Counters, maxAttempts int, handle worker.Handler) worker.Handler {
	return func(ctx context.Context, d *inbox.Delivery) error {
		c.Start()
		start := time.Now()
		err := handle(ctx, d)
		o := metrics.Ack
		switch {
		case err != nil && d.Attempt() >= maxAttempts:
			o = metrics.Dead
		case err != nil:
			o = metrics.Retry
		}
		c.End(o, time.Since(start))
		return err
	}
}
