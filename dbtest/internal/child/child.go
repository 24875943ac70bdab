// Package child runs the test binary again as a worker process, which a
// test reads line by line, asks to stop or kills: the crash and load
// tests' workers (dbtest) and the Galera suite's (dbtest/galera). The
// binary tells itself a worker from a test run by the environment the test
// gives it.
package child

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"
)

// StopContext returns, in a worker process, a context cancelled once the
// parent closes the worker's stdin: it asks the worker to stop, or it went
// away and no orphan should linger.
func StopContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	return ctx, cancel
}

// Proc is a running worker process.
type Proc struct {
	Name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string // stdout, line by line; closed at EOF
	stderr syncBuffer
	done   chan struct{} // closed once it exited
	err    error         // Wait's result, set before done closes
}

// Start starts the test binary with env added to this process's
// environment and attr, when not nil, as its attributes (Pdeathsig, say).
// -test.run matches nothing, should the worker's switch ever be missed.
// The process is killed, if still running, when the test ends.
func Start(t testing.TB, name string, attr *syscall.SysProcAttr, env ...string) *Proc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := &Proc{Name: name, lines: make(chan string, 64), done: make(chan struct{})}
	p.cmd = exec.Command(exe, "-test.run=^$")
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stderr = &p.stderr
	p.cmd.SysProcAttr = attr
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
		// Wait only after stdout is read to its end, as os/exec asks.
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		if !p.Exited() {
			p.Kill()
		}
	})
	return p
}

// Line waits for the next line the worker prints, failing t if it exits or
// timeout passes first.
func (p *Proc) Line(t testing.TB, timeout time.Duration) string {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case l, ok := <-p.lines:
		if !ok {
			<-p.done
			t.Fatalf("%s exited (%v) before printing a line; stderr:\n%s", p.Name, p.err, p.Stderr())
		}
		return l
	case <-timer.C:
		t.Fatalf("%s printed nothing in %v; stderr:\n%s", p.Name, timeout, p.Stderr())
	}
	return ""
}

// Stdin is the worker's standard input.
func (p *Proc) Stdin() io.Writer { return p.stdin }

// Stderr returns what the worker wrote to its standard error so far.
func (p *Proc) Stderr() string { return p.stderr.String() }

// Done is closed once the worker exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is the worker's exit error, once Done is closed.
func (p *Proc) Err() error { return p.err }

// Exited reports whether the worker has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Kill sends SIGKILL and waits for the process to be gone.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Kill()
	for range p.lines {
		// Drain what it printed so that the reader can reach Wait.
	}
	<-p.done
}

// Stop closes the worker's stdin, its signal to finish, and waits up to
// timeout for it to exit, returning its exit error.
func (p *Proc) Stop(timeout time.Duration) error {
	p.stdin.Close()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	go func() {
		for range p.lines {
		}
	}()
	select {
	case <-p.done:
		return p.err
	case <-timer.C:
		p.Kill()
		return fmt.Errorf("%s did not exit within %v of being asked to stop", p.Name, timeout)
	}
}

// syncBuffer is a bytes.Buffer safe for the writer os/exec runs.
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
