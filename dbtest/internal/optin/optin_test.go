package optin

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

const notice = "skipping: skipped the example suite: set INBOX_CLUSTER_SUITES=1 to run it."

// TestNoticeInPipedRun runs go test as the README's command does, on a list
// of packages whose first skips its suite (testdata/skipping), with the
// output in a pipe as in a CI log, without the variables: the notice must
// be in the captured output once, after the skipped suite's test and before
// its package's ok line, with or without -v. (Before, it went to /dev/tty
// and a pipe never saw it.)
func TestNoticeInPipedRun(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command, which the README's test command is: %v", err)
	}
	for _, verbose := range []bool{false, true} {
		args := []string{"test", "-count=1"}
		if verbose {
			args = append(args, "-v")
		}
		cmd := exec.Command(goTool, append(args, "./testdata/skipping", "./testdata/quiet")...)
		cmd.Env = withoutInboxVars(os.Environ())
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(cmd.Args[1:], " "), err, out)
		}
		lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
		at, ok, seen := -1, -1, 0
		for i, l := range lines {
			switch {
			case l == notice:
				at, seen = i, seen+1
			case strings.HasPrefix(l, "ok  \t") && strings.HasSuffix(strings.Fields(l)[1], "/testdata/skipping"):
				ok = i
			}
		}
		if seen != 1 || at > ok || ok != at+1 {
			t.Errorf("-v %v: the notice %d times, at line %d, the skipping package's ok at %d; want it once, just before the ok line:\n%s",
				verbose, seen, at, ok, out)
		}
	}
}

// withoutInboxVars is env without the variables that run or require the
// suites.
func withoutInboxVars(env []string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, "INBOX_") {
			out = append(out, kv)
		}
	}
	return out
}
