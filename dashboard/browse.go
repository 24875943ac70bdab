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
	Result       *result // an action's, left by the form that came back here
	PausedSince  string  // when the queue was paused, empty while it runs
	// The bulk actions (bulk.go): whether the queue has them, this page
	// for their return, and the kind of the listed ids.
	Bulk       bool
	Self, Kind string
}

type payloadView struct {
	Label, Format, Text string
}

type jobData struct {
	Queue, ID, Kind, State string
	Attempt                int
	Due, DueLabel          string
	Enqueued, DeadAt       string
	Priority               int64
	Error                  string
	Payload                []payloadView
	CanRequeue, CanCancel  bool
	Err                    string
	Token                  string
	ReadOnly               bool
	Generated, JobsHref    string
	Return                 string // where the actions go back to
	Self                   string // this page, where a run now goes back to
	Result                 *result
	CanDelete, CanRunNow   bool   // the bulk actions (bulk.go) the job's state allows
	PausedSince            string // when the queue was paused, empty while it runs
	CanRequeueAs           bool   // the requeue form takes a new id (RequeuerAs)
}

// pauseReader is a [Queue] whose pause can be read alone: *inbox.Queue
// is one (Paused, one statement, none without a control table).
type pauseReader interface {
	Paused(ctx context.Context) (inbox.PauseState, error)
}

// browser returns r's queue and its Browser, or writes the refusal: as
// text, or as JSON for the api.
func (h *Handler) browser(w http.ResponseWriter, r *http.Request, api bool) (*QueueConfig, Browser, bool) {
	q, err := h.queue(r)
	if err == nil {
		if b, ok := q.Queue.(Browser); ok {
			return q, b, true
		}
		err = errors.New("queue " + q.Name + " cannot be browsed (its Queue has no ListJobs and Job)")
	}
	if api {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
	} else {
		http.Error(w, "dashboard: "+err.Error(), http.StatusNotFound)
	}
	return nil, nil, false
}

func jobHref(queue string, id any) string {
	return "job?" + url.Values{"queue": {queue}, "id": {fmt.Sprint(id)}, "kind": {kindOf(id)}}.Encode()
}

// jobsList is one page of a queue's jobs in one state, as the jobs view
// and api/jobs show it.
type jobsList struct {
	tab          int
	status       int
	jobs         []inbox.JobView
	counts       inbox.Stats
	countsErr    error
	err, note    string
	newest       url.Values // the first page
	newer, older url.Values // the next pages; nil where there is none
}

// listJobs reads the page of q's jobs that r asks for (state, and after or
// before a job), with the queue's counts.
func (h *Handler) listJobs(r *http.Request, q *QueueConfig, b Browser) jobsList {
	v := r.URL.Query()
	l := jobsList{status: http.StatusOK, tab: -1}
	state := v.Get("state")
	if state == "" {
		state = "ready"
	}
	for i, t := range tabs {
		if t.name == state {
			l.tab = i
		}
	}
	if l.tab < 0 {
		l.status, l.err, l.tab = http.StatusBadRequest, fmt.Sprintf("no state %q: ready, waiting, inwork, dead or all", short(state, 16)), 0
	}
	l.newest = url.Values{"queue": {q.Name}, "state": {tabs[l.tab].name}}
	if tabs[l.tab].state == inbox.StateDead {
		l.counts, l.countsErr = q.Queue.Stats(r.Context())
		h.deadRows(r, q, v, &l)
	} else {
		h.liveRows(r, q, b, v, &l)
	}
	return l
}

// serveJobs serves the jobs view: one state's jobs of a queue, a page at
// a time, newer and older.
func (h *Handler) serveJobs(w http.ResponseWriter, r *http.Request) {
	q, b, ok := h.browser(w, r, false)
	if !ok {
		return
	}
	l := h.listJobs(r, q, b)
	d := jobsData{Queue: q.Name, State: tabs[l.tab].name, Token: h.token(w, r), ReadOnly: h.readOnly, Generated: when(h.now()),
		Err: l.err, Note: l.note, Newest: "?" + l.newest.Encode(), Tabs: tabsOf(q.Name, l.tab, l.counts, l.countsErr)}
	d.Result = h.flash(w, r)
	if l.countsErr == nil && l.counts.Paused {
		d.PausedSince = when(l.counts.PausedSince)
	}
	// A job's page and the bulk actions go back here after an action.
	self, _ := localReturn("jobs?" + r.URL.RawQuery)
	d.Self, d.Bulk = self, h.bulk(q)
	for _, j := range l.jobs {
		row := rowOf(q.Name, j)
		if self != "" {
			row.Href += "&" + url.Values{"return": {self}}.Encode()
		}
		d.Jobs = append(d.Jobs, row)
	}
	if len(d.Jobs) > 0 {
		d.Kind = d.Jobs[0].Kind
	}
	if l.newer != nil {
		d.Newer = "?" + l.newer.Encode()
	}
	if l.older != nil {
		d.Older = "?" + l.older.Encode()
	}
	h.render(w, l.status, "jobs.html", d)
}

// deadRows fills l with the page of dead jobs v asks for.
func (h *Handler) deadRows(r *http.Request, q *QueueConfig, v url.Values, l *jobsList) {
	after, err := afterOf(v)
	if err != nil {
		l.err, l.status = err.Error(), http.StatusBadRequest
		return
	}
	jobs, err := q.Queue.ListDead(r.Context(), h.page, after)
	if err != nil {
		l.err = err.Error()
	}
	for _, j := range jobs {
		l.jobs = append(l.jobs, inbox.JobView{ID: j.ID, State: inbox.StateDead, Attempt: j.Attempt, LastError: j.LastError, DeadAt: j.DeadAt, Data: j.Data})
	}
	if after != nil {
		l.newer = l.newest
	}
	if len(jobs) == h.page {
		last := jobs[len(jobs)-1]
		l.older = url.Values{"queue": {q.Name}, "state": {"dead"}, "after": {fmt.Sprint(last.ID)}, "kind": {kindOf(last.ID)}}
		if !last.DeadAt.IsZero() {
			l.older.Set("at", last.DeadAt.UTC().Format(time.RFC3339Nano))
		}
	}
}

// liveRows fills l with the page of the queue table's jobs in l's tab that
// v asks for, and the counts of Stats read with it.
func (h *Handler) liveRows(r *http.Request, q *QueueConfig, b Browser, v url.Values, l *jobsList) {
	name := tabs[l.tab].name
	f := inbox.JobFilter{State: tabs[l.tab].state, Limit: h.page}
	var err error
	if s := v.Get("after"); s != "" {
		f.After, err = parseID(s, v.Get("kind"), q.TextIDs)
	} else if s := v.Get("before"); s != "" {
		f.Before, err = parseID(s, v.Get("kind"), q.TextIDs)
	}
	var page inbox.JobPage
	if err == nil {
		page, err = b.ListJobs(r.Context(), f)
		l.counts, l.countsErr = page.Stats, page.StatsErr
	} else {
		l.status = http.StatusBadRequest
	}
	switch {
	case errors.Is(err, inbox.ErrNoInWorkList):
		l.note = "This queue's form cannot list the jobs in work: its rows do not say which a claim holds (they are listed as ready). The count comes from the server's locks where it can tell."
	case err != nil:
		l.err = err.Error()
	}
	l.jobs = page.Jobs
	if n := len(page.Jobs); n > 0 {
		if page.Newer {
			l.newer = url.Values{"queue": {q.Name}, "state": {name}, "before": {fmt.Sprint(page.Jobs[0].ID)}, "kind": {kindOf(page.Jobs[0].ID)}}
		}
		if page.Older {
			l.older = url.Values{"queue": {q.Name}, "state": {name}, "after": {fmt.Sprint(page.Jobs[n-1].ID)}, "kind": {kindOf(page.Jobs[n-1].ID)}}
		}
	} else if f.After != nil || f.Before != nil {
		l.newer = l.newest
	}
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
		Due: when(j.Due), Enqueued: when(j.EnqueuedAt), DeadAt: when(j.DeadAt), Error: short(j.LastError, 200)}
	var parts []string
	for _, p := range payloadOf(j.Data) {
		parts = append(parts, short(strings.Join(strings.Fields(p.Text), " "), 200))
	}
	row.Data = strings.Join(parts, " · ")
	return row
}

// readJob reads the job r names (id, kind) of q; it returns the status of
// the answer and, when it is not 200, why.
func (h *Handler) readJob(r *http.Request, q *QueueConfig, b Browser) (inbox.JobView, int, string) {
	id, err := parseID(r.URL.Query().Get("id"), r.URL.Query().Get("kind"), q.TextIDs)
	if err != nil {
		return inbox.JobView{}, http.StatusBadRequest, err.Error()
	}
	j, err := b.Job(r.Context(), id)
	switch {
	case errors.Is(err, inbox.ErrNotFound):
		return j, http.StatusNotFound, fmt.Sprintf("queue %s has no job %v, dead or alive (acked, cancelled or purged, or never there)", q.Name, id)
	case err != nil:
		return j, http.StatusInternalServerError, err.Error()
	}
	return j, http.StatusOK, ""
}

// serveJob serves one job's page: its state, times, last error and data,
// and the actions its state allows.
func (h *Handler) serveJob(w http.ResponseWriter, r *http.Request) {
	q, b, ok := h.browser(w, r, false)
	if !ok {
		return
	}
	d := jobData{Queue: q.Name, Token: h.token(w, r), ReadOnly: h.readOnly, Generated: when(h.now()),
		JobsHref: "jobs?" + url.Values{"queue": {q.Name}}.Encode()}
	d.Result = h.flash(w, r)
	// A job waits on a paused queue however ready it is: the page says so,
	// as the jobs view does. (The pause unread, the page goes without.)
	if p, ok := q.Queue.(pauseReader); ok {
		if st, err := p.Paused(r.Context()); err == nil && st.Paused {
			d.PausedSince = when(st.Since)
		}
	}
	j, status, why := h.readJob(r, q, b)
	if status != http.StatusOK {
		d.Err = why
	} else {
		d.ID, d.Kind, d.State, d.Attempt = fmt.Sprint(j.ID), kindOf(j.ID), j.State.String(), j.Attempt
		d.Due, d.Enqueued, d.DeadAt, d.Priority, d.Error = when(j.Due), when(j.EnqueuedAt), when(j.DeadAt), j.Priority, j.LastError
		d.DueLabel = dueLabel(j.State)
		d.Payload = payloadOf(j.Data)
		d.CanRequeue, d.CanCancel = canRequeue(j.State), canCancel(j.State)
		_, as := q.Queue.(RequeuerAs)
		d.CanRequeueAs = d.CanRequeue && as
		bulk := h.bulk(q)
		d.CanDelete, d.CanRunNow = bulk && j.State == inbox.StateDead, bulk && j.State == inbox.StateWaiting
		d.JobsHref = "jobs?" + url.Values{"queue": {q.Name}, "state": {tabs[stateTab(j.State)].name}}.Encode()
		// The actions go back to the page the operator came from, or else
		// to the job's state in the jobs view: the job itself may be gone.
		d.Return = d.JobsHref
		if ret, err := localReturn(r.URL.Query().Get("return")); err == nil && ret != "" {
			d.Return = ret
		}
		// A run now keeps the job, so it comes back to this page.
		d.Self, _ = localReturn("job?" + r.URL.RawQuery)
	}
	h.render(w, status, "job.html", d)
}

// dueLabel names a job's Due: a lease's end in work, a time to wait for
// otherwise.
func dueLabel(s inbox.JobState) string {
	if s == inbox.StateInWork {
		return "lease ends"
	}
	return "not before"
}

func canRequeue(s inbox.JobState) bool { return s == inbox.StateDead }

func canCancel(s inbox.JobState) bool { return s == inbox.StateReady || s == inbox.StateWaiting }

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
