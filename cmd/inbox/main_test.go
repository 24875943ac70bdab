package main

import (
	"bytes"
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sqlinbox/inbox"
)

// refusing is a connector that counts the connections asked of it and
// gives none: a command that reached the database fails with exit code 1.
type refusing struct{ n atomic.Int64 }

func (r *refusing) Connect(context.Context) (driver.Conn, error) {
	r.n.Add(1)
	return nil, errors.New("refusing: no database here")
}

func (r *refusing) Driver() driver.Driver { return nil }

// withRefusing makes run open the refusing connector for the test.
func withRefusing(t *testing.T) *refusing {
	r := &refusing{}
	saved := opener
	opener = func(string, string) (*sql.DB, error) { return sql.OpenDB(r), nil }
	t.Cleanup(func() { opener = saved })
	return r
}

func runArgs(env map[string]string, args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, func(k string) string { return env[k] }, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

var dsnSet = map[string]string{"INBOX_DSN": "anything"}

func TestUsageErrors(t *testing.T) {
	r := withRefusing(t)
	base := []string{"-engine", "sqlite", "-table", "jobs", "-lease-column", "locked_until"}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		code int
	}{
		{"no args", dsnSet, nil, exitUsage},
		{"no engine", dsnSet, []string{"-table", "jobs", "stats"}, exitUsage},
		{"bad engine", dsnSet, []string{"-engine", "oracle", "-table", "jobs", "stats"}, exitUsage},
		{"bad flag", dsnSet, []string{"-nope", "stats"}, exitUsage},
		{"no command", dsnSet, base, exitUsage},
		{"unknown command", dsnSet, append(base, "frobnicate"), exitUsage},
		{"no dsn", nil, append(base, "stats"), exitUsage},
		{"stats argument", dsnSet, append(base, "stats", "x"), exitUsage},
		{"show no id", dsnSet, append(base, "show"), exitUsage},
		{"show two ids", dsnSet, append(base, "show", "1", "2"), exitUsage},
		{"show text id", dsnSet, append(base, "show", "abc"), exitUsage},
		{"cancel text id", dsnSet, append(base, "cancel", "1x"), exitUsage},
		{"requeue no id", dsnSet, append(base, "requeue"), exitUsage},
		{"jobs bad state", dsnSet, append(base, "jobs", "-state", "sleeping"), exitUsage},
		{"jobs limit 0", dsnSet, append(base, "jobs", "-limit", "0"), exitUsage},
		{"jobs limit high", dsnSet, append(base, "jobs", "-limit", "1001"), exitUsage},
		{"jobs after and before", dsnSet, append(base, "jobs", "-after", "1", "-before", "3"), exitUsage},
		{"jobs dead before", dsnSet, append(base, "jobs", "-state", "dead", "-before", "3"), exitUsage},
		{"jobs bad after", dsnSet, append(base, "jobs", "-after", "x"), exitUsage},
		{"purge negative", dsnSet, append(base, "purge", "-older", "-1h", "-yes"), exitUsage},
		{"purge without yes", dsnSet, append(base, "purge"), exitRefused},
		{"purge older without yes", dsnSet, append(base, "purge", "-older", "1h"), exitRefused},
		{"pause bad flag", dsnSet, append(base, "pause", "-who", "me"), exitUsage},
		{"bad timeout", dsnSet, append([]string{"-timeout", "0s"}, append(base, "stats")...), exitUsage},
		{"no table", dsnSet, []string{"-engine", "sqlite", "stats"}, exitUsage},
		{"bad description", dsnSet, []string{"-engine", "sqlite", "-table", "jobs; drop", "stats"}, exitUsage},
		{"sqlite row lock", dsnSet, []string{"-engine", "sqlite", "-table", "jobs", "stats"}, exitUsage},
		{"missing config", dsnSet, []string{"-engine", "sqlite", "-config", "/nonexistent.json", "stats"}, exitUsage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := r.n.Load()
			code, stdout, stderr := runArgs(tc.env, tc.args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d; stderr %q", code, tc.code, stderr)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
			if !strings.HasPrefix(stderr, "inbox: ") {
				t.Errorf("stderr %q, want an inbox: error", stderr)
			}
			if r.n.Load() != before {
				t.Errorf("a connection was asked for")
			}
		})
	}
}

func TestJSONErrors(t *testing.T) {
	r := withRefusing(t)
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"-json", "-engine", "oracle", "stats"}, exitUsage},
		{[]string{"-json", "-nope", "stats"}, exitUsage},
		{[]string{"-json", "-engine", "sqlite", "-table", "jobs", "show", "x"}, exitUsage},
		{[]string{"-json", "-engine", "sqlite", "-table", "jobs", "purge"}, exitRefused},
		// The database refuses: the operation failed.
		{[]string{"-json", "-engine", "sqlite", "-table", "jobs", "-lease-column", "locked_until", "show", "1"}, exitFailed},
	} {
		code, stdout, stderr := runArgs(dsnSet, tc.args...)
		if code != tc.code {
			t.Errorf("%q: exit %d, want %d", tc.args, code, tc.code)
		}
		var out map[string]any
		if err := json.Unmarshal([]byte(stdout), &out); err != nil {
			t.Fatalf("%q: stdout %q: %v", tc.args, stdout, err)
		}
		if len(out) != 2 || out["code"] != float64(tc.code) || out["error"] == "" {
			t.Errorf("%q: %v, want error and code %d", tc.args, out, tc.code)
		}
		if stderr != "" && tc.code != exitUsage {
			t.Errorf("%q: stderr %q", tc.args, stderr)
		}
	}
	if r.n.Load() != 1 {
		t.Errorf("%d connections asked for, want 1 (show)", r.n.Load())
	}
}

func TestHelp(t *testing.T) {
	code, stdout, stderr := runArgs(nil, "-h")
	if code != exitOK || stdout != "" {
		t.Fatalf("exit %d, stdout %q", code, stdout)
	}
	for _, want := range []string{"Exit codes:", "INBOX_DSN", "-engine", "purge [-older 168h] -yes", "4  refused"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("usage lacks %q:\n%s", want, stderr)
		}
	}
}

func TestConfigFileAndFlags(t *testing.T) {
	path := filepath.Join(t.TempDir(), "queue.json")
	file := inbox.Table{Name: "from_file", LockedUntil: "locked_until", DeadTable: "dead", Data: []string{"a", "b"}, ControlTable: "ctl"}
	b, _ := json.Marshal(file)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	g, err := parseGlobal([]string{"-engine", "postgres", "-config", path, "-table", "from_flag", "-data", "x,y,z", "-control-table", "", "-text-ids", "show", "u-1"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	want := file
	want.Name, want.Data, want.ControlTable = "from_flag", []string{"x", "y", "z"}, ""
	if !reflect.DeepEqual(g.table, want) {
		t.Errorf("table %+v, want %+v", g.table, want)
	}
	if id, err := g.parseID("u-1"); err != nil || id != "u-1" {
		t.Errorf("text id: %v, %v", id, err)
	}
	if id, err := (global{}).parseID("42"); err != nil || id != int64(42) {
		t.Errorf("integer id: %#v, %v", id, err)
	}

	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte(`{"Name": "jobs", "Lease": "x"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = parseGlobal([]string{"-engine", "postgres", "-config", bad, "stats"}, &bytes.Buffer{})
	var ce *cliError
	if !errors.As(err, &ce) || ce.code != exitUsage {
		t.Errorf("unknown field: %v, want a usage error", err)
	}
}

func TestCodeOf(t *testing.T) {
	for err, want := range map[error]int{
		inbox.ErrNotFound:       exitNotFound,
		inbox.ErrNotDead:        exitNotFound,
		inbox.ErrInWork:         exitRefused,
		inbox.ErrNoControlTable: exitRefused,
		inbox.ErrNoDeadTable:    exitRefused,
		inbox.ErrNoDeadAt:       exitRefused,
		inbox.ErrNoEnqueuedAt:   exitRefused,
		inbox.ErrNoInWorkList:   exitRefused,
		inbox.ErrRequeueNeedsID: exitRefused,
		inbox.ErrDeadID:         exitRefused,
		errors.New("broken"):    exitFailed,
	} {
		if got := codeOf(err); got != want {
			t.Errorf("%v: %d, want %d", err, got, want)
		}
	}
}
