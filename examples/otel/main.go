// Command otel turns a queue's state and its worker loops' events into
// OpenTelemetry metrics and spans: Register observes what package metrics'
// Prometheus page shows of the queue (Queue.Stats at each collection), and
// Events is a worker.Config.OnEvent that counts the jobs started and ended
// by outcome, records their handlers' durations, and makes a span of each
// handler run. It runs workers on an SQLite file, failing some jobs, prints
// the metrics with the stdout exporter every -every and, with -spans, a
// line per span.
//
//	cd examples/otel && go run . [-for 20s] [-every 5s] [-spans]
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
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/stdout/stdoutmetric"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	_ "modernc.org/sqlite"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/worker"
)

// Register makes the instruments of queue name on meter: inbox.jobs by state
// (ready, waiting, in_work, dead; a count the server cannot tell is not
// observed) and inbox.oldest_ready in seconds. Their callback reads q.Stats
// once per collection; its error is the collection's (OpenTelemetry
// reports it and goes on). Unregister the returned registration to stop.
func Register(meter metric.Meter, name string, q *inbox.Queue) (metric.Registration, error) {
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
	queue := attribute.String("queue", name)
	return meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
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
	}, jobs, age)
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
	spans := flag.Bool("spans", false, "print a line per span")
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
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp, sdkmetric.WithInterval(*every))))
	defer meters.Shutdown(context.Background())
	var traceOpts []sdktrace.TracerProviderOption
	if *spans {
		traceOpts = append(traceOpts, sdktrace.WithSyncer(spanPrinter{}))
	}
	tracers := sdktrace.NewTracerProvider(traceOpts...)
	defer tracers.Shutdown(context.Background())
	meter := meters.Meter("github.com/sqlinbox/inbox")
	if _, err := Register(meter, "jobs", q); err != nil {
		log.Fatal(err)
	}
	onEvent, err := Events(meter, tracers.Tracer("github.com/sqlinbox/inbox"))
	if err != nil {
		log.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), *runFor)
	defer cancel()
	go produce(ctx, q, db)
	cfg := worker.Config{Workers: 3, MaxAttempts: 2, Backoff: func(int) time.Duration { return time.Second }, OnEvent: onEvent}
	err = worker.Run(ctx, q, cfg, func(ctx context.Context, d *inbox.Delivery) error {
		if rand.Intn(3) == 0 {
			return errors.New("smtp: 451 greylisted")
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

// produce enqueues a job every 50 ms until ctx ends.
func produce(ctx context.Context, q *inbox.Queue, db *sql.DB) {
	for n := 0; ctx.Err() == nil; n++ {
		q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte(fmt.Sprintf("job %d", n))}})
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// spanPrinter exports each span as a line on the standard error.
type spanPrinter struct{}

func (spanPrinter) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	for _, s := range spans {
		log.Printf("span %s %v %v %v", s.Name(), s.EndTime().Sub(s.StartTime()), s.Status().Code, s.Attributes())
	}
	return nil
}

func (spanPrinter) Shutdown(context.Context) error { return nil }
