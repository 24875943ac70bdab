package browsertest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/worker"
)

// tabTo presses Tab from the top of the page until the focused element
// matches the CSS selector sel, as an operator without a mouse would.
func tabTo(t *testing.T, tab context.Context, sel string) {
	t.Helper()
	run(t, tab, js(`document.activeElement && document.activeElement.blur()`))
	cond := fmt.Sprintf(`document.activeElement !== null && document.activeElement.matches(%q)`, sel)
	for i := 0; ; i++ {
		if value(t, tab, chromedp.Evaluate[bool](cond)) {
			return
		}
		if i == 80 {
			t.Fatalf("80 presses of Tab never reached %s", sel)
		}
		run(t, tab, chromedp.KeyEvent("\t"))
	}
}

// getJSON GETs url and decodes its body into v.
func getJSON(t *testing.T, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %d, not JSON: %v", url, resp.StatusCode, err)
	}
	return resp.StatusCode
}

// pausedNow reads whether the queue is paused three ways: Stats, the
// page's api/queues, and the banner of the page in tab.
func pausedNow(t *testing.T, f *fixture, tab context.Context) (stats, api, banner bool) {
	t.Helper()
	st, err := f.q.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var qs struct {
		Queues []struct {
			Name   string
			Paused bool
		}
	}
	if status := getJSON(t, f.url+"api/queues", &qs); status != 200 || len(qs.Queues) != 1 {
		t.Fatalf("api/queues: %d %+v", status, qs)
	}
	n := value(t, tab, chromedp.Evaluate[int](`document.querySelectorAll('p.paused-banner[data-queue="jobs"]').length`))
	return st.Paused, qs.Queues[0].Paused, n == 1
}

// TestPauseResume (issue 37 item 4) pauses and resumes the queue from the
// page in Chromium on every engine it can reach, with the mouse and with
// the keyboard alone (Tab to the button, Enter): paused, the page shows a
// banner, Stats and api/queues say so, and a worker.Run loop on the queue
// handles nothing, the jobs enqueued meanwhile waiting in the table;
// resumed, the banner goes and the loop handles them. Then the main
// requeue action, by keyboard alone.
func TestPauseResume(t *testing.T) {
	browserCtx := browser(t)
	for _, e := range engines {
		t.Run(e.name, func(t *testing.T) {
			f := newFixture(t, e, nil)
			tab := newTab(t, browserCtx)
			run(t, tab, chromedp.Navigate(f.url+"?queue=jobs"))
			if s, a, b := pausedNow(t, f, tab); s || a || b {
				t.Fatalf("paused before the click: Stats %v, api %v, banner %v", s, a, b)
			}
			res := submit(t, tab, click(`tr[data-queue="jobs"] form.pause button`))
			if !strings.Contains(res, "paused jobs") {
				t.Fatalf("pause: the page says %q", res)
			}
			if s, a, b := pausedNow(t, f, tab); !s || !a || !b {
				t.Errorf("after the pause: Stats %v, api %v, banner %v; want all paused", s, a, b)
			}
			if e.name == "sqlite" {
				shot(t, tab, *screenshotPaused)
			}
			// The jobs view says so too, then back to the main page.
			run(t, tab, chromedp.Navigate(f.url+"jobs?queue=jobs"))
			if got := text(t, tab, "p.paused-banner"); !strings.Contains(got, "Queue jobs is paused since") {
				t.Errorf("the paused queue's jobs view: banner %q", got)
			}
			// And a job's page, reached from the view.
			follow(t, tab, click("tr[data-id] td.id a"))
			if got := text(t, tab, "p.paused-banner"); !strings.Contains(got, "Queue jobs is paused since") {
				t.Errorf("a job's page of the paused queue: banner %q", got)
			}
			run(t, tab, chromedp.Navigate(f.url+"?queue=jobs"))

			// A loop on the paused queue claims nothing, the jobs there
			// and one enqueued now.
			handled := make(chan string, 16)
			ctx, stop := context.WithCancel(context.Background())
			const poll = 50 * time.Millisecond
			done := make(chan error, 1)
			go func() {
				done <- worker.Run(ctx, f.q, worker.Config{Poll: poll, OnError: func(err error) { t.Logf("worker: %v", err) }},
					func(_ context.Context, d *inbox.Delivery) error {
						var p []byte
						if err := d.Scan(&p); err != nil {
							return err
						}
						handled <- string(p)
						return nil
					})
			}()
			defer func() {
				stop()
				if err := <-done; err != nil {
					t.Errorf("worker.Run: %v", err)
				}
			}()
			if _, err := f.q.Enqueue(context.Background(), f.db, inbox.Job{Data: []any{[]byte("after-pause")}}); err != nil {
				t.Fatal(err)
			}
			// Nothing to wait for: watch for at least five of the loop's
			// polls and twenty reads, waking it at each.
			for i, start := 0, time.Now(); i < 20 || time.Since(start) < 5*poll; i++ {
				f.q.Wake()
				st, err := f.q.Stats(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if st.Ready != 3 || len(handled) > 0 {
					t.Fatalf("paused, the worker claimed: %d ready of 3, %d handled", st.Ready, len(handled))
				}
			}

			// Resume by keyboard: the loop handles the three.
			tabTo(t, tab, `tr[data-queue="jobs"] form.resume button`)
			if res := submit(t, tab, chromedp.KeyEvent("\r")); !strings.Contains(res, "resumed jobs") {
				t.Fatalf("resume by keyboard: the page says %q", res)
			}
			if s, a, b := pausedNow(t, f, tab); s || a || b {
				t.Errorf("after the resume: Stats %v, api %v, banner %v; want none paused", s, a, b)
			}
			want := map[string]bool{"ready-1": true, "ready-2": true, "after-pause": true}
			deadline := time.After(30 * time.Second)
			for len(want) > 0 {
				select {
				case p := <-handled:
					if !want[p] {
						t.Errorf("the worker handled %q", p)
					}
					delete(want, p)
				case <-deadline:
					t.Fatalf("resumed, the worker never handled %v", want)
				}
			}

			// Pause by keyboard, resume by the mouse.
			tabTo(t, tab, `tr[data-queue="jobs"] form.pause button`)
			if res := submit(t, tab, chromedp.KeyEvent("\r")); !strings.Contains(res, "paused jobs") {
				t.Fatalf("pause by keyboard: the page says %q", res)
			}
			if s, a, b := pausedNow(t, f, tab); !s || !a || !b {
				t.Errorf("after the keyboard's pause: Stats %v, api %v, banner %v", s, a, b)
			}
			if res := submit(t, tab, click(`tr[data-queue="jobs"] form.resume button`)); !strings.Contains(res, "resumed jobs") {
				t.Fatalf("resume: the page says %q", res)
			}

			// The main page's requeue, by keyboard alone.
			run(t, tab, chromedp.Navigate(f.url+"?queue=jobs"))
			tabTo(t, tab, fmt.Sprintf(`tr[data-id="%v"] form.requeue button`, f.dead["dies-plain"]))
			if res := submit(t, tab, chromedp.KeyEvent("\r")); !strings.Contains(res, fmt.Sprintf("requeued dead job %v", f.dead["dies-plain"])) {
				t.Fatalf("requeue by keyboard: the page says %q", res)
			}
			if _, dead := f.rows(t); dead != 2 {
				t.Errorf("%d dead jobs after the requeue, want 2", dead)
			}
			if err := f.held.Ack(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}
