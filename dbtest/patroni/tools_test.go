package patroni

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sqlinbox/inbox/dbtest/internal/cluster"
	"github.com/sqlinbox/inbox/internal/optin"
)

// tools are the programs the harness runs and the account it runs
// Patroni (and so PostgreSQL) as.
type tools struct {
	patroni, etcd string
	pgBin         string // PostgreSQL's server programs, Patroni's bin_dir
	// as is the postgres account when this process is root (PostgreSQL
	// refuses to run as root), this process's otherwise.
	as cluster.Account
}

// pgPrograms are the server programs Patroni runs: a replica is made by
// pg_basebackup, an old leader rejoins through pg_rewind.
var pgPrograms = []string{"initdb", "pg_ctl", "postgres", "pg_basebackup", "pg_rewind", "pg_controldata"}

// suite names the Patroni suite in its skip messages and notices.
var suite = cluster.Suite{
	Pkg:   "dbtest/patroni",
	Short: "patroni",
	Name:  "the Patroni suite",
	Boots: "which boots etcd and three Patroni members and fails their leader over (about a minute)",
	Find:  func() error { _, err := findTools(); return err },
}

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
			if p := filepath.Join(dir, name); cluster.FileExists(p) {
				return p
			}
		}
		missing = append(missing, name)
		return ""
	}
	tl.patroni = look("patroni")
	tl.etcd = look("etcd")
	tl.pgBin = cluster.FindPgBin(pgPrograms...)
	if tl.pgBin == "" {
		missing = append(missing, "PostgreSQL's "+strings.Join(pgPrograms, ", ")+" (INBOX_PG_BIN or /usr/lib/postgresql/N/bin)")
	}
	if len(missing) > 0 {
		return tl, fmt.Errorf("missing %s; on Debian: apt-get install patroni etcd-server postgresql", strings.Join(missing, "; "))
	}
	var err error
	tl.as, err = cluster.ServerAccount("postgres")
	return tl, err
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
	suite.Require(t, err)
	return tl
}
