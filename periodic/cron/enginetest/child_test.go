package enginetest

// Scheduler processes: the test binary runs again as a child (childEnv),
// which the test kills.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sqlinbox/inbox/dialect"
	"github.com/sqlinbox/inbox/periodic"
)

// childEnv names the role of a child process; childConfigEnv carries its
// childConfig as JSON.
const (
	childEnv       = "INBOX_PERIODIC_CHILD"
	childConfigEnv = "INBOX_PERIODIC_CHILD_CONFIG"
)

// childConfig is what a scheduler process is told.
type childConfig struct {
	Engine, DSN, Jobs, State string
	// Entries are tick intervals by entry name, each with Backfill(1e6):
	// no tick is ever passed over, so that every one must be enqueued.
	Entries map[string]time.Duration
	// Hold makes the first COMMIT block for good once it is due: the
	// process says "holding" and waits, its compare-and-set and jobs sent
	// and not committed, its locks held, to be killed.
	Hold bool
}

func (c childConfig) entries() ([]periodic.Entry, error) {
	var out []periodic.Entry
	for name, d := range c.Entries {
		s, err := periodic.Every(d)
		if err != nil {
			return nil, err
		}
		out = append(out, entry(name, s, periodic.Backfill(1e6)))
	}
	return out, nil
}

// childMain runs a child's role and returns its exit code.
func childMain(role string) int {
	if err := childRun(role); err != nil {
		fmt.Fprintf(os.Stderr, "child %s (pid %d): %v\n", role, os.Getpid(), err)
		return 2
	}
	return 0
}

func childRun(role string) error {
	if role != "scheduler" {
		return fmt.Errorf("unknown role %q", role)
	}
	var cfg childConfig
	if err := json.Unmarshal([]byte(os.Getenv(childConfigEnv)), &cfg); err != nil {
		return fmt.Errorf("%s: %v", childConfigEnv, err)
	}
	e, err := engineNamed(cfg.Engine)
	if err != nil {
		return err
	}
	var once sync.Once
	hold := func(call, _ string) error {
		if cfg.Hold && call == "commit" {
			once.Do(func() {
				fmt.Println("holding")
				select {} // until killed
			})
		}
		return nil
	}
	db, _, err := openCounted(e, cfg.DSN, hold)
	if err != nil {
		return err
	}
	defer db.Close()
	q, err := newQueue(e, db, cfg.Jobs)
	if err != nil {
		return err
	}
	entries, err := cfg.entries()
	if err != nil {
		return err
	}
	s, err := periodic.New(q, db, periodic.Config{Table: cfg.State, Entries: entries, OnError: func(err error) {
		fmt.Fprintln(os.Stderr, "OnError:", err)
	}})
	if err != nil {
		return err
	}
	// Stop once the parent closes stdin, or goes away.
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	fmt.Println("ready")
	return s.Run(ctx)
}

// child is a scheduler process.
type child struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	done   chan struct{}
	err    error
	stderr syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// startChild starts a scheduler process of cfg, killed if still running
// when the test ends, or when this process dies.
func startChild(t *testing.T, name string, cfg childConfig) *child {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := &child{name: name, lines: make(chan string, 16), done: make(chan struct{})}
	c.cmd = exec.Command(exe, "-test.run=^$")
	c.cmd.Env = append(os.Environ(), childEnv+"=scheduler", childConfigEnv+"="+string(js))
	c.cmd.Stderr = &c.stderr
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
		c.err = c.cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		<-c.done
	})
	return c
}

// expect waits for the line want from c, failing t after a minute or when
// c exits first.
func (c *child) expect(t *testing.T, want string) {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				<-c.done
				t.Fatalf("%s exited (%v) before saying %q; stderr:\n%s", c.name, c.err, want, c.stderr.String())
			}
			if l == want {
				return
			}
		case <-deadline:
			t.Fatalf("%s did not say %q within a minute; stderr:\n%s", c.name, want, c.stderr.String())
		}
	}
}

// kill kills c with SIGKILL: no deferred call, no rollback of its own.
func (c *child) kill(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-c.done
}

// stop asks c to stop and fails t unless it exits cleanly, its OnError
// silent.
func (c *child) stop(t *testing.T) {
	t.Helper()
	c.stdin.Close()
	select {
	case <-c.done:
	case <-time.After(time.Minute):
		t.Fatalf("%s did not stop within a minute", c.name)
	}
	if c.err != nil || strings.TrimSpace(c.stderr.String()) != "" {
		t.Errorf("%s: exit %v; stderr:\n%s", c.name, c.err, c.stderr.String())
	}
}

// Scheduler processes on the real clock, an entry ticking every 100 ms:
// the first one is killed with SIGKILL while its COMMIT is due (its
// compare-and-set and its jobs sent, its locks held), while two more wait on
// those locks; a third is killed at an arbitrary moment later and replaced.
// Each entry's every tick, from its registration to its last tick, is
// enqueued exactly once.
func TestKilledProcesses(t *testing.T) {
	forEach(t, func(t *testing.T, v *env) {
		cfg := childConfig{Engine: v.e.name, DSN: v.dsn, Jobs: v.jobs, State: v.state,
			Entries: map[string]time.Duration{"a": 100 * time.Millisecond, "b": 100 * time.Millisecond, "c": 300 * time.Millisecond}}
		entries, err := cfg.entries()
		if err != nil {
			t.Fatal(err)
		}
		// The test registers the entries itself, so that it knows from
		// when the ticks run.
		registered := time.Now().UTC().Truncate(time.Second)
		v.register(t, registered, "a", "b", "c")

		holder := cfg
		holder.Hold = true
		h := startChild(t, "holder", holder)
		h.expect(t, "holding")
		others := []*child{startChild(t, "second", cfg), startChild(t, "third", cfg)}
		for _, c := range others {
			c.expect(t, "ready")
		}
		h.kill(t)

		// The survivors carry on; one of them dies at some point and a
		// new process takes its place.
		watch := v.scheduler(t, v.admin, nil, nil, entries, nil)
		v.waitTicks(t, watch, time.Now().Add(500*time.Millisecond))
		others[0].kill(t)
		others = append(others[1:], startChild(t, "fourth", cfg))
		others[1].expect(t, "ready")
		v.waitTicks(t, watch, time.Now().Add(time.Second))
		for _, c := range others {
			c.stop(t)
		}

		lasts := v.lastTicks(t, watch)
		want := map[string][]time.Time{}
		for _, e := range entries {
			want[e.Name] = ticksBetween(e.Schedule, registered, lasts[e.Name])
		}
		v.wantTicks(t, want)
	})
}

// register inserts the state rows of names with last tick at, as a
// scheduler's start would.
func (v *env) register(t *testing.T, at time.Time, names ...string) {
	t.Helper()
	mark := dialect.Question
	if v.e.name == "postgres" {
		mark = dialect.Dollar
	}
	for _, n := range names {
		q := fmt.Sprintf("INSERT INTO %s (name, last_tick) VALUES (%s, %s)", v.state, mark(1), mark(2))
		if _, err := v.admin.Exec(q, n, v.e.dialect.TimeArg(at)); err != nil {
			t.Fatal(err)
		}
	}
}

// waitTicks polls the state table, every 20 ms for a minute at most, until
// each entry's last tick is at least at.
func (v *env) waitTicks(t *testing.T, s *periodic.Scheduler, at time.Time) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		done := true
		for _, st := range mustEntries(t, s) {
			done = done && !st.Last.Before(at)
		}
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the entries' last ticks %v did not reach %v within a minute", mustEntries(t, s), at)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func mustEntries(t *testing.T, s *periodic.Scheduler) []periodic.EntryState {
	t.Helper()
	states, err := s.Entries(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return states
}
