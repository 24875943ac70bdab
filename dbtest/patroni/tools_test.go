package patroni

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/sqlinbox/inbox/internal/optin"
)

// tools are the programs the harness runs and the account it runs
// Patroni (and so PostgreSQL) as.
type tools struct {
	patroni, etcd string
	pgBin         string // PostgreSQL's server programs, Patroni's bin_dir
	// cred is the postgres account's when this process is root
	// (PostgreSQL refuses to run as root), nil otherwise.
	cred     *syscall.Credential
	uid, gid int
}

// pgPrograms are the server programs Patroni runs: a replica is made by
// pg_basebackup, an old leader rejoins through pg_rewind.
var pgPrograms = []string{"initdb", "pg_ctl", "postgres", "pg_basebackup", "pg_rewind", "pg_controldata"}

// findTools locates patroni, etcd and PostgreSQL's server programs
// (INBOX_PG_BIN, or the newest /usr/lib/postgresql/N/bin), and reports what
// is missing with the Debian packages that hold it.
func findTools() (tools, error) {
	var tl tools
	var missing []string
	look := func(name string) string {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
		for _, dir := range []string{"/usr/bin", "/usr/sbin", "/usr/local/bin"} {
			if p := filepath.Join(dir, name); isFile(p) {
				return p
			}
		}
		missing = append(missing, name)
		return ""
	}
	tl.patroni = look("patroni")
	tl.etcd = look("etcd")
	tl.pgBin = findPgBin()
	if tl.pgBin == "" {
		missing = append(missing, "PostgreSQL's "+strings.Join(pgPrograms, ", ")+" (INBOX_PG_BIN or /usr/lib/postgresql/N/bin)")
	}
	if len(missing) > 0 {
		return tl, fmt.Errorf("missing %s; on Debian: apt-get install patroni etcd-server postgresql", strings.Join(missing, "; "))
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return tl, fmt.Errorf("running as root, and no postgres account to run Patroni and PostgreSQL as: %v", err)
		}
		uid, err1 := strconv.Atoi(u.Uid)
		gid, err2 := strconv.Atoi(u.Gid)
		if err1 != nil || err2 != nil {
			return tl, fmt.Errorf("postgres account: uid %q gid %q", u.Uid, u.Gid)
		}
		tl.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}
		tl.uid, tl.gid = uid, gid
	}
	return tl, nil
}

// findPgBin is INBOX_PG_BIN, or the newest /usr/lib/postgresql/N/bin that
// holds every program of pgPrograms; "" when none does.
func findPgBin() string {
	has := func(dir string) bool {
		for _, p := range pgPrograms {
			if !isFile(filepath.Join(dir, p)) {
				return false
			}
		}
		return true
	}
	if dir := os.Getenv("INBOX_PG_BIN"); dir != "" {
		if has(dir) {
			return dir
		}
		return ""
	}
	cands, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	major := func(bin string) float64 {
		v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(bin)), 64)
		return v
	}
	sort.Slice(cands, func(i, j int) bool { return major(cands[i]) > major(cands[j]) })
	for _, c := range cands {
		if has(c) {
			return c
		}
	}
	return ""
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

// requireTools skips t unless the cluster suites were asked for
// (INBOX_CLUSTER_SUITES=1); asked for, it returns the tools, or skips t
// naming what is missing, a failure under INBOX_REQUIRE_DBS=1 (CI).
func requireTools(t testing.TB) tools {
	t.Helper()
	optin.Require(t, "the Patroni suite (etcd and a three-member Patroni cluster of its own)")
	if testing.Short() {
		t.Skip("the Patroni suite boots a cluster and fails its leader over; -short skips it")
	}
	tl, err := findTools()
	if err != nil {
		if os.Getenv("INBOX_REQUIRE_DBS") == "1" {
			t.Fatalf("patroni: %v, and INBOX_REQUIRE_DBS=1: the Patroni suite must run", err)
		}
		t.Skipf("patroni: %v: skipping the Patroni suite (INBOX_REQUIRE_DBS=1 makes this a failure)", err)
	}
	return tl
}
