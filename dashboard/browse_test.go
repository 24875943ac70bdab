package dashboard

import (
	"context"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
)

// fakeBrowser is a fakeQueue that can be browsed: jobs 10 to 39, 13
// waiting and the others ready, and fakeQueue's dead ones.
type fakeBrowser struct {
	*fakeQueue
	jobs []inbox.JobView // highest id first
}

func newFakeBrowser() *fakeBrowser {
	b := &fakeBrowser{fakeQueue: newFake()}
	for id := int64(39); id >= 10; id-- {
		j := inbox.JobView{ID: id, State: inbox.StateReady, Attempt: 1, EnqueuedAt: t0, Data: []any{[]byte(`{"to":"a@example.com","n":1}`)}}
		switch id {
		case 13:
			j.State, j.Due, j.LastError = inbox.StateWaiting, t0.Add(3600e9), "<b>greylisted</b>\nline two"
			j.Data = []any{[]byte("plain text\twith a tab")}
		case 12:
			j.Data = []any{[]byte{0x00, 0xff, 'a', 0x1b}}
		}
		b.jobs = append(b.jobs, j)
	}
	return b
}

func (b *fakeBrowser) ListJobs(_ context.Context, f inbox.JobFilter) (inbox.JobPage, error) {
	b.mu.Lock()
	paused, since := b.stats.Paused, b.stats.PausedSince
	b.mu.Unlock()
	page := inbox.JobPage{Stats: inbox.Stats{Ready: 29, Waiting: 1, InWork: -1, Dead: int64(len(b.dead)), Paused: paused, PausedSince: since}}
	if f.State == inbox.StateInWork {
		return page, inbox.ErrNoInWorkList
	}
	var match []inbox.JobView
	for _, j := range b.jobs {
		if f.State == inbox.StateAll || j.State == f.State {
			match = append(match, j)
		}
	}
	lo, hi := 0, len(match)
	for i, j := range match {
		id := j.ID.(int64)
		if f.After != nil && id >= f.After.(int64) {
			lo = i + 1
		}
		if f.Before != nil && id > f.Before.(int64) {
			hi = i + 1
		}
	}
	if f.Before != nil {
		page.Older = true
		if hi-lo > f.Limit {
			lo, page.Newer = hi-f.Limit, true
		}
	} else {
		page.Newer = f.After != nil
		if hi-lo > f.Limit {
			hi, page.Older = lo+f.Limit, true
		}
	}
	page.Jobs = match[lo:hi]
	return page, nil
}

// Paused reads the pause as *inbox.Queue does, without the counts.
func (b *fakeBrowser) Paused(context.Context) (inbox.PauseState, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return inbox.PauseState{Paused: b.stats.Paused, Since: b.stats.PausedSince}, nil
}

func (b *fakeBrowser) Job(_ context.Context, id any) (inbox.JobView, error) {
	for _, j := range b.jobs {
		if j.ID == id {
			return j, nil
		}
	}
	for _, d := range b.dead {
		if d.ID == id {
			return inbox.JobView{ID: d.ID, State: inbox.StateDead, Attempt: d.Attempt, LastError: d.LastError, DeadAt: d.DeadAt, Data: d.Data}, nil
		}
	}
	return inbox.JobView{}, inbox.ErrNotFound
}

var idsRe = regexp.MustCompile(`<tr data-id="([^"]+)">`)

// rowIDs are the ids of a page's job rows, in order.
func rowIDs(body string) []string {
	var ids []string
	for _, m := range idsRe.FindAllStringSubmatch(body, -1) {
		ids = append(ids, m[1])
	}
	return ids
}

// linkOf returns the href of the link with the id, unescaped.
func linkOf(t *testing.T, body, id string) string {
	t.Helper()
	m := regexp.MustCompile(`id="` + id + `" href="([^"]+)"`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no link %q in:\n%s", id, body)
	}
	return "jobs" + html.UnescapeString(m[1])
}

// TestJobsView: a queue's jobs by state, the counts on the tabs, paging
// older then newer, an in-work tab the form cannot list explained, the
// dead tab, and a queue that cannot be browsed refused.
func TestJobsView(t *testing.T) {
	b := newFakeBrowser()
	c := newClient(t, newHandler(t, Config{Queues: []QueueConfig{{Name: "mail", Queue: b}, {Name: "plain", Queue: newFake()}}, DeadPage: 10}))
	status, body := c.get("/jobs?queue=mail")
	if status != 200 || !strings.Contains(body, `aria-current="page">ready (29)`) || !strings.Contains(body, "waiting (1)") || !strings.Contains(body, "in work (—)") {
		t.Fatalf("ready tab: %d\n%s", status, body)
	}
	if got := rowIDs(body); len(got) != 10 || got[0] != "39" || got[9] != "30" {
		t.Errorf("first page = %v", got)
	}
	if strings.Contains(body, `id="newer"`) {
		t.Errorf("the first page links to newer jobs")
	}
	older := linkOf(t, body, "older")
	_, body = c.get("/" + older)
	if got := rowIDs(body); len(got) != 10 || got[0] != "29" {
		t.Errorf("older page = %v", got)
	}
	_, body = c.get("/" + linkOf(t, body, "newer"))
	if got := rowIDs(body); len(got) != 10 || got[0] != "39" || got[9] != "30" {
		t.Errorf("newer page = %v", got)
	}
	_, body = c.get("/jobs?queue=mail&state=waiting")
	if got := rowIDs(body); !slices.Equal(got, []string{"13"}) || !strings.Contains(body, "&lt;b&gt;greylisted&lt;/b&gt;") {
		t.Errorf("waiting tab = %v\n%s", got, body)
	}
	_, body = c.get("/jobs?queue=mail&state=inwork")
	if !strings.Contains(body, `id="jobs-note"`) || !strings.Contains(body, "cannot list the jobs in work") {
		t.Errorf("in-work tab without a list:\n%s", body)
	}
	_, body = c.get("/jobs?queue=mail&state=dead")
	if got := rowIDs(body); !slices.Equal(got, []string{"7", "5"}) || strings.Contains(body, "<script>") {
		t.Errorf("dead tab = %v\n%s", got, body)
	}
	for _, w := range []struct {
		path   string
		status int
	}{
		{"/jobs?queue=plain", http.StatusNotFound},
		{"/jobs?queue=nope", http.StatusNotFound},
		{"/jobs?queue=mail&state=bogus", http.StatusBadRequest},
		{"/jobs?queue=mail&after=x1", http.StatusBadRequest},
		{"/job?queue=mail&id=999", http.StatusNotFound},
		{"/job?queue=mail&id=", http.StatusBadRequest},
	} {
		if status, _ := c.get(w.path); status != w.status {
			t.Errorf("GET %s: %d, want %d", w.path, status, w.status)
		}
	}
	if status, _ := c.post("/jobs?queue=mail", url.Values{}); status != http.StatusMethodNotAllowed {
		t.Errorf("POST /jobs: %d", status)
	}
}

// TestJobsViewPaused: the jobs view of a paused queue says so on every
// tab, from the counts read with the page (the live tabs') or Stats (the
// dead tab's); a queue that runs has no banner.
func TestJobsViewPaused(t *testing.T) {
	b := newFakeBrowser()
	c := newClient(t, newHandler(t, Config{Queues: []QueueConfig{{Name: "mail", Queue: b}}}))
	banner := `<p class="result paused-banner">Queue mail is paused since `
	if _, body := c.get("/jobs?queue=mail"); strings.Contains(body, `class="result paused-banner"`) {
		t.Errorf("a queue that runs has a paused banner:\n%s", body)
	}
	b.mu.Lock()
	b.stats.Paused, b.stats.PausedSince = true, t0.Add(-time.Minute)
	b.mu.Unlock()
	for _, state := range []string{"ready", "waiting", "dead"} {
		if _, body := c.get("/jobs?queue=mail&state=" + state); !strings.Contains(body, banner+when(t0.Add(-time.Minute))) {
			t.Errorf("%s tab of a paused queue has no banner:\n%s", state, body)
		}
	}
}

// TestJobPagePaused: a job's page says its queue is paused, as the jobs
// view does, read with the queue's Paused alone; a queue that runs has
// no banner.
func TestJobPagePaused(t *testing.T) {
	b := newFakeBrowser()
	c := newClient(t, newHandler(t, Config{Queues: []QueueConfig{{Name: "mail", Queue: b}}}))
	if _, body := c.get("/job?queue=mail&id=10"); strings.Contains(body, `class="result paused-banner"`) {
		t.Errorf("the job page of a queue that runs has a paused banner:\n%s", body)
	}
	b.mu.Lock()
	b.stats.Paused, b.stats.PausedSince = true, t0.Add(-time.Minute)
	b.mu.Unlock()
	banner := `<p class="result paused-banner">Queue mail is paused since ` + when(t0.Add(-time.Minute))
	for _, path := range []string{"/job?queue=mail&id=10", "/job?queue=mail&id=999"} {
		if _, body := c.get(path); !strings.Contains(body, banner) {
			t.Errorf("%s of a paused queue has no banner:\n%s", path, body)
		}
	}
}

// TestJobPage: the data as pretty JSON, text or hex, the last error whole
// and escaped, the actions of the job's state carrying the token, and a
// requeue from the page going through the action's checks.
func TestJobPage(t *testing.T) {
	b := newFakeBrowser()
	c := newClient(t, newHandler(t, Config{Queues: []QueueConfig{{Name: "mail", Queue: b}}}))
	_, body := c.get("/job?queue=mail&id=39")
	if !strings.Contains(body, "JSON, 28 bytes") || !strings.Contains(body, "{\n  &#34;to&#34;: &#34;a@example.com&#34;,\n  &#34;n&#34;: 1\n}") {
		t.Errorf("JSON data:\n%s", body)
	}
	if !strings.Contains(body, `id="cancel-form"`) || strings.Contains(body, `id="requeue-form"`) {
		t.Errorf("a ready job's actions:\n%s", body)
	}
	_, body = c.get("/job?queue=mail&id=13")
	if !strings.Contains(body, "text, 21 bytes") || !strings.Contains(body, "plain text\twith a tab") ||
		!strings.Contains(body, "&lt;b&gt;greylisted&lt;/b&gt;\nline two") || !strings.Contains(body, "waiting") {
		t.Errorf("text data and error:\n%s", body)
	}
	_, body = c.get("/job?queue=mail&id=12")
	if !strings.Contains(body, "binary, 4 bytes, in hex") || !strings.Contains(body, "00 ff 61 1b") || strings.Contains(body, "[0 255") {
		t.Errorf("binary data:\n%s", body)
	}
	_, body = c.get("/job?queue=mail&id=5")
	if !strings.Contains(body, `id="requeue-form"`) || strings.Contains(body, `id="cancel-form"`) || !strings.Contains(body, strings.Repeat("long error ", 1000)[:200]) {
		t.Errorf("a dead job's page:\n%s", body)
	}
	if strings.Count(body, "long error") != 1000 {
		t.Errorf("the dead job's error is not whole: %d of 1000 repeats", strings.Count(body, "long error"))
	}
	tok := tokenRe.FindStringSubmatch(body)
	if tok == nil {
		t.Fatalf("no token on the job page")
	}
	if status, _ := c.post("/requeue", url.Values{"queue": {"mail"}, "id": {"5"}, "kind": {"int"}}); status != http.StatusForbidden {
		t.Errorf("requeue without the token: %d", status)
	}
	status, res := c.post("/requeue", url.Values{"csrf": {tok[1]}, "queue": {"mail"}, "id": {"5"}, "kind": {"int"}})
	if status != 200 || !strings.Contains(res, "requeued dead job 5 of mail") {
		t.Errorf("requeue from the job page: %d\n%s", status, res)
	}
	ro := newClient(t, newHandler(t, Config{ReadOnly: true, Queues: []QueueConfig{{Name: "mail", Queue: b}}}))
	if _, body := ro.get("/job?queue=mail&id=7"); strings.Contains(body, "<form method=\"post\"") {
		t.Errorf("a read-only job page shows forms")
	}
}

func TestPayloadOf(t *testing.T) {
	for _, w := range []struct {
		in     any
		format string
		text   string
	}{
		{[]byte(`[1,2]`), "JSON, 5 bytes", "[\n  1,\n  2\n]"},
		{"héllo\nworld", "text, 12 bytes", "héllo\nworld"},
		{[]byte("bell\a"), "binary, 5 bytes, in hex", "00000000  62 65 6c 6c 07                                    |bell.|\n"},
		{[]byte{0xc3}, "binary, 1 bytes, in hex", "00000000  c3                                                |.|\n"},
		{int64(42), "int64", "42"},
		{nil, "NULL", ""},
	} {
		p := payloadOf([]any{w.in})[0]
		if p.Format != w.format || p.Text != w.text {
			t.Errorf("payloadOf(%q) = %q %q, want %q %q", w.in, p.Format, p.Text, w.format, w.text)
		}
	}
}

// asBrowser is a fakeBrowser on a table whose ids the caller gives:
// RequeueDead has none to give, RequeueDeadAs requeues under the one given.
type asBrowser struct{ *fakeBrowser }

func (a asBrowser) RequeueDead(_ context.Context, id any) (any, error) {
	return nil, fmt.Errorf("inbox: requeue dead: %w", inbox.ErrRequeueNeedsID)
}

func (a asBrowser) RequeueDeadAs(ctx context.Context, id, newID any) error {
	a.mu.Lock()
	for _, j := range a.dead {
		if j.ID == newID {
			a.mu.Unlock()
			return fmt.Errorf("inbox: requeue dead: new id: %w", inbox.ErrDeadID)
		}
	}
	a.mu.Unlock()
	if _, err := a.fakeBrowser.RequeueDead(ctx, id); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.changes = append(a.changes, fmt.Sprintf("as %v", newID))
	return nil
}

// TestJobPageRequeueAs: where the Queue can requeue under a given id, a
// dead job's page has a field for it. Without one, a table that assigns no
// ids is refused, saying what to do; a dead job's id or text that is not an
// id is refused; a fresh id requeues the job under it. A Queue that cannot
// has no field, and a new id posted to it anyway changes nothing.
func TestJobPageRequeueAs(t *testing.T) {
	b := asBrowser{newFakeBrowser()}
	c := newClient(t, newHandler(t, Config{Queues: []QueueConfig{{Name: "mail", Queue: b}}}))
	_, body := c.get("/job?queue=mail&id=5")
	if !strings.Contains(body, `id="new-id"`) {
		t.Fatalf("a dead job's page of a RequeuerAs has no new id field:\n%s", body)
	}
	tok := tokenRe.FindStringSubmatch(body)[1]
	status := 0
	requeue := func(q *client, newID string) string {
		t.Helper()
		var res string
		status, res = q.post("/requeue", url.Values{"csrf": {tok}, "queue": {"mail"}, "id": {"5"}, "kind": {"int"}, "new_id": {newID}})
		return res
	}
	for _, w := range []struct {
		newID, says string
		status      int
	}{
		{"", "bad request: queue mail assigns no ids: give dead job 5 a new id on its page", http.StatusBadRequest},
		{"7", "conflict: 7 is a dead job&#39;s id", http.StatusConflict},
		{"seven", "bad request: new id: ", http.StatusBadRequest},
	} {
		if res := requeue(c, w.newID); !strings.Contains(res, w.says) || status != w.status {
			t.Errorf("requeue under %q: %d, want %d and %q in\n%s", w.newID, status, w.status, w.says, res)
		}
	}
	if ch := b.changed(); len(ch) != 0 {
		t.Fatalf("refused requeues changed %q", ch)
	}
	if res := requeue(c, "5000"); !strings.Contains(res, "requeued dead job 5 of mail as job 5000") {
		t.Errorf("requeue under 5000:\n%s", res)
	}
	if ch := b.changed(); strings.Join(ch, ",") != "requeue 5,as 5000" {
		t.Errorf("changes %q, want job 5 requeued as 5000", ch)
	}

	plain := newFakeBrowser()
	pc := newClient(t, newHandler(t, Config{Queues: []QueueConfig{{Name: "mail", Queue: plain}}}))
	_, body = pc.get("/job?queue=mail&id=7")
	if strings.Contains(body, `id="new-id"`) {
		t.Errorf("a Queue without RequeueDeadAs has a new id field")
	}
	tok = tokenRe.FindStringSubmatch(body)[1]
	if res := requeue(pc, "5000"); !strings.Contains(res, "cannot requeue under a given id") || len(plain.changed()) != 0 {
		t.Errorf("a new id posted to a Queue without RequeueDeadAs: %q\n%s", plain.changed(), res)
	}
}
