package failover

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The cluster is a PostgreSQL primary and its streaming standby, synchronous
// (synchronous_commit=on with the standby in synchronous_standby_names) or
// asynchronous,
// both on 127.0.0.1 on free ports, in data directories of a temporary
// directory, started by the test and gone when it ends. It never touches a
// server it did not start: the ports are fresh, the Unix sockets live in the
// temporary directory, and no DSN is read from the environment.
//
// Every setting is passed on the server's command line, none is written to a
// configuration file, so that pg_basebackup copies nothing of the primary's
// into the standby: promoted, the standby has no synchronous_standby_names
// and commits without waiting for a standby it no longer has.

// serverWait bounds how long a server may take to start, a base backup to
// finish, or a promotion to complete: generous, a deadline for a failure on
// a loaded machine, not a duration the test expects.
const serverWait = 2 * time.Minute

// pgBinaries is where PostgreSQL's server programs are and who runs them.
type pgBinaries struct {
	dir     string
	version string
	// cred is the postgres account's when this process is root (the server
	// refuses to run as root), nil otherwise.
	cred *syscall.Credential
}

// findPostgres locates initdb, pg_basebackup and postgres: INBOX_PG_BIN, or
// the newest /usr/lib/postgresql/N/bin holding all three. Without them the
// test skips, saying why, or fails under INBOX_REQUIRE_DBS=1.
func findPostgres(t *testing.T) pgBinaries {
	t.Helper()
	need := []string{"initdb", "pg_basebackup", "postgres"}
	has := func(dir string) bool {
		for _, p := range need {
			if fi, err := os.Stat(filepath.Join(dir, p)); err != nil || fi.IsDir() {
				return false
			}
		}
		return true
	}
	dir := os.Getenv("INBOX_PG_BIN")
	if dir == "" {
		cands, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
		sort.Slice(cands, func(i, j int) bool { return pgMajor(cands[i]) > pgMajor(cands[j]) })
		for _, c := range cands {
			if has(c) {
				dir = c
				break
			}
		}
	}
	if dir == "" || !has(dir) {
		where := "INBOX_PG_BIN=" + dir
		if dir == "" {
			where = "INBOX_PG_BIN unset and no /usr/lib/postgresql/*/bin"
		}
		unavailable(t, "PostgreSQL's server programs (%s) not found (%s)", strings.Join(need, ", "), where)
	}
	b := pgBinaries{dir: dir, version: filepath.Base(filepath.Dir(dir))}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			unavailable(t, "running as root, and no postgres account to run PostgreSQL's servers as: %v", err)
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil {
			t.Fatalf("postgres account: uid %q gid %q", u.Uid, u.Gid)
		}
		b.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}
	}
	return b
}

// pgMajor is the version number in /usr/lib/postgresql/N/bin, 0 if none.
func pgMajor(bin string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(bin)), 64)
	return v
}

// unavailable skips t, or fails it under INBOX_REQUIRE_DBS=1 (CI), where
// the suite must run.
func unavailable(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("INBOX_REQUIRE_DBS") == "1" {
		t.Fatalf("%s; INBOX_REQUIRE_DBS=1: the failover suite must run", msg)
	}
	t.Skipf("%s: skipping the failover suite (INBOX_REQUIRE_DBS=1 makes this a failure)", msg)
}

// command prepares one of the programs, run in dir as the server's account,
// killed should this process die first.
func (b pgBinaries) command(dir, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(b.dir, name), args...)
	cmd.Dir = dir
	env := []string{"HOME=" + dir, "LC_ALL=C"}
	for _, kv := range os.Environ() {
		// No PG* variable (PGHOST, PGPORT, PGDATA …) may point a program
		// at another server, and HOME and the locale are set above.
		if !strings.HasPrefix(kv, "PG") && !strings.HasPrefix(kv, "HOME=") && !strings.HasPrefix(kv, "LC_") && !strings.HasPrefix(kv, "LANG") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: b.cred, Pdeathsig: syscall.SIGKILL}
	return cmd
}

// run runs a program to its end, failing t with its output if it fails.
func (b pgBinaries) run(t *testing.T, dir, name string, args ...string) {
	t.Helper()
	cmd := b.command(dir, name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	timer := time.NewTimer(serverWait)
	defer timer.Stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out.String())
		}
	case <-timer.C:
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%s did not finish within %v\n%s", name, serverWait, out.String())
	}
}

// cluster is a primary and its standby.
type cluster struct {
	bin              pgBinaries
	base             string // the temporary directory, the sockets' too
	primary, standby *pgNode
	sync             bool // the standby is synchronous
}

// pgNode is one running server.
type pgNode struct {
	name string
	data string
	port int
	log  string // its server log
	cmd  *exec.Cmd
	done chan struct{} // closed once the postmaster was reaped
}

// standbyName is the standby's cluster_name, and so its application_name
// on the primary, where synchronous_standby_names names it.
const standbyName = "standby"

// startCluster makes the primary (initdb), the standby (pg_basebackup with
// a replication slot) and waits until the primary reports the standby as
// streaming, synchronously when sync is set (else asynchronously: the
// primary commits without waiting for it). Everything is stopped and removed
// when t ends.
func startCluster(t *testing.T, bin pgBinaries, sync bool) *cluster {
	t.Helper()
	base, err := os.MkdirTemp("", "inbox-failover-")
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{bin: bin, base: base, sync: sync}
	t.Cleanup(func() {
		for _, n := range []*pgNode{c.standby, c.primary} {
			if n != nil {
				if err := n.stop(); err != nil {
					t.Errorf("stopping the %s: %v", n.name, err)
				}
			}
		}
		if t.Failed() {
			for _, n := range []*pgNode{c.primary, c.standby} {
				if n != nil {
					t.Logf("%s's log (last lines):\n%s", n.name, tail(n.log, 40))
				}
			}
		}
		if err := os.RemoveAll(base); err != nil {
			t.Errorf("removing %s: %v", base, err)
		}
	})
	if bin.cred != nil {
		if err := os.Chown(base, int(bin.cred.Uid), int(bin.cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	primary := filepath.Join(base, "primary")
	bin.run(t, base, "initdb", "-D", primary, "-U", "postgres", "--auth=trust", "--encoding=UTF8",
		"--locale=C", "--no-sync", "--no-instructions")
	names := ""
	if sync {
		names = standbyName
	}
	c.primary = c.start(t, "primary", primary,
		"-c", "synchronous_standby_names="+names,
		"-c", "synchronous_commit=on")
	bin.run(t, base, "pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(c.primary.port), "-U", "postgres",
		"-D", filepath.Join(base, "standby"), "-X", "stream", "-c", "fast", "--no-sync",
		"-R", "-C", "-S", "failover_standby")
	c.standby = c.start(t, "standby", filepath.Join(base, "standby"),
		"-c", "cluster_name="+standbyName,
		"-c", "synchronous_standby_names=",
		"-c", "hot_standby=on")
	db := c.primary.open(t)
	eventually(t, serverWait, "the standby to stream", func() error {
		return c.checkSync(db)
	})
	return c
}

// checkSync returns an error unless the primary (through db) streams to
// the standby, synchronously or not as the cluster was made.
func (c *cluster) checkSync(db *sql.DB) error {
	var state, sync string
	err := db.QueryRow("SELECT state, sync_state FROM pg_stat_replication WHERE application_name = $1", standbyName).Scan(&state, &sync)
	if errors.Is(err, sql.ErrNoRows) {
		return errors.New("no standby connected")
	}
	if err != nil {
		return err
	}
	want := "async"
	if c.sync {
		want = "sync"
	}
	if state != "streaming" || sync != want {
		return fmt.Errorf("standby is %s, %s; want streaming, %s", state, sync, want)
	}
	return nil
}

// start starts a server on data on a free port and waits until it answers.
// A port taken between the choice and the bind is chosen again.
func (c *cluster) start(t *testing.T, name, data string, args ...string) *pgNode {
	t.Helper()
	for try := 1; ; try++ {
		n := &pgNode{name: name, data: data, port: freePort(t), log: filepath.Join(c.base, name+".log"), done: make(chan struct{})}
		logf, err := os.OpenFile(n.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		all := append([]string{"-D", data,
			"-c", "port=" + strconv.Itoa(n.port),
			"-c", "listen_addresses=127.0.0.1",
			"-c", "unix_socket_directories=" + c.base,
			// A killed process's writes stay in the kernel's page cache:
			// fsync guards only against the machine's crash, not tested.
			"-c", "fsync=off",
			"-c", "shared_buffers=16MB",
			"-c", "max_connections=120",
			"-c", "max_wal_senders=4",
			"-c", "wal_level=replica",
		}, args...)
		n.cmd = c.bin.command(c.base, "postgres", all...)
		n.cmd.Stdout, n.cmd.Stderr = logf, logf
		if err := n.cmd.Start(); err != nil {
			logf.Close()
			t.Fatalf("starting the %s: %v", name, err)
		}
		logf.Close()
		go func() {
			_ = n.cmd.Wait()
			close(n.done)
		}()
		err = n.waitReady()
		if err == nil {
			return n
		}
		<-n.done
		if try < 5 && strings.Contains(tail(n.log, 20), "could not bind") {
			continue
		}
		t.Fatalf("the %s did not start: %v\n%s", name, err, tail(n.log, 40))
	}
}

// freePort returns a port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// dsn is the node's own address alone.
func (n *pgNode) dsn() string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres sslmode=disable connect_timeout=5", n.port)
}

// waitReady polls until the server answers a query, it exits, or
// serverWait passes.
func (n *pgNode) waitReady() error {
	db, err := sql.Open("pgx", n.dsn())
	if err != nil {
		return err
	}
	defer db.Close()
	deadline := time.Now().Add(serverWait)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var one int
		err := db.QueryRowContext(ctx, "SELECT 1").Scan(&one)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-n.done:
			return fmt.Errorf("exited: %s", n.cmd.ProcessState)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer within %v: %v", serverWait, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// open opens a pool on this node alone, closed when t ends.
func (n *pgNode) open(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", n.dsn())
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(4)
	t.Cleanup(func() { db.Close() })
	return db
}

// multiHost is the workers' data source: both servers, first the primary,
// and only a read-write session will do.
func (c *cluster) multiHost() string {
	return fmt.Sprintf("host=127.0.0.1,127.0.0.1 port=%d,%d user=postgres dbname=postgres sslmode=disable "+
		"target_session_attrs=read-write connect_timeout=5", c.primary.port, c.standby.port)
}

// crash kills the node as a machine's crash would: every process of the
// server at once with SIGKILL, so that none writes, replicates or answers
// anything more. The postmaster is stopped first, so that it forks nothing
// while its children are listed; its children are killed, then it.
//
// Each server child makes itself a session leader (InitPostmasterChild), so
// no process group reaches them all: they are found by their parent. This
// process becomes a child subreaper, so that the killed children, orphaned
// with their postmaster, are this process's to reap rather than left as
// zombies under an init that may reap none.
func (n *pgNode) crash() error {
	select {
	case <-n.done:
		return fmt.Errorf("the %s had already exited", n.name)
	default:
	}
	const prSetChildSubreaper = 36
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		return fmt.Errorf("PR_SET_CHILD_SUBREAPER: %v", errno)
	}
	pid := n.cmd.Process.Pid
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
	<-n.done
	for _, k := range kids {
		reap(k)
	}
	n.removeSharedMemory()
	return nil
}

// stop ends the node, if still running, by an immediate shutdown (its data
// is thrown away), or by a crash if that does not end it in time.
func (n *pgNode) stop() error {
	select {
	case <-n.done:
		return nil
	default:
	}
	_ = syscall.Kill(n.cmd.Process.Pid, syscall.SIGQUIT)
	timer := time.NewTimer(30 * time.Second)
	defer timer.Stop()
	select {
	case <-n.done:
		return nil
	case <-timer.C:
		return n.crash()
	}
}

// removeSharedMemory removes the System V segment a killed postmaster
// leaves (the 7th line of postmaster.pid names it): nothing else would.
func (n *pgNode) removeSharedMemory() {
	data, err := os.ReadFile(filepath.Join(n.data, "postmaster.pid"))
	if err != nil {
		return
	}
	lines := strings.Split(string(data), "\n")
	if len(lines) < 7 {
		return
	}
	f := strings.Fields(lines[6])
	if len(f) != 2 {
		return
	}
	id, err := strconv.Atoi(f[1])
	if err != nil || id < 0 {
		return
	}
	const ipcRmid = 0
	_, _, _ = syscall.Syscall(syscall.SYS_SHMCTL, uintptr(id), ipcRmid, 0)
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
		f := strings.Fields(s[i+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			kids = append(kids, p)
		}
	}
	return kids
}

// reap waits for a killed orphan that this process, as its subreaper,
// inherited; it returns once the process is gone or is not this process's.
func reap(pid int) {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var ws syscall.WaitStatus
		got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		if got == pid || errors.Is(err, syscall.ECHILD) {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// promote ends the standby's recovery: pg_promote waits until it is a
// primary.
func (c *cluster) promote(db *sql.DB) error {
	ctx, cancel := context.WithTimeout(context.Background(), serverWait)
	defer cancel()
	var ok bool
	if err := db.QueryRowContext(ctx, "SELECT pg_promote(true, $1)", int(serverWait.Seconds())).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return errors.New("pg_promote returned false")
	}
	return nil
}

// tail returns the last n lines of a file, for a failure message.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// eventually polls f every 20 ms until it returns nil, failing t with f's
// last error after timeout.
func eventually(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s: %v", timeout, what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
