// Package skipping is a package whose suites skip, as the cluster suites
// do without INBOX_CLUSTER_SUITES and the database suites without their
// variables, and say so: TestNoticeInPipedRun runs it with go test.
package skipping

import (
	"os"
	"testing"

	"github.com/sqlinbox/inbox/internal/optin"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if !optin.Enabled() {
		optin.Notice("skipping: skipped the example suite: set " + optin.Env + "=1 to run it.\n")
	}
	os.Exit(code)
}

func TestSuite(t *testing.T) {
	optin.Require(t, "the example suite")
}

// Two tests skip for one reason, said once.
func TestDatabase1(t *testing.T) { skipDatabase(t) }
func TestDatabase2(t *testing.T) { skipDatabase(t) }

func skipDatabase(t *testing.T) {
	optin.DSN(t, "INBOX_POSTGRES_DSN", "the example database tests")
}
