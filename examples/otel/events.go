package main

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/sqlinbox/inbox/worker"
)

// Events returns a worker.Config.OnEvent that records the loops' events on
// meter and tracer: the counters inbox.worker.started, inbox.worker.ended
// (by outcome: acked, retried, dead, released, settled, or lost when the
// loop's settlement failed) and inbox.worker.errors (the loops' own), the
// up-down counter inbox.worker.in_flight, the histogram
// inbox.worker.handler.duration in seconds, each with the queue as
// attribute; and a span per handler run, "process <queue>", of the
// handler's duration, with the job's id, attempt and outcome, and status
// Error when the handler or the settlement failed. The spans are recorded
// when the job ends, so a handler's own spans are not their children: start
// those from the handler's ctx.
func Events(meter metric.Meter, tracer trace.Tracer) (func(worker.Event), error) {
	started, err := meter.Int64Counter("inbox.worker.started", metric.WithUnit("{job}"),
		metric.WithDescription("Handlers the worker loops started."))
	if err != nil {
		return nil, err
	}
	ended, err := meter.Int64Counter("inbox.worker.ended", metric.WithUnit("{job}"),
		metric.WithDescription("Jobs whose handler returned, by what the loop did."))
	if err != nil {
		return nil, err
	}
	errs, err := meter.Int64Counter("inbox.worker.errors", metric.WithUnit("{error}"),
		metric.WithDescription("Errors the worker loops met and went on after."))
	if err != nil {
		return nil, err
	}
	inFlight, err := meter.Int64UpDownCounter("inbox.worker.in_flight", metric.WithUnit("{job}"),
		metric.WithDescription("Handlers running."))
	if err != nil {
		return nil, err
	}
	took, err := meter.Float64Histogram("inbox.worker.handler.duration", metric.WithUnit("s"),
		metric.WithDescription("How long the handlers of the ended jobs ran."))
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	return func(e worker.Event) {
		queue := metric.WithAttributes(attribute.String("queue", e.Queue))
		switch e.Kind {
		case worker.EventStart:
			started.Add(ctx, 1, queue)
			inFlight.Add(ctx, 1, queue)
		case worker.EventEnd:
			o := outcome(e)
			ended.Add(ctx, 1, metric.WithAttributes(attribute.String("queue", e.Queue), attribute.String("outcome", o)))
			inFlight.Add(ctx, -1, queue)
			took.Record(ctx, e.Duration.Seconds(), queue)
			span(tracer, e, o)
		case worker.EventError:
			errs.Add(ctx, 1, queue)
		}
	}, nil
}

// outcome is e's outcome attribute: lost when the settlement failed.
func outcome(e worker.Event) string {
	if e.SettleErr != nil {
		return "lost"
	}
	return e.Outcome.String()
}

// span records the span of e's handler run, which ended now.
func span(tracer trace.Tracer, e worker.Event, outcome string) {
	end := time.Now()
	_, s := tracer.Start(context.Background(), "process "+e.Queue,
		trace.WithSpanKind(trace.SpanKindConsumer), trace.WithTimestamp(end.Add(-e.Duration)),
		trace.WithAttributes(
			attribute.String("messaging.system", "inbox"),
			attribute.String("messaging.destination.name", e.Queue),
			attribute.String("messaging.message.id", fmt.Sprint(e.ID)),
			attribute.Int("inbox.attempt", e.Attempt),
			attribute.String("inbox.outcome", outcome),
		))
	switch {
	case e.SettleErr != nil:
		s.RecordError(e.SettleErr)
		s.SetStatus(codes.Error, "settlement: "+e.SettleErr.Error())
	case e.Err != nil:
		s.RecordError(e.Err)
		s.SetStatus(codes.Error, e.Err.Error())
	}
	s.End(trace.WithTimestamp(end))
}
