package main

// The relay against a real NATS server with JetStream (INBOX_NATS_URL, else
// nats://127.0.0.1:4222) and a real outbox table: PostgreSQL
// (INBOX_POSTGRES_DSN) and SQLite (a temporary file). Each test makes its
// own table and stream, under names no other run uses, and deletes them.
// Without NATS or the PostgreSQL DSN the tests skip and say so; under
// INBOX_REQUIRE_DBS=1 that is a failure. Every wait is for a signal or a
// poll with a deadline.

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sqlinbox/inbox"
)

// childEnv carries a childConfig to the test binary re-executed as a relay.
const childEnv = "RELAY_TEST_CHILD"

// TestMain doubles as a relay process for TestRelayKilled: with
// RELAY_TEST_CHILD set, it relays until it reaches the crash point the
// config names, reports it on stdout and waits there to be killed.
func TestMain(m *testing.M) {
	if v := os.Getenv(childEnv); v != "" {
		if err := child(v); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	code := m.Run()
	removeBinary()
	os.Exit(code)
}

type childConfig struct {
	Driver, DSN, Table string
	NATS, Stream       string
	Lease              time.Duration
	Batch, Workers     int
	Point              string // the hook's point to stop at: "sent" or "published"
	At                 int64  // the batch to stop at
	// The relay's deadlines; zero: a second for MaxRetryDelay, the
	// defaults for the others.
	PublishTimeout, ProofTimeout, AckTimeout, MaxRetryDelay time.Duration
}

func child(v string) error {
	var c childConfig
	if err := json.Unmarshal([]byte(v), &c); err != nil {
		return err
	}
	// The parent kills this process; the deadline only keeps an orphan
	// from living on.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	db, q, src, err := openOutbox(ctx, c.Driver, c.DSN, c.Table, c.Lease, false)
	if err != nil {
		return err
	}
	defer db.Close()
	nc, err := nats.Connect(c.NATS)
	if err != nil {
		return err
	}
	defer nc.Close()
	r, err := New(q, nc, Config{Stream: c.Stream, Source: src, DB: db, Batch: c.Batch, Workers: c.Workers,
		PublishTimeout: c.PublishTimeout, ProofTimeout: c.ProofTimeout, AckTimeout: c.AckTimeout,
		MaxRetryDelay: cmp.Or(c.MaxRetryDelay, time.Second)})
	if err != nil {
		return err
	}
	r.hook = func(point string, batch int64, ids []string) {
		if point == c.Point && batch == c.At {
			jobs := make([]string, len(ids))
			for i, id := range ids {
				jobs[i] = strings.TrimPrefix(id, r.cfg.MsgIDPrefix)
			}
			// One write: the parent reads whole lines.
			os.Stdout.WriteString("STOPPED " + strings.Join(jobs, ",") + "\n")
			<-ctx.Done()
		}
	}
	return r.Run(ctx)
}

// require skips the test, or fails it under INBOX_REQUIRE_DBS=1.
func require(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("INBOX_REQUIRE_DBS") == "1" {
		t.Fatalf("%s, and INBOX_REQUIRE_DBS=1", msg)
	}
	t.Skipf("%s: skipping (set INBOX_REQUIRE_DBS=1 to make this a failure)", msg)
}

// connect returns a connection to the NATS server, skipping the test when
// none answers or it has no JetStream.
func connect(t *testing.T) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	url := defaultNATS()
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second))
	if err != nil {
		require(t, "no NATS server at %s (INBOX_NATS_URL): %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		require(t, "the NATS server at %s has no JetStream: %v", url, err)
	}
	return nc, js
}

// outbox is one test's table and stream.
type outbox struct {
	driver, dsn, table, stream, subject string
	source                              string // the table's identity, Config.Source
	db                                  *sql.DB
	q                                   *inbox.Queue
	s                                   jetstream.Stream
}

// newOutbox makes a table and a stream of the test's own on driver (pgx
// or sqlite), deleted when the test ends.
func newOutbox(t *testing.T, nc *nats.Conn, js jetstream.JetStream, driver string, lease time.Duration) *outbox {
	t.Helper()
	o := &outbox{driver: driver}
	switch driver {
	case "pgx":
		o.dsn = os.Getenv("INBOX_POSTGRES_DSN")
		if o.dsn == "" {
			require(t, "INBOX_POSTGRES_DSN is not set")
		}
	case "sqlite":
		o.dsn = sqliteDSN(filepath.Join(t.TempDir(), "outbox.db"))
	}
	tag := fmt.Sprintf("%d_%04x", os.Getpid(), rand.IntN(1<<16))
	o.table = "relay_t_" + tag
	o.stream = "RELAY_T_" + tag
	o.subject = o.stream + ".job"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o.open(t, lease)
	// Longer than the test: no de-duplication id expires while it runs.
	var err error
	o.s, err = createStream(ctx, nc, o.stream, 30*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := js.DeleteStream(context.Background(), o.stream); err != nil {
			t.Errorf("delete stream %s: %v", o.stream, err)
		}
	})
	return o
}

// open creates o's table and opens its queue, and drops the table when the
// test ends.
func (o *outbox) open(t *testing.T, lease time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var err error
	o.db, o.q, o.source, err = openOutbox(ctx, o.driver, o.dsn, o.table, lease, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, tb := range []string{o.table, o.table + "_dead"} {
			if _, err := o.db.Exec("DROP TABLE IF EXISTS " + tb); err != nil {
				t.Errorf("drop %s: %v", tb, err)
			}
		}
		o.db.Close()
	})
}

// sibling makes a second table in o's database that relays into o's
// stream, on o's subject: its ids are o's ids.
func (o *outbox) sibling(t *testing.T, lease time.Duration) *outbox {
	t.Helper()
	b := &outbox{driver: o.driver, dsn: o.dsn, table: o.table + "_b", stream: o.stream, subject: o.subject, s: o.s}
	b.open(t, lease)
	return b
}

// enqueue adds n jobs in one transaction and returns each job's payload by
// its de-duplication id.
func (o *outbox) enqueue(t *testing.T, n int) map[string]string {
	t.Helper()
	ctx := context.Background()
	tx, err := o.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := make(map[string]string, n)
	for i := range n {
		payload := fmt.Sprintf("%s: order %d shipped", o.table, i)
		id, err := o.q.Enqueue(ctx, tx, inbox.Job{Data: []any{o.subject, []byte(payload)}})
		if err != nil {
			tx.Rollback()
			t.Fatal(err)
		}
		want[idText(id)] = payload
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return want
}

// ids returns the ids of the jobs in table.
func (o *outbox) ids(t *testing.T, table string) map[string]bool {
	t.Helper()
	rows, err := o.db.Query("SELECT id FROM " + table)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	ids := map[string]bool{}
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids[idText(id)] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// message is one stored message.
type message struct {
	subject, payload, source string
}

// messages reads the whole stream: every stored message by its
// de-duplication id (o's jobs by their job id alone: the default prefix of
// o's table taken off), and how many carried each id.
func (o *outbox) messages(t *testing.T) (map[string]message, map[string]int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	info, err := o.s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byID, count := map[string]message{}, map[string]int{}
	if info.State.Msgs == 0 {
		return byID, count
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := o.s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // deleted (a test's probe)
		}
		if err != nil {
			t.Fatalf("message %d: %v", seq, err)
		}
		id := strings.TrimPrefix(m.Header.Get(jetstream.MsgIDHeader), defaultMsgIDPrefix(o.source))
		byID[id] = message{m.Subject, string(m.Data), m.Header.Get(SourceHeader)}
		count[id]++
	}
	return byID, count
}

// relayProcess is a relay in a child process.
type relayProcess struct {
	cmd     *exec.Cmd
	lines   chan string
	stderr  bytes.Buffer
	stopped chan struct{} // closed when stdout ends
}

func startRelay(t *testing.T, c childConfig) *relayProcess {
	t.Helper()
	cfg, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	p := &relayProcess{lines: make(chan string, 16), stopped: make(chan struct{})}
	p.cmd = exec.Command(os.Args[0], "-test.run=^$")
	p.cmd.Env = append(os.Environ(), childEnv+"="+string(cfg))
	p.cmd.Stderr = &p.stderr
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.stopped)
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	t.Cleanup(p.kill)
	return p
}

// waitStopped waits for the child's report that it stopped at its crash
// point, and returns the ids it reported.
func (p *relayProcess) waitStopped(t *testing.T) []string {
	t.Helper()
	deadline := time.After(2 * time.Minute)
	for {
		select {
		case line := <-p.lines:
			if ids, ok := strings.CutPrefix(line, "STOPPED "); ok {
				return strings.Split(ids, ",")
			}
			if line == "STOPPED" {
				return nil
			}
		case <-p.stopped:
			p.cmd.Wait()
			t.Fatalf("the relay process ended before its crash point: %v\n%s", p.cmd.ProcessState, p.stderr.String())
		case <-deadline:
			t.Fatalf("the relay process did not reach its crash point in two minutes\n%s", p.stderr.String())
		}
	}
}

// kill sends SIGKILL and reaps the process.
func (p *relayProcess) kill() {
	if p.cmd.ProcessState != nil {
		return
	}
	p.cmd.Process.Kill()
	<-p.stopped
	p.cmd.Wait()
}

// TestRelayKilled relays 2,000 jobs with relays that are SIGKILLed: the
// first after the broker acked a batch and before the batch was acked in
// the table, the second halfway through publishing a batch; a third, in
// this process, finishes. Every job must be in the stream exactly once,
// with its payload, and none left in the table. The first relay's batch
// was seen in the stream and in the table after its kill, so the table
// emptied only through a publish that the stream dropped as a duplicate
// (by the second relay or the third: which one depends on timing).
func TestRelayKilled(t *testing.T) {
	for _, driver := range []string{"pgx", "sqlite"} {
		t.Run(driver, func(t *testing.T) {
			nc, js := connect(t)
			// The killed relays' jobs wait this long for the last relay. It
			// also bounds the time from a claim to the kill: no other loop of
			// the same relay may claim the stopped batch meanwhile.
			const lease = 5 * time.Second
			o := newOutbox(t, nc, js, driver, lease)
			const n = 2000
			want := o.enqueue(t, n)
			base := childConfig{Driver: driver, DSN: o.dsn, Table: o.table, NATS: defaultNATS(),
				Stream: o.stream, Lease: lease, Batch: 50, Workers: 2}

			// 1: killed with a batch published and not acked.
			c := base
			c.Point, c.At = "published", 3
			p := startRelay(t, c)
			hung := p.waitStopped(t)
			p.kill()
			if len(hung) == 0 {
				t.Fatal("the first relay stopped with an empty batch")
			}
			left := o.ids(t, o.table)
			stored, _ := o.messages(t)
			for _, id := range hung {
				if _, ok := stored[id]; !ok || !left[id] {
					t.Fatalf("job %s of the killed relay's batch: in the stream %v, in the table %v; want both", id, ok, left[id])
				}
			}
			t.Logf("first relay killed with %d jobs published and not acked; %d messages stored, %d jobs in the table", len(hung), len(stored), len(left))

			// 2: killed halfway through publishing a batch.
			c = base
			c.Point, c.At = "sent", 4
			p = startRelay(t, c)
			half := p.waitStopped(t)
			p.kill()
			left = o.ids(t, o.table)
			for _, id := range half {
				if !left[id] {
					t.Fatalf("job %s of the second relay's half-published batch is not in the table", id)
				}
			}
			stored, _ = o.messages(t)
			t.Logf("second relay killed with %d of its batch's jobs sent; %d messages stored, %d jobs in the table", len(half), len(stored), len(left))

			// 3: this process's relay drains the table, once the killed
			// relays' leases run out.
			nc2, err := nats.Connect(defaultNATS())
			if err != nil {
				t.Fatal(err)
			}
			defer nc2.Close()
			r, err := New(o.q, nc2, Config{Stream: o.stream, Source: o.source, DB: o.db, Batch: 50, Workers: 2, MaxRetryDelay: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if err := r.Check(ctx); err != nil {
				t.Fatal(err)
			}
			ran := make(chan error, 1)
			go func() { ran <- r.Run(ctx) }()
			deadline := time.Now().Add(2 * time.Minute)
			for {
				var count int
				if err := o.db.QueryRow("SELECT COUNT(*) FROM " + o.table).Scan(&count); err != nil {
					t.Fatal(err)
				}
				if count == 0 {
					break
				}
				select {
				case err := <-ran:
					t.Fatalf("the relay stopped with %d jobs left: %v", count, err)
				default:
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d jobs still in the table after two minutes; relay: %+v", count, r.Stats())
				}
				time.Sleep(20 * time.Millisecond) // a poll with a deadline
			}
			cancel()
			if err := <-ran; err != nil {
				t.Fatal(err)
			}
			st := r.Stats()
			t.Logf("last relay: %+v", st)

			stored, count := o.messages(t)
			if len(count) != n {
				t.Errorf("%d distinct messages in the stream, want %d", len(count), n)
			}
			for id, c := range count {
				if c != 1 {
					t.Errorf("job %s stored %d times", id, c)
				}
			}
			for id, payload := range want {
				m, ok := stored[id]
				switch {
				case !ok:
					t.Errorf("job %s is not in the stream", id)
				case m.payload != payload || m.subject != o.subject:
					t.Errorf("job %s stored as %q on %s, want %q on %s", id, m.payload, m.subject, payload, o.subject)
				}
			}
			if left := o.ids(t, o.table); len(left) != 0 {
				t.Errorf("%d jobs left in the table", len(left))
			}
			if dead := o.ids(t, o.table+"_dead"); len(dead) != 0 {
				t.Errorf("%d jobs in the dead table", len(dead))
			}
		})
	}
}

// TestRelayFailures: a payload over the server's limit goes to the dead
// table, a subject no stream takes is retried later with its attempt
// spent, and neither holds up the job beside them.
func TestRelayFailures(t *testing.T) {
	for _, driver := range []string{"pgx", "sqlite"} {
		t.Run(driver, func(t *testing.T) {
			nc, js := connect(t)
			o := newOutbox(t, nc, js, driver, 30*time.Second)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			enqueue := func(subject string, payload []byte) string {
				id, err := o.q.Enqueue(ctx, o.db, inbox.Job{Data: []any{subject, payload}})
				if err != nil {
					t.Fatal(err)
				}
				return idText(id)
			}
			good := enqueue(o.subject, []byte("fine"))
			big := enqueue(o.subject, make([]byte, nc.MaxPayload()+1))
			lost := enqueue("NOWHERE_"+o.stream+".job", []byte("no stream takes this subject"))

			r, err := New(o.q, nc, Config{Stream: o.stream, Source: o.source, DB: o.db, PublishTimeout: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			ran := make(chan error, 1)
			go func() { ran <- r.Run(ctx) }()
			deadline := time.Now().Add(time.Minute)
			for st := r.Stats(); st.Acked < 1 || st.Dead < 1 || st.Retried < 1; st = r.Stats() {
				select {
				case err := <-ran:
					t.Fatalf("the relay stopped: %v; %+v", err, st)
				default:
				}
				if time.Now().After(deadline) {
					t.Fatalf("after a minute: %+v, want an ack, a dead job and a retry", st)
				}
				time.Sleep(10 * time.Millisecond) // a poll with a deadline
			}
			cancel()
			if err := <-ran; err != nil {
				t.Fatal(err)
			}
			t.Logf("%+v", r.Stats())

			if left := o.ids(t, o.table); len(left) != 1 || !left[lost] {
				t.Errorf("jobs left in the table: %v, want only the retried job %s", left, lost)
			}
			var attempt int
			if err := o.db.QueryRow("SELECT attempt FROM " + o.table).Scan(&attempt); err != nil {
				t.Fatal(err)
			}
			if attempt < 2 {
				t.Errorf("the retried job's next attempt is %d, want at least 2", attempt)
			}
			if dead := o.ids(t, o.table+"_dead"); len(dead) != 1 || !dead[big] {
				t.Errorf("dead jobs: %v, want only the oversized job %s", dead, big)
			}
			stored, count := o.messages(t)
			if len(count) != 1 || count[good] != 1 || stored[good].payload != "fine" {
				t.Errorf("stream holds %v, want job %s alone", count, good)
			}
		})
	}
}

// TestCheck: a stream whose duplicate window does not outlast the lease
// plus the longest retry delay is refused, as is a missing stream.
func TestCheck(t *testing.T) {
	nc, js := connect(t)
	o := newOutbox(t, nc, js, "sqlite", 30*time.Second)
	ctx := context.Background()
	short := o.stream + "_SHORT"
	if _, err := createStream(ctx, nc, short, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { js.DeleteStream(context.Background(), short) })
	for _, c := range []struct {
		stream string
		want   string // in the error; empty: none
	}{
		{o.stream, ""},
		{short, "keeps de-duplication ids for 1m30s, not longer than the lease (or the publish, proof and ack timeouts together, if longer) plus the longest retry delay (1m30s)"},
		{o.stream + "_MISSING", "stream not found"},
	} {
		r, err := New(o.q, nc, Config{Stream: c.stream, Source: o.source, DB: o.db})
		if err != nil {
			t.Fatal(err)
		}
		err = r.Check(ctx)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.stream, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: error %v, want one containing %q", c.stream, err, c.want)
		}
	}
}

// TestNew: the settings New refuses, before any I/O.
func TestNew(t *testing.T) {
	db, err := sql.Open("sqlite", sqliteDSN(filepath.Join(t.TempDir(), "none.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	lease, err := inbox.New(db, inbox.Config{Dialect: inbox.SQLite,
		Table: inbox.Table{Name: "outbox", LockedUntil: "locked_until", Data: []string{"subject", "payload"}}})
	if err != nil {
		t.Fatal(err)
	}
	advisory, err := inbox.New(db, inbox.Config{Dialect: inbox.SQLite,
		Table: inbox.Table{Name: "outbox", AdvisoryKey: "id", Data: []string{"subject", "payload"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		q    *inbox.Queue
		cfg  Config
		want string
	}{
		{advisory, Config{Stream: "S", Source: "x"}, "must be of the lease form, not advisory"},
		{lease, Config{Source: "x"}, "Config.Stream is empty"},
		{lease, Config{Stream: "S"}, "Config.Source is empty"},
		{lease, Config{Stream: "S", Source: "a\nb"}, "holds a line break or NUL"},
		{lease, Config{Stream: "S", Source: "x", Batch: inbox.MaxClaim + 1}, "Config.Batch 1001 must be from 1 to 1000"},
		{lease, Config{Stream: "S", Source: "x", Poll: -1}, "must not be negative"},
		{lease, Config{Stream: "S", Source: "x", ProofTimeout: -1}, "must not be negative"},
		{lease, Config{Stream: "S", Source: "x"}, "Config.DB is nil"},
		{lease, Config{Stream: "S", Source: "x", DB: db}, "the NATS connection is nil"},
	} {
		if _, err := New(c.q, nil, c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v): %v, want an error containing %q", c.cfg, err, c.want)
		}
	}
}

// TestRelayStops: a relay stopped mid-run finishes what it holds, so that
// no job is left leased, waiting out its lease, and none has spent an
// attempt; what it acked is in the stream, and nothing else.
func TestRelayStops(t *testing.T) {
	for _, driver := range []string{"pgx", "sqlite"} {
		t.Run(driver, func(t *testing.T) {
			nc, js := connect(t)
			o := newOutbox(t, nc, js, driver, 30*time.Second)
			const n = 3000
			o.enqueue(t, n)
			// A publish that timed out would be retried, spending its
			// attempt: the timeout here is longer than the test.
			r, err := New(o.q, nc, Config{Stream: o.stream, Source: o.source, DB: o.db, Batch: 50, Workers: 4, PublishTimeout: 5 * time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ran := make(chan error, 1)
			go func() { ran <- r.Run(ctx) }()
			deadline := time.Now().Add(time.Minute)
			for r.Stats().Acked < 200 {
				if time.Now().After(deadline) {
					t.Fatalf("after a minute: %+v", r.Stats())
				}
				time.Sleep(time.Millisecond) // a poll with a deadline
			}
			cancel()
			if err := <-ran; err != nil {
				t.Fatal(err)
			}
			st := r.Stats()
			t.Logf("%+v", st)
			var leased, spent, left int
			if err := o.db.QueryRow("SELECT COUNT(*), COUNT(locked_until), COALESCE(SUM(attempt - 1), 0) FROM "+o.table).Scan(&left, &leased, &spent); err != nil {
				t.Fatal(err)
			}
			if leased != 0 || spent != 0 {
				t.Errorf("after the relay stopped, %d jobs are under lease and %d attempts spent", leased, spent)
			}
			_, count := o.messages(t)
			if len(count) != int(st.Acked) || left+int(st.Acked) != n {
				t.Errorf("%d messages stored, %d jobs acked, %d left in the table, of %d", len(count), st.Acked, left, n)
			}
		})
	}
}

// TestRelayDuplicateProof: a publish the stream calls a duplicate deletes
// its job only when the stored message is the job's own. A message of
// another table under the job's id (a shared prefix) ends Run with
// ErrCollision; a stored message the stream has removed since (its id
// still in the duplicate window) cannot be compared, and the job is given
// back (Unproven). In both cases the job stays in the table.
func TestRelayDuplicateProof(t *testing.T) {
	for _, c := range []struct {
		name   string
		source string // of the message stored first under the job's id
		remove bool   // removed from the stream before the relay publishes
	}{
		{name: "another table's message", source: "postgres:other/public.outbox"},
		{name: "removed message", remove: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			nc, js := connect(t)
			o := newOutbox(t, nc, js, "sqlite", 30*time.Second)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			id, err := o.q.Enqueue(ctx, o.db, inbox.Job{Data: []any{o.subject, []byte("mine")}})
			if err != nil {
				t.Fatal(err)
			}
			src := c.source
			if src == "" {
				src = o.source
			}
			first := nats.NewMsg(o.subject)
			first.Data = []byte("mine")
			first.Header.Set(SourceHeader, src)
			first.Header.Set(jetstream.MsgIDHeader, defaultMsgIDPrefix(o.source)+idText(id))
			ack, err := js.PublishMsg(ctx, first)
			if err != nil {
				t.Fatal(err)
			}
			if c.remove {
				if err := o.s.DeleteMsg(ctx, ack.Sequence); err != nil {
					t.Fatal(err)
				}
			}
			r, err := New(o.q, nc, Config{Stream: o.stream, Source: o.source, DB: o.db})
			if err != nil {
				t.Fatal(err)
			}
			ran := make(chan error, 1)
			go func() { ran <- r.Run(ctx) }()
			if c.remove {
				for r.Stats().Unproven == 0 {
					select {
					case err := <-ran:
						t.Fatalf("Run returned %v; %+v", err, r.Stats())
					case <-ctx.Done():
						t.Fatalf("no unproven duplicate in a minute: %+v", r.Stats())
					case <-time.After(10 * time.Millisecond): // a poll with a deadline
					}
				}
				cancel()
				if err := <-ran; err != nil {
					t.Errorf("Run: %v, want nil", err)
				}
			} else if err := <-ran; !errors.Is(err, ErrCollision) || !strings.Contains(err.Error(), "postgres:other/public.outbox") {
				t.Errorf("Run: %v, want ErrCollision naming the other table", err)
			}
			if st := r.Stats(); st.Acked != 0 || st.Duplicates != 0 {
				t.Errorf("%+v: the job was counted as relayed", st)
			}
			if left := o.ids(t, o.table); !left[idText(id)] {
				t.Errorf("job %v left the table though the stream does not hold its message", id)
			}
		})
	}
}
