package main

// graphile-worker, the Node.js job queue on PostgreSQL, as a second peer of
// inbox on pgx in -run peers. Its side is a node process running
// bench/graphile/run.js, which this file drives line by line over stdin and
// stdout: "fill N" adds N jobs with addJobs, "segment TOTAL MS" starts a
// runner on them (concurrentJobs = workers, a local queue of 500, batched
// completions) and stops it after MS ms or TOTAL jobs, answering with the
// jobs its no-op task handled and the time from the runner's start to the
// end of its stop. The stop resolves once the handled jobs' completions are
// written (graphile-worker deletes a completed job) and the local queue's
// unstarted jobs returned, so the count is exact: every job counted was
// deleted within the segment's time, and the line checks at its end that
// the jobs left are the jobs added less those counted, none locked or
// attempted.
//
// Node and its packages are optional: without node or npm, or when
// `npm ci` fails, the run prints "graphile-worker skipped: …" and goes on.
// Tests leave graphile-worker out (CI has no node, nor node_modules, and
// TestPeers counts one line per worker count); INBOX_BENCH_GRAPHILE=0
// leaves it out of a run.

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// graphileSchema is graphile-worker's default schema, which run.js uses;
// the run drops it at its end.
const graphileSchema = "graphile_worker"

// graphileWanted: in a run of the program unless INBOX_BENCH_GRAPHILE=0,
// never in a test binary.
func graphileWanted() bool {
	return os.Getenv("INBOX_BENCH_GRAPHILE") != "0" && !testing.Testing()
}

// graphileDir finds bench/graphile: next to this source file when the
// program runs from its sources (go run), else from the working directory.
func graphileDir() string {
	if _, file, _, ok := runtime.Caller(0); ok {
		d := filepath.Join(filepath.Dir(file), "graphile")
		if _, err := os.Stat(filepath.Join(d, "run.js")); err == nil {
			return d
		}
	}
	for _, d := range []string{filepath.Join("bench", "graphile"), "graphile"} {
		if _, err := os.Stat(filepath.Join(d, "run.js")); err == nil {
			return d
		}
	}
	return filepath.Join("bench", "graphile")
}

// graphilePeer gets graphile-worker ready: node and npm on the PATH,
// its packages installed (npm ci, when node_modules is missing) and its
// schema dropped. ok is false when it cannot run, said in one line on log.
func graphilePeer(ctx context.Context, log io.Writer) (p peer, ok bool) {
	name, err := graphileSetup(ctx)
	if err != nil {
		fmt.Fprintf(log, "graphile-worker skipped: %v\n", err)
		return peer{}, false
	}
	side := func(ctx context.Context, e engine, db *sql.DB, dir string, workers int, log io.Writer) (peerSide, error) {
		return newGraphileSide(ctx, e, db, dir, workers, log)
	}
	// Its local queue makes it about as fast as inbox from one worker on:
	// River's first guess would leave it out of jobs in the first line.
	return peer{name: name, guess: 40000, side: side}, true
}

// graphileSetup checks for node and npm, installs the pinned packages when
// they are missing, and names the peer with the versions it will run.
func graphileSetup(ctx context.Context) (string, error) {
	node, err := exec.LookPath("node")
	if err != nil {
		return "", errors.New("node not found on PATH")
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		return "", errors.New("npm not found on PATH")
	}
	gd := graphileDir()
	pkg := filepath.Join(gd, "node_modules", "graphile-worker", "package.json")
	if _, err := os.Stat(pkg); err != nil {
		// npm ci installs exactly package-lock.json, into gd only.
		var out bytes.Buffer
		cmd := exec.CommandContext(ctx, npm, "ci", "--prefix", gd, "--no-audit", "--no-fund")
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("npm ci --prefix %s: %v: %s", gd, err, npmError(out.String()))
		}
	}
	b, err := os.ReadFile(pkg)
	if err != nil {
		return "", err
	}
	var v struct{ Version string }
	if err := json.Unmarshal(b, &v); err != nil {
		return "", fmt.Errorf("%s: %v", pkg, err)
	}
	nv, err := exec.CommandContext(ctx, node, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("node --version: %v", err)
	}
	return fmt.Sprintf("graphile-worker %s (Node %s)", v.Version, strings.TrimSpace(string(nv))), nil
}

// npmError picks npm's reason out of its output: its "npm error" lines but
// the one pointing to its log file, at most three.
func npmError(s string) string {
	var why []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, "npm error") && !strings.Contains(l, "complete log") && len(why) < 3 {
			why = append(why, strings.TrimSpace(strings.TrimPrefix(l, "npm error")))
		}
	}
	if len(why) == 0 {
		return strings.TrimSpace(s)
	}
	return strings.Join(why, "; ")
}

func graphileDropSchema(ctx context.Context, e engine, dir string) {
	db, err := e.open(dir, 1)
	if err != nil {
		return
	}
	defer db.Close()
	db.ExecContext(ctx, "DROP SCHEMA IF EXISTS "+graphileSchema+" CASCADE")
}

// graphileSide is one node process for a line, with an empty job table of
// its own.
type graphileSide struct {
	db     *sql.DB
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string // run.js's answers; closed when its stdout ends
	exited chan struct{}
	// handled counts the jobs the segments handled, filled the jobs added.
	handled, filled int
	// start and stop are the longest a runner took to start and to stop,
	// both within the segments' time.
	start, stop time.Duration
}

// newGraphileSide drops graphile-worker's schema, so that the line starts
// on an empty job table, and starts run.js, which migrates it afresh.
func newGraphileSide(ctx context.Context, e engine, db *sql.DB, dir string, workers int, log io.Writer) (*graphileSide, error) {
	if _, err := db.ExecContext(ctx, "DROP SCHEMA IF EXISTS "+graphileSchema+" CASCADE"); err != nil {
		return nil, err
	}
	gd := graphileDir()
	// Not CommandContext: close ends the process by closing its stdin.
	cmd := exec.Command("node", filepath.Join(gd, "run.js"))
	cmd.Dir = gd
	cmd.Env = append(os.Environ(),
		"GRAPHILE_DSN="+e.dsn(dir),
		"GRAPHILE_WORKERS="+strconv.Itoa(workers),
		"GRAPHILE_PAYLOAD="+string(payload)) // 128 ASCII letters
	cmd.Stderr = log
	stdin, stdout, err := startPiped(cmd)
	if err != nil {
		return nil, err
	}
	g := &graphileSide{db: db, cmd: cmd, stdin: stdin, lines: make(chan string), exited: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			g.lines <- sc.Text()
		}
		close(g.lines)
		cmd.Wait()
		close(g.exited)
	}()
	if _, err := g.answer(ctx, 60*time.Second); err != nil {
		g.close()
		return nil, err
	}
	return g, nil
}

// answer waits for run.js's next line, for at most wait.
func (g *graphileSide) answer(ctx context.Context, wait time.Duration) (string, error) {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case l, ok := <-g.lines:
		if !ok {
			return "", errors.New("graphile-worker: run.js exited (its error is in the log above)")
		}
		return l, nil
	case <-t.C:
		return "", fmt.Errorf("graphile-worker: no answer from run.js in %v", wait)
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

func (g *graphileSide) ask(ctx context.Context, cmd string, wait time.Duration) (string, error) {
	if _, err := fmt.Fprintln(g.stdin, cmd); err != nil {
		return "", err
	}
	return g.answer(ctx, wait)
}

func (g *graphileSide) fill(ctx context.Context, n int) error {
	l, err := g.ask(ctx, "fill "+strconv.Itoa(n), 5*time.Minute)
	if err == nil && l != "filled" {
		err = fmt.Errorf("graphile-worker: fill answered %q", l)
	}
	if err == nil {
		g.filled += n
	}
	return err
}

// segment has run.js start a runner and stop it after duration or total
// jobs; its time runs from the runner's start to the end of its stop.
func (g *graphileSide) segment(ctx context.Context, workers, total int, duration time.Duration) (result, int) {
	l, err := g.ask(ctx, fmt.Sprintf("segment %d %d", total, duration.Milliseconds()), duration+time.Minute)
	if err != nil {
		return result{err: err}, 0
	}
	var jobs int
	var elapsed, start, stop int64
	if _, err := fmt.Sscanf(l, "done %d %d %d %d", &jobs, &elapsed, &start, &stop); err != nil {
		return result{err: fmt.Errorf("graphile-worker: segment answered %q", l)}, 0
	}
	g.handled += jobs
	g.start = max(g.start, time.Duration(start))
	g.stop = max(g.stop, time.Duration(stop))
	return result{jobs: jobs, elapsed: time.Duration(elapsed)}, jobs
}

// pending counts the jobs left in graphile-worker's public jobs view, and
// checks that they are the jobs added less those handled, and that none
// is locked or was attempted (a job handled and not deleted, or returned
// from the local queue without its attempt undone).
func (g *graphileSide) pending(ctx context.Context) (int, error) {
	var n, other int
	err := g.db.QueryRowContext(ctx, "SELECT count(*), count(*) FILTER (WHERE locked_at IS NOT NULL OR attempts > 0)"+
		" FROM "+graphileSchema+".jobs").Scan(&n, &other)
	if err != nil {
		return 0, err
	}
	if other != 0 || n != g.filled-g.handled {
		return 0, fmt.Errorf("graphile-worker: %d jobs added, %d handled, %d left, %d of them locked or attempted", g.filled, g.handled, n, other)
	}
	return n, nil
}

func (g *graphileSide) note() string {
	return fmt.Sprintf(" (a runner took up to %v to start and %v to stop, within the segments' time)",
		g.start.Round(time.Millisecond), g.stop.Round(time.Millisecond))
}

// close ends run.js by closing its stdin (it closes its pool and exits),
// killing it if it has not exited after 30 s.
func (g *graphileSide) close() {
	g.stdin.Close()
	go func() {
		for range g.lines { // drain, so that the reader reaches Wait
		}
	}()
	select {
	case <-g.exited:
	case <-time.After(30 * time.Second):
		g.cmd.Process.Kill()
		<-g.exited
	}
}

// startPiped starts cmd with pipes to its standard input and from its
// standard output.
func startPiped(cmd *exec.Cmd) (io.WriteCloser, io.ReadCloser, error) {
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	return stdin, stdout, nil
}
