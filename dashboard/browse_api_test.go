package dashboard

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
)

type jobsJSON struct {
	Queue, State string
	Total        *int64
	Counts       map[string]*int64
	Next, Prev   *string
	Note, Error  string
	Jobs         []jobJSON
}

// getJSON GETs path and decodes its body into v.
func getJSON(t *testing.T, c *client, path string, v any) int {
	t.Helper()
	status, body := c.get(path)
	if err := json.Unmarshal([]byte(body), v); err != nil {
		t.Fatalf("GET %s: %d, not JSON: %v\n%s", path, status, err, body)
	}
	return status
}

func idsOf(jobs []jobJSON) []string {
	var ids []string
	for _, j := range jobs {
		ids = append(ids, fmt.Sprint(j.ID))
	}
	return ids
}

// TestJobsJSON (issue 37): api/jobs serves the jobs view's page (the same
// rows for the same query), the state's total and the counts, and the
// queries of the older and newer pages; bad input is a 400 naming it.
func TestJobsJSON(t *testing.T) {
	b := newFakeBrowser()
	c := newClient(t, newHandler(t, Config{Queues: []QueueConfig{{Name: "mail", Queue: b}, {Name: "plain", Queue: newFake()}}, DeadPage: 10}))
	var p jobsJSON
	if status := getJSON(t, c, "/api/jobs?queue=mail", &p); status != 200 || p.State != "ready" || p.Total == nil || *p.Total != 29 ||
		p.Counts["in_work"] != nil || *p.Counts["dead"] != 2 || p.Prev != nil || p.Next == nil {
		t.Fatalf("first page: %d %+v", status, p)
	}
	if got := idsOf(p.Jobs); len(got) != 10 || got[0] != "39" || got[9] != "30" {
		t.Errorf("first page ids %v", got)
	}
	first := idsOf(p.Jobs)
	var older jobsJSON
	getJSON(t, c, "/api/jobs"+*p.Next, &older)
	if got := idsOf(older.Jobs); len(got) != 10 || got[0] != "29" || older.Prev == nil {
		t.Fatalf("older page %v, prev %v", got, older.Prev)
	}
	var back jobsJSON
	getJSON(t, c, "/api/jobs"+*older.Prev, &back)
	if got := idsOf(back.Jobs); !slices.Equal(got, first) {
		t.Errorf("back newer: %v, want %v", got, first)
	}
	// The page and the JSON list the same rows for the same query.
	for _, q := range []string{"?queue=mail", "?queue=mail&state=waiting", "?queue=mail&state=all&after=20&kind=int", "?queue=mail&state=dead"} {
		var j jobsJSON
		getJSON(t, c, "/api/jobs"+q, &j)
		_, page := c.get("/jobs" + q)
		if got, want := idsOf(j.Jobs), rowIDs(page); !slices.Equal(got, want) {
			t.Errorf("%s: JSON lists %v, the page %v", q, got, want)
		}
	}
	var dead jobsJSON
	getJSON(t, c, "/api/jobs?queue=mail&state=dead", &dead)
	if len(dead.Jobs) != 2 || dead.Jobs[0].State != "dead" || dead.Jobs[0].DeadAt == nil || !dead.Jobs[0].DeadAt.Equal(t0.Add(-60e9)) ||
		dead.Jobs[0].LastError != `<script>alert("x")</script><b>bold</b>` || *dead.Total != 2 || !slices.Equal(dead.Jobs[0].Actions, []string{"requeue"}) {
		t.Errorf("dead page: %+v", dead)
	}
	var inwork jobsJSON
	if status := getJSON(t, c, "/api/jobs?queue=mail&state=inwork", &inwork); status != 200 || !strings.Contains(inwork.Note, "cannot list the jobs in work") || len(inwork.Jobs) != 0 {
		t.Errorf("in work: %d %+v", status, inwork)
	}
	for _, w := range []struct {
		path   string
		status int
		says   string
	}{
		{"/api/jobs?queue=mail&state=bogus", 400, `no state "bogus"`},
		{"/api/jobs?queue=mail&after=x1", 400, `id "x1" is not an integer`},
		{"/api/jobs?queue=nope", 404, `no queue named "nope"`},
		{"/api/jobs?queue=plain", 404, "queue plain cannot be browsed"},
		{"/api/job?queue=mail&id=999", 404, "queue mail has no job 999"},
		{"/api/job?queue=mail&id=", 400, "no id given"},
		{"/api/job?queue=plain&id=1", 404, "queue plain cannot be browsed"},
	} {
		var e struct{ Error string }
		if status := getJSON(t, c, w.path, &e); status != w.status || !strings.Contains(e.Error, w.says) {
			t.Errorf("GET %s: %d %q, want %d saying %q", w.path, status, e.Error, w.status, w.says)
		}
	}
	if status, _ := c.post("/api/jobs?queue=mail", url.Values{}); status != http.StatusMethodNotAllowed {
		t.Errorf("POST api/jobs: %d", status)
	}
}

// TestJobJSON (issue 37): api/job serves a job as its page shows it: the
// data as pretty JSON, text or hex, the error whole, the times, and the
// actions its state allows (none when read-only).
func TestJobJSON(t *testing.T) {
	b := newFakeBrowser()
	c := newClient(t, newHandler(t, Config{Queues: []QueueConfig{{Name: "mail", Queue: b}}}))
	type answer struct {
		Queue string
		Job   jobJSON
	}
	var a answer
	if status := getJSON(t, c, "/api/job?queue=mail&id=39", &a); status != 200 || a.Queue != "mail" || a.Job.ID != float64(39) ||
		a.Job.State != "ready" || a.Job.EnqueuedAt == nil || a.Job.Due != nil || a.Job.DeadAt != nil || !slices.Equal(a.Job.Actions, []string{"cancel"}) ||
		len(a.Job.Data) != 1 || a.Job.Data[0].Format != "JSON, 28 bytes" || a.Job.Data[0].Text != "{\n  \"to\": \"a@example.com\",\n  \"n\": 1\n}" {
		t.Errorf("a ready job: %d %+v", status, a)
	}
	getJSON(t, c, "/api/job?queue=mail&id=13", &a)
	if a.Job.State != "waiting" || a.Job.Due == nil || a.Job.DueLabel != "not before" || a.Job.LastError != "<b>greylisted</b>\nline two" || a.Job.Data[0].Format != "text, 21 bytes" {
		t.Errorf("a waiting job: %+v", a.Job)
	}
	getJSON(t, c, "/api/job?queue=mail&id=12", &a)
	if a.Job.Data[0].Format != "binary, 4 bytes, in hex" || !strings.Contains(a.Job.Data[0].Text, "00 ff 61 1b") {
		t.Errorf("a binary job: %+v", a.Job.Data)
	}
	getJSON(t, c, "/api/job?queue=mail&id=5", &a)
	if a.Job.State != "dead" || len(a.Job.LastError) != 11000 || !slices.Equal(a.Job.Actions, []string{"requeue"}) {
		t.Errorf("a dead job: state %s, %d bytes of error, actions %v", a.Job.State, len(a.Job.LastError), a.Job.Actions)
	}
	ro := newClient(t, newHandler(t, Config{ReadOnly: true, Queues: []QueueConfig{{Name: "mail", Queue: b}}}))
	getJSON(t, ro, "/api/job?queue=mail&id=5", &a)
	if len(a.Job.Actions) != 0 {
		t.Errorf("read-only: actions %v", a.Job.Actions)
	}
}
