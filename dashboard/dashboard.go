// Package dashboard is an http.Handler that shows inbox queues to operators
// and lets them act on dead jobs: each queue's ready, waiting, in-work and
// dead jobs and the age of the oldest, their depth and throughput over the
// last hour as charts, the dead jobs with their errors, and forms to requeue
// or purge dead jobs and cancel a waiting one; where the queue is a [Bulk],
// to requeue or delete the dead jobs ticked, requeue all after their count,
// and run a waiting job now. A jobs view lists a queue's jobs by state a
// page at a time, and a job's page shows its data (JSON, text or hex), its
// last error whole, and the actions its state allows. JSON endpoints serve
// the same. It uses the standard library alone; the page fetches nothing
// from another host.
//
// The handler has no authentication of its own: mount it behind the
// service's, under a prefix with http.StripPrefix:
//
//	mux.Handle("/admin/jobs/", auth(http.StripPrefix("/admin/jobs", h)))
//
// Forms are POSTs carrying a token tied to a cookie (double submit, the
// token an HMAC of the cookie under a key of the handler's), and a
// read-only handler shows no forms and refuses every POST.
package dashboard

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/periodic"
)

// Queue is what the dashboard reads and acts on: *inbox.Queue is one.
type Queue interface {
	Stats(ctx context.Context) (inbox.Stats, error)
	ListDead(ctx context.Context, limit int, after *inbox.DeadJob) ([]inbox.DeadJob, error)
	RequeueDead(ctx context.Context, id any) (any, error)
	PurgeDead(ctx context.Context, olderThan time.Time) (int64, error)
	Cancel(ctx context.Context, id any) error
}

// RequeuerAs is implemented by a [Queue] that can requeue a dead job under
// an id the caller gives: *inbox.Queue is one. A dead job's page then has
// a field for the new id, which a table whose ids the caller gives needs
// (RequeueDead there returns inbox.ErrRequeueNeedsID).
type RequeuerAs interface {
	RequeueDeadAs(ctx context.Context, id, newID any) error
}

// Pauser is implemented by a [Queue] that can be paused: *inbox.Queue is
// one, when its description names a control table
// (inbox.Table.ControlTable). The page then shows a pause or resume
// button for the queue.
type Pauser interface {
	Pause(ctx context.Context, by string) error
	Resume(ctx context.Context) error
}

// QueueConfig is one queue of the dashboard.
type QueueConfig struct {
	// Name is shown and names the queue in URLs and forms; names differ.
	Name string
	// Queue is read at every page and acted on by the forms.
	Queue Queue
	// TextIDs is set when the table's ids are text (UUIDs, say): ids typed
	// into a form are then passed as strings, otherwise as int64 (text
	// that is not an integer is refused).
	TextIDs bool
	// Done, when set, returns how many jobs this process's workers have
	// acked or buried so far (metrics.Counters.Done); the throughput chart
	// is its growth. Without it the chart shows the depth alone.
	Done func() uint64
}

// Config configures [New]. Its zero value but Queues means the defaults.
type Config struct {
	// Queues are shown in this order; at least one.
	Queues []QueueConfig
	// ReadOnly hides the forms and refuses every POST (403).
	ReadOnly bool
	// DeadPage is how many dead jobs a page lists: 1 to inbox.MaxList;
	// zero means 20.
	DeadPage int
	// SampleEvery is the interval between samples of the charts; zero
	// means 10 s. Keep is how long samples are kept; zero means an hour.
	SampleEvery, Keep time.Duration
	// Timeout bounds the database reads and actions of one request; zero
	// means 10 s.
	Timeout time.Duration
	// Key signs the forms' tokens; nil means a random key of this handler,
	// so that tokens die with the process. Give every replica behind one
	// load balancer the same key (at least 32 bytes).
	Key []byte
	// CookiePath is the token cookie's path; empty means "/". Set it to the
	// prefix the handler is mounted under to keep the cookie there.
	CookiePath string
	// Now replaces time.Now (tests).
	Now func() time.Time
	// Schedules, when set, lists the periodic jobs on the page and at
	// api/schedules: each entry's last and next tick. *periodic.Scheduler
	// is one.
	Schedules Schedules
}

// Schedules is what the dashboard reads of periodic jobs.
type Schedules interface {
	Entries(ctx context.Context) ([]periodic.EntryState, error)
}

// Handler serves the dashboard; create it with [New]. It is safe for
// concurrent use.
type Handler struct {
	queues   []QueueConfig
	byName   map[string]*QueueConfig
	readOnly bool
	page     int
	every    time.Duration
	timeout  time.Duration
	key      []byte
	cookie   string
	now      func() time.Time
	hist     *history
	sampleMu sync.Mutex
	tmpl     *template.Template
	// schedules lists the periodic jobs; nil for none.
	schedules Schedules
}

//go:embed *.html
var files embed.FS

// New returns the handler of cfg's queues. It returns an error naming what
// is wrong: no queue, a queue without a name or a Queue, a name used twice, a
// DeadPage out of range, a negative duration, or a Key shorter than 32
// bytes. It does no I/O.
func New(cfg Config) (*Handler, error) {
	if len(cfg.Queues) == 0 {
		return nil, errors.New("dashboard: no queue in Config.Queues")
	}
	h := &Handler{
		byName: map[string]*QueueConfig{}, readOnly: cfg.ReadOnly, page: cfg.DeadPage,
		every: cfg.SampleEvery, timeout: cfg.Timeout, key: cfg.Key, cookie: cfg.CookiePath, now: cfg.Now,
		schedules: cfg.Schedules,
	}
	h.queues = append(h.queues, cfg.Queues...)
	for i := range h.queues {
		q := &h.queues[i]
		switch {
		case q.Name == "":
			return nil, fmt.Errorf("dashboard: queue %d has no name", i)
		case q.Queue == nil:
			return nil, fmt.Errorf("dashboard: queue %q has no Queue", q.Name)
		case h.byName[q.Name] != nil:
			return nil, fmt.Errorf("dashboard: queue %q named twice", q.Name)
		}
		h.byName[q.Name] = q
	}
	if h.page == 0 {
		h.page = 20
	}
	if h.page < 1 || h.page > inbox.MaxList {
		return nil, fmt.Errorf("dashboard: DeadPage %d: 1 to %d", cfg.DeadPage, inbox.MaxList)
	}
	if cfg.SampleEvery < 0 || cfg.Keep < 0 || cfg.Timeout < 0 {
		return nil, errors.New("dashboard: SampleEvery, Keep and Timeout may not be negative")
	}
	if h.every == 0 {
		h.every = 10 * time.Second
	}
	keep := cfg.Keep
	if keep == 0 {
		keep = time.Hour
	}
	if h.timeout == 0 {
		h.timeout = 10 * time.Second
	}
	if h.key == nil {
		h.key = make([]byte, 32)
		if _, err := rand.Read(h.key); err != nil {
			return nil, fmt.Errorf("dashboard: a key for the tokens: %w", err)
		}
	} else if len(h.key) < 32 {
		return nil, fmt.Errorf("dashboard: Key of %d bytes: at least 32", len(h.key))
	}
	if h.cookie == "" {
		h.cookie = "/"
	}
	if h.now == nil {
		h.now = time.Now
	}
	h.hist = &history{keep: keep, series: map[string][]Sample{}}
	h.tmpl = template.Must(template.New("page.html").Funcs(funcs).ParseFS(files, "*.html"))
	return h, nil
}

// ServeHTTP serves the page (GET /), the jobs view of a queue by state
// (GET /jobs) and a job's page (GET /job) where the Queue is a [Browser],
// the actions (POST /requeue, /purge, /cancel, /pause, /resume), the bulk
// actions where the Queue is a [Bulk] (POST /selected, /delete, /run-now;
// GET /requeue-all shows the count, POST does it), and the JSON endpoints
// (GET /api/queues, /api/history, /api/dead, /api/jobs, /api/job,
// /api/token; POST /api/requeue, /api/purge, /api/cancel, /api/pause,
// /api/resume), paths relative to where the handler is mounted.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), h.timeout)
	defer cancel()
	r = r.WithContext(ctx)
	path := strings.TrimPrefix(r.URL.Path, "/")
	api := strings.HasPrefix(path, "api/")
	action := strings.TrimPrefix(path, "api/")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	switch {
	case path == "" || path == "index.html":
		if allow(w, r, http.MethodGet) {
			h.servePage(w, r, nil)
		}
	case action == "requeue" || action == "purge" || action == "cancel" || action == "pause" || action == "resume":
		if allow(w, r, http.MethodPost) {
			h.serveAction(w, r, action, api)
		}
	case bulkPaths[path]:
		h.serveBulk(w, r, path)
	case path == "jobs":
		if allow(w, r, http.MethodGet) {
			h.serveJobs(w, r)
		}
	case path == "job":
		if allow(w, r, http.MethodGet) {
			h.serveJob(w, r)
		}
	case path == "api/jobs" || path == "api/job":
		if allow(w, r, http.MethodGet) {
			h.serveBrowseJSON(w, r, path)
		}
	case path == "api/queues":
		if allow(w, r, http.MethodGet) {
			h.serveQueues(w, r)
		}
	case path == "api/history":
		if allow(w, r, http.MethodGet) {
			h.serveHistory(w, r)
		}
	case path == "api/schedules":
		if allow(w, r, http.MethodGet) {
			h.serveSchedules(w, r)
		}
	case path == "api/dead":
		if allow(w, r, http.MethodGet) {
			h.serveDead(w, r)
		}
	case path == "api/token":
		if allow(w, r, http.MethodGet) {
			writeJSON(w, http.StatusOK, map[string]any{"token": h.token(w, r), "read_only": h.readOnly})
		}
	default:
		if api {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "no endpoint " + r.URL.Path})
			return
		}
		http.NotFound(w, r)
	}
}

// allow answers 405 unless r's method is method (or HEAD for GET).
func allow(w http.ResponseWriter, r *http.Request, method string) bool {
	if r.Method == method || method == http.MethodGet && r.Method == http.MethodHead {
		return true
	}
	w.Header().Set("Allow", method)
	http.Error(w, "dashboard: "+method+" only", http.StatusMethodNotAllowed)
	return false
}

// cookieName is the token cookie's name.
const cookieName = "inbox_dashboard_csrf"

// token returns the form token of r's cookie, setting a new cookie first
// when r has none.
func (h *Handler) token(w http.ResponseWriter, r *http.Request) string {
	c, err := r.Cookie(cookieName)
	if err != nil || len(c.Value) != 32 {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			panic("dashboard: crypto/rand: " + err.Error())
		}
		c = &http.Cookie{Name: cookieName, Value: hex.EncodeToString(b), Path: h.cookie, HttpOnly: true,
			SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil}
		http.SetCookie(w, c)
	}
	return h.sign(c.Value)
}

func (h *Handler) sign(cookie string) string {
	m := hmac.New(sha256.New, h.key)
	m.Write([]byte(cookie))
	return hex.EncodeToString(m.Sum(nil))
}

// errCSRF is the refusal of a POST without a valid token.
var errCSRF = errors.New("the form's token is missing or does not match this browser's cookie: reload the page and try again; nothing was changed")

// checkToken checks r's token (form field csrf or header X-CSRF-Token)
// against its cookie, and refuses a request a browser marked cross-site.
func (h *Handler) checkToken(r *http.Request) error {
	if r.Header.Get("Sec-Fetch-Site") == "cross-site" {
		return errors.New("a cross-site request: nothing was changed")
	}
	c, err := r.Cookie(cookieName)
	if err != nil || c.Value == "" {
		return errCSRF
	}
	got := r.Header.Get("X-CSRF-Token")
	if got == "" {
		got = r.PostFormValue("csrf")
	}
	if got == "" || !hmac.Equal([]byte(got), []byte(h.sign(c.Value))) {
		return errCSRF
	}
	return nil
}

// queue returns the queue named by r's "queue" value, the first without one.
func (h *Handler) queue(r *http.Request) (*QueueConfig, error) {
	name := r.FormValue("queue")
	if name == "" {
		return &h.queues[0], nil
	}
	if q := h.byName[name]; q != nil {
		return q, nil
	}
	return nil, fmt.Errorf("no queue named %q", name)
}

// funcs are the template's helpers.
var funcs = template.FuncMap{
	"count": func(n int64) string {
		if n < 0 {
			return "—"
		}
		return fmt.Sprint(n)
	},
	"age":  age,
	"when": when,
	"list": func(c ...chart) []chart { return c },
}

func when(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// age writes d as an operator reads it: 0, 850ms, 42s, 3m10s, 2h5m, 3d4h.
func age(d time.Duration) string {
	switch {
	case d <= 0:
		return "—"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	case d < 48*time.Hour:
		return d.Round(time.Minute).String()
	}
	days := d / (24 * time.Hour)
	return fmt.Sprintf("%dd%dh", days, (d-days*24*time.Hour)/time.Hour)
}
