package dashboard

// The periodic jobs' entries: each one's last and next tick.

import (
	"net/http"
	"time"
)

// scheduleView is one entry of the periodic jobs as the page shows it.
type scheduleView struct {
	Name, Last, Next string
}

// scheduleViews reads the entries, nil without Schedules; a failed read is
// the error's text.
func (h *Handler) scheduleViews(r *http.Request) ([]scheduleView, string) {
	if h.schedules == nil {
		return nil, ""
	}
	es, err := h.schedules.Entries(r.Context())
	if err != nil {
		return nil, err.Error()
	}
	views := make([]scheduleView, len(es))
	for i, e := range es {
		views[i] = scheduleView{Name: e.Name, Last: tickText(e.Last), Next: tickText(e.Next)}
	}
	return views, ""
}

// tickText shows a tick's time, or what its absence means.
func tickText(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return when(t)
}

// serveSchedules answers api/schedules: the entries with their ticks in
// RFC 3339, null for none.
func (h *Handler) serveSchedules(w http.ResponseWriter, r *http.Request) {
	if h.schedules == nil {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "this dashboard has no periodic jobs (Config.Schedules)"})
		return
	}
	es, err := h.schedules.Entries(r.Context())
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		return
	}
	type entry struct {
		Name string     `json:"name"`
		Last *time.Time `json:"last_tick"`
		Next *time.Time `json:"next_tick"`
	}
	out := make([]entry, len(es))
	for i, e := range es {
		out[i] = entry{Name: e.Name, Last: orNil(e.Last), Next: orNil(e.Next)}
	}
	writeJSON(w, http.StatusOK, map[string]any{"schedules": out})
}

func orNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}
