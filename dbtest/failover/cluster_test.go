package failover

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sqlinbox/inbox/dbtest/internal/cluster"
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

// suite names the failover suite in its skip messages and notices.
var suite = cluster.Suite{
	Pkg:   "dbtest/failover",
	Short: "failover",
	Name:  "the failover suite",
	Boots: "which starts a PostgreSQL primary and standby of its own (about two minutes)",
	Find:  func() error { _, err := findPostgres(); return err },
}

// pgPrograms are the server programs the suite runs.
var pgPrograms = []string{"initdb", "pg_basebackup", "postgres"}

// findPostgres locates initdb, pg_basebackup and postgres: INBOX_PG_BIN, or
// the newest /usr/lib/postgresql/N/bin holding all three, and the account
// to run them as.
func findPostgres() (pgBinaries, error) {
	dir := cluster.FindPgBin(pgPrograms...)
	if dir == "" {
		where := "INBOX_PG_BIN=" + os.Getenv("INBOX_PG_BIN")
		if os.Getenv("INBOX_PG_BIN") == "" {
			where = "INBOX_PG_BIN unset and no /usr/lib/postgresql/*/bin"
		}
		return pgBinaries{}, fmt.Errorf("PostgreSQL's server programs (%s) not found (%s)", strings.Join(pgPrograms, ", "), where)
	}
	as, err := cluster.ServerAccount("postgres")
	if err != nil {
		return pgBinaries{}, err
	}
	return pgBinaries{dir: dir, version: filepath.Base(filepath.Dir(dir)), cred: as.Cred}, nil
}

// requirePostgres returns the server programs, or skips t saying what is
// missing (a failure under INBOX_REQUIRE_DBS=1).
func requirePostgres(t *testing.T) pgBinaries {
	t.Helper()
	b, err := findPostgres()
	suite.Require(t, err)
	return b
}

// command prepares one of the programs, run in dir as the server's account,
// killed should this process die first.
func (b pgBinaries) command(dir, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(b.dir, name), args...)
	cmd.Dir = dir
	// No PG* variable (PGHOST, PGPORT, PGDATA …) may point a program at
	// another server.
	cmd.Env = cluster.Env(dir, "PG")
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

// pgCluster is a primary and its standby.
type pgCluster struct {
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
	proc *cluster.Proc
}

// standbyName is the standby's cluster_name, and so its application_name
// on the primary, where synchronous_standby_names names it.
const standbyName = "standby"

// startCluster makes the primary (initdb), the standby (pg_basebackup with
// a replication slot) and waits until the primary reports the standby as
// streaming, synchronously when sync is set (else asynchronously: the
// primary commits without waiting for it). Everything is stopped and removed
// when t ends.
func startCluster(t *testing.T, bin pgBinaries, sync bool) *pgCluster {
	t.Helper()
	base, err := os.MkdirTemp("", "inbox-failover-")
	if err != nil {
		t.Fatal(err)
	}
	c := &pgCluster{bin: bin, base: base, sync: sync}
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
					t.Logf("%s's log (last lines):\n%s", n.name, cluster.Tail(n.log, 40))
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
	cluster.Eventually(t, serverWait, "the standby to stream", func() error {
		return c.checkSync(db)
	})
	return c
}

// checkSync returns an error unless the primary (through db) streams to
// the standby, synchronously or not as the cluster was made.
func (c *pgCluster) checkSync(db *sql.DB) error {
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
func (c *pgCluster) start(t *testing.T, name, data string, args ...string) *pgNode {
	t.Helper()
	for try := 1; ; try++ {
		n := &pgNode{name: name, data: data, port: cluster.FreePort(t), log: filepath.Join(c.base, name+".log")}
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
		cmd := c.bin.command(c.base, "postgres", all...)
		cmd.Stdout, cmd.Stderr = logf, logf
		n.proc, err = cluster.Start(cmd)
		logf.Close()
		if err != nil {
			t.Fatalf("starting the %s: %v", name, err)
		}
		err = n.waitReady()
		if err == nil {
			return n
		}
		<-n.proc.Done()
		if try < 5 && strings.Contains(cluster.Tail(n.log, 20), "could not bind") {
			continue
		}
		t.Fatalf("the %s did not start: %v\n%s", name, err, cluster.Tail(n.log, 40))
	}
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
	return cluster.WaitAnswer(db, n.proc, serverWait, 50*time.Millisecond)
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
func (c *pgCluster) multiHost() string {
	return fmt.Sprintf("host=127.0.0.1,127.0.0.1 port=%d,%d user=postgres dbname=postgres sslmode=disable "+
		"target_session_attrs=read-write connect_timeout=5", c.primary.port, c.standby.port)
}

// crash kills the node as a machine's crash would: every process of the
// server at once with SIGKILL, so that none writes, replicates or answers
// anything more (cluster.KillPostmaster). This process becomes a child
// subreaper, so that the killed children, orphaned with their postmaster,
// are this process's to reap rather than left as zombies under an init
// that may reap none.
func (n *pgNode) crash() error {
	if !n.proc.Running() {
		return fmt.Errorf("the %s had already exited", n.name)
	}
	if err := cluster.BecomeSubreaper(); err != nil {
		return err
	}
	kids, err := cluster.KillPostmaster(n.proc.Cmd.Process.Pid)
	if err != nil {
		return err
	}
	<-n.proc.Done()
	for _, k := range kids {
		reap(k)
	}
	cluster.RemoveSharedMemory(n.data)
	return nil
}

// stop ends the node, if still running, by an immediate shutdown (its data
// is thrown away), or by a crash if that does not end it in time.
func (n *pgNode) stop() error {
	if !n.proc.Running() {
		return nil
	}
	_ = syscall.Kill(n.proc.Cmd.Process.Pid, syscall.SIGQUIT)
	if n.proc.Exited(30 * time.Second) {
		return nil
	}
	return n.crash()
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
func (c *pgCluster) promote(db *sql.DB) error {
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
