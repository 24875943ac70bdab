package dashboard

import (
	"net/http"
	"time"

	"github.com/sqlinbox/inbox"
)

// jobJSON is a job as api/jobs and api/job return it: the page's fields,
// with times as RFC 3339 (null when not known) and ids as stored.
type jobJSON struct {
	ID         any        `json:"id"`
	State      string     `json:"state"`
	Attempt    int        `json:"attempt"`
	Due        *time.Time `json:"due"`
	DueLabel   string     `json:"due_label,omitempty"`
	EnqueuedAt *time.Time `json:"enqueued_at"`
	DeadAt     *time.Time `json:"dead_at"`
	Priority   int64      `json:"priority"`
	LastError  string     `json:"last_error"`
	// Data is each data column as the job page shows it: pretty JSON, text
	// or a hex dump, and which.
	Data []payloadJSON `json:"data"`
	// Actions are those the job's state allows (requeue, cancel); none on a
	// read-only dashboard.
	Actions []string `json:"actions"`
}

type payloadJSON struct {
	Column int    `json:"column"`
	Format string `json:"format"`
	Text   string `json:"text"`
}

// timeJSON is t in UTC, or nil (JSON null) when it is zero.
func timeJSON(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}

func (h *Handler) jobJSONOf(j inbox.JobView) jobJSON {
	out := jobJSON{ID: j.ID, State: j.State.String(), Attempt: j.Attempt, Due: timeJSON(j.Due), EnqueuedAt: timeJSON(j.EnqueuedAt),
		DeadAt: timeJSON(j.DeadAt), Priority: j.Priority, LastError: j.LastError, Data: []payloadJSON{}, Actions: []string{}}
	if out.Due != nil {
		out.DueLabel = dueLabel(j.State)
	}
	for i, p := range payloadOf(j.Data) {
		out.Data = append(out.Data, payloadJSON{Column: i + 1, Format: p.Format, Text: p.Text})
	}
	if !h.readOnly && canRequeue(j.State) {
		out.Actions = append(out.Actions, "requeue")
	}
	if !h.readOnly && canCancel(j.State) {
		out.Actions = append(out.Actions, "cancel")
	}
	return out
}

// serveJobsJSON serves api/jobs: the jobs view's page (listJobs) as JSON,
// with the state's count as total and the queries of the next pages, to
// append to api/jobs.
func (h *Handler) serveJobsJSON(w http.ResponseWriter, r *http.Request) {
	q, b, ok := h.browser(w, r, true)
	if !ok {
		return
	}
	l := h.listJobs(r, q, b)
	if l.status != http.StatusOK {
		writeJSON(w, l.status, map[string]string{"error": l.err})
		return
	}
	body := map[string]any{"queue": q.Name, "state": tabs[l.tab].name, "total": nil, "counts": nil,
		"next": nil, "prev": nil}
	if l.countsErr == nil {
		c := l.counts
		body["counts"] = map[string]*int64{"ready": known(c.Ready), "waiting": known(c.Waiting), "in_work": known(c.InWork), "dead": known(c.Dead)}
		if t := tabs[l.tab].state; t != inbox.StateAll {
			body["total"] = known(map[inbox.JobState]int64{inbox.StateReady: c.Ready, inbox.StateWaiting: c.Waiting,
				inbox.StateInWork: c.InWork, inbox.StateDead: c.Dead}[t])
		}
	} else {
		body["counts_error"] = l.countsErr.Error()
	}
	if l.err != "" {
		body["error"] = l.err
	}
	if l.note != "" {
		body["note"] = l.note
	}
	if l.older != nil {
		body["next"] = "?" + l.older.Encode()
	}
	if l.newer != nil {
		body["prev"] = "?" + l.newer.Encode()
	}
	jobs := make([]jobJSON, 0, len(l.jobs))
	for _, j := range l.jobs {
		jobs = append(jobs, h.jobJSONOf(j))
	}
	body["jobs"] = jobs
	status := http.StatusOK
	if l.err != "" {
		status = http.StatusInternalServerError
	}
	writeJSON(w, status, body)
}

// serveJobJSON serves api/job: one job, as its page shows it.
func (h *Handler) serveJobJSON(w http.ResponseWriter, r *http.Request) {
	q, b, ok := h.browser(w, r, true)
	if !ok {
		return
	}
	j, status, why := h.readJob(r, q, b)
	if status != http.StatusOK {
		writeJSON(w, status, map[string]string{"error": why})
		return
	}
	out := h.jobJSONOf(j)
	writeJSON(w, http.StatusOK, map[string]any{"queue": q.Name, "job": out})
}

// serveBrowseJSON serves the job browser's JSON: api/jobs or api/job.
func (h *Handler) serveBrowseJSON(w http.ResponseWriter, r *http.Request, path string) {
	if path == "api/jobs" {
		h.serveJobsJSON(w, r)
		return
	}
	h.serveJobJSON(w, r)
}
