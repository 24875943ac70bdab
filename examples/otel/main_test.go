package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/worker"
)

// TestRegister (issue 23): a collection observes the queue's counts by
// state and the age of the oldest ready job, with the queue and the state
// as attributes.
func TestRegister(t *testing.T) {
	db, q, err := open(filepath.Join(t.TempDir(), "jobs.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	for i := 0; i < 4; i++ {
		if _, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte("x")}}); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := q.Claim(ctx, 2)
	if err != nil || len(ds) != 2 {
		t.Fatalf("claim: %d, %v", len(ds), err)
	}
	if err := ds[0].Dead(ctx); err != nil {
		t.Fatal(err)
	}
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer provider.Shutdown(ctx)
	reg, err := Register(provider.Meter("test"), "mail", q)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Unregister()
	got, floats := collect(t, reader)
	for k, want := range map[string]int64{
		"inbox.jobs/mail ready": 2, "inbox.jobs/mail waiting": 0, "inbox.jobs/mail in_work": 1, "inbox.jobs/mail dead": 1,
	} {
		if v, ok := got[k]; !ok || v != want {
			t.Errorf("%s = %d (observed: %v), want %d", k, v, ok, want)
		}
	}
	if age := floats["inbox.oldest_ready/mail"]; age < 0 || age > float64(time.Minute/time.Second) {
		t.Errorf("oldest ready %v s", age)
	}
}

// TestEvents (issue 22 item 6): the worker loops' events of three jobs, one
// acked, one retried then dead (MaxAttempts 2), and a loop error, recorded
// as counters by outcome, the in-flight count back to 0, a duration per
// handler run, and a span per run named for the queue with the job's id,
// attempt and outcome, its status Error where the handler failed.
func TestEvents(t *testing.T) {
	db, q, err := open(filepath.Join(t.TempDir(), "jobs.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ok, _ := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte("ok")}})
	bad, _ := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte("bad")}})

	reader := sdkmetric.NewManualReader()
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer meters.Shutdown(ctx)
	spans := tracetest.NewSpanRecorder()
	tracers := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tracers.Shutdown(ctx)
	onEvent, err := Events(meters.Meter("test"), tracers.Tracer("test"))
	if err != nil {
		t.Fatal(err)
	}
	returned := make(chan error, 1)
	go func() {
		cfg := worker.Config{Workers: 2, MaxAttempts: 2, Poll: 10 * time.Millisecond, Backoff: func(int) time.Duration { return 0 }, OnEvent: onEvent}
		returned <- worker.Run(ctx, q, cfg, func(ctx context.Context, d *inbox.Delivery) error {
			var p []byte
			if err := d.Scan(&p); err != nil || string(p) == "bad" {
				return errors.New("smtp: 554 rejected")
			}
			return nil
		})
	}()
	deadline := time.Now().Add(30 * time.Second)
	for len(spans.Ended()) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d spans after 30 s, want 3", len(spans.Ended()))
		}
		time.Sleep(5 * time.Millisecond) // polling the recorder, with a deadline
	}
	cancel()
	if err := <-returned; err != nil {
		t.Fatal(err)
	}
	onEvent(worker.Event{Kind: worker.EventError, Queue: "jobs", Err: errors.New("connection refused")})

	got, _ := collect(t, reader)
	for k, want := range map[string]int64{
		"inbox.worker.started/jobs": 3, "inbox.worker.ended/jobs acked": 1, "inbox.worker.ended/jobs retried": 1,
		"inbox.worker.ended/jobs dead": 1, "inbox.worker.in_flight/jobs": 0, "inbox.worker.errors/jobs": 1,
		"inbox.worker.handler.duration/jobs": 3,
	} {
		if v, ok := got[k]; !ok || v != want {
			t.Errorf("%s = %d (recorded: %v), want %d", k, v, ok, want)
		}
	}
	var lines []string
	for _, s := range spans.Ended() {
		a := map[attribute.Key]string{}
		for _, kv := range s.Attributes() {
			a[kv.Key] = kv.Value.Emit()
		}
		if s.EndTime().Before(s.StartTime()) {
			t.Errorf("span %s ends before it starts", s.Name())
		}
		lines = append(lines, fmt.Sprintf("%s id=%s attempt=%s outcome=%s status=%v %s", s.Name(), a["messaging.message.id"],
			a["inbox.attempt"], a["inbox.outcome"], s.Status().Code, s.Status().Description))
	}
	sort.Strings(lines)
	want := []string{
		fmt.Sprintf("process jobs id=%v attempt=1 outcome=acked status=%v ", ok, codes.Unset),
		fmt.Sprintf("process jobs id=%v attempt=1 outcome=retried status=%v smtp: 554 rejected", bad, codes.Error),
		fmt.Sprintf("process jobs id=%v attempt=2 outcome=dead status=%v smtp: 554 rejected", bad, codes.Error),
	}
	sort.Strings(want)
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("spans:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}

// collect reads reader once: the integer points and histogram counts by
// "name/queue state-or-outcome", and the float gauges.
func collect(t *testing.T, reader *sdkmetric.ManualReader) (map[string]int64, map[string]float64) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	ints, floats := map[string]int64{}, map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					ints[m.Name+"/"+label(p.Attributes)] = p.Value
				}
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					ints[m.Name+"/"+label(p.Attributes)] = p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					ints[m.Name+"/"+label(p.Attributes)] = int64(p.Count)
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					floats[m.Name+"/"+label(p.Attributes)] = p.Value
				}
			}
		}
	}
	return ints, floats
}

// label is a point's attributes as "queue state-or-outcome".
func label(s attribute.Set) string {
	out := ""
	for _, k := range []attribute.Key{"queue", "state", "outcome"} {
		if v, ok := s.Value(k); ok {
			if out != "" {
				out += " "
			}
			out += v.AsString()
		}
	}
	return out
}
