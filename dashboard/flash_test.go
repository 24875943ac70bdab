package dashboard

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// TestLocalReturn (issue 37): a form's return is one of the dashboard's
// pages, relative; anything that could leave it is refused.
func TestLocalReturn(t *testing.T) {
	for in, want := range map[string]string{
		"": "", "./": "./", "./?queue=mail": "./?queue=mail", "jobs?state=dead&queue=mail": "jobs?queue=mail&state=dead",
		"job?queue=a&id=1&kind=int#top": "job?id=1&kind=int&queue=a",
	} {
		if got, err := localReturn(in); err != nil || got != want {
			t.Errorf("localReturn(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{
		"//evil.com", "http://evil.com", "https://evil.com/jobs", "/jobs", `/\evil.com`, `\\evil.com`, "javascript:alert(1)",
		"../x", "jobs/../../x", "%2F%2Fevil.com", " //evil.com", "jobs\r\nLocation: http://evil.com", "mailto:a@b", "job?" + strings.Repeat("a", 3000),
	} {
		if got, err := localReturn(bad); err == nil || !strings.Contains(err.Error(), "is not a page of this dashboard") {
			t.Errorf("localReturn(%q) = %q, %v; want refused", bad, got, err)
		}
	}
}

// send POSTs form to path without following a redirect.
func (c *client) send(path string, form url.Values) *http.Response {
	c.t.Helper()
	nc := *c.c
	nc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := nc.PostForm(c.srv.URL+path, form)
	if err != nil {
		c.t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// TestReturnAfterAction (issue 37 item 4): an action from a job page goes
// back to the page the operator came from (303, relative, under the
// dashboard's prefix), which shows what happened once; a failed action
// too. A return that is not one of the dashboard's pages is refused and
// changes nothing; a refused token answers where it was sent; a flash
// cookie the handler did not sign shows nothing.
func TestReturnAfterAction(t *testing.T) {
	b := newFakeBrowser()
	h := newHandler(t, Config{Queues: []QueueConfig{{Name: "mail", Queue: b}}})
	mux := http.NewServeMux()
	mux.Handle("/admin/", http.StripPrefix("/admin", h))
	c := newClient(t, mux)
	_, body := c.get("/admin/?queue=mail")
	if !strings.Contains(body, `href="job?queue=mail&amp;id=5&amp;kind=int&amp;return=.%2f%3fqueue%3dmail"`) {
		t.Errorf("the dead list's links carry no return to the page")
	}
	_, body = c.get("/admin/job?queue=mail&id=5&return=" + url.QueryEscape("./?queue=mail"))
	m := tokenRe.FindStringSubmatch(body)
	if m == nil || !strings.Contains(body, `<input type="hidden" name="return" value="./?queue=mail">`) {
		t.Fatalf("the job page's form carries no token or return:\n%s", body)
	}
	tok := m[1]
	form := func(id, ret string) url.Values {
		return url.Values{"csrf": {tok}, "queue": {"mail"}, "id": {id}, "kind": {"int"}, "return": {ret}}
	}
	for _, bad := range []string{"//evil.com", "http://evil.com"} {
		resp := c.send("/admin/requeue", form("5", bad))
		if resp.StatusCode != 400 || resp.Header.Get("Location") != "" || len(b.changed()) != 0 {
			t.Errorf("return %q: %d, Location %q, changes %v; want 400 and nothing changed", bad, resp.StatusCode, resp.Header.Get("Location"), b.changed())
		}
	}
	noToken := form("5", "./?queue=mail")
	noToken.Del("csrf")
	if resp := c.send("/admin/requeue", noToken); resp.StatusCode != 403 || resp.Header.Get("Location") != "" {
		t.Errorf("no token: %d, Location %q; want 403 here", resp.StatusCode, resp.Header.Get("Location"))
	}

	resp := c.send("/admin/requeue", form("5", "./?queue=mail"))
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "./?queue=mail" {
		t.Fatalf("requeue: %d to %q, want 303 to ./?queue=mail", resp.StatusCode, resp.Header.Get("Location"))
	}
	next, _ := resp.Request.URL.Parse(resp.Header.Get("Location"))
	if next.Path != "/admin/" {
		t.Errorf("the return resolves to %s, want the page under /admin/", next.Path)
	}
	_, body = c.get(next.RequestURI())
	if !strings.Contains(body, `<p id="result" role="status" class="result ok">requeued dead job 5 of mail as job 101</p>`) {
		t.Errorf("the page after the requeue does not say so:\n%s", body)
	}
	if _, body = c.get(next.RequestURI()); strings.Contains(body, `id="result"`) {
		t.Errorf("the result shows a second time")
	}

	// A failed action goes back too, saying why; the job view shows it.
	resp = c.send("/admin/requeue", form("5", "jobs?queue=mail&state=dead"))
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "jobs?queue=mail&state=dead" {
		t.Fatalf("second requeue: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	_, body = c.get("/admin/jobs?queue=mail&state=dead")
	if !strings.Contains(body, `class="result err">not found: queue mail has no dead job 5`) {
		t.Errorf("the jobs view does not say the requeue failed:\n%s", body)
	}

	// A cancel from a job page reached from the jobs view.
	_, body = c.get("/admin/jobs?queue=mail&state=waiting")
	if !strings.Contains(body, `href="job?id=13&amp;kind=int&amp;queue=mail&amp;return=jobs%3Fqueue%3Dmail%26state%3Dwaiting"`) {
		t.Errorf("the jobs view's links carry no return:\n%s", body)
	}
	resp = c.send("/admin/cancel", form("40", "jobs?queue=mail&state=waiting"))
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "jobs?queue=mail&state=waiting" {
		t.Fatalf("cancel: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	_, body = c.get("/admin/jobs?queue=mail&state=waiting")
	if !strings.Contains(body, `class="result ok">cancelled job 40 of mail</p>`) {
		t.Errorf("the jobs view shows no result of the cancel:\n%s", body)
	}

	// A flash the handler did not sign shows nothing.
	u, _ := url.Parse(c.srv.URL + "/admin/")
	c.c.Jar.SetCookies(u, []*http.Cookie{{Name: flashCookie, Value: "MWZvcmdlZA.0123", Path: "/"}})
	if _, body = c.get("/admin/"); strings.Contains(body, `id="result"`) {
		t.Errorf("a forged flash shows")
	}
}
