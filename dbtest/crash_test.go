package dbtest

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
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
)

// The crash tests re-execute the test binary as a worker process (TestMain's
// INBOX_CHILD switch), let it claim a job and SIGKILL it mid-handler, then
// measure how the job comes back: at once with the same attempt and without
// the child's writes (row lock), at once with the attempt spent (advisory),
// only once the lease ran out with the attempt spent (lease).

// crashXLease is the real lease of the crash and load tests' lease form:
// short, so that a killed holder's jobs come back soon.
const crashXLease = 2 * time.Second

// crashXChildConfig is what a worker process is told, as JSON in
// INBOX_CHILD_CONFIG.
type crashXChildConfig struct {
	Engine  string        // Engine.Name
	DSN     string        // the data source, the SQLite file's included
	Table   string        // the queue table, made by Engine.CreateTable
	Form    string        // as for Table()
	Lease   time.Duration // lease form
	Effects string        // row lock: a table the handler writes through Delivery.Tx
	Ledger  string        // load: the ledger file
	Workers int           // load: goroutines
	Batch   int           // load: most jobs per claim
	Conns   int           // pool size
	Keep    bool          // lease: run a keeper per delivery
	Hold    int           // load: > 0 blocks the Hold-th delivery and every later one until killed
}

// crashXChildMain runs a worker role and returns the process's exit code.
func crashXChildMain(role string) int {
	var cfg crashXChildConfig
	if err := json.Unmarshal([]byte(os.Getenv("INBOX_CHILD_CONFIG")), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "child: INBOX_CHILD_CONFIG:", err)
		return 2
	}
	var err error
	switch role {
	case "crash":
		err = crashXChild(cfg)
	case "load":
		err = loadXChild(cfg)
	default:
		err = fmt.Errorf("unknown INBOX_CHILD role %q", role)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "child %s (pid %d): %v\n", role, os.Getpid(), err)
		return 2
	}
	return 0
}

// crashXEngine returns the engine named name.
func crashXEngine(name string) (Engine, error) {
	for _, e := range Engines {
		if e.Name == name {
			return e, nil
		}
	}
	return Engine{}, fmt.Errorf("no engine %q", name)
}

// crashXConfig is the queue configuration of a table in a form.
func crashXConfig(e Engine, table, form string, lease time.Duration) inbox.Config {
	cfg := inbox.Config{Dialect: e.Dialect, Table: Table(table, form), Prepare: confPrepare}
	if form == "lease" {
		cfg.Lease = lease
	}
	return cfg
}

// crashXChildQueue opens the child's database and queue.
func crashXChildQueue(cfg crashXChildConfig) (*sql.DB, *inbox.Queue, Engine, error) {
	e, err := crashXEngine(cfg.Engine)
	if err != nil {
		return nil, nil, e, err
	}
	db, err := sql.Open(e.Driver, cfg.DSN)
	if err != nil {
		return nil, nil, e, err
	}
	db.SetMaxOpenConns(cfg.Conns)
	db.SetMaxIdleConns(cfg.Conns)
	q, err := inbox.New(db, crashXConfig(e, cfg.Table, cfg.Form, cfg.Lease))
	if err != nil {
		db.Close()
		return nil, nil, e, err
	}
	return db, q, e, nil
}

// crashXChild claims one job, writes through its transaction when the form
// has one, runs a keeper under the lease, tells the parent on stdout and
// blocks until killed. It returns only if stdin closes first (the parent
// went away), so that no orphan lingers.
func crashXChild(cfg crashXChildConfig) error {
	db, q, e, err := crashXChildQueue(cfg)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var d *inbox.Delivery
	for d == nil {
		ds, err := q.Claim(ctx, 1)
		if err != nil {
			return err
		}
		if len(ds) == 1 {
			d = ds[0]
		} else if ctx.Err() != nil {
			return errors.New("no job to claim")
		} else {
			time.Sleep(10 * time.Millisecond)
		}
	}
	session := "-"
	if tx := d.Tx(); tx != nil {
		if _, err := tx.ExecContext(ctx, crashXQ(e, "INSERT INTO "+cfg.Effects+" (job_id, note) VALUES (?, 'child')"), d.ID()); err != nil {
			return err
		}
		if session, err = crashXSessionID(ctx, e, tx); err != nil {
			return err
		}
	}
	_, stop := d.Keep(context.Background())
	defer stop()
	fmt.Printf("CLAIMED %v %d %s\n", d.ID(), d.Attempt(), session)
	_, _ = io.Copy(io.Discard, os.Stdin)
	return errors.New("stdin closed before the parent killed this process")
}

// crashXSessionID returns the server's id of the session ex runs on.
func crashXSessionID(ctx context.Context, e Engine, ex interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}) (string, error) {
	q := "SELECT pg_backend_pid()"
	if e.IsMySQL() {
		q = "SELECT CONNECTION_ID()"
	}
	var id int64
	err := ex.QueryRowContext(ctx, q).Scan(&id)
	return strconv.FormatInt(id, 10), err
}

// crashXQ turns ? placeholders into PostgreSQL's $n for e.
func crashXQ(e Engine, q string) string {
	if !e.IsPostgres() {
		return q
	}
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// crashXProc is a running worker process.
type crashXProc struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string // its stdout, line by line; closed at EOF
	stderr *crashXBuffer
	done   chan struct{} // closed once it exited
	err    error         // Wait's result, set before done closes
	killed bool
}

// crashXBuffer is a bytes.Buffer safe for the writer os/exec runs.
type crashXBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *crashXBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *crashXBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// crashXStart starts the test binary as a worker in role. The process is
// killed, if still running, when the test ends.
func crashXStart(t testing.TB, name, role string, cfg crashXChildConfig) *crashXProc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := &crashXProc{name: name, lines: make(chan string, 64), stderr: &crashXBuffer{}, done: make(chan struct{})}
	// -test.run matches nothing, should the switch ever be missed.
	p.cmd = exec.Command(exe, "-test.run=^$")
	p.cmd.Env = append(os.Environ(), "INBOX_CHILD="+role, "INBOX_CHILD_CONFIG="+string(js))
	p.cmd.Stderr = p.stderr
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
		// Wait only after stdout is read to its end, as os/exec asks.
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			p.Kill()
		}
	})
	return p
}

// Line waits for the next line the worker prints, failing t if it exits or
// timeout passes first.
func (p *crashXProc) Line(t testing.TB, timeout time.Duration) string {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case l, ok := <-p.lines:
		if !ok {
			<-p.done
			t.Fatalf("%s exited (%v) before printing a line; stderr:\n%s", p.name, p.err, p.stderr)
		}
		return l
	case <-timer.C:
		t.Fatalf("%s printed nothing in %v; stderr:\n%s", p.name, timeout, p.stderr)
	}
	return ""
}

// Kill sends SIGKILL and waits for the process to be gone.
func (p *crashXProc) Kill() {
	p.killed = true
	_ = p.cmd.Process.Kill()
	for range p.lines {
		// Drain what it printed so that the reader can reach Wait.
	}
	<-p.done
}

// Stop closes the worker's stdin, its signal to finish, and waits up to
// timeout for it to exit, returning its exit error.
func (p *crashXProc) Stop(timeout time.Duration) error {
	p.stdin.Close()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	go func() {
		for range p.lines {
		}
	}()
	select {
	case <-p.done:
		return p.err
	case <-timer.C:
		p.Kill()
		return fmt.Errorf("%s did not exit within %v of being asked to stop", p.name, timeout)
	}
}

// crashXServerNow reads the clock the queue decides by: the server's for
// PostgreSQL and MariaDB, the process's for SQLite.
func crashXServerNow(t testing.TB, e Engine, db *sql.DB) time.Time {
	t.Helper()
	var raw any
	switch {
	case e.IsPostgres():
		if err := db.QueryRow("SELECT clock_timestamp()").Scan(&raw); err != nil {
			t.Fatal(err)
		}
	case e.IsMySQL():
		if err := db.QueryRow("SELECT UTC_TIMESTAMP(6)").Scan(&raw); err != nil {
			t.Fatal(err)
		}
	default:
		return time.Now().UTC()
	}
	tm, err := e.Dialect.ScanTime(raw)
	if err != nil {
		t.Fatal(err)
	}
	return tm.UTC()
}

// crashXRow reads a job's attempt and lease expiry (zero when NULL), and
// whether the row exists.
func crashXRow(t testing.TB, e Engine, db *sql.DB, table string, id any) (attempt int, lockedUntil time.Time, ok bool) {
	t.Helper()
	var raw any
	err := db.QueryRow(crashXQ(e, "SELECT attempt, locked_until FROM "+table+" WHERE id = ?"), id).Scan(&attempt, &raw)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, time.Time{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	if raw != nil {
		if lockedUntil, err = e.Dialect.ScanTime(raw); err != nil {
			t.Fatal(err)
		}
	}
	return attempt, lockedUntil.UTC(), true
}

// crashXCount returns the rows of table matching where (with args).
func crashXCount(t testing.TB, e Engine, db *sql.DB, table, where string, args ...any) int {
	t.Helper()
	q := "SELECT COUNT(*) FROM " + table
	if where != "" {
		q += " WHERE " + where
	}
	var n int
	if err := db.QueryRow(crashXQ(e, q), args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// crashXEffectsSchema creates the table a row-lock handler writes to.
func crashXEffectsSchema(e Engine, table string) []string {
	return []string{"DROP TABLE IF EXISTS " + table, "CREATE TABLE " + table + " (job_id bigint NOT NULL, note varchar(20) NOT NULL)"}
}

// TestCrash kills a child process mid-handler for every form on every
// engine and driver that supports it, and checks how the job comes back.
func TestCrash(t *testing.T) {
	crashXWall(t)
	for _, e := range Engines {
		for _, form := range e.Forms() {
			t.Run(e.Name+"/"+form, func(t *testing.T) {
				t.Parallel()
				crashXRun(t, e, form)
			})
		}
	}
}

func crashXRun(t *testing.T, e Engine, form string) {
	ctx := context.Background()
	crashXWall(t)
	dir := t.TempDir()
	dsn := e.DSN(t, dir)
	db := e.OpenDSN(t, dsn, 4)
	table := fmt.Sprintf("crash_%s_%s_%d", e.Name, form, os.Getpid())
	effects := fmt.Sprintf("crash_fx_%s_%d", e.Name, os.Getpid())
	e.CreateTable(t, db, table)
	t.Cleanup(func() { crashXDrop(t, db, table, table+"_dead", table+"_claims") })
	if form == "rowlock" {
		for _, s := range crashXEffectsSchema(e, effects) {
			if _, err := db.Exec(s); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() { crashXDrop(t, db, effects) })
	}
	q, err := inbox.New(db, crashXConfig(e, table, form, crashXLease))
	if err != nil {
		t.Fatal(err)
	}
	idAny, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte("crash")}})
	if err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprint(idAny)
	switch form {
	case "advisory":
		crashXRegister(e, table, 1)
	case "rowlock":
		crashXRegister(e, table, 0)
		crashXRegister(e, effects, 0)
	}

	child := crashXStart(t, "child", "crash", crashXChildConfig{Engine: e.Name, DSN: dsn, Table: table, Form: form,
		Lease: crashXLease, Effects: effects, Conns: 4})
	f := strings.Fields(child.Line(t, 2*time.Minute))
	if len(f) != 4 || f[0] != "CLAIMED" {
		t.Fatalf("child said %q, want CLAIMED id attempt session", f)
	}
	if f[1] != id || f[2] != "1" {
		t.Fatalf("child claimed job %s attempt %s, want job %s attempt 1", f[1], f[2], id)
	}
	// While the child lives, the job is held; except that SQLite's
	// advisory keys are held in the process that claimed them, so this
	// process cannot see them (one process serves a SQLite file).
	if !(e.IsSQLite() && form == "advisory") {
		if ds, err := q.Claim(ctx, 1); err != nil || len(ds) != 0 {
			t.Fatalf("claim while the child holds the job: %d deliveries, %v; want none", len(ds), err)
		}
	}

	child.Kill()
	killed := time.Now()
	// The lease the child last wrote, and the clock then: the job may come
	// back no earlier than that expiry.
	var expiry, nowAtKill time.Time
	if form == "lease" {
		var ok bool
		_, expiry, ok = crashXRow(t, e, db, table, idAny)
		nowAtKill = crashXServerNow(t, e, db)
		if !ok || expiry.IsZero() {
			t.Fatalf("job %s: no lease in its row after the kill", id)
		}
	}
	var d *inbox.Delivery
	polls := 0
	deadline := killed.Add(inbox.DefaultLease)
	for d == nil {
		ds, err := q.Claim(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		polls++
		if len(ds) == 1 {
			d = ds[0]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s not claimable %v after the kill (%d claims tried)", id, inbox.DefaultLease, polls)
		}
		time.Sleep(2 * time.Millisecond)
	}
	delay := time.Since(killed)
	if fmt.Sprint(d.ID()) != id {
		t.Fatalf("claimed job %v, want %s", d.ID(), id)
	}
	wantAttempt := 2
	if form == "rowlock" {
		wantAttempt = 1
	}
	if d.Attempt() != wantAttempt {
		t.Errorf("after the crash: attempt %d, want %d (%s)", d.Attempt(), wantAttempt, map[bool]string{true: "a crash spends none under the row lock", false: "a crash spends one"}[form == "rowlock"])
	}
	switch form {
	case "lease":
		// The claim happened at its expiry less the lease, by the queue's
		// clock: never before the lease the killed child held ran out.
		claimedAt := d.Expiry().Add(-crashXLease)
		if claimedAt.Before(expiry) {
			t.Errorf("claimed at %v, before the killed child's lease ran out at %v", claimedAt, expiry)
		}
		t.Logf("FIGURE: crash %s lease: redelivered %v after the kill (lease %v, %v of it left at the kill), attempt 1 -> %d, %d claims tried",
			e.Name, delay.Round(time.Millisecond), crashXLease, expiry.Sub(nowAtKill).Round(time.Millisecond), d.Attempt(), polls)
	default:
		// At once: nothing in these forms waits on a clock, so the job is
		// back as soon as the server has ended the dead process's session,
		// long before anything lease-like (DefaultLease/3).
		if delay > inbox.DefaultLease/3 {
			t.Errorf("redelivered %v after the kill; the %s form returns a job at once", delay, form)
		}
		t.Logf("FIGURE: crash %s %s: redelivered %v after the kill, attempt 1 -> %d, %d claims tried",
			e.Name, form, delay.Round(time.Millisecond), d.Attempt(), polls)
	}
	if form == "rowlock" {
		if n := crashXCount(t, e, db, effects, "job_id = ?", idAny); n != 0 {
			t.Errorf("%d rows the killed child wrote through its transaction survived", n)
		}
		// The child's session is gone, not left idle in its transaction.
		crashXEventually(t, 30*time.Second, "the killed child's session to end", func() error {
			q := "SELECT COUNT(*) FROM pg_stat_activity WHERE pid = $1"
			if e.IsMySQL() {
				q = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?"
			}
			var n int
			if err := db.QueryRow(q, f[3]).Scan(&n); err != nil {
				return err
			}
			if n != 0 {
				return fmt.Errorf("session %s still listed", f[3])
			}
			return nil
		})
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if n := crashXCount(t, e, db, table, ""); n != 0 {
		t.Errorf("%d rows left after the ack", n)
	}
	crashXAssertNoLocks(t, e, db, table, 1)
}
