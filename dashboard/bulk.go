package dashboard

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sqlinbox/inbox"
)

// Bulk is what a [Queue] also implements for the bulk actions: requeueing
// or deleting the dead jobs ticked on the dead list, requeueing every dead
// job (or those older than an age) after a page that shows their count,
// deleting one dead job, and running a waiting job now. *inbox.Queue
// does. A Queue without it shows none of these.
type Bulk interface {
	DeleteDeadMany(ctx context.Context, ids []any) error
	RequeueDeadMany(ctx context.Context, ids []any) ([]any, error)
	CountDead(ctx context.Context, f inbox.DeadFilter) (int64, error)
	RequeueDeadAll(ctx context.Context, f inbox.DeadFilter, batch int) (int64, error)
	RunNow(ctx context.Context, id any) error
}

// requeueBatch is how many dead jobs one transaction of a requeue-all
// takes: few enough that no transaction holds many rows for long.
const requeueBatch = 200

// bulkPaths are the bulk actions' paths: requeue-all is a GET (the page
// that shows the count) and a POST (the requeue); the others are POSTs.
var bulkPaths = map[string]bool{"selected": true, "requeue-all": true, "delete": true, "run-now": true}

// confirmData is the page that asks before a requeue-all.
type confirmData struct {
	Queue, Older, What, Back, Token string
	Count                           int64
	CountText                       string
	Err                             string
	Generated                       string
}

// serveBulk serves the bulk actions; each POST goes back, as the other
// actions do (goBack), to the page its form names, or else to the queue's
// dead list, which shows what happened.
func (h *Handler) serveBulk(w http.ResponseWriter, r *http.Request, path string) {
	if path == "requeue-all" && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		h.serveConfirm(w, r)
		return
	}
	if !allow(w, r, http.MethodPost) {
		return
	}
	q, res, ok := h.actionQueue(w, r)
	ret, _ := localReturn(r.PostFormValue("return"))
	if ok {
		res = h.bulkAction(r, q, path)
		// A deleted job's page would only say it is gone.
		if ret == "" || path == "delete" && res.OK && strings.HasPrefix(ret, "job?") {
			ret = "jobs?" + url.Values{"queue": {q.Name}, "state": {"dead"}}.Encode()
		}
	}
	h.goBack(w, r, ret, res)
}

// bulkAction runs the bulk action path on q, refused where q's Queue is no
// Bulk.
func (h *Handler) bulkAction(r *http.Request, q *QueueConfig, path string) result {
	b, ok := q.Queue.(Bulk)
	switch {
	case !ok:
		return result{Text: "not found: queue " + q.Name + " has no bulk actions (its Queue is no dashboard.Bulk); nothing was changed"}
	case path == "selected":
		return h.selectedAction(r, q, b)
	case path == "requeue-all":
		return h.requeueAllAction(r, q, b)
	case path == "delete":
		return h.deleteAction(r, q, b)
	}
	return h.runNowAction(r, q, b)
}

// selectedAction requeues or deletes the dead jobs ticked on the list.
func (h *Handler) selectedAction(r *http.Request, q *QueueConfig, b Bulk) result {
	do := r.PostFormValue("do")
	if do != "requeue" && do != "delete" {
		return result{Text: fmt.Sprintf("bad request: do %q: requeue or delete; nothing was changed", short(do, 16))}
	}
	ids, err := parseIDs(r.PostForm["id"], r.PostFormValue("kind"), q.TextIDs)
	if err != nil {
		return result{Text: "bad request: " + err.Error() + "; nothing was changed"}
	}
	ctx := r.Context()
	if do == "requeue" {
		newIDs, err := b.RequeueDeadMany(ctx, ids)
		if err != nil {
			return deadErr(q, err)
		}
		return result{OK: true, Text: fmt.Sprintf("requeued %s of %s", jobsText(len(newIDs), "dead job"), q.Name)}
	}
	if r.PostFormValue("confirm") != "yes" {
		return result{Text: "bad request: deleting needs the confirmation box ticked; nothing was changed"}
	}
	if err := b.DeleteDeadMany(ctx, ids); err != nil {
		return deadErr(q, err)
	}
	return result{OK: true, Text: fmt.Sprintf("deleted %s of %s", jobsText(len(ids), "dead job"), q.Name)}
}

// deleteAction deletes one dead job, from its page.
func (h *Handler) deleteAction(r *http.Request, q *QueueConfig, b Bulk) result {
	id, err := parseID(r.PostFormValue("id"), r.PostFormValue("kind"), q.TextIDs)
	if err != nil {
		return result{Text: "bad request: " + err.Error() + "; nothing was changed"}
	}
	if r.PostFormValue("confirm") != "yes" {
		return result{Text: "bad request: deleting needs the confirmation box ticked; nothing was changed"}
	}
	if err := b.DeleteDeadMany(r.Context(), []any{id}); err != nil {
		return deadErr(q, err)
	}
	return result{OK: true, Text: fmt.Sprintf("deleted dead job %v of %s", id, q.Name)}
}

// runNowAction makes one waiting job ready now.
func (h *Handler) runNowAction(r *http.Request, q *QueueConfig, b Bulk) result {
	id, err := parseID(r.PostFormValue("id"), r.PostFormValue("kind"), q.TextIDs)
	if err != nil {
		return result{Text: "bad request: " + err.Error() + "; nothing was changed"}
	}
	err = b.RunNow(r.Context(), id)
	switch {
	case errors.Is(err, inbox.ErrNotFound):
		return result{Text: fmt.Sprintf("not found: queue %s has no job %v; nothing was changed", q.Name, id)}
	case errors.Is(err, inbox.ErrInWork):
		return result{Text: fmt.Sprintf("conflict: job %v of %s is in work and is left to its holder; nothing was changed", id, q.Name)}
	case errors.Is(err, inbox.ErrNotWaiting):
		return result{Text: fmt.Sprintf("conflict: job %v of %s is not waiting (ready already, or dead); nothing was changed", id, q.Name)}
	case err != nil:
		return result{Text: "failed: " + err.Error()}
	}
	return result{OK: true, Text: fmt.Sprintf("job %v of %s is ready to run now", id, q.Name)}
}

// requeueAllAction requeues the dead jobs the confirmation page counted,
// no more than its count.
func (h *Handler) requeueAllAction(r *http.Request, q *QueueConfig, b Bulk) result {
	f, what, err := h.deadFilterOf(r.PostFormValue("older"))
	if err != nil {
		return result{Text: "bad request: " + err.Error() + "; nothing was changed"}
	}
	f.Max, err = strconv.ParseInt(r.PostFormValue("count"), 10, 64)
	if err != nil || f.Max < 1 {
		return result{Text: fmt.Sprintf("bad request: count %q is not the positive count the confirmation page showed; nothing was changed", short(r.PostFormValue("count"), 24))}
	}
	n, err := b.RequeueDeadAll(r.Context(), f, requeueBatch)
	if err != nil {
		return result{Text: fmt.Sprintf("failed after requeueing %s of %s: %v", jobsText(int(n), "dead job"), q.Name, err)}
	}
	return result{OK: true, Text: fmt.Sprintf("requeued %s of %s (%s)", jobsText(int(n), "dead job"), q.Name, what)}
}

// serveConfirm shows how many dead jobs a requeue-all would take, with the
// form that does it.
func (h *Handler) serveConfirm(w http.ResponseWriter, r *http.Request) {
	q, err := h.queue(r)
	if err != nil {
		http.Error(w, "dashboard: "+err.Error(), http.StatusNotFound)
		return
	}
	older := r.URL.Query().Get("older")
	d := confirmData{Queue: q.Name, Older: older, Token: h.token(w, r), Generated: when(h.now()),
		Back: "jobs?" + url.Values{"queue": {q.Name}, "state": {"dead"}}.Encode()}
	status := http.StatusOK
	b, ok := q.Queue.(Bulk)
	f, what, err := h.deadFilterOf(older)
	switch {
	case h.readOnly:
		status, d.Err = http.StatusForbidden, "this dashboard is read-only"
	case !ok:
		status, d.Err = http.StatusNotFound, "queue "+q.Name+" has no bulk actions (its Queue is no dashboard.Bulk)"
	case err != nil:
		status, d.Err = http.StatusBadRequest, err.Error()
	default:
		d.What = what
		d.Count, err = b.CountDead(r.Context(), f)
		if err != nil {
			status, d.Err = http.StatusInternalServerError, err.Error()
		}
		d.CountText = thousands(d.Count)
	}
	h.render(w, status, "confirm.html", d)
}

// deadFilterOf reads the age a requeue-all keeps: "all" (or empty) or a
// positive duration.
func (h *Handler) deadFilterOf(older string) (inbox.DeadFilter, string, error) {
	if older == "" || older == "all" {
		return inbox.DeadFilter{}, "of any age", nil
	}
	d, err := time.ParseDuration(older)
	if err != nil || d <= 0 {
		return inbox.DeadFilter{}, "", fmt.Errorf("older %q is not a positive duration (24h, 168h) or all", short(older, 32))
	}
	return inbox.DeadFilter{DiedBefore: h.now().Add(-d)}, "older than " + d.String(), nil
}

// parseIDs reads the ids ticked on the dead list.
func parseIDs(values []string, kind string, textIDs bool) ([]any, error) {
	if len(values) == 0 {
		return nil, errors.New("no job selected: tick the jobs first")
	}
	if len(values) > inbox.MaxList {
		return nil, fmt.Errorf("%d jobs selected: at most %d at once", len(values), inbox.MaxList)
	}
	ids := make([]any, len(values))
	for i, s := range values {
		id, err := parseID(s, kind, textIDs)
		if err != nil {
			return nil, err
		}
		ids[i] = id
	}
	return ids, nil
}

// deadErr is the result of a dead-job action that failed.
func deadErr(q *QueueConfig, err error) result {
	if errors.Is(err, inbox.ErrNotDead) {
		return result{Text: fmt.Sprintf("not found: %v (queue %s; requeued or purged already, or never dead); nothing was changed", err, q.Name)}
	}
	return result{Text: "failed: " + err.Error()}
}

// jobsText is "1 dead job" or "1,234 dead jobs".
func jobsText(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return thousands(int64(n)) + " " + noun + "s"
}

// thousands writes n with commas between the thousands: 1,234.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	if n < 0 {
		return s
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// bulk reports whether q's pages offer the bulk actions.
func (h *Handler) bulk(q *QueueConfig) bool {
	_, ok := q.Queue.(Bulk)
	return ok && !h.readOnly
}
