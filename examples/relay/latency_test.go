package main

// The relay with the broker away: a delaying proxy between the relays and
// NATS (newDelayProxy), relays killed between the broker's ack and the
// table's, and a stream whose duplicate window is short enough to pass in
// the test; and the command started while the broker does not answer.

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestRelayLatency relays 300 jobs with the broker 50 ms (SQLite) or
// 150 ms (PostgreSQL) away each way, a round trip of 100 or 300 ms, and a
// stream keeping de-duplication ids for 8 s. The relays' deadlines are
// 1.5 s each (publish, proof, table), so that the window is longer than
// their Reach (5.5 s).
//
//  1. A relay is killed after the broker acked its second batch of 50 and
//     before the table did: 50 jobs stored and still in the table.
//  2. Past the window (a probe message published after the kill is no
//     longer called a duplicate), a second relay starts. Its publishes of
//     those jobs would be stored again; its sweep finds them in the stream
//     instead and deletes them. It is killed in turn after the broker
//     acked its second batch and before the table did.
//  3. Within the window, a relay in this process drains the table, each
//     duplicate of the second relay's batch proven before its job is
//     deleted, within the deadlines.
//
// Every job is stored once. Before, the third relay proved its duplicates
// one at a time, two round trips each, all under one deadline of
// PublishTimeout: its table acks failed and it exited; and the second
// relay published the first batch again, stored twice.
func TestRelayLatency(t *testing.T) {
	for _, c := range []struct {
		driver string
		delay  time.Duration // each way
	}{
		{"sqlite", 50 * time.Millisecond},
		{"pgx", 150 * time.Millisecond},
	} {
		t.Run(c.driver+"/"+c.delay.String(), func(t *testing.T) {
			nc, js := connect(t)
			const lease = time.Second
			o := newOutbox(t, nc, js, c.driver, lease)
			const window = 8 * time.Second
			short(t, js, o, window)
			p := newDelayProxy(t, strings.TrimPrefix(defaultNATS(), "nats://"), c.delay)
			const n = 300
			want := o.enqueue(t, n)
			const step = 1500 * time.Millisecond
			base := childConfig{Driver: c.driver, DSN: o.dsn, Table: o.table, NATS: p.url(), Stream: o.stream,
				Lease: lease, Batch: 50, Workers: 1, Point: "published", At: 2,
				PublishTimeout: step, ProofTimeout: step, AckTimeout: step, MaxRetryDelay: time.Second}

			// 1: killed with a batch stored and not acked in the table.
			first := startRelay(t, base)
			hung := first.waitStopped(t)
			first.kill()
			mustHold(t, o, hung)
			t.Logf("first relay killed with %d jobs stored and in the table", len(hung))

			// 2: past the window.
			waited := pastWindow(t, js, o)
			t.Logf("the stream forgot the ids %v after the kill", waited.Round(time.Millisecond))
			second := startRelay(t, base)
			hung2 := second.waitStopped(t)
			second.kill()
			_, count := o.messages(t)
			left := o.ids(t, o.table)
			twice := 0
			for _, id := range hung {
				if count[id] != 1 || left[id] {
					if twice++; twice <= 3 {
						t.Errorf("job %s, stored %v before the second relay started: stored %d times, in the table %v; want once, and deleted",
							id, waited.Round(time.Millisecond), count[id], left[id])
					}
				}
			}
			mustHold(t, o, hung2)
			if twice == 0 {
				t.Logf("second relay: the first relay's %d jobs deleted without a publish; killed with %d jobs stored and in the table", len(hung), len(hung2))
			}

			// 3: within the window, through the same proxy.
			nc2, err := nats.Connect(p.url(), nats.Timeout(10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			defer nc2.Close()
			r, err := New(o.q, nc2, Config{Stream: o.stream, Source: o.source, DB: o.db, Batch: 50, Workers: 2,
				PublishTimeout: step, ProofTimeout: step, AckTimeout: step, MaxRetryDelay: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			// The longest time of a batch from half its publishes sent to
			// its duplicates proven: a publish's round trip and the proof's.
			var (
				mu      sync.Mutex
				sent    = map[int64]time.Time{}
				slowest time.Duration
			)
			r.hook = func(point string, batch int64, _ []string) {
				mu.Lock()
				defer mu.Unlock()
				if point == "sent" {
					sent[batch] = time.Now()
				} else if d := time.Since(sent[batch]); d > slowest {
					slowest = d
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ran := make(chan error, 1)
			start := time.Now()
			go func() { ran <- r.Run(ctx) }()
			deadline := time.Now().Add(time.Minute)
			for o.count(t) > 0 {
				select {
				case err := <-ran:
					t.Fatalf("the relay stopped with %d jobs left: %v; %+v", o.count(t), err, r.Stats())
				default:
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d jobs left after a minute; %+v", o.count(t), r.Stats())
				}
				time.Sleep(20 * time.Millisecond) // a poll with a deadline
			}
			took := time.Since(start)
			cancel()
			if err := <-ran; err != nil {
				t.Fatal(err)
			}
			st := r.Stats()
			mu.Lock()
			t.Logf("FIGURE: broker %v away each way: the last relay drained %d jobs, %d of them stored before (%d proven duplicates, %d found by its sweep), in %v; slowest batch from publish to proof %v; %+v",
				c.delay, st.Acked+st.Recovered, len(hung2), st.Duplicates, st.Recovered, took.Round(time.Millisecond), slowest.Round(time.Millisecond), st)
			mu.Unlock()
			if st.Duplicates+st.Recovered < uint64(len(hung2)) || st.Unproven != 0 {
				t.Errorf("%+v: want the second relay's %d jobs proven stored", st, len(hung2))
			}
			checkStream(t, o, map[*outbox]map[string]string{o: want})
			if dead := o.ids(t, o.table+"_dead"); len(dead) != 0 {
				t.Errorf("%d jobs in the dead table", len(dead))
			}
		})
	}
}

// short replaces o's stream by one that keeps de-duplication ids for
// window.
func short(t *testing.T, js jetstream.JetStream, o *outbox, window time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := js.DeleteStream(ctx, o.stream); err != nil {
		t.Fatal(err)
	}
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: o.stream, Subjects: []string{o.stream + ".>"}, Storage: jetstream.FileStorage, Duplicates: window,
	})
	if err != nil {
		t.Fatal(err)
	}
	o.s = s
}

// mustHold fails the test unless every job of ids is stored in the stream
// and still in the table.
func mustHold(t *testing.T, o *outbox, ids []string) {
	t.Helper()
	if len(ids) == 0 {
		t.Fatal("the relay stopped with an empty batch")
	}
	left := o.ids(t, o.table)
	stored, _ := o.messages(t)
	for _, id := range ids {
		if _, ok := stored[id]; !ok || !left[id] {
			t.Fatalf("job %s of the killed relay's batch: in the stream %v, in the table %v; want in both", id, ok, left[id])
		}
	}
}

// pastWindow returns once the stream has forgotten the ids of every
// message stored so far: it publishes a probe message, then publishes it
// again, polling, until the stream no longer calls it a duplicate; then it
// deletes the probe's copies. It returns how long that took.
func pastWindow(t *testing.T, js jetstream.JetStream, o *outbox) time.Duration {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	probe := nats.NewMsg(o.stream + ".probe")
	probe.Header.Set(jetstream.MsgIDHeader, "probe")
	ack, err := js.PublishMsg(ctx, probe)
	if err != nil {
		t.Fatal(err)
	}
	copies := []uint64{ack.Sequence}
	for {
		select {
		case <-ctx.Done():
			t.Fatal("the stream still knew the probe's id after two minutes")
		case <-time.After(50 * time.Millisecond): // a poll with a deadline
		}
		ack, err := js.PublishMsg(ctx, probe)
		if err != nil {
			t.Fatal(err)
		}
		if !ack.Duplicate {
			copies = append(copies, ack.Sequence)
			break
		}
	}
	for _, seq := range copies {
		if err := o.s.DeleteMsg(ctx, seq); err != nil {
			t.Fatal(err)
		}
	}
	return time.Since(start)
}

// TestCommandFirstConnect starts the relay command while its link to NATS
// (a loopback proxy) refuses every connection, with a budget of 8
// attempts 250 ms apart. Restored after two refused attempts, the same
// process drains the table. Never restored, it exits with status 1 once
// the budget has run out, not before. Before, the relay exited at its
// first refused attempt.
func TestCommandFirstConnect(t *testing.T) {
	nc, js := connect(t)
	o := newOutbox(t, nc, js, "sqlite", 5*time.Second)
	p := newCutProxy(t, strings.TrimPrefix(defaultNATS(), "nats://"))
	budget := []string{"-nats-reconnects", "8", "-nats-reconnect-wait", "250ms"}
	want := map[*outbox]map[string]string{o: o.enqueue(t, 50)}

	p.setCut(true)
	c := startCommand(t, o, p.url(), budget...)
	deadline := time.Now().Add(time.Minute)
	for p.refused.Load() < 2 {
		if c.exited() {
			t.Fatalf("the relay exited after %d refused attempts, within its budget of 8: %v\n%s", p.refused.Load(), c.err, c.out)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d connection attempts in a minute, want 2", p.refused.Load())
		}
		time.Sleep(5 * time.Millisecond) // a poll with a deadline
	}
	p.setCut(false)
	took := waitEmpty(t, 2*time.Minute, []*command{c}, o)
	t.Logf("FIGURE: broker away at the start: drained %v after its return", took.Round(time.Millisecond))
	if err := c.interrupt(t); err != nil {
		t.Errorf("relay exited with %v; output:\n%s", err, c.out)
	}

	p.setCut(true)
	want[o] = mergeJobs(want[o], o.enqueue(t, 10))
	start := time.Now()
	c = startCommand(t, o, p.url(), budget...)
	select {
	case <-c.done:
	case <-time.After(time.Minute):
		t.Fatalf("the relay was still running a minute after its start with the broker away; output:\n%s", c.out)
	}
	took = time.Since(start)
	var ee *exec.ExitError
	if !errors.As(c.err, &ee) || ee.ExitCode() != 1 || !strings.Contains(c.out.String(), "no connection to NATS") {
		t.Fatalf("relay with the broker away: exit %v, output:\n%s\nwant exit status 1 saying there is no connection", c.err, c.out)
	}
	if n := p.refused.Load(); n < 9 || took < 7*250*time.Millisecond {
		t.Errorf("the relay gave up after %d attempts and %v, want 9 (the first and 8 more, 250 ms apart)", n, took)
	}
	t.Logf("FIGURE: broker away for good: the relay exited %v after its start, after %d refused attempts", took.Round(time.Millisecond), p.refused.Load())
	p.setCut(false)
	c = startCommand(t, o, p.url(), budget...)
	waitEmpty(t, 2*time.Minute, []*command{c}, o)
	if err := c.interrupt(t); err != nil {
		t.Errorf("relay exited with %v; output:\n%s", err, c.out)
	}
	checkStream(t, o, want)
}

func mergeJobs(a, b map[string]string) map[string]string {
	for id, payload := range b {
		a[id] = payload
	}
	return a
}
