package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
)

// fakeQueue is a queue in memory: a dead list and waiting jobs, recording
// every call that would change something.
type fakeQueue struct {
	mu      sync.Mutex
	stats   inbox.Stats
	dead    []inbox.DeadJob
	waiting map[int64]bool
	held    map[int64]bool
	nextID  int64
	changes []string
	purged  time.Time
}

func (f *fakeQueue) Stats(context.Context) (inbox.Stats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.stats
	st.Dead = int64(len(f.dead))
	return st, nil
}

func (f *fakeQueue) ListDead(_ context.Context, limit int, after *inbox.DeadJob) ([]inbox.DeadJob, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []inbox.DeadJob
	past := after == nil
	for _, j := range f.dead {
		if past && len(out) < limit {
			out = append(out, j)
		}
		if after != nil && j.ID == after.ID {
			past = true
		}
	}
	return out, nil
}

func (f *fakeQueue) RequeueDead(_ context.Context, id any) (any, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, j := range f.dead {
		if j.ID == id {
			f.dead = append(f.dead[:i], f.dead[i+1:]...)
			f.nextID++
			f.changes = append(f.changes, fmt.Sprintf("requeue %v", id))
			return f.nextID, nil
		}
	}
	return nil, fmt.Errorf("inbox: requeue dead: id %v: %w", id, inbox.ErrNotDead)
}

func (f *fakeQueue) PurgeDead(_ context.Context, before time.Time) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := int64(len(f.dead))
	f.dead, f.purged = nil, before
	f.changes = append(f.changes, "purge")
	return n, nil
}

func (f *fakeQueue) Cancel(_ context.Context, id any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, _ := id.(int64)
	switch {
	case f.held[n]:
		return fmt.Errorf("inbox: cancel: id %v: %w", id, inbox.ErrInWork)
	case !f.waiting[n]:
		return fmt.Errorf("inbox: cancel: id %v: %w", id, inbox.ErrNotFound)
	}
	delete(f.waiting, n)
	f.changes = append(f.changes, fmt.Sprintf("cancel %v", id))
	return nil
}

func (f *fakeQueue) changed() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.changes...)
}

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

func newFake() *fakeQueue {
	return &fakeQueue{
		stats: inbox.Stats{Ready: 12, Waiting: 3, InWork: -1, InWorkErr: errors.New("no plugin"), OldestReady: 90 * time.Second},
		dead: []inbox.DeadJob{
			{ID: int64(7), Attempt: 25, LastError: `<script>alert("x")</script><b>bold</b>`, DeadAt: t0.Add(-time.Minute), Data: []any{[]byte("<img src=x onerror=alert(1)>")}},
			{ID: int64(5), Attempt: 3, LastError: strings.Repeat("long error ", 1000), DeadAt: t0.Add(-time.Hour)},
		},
		waiting: map[int64]bool{40: true},
		held:    map[int64]bool{41: true},
		nextID:  100,
	}
}

// client is a browser: a cookie jar and the dashboard's server.
type client struct {
	t   *testing.T
	srv *httptest.Server
	c   *http.Client
}

func newClient(t *testing.T, h http.Handler) *client {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	jar, _ := cookiejar.New(nil)
	return &client{t: t, srv: srv, c: &http.Client{Jar: jar}}
}

func (c *client) get(path string) (int, string) {
	c.t.Helper()
	resp, err := c.c.Get(c.srv.URL + path)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (c *client) post(path string, v url.Values, header ...string) (int, string) {
	c.t.Helper()
	req, _ := http.NewRequest("POST", c.srv.URL+path, strings.NewReader(v.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.c.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

var tokenRe = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// token loads the page and returns the form token in it.
func (c *client) token() string {
	c.t.Helper()
	_, body := c.get("/")
	m := tokenRe.FindStringSubmatch(body)
	if m == nil {
		c.t.Fatalf("no token in the page:\n%s", body)
	}
	return m[1]
}

func newHandler(t *testing.T, cfg Config) *Handler {
	t.Helper()
	if cfg.Now == nil {
		cfg.Now = func() time.Time { return t0 }
	}
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestPage (issue 23): the page shows each queue's counts (an unknown in
// work as a dash with the server's reason), the dead jobs with their error
// texts and data escaped, a very long error cut with a note, and forms
// carrying the token.
func TestPage(t *testing.T) {
	f := newFake()
	other := newFake()
	other.stats.Ready = 4
	h := newHandler(t, Config{Queues: []QueueConfig{{Name: "mail", Queue: f}, {Name: "<b>x</b>", Queue: other}}})
	c := newClient(t, h)
	status, body := c.get("/")
	if status != 200 {
		t.Fatalf("GET / = %d", status)
	}
	for _, want := range []string{
		`<td class="n ready-count">12</td>`, `<td class="n waiting-count">3</td>`,
		`<td class="n inwork-count" title="no plugin">—</td>`, `<td class="n dead-count">2</td>`, `<td class="n oldest">1m30s</td>`,
		`<td class="n ready-count">4</td>`, `&lt;b&gt;x&lt;/b&gt;`,
		`&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&lt;b&gt;bold&lt;/b&gt;`, `&lt;img src=x onerror=alert(1)&gt;`,
		`first 2000 of 11000 bytes`, `<input type="hidden" name="id" value="7">`, `action="requeue"`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks %s", want)
		}
	}
	for _, bad := range []string{"<script>", "<b>bold", "<img src=x"} {
		if strings.Contains(body, bad) {
			t.Errorf("page carries %q unescaped", bad)
		}
	}
	if status, _ := c.get("/?queue=nope"); status != 404 {
		t.Errorf("an unknown queue = %d, want 404", status)
	}
}

// TestActions (issue 23): each action with the page's token acts once and
// says what it did; without a valid token, with a bad id, a second requeue,
// a job in work, a purge unconfirmed, nothing changes and the answer says
// why, with a status to match.
func TestActions(t *testing.T) {
	f := newFake()
	h := newHandler(t, Config{Queues: []QueueConfig{{Name: "mail", Queue: f}}})
	c := newClient(t, h)
	tok := c.token()
	form := func(kv ...string) url.Values {
		v := url.Values{"queue": {"mail"}}
		for i := 0; i+1 < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v
	}
	for _, w := range []struct {
		name, path string
		form       url.Values
		header     []string
		status     int
		says       string
		changes    int
	}{
		{"no token", "/requeue", form("id", "7"), nil, 403, "token is missing", 0},
		{"forged token", "/requeue", form("id", "7", "csrf", strings.Repeat("ab", 32)), nil, 403, "does not match", 0},
		{"cross-site", "/requeue", form("id", "7", "csrf", tok), []string{"Sec-Fetch-Site", "cross-site"}, 403, "cross-site", 0},
		{"not an integer", "/requeue", form("id", "7 or 1=1", "csrf", tok), nil, 400, `id &#34;7 or 1=1&#34; is not an integer`, 0},
		{"unknown id", "/requeue", form("id", "999", "csrf", tok), nil, 404, "has no dead job 999", 0},
		{"unknown queue", "/requeue", url.Values{"queue": {"nope"}, "id": {"7"}, "csrf": {tok}}, nil, 404, `no queue named &#34;nope&#34;`, 0},
		{"requeue", "/requeue", form("id", "7", "kind", "int", "csrf", tok), nil, 200, "requeued dead job 7 of mail as job 101", 1},
		{"second requeue", "/requeue", form("id", "7", "kind", "int", "csrf", tok), nil, 404, "has no dead job 7 (requeued or purged already", 1},
		{"cancel in work", "/cancel", form("id", "41", "csrf", tok), nil, 409, "is in work and is left to its holder", 1},
		{"cancel unknown", "/cancel", form("id", "42", "csrf", tok), nil, 404, "has no job 42", 1},
		{"cancel", "/cancel", form("id", "40", "csrf", tok), nil, 200, "cancelled job 40 of mail", 2},
		{"purge unconfirmed", "/purge", form("older", "all", "csrf", tok), nil, 400, "confirmation box", 2},
		{"purge bad age", "/purge", form("older", "-1h", "confirm", "yes", "csrf", tok), nil, 400, "not a positive duration", 2},
		{"purge a day", "/purge", form("older", "24h", "confirm", "yes", "csrf", tok), nil, 200, "purged 1 dead jobs of mail (the dead jobs older than 24h0m0s)", 3},
	} {
		status, body := c.post(w.path, w.form, w.header...)
		if status != w.status || !strings.Contains(body, w.says) {
			t.Errorf("%s: %d, want %d saying %q; page:\n%.600s", w.name, status, w.status, w.says, body[strings.Index(body, "<h2>Queues")-300:])
		}
		if got := f.changed(); len(got) != w.changes {
			t.Errorf("%s: changes %v, want %d", w.name, got, w.changes)
		}
	}
	if !f.purged.Equal(t0.Add(-24 * time.Hour)) {
		t.Errorf("purged before %v, want a day before now", f.purged)
	}
	if status, _ := c.get("/requeue"); status != 405 {
		t.Errorf("GET /requeue = %d, want 405", status)
	}
}

// TestReadOnly (issue 23): a read-only dashboard shows no form and refuses
// every action, changing nothing.
func TestReadOnly(t *testing.T) {
	f := newFake()
	h := newHandler(t, Config{Queues: []QueueConfig{{Name: "mail", Queue: f}}, ReadOnly: true})
	c := newClient(t, h)
	_, body := c.get("/")
	if strings.Contains(body, "<form") || !strings.Contains(body, "read-only") {
		t.Errorf("read-only page has forms or does not say so")
	}
	status, body := c.post("/requeue", url.Values{"queue": {"mail"}, "id": {"7"}})
	if status != 403 || !strings.Contains(body, "read-only") || len(f.changed()) != 0 {
		t.Errorf("POST to a read-only dashboard: %d, changes %v", status, f.changed())
	}
	status, body = c.post("/api/purge", url.Values{"queue": {"mail"}, "confirm": {"yes"}})
	if status != 403 || !strings.Contains(body, `"error": "refused: this dashboard is read-only`) || len(f.changed()) != 0 {
		t.Errorf("API POST to a read-only dashboard: %d %s, changes %v", status, body, f.changed())
	}
}

// TestJSON (issue 23): the endpoints serve the counts (null where not
// known), the dead jobs whole and paged, the history, and the actions with
// the token in a header.
func TestJSON(t *testing.T) {
	f := newFake()
	var done uint64
	h := newHandler(t, Config{Queues: []QueueConfig{{Name: "mail", Queue: f, Done: func() uint64 { return done }}}, DeadPage: 1})
	c := newClient(t, h)
	_, body := c.get("/api/queues")
	var qs struct {
		Queues []queueJSON `json:"queues"`
	}
	if err := json.Unmarshal([]byte(body), &qs); err != nil {
		t.Fatal(err)
	}
	if len(qs.Queues) != 1 || *qs.Queues[0].Ready != 12 || qs.Queues[0].InWork != nil || qs.Queues[0].InWorkNote != "no plugin" || *qs.Queues[0].Dead != 2 {
		t.Errorf("api/queues = %s", body)
	}
	_, body = c.get("/api/dead?queue=mail")
	var dead struct {
		Jobs []deadJSON        `json:"jobs"`
		Next map[string]string `json:"next"`
	}
	if err := json.Unmarshal([]byte(body), &dead); err != nil {
		t.Fatal(err)
	}
	if len(dead.Jobs) != 1 || dead.Jobs[0].LastError != f.dead[0].LastError || dead.Jobs[0].Data[0] != "<img src=x onerror=alert(1)>" || dead.Next["after"] != "7" {
		t.Errorf("api/dead = %s", body)
	}
	_, body = c.get("/api/dead?queue=mail&after=7&kind=int&at=" + url.QueryEscape(t0.Add(-time.Minute).Format(time.RFC3339Nano)))
	if !strings.Contains(body, `"id": 5`) || !strings.Contains(body, strings.Repeat("long error ", 1000)) {
		t.Errorf("api/dead's second page lacks job 5's whole error: %.300s", body)
	}
	if status, body := c.get("/api/dead?limit=0"); status != 400 || !strings.Contains(body, "limit") {
		t.Errorf("limit 0 = %d %s", status, body)
	}
	_, body = c.get("/api/token")
	var tok struct{ Token string }
	json.Unmarshal([]byte(body), &tok)
	status, body := c.post("/api/requeue", url.Values{"queue": {"mail"}, "id": {"7"}}, "X-CSRF-Token", tok.Token)
	if status != 200 || !strings.Contains(body, `"ok": true`) {
		t.Errorf("api/requeue = %d %s", status, body)
	}
	status, body = c.post("/api/requeue", url.Values{"queue": {"mail"}, "id": {"7"}}, "X-CSRF-Token", tok.Token)
	if status != 404 || !strings.Contains(body, "has no dead job 7") {
		t.Errorf("api/requeue again = %d %s", status, body)
	}
	_, body = c.get("/api/history?queue=mail")
	if !strings.Contains(body, `"ready": 12`) {
		t.Errorf("api/history = %s", body)
	}
}

// TestHistory (issue 23): samples are kept for Keep, the throughput is the
// growth of Done per minute, and the charts draw them.
func TestHistory(t *testing.T) {
	f := newFake()
	now := t0
	var done uint64
	h := newHandler(t, Config{Queues: []QueueConfig{{Name: "mail", Queue: f, Done: func() uint64 { return done }}},
		SampleEvery: 10 * time.Second, Keep: time.Minute, Now: func() time.Time { return now }})
	ctx := context.Background()
	for i := 0; i < 10; i++ {
		h.Sample(ctx)
		now = now.Add(10 * time.Second)
		done += 5
	}
	ss := h.hist.get("mail")
	if len(ss) != 7 || !ss[0].At.Equal(t0.Add(30*time.Second)) {
		t.Fatalf("kept %d samples from %v, want 7 from the last minute", len(ss), ss[0].At)
	}
	if ss[1].PerMinute != 30 {
		t.Errorf("throughput %v per minute, want 5 per 10 s: 30", ss[1].PerMinute)
	}
	depth, rate := h.charts(&h.queues[0], h.stats(httptest.NewRequest("GET", "/", nil))[0])
	if len(depth.Series) != 4 || depth.Series[2].Points != "" || len(rate.Series) != 1 || depth.top != 15 || rate.top != 30 {
		t.Errorf("charts: %d depth series (in work unknown: no line), %d rate, tops %v and %v", len(depth.Series), len(rate.Series), depth.top, rate.top)
	}
	c := newClient(t, h)
	_, body := c.get("/")
	if !strings.Contains(body, `<polyline class="ready" points="`) || !strings.Contains(body, `<polyline class="done" points="`) {
		t.Errorf("the page draws no chart")
	}
}

// TestNew (issue 23): bad configurations are refused by name.
func TestNew(t *testing.T) {
	q := newFake()
	for _, w := range []struct {
		cfg  Config
		says string
	}{
		{Config{}, "no queue"},
		{Config{Queues: []QueueConfig{{Queue: q}}}, "has no name"},
		{Config{Queues: []QueueConfig{{Name: "a"}}}, `"a" has no Queue`},
		{Config{Queues: []QueueConfig{{Name: "a", Queue: q}, {Name: "a", Queue: q}}}, `"a" named twice`},
		{Config{Queues: []QueueConfig{{Name: "a", Queue: q}}, DeadPage: 5000}, "DeadPage 5000"},
		{Config{Queues: []QueueConfig{{Name: "a", Queue: q}}, Key: []byte("short")}, "Key of 5 bytes"},
		{Config{Queues: []QueueConfig{{Name: "a", Queue: q}}, Timeout: -1}, "negative"},
	} {
		if _, err := New(w.cfg); err == nil || !strings.Contains(err.Error(), w.says) {
			t.Errorf("New(%+v) = %v, want an error saying %q", w.cfg, err, w.says)
		}
	}
}

// TestSampleOnRequest (issue 23): without Run, a page load takes a sample
// when the last is older than SampleEvery, and none otherwise.
func TestSampleOnRequest(t *testing.T) {
	now := t0
	h := newHandler(t, Config{Queues: []QueueConfig{{Name: "mail", Queue: newFake()}}, SampleEvery: 10 * time.Second,
		Now: func() time.Time { return now }})
	c := newClient(t, h)
	for _, step := range []struct {
		advance time.Duration
		want    int
	}{{0, 1}, {0, 1}, {9 * time.Second, 1}, {time.Second, 2}, {time.Minute, 3}} {
		now = now.Add(step.advance)
		c.get("/")
		if n := len(h.hist.get("mail")); n != step.want {
			t.Errorf("after %v more: %d samples, want %d", step.advance, n, step.want)
		}
	}
}

// brokenQueue fails its reads as a queue without Table.EnqueuedAt or
// Table.DeadTable does.
type brokenQueue struct{ *fakeQueue }

func (brokenQueue) Stats(context.Context) (inbox.Stats, error) {
	return inbox.Stats{}, fmt.Errorf("inbox: stats: %w", inbox.ErrNoEnqueuedAt)
}

func (brokenQueue) ListDead(context.Context, int, *inbox.DeadJob) ([]inbox.DeadJob, error) {
	return nil, fmt.Errorf("inbox: list dead: %w", inbox.ErrNoDeadTable)
}

// TestReadErrors (issue 23): a queue whose reads fail shows the errors in
// its row and in place of the dead jobs, its counts as dashes (null in
// JSON), and the other queues as usual.
func TestReadErrors(t *testing.T) {
	h := newHandler(t, Config{Queues: []QueueConfig{{Name: "broken", Queue: brokenQueue{newFake()}}, {Name: "mail", Queue: newFake()}}})
	c := newClient(t, h)
	status, body := c.get("/?queue=broken")
	for _, want := range []string{
		"needs Table.EnqueuedAt", `id="dead-error">inbox: list dead: inbox: no dead table`,
		`<td class="n ready-count">—</td>`, `<td class="n ready-count">12</td>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("page (%d) lacks %s", status, want)
		}
	}
	_, body = c.get("/api/queues")
	if !strings.Contains(body, `"ready": null`) || !strings.Contains(body, `"error": "inbox: stats: inbox: the age of the oldest ready job needs Table.EnqueuedAt"`) {
		t.Errorf("api/queues = %s", body)
	}
}

// TestLegendAfterAction (issue 35): after a requeue, within the sampling
// interval, the depth chart's legend counts what the table counts (it
// showed the sample from before the action: dead 3 beside a table's 2),
// and a page load with nothing changed adds no sample.
func TestLegendAfterAction(t *testing.T) {
	f := newFake()
	f.dead = append(f.dead, inbox.DeadJob{ID: int64(3), Attempt: 1, DeadAt: t0.Add(-2 * time.Hour)})
	h := newHandler(t, Config{Queues: []QueueConfig{{Name: "mail", Queue: f}}, SampleEvery: time.Hour})
	c := newClient(t, h)
	legend := func(body string) string {
		m := regexp.MustCompile(`■ dead \((\d+)\)`).FindStringSubmatch(body)
		if m == nil {
			t.Fatalf("no dead count in the legend:\n%s", body)
		}
		return m[1]
	}
	tok := c.token()
	_, body := c.get("/")
	if got := legend(body); got != "3" || !strings.Contains(body, `<td class="n dead-count">3</td>`) {
		t.Fatalf("before the requeue: legend dead %s, want 3 as the table", got)
	}
	samples := len(h.hist.get("mail"))
	status, body := c.post("/requeue", url.Values{"queue": {"mail"}, "id": {"7"}, "kind": {"int"}, "csrf": {tok}})
	if status != 200 {
		t.Fatalf("requeue: %d", status)
	}
	if got := legend(body); got != "2" || !strings.Contains(body, `<td class="n dead-count">2</td>`) {
		t.Errorf("after the requeue: legend dead %s, want 2 as the table", got)
	}
	if n := len(h.hist.get("mail")); n != samples+1 {
		t.Errorf("%d samples after the requeue, want %d", n, samples+1)
	}
	c.get("/")
	if n := len(h.hist.get("mail")); n != samples+1 {
		t.Errorf("%d samples after a page load with nothing changed, want %d", n, samples+1)
	}
}
