package browsertest

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/sqlinbox/inbox"
)

// killReady buries every ready job of f's queue and returns how many.
func killReady(t *testing.T, f *fixture) int {
	t.Helper()
	ctx := context.Background()
	ds, err := f.q.Claim(ctx, 50)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		if err := d.Dead(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return len(ds)
}

// idOf returns the id of the queue table's job whose payload is p.
func idOf(t *testing.T, f *fixture, e engine, p string) int64 {
	t.Helper()
	var id int64
	ph := "?"
	if e.dialect == inbox.Postgres {
		ph = "$1"
	}
	if err := f.db.QueryRow("SELECT id FROM "+f.table+" WHERE payload = "+ph, []byte(p)).Scan(&id); err != nil {
		t.Fatalf("the id of job %q: %v", p, err)
	}
	return id
}

// TestBulkActions (issue 37) drives the bulk actions in Chromium on every
// engine it can reach: two dead jobs ticked and requeued with the
// keyboard alone; a delete of the ticked ones without its box ticked
// refused; one dead job deleted from its page; every dead job requeued
// after a page that shows their count; a waiting job run now from its
// page (a job in work offers no such button). Each returns to its page
// with what happened, and the tables agree.
func TestBulkActions(t *testing.T) {
	browserCtx := browser(t)
	for _, e := range engines {
		t.Run(e.name, func(t *testing.T) {
			f := newFixture(t, e, nil)
			tab := newTab(t, browserCtx)
			bulkPhone(t, tab, f.url+"jobs?queue=jobs&state=dead", f.url+"requeue-all?queue=jobs&older=all")
			bulkSelected(t, f, tab)
			bulkDeleteOne(t, f, tab)
			bulkRequeueAll(t, f, tab)
			bulkRunNow(t, f, e, tab)
		})
	}
}

// bulkRows checks the queue table's and the dead table's rows.
func bulkRows(t *testing.T, f *fixture, what string, queue, dead int) {
	t.Helper()
	if q, d := f.rows(t); q != queue || d != dead {
		t.Errorf("%s: %d jobs, %d dead; want %d and %d", what, q, d, queue, dead)
	}
}

// bulkSelected ticks two dead jobs and requeues them with the keyboard
// alone (Tab, Space, Enter); a delete of the ticked job without its box
// is refused.
func bulkSelected(t *testing.T, f *fixture, tab context.Context) {
	deadList := f.url + "jobs?queue=jobs&state=dead"
	run(t, tab, chromedp.Navigate(deadList), js(`document.activeElement && document.activeElement.blur()`))
	for _, p := range []string{"dies-plain", "dies-long"} {
		tabTo(t, tab, fmt.Sprintf("#pick-%v", f.dead[p]))
		run(t, tab, chromedp.KeyEvent(" "))
	}
	tabTo(t, tab, "#requeue-selected")
	follow(t, tab, chromedp.KeyEvent("\r"))
	if got := text(t, tab, "#result"); got != "requeued 2 dead jobs of jobs" {
		t.Errorf("after requeue selected the list says %q", got)
	}
	bulkRows(t, f, "after requeue selected", 6, 1)

	run(t, tab, chromedp.Navigate(deadList))
	run(t, tab, click(fmt.Sprintf("#pick-%v", f.dead["dies-html"])))
	follow(t, tab, click("#delete-selected"))
	if got := text(t, tab, "#result"); !strings.Contains(got, "deleting needs the confirmation box ticked; nothing was changed") {
		t.Errorf("delete selected unconfirmed: the list says %q", got)
	}
	bulkRows(t, f, "after a refused delete", 6, 1)
}

// bulkDeleteOne deletes the last dead job from its page, which returns to
// the dead list.
func bulkDeleteOne(t *testing.T, f *fixture, tab context.Context) {
	run(t, tab, chromedp.Navigate(f.url+fmt.Sprintf("job?queue=jobs&id=%v&kind=int", f.dead["dies-html"])))
	run(t, tab, click("#delete-sure"))
	follow(t, tab, click("#delete"))
	if got := text(t, tab, "#result"); got != fmt.Sprintf("deleted dead job %v of jobs", f.dead["dies-html"]) {
		t.Errorf("after delete the page says %q", got)
	}
	if got := value(t, tab, chromedp.Evaluate[string](`document.title`)); !strings.Contains(got, "dead jobs") {
		t.Errorf("delete returned to %q, want the dead list", got)
	}
	bulkRows(t, f, "after delete", 6, 0)
}

// bulkRequeueAll buries the ready jobs, then requeues every dead job: the
// count on a page of its own first, changing nothing, then the requeue.
func bulkRequeueAll(t *testing.T, f *fixture, tab context.Context) {
	killed := killReady(t, f)
	run(t, tab, chromedp.Navigate(f.url+"jobs?queue=jobs&state=dead"))
	follow(t, tab, click("#requeue-all"))
	want := fmt.Sprintf("Requeue %d dead jobs of any age?", killed)
	if got := text(t, tab, "#confirm-count"); got != want {
		t.Errorf("the confirmation says %q, want %q", got, want)
	}
	bulkRows(t, f, "after the count alone", 6-killed, killed)
	follow(t, tab, click("#confirm"))
	if got, want := text(t, tab, "#result"), fmt.Sprintf("requeued %d dead jobs of jobs (of any age)", killed); got != want {
		t.Errorf("after requeue all the list says %q, want %q", got, want)
	}
	bulkRows(t, f, "after requeue all", 6, 0)
}

// bulkRunNow runs the retry waiting an hour now, from its page; the held
// job's page offers no such button, and its holder's ack holds.
func bulkRunNow(t *testing.T, f *fixture, e engine, tab context.Context) {
	retries := idOf(t, f, e, "retries")
	run(t, tab, chromedp.Navigate(f.url+fmt.Sprintf("job?queue=jobs&id=%d&kind=int", retries)))
	if got := text(t, tab, "#job-state"); got != "waiting" {
		t.Fatalf("the retry's page says %q, want waiting", got)
	}
	follow(t, tab, click("#run-now"))
	if got := text(t, tab, "#result"); got != fmt.Sprintf("job %d of jobs is ready to run now", retries) {
		t.Errorf("after run now the page says %q", got)
	}
	if got := text(t, tab, "#job-state"); got != "ready" {
		t.Errorf("after run now the job is %q, want ready", got)
	}
	handle(t, f, "retries")
	run(t, tab, chromedp.Navigate(f.url+fmt.Sprintf("job?queue=jobs&id=%v&kind=int", f.held.ID())))
	if n := value(t, tab, chromedp.Evaluate[int](`document.querySelectorAll("#run-now, #delete").length`)); n != 0 {
		t.Errorf("the held job's page offers %d bulk buttons", n)
	}
	if err := f.held.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// bulkPhone loads each page in a window as wide as a phone's: the page,
// its bulk forms included, must not be wider than the window (a table
// scrolls in its own box).
func bulkPhone(t *testing.T, tab context.Context, urls ...string) {
	t.Helper()
	run(t, tab, chromedp.EmulateViewport(375, 740))
	defer run(t, tab, chromedp.EmulateViewport(1200, 1000))
	for _, u := range urls {
		run(t, tab, chromedp.Navigate(u))
		if w := value(t, tab, chromedp.Evaluate[int](`window.innerWidth`)); w != 375 {
			t.Fatalf("the window is %d px wide, want 375", w)
		}
		if wide := value(t, tab, chromedp.Evaluate[bool](`document.documentElement.scrollWidth > window.innerWidth`)); wide {
			w := value(t, tab, chromedp.Evaluate[int](`document.documentElement.scrollWidth`))
			t.Errorf("%s is %d px wide in a window of 375", u, w)
		}
	}
}
