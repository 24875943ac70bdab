package cluster

import (
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
)

// recorder is a testing.TB whose Fatalf and Skipf end the calling
// goroutine, as the real ones do, and record how.
type recorder struct {
	testing.TB
	ended string // "fatal: …" or "skip: …"
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.ended = "fatal: " + fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (r *recorder) Skipf(format string, args ...any) {
	r.ended = "skip: " + fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run calls f on a recorder in a goroutine of its own, for Goexit.
func run(t *testing.T, f func(tb testing.TB)) string {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	return r.ended
}

func TestRequireSkipsOrFails(t *testing.T) {
	s := Suite{Short: "x", Name: "the X suite"}
	missing := errors.New("xd not found")
	t.Setenv("INBOX_REQUIRE_DBS", "")
	if got := run(t, func(tb testing.TB) { s.Require(tb, nil) }); got != "" {
		t.Errorf("nothing missing: ended %q, want it to go on", got)
	}
	got := run(t, func(tb testing.TB) { s.Require(tb, missing) })
	if want := "skip: x: xd not found: skipping the X suite (INBOX_REQUIRE_DBS=1 makes this a failure)"; got != want {
		t.Errorf("missing tool: %q, want %q", got, want)
	}
	t.Setenv("INBOX_REQUIRE_DBS", "1")
	got = run(t, func(tb testing.TB) { s.Require(tb, missing) })
	if want := "fatal: x: xd not found, and INBOX_REQUIRE_DBS=1: the X suite must run"; got != want {
		t.Errorf("missing tool under INBOX_REQUIRE_DBS=1: %q, want %q", got, want)
	}
}

func TestPollReturnsOnceNilAndFailsAtDeadline(t *testing.T) {
	calls := 0
	got := run(t, func(tb testing.TB) {
		Eventually(tb, time.Minute, "three calls", func() error {
			if calls++; calls < 3 {
				return errors.New("not yet")
			}
			return nil
		})
	})
	if got != "" || calls != 3 {
		t.Errorf("ended %q after %d calls, want nothing after 3", got, calls)
	}
	got = run(t, func(tb testing.TB) {
		Poll(tb, 0, time.Millisecond, "never", func() error { return errors.New("still not") })
	})
	if want := "fatal: waited 0s for never: still not"; got != want {
		t.Errorf("deadline: %q, want %q", got, want)
	}
}

func TestTailAndFileExists(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "log")
	if err := os.WriteFile(p, []byte("a\nb\nc\nd\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := Tail(p, 2); got != "c\nd" {
		t.Errorf("Tail(2) = %q, want %q", got, "c\nd")
	}
	if got := Tail(p, 10); got != "a\nb\nc\nd" {
		t.Errorf("Tail(10) = %q", got)
	}
	if got := Tail(filepath.Join(dir, "none"), 2); !strings.Contains(got, "no such file") {
		t.Errorf("Tail of a missing file = %q, want the error", got)
	}
	if !FileExists(p) || FileExists(dir) || FileExists(filepath.Join(dir, "none")) {
		t.Errorf("FileExists: file %v, directory %v, missing %v; want true, false, false",
			FileExists(p), FileExists(dir), FileExists(filepath.Join(dir, "none")))
	}
}

func TestEnvDropsWhatPointsElsewhere(t *testing.T) {
	t.Setenv("PGHOST", "elsewhere")
	t.Setenv("ETCDCTL_API", "2")
	t.Setenv("LC_TIME", "de_DE")
	t.Setenv("INBOX_KEEP", "1")
	env := Env("/home/x", "PG", "ETCD")
	for _, kv := range env {
		for _, bad := range []string{"PGHOST=", "ETCDCTL_API=", "LC_TIME=", "HOME=/root"} {
			if strings.HasPrefix(kv, bad) {
				t.Errorf("Env kept %s", kv)
			}
		}
	}
	for _, want := range []string{"HOME=/home/x", "LC_ALL=C", "INBOX_KEEP=1"} {
		if !slices.Contains(env, want) {
			t.Errorf("Env lacks %s: %v", want, env)
		}
	}
}

func TestFormTable(t *testing.T) {
	if tb := FormTable("q", "lease"); tb.LockedUntil != "locked_until" || tb.DeadTable != "q_dead" || tb.NotBefore != "" {
		t.Errorf("lease: %+v", tb)
	}
	if tb := FormTable("q", "rowlock"); tb.NotBefore != "not_before" || tb.LockedUntil != "" || tb.AdvisoryKey != "" {
		t.Errorf("rowlock: %+v", tb)
	}
	if tb := FormTable("q", "advisory"); tb.AdvisoryKey != "id" || tb.NotBefore != "not_before" {
		t.Errorf("advisory: %+v", tb)
	}
}

// TestKillGroupEndsTheGroup starts a shell leading a group with a child of
// its own, and checks that the kill of the group ends both.
func TestKillGroupEndsTheGroup(t *testing.T) {
	cmd := exec.Command("sh", "-c", "sleep 300 & wait")
	cmd.SysProcAttr = ServerAttr(nil)
	p, err := Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	var kid int
	Eventually(t, time.Minute, "the shell's child", func() error {
		kids := Children(cmd.Process.Pid)
		if len(kids) != 1 {
			return fmt.Errorf("children %v", kids)
		}
		kid = kids[0]
		return nil
	})
	if !p.Running() || ProcState(cmd.Process.Pid) == 0 {
		t.Fatalf("running %v, state %c; want a running shell", p.Running(), ProcState(cmd.Process.Pid))
	}
	if err := p.KillGroup(time.Minute); err != nil {
		t.Fatal(err)
	}
	if p.Running() || p.Err() == nil {
		t.Errorf("after KillGroup: running %v, Wait's error %v; want exited, killed", p.Running(), p.Err())
	}
	Eventually(t, time.Minute, "the child to be gone", func() error {
		if s := ProcState(kid); s != 0 && s != 'Z' {
			return fmt.Errorf("child %d in state %c", kid, s)
		}
		return nil
	})
}

// TestKillPostmasterKillsParentAndChildren plays a postmaster with a shell
// whose children lead sessions of their own, as PostgreSQL's do, so that
// only their parent finds them.
func TestKillPostmasterKillsParentAndChildren(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Fatalf("setsid: %v", err)
	}
	cmd := exec.Command("sh", "-c", "setsid sleep 300 & setsid sleep 300 & wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p, err := Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	Eventually(t, time.Minute, "two children", func() error {
		if kids := Children(cmd.Process.Pid); len(kids) != 2 {
			return fmt.Errorf("children %v", kids)
		}
		return nil
	})
	kids, err := KillPostmaster(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if len(kids) != 2 {
		t.Errorf("killed children %v, want two", kids)
	}
	if !p.Exited(time.Minute) {
		t.Fatal("the parent runs on after KillPostmaster")
	}
	Eventually(t, time.Minute, "the children to be gone", func() error {
		for _, k := range kids {
			if s := ProcState(k); s != 0 && s != 'Z' {
				return fmt.Errorf("child %d in state %c", k, s)
			}
		}
		return nil
	})
}

func TestServerAccountAndChown(t *testing.T) {
	as, err := ServerAccount("no-such-account-inbox", "root")
	if err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() != 0 {
		if as.Cred != nil {
			t.Errorf("not root: %+v, want this process's own account", as)
		}
		return
	}
	if as.Cred == nil || as.UID != 0 || len(as.Cred.Groups) != 0 {
		t.Errorf("root's account: %+v, want uid 0 and no supplementary groups", as)
	}
	if _, err := ServerAccount("no-such-account-inbox"); !IsUnknownUser(err) {
		t.Errorf("no account: %v, want an unknown user error", err)
	}
	dir := TempDir(t)
	st, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o755 {
		t.Errorf("TempDir: mode %v, want 0755", st.Mode().Perm())
	}
	if err := as.ChownTree(dir); err != nil {
		t.Error(err)
	}
}

// TestWaitAnswerSaysWhyNot checks WaitAnswer's two failures on a port
// nothing listens on: the process exited, or the deadline passed. Its
// success is every cluster suite's boot.
func TestWaitAnswerSaysWhyNot(t *testing.T) {
	db, err := sql.Open("pgx", fmt.Sprintf("host=127.0.0.1 port=%d user=x connect_timeout=5", FreePort(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	exited, err := Start(exec.Command("true"))
	if err != nil {
		t.Fatal(err)
	}
	<-exited.Done()
	if err := WaitAnswer(db, exited, time.Minute, time.Millisecond); err == nil || !strings.HasPrefix(err.Error(), "exited (exit status 0)") {
		t.Errorf("exited process: %v, want it named", err)
	}
	cmd := exec.Command("sleep", "300")
	running, err := Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); <-running.Done() }()
	if err := WaitAnswer(db, running, 0, time.Millisecond); err == nil || !strings.HasPrefix(err.Error(), "no answer within 0s") {
		t.Errorf("deadline: %v, want it named", err)
	}
}
