package dashboard

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/sqlinbox/inbox"
)

// Browser is what a [Queue] also implements for the jobs view and the job
// page: *inbox.Queue does. A Queue without it shows its dead jobs alone.
type Browser interface {
	ListJobs(ctx context.Context, f inbox.JobFilter) (inbox.JobPage, error)
	Job(ctx context.Context, id any) (inbox.JobView, error)
}

// tabs are the jobs view's states, in order.
var tabs = []struct {
	name  string
	state inbox.JobState
	label string
}{
	{"ready", inbox.StateReady, "ready"}, {"waiting", inbox.StateWaiting, "waiting"},
	{"inwork", inbox.StateInWork, "in work"}, {"dead", inbox.StateDead, "dead"}, {"all", inbox.StateAll, "all"},
}

type tabView struct {
	Name, Label, Count, Href string
	Selected                 bool
}

type jobRow struct {
	ID, Kind, State, Href string
	Attempt               int
	Due, Enqueued, DeadAt string
	Error, Data           string
}

type jobsData struct {
	Queue, State string
	Tabs         []tabView
	Jobs         []jobRow
	Err, Note    string
	Newer, Older string // the queries of the next pages, empty where there is none
	Newest       string
	Token        string
	ReadOnly     bool
	Generated    string
	// The bulk actions (bulk.go): the last action's outcome, whether the
	// queue has them, this page's address to come back to, and the kind
	// of the listed ids.
	Flash      *result
	Bulk       bool
	Back, Kind string
}

type payloadView struct {
	Label, Format, Text string
}

type jobData struct {
	Queue, ID, Kind, State    string
	Attempt                   int
	Due, DueLabel             string
	Enqueued, DeadAt          string
	Priority                  int64
	Error                     string
	Payload                   []payloadView
	CanRequeue, CanCancel     bool
	Err                       string
	Token                     string
	ReadOnly                  bool
	Generated, Back, JobsHref string
	// The bulk actions (bulk.go): the last action's outcome, and the
	// buttons the job's state allows.
	Flash                *result
	CanDelete, CanRunNow bool
}

// browser returns r's queue and its Browser, or writes the refusal.
func (h *Handler) browser(w http.ResponseWriter, r *http.Request) (*QueueConfig, Browser, bool) {
	q, err := h.queue(r)
	if err != nil {
		http.Error(w, "dashboard: "+err.Error(), http.StatusNotFound)
		return nil, nil, false
	}
	b, ok := q.Queue.(Browser)
	if !ok {
		http.Error(w, "dashboard: queue "+q.Name+" cannot be browsed (its Queue has no ListJobs and Job)", http.StatusNotFound)
		return nil, nil, false
	}
	return q, b, true
}

func jobHref(queue string, id any) string {
	return "job?" + url.Values{"queue": {queue}, "id": {fmt.Sprint(id)}, "kind": {kindOf(id)}}.Encode()
}

// serveJobs serves the jobs view: one state's jobs of a queue, a page at
// a time, newer and older.
func (h *Handler) serveJobs(w http.ResponseWriter, r *http.Request) {
	q, b, ok := h.browser(w, r)
	if !ok {
		return
	}
	v := r.URL.Query()
	state := v.Get("state")
	if state == "" {
		state = "ready"
	}
	d := jobsData{Queue: q.Name, State: state, Token: h.token(w, r), ReadOnly: h.readOnly, Generated: when(h.now()),
		Back: "jobs?" + r.URL.RawQuery}
	d.Flash, d.Bulk = h.bulkOf(w, r, q)
	status := http.StatusOK
	sel := -1
	for i, t := range tabs {
		if t.name == state {
			sel = i
		}
	}
	if sel < 0 {
		status, d.Err, sel, d.State = http.StatusBadRequest, fmt.Sprintf("no state %q: ready, waiting, inwork, dead or all", short(state, 16)), 0, "ready"
	}
	base := url.Values{"queue": {q.Name}, "state": {tabs[sel].name}}
	d.Newest = "?" + base.Encode()
	var counts inbox.Stats
	var countsErr error
	if tabs[sel].state == inbox.StateDead {
		counts, countsErr = q.Queue.Stats(r.Context())
		status = h.deadRows(r, q, v, &d, status)
	} else {
		counts, countsErr, status = h.liveRows(r, q, b, v, sel, &d, status)
	}
	d.Tabs = tabsOf(q.Name, sel, counts, countsErr)
	if len(d.Jobs) > 0 {
		d.Kind = d.Jobs[0].Kind
	}
	h.render(w, status, "jobs.html", d)
}

// deadRows fills d with the page of dead jobs v asks for; it returns the
// response's status.
func (h *Handler) deadRows(r *http.Request, q *QueueConfig, v url.Values, d *jobsData, status int) int {
	after, err := afterOf(v)
	if err != nil {
		d.Err = err.Error()
		return http.StatusBadRequest
	}
	jobs, err := q.Queue.ListDead(r.Context(), h.page, after)
	if err != nil {
		d.Err = err.Error()
	}
	for _, j := range jobs {
		dv := deadOf(j)
		d.Jobs = append(d.Jobs, jobRow{ID: dv.ID, Kind: dv.Kind, State: "dead", Href: jobHref(q.Name, j.ID), Attempt: j.Attempt,
			DeadAt: dv.DeadAt, Error: short(j.LastError, 200), Data: dv.Data})
	}
	if after != nil {
		d.Newer = d.Newest
	}
	if len(jobs) == h.page {
		last := jobs[len(jobs)-1]
		o := url.Values{"queue": {q.Name}, "state": {"dead"}, "after": {fmt.Sprint(last.ID)}, "kind": {kindOf(last.ID)}}
		if !last.DeadAt.IsZero() {
			o.Set("at", last.DeadAt.UTC().Format(time.RFC3339Nano))
		}
		d.Older = "?" + o.Encode()
	}
	return status
}

// liveRows fills d with the page of the queue table's jobs in tab sel that
// v asks for; it returns the counts of Stats and the response's status.
func (h *Handler) liveRows(r *http.Request, q *QueueConfig, b Browser, v url.Values, sel int, d *jobsData, status int) (inbox.Stats, error, int) {
	var counts inbox.Stats
	var countsErr error
	f := inbox.JobFilter{State: tabs[sel].state, Limit: h.page}
	var err error
	if s := v.Get("after"); s != "" {
		f.After, err = parseID(s, v.Get("kind"), q.TextIDs)
	} else if s := v.Get("before"); s != "" {
		f.Before, err = parseID(s, v.Get("kind"), q.TextIDs)
	}
	var page inbox.JobPage
	if err == nil {
		page, err = b.ListJobs(r.Context(), f)
		counts, countsErr = page.Stats, page.StatsErr
	} else {
		status = http.StatusBadRequest
	}
	switch {
	case errors.Is(err, inbox.ErrNoInWorkList):
		d.Note = "This queue's form cannot list the jobs in work: its rows do not say which a claim holds (they are listed as ready). The count comes from the server's locks where it can tell."
	case err != nil:
		d.Err = err.Error()
	}
	for _, j := range page.Jobs {
		d.Jobs = append(d.Jobs, rowOf(q.Name, j))
	}
	if n := len(page.Jobs); n > 0 {
		if page.Newer {
			nv := url.Values{"queue": {q.Name}, "state": {tabs[sel].name}, "before": {fmt.Sprint(page.Jobs[0].ID)}, "kind": {kindOf(page.Jobs[0].ID)}}
			d.Newer = "?" + nv.Encode()
		}
		if page.Older {
			ov := url.Values{"queue": {q.Name}, "state": {tabs[sel].name}, "after": {fmt.Sprint(page.Jobs[n-1].ID)}, "kind": {kindOf(page.Jobs[n-1].ID)}}
			d.Older = "?" + ov.Encode()
		}
	} else if f.After != nil || f.Before != nil {
		d.Newer = d.Newest
	}
	return counts, countsErr, status
}

// tabsOf are the state tabs, sel selected, with their counts.
func tabsOf(queue string, sel int, counts inbox.Stats, countsErr error) []tabView {
	var out []tabView
	for i, t := range tabs {
		c := map[inbox.JobState]int64{inbox.StateReady: counts.Ready, inbox.StateWaiting: counts.Waiting,
			inbox.StateInWork: counts.InWork, inbox.StateDead: counts.Dead}[t.state]
		count := "—"
		switch {
		case t.state == inbox.StateAll:
			count = ""
		case countsErr == nil && c >= 0:
			count = fmt.Sprint(c)
		}
		out = append(out, tabView{Name: t.name, Label: t.label, Count: count, Selected: i == sel,
			Href: "jobs?" + url.Values{"queue": {queue}, "state": {t.name}}.Encode()})
	}
	return out
}

func rowOf(queue string, j inbox.JobView) jobRow {
	row := jobRow{ID: fmt.Sprint(j.ID), Kind: kindOf(j.ID), State: j.State.String(), Href: jobHref(queue, j.ID), Attempt: j.Attempt,
		Due: when(j.Due), Enqueued: when(j.EnqueuedAt), Error: short(j.LastError, 200)}
	var parts []string
	for _, p := range payloadOf(j.Data) {
		parts = append(parts, short(strings.Join(strings.Fields(p.Text), " "), 200))
	}
	row.Data = strings.Join(parts, " · ")
	return row
}

// serveJob serves one job's page: its state, times, last error and data,
// and the actions its state allows.
func (h *Handler) serveJob(w http.ResponseWriter, r *http.Request) {
	q, b, ok := h.browser(w, r)
	if !ok {
		return
	}
	d := jobData{Queue: q.Name, Token: h.token(w, r), ReadOnly: h.readOnly, Generated: when(h.now()),
		JobsHref: "jobs?" + url.Values{"queue": {q.Name}}.Encode(), Back: "job?" + r.URL.RawQuery}
	var bulk bool
	d.Flash, bulk = h.bulkOf(w, r, q)
	status := http.StatusOK
	id, err := parseID(r.URL.Query().Get("id"), r.URL.Query().Get("kind"), q.TextIDs)
	if err == nil {
		var j inbox.JobView
		j, err = b.Job(r.Context(), id)
		switch {
		case errors.Is(err, inbox.ErrNotFound):
			status, d.Err = http.StatusNotFound, fmt.Sprintf("queue %s has no job %v, dead or alive (acked, cancelled or purged, or never there)", q.Name, id)
		case err != nil:
			status, d.Err = http.StatusInternalServerError, err.Error()
		default:
			d.ID, d.Kind, d.State, d.Attempt = fmt.Sprint(j.ID), kindOf(j.ID), j.State.String(), j.Attempt
			d.Due, d.Enqueued, d.DeadAt, d.Priority, d.Error = when(j.Due), when(j.EnqueuedAt), when(j.DeadAt), j.Priority, j.LastError
			d.DueLabel = "not before"
			if j.State == inbox.StateInWork {
				d.DueLabel = "lease ends"
			}
			d.Payload = payloadOf(j.Data)
			d.CanRequeue = j.State == inbox.StateDead
			d.CanCancel = j.State == inbox.StateReady || j.State == inbox.StateWaiting
			d.CanDelete, d.CanRunNow = bulk && j.State == inbox.StateDead, bulk && j.State == inbox.StateWaiting
			d.JobsHref = "jobs?" + url.Values{"queue": {q.Name}, "state": {tabs[stateTab(j.State)].name}}.Encode()
		}
	} else {
		status, d.Err = http.StatusBadRequest, err.Error()
	}
	h.render(w, status, "job.html", d)
}

func stateTab(s inbox.JobState) int {
	for i, t := range tabs {
		if t.state == s {
			return i
		}
	}
	return 0
}

// payloadOf shows data columns as an operator reads them: pretty JSON when
// the value parses as JSON, text when it is UTF-8 without control
// characters, hex otherwise; other values as Go prints them.
func payloadOf(data []any) []payloadView {
	out := make([]payloadView, len(data))
	for i, v := range data {
		p := payloadView{Label: fmt.Sprintf("column %d", i+1)}
		var b []byte
		switch x := v.(type) {
		case []byte:
			b = x
		case string:
			b = []byte(x)
		case nil:
			p.Format, p.Text = "NULL", ""
			out[i] = p
			continue
		default:
			p.Format, p.Text = fmt.Sprintf("%T", v), fmt.Sprint(v)
			out[i] = p
			continue
		}
		var pretty bytes.Buffer
		switch {
		case len(bytes.TrimSpace(b)) > 0 && json.Valid(b) && json.Indent(&pretty, b, "", "  ") == nil:
			p.Format, p.Text = fmt.Sprintf("JSON, %d bytes", len(b)), pretty.String()
		case printable(b):
			p.Format, p.Text = fmt.Sprintf("text, %d bytes", len(b)), string(b)
		default:
			p.Format, p.Text = fmt.Sprintf("binary, %d bytes, in hex", len(b)), hex.Dump(b)
		}
		out[i] = p
	}
	return out
}

// printable reports whether b is UTF-8 text with no control character but
// newlines and tabs.
func printable(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if unicode.IsControl(r) && r != '\n' && r != '\t' && r != '\r' {
			return false
		}
	}
	return true
}

// render writes the template name with d.
func (h *Handler) render(w http.ResponseWriter, status int, name string, d any) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", csp)
	w.WriteHeader(status)
	if err := h.tmpl.ExecuteTemplate(w, name, d); err != nil {
		fmt.Fprintf(w, "<p>dashboard: %s</p>", escapeText(err.Error()))
	}
}
