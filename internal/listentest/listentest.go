// Package listentest is the test suite of the PostgreSQL listeners, the
// modules under listen/, each of which runs it with its driver. It lives in
// the root module, on its exported API and the standard library, so that
// neither listener's module links the other's driver.
//
// On a real PostgreSQL (INBOX_POSTGRES_DSN): a notification sent by another
// process reaches an idle worker loop through the listener; a listener
// whose session is ended by pg_terminate_backend reconnects, the job
// enqueued meanwhile is handled long before the loops' fallback poll could
// fire, and notifications arrive again; a listener that cannot reach its
// server keeps trying and returns when its context ends; no goroutine is
// left after any of them. Every wait is for a signal, or a poll with a
// deadline; the fallback poll is ten minutes, so a job handled within the
// 30-second deadline was woken, not polled for.
package listentest

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/connhook"
	"github.com/sqlinbox/inbox/internal/optin"
	"github.com/sqlinbox/inbox/worker"
)

// Driver is what a listener's module gives the suite.
type Driver struct {
	// Name names the driver in tables and sessions.
	Name string
	// Connector opens the driver's connector for dsn: the pools of the
	// tests and of the enqueuing process use it.
	Connector func(dsn string) (driver.Connector, error)
	// Listener makes the listener under test, reconnecting after 10 ms
	// doubled up to 200 ms, pinging a connection silent for health (zero:
	// the listener's default), reporting its errors to onError.
	Listener func(dsn string, health time.Duration, onError func(error)) worker.Listener
	// NoLeaks is called once a test has set up its pools; the function it
	// returns fails the test if a goroutine started since is still running
	// (the listener modules pass goleak.VerifyNone with IgnoreCurrent).
	NoLeaks func(t *testing.T) func()
}

const (
	never    = 10 * time.Minute // the loops' fallback poll: it never fires here
	deadline = 30 * time.Second
	channel  = "inbox_listen_test"
	// enqueueEnv, set to a table, makes Main the process that enqueues for
	// NotifyFromAnotherProcess.
	enqueueEnv = "LISTEN_TEST_ENQUEUE"
)

// Main is the listener module's TestMain. It doubles as the process that
// enqueues for NotifyFromAnotherProcess: with LISTEN_TEST_ENQUEUE set to a
// table, it enqueues one job there through a pool of its own and exits.
func Main(m *testing.M, d Driver) {
	if table := os.Getenv(enqueueEnv); table != "" {
		if err := childEnqueue(d, table); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func childEnqueue(d Driver, table string) error {
	c, err := d.Connector(os.Getenv("INBOX_POSTGRES_DSN"))
	if err != nil {
		return err
	}
	db := sql.OpenDB(c)
	defer db.Close()
	q, err := inbox.New(db, queueConfig(table))
	if err != nil {
		return err
	}
	_, err = q.Enqueue(context.Background(), db, inbox.Job{Data: []any{[]byte("from another process")}})
	return err
}

// dsn returns INBOX_POSTGRES_DSN, skipping the test without it (failing it
// under INBOX_REQUIRE_DBS=1).
func dsn(t *testing.T) string {
	t.Helper()
	return optin.DSN(t, "INBOX_POSTGRES_DSN", "the listener tests")
}

// withAppName names the sessions a DSN opens, so that the test can find the
// listener's session.
func withAppName(t *testing.T, dsn, name string) string {
	t.Helper()
	if strings.Contains(dsn, "://") {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		v := u.Query()
		v.Set("application_name", name)
		u.RawQuery = v.Encode()
		return u.String()
	}
	return dsn + " application_name=" + name
}

func queueConfig(table string) inbox.Config {
	return inbox.Config{Dialect: inbox.Postgres, NotifyChannel: channel,
		Table: inbox.Table{Name: table, LockedUntil: "locked_until", DeadTable: table + "_dead"}}
}

// setup creates a lease table and opens the worker's pool (counting its
// claims) and another pool, each with a queue on the table.
func setup(t *testing.T, d Driver, name string) (table string, wdb *sql.DB, wq *inbox.Queue, count *connhook.Watch, odb *sql.DB, oq *inbox.Queue) {
	t.Helper()
	table = fmt.Sprintf("listen_%s_%s_%d", name, d.Name, os.Getpid())
	odb = open(t, d, dsn(t))
	for _, s := range []string{
		"DROP TABLE IF EXISTS " + table, "DROP TABLE IF EXISTS " + table + "_dead",
		"CREATE TABLE " + table + " (id bigserial PRIMARY KEY, attempt integer NOT NULL DEFAULT 1, locked_until timestamptz, payload bytea NOT NULL)",
		"CREATE TABLE " + table + "_dead (id bigint PRIMARY KEY, attempt integer NOT NULL, payload bytea NOT NULL)",
	} {
		if _, err := odb.Exec(s); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, s := range []string{"DROP TABLE IF EXISTS " + table, "DROP TABLE IF EXISTS " + table + "_dead"} {
			if _, err := odb.Exec(s); err != nil {
				t.Error(err)
			}
		}
	})
	wdb, count = openCounting(t, d, dsn(t))
	var err error
	if wq, err = inbox.New(wdb, queueConfig(table)); err != nil {
		t.Fatal(err)
	}
	count.Add(wq.Statements().Claim.For(1).SQL) // the loops claim one job at a time
	if oq, err = inbox.New(odb, queueConfig(table)); err != nil {
		t.Fatal(err)
	}
	return table, wdb, wq, count, odb, oq
}

// open opens a pool on dsn with d's connector, closed when the test ends.
func open(t *testing.T, d Driver, dsn string) *sql.DB {
	t.Helper()
	c, err := d.Connector(dsn)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	t.Cleanup(func() { db.Close() })
	return db
}

// observed wraps a listener, reporting each wake-up it relays.
type observed struct {
	worker.Listener
	wakes chan struct{}
}

func (o observed) Listen(ctx context.Context, channel string, wake func()) error {
	return o.Listener.Listen(ctx, channel, func() {
		select {
		case o.wakes <- struct{}{}:
		default: // the test reads what it waits for; more may come
		}
		wake()
	})
}

// started runs f in a goroutine, returning its result's channel.
func started(f func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return ch
}

func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	timer := time.NewTimer(deadline)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("waited %v for %s", deadline, what)
	}
	var zero T
	return zero
}

// drain empties ch.
func drain[T any](ch <-chan T) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

// untilOK polls f until it returns nil, failing after the deadline.
func untilOK(t *testing.T, what string, f func() error) {
	t.Helper()
	end := time.Now().Add(deadline)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("waited %v for %s: %v", deadline, what, err)
		}
		time.Sleep(10 * time.Millisecond) // polling the server, with a deadline
	}
}

// report returns an OnError that passes errors to ch without blocking.
func report(ch chan error) func(error) {
	return func(err error) {
		select {
		case ch <- err:
		default:
		}
	}
}

// NotifyFromAnotherProcess: a job enqueued by another process (the test
// binary, run again through Main) wakes an idle loop through the listener,
// and no goroutine is left once the loop and the listener have returned.
func NotifyFromAnotherProcess(t *testing.T, d Driver) {
	table, wdb, wq, count, _, _ := setup(t, d, "notify")
	leaks := d.NoLeaks(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wakes := make(chan struct{}, 8)
	listened := started(func() error { return worker.Listen(ctx, wq, observed{d.Listener(dsn(t), 0, nil), wakes}) })
	recv(t, wakes, "the listener to listen")
	handled := make(chan string, 1)
	worked := started(func() error {
		return worker.Run(ctx, wq, worker.Config{Poll: never}, func(_ context.Context, del *inbox.Delivery) error {
			var p []byte
			if err := del.Scan(&p); err != nil {
				return err
			}
			handled <- string(p)
			return nil
		})
	})
	// The loop's first claim is done: it is idle, and only a wake-up makes
	// it claim again.
	count.Wait(t, 1, deadline)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), enqueueEnv+"="+table)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the enqueuing process: %v\n%s", err, out)
	}
	recv(t, wakes, "the notification")
	if p := recv(t, handled, "the job"); p != "from another process" {
		t.Errorf("handled %q", p)
	}
	cancel()
	if err := recv(t, worked, "Run to return"); err != nil {
		t.Errorf("Run: %v", err)
	}
	if err := recv(t, listened, "Listen to return"); err != nil {
		t.Errorf("Listen: %v", err)
	}
	wdb.Close()
	leaks()
}

// Reconnect: the listener's session is ended by pg_terminate_backend. A job
// enqueued at once by another pool (the notification perhaps lost with the
// session) is handled before the deadline, with the fallback poll at ten
// minutes; the listener reports the loss, listens again on a new session,
// and relays the next notification. No goroutine is left at the end.
func Reconnect(t *testing.T, d Driver) {
	_, wdb, wq, count, odb, oq := setup(t, d, "reconnect")
	app := fmt.Sprintf("inbox_listen_%s_%d", d.Name, os.Getpid())
	leaks := d.NoLeaks(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wakes := make(chan struct{}, 8)
	lost := make(chan error, 8)
	l := d.Listener(withAppName(t, dsn(t), app), 0, report(lost))
	listened := started(func() error { return worker.Listen(ctx, wq, observed{l, wakes}) })
	recv(t, wakes, "the listener to listen")
	handled := make(chan any, 2)
	worked := started(func() error {
		return worker.Run(ctx, wq, worker.Config{Poll: never}, func(_ context.Context, del *inbox.Delivery) error {
			handled <- del.ID()
			return nil
		})
	})
	count.Wait(t, 1, deadline)

	old := listenerPID(t, odb, app, 0)
	var ended bool
	if err := odb.QueryRow("SELECT pg_terminate_backend($1)", old).Scan(&ended); err != nil || !ended {
		t.Fatalf("pg_terminate_backend(%d): %v %v", old, ended, err)
	}
	id := enqueueQuietly(t, odb, oq)
	if got := recv(t, handled, "the job enqueued while the listener was cut off"); got != id {
		t.Errorf("handled %v, want %v", got, id)
	}
	t.Logf("the listener reported: %v", recv(t, lost, "the listener to report the lost connection"))

	// A new session listens, and notifications arrive again.
	pid := listenerPID(t, odb, app, old)
	t.Logf("listener session %d ended, %d listens", old, pid)
	drain(wakes)
	drain(lost)
	if _, err := odb.Exec("SELECT pg_notify($1, '')", channel); err != nil {
		t.Fatal(err)
	}
	recv(t, wakes, "a notification after the reconnection")
	select {
	case err := <-lost:
		t.Errorf("the listener lost its connection again: %v", err)
	default:
	}

	cancel()
	if err := recv(t, worked, "Run to return"); err != nil {
		t.Errorf("Run: %v", err)
	}
	if err := recv(t, listened, "Listen to return"); err != nil {
		t.Errorf("Listen: %v", err)
	}
	wdb.Close()
	leaks()
}

// enqueueQuietly enqueues a job as another process would: in a
// transaction, the notification sent at its commit, no Wake.
func enqueueQuietly(t *testing.T, db *sql.DB, q *inbox.Queue) any {
	t.Helper()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	id, err := q.Enqueue(context.Background(), tx, inbox.Job{Data: []any{[]byte("during the cut")}})
	if err != nil {
		_ = tx.Rollback()
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return id
}

// listenerPID polls for the session named app that has run LISTEN and is
// idle, other than not, and returns its pid. The listeners ping only once
// they listen, so a ping as the last statement (lib/pq's empty query,
// pgx's "-- ping") says so too.
func listenerPID(t *testing.T, db *sql.DB, app string, not int) int {
	t.Helper()
	var pid int
	untilOK(t, "the listener's session", func() error {
		err := db.QueryRow(`SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND pid <> $2
			AND state = 'idle' AND (query LIKE 'LISTEN %' OR query IN ('', '-- ping'))`, app, not).Scan(&pid)
		if errors.Is(err, sql.ErrNoRows) {
			return errors.New("no session named " + app + " listening")
		}
		return err
	})
	return pid
}

// Unreachable: a listener whose server does not answer reports each failed
// attempt, keeps trying, never wakes, and returns nil once its context
// ends, leaving no goroutine.
func Unreachable(t *testing.T, d Driver) {
	leaks := d.NoLeaks(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	failures := make(chan error, 16)
	l := d.Listener("postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=5", 0, report(failures))
	wakes := make(chan struct{}, 1)
	listened := started(func() error { return l.Listen(ctx, channel, func() { wakes <- struct{}{} }) })
	for i := 0; i < 3; i++ {
		t.Logf("attempt %d: %v", i+1, recv(t, failures, "a failed attempt"))
	}
	cancel()
	if err := recv(t, listened, "Listen to return"); err != nil {
		t.Errorf("Listen: %v", err)
	}
	select {
	case <-wakes:
		t.Error("woke without a connection")
	default:
	}
	leaks()
}

// openCounting opens dsn with d's connector, wrapped in one that counts
// the runs of the statements the Watch watches that reached the driver and
// returned: the test's way to know an idle loop has claimed.
func openCounting(t *testing.T, d Driver, dsn string) (*sql.DB, *connhook.Watch) {
	t.Helper()
	inner, err := d.Connector(dsn)
	if err != nil {
		t.Fatal(err)
	}
	w := connhook.NewWatch()
	db := sql.OpenDB(connhook.Wrap(inner, connhook.Hooks{After: func(_ context.Context, call connhook.Call, err error, _ time.Duration) {
		if call.Kind == connhook.Query && err == nil {
			w.Saw(call.SQL)
		}
	}}))
	db.SetMaxOpenConns(4)
	t.Cleanup(func() { db.Close() })
	return db, w
}
