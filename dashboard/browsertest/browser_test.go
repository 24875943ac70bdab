// Package browsertest drives the dashboard (package dashboard) in a real
// headless Chromium (Debian's chromium package): a module of its own, so
// that chromedp and the drivers stay out of the inbox module.
//
//	go test ./dashboard/browsertest/
//	go test ./dashboard/browsertest/ -run TestScreenshot -args -screenshot ../../docs/dashboard.png
//	go test ./dashboard/browsertest/ -run TestBrowseJobs/sqlite -args -screenshot-jobs ../../docs/dashboard-jobs.png -screenshot-job ../../docs/dashboard-job.png
//
// Without chromium the tests skip, unless INBOX_REQUIRE_DBS=1 (CI), which
// makes a missing browser a failure, as it does a missing database.
package browsertest

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/dashboard"
	"github.com/sqlinbox/inbox/internal/optin"
	"github.com/sqlinbox/inbox/metrics"
	"github.com/sqlinbox/inbox/worker"
)

var (
	screenshot     = flag.String("screenshot", "", "TestScreenshot writes the page's PNG here")
	screenshotJobs = flag.String("screenshot-jobs", "", "TestBrowseJobs writes the jobs view's PNG here (SQLite)")
	screenshotJob  = flag.String("screenshot-job", "", "TestBrowseJobs writes a job page's PNG here (SQLite)")
)

// browser starts a headless Chromium with a fresh profile and returns a
// context for a first tab.
func browser(t *testing.T) context.Context {
	t.Helper()
	path := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		if os.Getenv("INBOX_REQUIRE_DBS") == "1" {
			t.Fatal("no chromium on PATH (apt-get install -y chromium), and INBOX_REQUIRE_DBS=1")
		}
		optin.Skip(t, "no chromium on PATH: skipped the browser tests; apt-get install -y chromium (INBOX_REQUIRE_DBS=1 makes that a failure)")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1200, 1000),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelTab(); cancelAlloc() })
	// The first call starts the browser, which lives as long as that
	// call's context: no deadline on it.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting %s: %v", path, err)
	}
	return ctx
}

// newTab opens a tab of the browser.
func newTab(t *testing.T, browserCtx context.Context) context.Context {
	t.Helper()
	tab, cancel := chromedp.NewContext(browserCtx)
	t.Cleanup(cancel)
	if err := chromedp.Do(tab); err != nil {
		t.Fatal(err)
	}
	return tab
}

// engine is a database the scenario runs on.
type engine struct {
	name, driver string
	dialect      inbox.Dialect
	dsn          func(t *testing.T) string
	schema       func(table string) []string
}

var engines = []engine{
	{name: "sqlite", driver: "sqlite", dialect: inbox.SQLite,
		dsn: func(t *testing.T) string {
			return "file:" + filepath.Join(t.TempDir(), "jobs.db") + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)"
		},
		schema: func(tb string) []string {
			return []string{
				"CREATE TABLE " + tb + " (id INTEGER PRIMARY KEY AUTOINCREMENT, attempt INTEGER NOT NULL DEFAULT 1, locked_until TEXT, payload BLOB NOT NULL, last_error TEXT, enqueued_at TEXT)",
				"CREATE TABLE " + tb + "_dead (id INTEGER PRIMARY KEY, attempt INTEGER NOT NULL, payload BLOB NOT NULL, last_error TEXT, dead_at TEXT)",
				"CREATE INDEX " + tb + "_claimable ON " + tb + " (locked_until, id)",
				"CREATE INDEX " + tb + "_age ON " + tb + " (locked_until, enqueued_at)",
				"CREATE INDEX " + tb + "_dead_at ON " + tb + "_dead (dead_at, id)",
				"CREATE TABLE " + tb + "_control (queue TEXT PRIMARY KEY, paused_at TEXT, paused_by TEXT)",
			}
		}},
	{name: "postgres", driver: "pgx", dialect: inbox.Postgres,
		dsn: func(*testing.T) string { return os.Getenv("INBOX_POSTGRES_DSN") },
		schema: func(tb string) []string {
			return []string{
				"CREATE TABLE " + tb + " (id bigserial PRIMARY KEY, attempt integer NOT NULL DEFAULT 1, locked_until timestamptz, payload bytea NOT NULL, last_error text, enqueued_at timestamptz)",
				"CREATE TABLE " + tb + "_dead (id bigint PRIMARY KEY, attempt integer NOT NULL, payload bytea NOT NULL, last_error text, dead_at timestamptz)",
				"CREATE INDEX " + tb + "_free ON " + tb + " (id) WHERE locked_until IS NULL",
				"CREATE INDEX " + tb + "_lu ON " + tb + " (locked_until)",
				"CREATE INDEX " + tb + "_free_age ON " + tb + " (enqueued_at) WHERE locked_until IS NULL",
				"CREATE INDEX " + tb + "_dead_at ON " + tb + "_dead (dead_at, id)",
				"CREATE TABLE " + tb + "_control (queue text PRIMARY KEY, paused_at timestamptz, paused_by text)",
			}
		}},
	{name: "mariadb", driver: "mysql", dialect: inbox.MariaDB,
		dsn: func(*testing.T) string {
			d := os.Getenv("INBOX_MYSQL_DSN")
			if d == "" {
				return ""
			}
			if strings.Contains(d, "?") {
				return d + "&parseTime=false"
			}
			return d + "?parseTime=false"
		},
		schema: func(tb string) []string {
			return []string{
				"CREATE TABLE " + tb + " (id BIGINT AUTO_INCREMENT PRIMARY KEY, attempt INT NOT NULL DEFAULT 1, locked_until DATETIME(6) NULL, payload BLOB NOT NULL, last_error TEXT NULL, enqueued_at DATETIME(6) NULL)",
				"CREATE TABLE " + tb + "_dead (id BIGINT PRIMARY KEY, attempt INT NOT NULL, payload BLOB NOT NULL, last_error TEXT NULL, dead_at DATETIME(6) NULL)",
				"CREATE INDEX " + tb + "_claimable ON " + tb + " (locked_until, id)",
				"CREATE INDEX " + tb + "_age ON " + tb + " (locked_until, enqueued_at)",
				"CREATE INDEX " + tb + "_dead_at ON " + tb + "_dead (dead_at, id)",
				"CREATE TABLE " + tb + "_control (queue varchar(191) PRIMARY KEY, paused_at DATETIME(6) NULL, paused_by text NULL)",
			}
		}},
}

// fixture is a queue with jobs in every state and the dashboard serving it.
type fixture struct {
	db       *sql.DB
	q        *inbox.Queue
	table    string
	url      string         // the dashboard's page
	dead     map[string]any // dead jobs' ids by their payload
	held     *inbox.Delivery
	counters *metrics.Counters
	dash     *dashboard.Handler
	now      func() time.Time
}

// The error texts of the dead jobs: one plain, one of HTML that would run
// script if it were not escaped, one far longer than the page shows.
const (
	plainError = "smtp: 451 4.7.1 greylisted"
	htmlError  = `<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2"><b>bold</b>`
)

var longError = strings.Repeat("a very long error text ", 2000) // 46,000 bytes, cut by inbox.MaxErrorText

func newFixture(t *testing.T, e engine, dashNow func() time.Time) *fixture {
	t.Helper()
	dsn := e.dsn(t)
	if dsn == "" {
		if os.Getenv("INBOX_REQUIRE_DBS") == "1" {
			t.Fatalf("%s: no DSN and INBOX_REQUIRE_DBS=1", e.name)
		}
		optin.Skip(t, e.name+": no DSN (INBOX_POSTGRES_DSN, INBOX_MYSQL_DSN): skipped the browser tests on it (INBOX_REQUIRE_DBS=1 makes that a failure)")
	}
	db, err := sql.Open(e.driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(8)
	t.Cleanup(func() { db.Close() })
	table := "browser_jobs"
	if e.name != "sqlite" {
		table = fmt.Sprintf("browser_jobs_%d", time.Now().UnixNano()%1e9)
		t.Cleanup(func() {
			db.Exec("DROP TABLE IF EXISTS " + table)
			db.Exec("DROP TABLE IF EXISTS " + table + "_dead")
			db.Exec("DROP TABLE IF EXISTS " + table + "_control")
		})
	}
	for _, s := range e.schema(table) {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	q, err := inbox.New(db, inbox.Config{Dialect: e.dialect, Lease: time.Minute, Table: inbox.Table{
		Name: table, LockedUntil: "locked_until", DeadTable: table + "_dead",
		LastError: "last_error", EnqueuedAt: "enqueued_at", DeadAt: "dead_at", ControlTable: table + "_control"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := q.CheckSchema(ctx); err != nil {
		t.Fatal(err)
	}
	f := &fixture{db: db, q: q, table: table, dead: map[string]any{}, counters: &metrics.Counters{}}
	enqueue := func(p string) {
		t.Helper()
		if _, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte(p)}}); err != nil {
			t.Fatal(err)
		}
	}
	// Three jobs die, one with each error; one waits for a retry in an
	// hour; one is held; two are ready.
	for _, p := range []string{"dies-plain", "dies-html", "dies-long", "retries", "held"} {
		enqueue(p)
	}
	ds, err := q.Claim(ctx, 5)
	if err != nil || len(ds) != 5 {
		t.Fatalf("claim: %d jobs, %v", len(ds), err)
	}
	for _, d := range ds {
		var p []byte
		if err := d.Scan(&p); err != nil {
			t.Fatal(err)
		}
		switch string(p) {
		case "dies-plain", "dies-html", "dies-long":
			d.SetError(errors.New(map[string]string{"dies-plain": plainError, "dies-html": htmlError, "dies-long": longError}[string(p)]))
			if err := d.Dead(ctx); err != nil {
				t.Fatal(err)
			}
			f.dead[string(p)] = d.ID()
		case "retries":
			if err := d.Retry(ctx, time.Hour); err != nil {
				t.Fatal(err)
			}
		case "held":
			f.held = d
		}
	}
	enqueue("ready-1")
	enqueue("ready-2")

	f.now = time.Now
	if dashNow != nil {
		f.now = dashNow
	}
	f.dash, err = dashboard.New(dashboard.Config{Queues: []dashboard.QueueConfig{{Name: "jobs", Queue: q, Done: f.counters.Done}}, Now: f.now})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/admin/", http.StripPrefix("/admin", f.dash))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	f.url = srv.URL + "/admin/"
	return f
}

// rows counts the queue table's and the dead table's rows.
func (f *fixture) rows(t *testing.T) (queue, dead int) {
	t.Helper()
	if err := f.db.QueryRow("SELECT (SELECT COUNT(*) FROM "+f.table+"), (SELECT COUNT(*) FROM "+f.table+"_dead)").Scan(&queue, &dead); err != nil {
		t.Fatal(err)
	}
	return queue, dead
}

// run runs steps in the tab with a deadline.
func run(t *testing.T, tab context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatal(err)
	}
}

// value runs one action of the tab that returns a value.
func value[T any](t *testing.T, tab context.Context, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// js evaluates expr in the tab, for its effect.
func js(expr string) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		_, err := chromedp.Evaluate[any](expr+`; null`)(ctx, t)
		if errors.Is(err, chromedp.ErrJSNull) {
			err = nil
		}
		return chromedp.Void{}, err
	}
}

// submit runs act, which submits a form, and waits for the next page: a mark
// left on the old page's window is gone from the new one. It returns the
// result the new page shows.
func submit(t *testing.T, tab context.Context, act chromedp.Action[chromedp.Void]) string {
	t.Helper()
	follow(t, tab, act)
	return text(t, tab, "#result")
}

// follow runs act, which leaves the page (a link, a form), and waits for
// the next page to be loaded.
func follow(t *testing.T, tab context.Context, act chromedp.Action[chromedp.Void]) {
	t.Helper()
	run(t, tab, js(`window.__old = true`), act)
	// While the tab navigates an evaluation may fail ("target navigated"):
	// poll until the new page answers.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(tab, 5*time.Second)
		done, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.__old === undefined && document.readyState === "complete"`))
		cancel()
		if err == nil && done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new page after the form was sent (last: %v)", err)
		}
	}
}

func text(t *testing.T, tab context.Context, sel string) string {
	t.Helper()
	return strings.TrimSpace(value(t, tab, chromedp.Text(chromedp.CSS(sel))))
}

func click(sel string) chromedp.Action[chromedp.Void] { return chromedp.Click(chromedp.CSS(sel)) }

// counts reads the queue's row of the page.
func counts(t *testing.T, tab context.Context) [4]string {
	row := `tr[data-queue="jobs"] `
	return [4]string{text(t, tab, row+".ready-count"), text(t, tab, row+".waiting-count"), text(t, tab, row+".inwork-count"), text(t, tab, row+".dead-count")}
}

// TestBrowser (issue 23) drives the page in Chromium on every engine it can
// reach: the counts match the table; the error texts show as text (HTML
// escaped, never run; a long one cut with a note); a requeued job leaves
// the dead list and is handled; a forged or missing token, unknown ids and
// a second requeue from a stale tab change nothing and say why.
func TestBrowser(t *testing.T) {
	browserCtx := browser(t)
	for _, e := range engines {
		t.Run(e.name, func(t *testing.T) {
			f := newFixture(t, e, nil)
			tab := newTab(t, browserCtx)
			run(t, tab, chromedp.Navigate(f.url+"?queue=jobs"))

			// The counts are the table's: two ready, one retrying, one
			// held, three dead.
			if got, want := counts(t, tab), [4]string{"2", "1", "1", "3"}; got != want {
				t.Errorf("counts (ready, waiting, in work, dead) = %v, want %v", got, want)
			}
			st, err := f.q.Stats(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if got := counts(t, tab); got != [4]string{fmt.Sprint(st.Ready), fmt.Sprint(st.Waiting), fmt.Sprint(st.InWork), fmt.Sprint(st.Dead)} {
				t.Errorf("counts %v differ from Stats %+v", got, st)
			}

			// HTML in an error is text: shown as written, nothing ran.
			htmlRow := fmt.Sprintf(`tr[data-id="%v"] `, f.dead["dies-html"])
			if got := text(t, tab, htmlRow+"pre.error"); got != htmlError {
				t.Errorf("the HTML error shows as %q, want the text itself", got)
			}
			xss := value(t, tab, chromedp.Evaluate[string](`typeof window.__xss`))
			scripts := value(t, tab, chromedp.Evaluate[int](`document.scripts.length`))
			imgs := value(t, tab, chromedp.Evaluate[int](`document.querySelectorAll("#dead img, #dead b").length`))
			if xss != "undefined" || scripts != 0 || imgs != 0 {
				t.Errorf("the error's HTML took effect: __xss %v, %d scripts, %d img/b elements", xss, scripts, imgs)
			}
			// The long error was cut to inbox.MaxErrorText when it was
			// stored; the page shows all of it in a box of its own, and the
			// page keeps its width.
			longRow := fmt.Sprintf(`tr[data-id="%v"] `, f.dead["dies-long"])
			if got, want := text(t, tab, longRow+"pre.error"), strings.TrimSpace(longError[:inbox.MaxErrorText]); got != want {
				t.Errorf("the long error shows %d bytes, want the %d stored", len(got), len(want))
			}
			if wide := value(t, tab, chromedp.Evaluate[bool](`document.documentElement.scrollWidth > window.innerWidth`)); wide {
				t.Errorf("the long error widens the page past the window")
			}

			// A second operator opens the page before the first requeues.
			stale := newTab(t, browserCtx)
			run(t, stale, chromedp.Navigate(f.url+"?queue=jobs"))

			// Bad input through the page changes nothing.
			plainRow := fmt.Sprintf(`tr[data-id="%v"] `, f.dead["dies-plain"])
			q0, d0 := f.rows(t)
			for _, w := range []struct {
				name, js, says string
			}{
				{"forged token", `document.querySelector('` + plainRow + `input[name=csrf]').value = "0123456789abcdef"`, "token is missing or does not match"},
				{"missing token", `document.querySelector('` + plainRow + `input[name=csrf]').remove()`, "token is missing or does not match"},
				{"unknown id", `document.querySelector('` + plainRow + `input[name=id]').value = "987654321"`, "has no dead job 987654321"},
				{"id not a number", `document.querySelector('` + plainRow + `input[name=id]').value = "1; DROP TABLE x"`, "is not an integer"},
			} {
				run(t, tab, chromedp.Navigate(f.url+"?queue=jobs"), js(w.js))
				res := submit(t, tab, click(plainRow+"button"))
				if !strings.Contains(res, w.says) || !strings.Contains(res, "nothing was changed") {
					t.Errorf("%s: the page says %q, want %q and that nothing changed", w.name, res, w.says)
				}
				if q, d := f.rows(t); q != q0 || d != d0 {
					t.Errorf("%s: rows %d and %d dead, were %d and %d", w.name, q, d, q0, d0)
				}
			}
			run(t, tab, chromedp.Navigate(f.url+"?queue=jobs"),
				chromedp.SendKeys(chromedp.CSS(`#cancel-form input[name=id]`), "987654321"))
			if res := submit(t, tab, click(`#cancel-form button`)); !strings.Contains(res, "has no job 987654321") {
				t.Errorf("cancelling an unknown id: the page says %q", res)
			}

			// Requeue: the job leaves the dead list, comes back with its
			// error, and is handled.
			run(t, tab, chromedp.Navigate(f.url+"?queue=jobs"))
			res := submit(t, tab, click(plainRow+"button"))
			if !strings.Contains(res, fmt.Sprintf("requeued dead job %v", f.dead["dies-plain"])) {
				t.Fatalf("requeue: the page says %q", res)
			}
			left := value(t, tab, chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll('tr[data-id="%v"]').length`, f.dead["dies-plain"])))
			if left != 0 {
				t.Errorf("the requeued job is still in the dead list")
			}
			if got, want := counts(t, tab), [4]string{"3", "1", "1", "2"}; got != want {
				t.Errorf("counts after the requeue = %v, want %v", got, want)
			}
			handled := handle(t, f, "dies-plain")
			if handled != plainError {
				t.Errorf("the requeued job came back with error %q, want the one it died with", handled)
			}

			// The stale tab requeues the same job again: refused, nothing
			// changes.
			q0, d0 = f.rows(t)
			res = submit(t, stale, click(plainRow+"button"))
			if !strings.Contains(res, fmt.Sprintf("has no dead job %v", f.dead["dies-plain"])) || !strings.Contains(res, "nothing was changed") {
				t.Errorf("second requeue: the page says %q", res)
			}
			if q, d := f.rows(t); q != q0 || d != d0 {
				t.Errorf("second requeue: rows %d and %d dead, were %d and %d", q, d, q0, d0)
			}
			if err := f.held.Ack(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// handle claims the queue's ready jobs, acks the one whose payload is p and
// releases the others; it returns the error p's delivery carried.
func handle(t *testing.T, f *fixture, p string) string {
	t.Helper()
	ctx := context.Background()
	ds, err := f.q.Claim(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	found, lastErr := false, ""
	for _, d := range ds {
		var got []byte
		if err := d.Scan(&got); err != nil {
			t.Fatal(err)
		}
		if string(got) == p {
			found, lastErr = true, d.LastError()
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := d.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if !found {
		t.Fatalf("job %q was not claimable after its requeue", p)
	}
	return lastErr
}

// TestScreenshot draws an hour of samples of a queue at work (the clock
// moved by hand) and takes the page's picture; with -screenshot it is
// written there (docs/dashboard.png).
func TestScreenshot(t *testing.T) {
	browserCtx := browser(t)
	now := time.Now().UTC().Add(-time.Hour)
	f := newFixture(t, engines[0], func() time.Time { return now })
	ctx := context.Background()
	// An hour of work, sampled each minute: a burst of jobs enqueued at
	// the quarter, drained at the rate the workers keep.
	for m := 0; m <= 60; m++ {
		n := 6
		if m >= 15 && m < 25 {
			n = 40
		}
		for i := 0; i < n; i++ {
			if _, err := f.q.Enqueue(ctx, f.db, inbox.Job{Data: []any{[]byte(fmt.Sprintf("mail %d-%d", m, i))}}); err != nil {
				t.Fatal(err)
			}
		}
		ds, err := f.q.Claim(ctx, 18)
		if err != nil {
			t.Fatal(err)
		}
		for i, d := range ds {
			// As a worker loop's events would count them.
			f.counters.Observe(worker.Event{Kind: worker.EventStart, ID: d.ID(), Attempt: d.Attempt()})
			end := worker.Event{Kind: worker.EventEnd, ID: d.ID(), Attempt: d.Attempt(), Duration: 40 * time.Millisecond, Outcome: worker.OutcomeAcked}
			if i == 0 && m%9 == 4 {
				d.SetError(errors.New("smtp: 554 5.7.1 message rejected: <spam@example.com> blocked"))
				err = d.Dead(ctx)
				end.Outcome = worker.OutcomeDead
			} else {
				err = d.Ack(ctx)
			}
			f.counters.Observe(end)
			if err != nil {
				t.Fatal(err)
			}
		}
		f.dash.Sample(ctx)
		now = now.Add(time.Minute)
	}
	tab := newTab(t, browserCtx)
	run(t, tab, chromedp.Navigate(f.url+"?queue=jobs"))
	png := value(t, tab, chromedp.FullScreenshot(100))
	if len(png) < 1000 || string(png[1:4]) != "PNG" {
		t.Fatalf("the screenshot is %d bytes, not a PNG", len(png))
	}
	polylines := value(t, tab, chromedp.Evaluate[int](`document.querySelectorAll("svg polyline").length`))
	if polylines < 4 {
		t.Errorf("the charts draw %d lines, want ready, waiting, in work, dead and throughput", polylines)
	}
	if *screenshot != "" {
		if err := os.WriteFile(*screenshot, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s (%d bytes)", *screenshot, len(png))
	}
}
