package main

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sqlinbox/inbox"
)

// benchMain measures the relay on a table and a stream of its own:
// throughput draining a backlog, then end-to-end latency at a steady
// enqueue rate, from the moment a job's Enqueue starts to the moment a
// JetStream consumer in the same process receives its message.
func benchMain(args []string) error {
	var o options
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	o.flags(fs)
	jobs := fs.Int("jobs", 20000, "backlog relayed for the throughput figure")
	rate := fs.Int("rate", 1000, "jobs enqueued per second for the latency figure")
	dur := fs.Duration("duration", 10*time.Second, "how long the latency run enqueues")
	producers := fs.Int("producers", 4, "goroutines enqueueing in the latency run, each at rate/producers")
	size := fs.Int("payload", 128, "payload bytes (at least 16)")
	fs.Parse(args)
	if o.driver == "sqlite" && o.dsn == "" {
		dir, err := os.MkdirTemp("", "relay-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		o.dsn = sqliteDSN(filepath.Join(dir, "outbox.db"))
	}
	o.fill()
	if *size < 16 || *rate <= 0 || *producers <= 0 || *jobs <= 0 {
		return errors.New("bench: -payload at least 16, -rate, -producers and -jobs positive")
	}
	o.table = fmt.Sprintf("relay_bench_%d", os.Getpid())
	o.stream = fmt.Sprintf("RELAY_BENCH_%d", os.Getpid())
	o.cfg.Stream = o.stream

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute+*dur)
	defer cancel()
	db, q, src, err := openOutbox(ctx, o.driver, o.dsn, o.table, o.lease, true)
	if err != nil {
		return err
	}
	o.cfg.Source = src
	o.cfg.DB = db
	defer func() {
		for _, t := range []string{o.table, o.table + "_dead"} {
			db.Exec("DROP TABLE IF EXISTS " + t)
		}
		db.Close()
	}()
	nc, err := o.connect(ctx)
	if err != nil {
		return err
	}
	defer nc.Close()
	s, err := createStream(ctx, nc, o.stream, 0)
	if err != nil {
		return err
	}
	defer func() {
		js, _ := jetstream.New(nc)
		js.DeleteStream(context.Background(), o.stream)
	}()
	fmt.Printf("relay bench: %s, batch %d, workers %d, poll %v, lease %v, payload %d B, %d cores\n",
		o.driver, o.cfg.Batch, o.cfg.Workers, o.cfg.Poll, o.lease, *size, runtime.NumCPU())
	subject := o.stream + ".job"

	// Throughput: a backlog enqueued beforehand, drained by one relay.
	payload := make([]byte, *size)
	for done := 0; done < *jobs; {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		for n := 0; n < 1000 && done < *jobs; n, done = n+1, done+1 {
			if _, err := q.Enqueue(ctx, tx, inbox.Job{Data: []any{subject, payload}}); err != nil {
				tx.Rollback()
				return err
			}
		}
		if err := tx.Commit(); err != nil {
			return err
		}
	}
	r, err := New(q, nc, o.cfg)
	if err != nil {
		return err
	}
	if err := r.Check(ctx); err != nil {
		return err
	}
	elapsed, err := runUntil(ctx, r, func() bool { return r.Stats().Acked >= uint64(*jobs) })
	if err != nil {
		return err
	}
	st := r.Stats()
	if err := verify(ctx, db, o.table, s, uint64(*jobs)); err != nil {
		return err
	}
	fmt.Printf("throughput: %d jobs relayed in %v: %.0f jobs/s (published %d, duplicates %d, lease lost %d)\n",
		*jobs, elapsed.Round(time.Millisecond), float64(*jobs)/elapsed.Seconds(), st.Published, st.Duplicates, st.LeaseLost)

	// Latency: producers enqueue at a steady rate while the relay runs and
	// a consumer receives; each payload carries the time its Enqueue
	// started, on the monotonic clock of this process.
	total := int(float64(*rate) * dur.Seconds())
	base := time.Now()
	var (
		mu   sync.Mutex
		lats = make([]time.Duration, 0, total)
		// Enqueue to the stream's timestamp of the message: the wall
		// clocks of this process and of the server, on one machine.
		stored = make([]time.Duration, 0, total)
		all    = make(chan struct{})
	)
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy})
	if err != nil {
		return err
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		got := time.Since(base)
		sent := time.Duration(binary.BigEndian.Uint64(m.Data()))
		wall := time.Unix(0, int64(binary.BigEndian.Uint64(m.Data()[8:])))
		var toStream time.Duration
		if meta, err := m.Metadata(); err == nil {
			toStream = meta.Timestamp.Sub(wall)
		}
		mu.Lock()
		defer mu.Unlock()
		lats = append(lats, got-sent)
		stored = append(stored, toStream)
		if len(lats) == total {
			close(all)
		}
	})
	if err != nil {
		return err
	}
	defer cc.Stop()
	r, err = New(q, nc, o.cfg)
	if err != nil {
		return err
	}
	rctx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- r.Run(rctx) }()
	enqStart := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, *producers)
	interval := time.Duration(float64(time.Second) * float64(*producers) / float64(*rate))
	for p := range *producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, *size)
			for i := p; i < total; i += *producers {
				if d := time.Until(enqStart.Add(time.Duration(i/(*producers))*interval + time.Duration(p)*interval/time.Duration(*producers))); d > 0 {
					time.Sleep(d)
				}
				binary.BigEndian.PutUint64(buf, uint64(time.Since(base)))
				binary.BigEndian.PutUint64(buf[8:], uint64(time.Now().UnixNano()))
				if _, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{subject, buf}}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	enqDur := time.Since(enqStart)
	close(errs)
	if err := <-errs; err != nil {
		stop()
		return err
	}
	select {
	case <-all:
	case <-time.After(time.Minute):
		stop()
		return fmt.Errorf("latency: %d of %d messages received a minute after the last enqueue", len(lats), total)
	}
	stop()
	if err := <-ran; err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	fmt.Printf("latency: %d jobs at %d/s (enqueued at %.0f/s by %d producers)\n",
		total, *rate, float64(total)/enqDur.Seconds(), *producers)
	fmt.Printf("  enqueue to consumer: %s\n", percentiles(lats))
	fmt.Printf("  enqueue to stream:   %s\n", percentiles(stored))
	st = r.Stats()
	fmt.Printf("  relay: published %d, duplicates %d, lease lost %d, retried %d\n", st.Published, st.Duplicates, st.LeaseLost, st.Retried)
	return nil
}

// percentiles sorts ds and returns its p50, p99 and maximum.
func percentiles(ds []time.Duration) string {
	slices.Sort(ds)
	p := func(f float64) time.Duration {
		return ds[min(len(ds)-1, int(f*float64(len(ds))))].Round(10 * time.Microsecond)
	}
	return fmt.Sprintf("p50 %v, p99 %v, max %v", p(0.50), p(0.99), p(1))
}

// runUntil runs r until done reports true, checked every millisecond, and
// returns how long that took.
func runUntil(ctx context.Context, r *Relay, done func() bool) (time.Duration, error) {
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	ran := make(chan error, 1)
	start := time.Now()
	go func() { ran <- r.Run(rctx) }()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !done() {
		select {
		case err := <-ran:
			return 0, fmt.Errorf("relay stopped early: %v", err)
		case <-tick.C:
		}
	}
	elapsed := time.Since(start)
	stop()
	return elapsed, <-ran
}

// verify checks that table is empty and the stream holds want messages.
func verify(ctx context.Context, db *sql.DB, table string, s jetstream.Stream, want uint64) error {
	var left int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+table).Scan(&left); err != nil {
		return err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return err
	}
	if left != 0 || info.State.Msgs != want {
		return fmt.Errorf("%d jobs left in the table, %d messages in the stream for %d jobs", left, info.State.Msgs, want)
	}
	return nil
}
