package main

// The relay command as a user runs it: built with go build and started as a
// process of its own, with its flags, against the same NATS server and
// databases as the other tests. Every wait is for the process, the table or
// the proxy, polled with a deadline.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The command is built once per test binary, into binDir, which TestMain
// removes.
var (
	buildOnce sync.Once
	binDir    string
	binPath   string
	buildErr  error
)

// relayBinary builds the relay command (this package) and returns its path.
func relayBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "relay-cmd-")
		if buildErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "relay")
		goTool, err := exec.LookPath("go")
		if err != nil {
			goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		out, err := exec.Command(goTool, "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// removeBinary removes what relayBinary built.
func removeBinary() {
	if binDir != "" {
		os.RemoveAll(binDir)
	}
}

// command is a running relay command.
type command struct {
	cmd  *exec.Cmd
	out  *lockedBuffer // stdout and stderr
	done chan struct{} // closed once it exited
	err  error         // Wait's result, set before done closes
}

// lockedBuffer is a bytes.Buffer safe for os/exec's copying goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// startCommand starts the relay command on o's table and stream with the
// extra flags, killed when the test ends if it still runs.
func startCommand(t *testing.T, o *outbox, natsURL string, extra ...string) *command {
	t.Helper()
	args := append([]string{"-driver", o.driver, "-dsn", o.dsn, "-table", o.table, "-stream", o.stream,
		"-nats", natsURL, "-lease", "5s"}, extra...)
	c := &command{out: &lockedBuffer{}, done: make(chan struct{})}
	c.cmd = exec.Command(relayBinary(t), args...)
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		c.err = c.cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		if !c.exited() {
			c.cmd.Process.Kill()
			<-c.done
		}
	})
	return c
}

func (c *command) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// interrupt sends SIGINT, as a terminal or a supervisor stops the relay,
// and returns how it exited.
func (c *command) interrupt(t *testing.T) error {
	t.Helper()
	if !c.exited() {
		c.cmd.Process.Signal(os.Interrupt)
	}
	select {
	case <-c.done:
		return c.err
	case <-time.After(time.Minute):
		t.Fatalf("the relay did not exit within a minute of SIGINT; output:\n%s", c.out)
	}
	return nil
}

// count returns the jobs in o's table.
func (o *outbox) count(t *testing.T) int {
	t.Helper()
	var n int
	if err := o.db.QueryRow("SELECT COUNT(*) FROM " + o.table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitEmpty polls until every table is empty, failing the test when one
// of the commands exits first or the deadline passes.
func waitEmpty(t *testing.T, deadline time.Duration, cmds []*command, tables ...*outbox) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		left := 0
		for _, o := range tables {
			left += o.count(t)
		}
		if left == 0 {
			return time.Since(start)
		}
		for _, c := range cmds {
			if c.exited() {
				t.Fatalf("the relay exited (%v) with %d jobs left; output:\n%s", c.err, left, c.out)
			}
		}
		if time.Since(start) > deadline {
			var out []string
			for _, c := range cmds {
				out = append(out, c.out.String())
			}
			t.Fatalf("%d jobs left after %v; output:\n%s", left, deadline, strings.Join(out, "\n---\n"))
		}
		time.Sleep(20 * time.Millisecond) // a poll with a deadline
	}
}

// checkStream checks that the stream holds exactly one message for each
// job enqueued into each table (want: the tables' payloads by job id), on
// its subject, with its table's source, and nothing else.
func checkStream(t *testing.T, o *outbox, want map[*outbox]map[string]string) {
	t.Helper()
	byID, count := o.messages(t)
	stored := map[string]message{} // by payload: each job's is its own
	for id, m := range byID {
		if count[id] != 1 {
			t.Errorf("id %s stored %d times", id, count[id])
		}
		stored[m.payload] = m
	}
	total, lost := 0, 0
	for tb, jobs := range want {
		for _, payload := range jobs {
			total++
			m, ok := stored[payload]
			switch {
			case !ok:
				if lost++; lost <= 5 {
					t.Errorf("job %q of %s is not in the stream", payload, tb.table)
				}
			case m.source != tb.source || m.subject != tb.subject:
				t.Errorf("job %q of %s stored from %q on %s, want from %q on %s", payload, tb.table, m.source, m.subject, tb.source, tb.subject)
			}
		}
	}
	if len(byID) != total || lost != 0 {
		t.Errorf("%d distinct messages in the stream for %d jobs: %d jobs lost (gone from their table, not in the stream)", len(byID), total, lost)
	}
}

// TestCommandTwoTables runs the relay command twice, one process per
// table, relaying two outbox tables whose ids are the same (1..200 each)
// into one stream with the default message ids: every job of both tables
// is in the stream once, with its table's source. Before the default id
// was made of the table's identity, the second table's messages were
// dropped as duplicates of the first's and their jobs deleted all the same:
// 200 of 400 lost.
func TestCommandTwoTables(t *testing.T) {
	for _, driver := range []string{"pgx", "sqlite"} {
		t.Run(driver, func(t *testing.T) {
			nc, js := connect(t)
			a := newOutbox(t, nc, js, driver, 5*time.Second)
			b := a.sibling(t, 5*time.Second)
			const n = 200
			want := map[*outbox]map[string]string{a: a.enqueue(t, n), b: b.enqueue(t, n)}
			for id := range want[a] {
				if _, ok := want[b][id]; !ok {
					t.Fatalf("job id %s is in %s and not in %s: the test needs the same ids", id, a.table, b.table)
				}
			}
			ca := startCommand(t, a, defaultNATS())
			cb := startCommand(t, b, defaultNATS())
			took := waitEmpty(t, 2*time.Minute, []*command{ca, cb}, a, b)
			for _, c := range []*command{ca, cb} {
				if err := c.interrupt(t); err != nil {
					t.Errorf("relay exited with %v; output:\n%s", err, c.out)
				}
			}
			t.Logf("both tables empty after %v; relays said:\n%s%s", took.Round(time.Millisecond), ca.out, cb.out)
			checkStream(t, a, want)
		})
	}
}

// TestCommandSharedPrefix gives two tables' relays the same -msgid-prefix,
// so that their ids collide: whichever publishes an id second finds the
// stream holding the other table's message under it, and must exit
// non-zero naming the collision, having deleted none of its jobs whose
// message the stream does not hold.
func TestCommandSharedPrefix(t *testing.T) {
	nc, js := connect(t)
	a := newOutbox(t, nc, js, "sqlite", 5*time.Second)
	b := a.sibling(t, 5*time.Second)
	const n = 100
	want := map[*outbox]map[string]string{a: a.enqueue(t, n)}
	ca := startCommand(t, a, defaultNATS(), "-msgid-prefix", "shared:")
	waitEmpty(t, 2*time.Minute, []*command{ca}, a)
	if err := ca.interrupt(t); err != nil {
		t.Fatalf("first relay: %v\n%s", err, ca.out)
	}
	want[b] = b.enqueue(t, n)
	cb := startCommand(t, b, defaultNATS(), "-msgid-prefix", "shared:")
	deadline := time.Now().Add(2 * time.Minute)
	for !cb.exited() {
		if left := b.count(t); left == 0 || time.Now().After(deadline) {
			t.Fatalf("the second relay is still running with %d of its %d jobs left, none of whose messages is in the stream; output:\n%s", left, n, cb.out)
		}
		time.Sleep(20 * time.Millisecond) // a poll with a deadline
	}
	var ee *exec.ExitError
	if !errors.As(cb.err, &ee) || ee.ExitCode() != 1 || !strings.Contains(cb.out.String(), "two outbox tables share a message-id prefix") {
		t.Errorf("second relay: exit %v, output:\n%s\nwant exit status 1 naming the shared prefix", cb.err, cb.out)
	}
	// Every job of b is still in its table: no message of b's is stored.
	if left := b.count(t); left != n {
		t.Errorf("%d of %d jobs of the second table left in it, want all: none of their messages is in the stream", left, n)
	}
	delete(want, b)
	checkStream(t, a, want)
}

// cutProxy forwards loopback connections to a NATS server until it is cut:
// then it closes every connection and answers each new one by closing it
// at once (counted), as a broker that went away would, until restored.
// With a delay, every byte reaches the other side that long after it was
// read, each way: a broker a round trip of twice the delay away.
type cutProxy struct {
	ln      net.Listener
	target  string
	delay   time.Duration
	mu      sync.Mutex
	cut     bool
	conns   map[net.Conn]struct{}
	refused atomic.Int64
	wg      sync.WaitGroup
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	return newDelayProxy(t, target, 0)
}

// newDelayProxy is a cutProxy that delays every byte, each way.
func newDelayProxy(t *testing.T, target string, delay time.Duration) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target, delay: delay, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *cutProxy) url() string { return "nats://" + p.ln.Addr().String() }

func (p *cutProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close()
			p.refused.Add(1)
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c], p.conns[s] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, s)
		go p.pipe(s, c)
	}
}

func (p *cutProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	if p.delay > 0 {
		delayCopy(dst, src, p.delay)
	} else {
		io.Copy(dst, src)
	}
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// delayCopy copies src to dst as io.Copy does, each chunk written delay
// after it was read, in order, without holding up the reads: the link's
// latency, not its bandwidth. It returns once src has ended and what was
// read is written (or dst has failed).
func delayCopy(dst io.Writer, src io.Reader, delay time.Duration) {
	type chunk struct {
		due time.Time
		b   []byte
	}
	chunks := make(chan chunk, 4096)
	written := make(chan struct{})
	go func() {
		defer close(written)
		var failed bool
		for c := range chunks {
			if failed {
				continue
			}
			if wait := time.Until(c.due); wait > 0 {
				time.Sleep(wait) // the latency itself
			}
			if _, err := dst.Write(c.b); err != nil {
				failed = true
			}
		}
	}()
	for {
		b := make([]byte, 32<<10)
		n, err := src.Read(b)
		if n > 0 {
			chunks <- chunk{time.Now().Add(delay), b[:n]}
		}
		if err != nil {
			break
		}
	}
	close(chunks)
	<-written
}

// setCut cuts (true) or restores (false) the link; cutting closes every
// connection.
func (p *cutProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		p.refused.Store(0)
		for c := range p.conns {
			c.Close()
		}
	}
}

func (p *cutProxy) close() {
	p.ln.Close()
	p.setCut(true)
	p.wg.Wait()
}

// TestCommandOutage cuts the relay command's link to NATS (a loopback
// proxy) while jobs are enqueued, with a reconnect budget shrunk by its
// flags to 8 attempts 250 ms apart. An outage shorter than the budget (cut,
// then restored after the client's second refused attempt): the same
// process drains the table once the broker is back. An outage longer than
// the budget (cut until the process exits): the relay exits with status 1
// instead of staying alive on a closed connection, and the relay started
// again, as a supervisor would, drains the table. Every job is in the
// stream once. Before, a relay whose connection had closed stayed alive,
// claiming and failing every publish, and never drained the table.
func TestCommandOutage(t *testing.T) {
	for _, driver := range []string{"pgx", "sqlite"} {
		t.Run(driver, func(t *testing.T) {
			nc, js := connect(t)
			o := newOutbox(t, nc, js, driver, 5*time.Second)
			p := newCutProxy(t, strings.TrimPrefix(defaultNATS(), "nats://"))
			budget := []string{"-nats-reconnects", "8", "-nats-reconnect-wait", "250ms"}
			want := map[*outbox]map[string]string{o: o.enqueue(t, 100)}
			add := func(more map[string]string) {
				for id, payload := range more {
					want[o][id] = payload
				}
			}
			c := startCommand(t, o, p.url(), budget...)
			waitEmpty(t, 2*time.Minute, []*command{c}, o)

			// Shorter than the budget.
			p.setCut(true)
			add(o.enqueue(t, 100))
			waitRefused(t, p, 2)
			if c.exited() {
				t.Fatalf("the relay exited within its reconnect budget: %v\n%s", c.err, c.out)
			}
			p.setCut(false)
			took := waitEmpty(t, 2*time.Minute, []*command{c}, o)
			t.Logf("FIGURE: outage shorter than the budget: drained %v after the broker's return", took.Round(time.Millisecond))

			// Longer than the budget.
			p.setCut(true)
			add(o.enqueue(t, 100))
			cutAt := time.Now()
			select {
			case <-c.done:
			case <-time.After(2 * time.Minute):
				t.Fatalf("the relay was still running two minutes into an outage longer than its budget, %d jobs left; output:\n%s", o.count(t), c.out)
			}
			var ee *exec.ExitError
			if !errors.As(c.err, &ee) || ee.ExitCode() != 1 || !strings.Contains(c.out.String(), "NATS connection is closed") {
				t.Fatalf("relay after its budget: exit %v, output:\n%s\nwant exit status 1 saying the connection closed", c.err, c.out)
			}
			t.Logf("FIGURE: outage longer than the budget: the relay exited %v after the cut, after %d refused attempts; %d jobs in the table",
				time.Since(cutAt).Round(time.Millisecond), p.refused.Load(), o.count(t))
			p.setCut(false)
			c = startCommand(t, o, p.url(), budget...)
			took = waitEmpty(t, 2*time.Minute, []*command{c}, o)
			t.Logf("FIGURE: outage longer than the budget: the restarted relay drained in %v", took.Round(time.Millisecond))
			if err := c.interrupt(t); err != nil {
				t.Errorf("relay exited with %v; output:\n%s", err, c.out)
			}
			checkStream(t, o, want)
		})
	}
}

// waitRefused polls until the proxy has refused n connection attempts
// since it was cut.
func waitRefused(t *testing.T, p *cutProxy, n int64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for p.refused.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d reconnect attempts in a minute, want %d", p.refused.Load(), n)
		}
		time.Sleep(5 * time.Millisecond) // a poll with a deadline
	}
}
