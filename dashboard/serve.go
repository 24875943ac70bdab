package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sqlinbox/inbox"
)

// maxShownError is how much of an error text the page shows; the JSON
// endpoint returns it whole.
const maxShownError = 2000

// maxForm bounds a POST's body: the forms carry a few short fields.
const maxForm = 64 << 10

type queueView struct {
	Name       string
	Stats      inbox.Stats
	Err        string // the Stats read's error
	InWorkNote string // why in work is not known
	Selected   bool
	TextIDs    bool
	Pausable   bool // the queue is a Pauser with somewhere to keep the state
}

type deadView struct {
	ID, Kind  string
	Attempt   int
	DeadAt    string
	Error     string
	ErrorLen  int // bytes of the whole text
	Shown     int // bytes shown, when cut
	Truncated bool
	Data      string
}

type result struct {
	OK   bool
	Text string
}

type pageData struct {
	Queues    []queueView
	Selected  queueView
	Dead      []deadView
	DeadErr   string
	Older     string // the query of the next page of dead jobs, empty at the end
	Result    *result
	Token     string
	ReadOnly  bool
	Refresh   int
	Depth     chart
	Rate      chart
	Generated string
	Self      string // this page, for the job pages' return
	// The periodic jobs, when the dashboard has Schedules.
	Schedules    []scheduleView
	SchedulesErr string
}

// stats reads every queue's state.
func (h *Handler) stats(r *http.Request) []queueView {
	views := make([]queueView, len(h.queues))
	for i, q := range h.queues {
		v := queueView{Name: q.Name, TextIDs: q.TextIDs, Pausable: pausable(q.Queue)}
		st, err := q.Queue.Stats(r.Context())
		if err != nil {
			v.Err = err.Error()
			v.Stats = inbox.Stats{Ready: -1, Waiting: -1, InWork: -1, Dead: -1}
		} else {
			v.Stats = st
			switch {
			case st.InWorkErr != nil:
				v.InWorkNote = st.InWorkErr.Error()
			case st.InWork < 0:
				v.InWorkNote = "the server cannot tell which of its locks are this queue's (see docs/operations.md)"
			}
		}
		views[i] = v
	}
	return views
}

func (h *Handler) servePage(w http.ResponseWriter, r *http.Request, res *result) {
	status := http.StatusOK
	if res != nil && !res.OK {
		status = res.status()
	}
	if res == nil {
		res = h.flash(w, r)
	}
	sel, err := h.queue(r)
	if err != nil {
		status, res, sel = http.StatusNotFound, &result{Text: err.Error()}, &h.queues[0]
	}
	views := h.stats(r)
	// The chart's latest sample is the table's reading, so that the legend
	// and the table agree, after an action too.
	h.sampleViews(views)
	d := pageData{Queues: views, Token: h.token(w, r), ReadOnly: h.readOnly, Result: res,
		Generated: when(h.now()), Self: "./?" + url.Values{"queue": {sel.Name}}.Encode()}
	for i := range d.Queues {
		if d.Queues[i].Name == sel.Name {
			d.Queues[i].Selected = true
			d.Selected = d.Queues[i]
		}
	}
	if n, err := strconv.Atoi(r.URL.Query().Get("refresh")); err == nil && n >= 2 && n <= 3600 {
		d.Refresh = n
	}
	d.Depth, d.Rate = h.charts(sel, d.Selected)
	d.Schedules, d.SchedulesErr = h.scheduleViews(r)
	after, err := afterOf(r.URL.Query())
	if err != nil {
		d.DeadErr = err.Error()
		status = http.StatusBadRequest
	} else {
		jobs, err := sel.Queue.ListDead(r.Context(), h.page, after)
		if err != nil {
			d.DeadErr = err.Error()
		}
		for _, j := range jobs {
			d.Dead = append(d.Dead, deadOf(j))
		}
		if len(jobs) == h.page {
			last := jobs[len(jobs)-1]
			v := url.Values{"queue": {sel.Name}, "after": {fmt.Sprint(last.ID)}, "kind": {kindOf(last.ID)}}
			if !last.DeadAt.IsZero() {
				v.Set("at", last.DeadAt.UTC().Format(time.RFC3339Nano))
			}
			d.Older = "?" + v.Encode()
		}
	}
	h.render(w, status, "page.html", d)
}

// csp lets the pages use their own inline style and nothing else: no
// script, no other host.
const csp = "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

func escapeText(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&#34;", "'", "&#39;").Replace(s)
}

// afterOf reads the page position of a dead-job listing: after (an id),
// kind (int or text) and at (when it died, RFC 3339).
func afterOf(v url.Values) (*inbox.DeadJob, error) {
	if v.Get("after") == "" {
		return nil, nil
	}
	id, err := parseID(v.Get("after"), v.Get("kind"), false)
	if err != nil {
		return nil, err
	}
	j := &inbox.DeadJob{ID: id}
	if at := v.Get("at"); at != "" {
		if j.DeadAt, err = time.Parse(time.RFC3339Nano, at); err != nil {
			return nil, fmt.Errorf("at %q is not a time (RFC 3339)", at)
		}
	}
	return j, nil
}

func kindOf(id any) string {
	if _, ok := id.(string); ok {
		return "text"
	}
	return "int"
}

// parseID reads an id typed or carried by a form: kind "int" or "text", or
// the queue's default (textIDs) when empty.
func parseID(s, kind string, textIDs bool) (any, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, errors.New("no id given")
	}
	if kind == "" {
		kind = "int"
		if textIDs {
			kind = "text"
		}
	}
	switch kind {
	case "text":
		if len(s) > 1024 {
			return nil, errors.New("an id of more than 1024 bytes")
		}
		return s, nil
	case "int":
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("id %q is not an integer", short(s, 64))
		}
		return n, nil
	}
	return nil, fmt.Errorf("kind %q: int or text", short(kind, 16))
}

func short(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

func deadOf(j inbox.DeadJob) deadView {
	v := deadView{ID: fmt.Sprint(j.ID), Kind: kindOf(j.ID), Attempt: j.Attempt, DeadAt: when(j.DeadAt),
		ErrorLen: len(j.LastError), Error: j.LastError}
	if len(v.Error) > maxShownError {
		v.Error, v.Truncated = short(v.Error, maxShownError), true
		v.Shown = len(strings.TrimSuffix(v.Error, "…"))
	}
	var parts []string
	for _, d := range dataOf(j.Data) {
		parts = append(parts, short(fmt.Sprint(d), 200))
	}
	v.Data = strings.Join(parts, " · ")
	return v
}

// dataOf turns data columns into what JSON and the page show: text for
// bytes that are UTF-8, the bytes (base64 in JSON) otherwise.
func dataOf(data []any) []any {
	out := make([]any, len(data))
	for i, d := range data {
		if b, ok := d.([]byte); ok && utf8.Valid(b) {
			d = string(b)
		}
		out[i] = d
	}
	return out
}

// status is the HTTP status of a failed action's result.
func (r *result) status() int {
	switch {
	case strings.HasPrefix(r.Text, "refused:"):
		return http.StatusForbidden
	case strings.HasPrefix(r.Text, "not found:"):
		return http.StatusNotFound
	case strings.HasPrefix(r.Text, "conflict:"):
		return http.StatusConflict
	case strings.HasPrefix(r.Text, "bad request:"):
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

// serveAction runs one POSTed action and answers with the page (or JSON)
// saying what happened. Every refusal happens before the queue is touched.
func (h *Handler) serveAction(w http.ResponseWriter, r *http.Request, action string, api bool) {
	res := h.act(w, r, action)
	if api {
		status := http.StatusOK
		body := map[string]any{"ok": res.OK, "message": res.Text}
		if !res.OK {
			status, body["error"] = res.status(), res.Text
		}
		writeJSON(w, status, body)
		return
	}
	// A form that names its page goes back there; act refused a return
	// that is not one of the dashboard's pages.
	ret, _ := localReturn(r.PostFormValue("return"))
	h.goBack(w, r, ret, res)
}

// actionQueue refuses what every POSTed action refuses before the queue
// is touched (a read-only dashboard, a bad form or token, a return that is
// not one of the dashboard's pages, an unknown queue), or returns the
// queue the form names.
func (h *Handler) actionQueue(w http.ResponseWriter, r *http.Request) (*QueueConfig, result, bool) {
	if h.readOnly {
		return nil, result{Text: "refused: this dashboard is read-only; nothing was changed"}, false
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	if err := r.ParseForm(); err != nil {
		return nil, result{Text: "bad request: " + err.Error() + "; nothing was changed"}, false
	}
	if err := h.checkToken(r); err != nil {
		return nil, result{Text: "refused: " + err.Error()}, false
	}
	if _, err := localReturn(r.PostFormValue("return")); err != nil {
		return nil, result{Text: "bad request: " + err.Error() + "; nothing was changed"}, false
	}
	q, err := h.queue(r)
	if err != nil {
		return nil, result{Text: "not found: " + err.Error() + "; nothing was changed"}, false
	}
	return q, result{}, true
}

// errBadNewID is a requeue's new id that the form cannot give.
var errBadNewID = errors.New("new id")

// requeue requeues the dead job id of q: under the form's new_id where one
// is given (the queue must be a [RequeuerAs]), else under an id the table
// assigns. It returns the new id, or the one asked for along with an error.
func (h *Handler) requeue(ctx context.Context, r *http.Request, q *QueueConfig, id any) (any, error) {
	text := r.PostFormValue("new_id")
	if text == "" {
		return q.Queue.RequeueDead(ctx, id)
	}
	as, ok := q.Queue.(RequeuerAs)
	if !ok {
		return nil, fmt.Errorf("%w: queue %s cannot requeue under a given id", errBadNewID, q.Name)
	}
	newID, err := parseID(text, r.PostFormValue("kind"), q.TextIDs)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errBadNewID, err)
	}
	return newID, as.RequeueDeadAs(ctx, id, newID)
}

func (h *Handler) act(w http.ResponseWriter, r *http.Request, action string) result {
	q, res, ok := h.actionQueue(w, r)
	if !ok {
		return res
	}
	ctx := r.Context()
	switch action {
	case "pause", "resume":
		return pauseAction(ctx, q, action)
	case "requeue":
		id, err := parseID(r.PostFormValue("id"), r.PostFormValue("kind"), q.TextIDs)
		if err != nil {
			return result{Text: "bad request: " + err.Error() + "; nothing was changed"}
		}
		newID, err := h.requeue(ctx, r, q, id)
		switch {
		case errors.Is(err, errBadNewID):
			return result{Text: "bad request: " + err.Error() + "; nothing was changed"}
		case errors.Is(err, inbox.ErrRequeueNeedsID):
			return result{Text: fmt.Sprintf("bad request: queue %s assigns no ids: give dead job %v a new id on its page; nothing was changed", q.Name, id)}
		case errors.Is(err, inbox.ErrDeadID):
			return result{Text: fmt.Sprintf("conflict: %v is a dead job's id (ids are never reused); nothing was changed", newID)}
		case errors.Is(err, inbox.ErrNotDead):
			return result{Text: fmt.Sprintf("not found: queue %s has no dead job %v (requeued or purged already, or never dead); nothing was changed", q.Name, id)}
		case err != nil:
			return result{Text: "failed: " + err.Error()}
		}
		return result{OK: true, Text: fmt.Sprintf("requeued dead job %v of %s as job %v", id, q.Name, newID)}
	case "cancel":
		id, err := parseID(r.PostFormValue("id"), r.PostFormValue("kind"), q.TextIDs)
		if err != nil {
			return result{Text: "bad request: " + err.Error() + "; nothing was changed"}
		}
		err = q.Queue.Cancel(ctx, id)
		switch {
		case errors.Is(err, inbox.ErrNotFound):
			return result{Text: fmt.Sprintf("not found: queue %s has no job %v; nothing was changed", q.Name, id)}
		case errors.Is(err, inbox.ErrInWork):
			return result{Text: fmt.Sprintf("conflict: job %v of %s is in work and is left to its holder; nothing was changed", id, q.Name)}
		case err != nil:
			return result{Text: "failed: " + err.Error()}
		}
		return result{OK: true, Text: fmt.Sprintf("cancelled job %v of %s", id, q.Name)}
	default: // purge
		return h.purgeAction(r, q)
	}
}

// purgeAction purges q's dead jobs, all or those older than the form says.
func (h *Handler) purgeAction(r *http.Request, q *QueueConfig) result {
	ctx := r.Context()
	if r.PostFormValue("confirm") != "yes" {
		return result{Text: "bad request: purging needs the confirmation box ticked; nothing was changed"}
	}
	var before time.Time
	what := "every dead job"
	if s := r.PostFormValue("older"); s != "" && s != "all" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return result{Text: fmt.Sprintf("bad request: older %q is not a positive duration (24h, 168h) or all; nothing was changed", short(s, 32))}
		}
		before, what = h.now().Add(-d), "the dead jobs older than "+d.String()
	}
	n, err := q.Queue.PurgeDead(ctx, before)
	switch {
	case errors.Is(err, inbox.ErrNoDeadAt):
		return result{Text: "bad request: purging by age needs Table.DeadAt on queue " + q.Name + "; nothing was changed"}
	case err != nil:
		return result{Text: "failed: " + err.Error()}
	}
	return result{OK: true, Text: fmt.Sprintf("purged %d dead jobs of %s (%s)", n, q.Name, what)}
}

type queueJSON struct {
	Name        string     `json:"name"`
	Ready       *int64     `json:"ready"`
	Waiting     *int64     `json:"waiting"`
	InWork      *int64     `json:"in_work"`
	InWorkNote  string     `json:"in_work_note,omitempty"`
	Dead        *int64     `json:"dead"`
	OldestReady float64    `json:"oldest_ready_seconds"`
	Paused      bool       `json:"paused"`
	PausedSince *time.Time `json:"paused_since,omitempty"`
	Error       string     `json:"error,omitempty"`
}

// known is n, or nil (JSON null) when it is -1.
func known(n int64) *int64 {
	if n < 0 {
		return nil
	}
	return &n
}

func (h *Handler) serveQueues(w http.ResponseWriter, r *http.Request) {
	h.sampleIfDue(r.Context())
	var out []queueJSON
	for _, v := range h.stats(r) {
		out = append(out, queueJSON{Name: v.Name, Ready: known(v.Stats.Ready), Waiting: known(v.Stats.Waiting),
			InWork: known(v.Stats.InWork), InWorkNote: v.InWorkNote, Dead: known(v.Stats.Dead),
			OldestReady: v.Stats.OldestReady.Seconds(), Paused: v.Stats.Paused, Error: v.Err})
		if v.Stats.Paused {
			since := v.Stats.PausedSince.UTC()
			out[len(out)-1].PausedSince = &since
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"queues": out})
}

func (h *Handler) serveHistory(w http.ResponseWriter, r *http.Request) {
	q, err := h.queue(r)
	if err != nil {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
		return
	}
	h.sampleIfDue(r.Context())
	writeJSON(w, http.StatusOK, map[string]any{"queue": q.Name, "every_seconds": h.every.Seconds(), "samples": h.hist.get(q.Name)})
}

type deadJSON struct {
	ID        any        `json:"id"`
	Attempt   int        `json:"attempt"`
	LastError string     `json:"last_error"`
	DeadAt    *time.Time `json:"dead_at"`
	Data      []any      `json:"data"`
}

func (h *Handler) serveDead(w http.ResponseWriter, r *http.Request) {
	q, err := h.queue(r)
	if err != nil {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
		return
	}
	limit := h.page
	if s := r.URL.Query().Get("limit"); s != "" {
		if limit, err = strconv.Atoi(s); err != nil || limit < 1 || limit > inbox.MaxList {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("limit %q: 1 to %d", short(s, 16), inbox.MaxList)})
			return
		}
	}
	after, err := afterOf(r.URL.Query())
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	jobs, err := q.Queue.ListDead(r.Context(), limit, after)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		return
	}
	out := make([]deadJSON, 0, len(jobs))
	for _, j := range jobs {
		dj := deadJSON{ID: j.ID, Attempt: j.Attempt, LastError: j.LastError, Data: dataOf(j.Data)}
		if !j.DeadAt.IsZero() {
			t := j.DeadAt.UTC()
			dj.DeadAt = &t
		}
		out = append(out, dj)
	}
	body := map[string]any{"queue": q.Name, "jobs": out}
	if len(jobs) == limit {
		last := jobs[len(jobs)-1]
		next := map[string]any{"after": fmt.Sprint(last.ID), "kind": kindOf(last.ID)}
		if !last.DeadAt.IsZero() {
			next["at"] = last.DeadAt.UTC().Format(time.RFC3339Nano)
		}
		body["next"] = next
	}
	writeJSON(w, http.StatusOK, body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
