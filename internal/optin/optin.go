// Package optin says which suites the README's test command skipped, where
// its reader sees it, and gates the suites that boot servers of their own
// (a Galera cluster, a PostgreSQL primary and standby): they run only when
// INBOX_CLUSTER_SUITES=1, which CI sets, so that the command starts nothing
// a newcomer did not ask for. A suite skipped for want of a database or a
// tool says so with Skip; a package whose whole suite skipped says so at
// the end of its run with Notice. It is test support for every module of
// the repository (dbtest, the examples, bench, the listener modules).
package optin

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// Env is the variable that turns the cluster suites on.
const Env = "INBOX_CLUSTER_SUITES"

// Enabled reports whether Env is 1.
func Enabled() bool { return os.Getenv(Env) == "1" }

// Require skips t unless Enabled, naming the suite, what it starts and the
// variable that runs it. INBOX_REQUIRE_DBS=1 does not turn a skip into a
// failure here: it makes missing databases fail, and these suites need no
// database but the servers they start.
func Require(t testing.TB, suite string) {
	t.Helper()
	if !Enabled() {
		t.Skipf("%s: skipped; set %s=1 to run it", suite, Env)
	}
}

// DSN returns the variable env, a database's data source. Without it, t
// fails under INBOX_REQUIRE_DBS=1, as in CI, where a missing database is a
// defect; otherwise it skips, saying that env is not set and that it
// skipped what (Skip).
func DSN(t testing.TB, env, what string) string {
	t.Helper()
	v := os.Getenv(env)
	if v == "" {
		if os.Getenv("INBOX_REQUIRE_DBS") == "1" {
			t.Fatalf("%s is not set and INBOX_REQUIRE_DBS=1: %s must run", env, what)
		}
		Skip(t, env+" is not set: skipped "+what+" (INBOX_REQUIRE_DBS=1 makes that a failure)")
	}
	return v
}

// Skip skips t with why, which it also says once per test binary through
// Notice, after the package's directory: without -v, go test on a list of
// packages shows no t.Skip message of a passing package. Under -v the
// skip's message is shown as it is.
func Skip(t testing.TB, why string) {
	t.Helper()
	if _, said := skipsSaid.LoadOrStore(why, true); !said && !testing.Verbose() {
		Notice(packageDir() + ": " + why + "\n")
	}
	t.Skip(why)
}

var skipsSaid sync.Map

// packageDir is the directory of the package under test, which go test
// runs its binary in, from the repository's root (the directory of
// go.work); its last element when there is no such root.
func packageDir() string {
	wd, err := os.Getwd()
	if err != nil {
		return filepath.Base(os.Args[0])
	}
	for dir := wd; ; {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			if rel, err := filepath.Rel(dir, wd); err == nil {
				return filepath.ToSlash(rel)
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return filepath.Base(wd)
		}
		dir = parent
	}
}

// Notice writes line, one line ending in a newline, where a person or a CI
// log running the README's test command sees it, with or without -v; a
// TestMain calls it after m.Run, so that it comes at the end of the
// package's run.
//
// Under -v it goes to stderr, which go test shows in order with the tests'
// output. Without -v, go test with a list of packages shows nothing a
// passing package printed, on stdout or stderr: the line goes instead to
// the output of the go command that runs the test binary, its parent
// (goOutput), where it stands just before the package's ok line, in a
// terminal, a pipe or a CI log alike. Where that cannot be reached (another
// system, a go command writing to a file, a binary not run by go test) it
// goes to the controlling terminal when there is one, else to stderr, shown
// for a failing package or a run of the current directory.
//
// A result go test took from its cache runs no binary and says nothing:
// -count=1 runs the suites again.
func Notice(line string) {
	if !testing.Verbose() {
		if out := goOutput(); out != nil {
			_, _ = out.WriteString(line)
			_ = out.Close()
			return
		}
		if tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
			_, _ = tty.WriteString(line)
			_ = tty.Close()
			return
		}
	}
	_, _ = os.Stderr.WriteString(line)
}

// goOutput opens the standard output of the go command that runs this
// binary, through Linux's /proc, when it is a pipe, a terminal or a file
// the go command appends to (>>). A file written at an offset (>) is left
// alone: opened again it would have an offset of its own, and the go
// command's next lines would overwrite the notice.
func goOutput() *os.File {
	ppid := strconv.Itoa(os.Getppid())
	exe, err := os.Readlink("/proc/" + ppid + "/exe")
	if err != nil || strings.TrimSuffix(filepath.Base(exe), ".exe") != "go" {
		return nil
	}
	name := "/proc/" + ppid + "/fd/1"
	fi, err := os.Stat(name)
	if err != nil || fi.Mode().IsRegular() && !appends(ppid) ||
		!fi.Mode().IsRegular() && fi.Mode()&(os.ModeNamedPipe|os.ModeCharDevice) == 0 {
		return nil
	}
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil
	}
	return f
}

// appends reports whether process pid writes its standard output with
// O_APPEND, from the octal flags of /proc/pid/fdinfo/1.
func appends(pid string) bool {
	info, err := os.ReadFile("/proc/" + pid + "/fdinfo/1")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(info), "\n") {
		if v, ok := strings.CutPrefix(line, "flags:"); ok {
			flags, err := strconv.ParseUint(strings.TrimSpace(v), 8, 64)
			return err == nil && flags&syscall.O_APPEND != 0
		}
	}
	return false
}
