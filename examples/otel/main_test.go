package main

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/metrics"
)

// TestRegister (issue 23): a collection observes the queue's counts by
// state, the age of the oldest ready job and the worker counters, with the
// queue and the state or outcome as attributes.
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
	var counters metrics.Counters
	h := counted(&counters, 1, func(context.Context, *inbox.Delivery) error { return errors.New("no") })
	if err := h(ctx, ds[0]); err == nil {
		t.Fatal("the handler did not fail")
	}
	if err := ds[0].Dead(ctx); err != nil {
		t.Fatal(err)
	}

	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer provider.Shutdown(ctx)
	reg, err := Register(provider.Meter("test"), "mail", q, &counters)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Unregister()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	var age float64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					got[m.Name+"/"+label(p.Attributes)] = p.Value
				}
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					got[m.Name+"/"+label(p.Attributes)] = p.Value
				}
			case metricdata.Gauge[float64]:
				age = d.DataPoints[0].Value
			}
		}
	}
	for k, want := range map[string]int64{
		"inbox.jobs/mail ready": 2, "inbox.jobs/mail waiting": 0, "inbox.jobs/mail in_work": 1, "inbox.jobs/mail dead": 1,
		"inbox.worker.started/mail": 1, "inbox.worker.ended/mail dead": 1, "inbox.worker.ended/mail ack": 0, "inbox.worker.in_flight/mail": 0,
	} {
		if v, ok := got[k]; !ok || v != want {
			t.Errorf("%s = %d (observed: %v), want %d", k, v, ok, want)
		}
	}
	if age < 0 || age > float64(time.Minute/time.Second) {
		t.Errorf("oldest ready %v s", age)
	}
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
