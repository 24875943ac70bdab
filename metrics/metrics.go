// Package metrics exposes queues to Prometheus: an http.Handler writing the
// text exposition format (version 0.0.4) by hand, with the standard library
// alone, and Counters that a worker loop feeds from its per-job events.
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
)

// Outcome is how a job's handling ended, as a worker loop settled it.
type Outcome int

// The outcomes a worker loop reports to [Counters.End].
const (
	Ack     Outcome = iota // done: the job was deleted
	Retry                  // failed: the job comes back later
	Dead                   // failed for good: moved to the dead table
	Release                // given back unspent (shutdown)
	Lost                   // the settlement failed: the job comes back as its form says
	nOutcomes
)

var outcomeNames = [nOutcomes]string{"ack", "retry", "dead", "release", "lost"}

// String is the outcome's label value: ack, retry, dead, release or lost.
func (o Outcome) String() string {
	if o < 0 || o >= nOutcomes {
		return "outcome(" + strconv.Itoa(int(o)) + ")"
	}
	return outcomeNames[o]
}

// Counters count one queue's jobs as the worker loops of a process handle
// them: Start when a handler starts, End when its job is settled. The zero
// value is ready; a Counters is safe for concurrent use, and costs two
// atomic additions per event. Feeding it from a loop's events takes a few
// lines:
//
//	OnStart: func(*inbox.Delivery) { c.Start() },
//	OnEnd:   func(d *inbox.Delivery, o Outcome, took time.Duration) { c.End(o, took) },
type Counters struct {
	started  atomic.Uint64
	ended    [nOutcomes]atomic.Uint64
	inFlight atomic.Int64
	nanos    atomic.Uint64 // handling time of the ended jobs
}

// Start counts a handler that started.
func (c *Counters) Start() {
	c.started.Add(1)
	c.inFlight.Add(1)
}

// End counts a job whose handling ended with o after took; an outcome
// outside the package's constants is counted as Lost.
func (c *Counters) End(o Outcome, took time.Duration) {
	if o < 0 || o >= nOutcomes {
		o = Lost
	}
	c.ended[o].Add(1)
	c.inFlight.Add(-1)
	if took > 0 {
		c.nanos.Add(uint64(took))
	}
}

// Snapshot is a reading of [Counters].
type Snapshot struct {
	Started  uint64            // handlers started
	Ended    [nOutcomes]uint64 // jobs ended, by Outcome
	InFlight int64             // handlers started and not ended
	Handling time.Duration     // total handling time of the ended jobs
}

// Snapshot reads the counters; each figure is exact, the set is not read
// at one instant.
func (c *Counters) Snapshot() Snapshot {
	s := Snapshot{Started: c.started.Load(), InFlight: c.inFlight.Load(), Handling: time.Duration(c.nanos.Load())}
	for i := range c.ended {
		s.Ended[i] = c.ended[i].Load()
	}
	return s
}

// Done is the number of jobs that left the queue through this process: acked
// or moved to the dead table. The dashboard's throughput reads it.
func (c *Counters) Done() uint64 {
	return c.ended[Ack].Load() + c.ended[Dead].Load()
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
	p.family("inbox_worker_started_total", "counter", "Handlers this process's worker loops started.")
	for _, q := range queues {
		if q.Counters != nil {
			p.sample("inbox_worker_started_total", q.Name, "", "", float64(q.Counters.started.Load()))
		}
	}
	p.family("inbox_worker_ended_total", "counter", "Jobs whose handling ended, by outcome (ack, retry, dead, release, lost: the settlement failed).")
	for _, q := range queues {
		if q.Counters != nil {
			s := q.Counters.Snapshot()
			for o, n := range s.Ended {
				p.sample("inbox_worker_ended_total", q.Name, "outcome", Outcome(o).String(), float64(n))
			}
		}
	}
	p.family("inbox_worker_in_flight", "gauge", "Handlers running in this process.")
	for _, q := range queues {
		if q.Counters != nil {
			p.sample("inbox_worker_in_flight", q.Name, "", "", float64(q.Counters.inFlight.Load()))
		}
	}
	p.family("inbox_worker_handling_seconds_total", "counter", "Total handling time of the jobs ended.")
	for _, q := range queues {
		if q.Counters != nil {
			p.sample("inbox_worker_handling_seconds_total", q.Name, "", "", time.Duration(q.Counters.nanos.Load()).Seconds())
		}
	}
	return p.err
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
