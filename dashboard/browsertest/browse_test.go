package browsertest

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/dashboard"
)

// rowCount counts the rows of the jobs table.
func rowCount(t *testing.T, tab context.Context) int {
	return value(t, tab, chromedp.Evaluate[int](`document.querySelectorAll("#jobs tr[data-id]").length`))
}

// shot writes the tab's picture to path, when one is given.
func shot(t *testing.T, tab context.Context, path string) {
	t.Helper()
	if path == "" {
		return
	}
	png := value(t, tab, chromedp.FullScreenshot(100))
	if len(png) < 1000 || string(png[1:4]) != "PNG" {
		t.Fatalf("the screenshot is %d bytes, not a PNG", len(png))
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s (%d bytes)", path, len(png))
}

// TestBrowseJobs (issue 37) drives the jobs view and the job page in
// Chromium on every engine it can reach: from the queues page to the jobs
// view, each state's tab lists its jobs; a page of one job goes older and
// back newer; a dead job's page shows its error as text, and requeueing
// it with the keyboard alone (Tab to the button, Enter) brings it back to
// the queue.
func TestBrowseJobs(t *testing.T) {
	browserCtx := browser(t)
	for _, e := range engines {
		t.Run(e.name, func(t *testing.T) {
			f := newFixture(t, e, nil)
			tab := newTab(t, browserCtx)
			run(t, tab, chromedp.Navigate(f.url+"?queue=jobs"))
			follow(t, tab, click("#browse"))
			// Ready: the two ready jobs; waiting: the retry; in work: the
			// held one; dead: three.
			for _, w := range []struct {
				tab   string
				rows  int
				label string
			}{{"ready", 2, "ready (2)"}, {"waiting", 1, "waiting (1)"}, {"inwork", 1, "in work (1)"}, {"dead", 3, "dead (3)"}, {"all", 4, "all"}} {
				follow(t, tab, click("#tab-"+w.tab))
				if n := rowCount(t, tab); n != w.rows {
					t.Errorf("tab %s: %d rows, want %d", w.tab, n, w.rows)
				}
				if got := text(t, tab, `nav.tabs a[aria-current="page"]`); got != w.label {
					t.Errorf("tab %s reads %q, want %q", w.tab, got, w.label)
				}
			}
			if e.name == "sqlite" {
				run(t, tab, chromedp.Navigate(f.url+"jobs?queue=jobs&state=all"))
				shot(t, tab, *screenshotJobs)
			}

			// Pages of one job: older, older, then newer again.
			one, err := dashboard.New(dashboard.Config{Queues: []dashboard.QueueConfig{{Name: "jobs", Queue: f.q}}, DeadPage: 1})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(http.StripPrefix("/admin", one))
			t.Cleanup(srv.Close)
			run(t, tab, chromedp.Navigate(srv.URL+"/admin/jobs?queue=jobs&state=all"))
			first := text(t, tab, "#jobs tr[data-id] td.id")
			follow(t, tab, click("#older"))
			second := text(t, tab, "#jobs tr[data-id] td.id")
			follow(t, tab, click("#older"))
			follow(t, tab, click("#newer"))
			if got := text(t, tab, "#jobs tr[data-id] td.id"); got != second || second == first {
				t.Errorf("pages: %s, then %s, back newer to %s", first, second, got)
			}
			follow(t, tab, click("#newer"))
			if got := text(t, tab, "#jobs tr[data-id] td.id"); got != first {
				t.Errorf("newest page again: %s, want %s", got, first)
			}

			// A dead job's page, reached from the dead tab.
			run(t, tab, chromedp.Navigate(f.url+"jobs?queue=jobs&state=dead"))
			follow(t, tab, click(fmt.Sprintf(`tr[data-id="%v"] td.id a`, f.dead["dies-html"])))
			if got := text(t, tab, "#job-state"); got != "dead" {
				t.Errorf("the dead job's page says state %q", got)
			}
			if got := text(t, tab, "#job-error-text"); got != htmlError {
				t.Errorf("the error shows as %q, want the text itself", got)
			}
			if xss := value(t, tab, chromedp.Evaluate[string](`typeof window.__xss`)); xss != "undefined" {
				t.Errorf("the error's HTML ran: __xss is %s", xss)
			}
			if got := value(t, tab, chromedp.Evaluate[string](`document.querySelector("pre.payload").textContent`)); got != "dies-html" {
				t.Errorf("the payload shows as %q, want the text dies-html", got)
			}
			if e.name == "sqlite" {
				shot(t, tab, *screenshotJob)
			}

			// Keyboard alone: Tab until the requeue button has the focus,
			// then Enter.
			run(t, tab, js(`document.activeElement && document.activeElement.blur()`))
			for i := 0; ; i++ {
				if value(t, tab, chromedp.Evaluate[string](`document.activeElement ? document.activeElement.id : ""`)) == "requeue" {
					break
				}
				if i == 40 {
					t.Fatal("40 presses of Tab never reached the requeue button")
				}
				run(t, tab, chromedp.KeyEvent("\t"))
			}
			res := submit(t, tab, chromedp.KeyEvent("\r"))
			if !strings.Contains(res, fmt.Sprintf("requeued dead job %v", f.dead["dies-html"])) {
				t.Fatalf("requeue from the job page: the page says %q", res)
			}
			// It went back to the dead tab it came from.
			if got := value(t, tab, chromedp.Evaluate[string](`location.pathname + location.search`)); got != "/admin/jobs?queue=jobs&state=dead" {
				t.Errorf("after the requeue the tab shows %s, want the dead tab it came from", got)
			}
			if _, dead := f.rows(t); dead != 2 {
				t.Errorf("%d dead jobs after the requeue, want 2", dead)
			}
			if got := handle(t, f, "dies-html"); got != htmlError {
				t.Errorf("the requeued job came back with error %q", got)
			}
			// Its old page now says so.
			run(t, tab, chromedp.Navigate(f.url+fmt.Sprintf("job?queue=jobs&id=%v", f.dead["dies-html"])))
			if got := text(t, tab, "#job-error"); !strings.Contains(got, "has no job") {
				t.Errorf("the requeued job's old page says %q", got)
			}
			if err := f.held.Ack(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestRequeueUnderNewID: a dead job's page has a field for a new id (the
// queue is an *inbox.Queue, a dashboard.RequeuerAs); typed into it, the
// requeue brings the job back under that id, on every engine. A dead
// job's id typed there is refused and changes nothing.
func TestRequeueUnderNewID(t *testing.T) {
	browserCtx := browser(t)
	for _, e := range engines {
		t.Run(e.name, func(t *testing.T) {
			f := newFixture(t, e, nil)
			tab := newTab(t, browserCtx)
			dead := f.dead["dies-long"]
			page := f.url + fmt.Sprintf("job?queue=jobs&id=%v", dead)
			run(t, tab, chromedp.Navigate(page))
			run(t, tab, chromedp.SendKeys(chromedp.CSS("#new-id"), fmt.Sprint(f.dead["dies-plain"])))
			if res := submit(t, tab, click("#requeue")); !strings.Contains(res, "is a dead job's id") {
				t.Errorf("requeue under a dead job's id: the page says %q", res)
			}
			if _, n := f.rows(t); n != 3 {
				t.Errorf("%d dead jobs after the refused requeue, want 3", n)
			}
			run(t, tab, chromedp.Navigate(page))
			run(t, tab, chromedp.SendKeys(chromedp.CSS("#new-id"), "900001"))
			res := submit(t, tab, click("#requeue"))
			if !strings.Contains(res, fmt.Sprintf("requeued dead job %v of jobs as job 900001", dead)) {
				t.Fatalf("requeue under 900001: the page says %q", res)
			}
			j, err := f.q.Job(context.Background(), int64(900001))
			if err != nil || j.State != inbox.StateReady {
				t.Errorf("job 900001 after the requeue: %+v, %v; want it ready", j, err)
			}
		})
	}
}
