package galera

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/sqlinbox/inbox/dbtest/internal/cluster"
)

// The harness runs MariaDB servers of its own on 127.0.0.1: a Galera
// cluster of three nodes, or one standalone server started the same way
// without wsrep, each with its own directory under the test's temporary
// directory (my.cnf, data/, error.log, socket) and its own ports, found
// free from 13306 (clients) and 14567 (Galera: group communication, IST and
// SST, three ports a node). The server already running on 3306 is never
// touched: every option comes from the node's own my.cnf (--defaults-file),
// never /etc/mysql.
//
// Run as root, the servers run as the mysql user (their directories belong
// to it): rsync state transfer writes a joiner's directory as the user the
// server runs as. Each server leads a process group of its own, so that the
// state-transfer scripts and the rsync daemon it starts go with it, and gets
// SIGKILL should the test process die without cleaning up (Pdeathsig, set
// after the change of user, which would clear it). The cleanup kills every
// group and then any process still naming the cluster's directory.

// dbName is the database the suites use on every server of the harness.
const dbName = "inbox_galera"

// bootWait bounds each wait for a server to come up or rejoin: a deadline
// for a failure, not a duration the test expects (a node joins in seconds).
const bootWait = 3 * time.Minute

// tools are the programs and the Galera library the harness needs.
type tools struct {
	mariadbd, installDB, provider string
}

// findTools locates mariadbd, mariadb-install-db, the Galera provider
// (INBOX_GALERA_PROVIDER overrides) and rsync (state transfer), and reports
// what is missing.
func findTools() (tools, error) {
	var tl tools
	var missing []string
	look := func(name string, dirs ...string) string {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
		for _, d := range dirs {
			if p := filepath.Join(d, name); cluster.FileExists(p) {
				return p
			}
		}
		missing = append(missing, name)
		return ""
	}
	tl.mariadbd = look("mariadbd", "/usr/sbin", "/usr/libexec")
	tl.installDB = look("mariadb-install-db", "/usr/bin", "/usr/sbin")
	look("rsync")
	candidates := []string{"/usr/lib/galera/libgalera_smm.so", "/usr/lib/libgalera_smm.so",
		"/usr/lib64/galera-4/libgalera_smm.so", "/usr/lib64/galera/libgalera_smm.so"}
	if p := os.Getenv("INBOX_GALERA_PROVIDER"); p != "" {
		candidates = []string{p}
	}
	for _, p := range candidates {
		if cluster.FileExists(p) {
			tl.provider = p
			break
		}
	}
	if tl.provider == "" {
		missing = append(missing, "the Galera provider libgalera_smm.so, looked for at "+strings.Join(candidates, ", "))
	}
	if len(missing) > 0 {
		return tl, fmt.Errorf("missing %s; on Debian: apt-get install galera-4 mariadb-server rsync", strings.Join(missing, "; "))
	}
	return tl, nil
}

// suite names the Galera suite in its skip messages and notices.
var suite = cluster.Suite{
	Pkg:   "dbtest/galera",
	Short: "galera",
	Name:  "the Galera suite",
	Boots: "which boots a three-node MariaDB Galera cluster on ports from 13306 (about a minute)",
	Find:  func() error { _, err := findTools(); return err },
}

// runAs is who the servers run as.
type runAs struct {
	cluster.Account
	extra []string // mariadbd options
}

// serverUser returns the mysql user's account when this process is root
// (mariadbd refuses to run as root unless told to), else this process's.
func serverUser() (runAs, error) {
	as, err := cluster.ServerAccount("mysql")
	if cluster.IsUnknownUser(err) {
		// No mysql user: run as root, which mariadbd accepts when asked.
		return runAs{Account: cluster.Account{UID: -1, GID: -1}, extra: []string{"--user=root"}}, nil
	}
	return runAs{Account: as}, err
}

// node is one server.
type node struct {
	name   string
	dir    string
	port   int // clients
	gcomm  int // group communication; IST gcomm+1, SST gcomm+2
	galera bool
	env    []string // added to the server's environment (LD_PRELOAD of libfaketime: skew_test.go)
	admin  *sql.DB  // root, for status and setup
	reads  *sql.DB  // root, for checks: on a Galera node each read first waits for the node to apply what the cluster committed before it

	proc *cluster.Proc // the current process; nil before the first start
	// starts counts the processes started, for the log file names.
	starts int
}

// harness is a set of servers and the test that owns them.
type harness struct {
	t     testing.TB
	tl    tools
	as    runAs
	base  string
	nodes []*node
}

// newHarness prepares n servers in a fresh directory of t (Galera nodes of
// one cluster when galera is set) and registers their cleanup; it starts
// none.
func newHarness(t testing.TB, n int, galera bool) *harness {
	t.Helper()
	tl, err := findTools()
	suite.Require(t, err)
	as, err := serverUser()
	if err != nil {
		t.Fatal(err)
	}
	base := cluster.TempDir(t)
	h := &harness{t: t, tl: tl, as: as, base: base}
	ports, err := freePorts(13306, n)
	if err != nil {
		t.Fatal(err)
	}
	var gports []int
	if galera {
		if gports, err = freePortRuns(14567, n, 3); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		nd := &node{name: fmt.Sprintf("node%d", i+1), dir: filepath.Join(base, fmt.Sprintf("node%d", i+1)),
			port: ports[i], galera: galera}
		if galera {
			nd.gcomm = gports[i]
		}
		h.nodes = append(h.nodes, nd)
	}
	var peers []string
	for _, nd := range h.nodes {
		peers = append(peers, fmt.Sprintf("127.0.0.1:%d", nd.gcomm))
	}
	for _, nd := range h.nodes {
		for _, d := range []string{"data", "tmp"} {
			if err := os.MkdirAll(filepath.Join(nd.dir, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(nd.cnf(), []byte(nd.config(tl, fmt.Sprintf("inbox_%d", os.Getpid()), peers)), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := h.as.ChownTree(nd.dir); err != nil {
			t.Fatal(err)
		}
		for _, pool := range []struct {
			db   **sql.DB
			wait bool
		}{{&nd.admin, false}, {&nd.reads, true}} {
			db, err := sql.Open("mysql", nd.adminDSN(pool.wait))
			if err != nil {
				t.Fatal(err)
			}
			db.SetMaxOpenConns(2)
			*pool.db = db
		}
	}
	t.Cleanup(h.teardown)
	return h
}

func (nd *node) cnf() string { return filepath.Join(nd.dir, "my.cnf") }

// config is the node's my.cnf. The settings a throughput comparison
// depends on are the same for a Galera node and a standalone server:
// InnoDB flushes its log once a second (innodb_flush_log_at_trx_commit=2,
// as Galera deployments commonly run: a commit is durable by replication),
// a small buffer pool, no binary log.
func (nd *node) config(tl tools, cluster string, peers []string) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("[mysqld]")
	w("datadir=%s", filepath.Join(nd.dir, "data"))
	w("socket=%s", filepath.Join(nd.dir, "mysqld.sock"))
	w("pid-file=%s", filepath.Join(nd.dir, "mysqld.pid"))
	w("log-error=%s", filepath.Join(nd.dir, "error.log"))
	// Temporary tables and the state-transfer scripts' files stay in the
	// node's directory, away from the /tmp of the server on 3306.
	w("tmpdir=%s", filepath.Join(nd.dir, "tmp"))
	w("port=%d", nd.port)
	w("bind-address=127.0.0.1")
	w("skip-name-resolve")
	w("max_connections=500")
	w("default_storage_engine=InnoDB")
	w("innodb_buffer_pool_size=128M")
	w("innodb_log_file_size=64M")
	w("innodb_flush_log_at_trx_commit=2")
	if !nd.galera {
		return b.String()
	}
	// Galera's requirements: row-based replication, interleaved
	// auto-increment locks.
	w("binlog_format=ROW")
	w("innodb_autoinc_lock_mode=2")
	w("wsrep_on=ON")
	w("wsrep_provider=%s", tl.provider)
	w("wsrep_cluster_name=%s", cluster)
	w("wsrep_cluster_address=gcomm://%s", strings.Join(peers, ","))
	w("wsrep_node_name=%s", nd.name)
	w("wsrep_node_address=127.0.0.1:%d", nd.gcomm)
	w("wsrep_node_incoming_address=127.0.0.1:%d", nd.port)
	// gcache holds the writesets a rejoining node receives by IST rather
	// than a whole copy by SST.
	w(`wsrep_provider_options="gmcast.listen_addr=tcp://127.0.0.1:%d;ist.recv_addr=127.0.0.1:%d;gcache.size=256M;cert.log_conflicts=yes"`, nd.gcomm, nd.gcomm+1)
	w("wsrep_sst_receive_address=127.0.0.1:%d", nd.gcomm+2)
	w("wsrep_sst_method=rsync")
	// Each certification conflict and brute-force abort in the error log,
	// for a failure's diagnosis.
	w("wsrep_log_conflicts=ON")
	return b.String()
}

// adminDSN is root over TCP, without a database; with syncWait, on a
// Galera node, every read waits for the node to apply what the cluster
// committed before it (wsrep_sync_wait).
func (nd *node) adminDSN(syncWait bool) string {
	dsn := fmt.Sprintf("root@tcp(127.0.0.1:%d)/?parseTime=true&timeout=5s", nd.port)
	if syncWait && nd.galera {
		dsn += "&wsrep_sync_wait=1"
	}
	return dsn
}

// DSN is the workers' data source on this node.
func (nd *node) DSN() string {
	return fmt.Sprintf("root@tcp(127.0.0.1:%d)/%s?parseTime=true&timeout=5s", nd.port, dbName)
}

// installDB creates the system tables in nd's data directory, with root
// reaching the server over TCP without a password.
func (h *harness) installDB(nd *node) {
	h.t.Helper()
	args := []string{"--defaults-file=" + nd.cnf(), "--auth-root-authentication-method=normal", "--skip-test-db"}
	if h.as.Cred != nil {
		args = append(args, "--user=mysql")
	}
	cmd := exec.Command(h.tl.installDB, args...)
	cmd.SysProcAttr = cluster.ServerAttr(nil)
	if out, err := cmd.CombinedOutput(); err != nil {
		h.t.Fatalf("%s: mariadb-install-db: %v\n%s", nd.name, err, out)
	}
}

// start starts nd's server with extra options; bootstrap starts a new
// cluster from it.
func (h *harness) start(nd *node, bootstrap bool, extra ...string) {
	h.t.Helper()
	args := []string{"--defaults-file=" + nd.cnf()}
	args = append(args, h.as.extra...)
	if bootstrap {
		args = append(args, "--wsrep-new-cluster")
	}
	args = append(args, extra...)
	nd.starts++
	out, err := os.Create(filepath.Join(h.base, fmt.Sprintf("%s.out.%d", nd.name, nd.starts)))
	if err != nil {
		h.t.Fatal(err)
	}
	cmd := exec.Command(h.tl.mariadbd, args...)
	if len(nd.env) > 0 {
		cmd.Env = append(os.Environ(), nd.env...)
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = cluster.ServerAttr(h.as.Cred)
	p, err := cluster.Start(cmd)
	out.Close() // the server has its own copy
	if err != nil {
		h.t.Fatalf("%s: starting mariadbd: %v", nd.name, err)
	}
	nd.proc = p
}

// recoverPosition runs nd's server once with --wsrep-recover, as Debian's
// galera_recovery does before a start after a crash, and returns the option
// that starts it from the position InnoDB recovered. Without it a node
// killed mid-write finds no position in grastate.dat (seqno -1) and asks
// for a whole copy (SST) instead of the writesets it missed (IST).
func (h *harness) recoverPosition(nd *node) string {
	h.t.Helper()
	args := []string{"--defaults-file=" + nd.cnf()}
	args = append(args, h.as.extra...)
	args = append(args, "--wsrep-recover", "--disable-log-error")
	cmd := exec.Command(h.tl.mariadbd, args...)
	cmd.SysProcAttr = cluster.ServerAttr(h.as.Cred)
	out, err := cmd.CombinedOutput()
	if err != nil {
		h.t.Fatalf("%s: mariadbd --wsrep-recover: %v\n%s", nd.name, err, out)
	}
	const mark = "WSREP: Recovered position:"
	for _, l := range strings.Split(string(out), "\n") {
		if _, pos, ok := strings.Cut(l, mark); ok {
			return "--wsrep_start_position=" + strings.TrimSpace(pos)
		}
	}
	h.t.Fatalf("%s: mariadbd --wsrep-recover printed no %q:\n%s", nd.name, mark, out)
	return ""
}

// running reports whether nd's server process is alive.
func (nd *node) running() bool {
	return nd.proc != nil && nd.proc.Running()
}

// kill sends SIGKILL to nd's process group and waits for the server to be
// gone.
func (h *harness) kill(nd *node) {
	h.t.Helper()
	if !nd.running() {
		return
	}
	if err := nd.proc.KillGroup(time.Minute); err != nil {
		h.t.Fatalf("%s: %v", nd.name, err)
	}
}

// teardown kills every server and whatever still names the harness's
// directory (a state-transfer script or rsync daemon that left the group),
// and closes the admin pools. It logs the tail of each error log when the
// test failed, and copies the error logs into INBOX_GALERA_LOGS when that
// names a directory.
func (h *harness) teardown() {
	for _, nd := range h.nodes {
		if nd.running() {
			if err := nd.proc.KillGroup(time.Minute); err != nil {
				h.t.Errorf("%s: %v", nd.name, err)
			}
		}
		if nd.admin != nil {
			nd.admin.Close()
			nd.reads.Close()
		}
	}
	for _, pid := range pidsNaming(h.base) {
		h.t.Logf("killing leftover process %d, which names %s", pid, h.base)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if dir := os.Getenv("INBOX_GALERA_LOGS"); dir != "" {
		for _, nd := range h.nodes {
			name := strings.NewReplacer("/", "_").Replace(h.t.Name()) + "-" + nd.name + ".error.log"
			if data, err := os.ReadFile(filepath.Join(nd.dir, "error.log")); err == nil {
				_ = os.WriteFile(filepath.Join(dir, name), data, 0o644)
			}
		}
	}
	if h.t.Failed() {
		for _, nd := range h.nodes {
			h.t.Logf("%s: last lines of error.log:\n%s", nd.name, cluster.Tail(filepath.Join(nd.dir, "error.log"), 30))
		}
	}
}

// pidsNaming lists the processes whose command line contains s.
func pidsNaming(s string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cmdline, []byte(s)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// status reads some of nd's global status variables.
func (nd *node) status(ctx context.Context, names ...string) (map[string]string, error) {
	q := "SHOW GLOBAL STATUS WHERE Variable_name IN (" + strings.TrimSuffix(strings.Repeat("?, ", len(names)), ", ") + ")"
	args := make([]any, len(names))
	for i, n := range names {
		args[i] = n
	}
	rows, err := nd.admin.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	m := map[string]string{}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return nil, err
		}
		m[k] = v
	}
	return m, rows.Err()
}

// ready reports whether nd serves clients: any answer from a standalone
// server; a Galera node must also be Synced and ready, in a primary
// component of want nodes (0: any size).
func (nd *node) ready(want int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if !nd.galera {
		return nd.admin.PingContext(ctx)
	}
	st, err := nd.status(ctx, "wsrep_ready", "wsrep_local_state_comment", "wsrep_cluster_status", "wsrep_cluster_size")
	if err != nil {
		return err
	}
	if st["wsrep_ready"] != "ON" || st["wsrep_local_state_comment"] != "Synced" || st["wsrep_cluster_status"] != "Primary" {
		return fmt.Errorf("%s: wsrep_ready=%s state=%s cluster=%s", nd.name, st["wsrep_ready"], st["wsrep_local_state_comment"], st["wsrep_cluster_status"])
	}
	if want > 0 && st["wsrep_cluster_size"] != strconv.Itoa(want) {
		return fmt.Errorf("%s: cluster size %s, want %d", nd.name, st["wsrep_cluster_size"], want)
	}
	return nil
}

// waitReady polls nd until ready(want) holds, failing the test when its
// server exits or bootWait passes first.
func (h *harness) waitReady(nd *node, want int) {
	h.t.Helper()
	deadline := time.Now().Add(bootWait)
	for {
		err := nd.ready(want)
		if err == nil {
			return
		}
		if !nd.running() {
			h.t.Fatalf("%s exited (%v) while starting: %v; error.log:\n%s", nd.name, nd.proc.Err(), err, cluster.Tail(filepath.Join(nd.dir, "error.log"), 40))
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("%s not ready after %v: %v; error.log:\n%s", nd.name, bootWait, err, cluster.Tail(filepath.Join(nd.dir, "error.log"), 40))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// bootCluster brings up every node as one Galera cluster: the first
// bootstraps it, the others join it one at a time (each by a state
// transfer from a member), and creates the test database. It returns how
// long that took.
func (h *harness) bootCluster() time.Duration {
	h.t.Helper()
	start := time.Now()
	first := h.nodes[0]
	h.installDB(first)
	h.start(first, true)
	h.waitReady(first, 1)
	for i, nd := range h.nodes[1:] {
		h.start(nd, false)
		h.waitReady(nd, i+2)
	}
	h.createDB()
	return time.Since(start)
}

// bootStandalone brings up the harness's single server.
func (h *harness) bootStandalone() time.Duration {
	h.t.Helper()
	start := time.Now()
	nd := h.nodes[0]
	h.installDB(nd)
	h.start(nd, false)
	h.waitReady(nd, 0)
	h.createDB()
	return time.Since(start)
}

func (h *harness) createDB() {
	h.t.Helper()
	if _, err := h.nodes[0].admin.Exec("CREATE DATABASE IF NOT EXISTS " + dbName); err != nil {
		h.t.Fatal(err)
	}
}

// freePorts returns n ports from from upward that nothing listens on
// 127.0.0.1.
func freePorts(from, n int) ([]int, error) {
	return freePortRuns(from, n, 1)
}

// freePortRuns returns the first ports of n runs of size consecutive free
// ports, from from upward, runs size apart (ten apart: 14567, 14577, …).
func freePortRuns(from, n, size int) ([]int, error) {
	step := 10
	if size == 1 {
		step = 1
	}
	var out []int
	for p := from; p+size <= from+2000 && len(out) < n; p += step {
		ok := true
		for q := p; q < p+size && ok; q++ {
			ok = portFree(q)
		}
		if ok {
			out = append(out, p)
		}
	}
	if len(out) < n {
		return nil, fmt.Errorf("found %d of %d free port runs of %d from %d", len(out), n, size, from)
	}
	return out, nil
}

func portFree(p int) bool {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
	if err != nil {
		return false
	}
	l.Close()
	return true
}
