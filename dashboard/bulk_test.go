package dashboard

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
)

// fakeBulk is a fakeBrowser with the bulk actions: requeues and deletes of
// dead jobs all or none, a count of 1,234 dead jobs for a requeue-all, and
// job 13 waiting.
type fakeBulk struct {
	*fakeBrowser
	filter inbox.DeadFilter
	batch  int
}

func newFakeBulk() *fakeBulk { return &fakeBulk{fakeBrowser: newFakeBrowser()} }

// takeDead removes the dead jobs ids, all or none, recording what.
func (f *fakeBulk) takeDead(what string, ids []any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	left := slices.Clone(f.dead)
	for _, id := range ids {
		i := slices.IndexFunc(left, func(j inbox.DeadJob) bool { return j.ID == id })
		if i < 0 {
			return fmt.Errorf("inbox: %s dead: id %v: %w", what, id, inbox.ErrNotDead)
		}
		left = slices.Delete(left, i, i+1)
	}
	f.dead = left
	f.changes = append(f.changes, fmt.Sprintf("%s %v", what, ids))
	return nil
}

func (f *fakeBulk) DeleteDeadMany(_ context.Context, ids []any) error {
	return f.takeDead("delete", ids)
}

func (f *fakeBulk) RequeueDeadMany(_ context.Context, ids []any) ([]any, error) {
	if err := f.takeDead("requeue", ids); err != nil {
		return nil, err
	}
	return slices.Clone(ids), nil
}

func (f *fakeBulk) CountDead(_ context.Context, df inbox.DeadFilter) (int64, error) { return 1234, nil }

func (f *fakeBulk) RequeueDeadAll(_ context.Context, df inbox.DeadFilter, batch int) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.filter, f.batch = df, batch
	f.changes = append(f.changes, "requeue all")
	return df.Max, nil
}

func (f *fakeBulk) RunNow(_ context.Context, id any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch id {
	case int64(13):
		f.changes = append(f.changes, "run now 13")
		return nil
	case int64(41):
		return fmt.Errorf("inbox: run now: id 41: %w", inbox.ErrInWork)
	case int64(39):
		return fmt.Errorf("inbox: run now: id 39 is ready: %w", inbox.ErrNotWaiting)
	}
	return fmt.Errorf("inbox: run now: id %v: %w", id, inbox.ErrNotFound)
}

// bulkClient is a browser on a dashboard of one fakeBulk queue, "mail",
// with the form token of its dead list.
func bulkClient(t *testing.T) (*client, *fakeBulk, string) {
	f := newFakeBulk()
	c := newClient(t, newHandler(t, Config{Queues: []QueueConfig{{Name: "mail", Queue: f}}}))
	_, body := c.get("/jobs?queue=mail&state=dead")
	m := tokenRe.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no token on the dead list:\n%s", body)
	}
	return c, f, m[1]
}

// TestBulkSelected: the dead list has a box per row and the bulk forms;
// the ticked jobs are requeued or deleted (deleting needs its box), and
// the list says how many; an empty selection, an id that is not an
// integer or one that is not dead changes nothing and says why.
func TestBulkSelected(t *testing.T) {
	c, f, tok := bulkClient(t)
	_, body := c.get("/jobs?queue=mail&state=dead")
	for _, want := range []string{`id="pick-7"`, `id="pick-5"`, `form="selected-form"`, `id="requeue-selected"`, `id="delete-selected"`, `action="requeue-all"`} {
		if !strings.Contains(body, want) {
			t.Errorf("the dead list lacks %s:\n%s", want, body)
		}
	}
	form := func(do string, ids ...string) url.Values {
		return url.Values{"csrf": {tok}, "queue": {"mail"}, "kind": {"int"}, "do": {do}, "id": ids, "return": {"jobs?queue=mail&state=dead"}}
	}
	sure := form("delete", "5")
	sure.Set("confirm", "yes")
	for _, w := range []struct {
		name    string
		form    url.Values
		says    string
		changes int
	}{
		{"nothing ticked", form("requeue"), "bad request: no job selected: tick the jobs first; nothing was changed", 0},
		{"not an integer", form("requeue", "7", "x"), "bad request: id &#34;x&#34; is not an integer; nothing was changed", 0},
		{"unknown do", form("frob", "7"), "bad request: do &#34;frob&#34;: requeue or delete", 0},
		{"one not dead", form("requeue", "7", "99"), "not found: inbox: requeue dead: id 99: inbox: no dead job with this id (queue mail;", 0},
		{"delete unconfirmed", form("delete", "7"), "deleting needs the confirmation box ticked", 0},
		{"requeue one", form("requeue", "7"), "requeued 1 dead job of mail", 1},
		{"delete", sure, "deleted 1 dead job of mail", 2},
	} {
		status, body := c.post("/selected", w.form)
		if status != 200 || !strings.Contains(body, `id="result"`) || !strings.Contains(body, w.says) || !strings.Contains(body, "<title>inbox · mail · dead jobs</title>") {
			t.Errorf("%s: %d, want the dead list saying %q:\n%s", w.name, status, w.says, body)
		}
		if got := f.changed(); len(got) != w.changes {
			t.Errorf("%s: changes %v, want %d", w.name, got, w.changes)
		}
	}
	// The flash is shown once.
	if _, body := c.get("/jobs?queue=mail&state=dead"); strings.Contains(body, `id="result"`) {
		t.Errorf("the flash shows again on reload")
	}
	// No token: refused, nothing changed.
	v := form("requeue", "7")
	v.Del("csrf")
	if status, _ := c.post("/selected", v); status != http.StatusForbidden || len(f.changed()) != 2 {
		t.Errorf("no token: %d, changes %v", status, f.changed())
	}
}

// TestBulkRequeueAll: the count comes first, on a page of its own; the
// requeue takes no more than it, in batches, and the list says how many.
func TestBulkRequeueAll(t *testing.T) {
	c, f, tok := bulkClient(t)
	status, body := c.get("/requeue-all?queue=mail&older=24h")
	if status != 200 || !strings.Contains(body, "Requeue 1,234 dead jobs older than 24h0m0s?") || !strings.Contains(body, `name="count" value="1234"`) || len(f.changed()) != 0 {
		t.Fatalf("the confirmation: %d, changes %v\n%s", status, f.changed(), body)
	}
	if status, body := c.get("/requeue-all?queue=mail&older=soon"); status != 400 || !strings.Contains(body, "older &#34;soon&#34; is not a positive duration") {
		t.Errorf("a bad age: %d\n%s", status, body)
	}
	form := url.Values{"csrf": {tok}, "queue": {"mail"}, "older": {"24h"}, "return": {"jobs?queue=mail&state=dead"}}
	form.Set("count", "many")
	if _, body := c.post("/requeue-all", form); !strings.Contains(body, "count &#34;many&#34; is not the positive count") || len(f.changed()) != 0 {
		t.Errorf("a bad count: changes %v\n%s", f.changed(), body)
	}
	form.Set("count", "1234")
	if _, body := c.post("/requeue-all", form); !strings.Contains(body, "requeued 1,234 dead jobs of mail (older than 24h0m0s)") {
		t.Errorf("the requeue's flash:\n%s", body)
	}
	want := inbox.DeadFilter{DiedBefore: t0.Add(-24 * time.Hour), Max: 1234}
	if f.filter != want || f.batch != requeueBatch {
		t.Errorf("RequeueDeadAll(%+v, %d), want (%+v, %d)", f.filter, f.batch, want, requeueBatch)
	}
}

// TestBulkJobPage: a dead job's page can delete it (back to the dead list),
// a waiting job's run it now (back to its page); a job in work or ready
// is refused, saying why; a queue without Bulk and a read-only dashboard
// show neither button.
func TestBulkJobPage(t *testing.T) {
	c, f, tok := bulkClient(t)
	if _, body := c.get("/job?queue=mail&id=7&kind=int"); !strings.Contains(body, `id="delete-form"`) || strings.Contains(body, `id="run-now-form"`) {
		t.Errorf("a dead job's page:\n%s", body)
	}
	if _, body := c.get("/job?queue=mail&id=13&kind=int"); !strings.Contains(body, `id="run-now-form"`) || strings.Contains(body, `id="delete-form"`) {
		t.Errorf("a waiting job's page:\n%s", body)
	}
	post := func(path, id string) string {
		_, body := c.post(path, url.Values{"csrf": {tok}, "queue": {"mail"}, "id": {id}, "kind": {"int"}, "confirm": {"yes"},
			"return": {"job?queue=mail&id=" + id + "&kind=int"}})
		return body
	}
	if body := post("/run-now", "41"); !strings.Contains(body, "conflict: job 41 of mail is in work and is left to its holder") {
		t.Errorf("run now of a job in work:\n%s", body)
	}
	if body := post("/run-now", "39"); !strings.Contains(body, "conflict: job 39 of mail is not waiting") {
		t.Errorf("run now of a ready job:\n%s", body)
	}
	if body := post("/run-now", "13"); !strings.Contains(body, "job 13 of mail is ready to run now") || !strings.Contains(body, "<title>inbox · mail · job 13</title>") {
		t.Errorf("run now:\n%s", body)
	}
	if body := post("/delete", "7"); !strings.Contains(body, "deleted dead job 7 of mail") || !strings.Contains(body, "dead jobs</title>") {
		t.Errorf("delete:\n%s", body)
	}
	if got := f.changed(); !slices.Equal(got, []string{"run now 13", "delete [7]"}) {
		t.Errorf("changes %v", got)
	}
	plain := newClient(t, newHandler(t, Config{Queues: []QueueConfig{{Name: "mail", Queue: newFakeBrowser()}}}))
	ro := newClient(t, newHandler(t, Config{ReadOnly: true, Queues: []QueueConfig{{Name: "mail", Queue: newFakeBulk()}}}))
	for name, cl := range map[string]*client{"no Bulk": plain, "read-only": ro} {
		for _, path := range []string{"/job?queue=mail&id=13&kind=int", "/job?queue=mail&id=7&kind=int", "/jobs?queue=mail&state=dead"} {
			if _, body := cl.get(path); strings.Contains(body, `id="run-now-form"`) || strings.Contains(body, `id="delete-form"`) || strings.Contains(body, `id="selected-form"`) {
				t.Errorf("%s: %s shows a bulk form", name, path)
			}
		}
	}
	if status, body := ro.post("/run-now", url.Values{"queue": {"mail"}, "id": {"13"}}); status != http.StatusForbidden || !strings.Contains(body, "read-only") {
		t.Errorf("run now on a read-only dashboard: %d", status)
	}
	if status, body := ro.get("/requeue-all?queue=mail"); status != http.StatusForbidden || strings.Contains(body, `id="confirm-form"`) {
		t.Errorf("the count page of a read-only dashboard: %d", status)
	}
	if status, body := plain.get("/requeue-all?queue=mail"); status != http.StatusNotFound || !strings.Contains(body, "has no bulk actions") {
		t.Errorf("the count page of a queue without Bulk: %d", status)
	}
}

// TestBulkReturn: a bulk action goes back (303) only to the dashboard's
// own pages, as the other actions do (localReturn): to the page its form
// names, or to the dead list when it names none; a return that could leave
// the dashboard is refused here and changes nothing.
func TestBulkReturn(t *testing.T) {
	c, f, tok := bulkClient(t)
	form := func(ret string) url.Values {
		return url.Values{"csrf": {tok}, "queue": {"mail"}, "kind": {"int"}, "do": {"requeue"}, "id": {"7"}, "return": {ret}}
	}
	for in, want := range map[string]string{
		"jobs?queue=mail&state=dead": "jobs?queue=mail&state=dead",
		"job?queue=mail&id=7":        "job?id=7&queue=mail",
		"":                           "jobs?queue=mail&state=dead",
	} {
		v := form(in)
		v.Del("id") // nothing ticked: refused, yet it goes back saying so
		if resp := c.send("/selected", v); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != want {
			t.Errorf("return %q: %d to %q, want 303 to %q", in, resp.StatusCode, resp.Header.Get("Location"), want)
		}
	}
	for _, bad := range []string{"https://evil.example/", "//evil.example/", "jobs?x\r\nSet-Cookie: a=b"} {
		if resp := c.send("/selected", form(bad)); resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Location") != "" {
			t.Errorf("return %q: %d to %q, want 400 here", bad, resp.StatusCode, resp.Header.Get("Location"))
		}
	}
	if got := f.changed(); len(got) != 0 {
		t.Errorf("changes %v, want none", got)
	}
	if got := thousands(1234567); got != "1,234,567" {
		t.Errorf("thousands = %q", got)
	}
}
