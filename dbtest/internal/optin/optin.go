// Package optin gates the suites that boot servers of their own (a Galera
// cluster, a PostgreSQL primary and standby): they run only when
// INBOX_CLUSTER_SUITES=1, which CI sets, so that the README's test command
// starts nothing a newcomer did not ask for. A skipped suite says so at the
// end of its package's run (Notice).
package optin

import (
	"os"
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

// Notice writes line, one line ending in a newline, where a person running
// the README's test command sees it at the end of the package's run, with
// or without -v. Under -v it goes to stderr, which go test shows in order
// with the tests' output. Without -v, go test with several packages shows
// nothing a passing package printed, so it goes to the controlling terminal
// when there is one (/dev/tty), else to stderr, shown for a failing package
// or a run of the current directory (as dbtest's skipNotice does).
func Notice(line string) {
	if !testing.Verbose() {
		if tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
			_, _ = tty.WriteString(line)
			_ = tty.Close()
			return
		}
	}
	_, _ = os.Stderr.WriteString(line)
}
