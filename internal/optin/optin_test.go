package optin

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The lines testdata/skipping says: Notice's at its end, Skip's at its
// database tests' skip.
const (
	notice     = "skipping: skipped the example suite: set INBOX_CLUSTER_SUITES=1 to run it."
	skipNotice = "internal/optin/testdata/skipping: INBOX_POSTGRES_DSN is not set: skipped the example database tests (INBOX_REQUIRE_DBS=1 makes that a failure)"
)

// TestNoticeInPipedRun runs go test as the README's command does, on a list
// of packages whose first skips its suites (testdata/skipping), without the
// variables, its output in a pipe as in a CI log or in a file it appends
// to (>>): Notice's line must be in the output once, just before the
// package's ok line, with or without -v (before, it went to /dev/tty and a
// pipe never saw it), and Skip's reason, given by two tests, once before it
// without -v.
func TestNoticeInPipedRun(t *testing.T) {
	for _, c := range []struct {
		name          string
		verbose, file bool
	}{{"pipe", false, false}, {"pipe -v", true, false}, {"appended file", false, true}} {
		t.Run(c.name, func(t *testing.T) {
			out := runGoTest(t, c.verbose, c.file)
			lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
			at, ok, seen, skipAt, skips := -1, -1, 0, -1, 0
			for i, l := range lines {
				switch {
				case l == notice:
					at, seen = i, seen+1
				case l == skipNotice:
					skipAt, skips = i, skips+1
				case strings.HasPrefix(l, "ok  \t") && strings.HasSuffix(strings.Fields(l)[1], "/testdata/skipping"):
					ok = i
				}
			}
			if seen != 1 || at > ok || ok != at+1 {
				t.Errorf("the notice %d times, at line %d, the skipping package's ok at %d; want it once, just before the ok line:\n%s",
					seen, at, ok, out)
			}
			if !c.verbose && (skips != 1 || skipAt > at) {
				t.Errorf("the skip's reason %d times, at line %d; want it once, before line %d:\n%s", skips, skipAt, at, out)
			}
		})
	}
}

// runGoTest runs go test on testdata/skipping and testdata/quiet without
// the suites' variables and returns its output, read from a pipe or from a
// file opened to append.
func runGoTest(t *testing.T, verbose, file bool) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command, which the README's test command is: %v", err)
	}
	args := []string{"test", "-count=1"}
	if verbose {
		args = append(args, "-v")
	}
	cmd := exec.Command(goTool, append(args, "./testdata/skipping", "./testdata/quiet")...)
	cmd.Env = withoutInboxVars(os.Environ())
	if !file {
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(cmd.Args[1:], " "), err, out)
		}
		return string(out)
	}
	path := filepath.Join(t.TempDir(), "log")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	err = cmd.Run()
	f.Close()
	out, rerr := os.ReadFile(path)
	if err != nil || rerr != nil {
		t.Fatalf("go %s: %v %v\n%s", strings.Join(cmd.Args[1:], " "), err, rerr, out)
	}
	return string(out)
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
