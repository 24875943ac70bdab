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

	"github.com/sqlinbox/inbox/dbtest/internal/cluster"
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
	if err := cluster.BecomeSubreaper(); err != nil {
		return nil, err
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
	for _, pid := range cluster.Children(os.Getpid()) {
		if r.ours[pid] || cluster.ProcState(pid) != 'Z' {
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

// start starts cmd, which its Proc waits for: the reaper leaves it alone
// until then.
func (r *reaper) start(cmd *exec.Cmd) (*cluster.Proc, error) {
	r.mu.Lock()
	p, err := cluster.Start(cmd)
	if err == nil {
		r.ours[cmd.Process.Pid] = true
	}
	r.mu.Unlock()
	if err != nil {
		return nil, err
	}
	go func() {
		<-p.Done()
		r.mu.Lock()
		delete(r.ours, cmd.Process.Pid)
		r.mu.Unlock()
	}()
	return p, nil
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
	if err != nil || cluster.ProcState(pid) == 0 || cluster.ProcState(pid) == 'Z' {
		return 0
	}
	return pid
}

// crashPostgres kills a postmaster and every child of it at once with
// SIGKILL, as a machine's crash would (cluster.KillPostmaster), and waits
// until the reaper has collected them.
func crashPostgres(pid int) error {
	kids, err := cluster.KillPostmaster(pid)
	if err != nil {
		return err
	}
	return waitGone(append(kids, pid), 30*time.Second)
}

// waitGone polls until every pid is gone (the reaper collects them).
func waitGone(pids []int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, p := range pids {
		for cluster.ProcState(p) != 0 {
			if time.Now().After(deadline) {
				return fmt.Errorf("process %d still there (state %c) %v after its kill", p, cluster.ProcState(p), timeout)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return nil
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
		if err != nil || cluster.ProcState(pid) != 0 {
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
			cluster.RemoveSharedMemory(data)
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
