package main

// -run latency: how long a job enqueued on an idle queue waits for its
// handler to start, p50 and p99, by how the idle worker learns of it:
//
//   - wake: worker.Run in this process, the job enqueued through the
//     *sql.DB of the same process (Enqueue rings the loops' bell);
//   - notify-pgx, notify-pq (PostgreSQL): worker.Run in a second process
//     (this program, run again), woken by the listener of the same
//     driver (listen/pgxlisten, listen/pqlisten) on its own connection; this process enqueues with
//     Config.NotifyChannel set, the NOTIFY sent by the insert itself;
//   - poll: worker.Run with its default fallback interval (1 s) and no
//     wake-up (the jobs are enqueued in a transaction, without Wake, as by
//     another process on MySQL or SQLite);
//   - poll-100ms: the hand-written loop of the README, Claim(1) and a
//     100 ms sleep when nothing was claimable.
//
// One worker (one Work loop, or one hand loop) on a lease table, a no-op
// handler. Each latency is measured twice: from the call of Enqueue (before
// the INSERT) and from its return (the commit), to the first line of the
// handler; across processes both clocks are the host's wall clock. In the
// wake and notify modes the jobs come one at a time, each once the last one
// was handled and the loop had a moment to idle again; in the poll modes
// they arrive at random, independent of the poll, so that each waits for a
// random part of the interval. The wake modes record their pool's driver
// calls and print where the time from the commit went (latency_parts.go).

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/listen/pgxlisten"
	"github.com/sqlinbox/inbox/listen/pqlisten"
	"github.com/sqlinbox/inbox/worker"
)

// Flags of -run latency.
var (
	latencySamples     int
	latencyPollSamples int
	latencyModes       string
)

func init() {
	flag.IntVar(&latencySamples, "latency-samples", 200, "latency: jobs per line of the wake-up modes")
	flag.IntVar(&latencyPollSamples, "latency-poll-samples", 40, "latency: jobs per line of the 1 s fallback poll (2.5 times as many for the 100 ms loop)")
	flag.StringVar(&latencyModes, "latency-modes", strings.Join(latencyModeNames, ","), "latency: modes to run")
}

// latencyChildEnv names the role of this program when it runs as the
// worker process of the notify modes; latencyChildConfig carries its
// configuration.
const (
	latencyChildEnv    = "INBOX_BENCH_CHILD"
	latencyChildConfig = "INBOX_BENCH_CHILD_CONFIG"
)

// latencyModeNames are the modes, in the table's order.
var latencyModeNames = []string{"wake", "wake-loaded", "ping-loaded", "write-loaded", "wake-shallow", "wake-rowlock", "notify", "poll", "poll-100ms"}

// latencySample is one job's wait.
type latencySample struct {
	fromCall, fromCommit time.Duration
	commit, start        time.Time // the Enqueue's return and the handler's first line
}

// latencyRun is one line of the table.
type latencyRun struct {
	e       engine
	mode    string // as printed
	samples []latencySample
	calls   *callLog // the measured pool's driver calls, in the wake modes
}

func runLatency(ctx context.Context, out, log io.Writer, es []engine, dir string) error {
	modes := map[string]bool{}
	for _, m := range strings.Split(latencyModes, ",") {
		m = strings.TrimSpace(m)
		if !slices.Contains(latencyModeNames, m) {
			return fmt.Errorf("-latency-modes: %q is none of %v", m, latencyModeNames)
		}
		modes[m] = true
	}
	if _, err := headerOf(out, es, dir, nil); err != nil {
		return err
	}
	fmt.Fprintf(out, "Enqueue→handler-start latency on an idle lease queue (the row lock where a line says so), one worker, a no-op handler; %d samples per line (%d for the poll modes).\n\n", latencySamples, latencyPollSamples)
	fmt.Fprintln(out, "| engine | driver | how the worker learns of the job | samples | p50 from Enqueue call | p99 | p50 from commit | p99 |")
	fmt.Fprintln(out, "|---|---|---|---:|---:|---:|---:|---:|")
	var traced []latencyRun
	for _, e := range es {
		for _, mode := range latencyModeNames {
			if !modes[mode] || (mode == "notify" && e.family != "postgres") || (mode == "wake-rowlock" && e.family == "sqlite") {
				continue
			}
			r, err := latencyLine(ctx, e, mode, dir)
			if err != nil {
				return fmt.Errorf("%s %s: %w", e.name, mode, err)
			}
			from := func(call bool) []time.Duration {
				ds := make([]time.Duration, len(r.samples))
				for i, s := range r.samples {
					ds[i] = s.fromCommit
					if call {
						ds[i] = s.fromCall
					}
				}
				return ds
			}
			c, m := from(true), from(false)
			fmt.Fprintf(out, "| %s | %s | %s | %d | %s | %s | %s | %s |\n", e.family, e.label, r.mode, len(r.samples),
				ms(percentile(c, 50)), ms(percentile(c, 99)), ms(percentile(m, 50)), ms(percentile(m, 99)))
			fmt.Fprintf(log, "%s %s: %d samples, max %v from the call\n", e.name, r.mode, len(r.samples), slices.Max(c))
			if r.calls != nil && len(r.samples) > 0 {
				traced = append(traced, r)
			}
		}
	}
	writeWakeParts(out, traced)
	return nil
}

// latencyLine measures one mode on one engine, on a fresh table.
func latencyLine(ctx context.Context, e engine, mode, dir string) (latencyRun, error) {
	r := latencyRun{e: e, mode: mode}
	var db *sql.DB
	var err error
	if strings.HasPrefix(mode, "wake") {
		r.calls = &callLog{}
		db, err = r.calls.open(e, dir, 4)
	} else {
		db, err = e.open(dir, 4)
	}
	if err != nil {
		return r, err
	}
	defer db.Close()
	table := "bench_latency_" + e.name
	if err := e.createTable(ctx, db, table); err != nil {
		return r, err
	}
	defer e.drop(context.WithoutCancel(ctx), db, table)
	cfg := inbox.Config{Dialect: e.dialect, Table: benchTable(table, "lease"), Prepare: prepareFor(e)}
	switch mode {
	case "wake":
		r.mode = "wake-up in the process (Enqueue on the *sql.DB)"
		r.samples, err = latencyInProcess(ctx, db, cfg, true)
	case "wake-loaded":
		// The same, while another queue of the database runs flat out:
		// the server and the two cores busy with work that is not the
		// measured job's.
		var rate float64
		r.samples, rate, err = underLoad(ctx, e, dir, table+"_load", func() ([]latencySample, error) {
			return latencyInProcess(ctx, db, cfg, true)
		})
		r.mode = fmt.Sprintf("wake-up in the process, %d workers draining another table (%.0f jobs/s)", latencyLoadWorkers, rate)
	case "ping-loaded":
		// Not a job: one round trip under the same load, the floor of
		// a loaded wake-up, whose claim is at least one.
		var rate float64
		r.samples, rate, err = underLoad(ctx, e, dir, table+"_load", func() ([]latencySample, error) {
			return latencyPings(latencySamples, func() error {
				var one int
				return db.QueryRowContext(ctx, "SELECT 1").Scan(&one)
			})
		})
		r.mode = fmt.Sprintf("no job: one round trip (SELECT 1), %d workers draining another table (%.0f jobs/s)", latencyLoadWorkers, rate)
	case "write-loaded":
		// Not a wake-up: an Enqueue alone, one row written and committed,
		// as a claim writes and commits one, under the same load.
		q, qerr := inbox.New(db, cfg)
		if qerr != nil {
			return r, qerr
		}
		var rate float64
		r.samples, rate, err = underLoad(ctx, e, dir, table+"_load", func() ([]latencySample, error) {
			return latencyPings(latencySamples, func() error {
				_, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{payload}})
				return err
			})
		})
		r.mode = fmt.Sprintf("no job claimed: the Enqueue alone (a row written and committed), %d workers draining another table (%.0f jobs/s)", latencyLoadWorkers, rate)
	case "wake-shallow":
		// The lease on a shallow table: one read fewer in MariaDB's
		// claim transaction.
		r.mode = "wake-up in the process, shallow lease"
		cfg.Table = benchTable(table, "lease-shallow")
		r.samples, err = latencyInProcess(ctx, db, cfg, true)
	case "wake-rowlock":
		// The row lock's claim is a locking read in a transaction it
		// keeps open, with no commit before the handler starts.
		r.mode = "wake-up in the process, row lock"
		cfg.Table = benchTable(table, "rowlock")
		r.samples, err = latencyInProcess(ctx, db, cfg, true)
	case "notify":
		r.mode = "NOTIFY to another process, " + map[string]string{"pq": "lib/pq", "pgx": "pgx"}[e.name] + " listener"
		r.samples, err = latencyNotify(ctx, e, db, cfg, dir)
	case "poll":
		r.mode = fmt.Sprintf("fallback poll (%v), no wake-up", worker.DefaultPoll)
		r.samples, err = latencyInProcess(ctx, db, cfg, false)
	case "poll-100ms":
		r.mode = "hand-written loop polling every 100 ms"
		r.samples, err = latencyHandPoll(ctx, db, cfg)
	}
	return r, err
}

// latencyInProcess runs one Work loop in this process: with wake, the
// jobs come one at a time through the *sql.DB and the fallback interval is
// a minute; without, they arrive at random in transactions nobody is told
// of, and the default interval finds them.
func latencyInProcess(ctx context.Context, db *sql.DB, cfg inbox.Config, wake bool) ([]latencySample, error) {
	q, err := inbox.New(db, cfg)
	if err != nil {
		return nil, err
	}
	started := make(chan latencyStart, 64)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	poll := time.Minute
	if !wake {
		poll = 0 // the default
	}
	done := make(chan error, 1)
	go func() {
		done <- worker.Run(ctx, q, worker.Config{Poll: poll, NoDelay: true, RetryForever: true}, func(_ context.Context, d *inbox.Delivery) error {
			started <- latencyStart{id: d.ID(), at: time.Now()}
			return handle(d)
		})
	}()
	defer func() { cancel(); <-done }()
	if wake {
		return latencyOneByOne(ctx, latencySamples, started, func() (any, error) {
			return q.Enqueue(ctx, db, inbox.Job{Data: []any{payload}})
		})
	}
	return latencyRandomArrivals(ctx, latencyPollSamples, worker.DefaultPoll/4, started, func() (any, error) {
		return enqueueQuietly(ctx, q, db)
	})
}

// enqueueQuietly enqueues a job in a transaction and commits it without
// Queue.Wake: no loop of this process learns of it.
func enqueueQuietly(ctx context.Context, q *inbox.Queue, db *sql.DB) (any, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	id, err := q.Enqueue(ctx, tx, inbox.Job{Data: []any{payload}})
	if err != nil {
		return nil, err
	}
	return id, tx.Commit()
}

// latencyHandPoll runs the README's hand-written loop: Claim(1), and a
// 100 ms sleep when nothing was claimable.
func latencyHandPoll(ctx context.Context, db *sql.DB, cfg inbox.Config) ([]latencySample, error) {
	q, err := inbox.New(db, cfg)
	if err != nil {
		return nil, err
	}
	started := make(chan latencyStart, 64)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- func() error {
			for ctx.Err() == nil {
				ds, err := q.Claim(ctx, 1)
				if err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return err
				}
				if len(ds) == 0 {
					select {
					case <-ctx.Done():
					case <-time.After(100 * time.Millisecond):
					}
					continue
				}
				started <- latencyStart{id: ds[0].ID(), at: time.Now()}
				if err := handle(ds[0]); err != nil {
					return err
				}
				if err := ds[0].Ack(context.WithoutCancel(ctx)); err != nil {
					return err
				}
			}
			return nil
		}()
	}()
	defer func() { cancel(); <-done }()
	return latencyRandomArrivals(ctx, latencyPollSamples*5/2, 50*time.Millisecond, started, func() (any, error) {
		return q.Enqueue(ctx, db, inbox.Job{Data: []any{payload}})
	})
}

// latencyStart is a handler's start, as reported by the worker.
type latencyStart struct {
	id any
	at time.Time
}

// underLoad runs measure while latencyLoad's workers drain table, and
// returns its samples with the load's jobs/s.
func underLoad(ctx context.Context, e engine, dir, table string, measure func() ([]latencySample, error)) ([]latencySample, float64, error) {
	stop, err := latencyLoad(ctx, e, dir, table)
	if err != nil {
		return nil, 0, err
	}
	samples, err := measure()
	rate, serr := stop()
	if err == nil {
		err = serr
	}
	return samples, rate, err
}

// latencyPings times n calls of call, paced as latencyOneByOne paces its
// jobs; each sample's wait is the call's.
func latencyPings(n int, call func() error) ([]latencySample, error) {
	out := make([]latencySample, 0, n)
	for i := 0; i < n; i++ {
		time.Sleep(5*time.Millisecond + time.Duration(rand.Int63n(int64(10*time.Millisecond))))
		began := time.Now()
		if err := call(); err != nil {
			return nil, err
		}
		done := time.Now()
		out = append(out, latencySample{fromCall: done.Sub(began), fromCommit: done.Sub(began), commit: began, start: done})
	}
	return out, nil
}

// latencyOneByOne enqueues n jobs one at a time: each after the last one's
// handler started and a pause of 5 to 15 ms in which the loop, having
// acknowledged it and found nothing more, goes idle.
func latencyOneByOne(ctx context.Context, n int, started <-chan latencyStart, enqueue func() (any, error)) ([]latencySample, error) {
	out := make([]latencySample, 0, n)
	for i := 0; i < n; i++ {
		time.Sleep(5*time.Millisecond + time.Duration(rand.Int63n(int64(10*time.Millisecond))))
		call := time.Now()
		id, err := enqueue()
		if err != nil {
			return nil, err
		}
		commit := time.Now()
		s, err := latencyAwait(ctx, started, id)
		if err != nil {
			return nil, err
		}
		out = append(out, latencySample{fromCall: s.Sub(call), fromCommit: s.Sub(commit), commit: commit, start: s})
	}
	return out, nil
}

// latencyAwait waits for job id's handler to start.
func latencyAwait(ctx context.Context, started <-chan latencyStart, id any) (time.Time, error) {
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	for {
		select {
		case s := <-started:
			if fmt.Sprint(s.id) == fmt.Sprint(id) {
				return s.at, nil
			}
		case <-timeout.C:
			return time.Time{}, fmt.Errorf("job %v not handled within 30s", id)
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		}
	}
}

// latencyRandomArrivals enqueues n jobs at random intervals averaging
// mean, independent of the worker, then waits for every handler to start.
func latencyRandomArrivals(ctx context.Context, n int, mean time.Duration, started <-chan latencyStart, enqueue func() (any, error)) ([]latencySample, error) {
	type sent struct{ call, commit time.Time }
	var mu sync.Mutex
	sentAt := map[string]sent{}
	got := map[string]time.Time{}
	collect := func(s latencyStart) {
		mu.Lock()
		got[fmt.Sprint(s.id)] = s.at
		mu.Unlock()
	}
	for i := 0; i < n; i++ {
		wait := time.Duration(rand.Int63n(int64(2 * mean)))
		deadline := time.After(wait)
	pause:
		for {
			select {
			case s := <-started:
				collect(s)
			case <-deadline:
				break pause
			}
		}
		call := time.Now()
		id, err := enqueue()
		if err != nil {
			return nil, err
		}
		mu.Lock()
		sentAt[fmt.Sprint(id)] = sent{call, time.Now()}
		mu.Unlock()
	}
	timeout := time.After(time.Minute)
	for {
		mu.Lock()
		complete := len(got) >= len(sentAt)
		mu.Unlock()
		if complete {
			break
		}
		select {
		case s := <-started:
			collect(s)
		case <-timeout:
			return nil, fmt.Errorf("%d of %d jobs handled within a minute", len(got), len(sentAt))
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	out := make([]latencySample, 0, n)
	for id, s := range sentAt {
		at, ok := got[id]
		if !ok {
			return nil, fmt.Errorf("job %s never handled", id)
		}
		out = append(out, latencySample{fromCall: at.Sub(s.call), fromCommit: at.Sub(s.commit)})
	}
	return out, nil
}

// latencyChild is the worker process's configuration.
type latencyChild struct {
	Engine, Table, Channel string
}

func (c latencyChild) encode() string { return c.Engine + "," + c.Table + "," + c.Channel }

func decodeLatencyChild(s string) (latencyChild, error) {
	f := strings.Split(s, ",")
	if len(f) != 3 {
		return latencyChild{}, fmt.Errorf("%s=%q: want engine,table,channel", latencyChildConfig, s)
	}
	return latencyChild{f[0], f[1], f[2]}, nil
}

// latencyNotify starts this program again as the worker process, which
// listens with the listener of the engine's driver and prints each
// handler's start, and enqueues here, one job at a time.
func latencyNotify(ctx context.Context, e engine, db *sql.DB, cfg inbox.Config, dir string) ([]latencySample, error) {
	cfg.NotifyChannel = "inbox_bench_" + e.name
	q, err := inbox.New(db, cfg)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = append(os.Environ(),
		latencyChildEnv+"=latency-worker",
		latencyChildConfig+"="+latencyChild{e.name, cfg.Table.Name, cfg.NotifyChannel}.encode())
	cmd.Stderr = os.Stderr
	stdin, stdout, err := startPiped(cmd)
	if err != nil {
		return nil, err
	}
	defer func() {
		stdin.Close() // the worker stops when its standard input ends
		_ = cmd.Wait()
	}()
	started := make(chan latencyStart, 64)
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			if line == "ready" {
				close(ready)
				continue
			}
			id, ns, ok := strings.Cut(line, " ")
			n, err := strconv.ParseInt(ns, 10, 64)
			if !ok || err != nil {
				fmt.Fprintln(os.Stderr, "bench: worker process said:", line)
				continue
			}
			started <- latencyStart{id: id, at: time.Unix(0, n)}
		}
	}()
	select {
	case <-ready:
	case <-time.After(30 * time.Second):
		return nil, errors.New("the worker process was not ready within 30s")
	}
	time.Sleep(100 * time.Millisecond) // its loop's first claim
	return latencyOneByOne(ctx, latencySamples, started, func() (any, error) {
		return q.Enqueue(ctx, db, inbox.Job{Data: []any{payload}})
	})
}

// latencyChildMain is the worker process: one Work loop with a minute's
// fallback interval, woken by the listener of its engine's driver, until
// its standard input ends. It prints "ready" once the listener listens,
// then "<id> <unix nanoseconds>" as each handler starts.
func latencyChildMain() int {
	c, err := decodeLatencyChild(os.Getenv(latencyChildConfig))
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench worker:", err)
		return 2
	}
	e, err := engineNamed(c.Engine)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench worker:", err)
		return 2
	}
	db, err := e.open("", 4)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench worker:", err)
		return 1
	}
	defer db.Close()
	q, err := inbox.New(db, inbox.Config{Dialect: e.dialect, Table: benchTable(c.Table, "lease"), NotifyChannel: c.Channel})
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench worker:", err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	var l worker.Listener = pgxlisten.Listener{ConnString: e.dsn("")}
	if e.name == "pq" {
		l = pqlisten.Listener{DSN: e.dsn("")}
	}
	var mu sync.Mutex
	w := bufio.NewWriter(os.Stdout)
	say := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		w.WriteString(s + "\n")
		w.Flush()
	}
	var once sync.Once
	listened := make(chan error, 1)
	go func() {
		listened <- l.Listen(ctx, c.Channel, func() {
			q.Wake()
			once.Do(func() { say("ready") })
		})
	}()
	err = worker.Run(ctx, q, worker.Config{Poll: time.Minute, NoDelay: true, RetryForever: true}, func(_ context.Context, d *inbox.Delivery) error {
		at := time.Now()
		say(fmt.Sprintf("%v %d", d.ID(), at.UnixNano()))
		return handle(d)
	})
	if lerr := <-listened; err == nil {
		err = lerr
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench worker:", err)
		return 1
	}
	return 0
}

// percentile returns the p-th percentile of ds (nearest rank).
func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	k := (p*len(s) + 99) / 100
	return s[max(k-1, 0)]
}

// ms prints d in milliseconds.
func ms(d time.Duration) string {
	v := float64(d) / float64(time.Millisecond)
	switch {
	case v < 10:
		return strconv.FormatFloat(v, 'f', 2, 64) + " ms"
	case v < 100:
		return strconv.FormatFloat(v, 'f', 1, 64) + " ms"
	}
	return strconv.FormatFloat(v, 'f', 0, 64) + " ms"
}

// latencyLoadWorkers is how many workers keep the server busy in the
// wake-loaded mode.
const latencyLoadWorkers = 8

// latencyLoad starts latencyLoadWorkers loops draining a lease table of
// its own, which an enqueuer keeps stocked (batches of 100 whenever fewer
// than 1,000 wait), and returns the function that stops them, drops the
// table and tells the jobs/s they handled. Its pool is its own, as another
// service's would be.
func latencyLoad(ctx context.Context, e engine, dir, table string) (stop func() (float64, error), err error) {
	db, err := e.open(dir, latencyLoadWorkers+2)
	if err != nil {
		return nil, err
	}
	if err := e.createTable(ctx, db, table); err != nil {
		db.Close()
		return nil, err
	}
	q, err := inbox.New(db, inbox.Config{Dialect: e.dialect, Table: benchTable(table, "lease"), Lease: time.Minute, Prepare: prepareFor(e)})
	if err != nil {
		db.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	var handled atomic.Int64
	errs := make(chan error, 2)
	go func() {
		errs <- worker.Run(ctx, q, worker.Config{Workers: latencyLoadWorkers, Poll: 10 * time.Millisecond, RetryForever: true}, func(_ context.Context, d *inbox.Delivery) error {
			handled.Add(1)
			return handle(d)
		})
	}()
	go func() { errs <- keepStocked(ctx, q, db, &handled) }()
	began := time.Now()
	return func() (float64, error) {
		rate := float64(handled.Load()) / time.Since(began).Seconds()
		cancel()
		err1, err2 := <-errs, <-errs
		e.drop(context.WithoutCancel(ctx), db, table)
		db.Close()
		var out []error
		for _, err := range []error{err1, err2} {
			if !errors.Is(err, context.Canceled) {
				out = append(out, err) // the run's own end is no failure
			}
		}
		return rate, errors.Join(out...)
	}, nil
}

// keepStocked enqueues batches of 100 jobs into q whenever fewer than 1,000
// of those it enqueued are still waiting (handled counts the rest), until
// ctx ends.
func keepStocked(ctx context.Context, q *inbox.Queue, db *sql.DB, handled *atomic.Int64) error {
	jobs := make([]inbox.Job, 100)
	for i := range jobs {
		jobs[i] = inbox.Job{Data: []any{payload}}
	}
	var enqueued int64
	for ctx.Err() == nil {
		if enqueued-handled.Load() >= 1000 {
			time.Sleep(time.Millisecond) // the backlog is stocked: look again in a moment
			continue
		}
		if _, err := q.EnqueueMany(ctx, db, jobs); err != nil && ctx.Err() == nil {
			return err
		}
		enqueued += int64(len(jobs))
	}
	return nil // the run's end, however the statement it cut failed
}
