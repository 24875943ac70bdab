package pgbouncer

import (
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sqlinbox/inbox/dbtest/internal/cluster"
)

// The harness runs a PgBouncer of its own on a free port of 127.0.0.1, in
// front of the PostgreSQL server of INBOX_POSTGRES_DSN (trust
// authentication, as CI's), with its configuration and user list in the
// test's temporary directory and its log in a file there. It serves two
// databases onto the DSN's: txDB in transaction pooling with a small pool
// (the deployment the suite is about) and sessionDB in session pooling, the
// fix the check names. Nothing else is touched: the server's own
// configuration, and Debian's pgbouncer service, if any, stay as they are.

// Databases of the harness's PgBouncer.
const (
	txDB      = "inbox_pgb_tx"
	sessionDB = "inbox_pgb_session"
	// poolSize is txDB's default_pool_size: server connections per user,
	// fewer than the suite's client connections, so that transactions wait
	// for one and sessions are handed around.
	poolSize = 4
)

// bootWait bounds PgBouncer's start: a deadline for a failure, not a
// duration the test expects (it answers in milliseconds).
const bootWait = 30 * time.Second

// findPgBouncer locates the pgbouncer program: INBOX_PGBOUNCER, the PATH,
// or Debian's /usr/sbin. Without it the suite skips, saying why, or fails
// under INBOX_REQUIRE_DBS=1.
func findPgBouncer() (string, error) {
	if p := os.Getenv("INBOX_PGBOUNCER"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("INBOX_PGBOUNCER=%s: %v", p, err)
		}
		return p, nil
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if p := "/usr/sbin/pgbouncer"; cluster.FileExists(p) {
		return p, nil
	}
	return "", fmt.Errorf("pgbouncer not found (INBOX_PGBOUNCER unset, not on PATH nor at /usr/sbin/pgbouncer); on Debian: apt-get install pgbouncer")
}

// suite names the PgBouncer suite in its skip messages and notices. A
// missing DSN says so itself (optin.DSN).
var suite = cluster.Suite{
	Pkg:   "dbtest/pgbouncer",
	Short: "pgbouncer",
	Name:  "the PgBouncer suite",
	Boots: "which starts a PgBouncer of its own in front of INBOX_POSTGRES_DSN's server",
	Find:  func() error { _, err := findPgBouncer(); return err },
}

// bouncer is a running PgBouncer.
type bouncer struct {
	port    int
	user    string // the clients' user, the DSN's
	dir     string
	version string
	proc    *cluster.Proc
}

// startBouncer writes pgbouncer.ini and the user list for backend (the
// server PgBouncer connects to) and starts PgBouncer, as the postgres
// account when this process is root (PgBouncer refuses to run as root).
// Its cleanup stops it; register pools on it afterwards, so that they close
// first.
func startBouncer(t *testing.T, bin string, backend *pgconn.Config) *bouncer {
	t.Helper()
	dir := cluster.TempDir(t)
	as, err := cluster.ServerAccount("postgres", "nobody")
	if err != nil {
		t.Fatal(err)
	}
	b := &bouncer{port: cluster.FreePort(t), user: backend.User, dir: dir}
	target := fmt.Sprintf("host=%s port=%d dbname=%s user=%s", backend.Host, backend.Port, backend.Database, backend.User)
	if backend.Password != "" {
		target += " password=" + backend.Password
	}
	ini := strings.Join([]string{
		"[databases]",
		txDB + " = " + target + " pool_mode=transaction pool_size=" + strconv.Itoa(poolSize),
		sessionDB + " = " + target + " pool_mode=session",
		"[pgbouncer]",
		"listen_addr = 127.0.0.1",
		"listen_port = " + strconv.Itoa(b.port),
		"unix_socket_dir =",
		"auth_type = trust",
		"auth_file = " + filepath.Join(dir, "userlist.txt"),
		"admin_users = " + backend.User,
		"max_client_conn = 200",
		// lib/pq sets extra_float_digits at startup, which PgBouncer
		// refuses unless told to ignore it.
		"ignore_startup_parameters = extra_float_digits",
		"logfile = " + filepath.Join(dir, "pgbouncer.log"),
		"",
	}, "\n")
	for name, text := range map[string]string{
		"pgbouncer.ini": ini,
		"userlist.txt":  fmt.Sprintf("%q \"\"\n", backend.User),
		"pgbouncer.log": "",
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := as.Chown(p); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatalf("%s --version: %v", bin, err)
	}
	b.version, _, _ = strings.Cut(strings.TrimSpace(string(out)), "\n")
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	cmd.SysProcAttr = cluster.ServerAttr(as.Cred)
	if b.proc, err = cluster.Start(cmd); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	t.Cleanup(func() { b.stop(t) })
	b.waitReady(t)
	return b
}

// waitReady polls until PgBouncer serves a query on txDB, failing t when it
// exits or bootWait passes first.
func (b *bouncer) waitReady(t *testing.T) {
	t.Helper()
	db, err := sql.Open("postgres", b.dsn(txDB))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := cluster.WaitAnswer(db, b.proc, bootWait, 20*time.Millisecond); err != nil {
		t.Fatalf("pgbouncer not serving %s: %v; its log:\n%s", txDB, err, b.log())
	}
}

// stop ends PgBouncer (SIGINT would wait for its clients; SIGTERM does not)
// and waits for it, logging its log when t failed.
func (b *bouncer) stop(t *testing.T) {
	_ = b.proc.SignalGroup(syscall.SIGTERM)
	if !b.proc.Exited(10 * time.Second) {
		_ = b.proc.SignalGroup(syscall.SIGKILL)
		<-b.proc.Done()
	}
	if t.Failed() {
		t.Logf("pgbouncer's log:\n%s", b.log())
	}
}

// log is the last lines of PgBouncer's log.
func (b *bouncer) log() string {
	return cluster.Tail(filepath.Join(b.dir, "pgbouncer.log"), 40)
}

// dsn is a client's data source for database db of the PgBouncer.
func (b *bouncer) dsn(db string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", b.user, b.port, db)
}
