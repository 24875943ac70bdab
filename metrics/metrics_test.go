package metrics

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/worker"
)

type fakeStats struct {
	st  inbox.Stats
	err error
}

func (f fakeStats) Stats(context.Context) (inbox.Stats, error) { return f.st, f.err }

// TestHandlerText (issue 23) pins the whole page: each queue's counts (a -1
// left out), its age, this process's jobs held and the worker counters fed
// by Observe (an end whose settlement failed counted lost, the handler
// durations in the histogram's buckets); a queue whose read fails is up 0
// without counts; label values are escaped.
func TestHandlerText(t *testing.T) {
	var c Counters
	for i := 0; i < 5; i++ {
		c.Observe(worker.Event{Kind: worker.EventStart, Queue: "mail", ID: int64(i), Attempt: 1})
	}
	c.Observe(worker.Event{Kind: worker.EventEnd, Outcome: worker.OutcomeAcked, Duration: 1500 * time.Millisecond})
	c.Observe(worker.Event{Kind: worker.EventEnd, Outcome: worker.OutcomeDead, Duration: 500 * time.Millisecond, Err: errors.New("no")})
	c.Observe(worker.Event{Kind: worker.EventEnd, Outcome: worker.OutcomeRetried, Duration: 3 * time.Millisecond, Err: errors.New("no")})
	c.Observe(worker.Event{Kind: worker.EventEnd, Outcome: worker.OutcomeAcked, Duration: 10 * time.Minute, SettleErr: inbox.ErrLeaseLost})
	c.Observe(worker.Event{Kind: worker.EventError, Err: errors.New("connection refused")})
	h, err := Handler(time.Second,
		Queue{Name: "mail", Queue: fakeStats{st: inbox.Stats{Ready: 7, Waiting: 2, InWork: -1, Dead: 1, OldestReady: 1500 * time.Millisecond}},
			Counters: &c, InWork: func() int { return 3 }},
		Queue{Name: "we\"ird\\q\nx", Queue: fakeStats{err: errors.New("down")}},
	)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if ct := rec.Header().Get("Content-Type"); ct != "text/plain; version=0.0.4; charset=utf-8" {
		t.Errorf("Content-Type %q", ct)
	}
	want := `# HELP inbox_up 1 when the last read of the queue's state succeeded, 0 when it failed.
# TYPE inbox_up gauge
inbox_up{queue="mail"} 1
inbox_up{queue="we\"ird\\q\nx"} 0
# HELP inbox_jobs Jobs in the queue table by state (ready, waiting, in_work) and in the dead table (dead); a state the server cannot count is left out.
# TYPE inbox_jobs gauge
inbox_jobs{queue="mail",state="ready"} 7
inbox_jobs{queue="mail",state="waiting"} 2
inbox_jobs{queue="mail",state="dead"} 1
# HELP inbox_oldest_ready_seconds Age of the oldest ready job (Table.EnqueuedAt); 0 when none is ready.
# TYPE inbox_oldest_ready_seconds gauge
inbox_oldest_ready_seconds{queue="mail"} 1.5
# HELP inbox_process_in_work Jobs this process holds (Queue.InWork).
# TYPE inbox_process_in_work gauge
inbox_process_in_work{queue="mail"} 3
# HELP inbox_worker_started_total Handlers this process's worker loops started.
# TYPE inbox_worker_started_total counter
inbox_worker_started_total{queue="mail"} 5
# HELP inbox_worker_ended_total Jobs whose handling ended, by outcome (acked, retried, dead, released, settled by the handler, snoozed, dropped, lost: the settlement failed).
# TYPE inbox_worker_ended_total counter
inbox_worker_ended_total{queue="mail",outcome="acked"} 1
inbox_worker_ended_total{queue="mail",outcome="retried"} 1
inbox_worker_ended_total{queue="mail",outcome="dead"} 1
inbox_worker_ended_total{queue="mail",outcome="released"} 0
inbox_worker_ended_total{queue="mail",outcome="settled"} 0
inbox_worker_ended_total{queue="mail",outcome="snoozed"} 0
inbox_worker_ended_total{queue="mail",outcome="dropped"} 0
inbox_worker_ended_total{queue="mail",outcome="lost"} 1
# HELP inbox_worker_in_flight Handlers running in this process.
# TYPE inbox_worker_in_flight gauge
inbox_worker_in_flight{queue="mail"} 1
# HELP inbox_worker_errors_total Errors the worker loops met and went on after (a claim or probe that failed).
# TYPE inbox_worker_errors_total counter
inbox_worker_errors_total{queue="mail"} 1
# HELP inbox_worker_handler_seconds How long the handlers of the ended jobs ran.
# TYPE inbox_worker_handler_seconds histogram
inbox_worker_handler_seconds_bucket{queue="mail",le="0.005"} 1
inbox_worker_handler_seconds_bucket{queue="mail",le="0.01"} 1
inbox_worker_handler_seconds_bucket{queue="mail",le="0.025"} 1
inbox_worker_handler_seconds_bucket{queue="mail",le="0.05"} 1
inbox_worker_handler_seconds_bucket{queue="mail",le="0.1"} 1
inbox_worker_handler_seconds_bucket{queue="mail",le="0.25"} 1
inbox_worker_handler_seconds_bucket{queue="mail",le="0.5"} 2
inbox_worker_handler_seconds_bucket{queue="mail",le="1"} 2
inbox_worker_handler_seconds_bucket{queue="mail",le="2.5"} 3
inbox_worker_handler_seconds_bucket{queue="mail",le="5"} 3
inbox_worker_handler_seconds_bucket{queue="mail",le="10"} 3
inbox_worker_handler_seconds_bucket{queue="mail",le="30"} 3
inbox_worker_handler_seconds_bucket{queue="mail",le="60"} 3
inbox_worker_handler_seconds_bucket{queue="mail",le="300"} 3
inbox_worker_handler_seconds_bucket{queue="mail",le="+Inf"} 4
inbox_worker_handler_seconds_sum{queue="mail"} 602.003
inbox_worker_handler_seconds_count{queue="mail"} 4
`
	if got := rec.Body.String(); got != want {
		t.Errorf("page:\n%s\nwant:\n%s", got, want)
	}
	if c.Done() != 2 {
		t.Errorf("Done = %d, want the ack and the dead (not the lost ack)", c.Done())
	}
}

// TestHandlerRefuses (issue 23): names that are empty or repeated are
// construction errors; a POST is refused.
func TestHandlerRefuses(t *testing.T) {
	if _, err := Handler(0, Queue{Name: ""}); err == nil || !strings.Contains(err.Error(), "without a name") {
		t.Errorf("empty name: %v", err)
	}
	if _, err := Handler(0, Queue{Name: "a"}, Queue{Name: "a"}); err == nil || !strings.Contains(err.Error(), `"a" named twice`) {
		t.Errorf("repeated name: %v", err)
	}
	h, _ := Handler(0, Queue{Name: "a"})
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, err := http.Post(srv.URL, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || !strings.Contains(string(body), "GET only") {
		t.Errorf("POST: %d %q", resp.StatusCode, body)
	}
}

// TestCountersConcurrent: events observed from many goroutines add up.
func TestCountersConcurrent(t *testing.T) {
	var c Counters
	done := make(chan struct{})
	for i := 0; i < 8; i++ {
		go func() {
			for j := 0; j < 1000; j++ {
				c.Observe(worker.Event{Kind: worker.EventStart})
				c.Observe(worker.Event{Kind: worker.EventEnd, Outcome: worker.OutcomeRetried, Duration: time.Microsecond})
			}
			done <- struct{}{}
		}()
	}
	for i := 0; i < 8; i++ {
		<-done
	}
	s := c.Snapshot()
	if s.Started != 8000 || s.Ended["retried"] != 8000 || s.InFlight != 0 || s.Handling != 8*time.Millisecond || s.Buckets[0] != 8000 {
		t.Errorf("snapshot %+v", s)
	}
}

// TestObserveNoAlloc: counting an event allocates nothing.
func TestObserveNoAlloc(t *testing.T) {
	var c Counters
	e := worker.Event{Kind: worker.EventEnd, Outcome: worker.OutcomeAcked, Duration: time.Second, ID: int64(1)}
	if n := testing.AllocsPerRun(100, func() { c.Observe(e) }); n != 0 {
		t.Errorf("%v allocations per Observe", n)
	}
}

// TestOutcomeLabels: the outcome labels are worker.Outcome's names, in its
// order, every outcome the worker package has included, then lost; an
// outcome added to package worker without a label fails here.
func TestOutcomeLabels(t *testing.T) {
	for i, l := range outcomeLabels[:lost] {
		if o := worker.Outcome(i + 1); o.String() != l {
			t.Errorf("label %d is %q, worker.Outcome(%d) is %q", i, l, i+1, o)
		}
	}
	if o := worker.Outcome(lost + 1); !strings.HasPrefix(o.String(), "outcome(") {
		t.Errorf("worker.Outcome(%d) is %q and has no label", lost+1, o)
	}
}

// TestDone: the jobs that left the queue, acked, dead or dropped; not those
// that come back, nor a settlement that failed.
func TestDone(t *testing.T) {
	var c Counters
	for _, o := range []worker.Outcome{worker.OutcomeAcked, worker.OutcomeDead, worker.OutcomeDropped,
		worker.OutcomeRetried, worker.OutcomeReleased, worker.OutcomeSnoozed, worker.OutcomeSettled} {
		c.Observe(worker.Event{Kind: worker.EventEnd, Outcome: o})
	}
	c.Observe(worker.Event{Kind: worker.EventEnd, Outcome: worker.OutcomeAcked, SettleErr: inbox.ErrLeaseLost})
	if n := c.Done(); n != 3 {
		t.Errorf("Done = %d, want 3", n)
	}
}
