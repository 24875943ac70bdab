package cluster

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ServerAttr starts a server as cred (nil: as this process) leading a
// process group of its own, so that a kill of the group takes the helpers
// it starts along (state-transfer scripts, Patroni's children) and the
// terminal's Ctrl-C does not reach it, and killed should this process die
// without cleaning up (Pdeathsig: Go sets it after the change of user,
// which would clear it).
func ServerAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: cred}
}

// Proc is a started process whose exit a test waits for.
type Proc struct {
	Cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start starts cmd and waits for it in the background, so that Done and
// Running answer without blocking.
func Start(cmd *exec.Cmd) (*Proc, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Proc{Cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Done is closed once the process exited and was waited for.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is the process's Wait result, once Done is closed.
func (p *Proc) Err() error { return p.err }

// Running reports whether the process has not exited yet.
func (p *Proc) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Exited waits up to timeout for the process to exit, and reports whether
// it did.
func (p *Proc) Exited(timeout time.Duration) bool {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-p.done:
		return true
	case <-timer.C:
		return false
	}
}

// SignalGroup sends sig to the process group the process leads
// (ServerAttr).
func (p *Proc) SignalGroup(sig syscall.Signal) error {
	return syscall.Kill(-p.Cmd.Process.Pid, sig)
}

// KillGroup kills the process's group with SIGKILL and waits up to timeout
// for the process to be gone.
func (p *Proc) KillGroup(timeout time.Duration) error {
	_ = p.SignalGroup(syscall.SIGKILL)
	if !p.Exited(timeout) {
		return fmt.Errorf("pid %d still running %v after SIGKILL", p.Cmd.Process.Pid, timeout)
	}
	return nil
}

// BecomeSubreaper makes this process a child subreaper: orphans of its
// descendants (a killed postmaster's children, a postmaster whose pg_ctl
// exited) become its children, to be reaped by it rather than left as
// zombies under an init that may reap none.
func BecomeSubreaper() error {
	const prSetChildSubreaper = 36
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		return fmt.Errorf("PR_SET_CHILD_SUBREAPER: %v", errno)
	}
	return nil
}

// KillPostmaster kills a postmaster and every child of it at once with
// SIGKILL, as a machine's crash would, and returns the children it killed
// for the caller to wait for. The postmaster is stopped first, so that it
// forks nothing while its children are listed. Each child makes itself a
// session leader (InitPostmasterChild), so no process group reaches them
// all: they are found by their parent.
func KillPostmaster(pid int) ([]int, error) {
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(10 * time.Second)
	for ProcState(pid) != 'T' {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("postmaster %d not stopped after SIGSTOP (state %c)", pid, ProcState(pid))
		}
		time.Sleep(time.Millisecond)
	}
	kids := Children(pid)
	for _, k := range kids {
		_ = syscall.Kill(k, syscall.SIGKILL)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return kids, err
	}
	return kids, nil
}

// RemoveSharedMemory removes the System V segment a killed postmaster
// leaves (the 7th line of postmaster.pid in data names it): nothing else
// would. A segment still attached is left: by that id now, it is another
// server's.
func RemoveSharedMemory(data string) {
	b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		return
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < 7 {
		return
	}
	f := strings.Fields(lines[6])
	if len(f) != 2 {
		return
	}
	id, err := strconv.Atoi(f[1])
	if err != nil || id < 0 || attached(id) != 0 {
		return
	}
	const ipcRmid = 0
	_, _, _ = syscall.Syscall(syscall.SYS_SHMCTL, uintptr(id), ipcRmid, 0)
}

// attached is how many processes have System V segment id attached
// (/proc/sysvipc/shm), -1 when there is no such segment.
func attached(id int) int {
	b, err := os.ReadFile("/proc/sysvipc/shm")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n")[1:] {
		// key shmid perms size cpid lpid nattch …
		f := strings.Fields(line)
		if len(f) > 6 && f[1] == strconv.Itoa(id) {
			n, err := strconv.Atoi(f[6])
			if err != nil {
				return -1
			}
			return n
		}
	}
	return -1
}

// statFields are the fields of /proc/pid/stat after the command name
// (state, ppid, …), nil when the process is gone. The name is cut at the
// last parenthesis: it may hold spaces and parentheses.
func statFields(pid string) []string {
	data, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return nil
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(s[i+1:])
}

// ProcState is the state letter of a process (R, S, T, Z …), 0 if gone.
func ProcState(pid int) byte {
	f := statFields(strconv.Itoa(pid))
	if len(f) == 0 || f[0] == "" {
		return 0
	}
	return f[0][0]
}

// Children lists the processes whose parent is pid.
func Children(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	want := strconv.Itoa(pid)
	var kids []int
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f := statFields(e.Name()); len(f) > 1 && f[1] == want {
			kids = append(kids, p)
		}
	}
	return kids
}

// WaitAnswer polls, every every, until db answers SELECT 1, returning nil,
// or until p exits or timeout passes, returning why with the last error:
// a server is ready once it answers, whatever its log says.
func WaitAnswer(db *sql.DB, p *Proc, timeout, every time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := db.QueryRowContext(ctx, "SELECT 1").Scan(new(int))
		cancel()
		if err == nil {
			return nil
		}
		if !p.Running() {
			return fmt.Errorf("exited (%s): %v", p.Cmd.ProcessState, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer within %v: %v", timeout, err)
		}
		time.Sleep(every)
	}
}
