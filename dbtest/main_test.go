package dbtest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/sqlinbox/inbox/internal/optin"
)

// TestMain runs the suite, then checks its hygiene: no goroutine left
// running (goleak), no session of this process left open in a transaction,
// and no advisory lock left held on a key of the tables the crash, load,
// cut and partition tests registered. Each check runs only when the tests
// passed, so that a failure is not buried under its aftermath.
//
// Without a database's variable, its suites skip (Engine.DSN); TestMain then
// says so where a person running the README's test command will see it
// (skipNotice).
//
// With INBOX_CHILD set the binary is not a test run but a worker process of
// the crash and load tests (crash_test.go, load_test.go): the tests re-execute
// it with the role in INBOX_CHILD and its configuration in
// INBOX_CHILD_CONFIG, and kill it.
func TestMain(m *testing.M) {
	if role := os.Getenv("INBOX_CHILD"); role != "" {
		os.Exit(childMain(role))
	}
	code := m.Run()
	skipNotice()
	if code == 0 {
		if problems := suiteHygiene(context.Background()); len(problems) > 0 {
			fmt.Fprintf(os.Stderr, "hygiene: the suite left behind:\n  %s\n", strings.Join(problems, "\n  "))
			code = 1
		}
	}
	if code == 0 {
		// No driver needs an exception: every goroutine the drivers start
		// (database/sql's opener, go-sql-driver/mysql's watchers, lib/pq's
		// cancel watchers) ends when its pool or connection is closed, and
		// goleak retries for a while so that those still unwinding finish.
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: goroutines left running after a successful run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// skipNotice tells a person that the database suites skipped, in one line
// at the end of the package's run, with or without -v, unless
// INBOX_REQUIRE_DBS=1 (then a missing database failed the tests instead).
//
// `go test` with several packages (the README's command) shows nothing a
// passing package printed, so a skip said by t.Skip would go unseen: the
// line goes to the go command's own output, just before the package's ok
// line, in a terminal, a pipe or a CI log (optin.Notice, which says where
// else it goes when that cannot be reached). A result `go test` took from
// its cache runs no binary and says nothing: -count=1 runs the suites again.
//
// Rejected: printing from a test (swallowed like the rest) and failing the
// package (a newcomer without databases must see the command pass).
func skipNotice() {
	if os.Getenv("INBOX_REQUIRE_DBS") == "1" {
		return
	}
	var skipped []string
	for _, v := range []struct{ env, suites string }{
		{"INBOX_POSTGRES_DSN", "PostgreSQL (pq, pgx)"},
		{"INBOX_MYSQL_DSN", "MariaDB/MySQL (mysql)"},
	} {
		if os.Getenv(v.env) == "" {
			skipped = append(skipped, v.env+" is not set: skipped the "+v.suites+" tests")
		}
	}
	if len(skipped) == 0 {
		return
	}
	them := "it"
	if len(skipped) > 1 {
		them = "them"
	}
	optin.Notice("dbtest: " + strings.Join(skipped, "; ") + ". Set " + them +
		" to run those tests (see the README); INBOX_REQUIRE_DBS=1 makes a missing one fail.\n")
}
