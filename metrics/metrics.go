// Package metrics exposes queues to Prometheus: an http.Handler writing the
// text exposition format (version 0.0.4) by hand, with the standard library
// alone, and Counters that worker loops feed with their events.
//
// A scrape reads each queue's [inbox.Queue.Stats] (one indexed statement,
// two where the server lists its row locks apart) in the scraper's request:
// nothing runs between scrapes.
package metrics

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/worker"
)

// outcomeLabels are the values of inbox_worker_ended_total's outcome label,
// indexed by [worker.Outcome] less one, then lost: a settlement that
// failed, whatever it meant to do.
var outcomeLabels = [...]string{"acked", "retried", "dead", "released", "settled", "snoozed", "dropped", "lost"}

const lost = len(outcomeLabels) - 1

// handlerBuckets are the upper bounds of inbox_worker_handler_seconds'
// buckets: from 5 ms to 5 minutes, for handlers that send mail as well as
// those that render reports.
var handlerBuckets = [...]time.Duration{
	5 * time.Millisecond, 10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2500 * time.Millisecond, 5 * time.Second, 10 * time.Second,
	30 * time.Second, time.Minute, 5 * time.Minute,
}

// Counters count one queue's jobs as the worker loops of a process handle
// them, fed by the loops' events: [Counters.Observe] is a
// [worker.Config.OnEvent]. The zero value is ready; a Counters is safe for
// concurrent use and costs a few atomic additions per event, no
// allocation.
type Counters struct {
	started  atomic.Uint64
	ended    [len(outcomeLabels)]atomic.Uint64
	inFlight atomic.Int64
	errors   atomic.Uint64
	// buckets count the handlers' durations by the first bound of
	// handlerBuckets they do not exceed, the last beyond them all; nanos
	// is their sum.
	buckets [len(handlerBuckets) + 1]atomic.Uint64
	nanos   atomic.Uint64
}

// Observe counts e: a start, an end by its outcome (lost when its
// settlement failed) and its handler's duration, or a loop's error. Give
// it the events of one queue's loops: worker.Config{OnEvent: c.Observe}.
func (c *Counters) Observe(e worker.Event) {
	switch e.Kind {
	case worker.EventStart:
		c.started.Add(1)
		c.inFlight.Add(1)
	case worker.EventEnd:
		o := lost
		if e.SettleErr == nil && e.Outcome >= 1 && int(e.Outcome) < lost+1 {
			o = int(e.Outcome) - 1
		}
		c.ended[o].Add(1)
		c.inFlight.Add(-1)
		c.buckets[bucket(e.Duration)].Add(1)
		c.nanos.Add(uint64(max(e.Duration, 0)))
	case worker.EventError:
		c.errors.Add(1)
	}
}

// bucket is the index of d's bucket.
func bucket(d time.Duration) int {
	for i, b := range handlerBuckets {
		if d <= b {
			return i
		}
	}
	return len(handlerBuckets)
}

// Snapshot is a reading of [Counters].
type Snapshot struct {
	Started  uint64            // handlers started
	Ended    map[string]uint64 // jobs ended, by outcome: acked, retried, dead, released, settled, snoozed, dropped, lost
	InFlight int64             // handlers started and not ended
	Errors   uint64            // the loops' errors (worker.EventError)
	// Buckets count the handlers by duration, within 5 ms, 10 ms, 25 ms,
	// 50 ms, 100 ms, 250 ms, 500 ms, 1 s, 2.5 s, 5 s, 10 s, 30 s, 1 min,
	// 5 min (and above the bound before), and beyond.
	Buckets  [len(handlerBuckets) + 1]uint64
	Handling time.Duration // total handling time of the ended jobs
}

// Snapshot reads the counters; each figure is exact, the set is not read
// at one instant.
func (c *Counters) Snapshot() Snapshot {
	s := Snapshot{Started: c.started.Load(), InFlight: c.inFlight.Load(), Errors: c.errors.Load(),
		Handling: time.Duration(c.nanos.Load()), Ended: make(map[string]uint64, len(outcomeLabels))}
	for i, l := range outcomeLabels {
		s.Ended[l] = c.ended[i].Load()
	}
	for i := range c.buckets {
		s.Buckets[i] = c.buckets[i].Load()
	}
	return s
}

// Done is the number of jobs that left the queue through this process:
// acked, moved to the dead table, or dropped (a permanent failure without a
// dead table). The dashboard's throughput reads it.
func (c *Counters) Done() uint64 {
	return c.ended[worker.OutcomeAcked-1].Load() + c.ended[worker.OutcomeDead-1].Load() + c.ended[worker.OutcomeDropped-1].Load()
}

// StatsReader reads a queue's state: *inbox.Queue is one.
type StatsReader interface {
	Stats(ctx context.Context) (inbox.Stats, error)
}

// Queue is one queue of the handler's page.
type Queue struct {
	// Name is the queue's label value (any text; escaped as the format
	// requires).
	Name string
	// Queue is read at every scrape; nil exports the counters alone.
	Queue StatsReader
	// Counters, when set, are exported as the worker counters.
	Counters *Counters
	// InWork, when set, is this process's count of jobs held
	// ([inbox.Queue.InWork]): the one figure of jobs in work where the
	// server cannot tell (the advisory form on PostgreSQL and MySQL).
	InWork func() int
}

// Handler returns the handler of the queues' metrics. Each scrape reads every
// queue's Stats under the request's context and Timeout; a queue whose read
// fails is exported with inbox_up 0 and without its counts, and the error is
// not the scrape's. A count the server cannot tell (Stats' -1) is left out,
// never exported as -1. Queue names must differ: Handler returns an error
// naming a repeated or empty one.
func Handler(timeout time.Duration, queues ...Queue) (http.Handler, error) {
	seen := map[string]bool{}
	for _, q := range queues {
		if q.Name == "" {
			return nil, fmt.Errorf("metrics: a queue without a name")
		}
		if seen[q.Name] {
			return nil, fmt.Errorf("metrics: queue %q named twice", q.Name)
		}
		seen[q.Name] = true
	}
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	return &handler{queues: append([]Queue(nil), queues...), timeout: timeout}, nil
}

type handler struct {
	queues  []Queue
	timeout time.Duration
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "metrics: GET only", http.StatusMethodNotAllowed)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.timeout)
	defer cancel()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	Write(ctx, w, h.queues...)
}

// Write writes the queues' metrics in the text exposition format: what the
// handler serves, for a caller that serves or pushes them its own way.
func Write(ctx context.Context, w io.Writer, queues ...Queue) error {
	stats := make([]*inbox.Stats, len(queues))
	for i, q := range queues {
		if q.Queue == nil {
			continue
		}
		if st, err := q.Queue.Stats(ctx); err == nil {
			stats[i] = &st
		}
	}
	p := &printer{w: w}
	p.family("inbox_up", "gauge", "1 when the last read of the queue's state succeeded, 0 when it failed.")
	for i, q := range queues {
		if q.Queue != nil {
			p.sample("inbox_up", q.Name, "", "", b2f(stats[i] != nil))
		}
	}
	p.family("inbox_jobs", "gauge", "Jobs in the queue table by state (ready, waiting, in_work) and in the dead table (dead); a state the server cannot count is left out.")
	for i, q := range queues {
		if st := stats[i]; st != nil {
			for _, s := range []struct {
				state string
				n     int64
			}{{"ready", st.Ready}, {"waiting", st.Waiting}, {"in_work", st.InWork}, {"dead", st.Dead}} {
				if s.n >= 0 {
					p.sample("inbox_jobs", q.Name, "state", s.state, float64(s.n))
				}
			}
		}
	}
	p.family("inbox_oldest_ready_seconds", "gauge", "Age of the oldest ready job (Table.EnqueuedAt); 0 when none is ready.")
	for i, q := range queues {
		if st := stats[i]; st != nil {
			p.sample("inbox_oldest_ready_seconds", q.Name, "", "", st.OldestReady.Seconds())
		}
	}
	p.family("inbox_process_in_work", "gauge", "Jobs this process holds (Queue.InWork).")
	for _, q := range queues {
		if q.InWork != nil {
			p.sample("inbox_process_in_work", q.Name, "", "", float64(q.InWork()))
		}
	}
	writeWorkers(p, queues)
	return p.err
}

// writeWorkers writes the worker counters of the queues that have them.
func writeWorkers(p *printer, queues []Queue) {
	snaps := make([]*Snapshot, len(queues))
	for i, q := range queues {
		if q.Counters != nil {
			s := q.Counters.Snapshot()
			snaps[i] = &s
		}
	}
	each := func(f func(name string, s *Snapshot)) {
		for i, q := range queues {
			if snaps[i] != nil {
				f(q.Name, snaps[i])
			}
		}
	}
	p.family("inbox_worker_started_total", "counter", "Handlers this process's worker loops started.")
	each(func(name string, s *Snapshot) {
		p.sample("inbox_worker_started_total", name, "", "", float64(s.Started))
	})
	p.family("inbox_worker_ended_total", "counter", "Jobs whose handling ended, by outcome (acked, retried, dead, released, settled by the handler, snoozed, dropped, lost: the settlement failed).")
	each(func(name string, s *Snapshot) {
		for _, o := range outcomeLabels {
			p.sample("inbox_worker_ended_total", name, "outcome", o, float64(s.Ended[o]))
		}
	})
	p.family("inbox_worker_in_flight", "gauge", "Handlers running in this process.")
	each(func(name string, s *Snapshot) { p.sample("inbox_worker_in_flight", name, "", "", float64(s.InFlight)) })
	p.family("inbox_worker_errors_total", "counter", "Errors the worker loops met and went on after (a claim or probe that failed).")
	each(func(name string, s *Snapshot) { p.sample("inbox_worker_errors_total", name, "", "", float64(s.Errors)) })
	p.family("inbox_worker_handler_seconds", "histogram", "How long the handlers of the ended jobs ran.")
	each(func(name string, s *Snapshot) {
		var n uint64
		for i, b := range handlerBuckets {
			n += s.Buckets[i]
			p.sample("inbox_worker_handler_seconds_bucket", name, "le", formatValue(b.Seconds()), float64(n))
		}
		n += s.Buckets[len(handlerBuckets)]
		p.sample("inbox_worker_handler_seconds_bucket", name, "le", "+Inf", float64(n))
		p.sample("inbox_worker_handler_seconds_sum", name, "", "", s.Handling.Seconds())
		p.sample("inbox_worker_handler_seconds_count", name, "", "", float64(n))
	})
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// printer writes the format, keeping the first write error.
type printer struct {
	w   io.Writer
	err error
}

func (p *printer) printf(format string, a ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, format, a...)
	}
}

func (p *printer) family(name, typ, help string) {
	p.printf("# HELP %s %s\n# TYPE %s %s\n", name, escapeHelp(help), name, typ)
}

func (p *printer) sample(name, queue, label, value string, v float64) {
	extra := ""
	if label != "" {
		extra = "," + label + "=\"" + escapeLabel(value) + "\""
	}
	p.printf("%s{queue=\"%s\"%s} %s\n", name, escapeLabel(queue), extra, formatValue(v))
}

// escapeLabel escapes a label value: backslash, double quote and line feed.
func escapeLabel(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s)
}

// escapeHelp escapes a HELP text: backslash and line feed.
func escapeHelp(s string) string {
	return strings.NewReplacer(`\`, `\\`, "\n", `\n`).Replace(s)
}

func formatValue(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
