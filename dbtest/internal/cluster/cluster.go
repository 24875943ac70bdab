// Package cluster is the plumbing the suites that boot servers of their own
// share (dbtest/galera, dbtest/failover, dbtest/pgbouncer, dbtest/patroni):
// the opt-in gate and the end of their TestMain, the account a server runs
// as when the test runs as root, starting, signalling and reaping server
// processes, the crash of a PostgreSQL postmaster, and small waits. Each
// piece was written once per suite before; one copy keeps their behaviour
// alike, and a fix reaches all four.
//
// What differs between the suites stays in them: how MariaDB, PostgreSQL,
// Patroni or PgBouncer is configured, booted and judged ready.
package cluster

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"go.uber.org/goleak"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/optin"
)

// Suite names one cluster suite in its skip messages and notices.
type Suite struct {
	Pkg   string // the package, "dbtest/galera"
	Short string // the messages' prefix, "galera"
	Name  string // "the Galera suite"
	// Boots says what the suite starts, completing "skipped the Galera
	// suite, …" for a run that did not ask for it.
	Boots string
	// Find looks for the programs the suite needs, for the notice of a run
	// that asked for the suite without them; nil when that is looked for
	// in the test alone.
	Find func() error
}

// Require skips t when err (what the suite needs is missing) is not nil,
// or fails it under INBOX_REQUIRE_DBS=1 (CI), where the suite must run:
// a missing tool must not pass as a skipped suite there.
func (s Suite) Require(t testing.TB, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if os.Getenv("INBOX_REQUIRE_DBS") == "1" {
		t.Fatalf("%s: %v, and INBOX_REQUIRE_DBS=1: %s must run", s.Short, err, s.Name)
	}
	t.Skipf("%s: %v: skipping %s (INBOX_REQUIRE_DBS=1 makes this a failure)", s.Short, err, s.Name)
}

// Run runs the package's tests and returns TestMain's exit code: it says
// at the end of the run that the suite skipped, and why (optin.Notice), so
// that a person running `go test` on many packages sees it; and a passing
// run that left a goroutine behind (worker loops, keepers, the drivers'
// watchers) fails.
func (s Suite) Run(m *testing.M) int {
	code := m.Run()
	s.notice()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: goroutines left running after a successful run: %v\n", err)
			code = 1
		}
	}
	return code
}

func (s Suite) notice() {
	if !optin.Enabled() {
		optin.Notice(s.Pkg + ": skipped " + s.Name + ", " + s.Boots + ": set " + optin.Env + "=1 to run it.\n")
		return
	}
	if os.Getenv("INBOX_REQUIRE_DBS") == "1" || s.Find == nil {
		return
	}
	if err := s.Find(); err != nil {
		optin.Notice(s.Pkg + ": skipped " + s.Name + ": " + err.Error() + ". INBOX_REQUIRE_DBS=1 makes this a failure.\n")
	}
}

// Account is who a server runs as. PostgreSQL, PgBouncer and MariaDB
// refuse to run as root, so a test run as root (a CI container) starts
// them as a service account.
type Account struct {
	Cred     *syscall.Credential // nil: as this process
	UID, GID int
}

// ServerAccount is, when this process is root, the first of names that
// exists, else this process's own (Cred nil). An error wraps
// user.UnknownUserError when none exists.
func ServerAccount(names ...string) (Account, error) {
	if os.Geteuid() != 0 {
		return Account{UID: -1, GID: -1}, nil
	}
	var u *user.User
	var err error
	for _, name := range names {
		if u, err = user.Lookup(name); err == nil {
			break
		}
	}
	if err != nil {
		return Account{}, fmt.Errorf("running as root, and no %v account to run the servers as: %w", names, err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil {
		return Account{}, fmt.Errorf("account %s: uid %q gid %q", u.Username, u.Uid, u.Gid)
	}
	// No supplementary groups: root's must not follow the server.
	cred := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}
	return Account{Cred: cred, UID: uid, GID: gid}, nil
}

// Chown gives paths to the account; as this process's own, it does nothing.
func (a Account) Chown(paths ...string) error {
	if a.Cred == nil {
		return nil
	}
	for _, p := range paths {
		if err := os.Lchown(p, a.UID, a.GID); err != nil {
			return err
		}
	}
	return nil
}

// ChownTree gives dir and everything under it to the account.
func (a Account) ChownTree(dir string) error {
	if a.Cred == nil {
		return nil
	}
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, a.UID, a.GID)
	})
}

// IsUnknownUser reports whether err says an account does not exist.
func IsUnknownUser(err error) bool {
	var unknown user.UnknownUserError
	return errors.As(err, &unknown)
}

// TempDir is a temporary directory of t that a server's account can
// reach: t.TempDir creates it and its parent 0700.
func TempDir(t testing.TB) string {
	t.Helper()
	base := t.TempDir()
	for _, d := range []string{filepath.Dir(base), base} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return base
}

// FormTable describes table (dead table table_dead) in the claim form
// form: lease, rowlock or advisory, as the suites create them.
func FormTable(table, form string) inbox.Table {
	tb := inbox.Table{Name: table, DeadTable: table + "_dead"}
	switch form {
	case "lease":
		tb.LockedUntil = "locked_until"
	case "rowlock":
		tb.NotBefore = "not_before"
	case "advisory":
		tb.AdvisoryKey = "id"
		tb.NotBefore = "not_before"
	default:
		panic("unknown form " + form)
	}
	return tb
}
