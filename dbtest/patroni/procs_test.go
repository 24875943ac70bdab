package patroni

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Patroni starts each postmaster the way pg_ctl does, through a process
// that exits at once: the postmaster is orphaned and its parent becomes the
// nearest subreaper, else PID 1, which may reap nothing (it does not on
// this machine). A postmaster that exits then stays a zombie, and Patroni,
// which waits for a stopped postmaster by polling for its PID, waits for
// ever. So this process makes itself a child subreaper: the postmasters,
// and their children once a kill orphans them, become its children, and
// the reaper collects them. It collects only processes it did not start
// itself (exec.Cmd waits for those), so a start and the reaper's scan never
// interleave (mu).

// reaper collects the zombies orphaned to this process.
type reaper struct {
	mu   sync.Mutex
	ours map[int]bool // pids of exec.Cmd processes, waited for by their Cmd
	stop chan struct{}
	done chan struct{}
}

// reapEvery is how often the reaper looks for zombies: a background
// chore, short so that Patroni's wait for a stopped postmaster ends soon.
const reapEvery = 20 * time.Millisecond

func newReaper() (*reaper, error) {
	const prSetChildSubreaper = 36
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		return nil, fmt.Errorf("PR_SET_CHILD_SUBREAPER: %v", errno)
	}
	r := &reaper{ours: map[int]bool{}, stop: make(chan struct{}), done: make(chan struct{})}
	go r.loop()
	return r, nil
}

func (r *reaper) loop() {
	defer close(r.done)
	tick := time.NewTicker(reapEvery)
	defer tick.Stop()
	for {
		select {
		case <-r.stop:
			r.reap()
			return
		case <-tick.C:
			r.reap()
		}
	}
}

// reap waits for every zombie child this process did not start.
func (r *reaper) reap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, pid := range children(os.Getpid()) {
		if r.ours[pid] || procState(pid) != 'Z' {
			continue
		}
		var ws syscall.WaitStatus
		_, _ = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
	}
}

// close stops the reaper after a last round.
func (r *reaper) close() {
	close(r.stop)
	<-r.done
}

// start starts cmd, and returns a channel closed once cmd has exited and
// been waited for.
func (r *reaper) start(cmd *exec.Cmd) (<-chan struct{}, error) {
	r.mu.Lock()
	err := cmd.Start()
	if err == nil {
		r.ours[cmd.Process.Pid] = true
	}
	r.mu.Unlock()
	if err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		r.mu.Lock()
		delete(r.ours, cmd.Process.Pid)
		r.mu.Unlock()
		close(done)
	}()
	return done, nil
}

// procState is the state letter of a process (R, S, T, Z …), 0 if gone.
func procState(pid int) byte {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// pid (comm) state ppid …: comm may hold spaces and parentheses.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return 0
	}
	return s[i+2]
}

// children lists the processes whose parent is pid.
func children(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var kids []int
	want := strconv.Itoa(pid)
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(data)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		if f := strings.Fields(s[i+1:]); len(f) > 1 && f[1] == want {
			kids = append(kids, p)
		}
	}
	return kids
}

// postmasterPID reads the running postmaster's pid from its data
// directory, 0 when there is none.
func postmasterPID(data string) int {
	b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || procState(pid) == 0 || procState(pid) == 'Z' {
		return 0
	}
	return pid
}

// crashPostgres kills a postmaster and every child of it at once with
// SIGKILL, as a machine's crash would: the postmaster is stopped first, so
// that it forks nothing while its children are listed. Each child leads a
// session of its own, so no process group reaches them all.
func crashPostgres(pid int) error {
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for procState(pid) != 'T' {
		if time.Now().After(deadline) {
			return fmt.Errorf("postmaster %d not stopped after SIGSTOP (state %c)", pid, procState(pid))
		}
		time.Sleep(time.Millisecond)
	}
	kids := children(pid)
	for _, k := range kids {
		_ = syscall.Kill(k, syscall.SIGKILL)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return err
	}
	return waitGone(append(kids, pid), 30*time.Second)
}

// waitGone polls until every pid is gone (the reaper collects them).
func waitGone(pids []int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, p := range pids {
		for procState(p) != 0 {
			if time.Now().After(deadline) {
				return fmt.Errorf("process %d still there (state %c) %v after its kill", p, procState(p), timeout)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return nil
}

// removeSharedMemory removes the System V segment a killed postmaster
// leaves (the 7th line of postmaster.pid names it), before its data
// directory is deleted: nothing else would.
func removeSharedMemory(data string) {
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
		// In use: a segment by that id now is another server's.
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

// sweepOrphans clears what an earlier run of this suite left behind when
// it ran no cleanup (a test binary killed by its -timeout): postmasters
// still running (one outlives its Patroni), the shared memory of those it
// had killed, and their directories. A run's directory is found by the
// owner file startCluster writes into it, naming the test process; one
// whose process is gone is cleared. Nothing else is touched: a postmaster
// is stopped only when its command line names a data directory there.
func sweepOrphans() {
	owners, _ := filepath.Glob(filepath.Join(os.TempDir(), "TestPatroni*", "*", ownerFile))
	for _, f := range owners {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || procState(pid) != 0 {
			continue
		}
		base := filepath.Dir(f)
		datas, _ := filepath.Glob(filepath.Join(base, "m*", "data"))
		cleared := true
		for _, data := range datas {
			if pm := postmasterPID(data); pm != 0 && runsOn(pm, data) {
				_ = syscall.Kill(pm, syscall.SIGQUIT) // immediate shutdown: it removes its shared memory
				cleared = cleared && waitGone([]int{pm}, 30*time.Second) == nil
				continue
			}
			removeSharedMemory(data)
		}
		if cleared {
			_ = os.RemoveAll(filepath.Dir(base))
		}
	}
}

// ownerFile, in a run's directory, names the test process that owns it.
const ownerFile = "owner"

// runsOn reports whether process pid is a postgres on data.
func runsOn(pid int, data string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	args := strings.Split(string(b), "\x00")
	for i, a := range args {
		if a == "-D" && i+1 < len(args) && args[i+1] == data {
			return true
		}
	}
	return false
}
