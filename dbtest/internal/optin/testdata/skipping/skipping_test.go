// Package skipping is a suite that skips, as the cluster suites do without
// INBOX_CLUSTER_SUITES, and says so at its end: TestNoticeInPipedRun runs
// it with go test.
package skipping

import (
	"os"
	"testing"

	"github.com/sqlinbox/inbox/dbtest/internal/optin"
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
