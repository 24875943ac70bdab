package patroni

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
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

// The harness runs, on 127.0.0.1 and free ports, one etcd (the v3 API
// Patroni's etcd3 section speaks) and members members under Patroni, each
// with its own directory under the test's temporary directory (patroni.yml,
// the data directory, the Unix socket, Patroni's log with PostgreSQL's in
// it). No setting comes from /etc: Patroni reads the file the test wrote,
// and the server on 5432 is never touched. Run as root, Patroni and
// PostgreSQL run as the postgres account.
//
// Each Patroni leads a process group and gets SIGKILL should this process
// die (Pdeathsig); the postmasters Patroni starts are this process's
// children through the reaper (procs_test.go), and the cleanup stops them.

const (
	members = 3
	// ttl, loopWait and retryTimeout are Patroni's: the leader key lives
	// ttl seconds unless renewed, every loopWait; a failover follows a dead
	// leader within about ttl+loopWait. Patroni wants ttl ≥ loopWait +
	// 2×retryTimeout. Short, for a failover in seconds; Patroni's defaults
	// (30, 10, 10) give half a minute.
	ttl, loopWait, retryTimeout = 6, 1, 2
	// bootWait bounds a wait for the cluster to come up or heal: a deadline
	// for a failure on a loaded machine, not a duration the test expects.
	bootWait = 4 * time.Minute
)

// patroniCluster is etcd and the Patroni members.
type patroniCluster struct {
	t       *testing.T
	tl      tools
	base    string
	scope   string
	reaper  *reaper
	etcd    *cluster.Proc
	etcdAPI int // etcd's client port
	members []*member
	http    *http.Client
}

// member is one Patroni and the PostgreSQL it runs.
type member struct {
	name     string
	dir      string
	data     string
	pgPort   int
	apiPort  int
	patroni  *cluster.Proc // nil before its first start
	starts   int
	crashed  bool // killed, not started since: its shared memory is left
	lastLogs string
}

// startCluster boots etcd, then the first member (which bootstraps the
// cluster with initdb and becomes its leader), then the others (replicas
// by pg_basebackup), and waits until the cluster is healthy. Everything is
// stopped when t ends.
func startCluster(t *testing.T, tl tools) *patroniCluster {
	t.Helper()
	sweepOrphans()
	base := cluster.TempDir(t)
	if err := os.WriteFile(filepath.Join(base, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := newReaper()
	if err != nil {
		t.Fatal(err)
	}
	c := &patroniCluster{t: t, tl: tl, base: base, reaper: r, scope: fmt.Sprintf("inbox-%d", os.Getpid()),
		http: &http.Client{Timeout: 3 * time.Second}}
	t.Cleanup(c.teardown)
	c.startEtcd()
	for i := range members {
		m := &member{name: fmt.Sprintf("m%d", i+1), dir: filepath.Join(base, fmt.Sprintf("m%d", i+1)),
			pgPort: cluster.FreePort(t), apiPort: cluster.FreePort(t)}
		m.data = filepath.Join(m.dir, "data")
		if err := os.Mkdir(m.dir, 0o700); err != nil {
			t.Fatal(err)
		}
		c.writeConfig(m)
		c.members = append(c.members, m)
	}
	c.start(t, c.members[0])
	cluster.Eventually(c.t, bootWait, "the first member to bootstrap and lead", func() error {
		l, err := c.leader()
		if err == nil && l != c.members[0] {
			err = fmt.Errorf("leader %s", l.name)
		}
		return err
	})
	for _, m := range c.members[1:] {
		c.start(t, m)
	}
	c.waitHealthy(t)
	return c
}

// startEtcd starts a one-member etcd with its data in the temporary
// directory and waits until it reports itself healthy.
func (c *patroniCluster) startEtcd() {
	c.t.Helper()
	c.etcdAPI = cluster.FreePort(c.t)
	peer := fmt.Sprintf("http://127.0.0.1:%d", cluster.FreePort(c.t))
	client := fmt.Sprintf("http://127.0.0.1:%d", c.etcdAPI)
	cmd := exec.Command(c.tl.etcd, "--name", "etcd", "--data-dir", filepath.Join(c.base, "etcd"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "etcd="+peer, "--initial-cluster-state", "new")
	cmd.Dir, cmd.Env = c.base, childEnv(c.base)
	logf, err := os.Create(filepath.Join(c.base, "etcd.log"))
	if err != nil {
		c.t.Fatal(err)
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = cluster.ServerAttr(nil)
	if c.etcd, err = c.reaper.start(cmd); err != nil {
		c.t.Fatalf("starting etcd: %v", err)
	}
	cluster.Eventually(c.t, bootWait, "etcd to be healthy", func() error {
		if !c.etcd.Running() {
			c.t.Fatalf("etcd exited: %s\n%s", cmd.ProcessState, cluster.Tail(filepath.Join(c.base, "etcd.log"), 30))
		}
		var h struct{ Health string }
		if err := c.getJSON(client+"/health", &h); err != nil {
			return err
		}
		if h.Health != "true" {
			return fmt.Errorf("health %q", h.Health)
		}
		return nil
	})
}

// writeConfig writes m's patroni.yml (JSON, which YAML reads): synchronous
// mode, the short timings, trust for loopback (replication included), and
// a rejoining old leader rewound, or copied anew should the rewind fail.
func (c *patroniCluster) writeConfig(m *member) {
	c.t.Helper()
	b, err := json.MarshalIndent(c.config(m), "", "  ")
	if err != nil {
		c.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(m.dir, "patroni.yml"), b, 0o600); err != nil {
		c.t.Fatal(err)
	}
	if err := c.tl.as.Chown(m.dir, filepath.Join(m.dir, "patroni.yml")); err != nil {
		c.t.Fatal(err)
	}
}

// config is m's Patroni configuration.
func (c *patroniCluster) config(m *member) map[string]any {
	addr := func(port int) string { return fmt.Sprintf("127.0.0.1:%d", port) }
	return map[string]any{
		"scope":   c.scope,
		"name":    m.name,
		"restapi": map[string]any{"listen": addr(m.apiPort), "connect_address": addr(m.apiPort)},
		"etcd3":   map[string]any{"hosts": addr(c.etcdAPI)},
		"bootstrap": map[string]any{
			"dcs": map[string]any{
				"ttl": ttl, "loop_wait": loopWait, "retry_timeout": retryTimeout,
				"maximum_lag_on_failover": 1 << 20,
				"synchronous_mode":        true,
				"postgresql": map[string]any{
					"use_pg_rewind": true,
					"use_slots":     true,
					"parameters": map[string]any{
						// A killed process's writes stay in the kernel's
						// page cache: fsync guards only against the
						// machine's crash, which is not tested.
						"fsync":           "off",
						"shared_buffers":  "16MB",
						"max_connections": 120,
						"wal_keep_size":   "128MB",
					},
				},
			},
			"initdb": []any{map[string]any{"encoding": "UTF8"}, map[string]any{"locale": "C"}, "no-sync"},
		},
		"postgresql": map[string]any{
			"listen":          addr(m.pgPort),
			"connect_address": addr(m.pgPort),
			"data_dir":        m.data,
			"bin_dir":         c.tl.pgBin,
			"pgpass":          filepath.Join(m.dir, "pgpass"),
			"authentication": map[string]any{
				"superuser":   map[string]any{"username": "postgres", "password": "postgres"},
				"replication": map[string]any{"username": "replicator", "password": "replicator"},
			},
			"parameters": map[string]any{"unix_socket_directories": m.dir},
			"pg_hba": []string{
				"local all all trust",
				"host all all 127.0.0.1/32 trust",
				"host replication all 127.0.0.1/32 trust",
			},
			// How long Patroni waits on pg_ctl start before it calls the
			// start failed (60 s by default): a replica's first start on a
			// 2-core machine running other suites took longer in CI.
			"pg_ctl_timeout": 240,
			"remove_data_directory_on_rewind_failure":     true,
			"remove_data_directory_on_diverged_timelines": true,
		},
	}
}

// start starts m's Patroni, which starts (and, the first time, creates)
// its PostgreSQL; its output goes to patroni.N.log, N counting its starts.
func (c *patroniCluster) start(t testing.TB, m *member) {
	t.Helper()
	m.starts++
	m.lastLogs = filepath.Join(m.dir, fmt.Sprintf("patroni.%d.log", m.starts))
	logf, err := os.Create(m.lastLogs)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(c.tl.patroni, filepath.Join(m.dir, "patroni.yml"))
	cmd.Dir, cmd.Env = m.dir, childEnv(m.dir)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = cluster.ServerAttr(c.tl.as.Cred)
	p, err := c.reaper.start(cmd)
	if err != nil {
		t.Fatalf("starting %s's Patroni: %v", m.name, err)
	}
	m.patroni, m.crashed = p, false
}

func (m *member) running() bool {
	return m.patroni != nil && m.patroni.Running()
}

// crash kills m as a machine's crash would: Patroni's process group, then
// its PostgreSQL, every process at once with SIGKILL.
func (c *patroniCluster) crash(m *member) error {
	pid := postmasterPID(m.data)
	if !m.running() || pid == 0 {
		return fmt.Errorf("%s is not running (Patroni running %v, postmaster %d)", m.name, m.running(), pid)
	}
	m.crashed = true
	if err := m.patroni.SignalGroup(syscall.SIGKILL); err != nil {
		return fmt.Errorf("killing %s's Patroni: %w", m.name, err)
	}
	if err := crashPostgres(pid); err != nil {
		return fmt.Errorf("killing %s's postmaster: %w", m.name, err)
	}
	if !m.patroni.Exited(30 * time.Second) {
		return fmt.Errorf("%s's Patroni still running 30 s after SIGKILL", m.name)
	}
	return nil
}

// teardown stops every process the harness started: Patroni first (so
// that none restarts its PostgreSQL), then each postmaster by an immediate
// shutdown, then etcd; on failure it logs the tail of each log.
func (c *patroniCluster) teardown() {
	for _, m := range c.members {
		if m.running() {
			_ = m.patroni.SignalGroup(syscall.SIGKILL)
			<-m.patroni.Done()
		}
		if pid := postmasterPID(m.data); pid != 0 {
			_ = syscall.Kill(pid, syscall.SIGQUIT)
			if err := waitGone([]int{pid}, 30*time.Second); err != nil {
				if err := crashPostgres(pid); err != nil {
					c.t.Errorf("stopping %s's postmaster: %v", m.name, err)
				}
				m.crashed = true
			}
		}
		if m.crashed {
			cluster.RemoveSharedMemory(m.data)
		}
	}
	if c.etcd != nil {
		_ = c.etcd.SignalGroup(syscall.SIGKILL)
		<-c.etcd.Done()
	}
	c.reaper.close()
	if c.t.Failed() {
		for _, m := range c.members {
			if m.lastLogs != "" {
				c.t.Logf("%s: %s (last lines):\n%s", m.name, m.lastLogs, cluster.Tail(m.lastLogs, 40))
			}
		}
	}
}

// memberState is a member as Patroni's GET /cluster shows it.
type memberState struct {
	Name     string `json:"name"`
	Role     string `json:"role"`  // leader, sync_standby, replica
	State    string `json:"state"` // running, streaming (later Patronis), starting, stopped …
	Timeline int    `json:"timeline"`
	Port     int    `json:"port"`
}

// state asks the first running member's REST API for the cluster's view.
func (c *patroniCluster) state() ([]memberState, error) {
	var last error = errors.New("no member running")
	for _, m := range c.members {
		if !m.running() {
			continue
		}
		var cs struct{ Members []memberState }
		if last = c.getJSON(fmt.Sprintf("http://127.0.0.1:%d/cluster", m.apiPort), &cs); last == nil {
			return cs.Members, nil
		}
	}
	return nil, last
}

// leader is the member Patroni's cluster view names leader, running.
func (c *patroniCluster) leader() (*member, error) {
	ms, err := c.state()
	if err != nil {
		return nil, err
	}
	for _, s := range ms {
		if s.Role == "leader" && s.State == "running" {
			if m := c.member(s.Name); m != nil {
				return m, nil
			}
			return nil, fmt.Errorf("Patroni names a leader %q the harness did not start", s.Name)
		}
	}
	return nil, fmt.Errorf("no running leader: %+v", ms)
}

func (c *patroniCluster) member(name string) *member {
	for _, m := range c.members {
		if m.name == name {
			return m
		}
	}
	return nil
}

// healthy returns nil once every member runs on the leader's timeline,
// one of them leader, one its synchronous standby.
func (c *patroniCluster) healthy() error {
	ms, err := c.state()
	if err != nil {
		return err
	}
	leaders, syncs := 0, 0
	tl := 0
	for _, s := range ms {
		switch s.Role {
		case "leader":
			leaders++
			tl = s.Timeline
		case "sync_standby":
			syncs++
		}
	}
	for _, s := range ms {
		if (s.State != "running" && s.State != "streaming") || s.Timeline != tl {
			return fmt.Errorf("%s is %s on timeline %d, the leader's is %d: %+v", s.Name, s.State, s.Timeline, tl, ms)
		}
	}
	if len(ms) != members || leaders != 1 || syncs != 1 {
		return fmt.Errorf("%d members, %d leaders, %d synchronous standbys; want %d, 1, 1: %+v", len(ms), leaders, syncs, members, ms)
	}
	return nil
}

func (c *patroniCluster) waitHealthy(t testing.TB) {
	t.Helper()
	cluster.Eventually(t, bootWait, "every member to run, with a leader and a synchronous standby", c.healthy)
}

// waitNewLeader waits until Patroni names a running leader other than old.
func (c *patroniCluster) waitNewLeader(t testing.TB, old *member) *member {
	t.Helper()
	var leader *member
	cluster.Eventually(t, bootWait, "a new leader", func() error {
		m, err := c.leader()
		if err == nil && m == old {
			err = fmt.Errorf("%s still leads", m.name)
		}
		leader = m
		return err
	})
	return leader
}

// switchover asks the leader's Patroni for a planned switchover to any
// synchronous standby; Patroni answers once it is done.
func (c *patroniCluster) switchover(leader *member) error {
	body, _ := json.Marshal(map[string]string{"leader": leader.name})
	client := &http.Client{Timeout: bootWait}
	resp, err := client.Post(fmt.Sprintf("http://127.0.0.1:%d/switchover", leader.apiPort), "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST /switchover: %s: %s", resp.Status, msg)
	}
	return nil
}

func (c *patroniCluster) getJSON(url string, into any) error {
	resp, err := c.http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, into); err != nil {
		return fmt.Errorf("GET %s: %s: %v", url, b, err)
	}
	return nil
}

// multiHost is the clients' data source: every member, and only a
// read-write session will do, so a client reaches the leader wherever it
// is.
func (c *patroniCluster) multiHost() string {
	var hosts, ports []string
	for _, m := range c.members {
		hosts = append(hosts, "127.0.0.1")
		ports = append(ports, strconv.Itoa(m.pgPort))
	}
	return fmt.Sprintf("host=%s port=%s user=postgres dbname=postgres sslmode=disable target_session_attrs=read-write connect_timeout=3",
		strings.Join(hosts, ","), strings.Join(ports, ","))
}

// open opens a pool of driver on the multi-host DSN, closed when t ends.
func (c *patroniCluster) open(t *testing.T, driver string, conns int) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, c.multiHost())
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	t.Cleanup(func() { db.Close() })
	return db
}

// pingWrite returns nil once db reaches a server that commits a write.
func pingWrite(ctx context.Context, db *sql.DB) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// An xid is assigned only on a primary, and its commit waits for the
	// synchronous standby.
	var xid int64
	return db.QueryRowContext(ctx, "SELECT txid_current()").Scan(&xid)
}

// childEnv is a child's environment, without the variables that would
// point Patroni, etcd or PostgreSQL elsewhere.
func childEnv(home string) []string {
	return cluster.Env(home, "PG", "PATRONI", "ETCD")
}
