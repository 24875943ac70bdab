package dashboard

import (
	"context"
	"encoding/json"
	"net/url"
	"strings"
	"testing"
	"time"
)

// pausingQueue is a fakeQueue that can be paused.
type pausingQueue struct{ *fakeQueue }

func (p pausingQueue) Pause(_ context.Context, by string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stats.Paused {
		p.stats.Paused, p.stats.PausedSince = true, t0.Add(-time.Minute)
	}
	p.changes = append(p.changes, "pause by "+by)
	return nil
}

func (p pausingQueue) Resume(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stats.Paused, p.stats.PausedSince = false, time.Time{}
	p.changes = append(p.changes, "resume")
	return nil
}

// TestPauseButton (issue 37 item 4): a queue that can be paused has a pause
// button, a POST form carrying the token; pressing it pauses the queue (by
// "dashboard"), and the page then shows it paused, since when, with a
// resume button; the JSON says so too. A POST without the token, or from
// another site, is refused and changes nothing; a queue that cannot be
// paused has no button, and a POST for it is refused.
func TestPauseButton(t *testing.T) {
	f := pausingQueue{newFake()}
	plain := newFake()
	h := newHandler(t, Config{Queues: []QueueConfig{{Name: "mail", Queue: f}, {Name: "plain", Queue: plain}}})
	c := newClient(t, h)
	_, page := c.get("/")
	if !strings.Contains(page, `action="pause"`) || strings.Count(page, `<button type="submit">pause</button>`) != 1 {
		t.Errorf("the page has not exactly one pause button (mail's):\n%s", page)
	}
	tok := c.token()
	for _, w := range []struct {
		name   string
		form   url.Values
		header []string
		status int
		says   string
	}{
		{"no token", url.Values{"queue": {"mail"}}, nil, 403, "token is missing"},
		{"forged token", url.Values{"queue": {"mail"}, "csrf": {strings.Repeat("ab", 32)}}, nil, 403, "does not match"},
		{"cross-site", url.Values{"queue": {"mail"}, "csrf": {tok}}, []string{"Sec-Fetch-Site", "cross-site"}, 403, "cross-site"},
		{"cannot pause", url.Values{"queue": {"plain"}, "csrf": {tok}}, nil, 400, "queue plain cannot be paused"},
	} {
		if status, body := c.post("/pause", w.form, w.header...); status != w.status || !strings.Contains(body, w.says) {
			t.Errorf("%s: %d, want %d saying %q", w.name, status, w.status, w.says)
		}
	}
	if got := f.changed(); len(got) != 0 {
		t.Fatalf("refused posts changed %v", got)
	}
	status, body := c.post("/pause", url.Values{"queue": {"mail"}, "csrf": {tok}})
	if status != 200 || !strings.Contains(body, "paused mail") || !strings.Contains(body, "paused since "+when(t0.Add(-time.Minute))) ||
		!strings.Contains(body, `<button type="submit">resume</button>`) {
		t.Errorf("pause: %d, want 200, the queue shown paused with a resume button:\n%s", status, body)
	}
	if !strings.Contains(body, `<p class="result paused-banner" data-queue="mail">Queue mail is paused since `+when(t0.Add(-time.Minute))) {
		t.Errorf("the paused page has no banner:\n%s", body)
	}
	if got := f.changed(); len(got) != 1 || got[0] != "pause by dashboard" {
		t.Errorf("changes %v, want a pause by dashboard", got)
	}
	_, js := c.get("/api/queues")
	var out struct{ Queues []queueJSON }
	if err := json.Unmarshal([]byte(js), &out); err != nil || len(out.Queues) != 2 || !out.Queues[0].Paused ||
		out.Queues[0].PausedSince == nil || !out.Queues[0].PausedSince.Equal(t0.Add(-time.Minute)) || out.Queues[1].Paused {
		t.Errorf("api/queues = %s (%v), want mail paused since a minute ago, plain running", js, err)
	}
	status, body = c.post("/api/resume", url.Values{"queue": {"mail"}, "csrf": {tok}})
	if status != 200 || !strings.Contains(body, "resumed mail") {
		t.Errorf("api/resume: %d %s", status, body)
	}
	if _, page := c.get("/"); strings.Contains(page, `class="result paused-banner"`) {
		t.Errorf("the banner stays after the resume")
	}
}
