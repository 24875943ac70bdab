package worker

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/fakedb"
)

// TestEventsFake (issue 22 item 6): on the fake, every job whose handler
// starts has one start and one end, the end after the start, with the
// outcome of the handler's result (alone, an odd id fails and is retried
// after Backoff, an even one is acked; a batch's are acked together: the
// fake has no batched retry), the queue's
// name, its attempt and the handler's duration, under loops stopped while
// their handlers run.
func TestEventsFake(t *testing.T) {
	for _, batch := range []int{1, 3} {
		f := fakedb.NewLease()
		q := btQueue(t, f)
		ctx, cancel := context.WithCancel(context.Background())
		var (
			mu      sync.Mutex
			started = map[any]int{}
			ends    = map[any][]Event{}
			handled atomic.Int64
		)
		cfg := Config{Batch: batch, RetryForever: true, Backoff: func(int) time.Duration { return time.Hour },
			OnEvent: func(e Event) {
				mu.Lock()
				defer mu.Unlock()
				switch e.Kind {
				case EventStart:
					started[e.ID]++
				case EventEnd:
					if started[e.ID] != 1 {
						t.Errorf("job %v ended after %d starts", e.ID, started[e.ID])
					}
					ends[e.ID] = append(ends[e.ID], e)
				default:
					t.Errorf("event %+v", e)
				}
				if e.Queue != "jobs" || e.Attempt != 1 {
					t.Errorf("event %+v: want queue jobs, attempt 1", e)
				}
			}}
		err := Run(ctx, q, cfg, func(_ context.Context, d *inbox.Delivery) error {
			if handled.Add(1) == 30 {
				cancel()
			}
			if batch == 1 && d.ID().(int64)%2 == 1 {
				return errors.New("odd")
			}
			time.Sleep(time.Millisecond) // a handler that takes a moment: its duration is seen
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(started) < 30 || len(ends) != len(started) {
			t.Fatalf("batch %d: %d jobs started, %d ended, want the same, at least 30", batch, len(started), len(ends))
		}
		for id, es := range ends {
			e := es[0]
			want, wantErr, wantDelay := OutcomeAcked, "", time.Duration(0)
			if batch == 1 && id.(int64)%2 == 1 {
				want, wantErr, wantDelay = OutcomeRetried, "odd", time.Hour
			}
			gotErr := ""
			if e.Err != nil {
				gotErr = e.Err.Error()
			}
			if len(es) != 1 || e.Outcome != want || gotErr != wantErr || e.Delay != wantDelay || e.SettleErr != nil {
				t.Errorf("batch %d: job %v ended %d times, first %+v; want once, %v", batch, id, len(es), e, want)
			}
			if want == OutcomeAcked && e.Duration < time.Millisecond {
				t.Errorf("batch %d: job %v's handler took %v, want at least its sleep", batch, id, e.Duration)
			}
		}
	}
}

// TestEventsNoAlloc (issue 22 item 6): a job's start and end cost no
// allocation, with OnEvent unset and with one set.
func TestEventsNoAlloc(t *testing.T) {
	f := fakedb.NewLease()
	q := btQueue(t, f)
	ds, err := q.Claim(context.Background(), 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("claim: %d, %v", len(ds), err)
	}
	d := ds[0]
	var n int
	for _, hook := range []func(Event){nil, func(e Event) { n += e.Attempt }} {
		w := &loop{name: "jobs", onEvent: hook}
		allocs := testing.AllocsPerRun(100, func() {
			took := w.since(w.began(d))
			w.ended(d, took, nil, OutcomeAcked, 0, nil)
		})
		if allocs != 0 {
			t.Errorf("OnEvent set %v: %v allocations per job, want 0", hook != nil, allocs)
		}
	}
}

// settledLost matches ErrSettled and ErrLeaseLost, as a late settlement of a
// delivery whose lease was lost answers.
type settledLost struct{}

func (settledLost) Error() string { return "settled: lease lost" }
func (settledLost) Is(target error) bool {
	return target == inbox.ErrSettled || target == inbox.ErrLeaseLost
}

// TestEndedSettled (issue 22 items 5, 6): a settlement answered ErrSettled
// ends the job settled by its handler, reported to nobody; one whose
// delivery was finished by a lost lease keeps its outcome and its error,
// and OnError gets it.
func TestEndedSettled(t *testing.T) {
	f := fakedb.NewLease()
	q := btQueue(t, f)
	ds, err := q.Claim(context.Background(), 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("claim: %d, %v", len(ds), err)
	}
	var got []Event
	var reported []error
	w := &loop{name: "jobs", onEvent: func(e Event) { got = append(got, e) }, onError: func(err error) { reported = append(reported, err) }}
	w.ended(ds[0], time.Second, nil, OutcomeAcked, 0, inbox.ErrSettled)
	w.ended(ds[0], time.Second, errors.New("no"), OutcomeRetried, time.Minute, settledLost{})
	if len(got) != 2 || got[0].Outcome != OutcomeSettled || got[0].SettleErr != nil ||
		got[1].Outcome != OutcomeRetried || got[1].Delay != time.Minute || !errors.Is(got[1].SettleErr, inbox.ErrLeaseLost) {
		t.Errorf("events %+v; want settled without error, then retried with the lost lease", got)
	}
	if len(reported) != 1 || !errors.Is(reported[0], inbox.ErrLeaseLost) {
		t.Errorf("OnError got %v, want the lost lease alone", reported)
	}
}

// TestSlogEvents (issue 22 item 6): the adapter's lines, level and
// attributes, and nothing below the logger's level.
func TestSlogEvents(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}}))
	on := SlogEvents(l)
	on(Event{Kind: EventStart, Queue: "mail", ID: int64(7), Attempt: 2})
	on(Event{Kind: EventEnd, Queue: "mail", ID: int64(7), Attempt: 2, Duration: 1500 * time.Millisecond, Outcome: OutcomeAcked})
	on(Event{Kind: EventEnd, Queue: "mail", ID: "a b", Attempt: 1, Duration: time.Millisecond, Outcome: OutcomeRetried,
		Delay: time.Minute, Err: errors.New("smtp: 451")})
	on(Event{Kind: EventEnd, Queue: "mail", ID: int64(8), Attempt: 25, Duration: time.Millisecond, Outcome: OutcomeDead, Err: errors.New("no")})
	on(Event{Kind: EventEnd, Queue: "mail", ID: int64(9), Attempt: 1, Outcome: OutcomeAcked, SettleErr: inbox.ErrLeaseLost})
	on(Event{Kind: EventEnd, Queue: "mail", ID: int64(10), Attempt: 1, Outcome: OutcomeReleased, Err: context.Canceled})
	on(Event{Kind: EventEnd, Queue: "mail", ID: int64(11), Attempt: 1, Outcome: OutcomeSettled})
	on(Event{Kind: EventError, Queue: "mail", Err: errors.New("connection refused")})
	want := `level=DEBUG msg="job started" queue=mail id=7 attempt=2
level=INFO msg="job acked" queue=mail id=7 attempt=2 outcome=acked duration=1.5s
level=WARN msg="job retried" queue=mail id="a b" attempt=1 outcome=retried duration=1ms delay=1m0s error="smtp: 451"
level=ERROR msg="job dead" queue=mail id=8 attempt=25 outcome=dead duration=1ms error=no
level=ERROR msg="job settlement failed" queue=mail id=9 attempt=1 outcome=acked duration=0s settle_error="inbox: lease lost"
level=INFO msg="job released" queue=mail id=10 attempt=1 outcome=released duration=0s error="context canceled"
level=INFO msg="job settled by its handler" queue=mail id=11 attempt=1 outcome=settled duration=0s
level=ERROR msg="worker loop error" queue=mail error="connection refused"
`
	if got := buf.String(); got != want {
		t.Errorf("log:\n%s\nwant:\n%s", got, want)
	}
	buf.Reset()
	on = SlogEvents(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn})))
	on(Event{Kind: EventStart, Queue: "mail", ID: int64(7), Attempt: 2})
	on(Event{Kind: EventEnd, Queue: "mail", ID: int64(7), Attempt: 2, Outcome: OutcomeAcked})
	if buf.Len() != 0 {
		t.Errorf("below Warn: %q", buf.String())
	}
	on(Event{Kind: EventEnd, Queue: "mail", ID: int64(7), Attempt: 2, Outcome: OutcomeRetried})
	if !strings.Contains(buf.String(), "job retried") {
		t.Errorf("at Warn: %q", buf.String())
	}
}

// BenchmarkWorkEvents is BenchmarkWork16 and its batch-of-one twin with
// OnEvent unset and set to a hook that counts: the cost of the events.
func BenchmarkWorkEvents(b *testing.B) {
	for _, batch := range []int{1, 16} {
		for _, on := range []bool{false, true} {
			name := "batch=" + map[int]string{1: "1", 16: "16"}[batch] + "/events=" + map[bool]string{false: "off", true: "on"}[on]
			b.Run(name, func(b *testing.B) {
				var seen atomic.Int64
				cfg := Config{Batch: batch, RetryForever: true}
				if on {
					cfg.OnEvent = func(e Event) { seen.Add(int64(e.Kind)) }
				}
				benchWork(b, cfg)
			})
		}
	}
}

// benchWork runs Run with cfg and a no-op handler for b.N jobs.
func benchWork(b *testing.B, cfg Config) {
	f := fakedb.NewLease()
	q := btQueue(b, f)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var handled atomic.Int64
	n := int64(b.N)
	b.ReportAllocs()
	b.ResetTimer()
	err := Run(ctx, q, cfg, func(context.Context, *inbox.Delivery) error {
		if handled.Add(1) >= n {
			cancel()
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkJobEvents is what the events add to one job, its start and its
// end, with OnEvent unset and set to a hook that counts.
func BenchmarkJobEvents(b *testing.B) {
	f := fakedb.NewLease()
	q := btQueue(b, f)
	ds, err := q.Claim(context.Background(), 1)
	if err != nil || len(ds) != 1 {
		b.Fatalf("claim: %d, %v", len(ds), err)
	}
	d := ds[0]
	var seen atomic.Int64
	for _, on := range []bool{false, true} {
		w := &loop{name: "jobs"}
		if on {
			w.onEvent = func(e Event) { seen.Add(int64(e.Kind)) }
		}
		b.Run(map[bool]string{false: "events=off", true: "events=on"}[on], func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				took := w.since(w.began(d))
				w.ended(d, took, nil, OutcomeAcked, 0, nil)
			}
		})
	}
}
