package cluster

import (
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Eventually polls f every 20 ms until it returns nil, failing t with f's
// last error after timeout: the suites wait for events (a standby
// streaming, a leader elected, a queue drained) by polling with a
// deadline, generous for a loaded machine, never by sleeping.
func Eventually(t testing.TB, timeout time.Duration, what string, f func() error) {
	t.Helper()
	Poll(t, timeout, 20*time.Millisecond, what, f)
}

// Poll is Eventually polling every every, for a check that costs more
// than a query.
func Poll(t testing.TB, timeout, every time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s: %v", timeout, what, err)
		}
		time.Sleep(every)
	}
}

// Tail returns the last n lines of the file at path, for a failure
// message: a server's log says why it did not start or answer.
func Tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// FreePort returns a port on 127.0.0.1 that was free a moment ago: the
// servers never take a port a real server may use. A server that loses
// the race for it fails to bind, which its harness may retry.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// FileExists reports whether p is a file (not a directory).
func FileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

// FindPgBin is where PostgreSQL's server programs are: INBOX_PG_BIN, or
// the newest /usr/lib/postgresql/N/bin (Debian's layout, several majors
// side by side) holding every one of programs; "" when none does.
func FindPgBin(programs ...string) string {
	has := func(dir string) bool {
		for _, p := range programs {
			if !FileExists(filepath.Join(dir, p)) {
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

// Env is a server's environment: this process's, in the C locale, with
// HOME at home, and without the variables whose names begin with one of
// drop (PG, PATRONI, ETCD …), which would point a program at a server the
// test did not start.
func Env(home string, drop ...string) []string {
	out := []string{"HOME=" + home, "LC_ALL=C"}
	drop = append(drop, "HOME=", "LC_", "LANG")
	for _, kv := range os.Environ() {
		if !slices.ContainsFunc(drop, func(p string) bool { return strings.HasPrefix(kv, p) }) {
			out = append(out, kv)
		}
	}
	return out
}
