package dbtest

// The job browser the way users run it: two pools, the table named plainly
// on one and qualified on the other, 8 worker loops claiming, failing and
// burying while enqueuers insert and an operator pages both ways, some of
// its calls cancelled at random points; rows from before the optional
// columns were added; error texts with NUL bytes, invalid UTF-8 and 5,000
// bytes read back by Queue.Job and the dashboard's api/job; ids the server
// assigns as UUIDs.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"math/rand"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/dashboard"
	"github.com/sqlinbox/inbox/worker"
)

// usersErrTexts are the error texts handlers return: a NUL byte, invalid
// UTF-8, 5,000 bytes.
var usersErrTexts = []string{
	"nul \x00 inside",
	"bad \xff\xfe utf-8 \xc3",
	strings.Repeat("é", 2500),
}

// usersBrowseSetup creates table with 20 rows enqueued before last_error
// and enqueued_at were added (half of them delayed an hour), adds the
// columns (no default: NULL in the old rows), and returns a queue on db1
// naming the table plainly and one on db2 naming it qualified.
func usersBrowseSetup(t *testing.T, e Engine, db1, db2 *sql.DB, form string) (table string, q1, q2 *inbox.Queue) {
	t.Helper()
	ctx := context.Background()
	table = newTable(t, e, db1, "ub_"+form)
	old := newQueue(t, db1, queueConfig(e, Table(table, form), nil))
	for i := 0; i < 20; i++ {
		job := inbox.Job{Data: []any{[]byte(fmt.Sprintf("old-%d", i))}}
		if i%2 == 1 {
			job.NotBefore = time.Now().Add(time.Hour)
		}
		if _, err := old.Enqueue(ctx, db1, job); err != nil {
			t.Fatal(err)
		}
	}
	addColumns(t, e, db1, table, "last_error", "enqueued_at", "dead.last_error", "dead.dead_at")
	tb := Table(table, form)
	tb.LastError, tb.EnqueuedAt, tb.DeadAt = "last_error", "enqueued_at", "dead_at"
	qualified := tb
	qualified.Name, qualified.DeadTable = concQualified(t, e, db1, table), concQualified(t, e, db1, table+"_dead")
	return table, newQueue(t, db1, queueConfig(e, tb, nil)), newQueue(t, db2, queueConfig(e, qualified, nil))
}

// usersRun is what the workers and the operator of one test met.
type usersRun struct {
	mu      sync.Mutex
	errs    []string
	handled map[string]bool // payloads whose handler ran
	sweeps  atomic.Int64    // full sweeps the operator finished, both ways
}

func (r *usersRun) fail(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.errs) < 20 {
		r.errs = append(r.errs, fmt.Sprintf(format, args...))
	}
}

func (r *usersRun) ran() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.handled)
}

// usersHandle acknowledges "ok" payloads; "fail-k" returns
// usersErrTexts[k] and "panic-k" panics with it.
func (r *usersRun) handle(ctx context.Context, d *inbox.Delivery) error {
	var payload []byte
	if err := d.Scan(&payload); err != nil {
		return err
	}
	r.mu.Lock()
	r.handled[string(payload)] = true
	r.mu.Unlock()
	kind, rest, _ := strings.Cut(string(payload), "-")
	var k int
	fmt.Sscanf(rest, "%d", &k)
	switch kind {
	case "fail":
		return errors.New(usersErrTexts[k%len(usersErrTexts)])
	case "panic":
		panic(usersErrTexts[k%len(usersErrTexts)])
	}
	return nil
}

// usersEnqueue enqueues n jobs on q, delayed of every four an hour, and
// returns how many are ready.
func usersEnqueue(r *usersRun, q *inbox.Queue, ex inbox.Executor, tag string, n, delayed int) int {
	ready := 0
	for i := 0; i < n; i++ {
		kind := []string{"ok", "fail", "ok", "panic", "ok"}[i%5]
		job := inbox.Job{Data: []any{[]byte(fmt.Sprintf("%s-%d-%s", kind, i, tag))}}
		if i%4 < delayed {
			job.NotBefore = time.Now().Add(time.Hour)
		} else {
			ready++
		}
		if _, err := q.Enqueue(context.Background(), ex, job); err != nil {
			r.fail("enqueue %s %d: %v", tag, i, err)
		}
	}
	return ready
}

// usersWorkers runs worker.Run with 4 loops on each queue: a failure waits
// an hour on the first queue and is buried on the second.
func usersWorkers(r *usersRun, q1, q2 *inbox.Queue) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i, q := range []*inbox.Queue{q1, q2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := worker.Config{Workers: 4, Poll: 20 * time.Millisecond, MaxAttempts: 25 - 24*i,
				Backoff: func(int) time.Duration { return time.Hour },
				OnError: func(err error) { r.fail("worker %d: %v", i, err) }}
			if err := worker.Run(ctx, q, cfg, r.handle); err != nil {
				r.fail("Run %d: %v", i, err)
			}
		}()
	}
	return func() { cancel(); wg.Wait() }
}

// TestUsersBrowseUnderWork: an operator pages every state both ways, on
// either spelling of the table, while 8 worker loops on two pools claim,
// acknowledge, retry and bury and two enqueuers insert, a third of its
// calls under a context cancelled at a random moment. Every page is in
// order with no id twice, a sweep never steps back (no loop), each job
// listed is in the state asked, every call not cancelled succeeds. Once
// all is quiet the sweeps, the counts and the table agree.
func TestUsersBrowseUnderWork(t *testing.T) {
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		db1, db2 := openTwo(t, e, 10)
		table, q1, q2 := usersBrowseSetup(t, e, db1, db2, form)
		r := &usersRun{handled: map[string]bool{}}
		// Mostly ready at first; mostly delayed from the enqueuers.
		ready := 10 + usersEnqueue(r, q1, db1, "a", 40, 1)
		stopWork := usersWorkers(r, q1, q2)
		stopBrowse := usersBrowser(r, []*inbox.Queue{q1, q2}, form == "lease")
		var wg sync.WaitGroup
		var more atomic.Int64
		for i, q := range []*inbox.Queue{q1, q2} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				more.Add(int64(usersEnqueue(r, q, []*sql.DB{db1, db2}[i], fmt.Sprint("b", i), 40, 3)))
			}()
		}
		wg.Wait()
		ready += int(more.Load())
		eventually(t, 2*time.Minute, "every ready job handled and two sweeps", func() error {
			if n, s := r.ran(), r.sweeps.Load(); n < ready || s < 2 {
				return fmt.Errorf("%d of %d handled, %d sweeps", n, ready, s)
			}
			return nil
		})
		stopBrowse()
		stopWork()
		for _, msg := range r.errs {
			t.Error(msg)
		}
		usersQuiet(t, db1, table, q2, form == "lease")
	})
}

// usersBrowser pages every state of the queues in turn, both ways, until
// stop.
func usersBrowser(r *usersRun, qs []*inbox.Queue, lease bool) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	states := []inbox.JobState{inbox.StateAll, inbox.StateReady, inbox.StateWaiting}
	if lease {
		states = append(states, inbox.StateInWork)
	}
	go func() {
		defer close(done)
		rnd := rand.New(rand.NewSource(time.Now().UnixNano()))
		for i := 0; ctx.Err() == nil; i++ {
			q, state := qs[i%2], states[i%len(states)]
			low := usersSweep(r, rnd, q, inbox.JobFilter{State: state, Limit: 1 + rnd.Intn(7)})
			if low != nil {
				usersSweep(r, rnd, q, inbox.JobFilter{State: state, Limit: 1 + rnd.Intn(7), Before: low})
			}
			r.sweeps.Add(1)
		}
	}()
	return func() { cancel(); <-done }
}

// usersSweep pages from f to the end in f's direction (older without
// Before), checking each page, and returns the lowest id seen.
func usersSweep(r *usersRun, rnd *rand.Rand, q *inbox.Queue, f inbox.JobFilter) (low any) {
	up := f.Before != nil
	var edge any // the id the next page must lie beyond
	for pages := 0; ; pages++ {
		if pages > 1000 {
			r.fail("%+v: a sweep of more than 1000 pages: it loops", f)
			return low
		}
		ctx, cancel := context.Background(), context.CancelFunc(func() {})
		if rnd.Intn(3) == 0 {
			ctx, cancel = context.WithTimeout(ctx, time.Duration(rnd.Intn(3000))*time.Microsecond)
		}
		p, err := q.ListJobs(ctx, f)
		// A dial cut by the deadline can return before the context
		// says it is done.
		dl, cutting := ctx.Deadline()
		cut := ctx.Err() != nil || cutting && !time.Now().Before(dl)
		cancel()
		switch {
		case err != nil && cut:
			continue // cut at a random point: ask again
		case err != nil:
			r.fail("ListJobs(%+v): %v", f, err)
			return low
		}
		usersCheckPage(r, q, f, p, edge, up)
		if len(p.Jobs) == 0 {
			return low
		}
		first, last := p.Jobs[0].ID, p.Jobs[len(p.Jobs)-1].ID
		if low == nil || idLess(last, low) {
			low = last
		}
		if up {
			if !p.Newer {
				return low
			}
			f.Before, edge = first, first
		} else {
			if !p.Older {
				return low
			}
			f.After, edge = last, last
		}
	}
}

// usersCheckPage fails r unless p's jobs are in descending order, each in
// f's state with a storable error text, and beyond edge (above it going
// up, below it going down); and unless Job finds the first or says it is
// gone.
func usersCheckPage(r *usersRun, q *inbox.Queue, f inbox.JobFilter, p inbox.JobPage, edge any, up bool) {
	if len(p.Jobs) > f.Limit {
		r.fail("%+v: a page of %d jobs", f, len(p.Jobs))
	}
	for i, j := range p.Jobs {
		if i > 0 && !idLess(j.ID, p.Jobs[i-1].ID) {
			r.fail("%+v: page %v: %v after %v", f, pageIDs(p), j.ID, p.Jobs[i-1].ID)
		}
		if f.State != inbox.StateAll && j.State != f.State {
			r.fail("%+v: job %v is %v", f, j.ID, j.State)
		}
		if !utf8.ValidString(j.LastError) || strings.IndexByte(j.LastError, 0) >= 0 || len(j.LastError) > inbox.MaxErrorText {
			r.fail("job %v: last error %q", j.ID, j.LastError)
		}
	}
	if edge != nil && len(p.Jobs) > 0 {
		if up && !idLess(edge, p.Jobs[len(p.Jobs)-1].ID) || !up && !idLess(p.Jobs[0].ID, edge) {
			r.fail("%+v: page %v is not beyond %v", f, pageIDs(p), edge)
		}
	}
	if len(p.Jobs) > 0 {
		if _, err := q.Job(context.Background(), p.Jobs[0].ID); err != nil && !errors.Is(err, inbox.ErrNotFound) {
			r.fail("Job(%v): %v", p.Jobs[0].ID, err)
		}
	}
}

// usersQuiet checks, with nothing running, that the sweeps of each state,
// the counts and the table agree, and that a row from before the optional
// columns reads as one.
func usersQuiet(t *testing.T, db *sql.DB, table string, q *inbox.Queue, lease bool) {
	t.Helper()
	ctx := context.Background()
	st, err := q.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	count := func(state inbox.JobState) int {
		n, f := 0, inbox.JobFilter{State: state, Limit: 7}
		for {
			p, err := q.ListJobs(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			n += len(p.Jobs)
			if !p.Older {
				return n
			}
			f.After = p.Jobs[len(p.Jobs)-1].ID
		}
	}
	rows, dead := countRows(t, db, table), countRows(t, db, table+"_dead")
	all, ready, waiting := count(inbox.StateAll), count(inbox.StateReady), count(inbox.StateWaiting)
	// InWork is -1 where the server cannot tell (advisory, MySQL's
	// dialect on MariaDB): nothing is in work either way.
	if all != rows || int64(rows) != st.Ready+st.Waiting+max(st.InWork, 0) || st.InWork > 0 ||
		int64(ready) != st.Ready || int64(waiting) != st.Waiting || int64(dead) != st.Dead {
		t.Errorf("rows %d, dead %d; listed all %d, ready %d, waiting %d; counts %+v", rows, dead, all, ready, waiting, st)
	}
	if lease && count(inbox.StateInWork) != 0 {
		t.Errorf("jobs in work with nothing running")
	}
	j, err := q.Job(ctx, int64(2)) // old, delayed, never claimed
	if err != nil || j.State != inbox.StateWaiting || !j.EnqueuedAt.IsZero() || j.LastError != "" {
		t.Errorf("Job(2) = %+v, %v; want waiting, no enqueue time, no error", j, err)
	}
}

// usersStorable is s as a last_error column must hold it: each invalid
// byte and NUL as U+FFFD, cut at a character to MaxErrorText bytes.
func usersStorable(s string) string {
	var b strings.Builder
	for len(s) > 0 {
		r, size := utf8.DecodeRuneInString(s)
		if r == 0 || r == utf8.RuneError {
			r = utf8.RuneError
		}
		if b.Len()+utf8.RuneLen(r) > inbox.MaxErrorText {
			break
		}
		b.WriteRune(r)
		s = s[size:]
	}
	return b.String()
}

// usersRunUntil runs worker.Run on q with cfg until n payloads were
// handled.
func usersRunUntil(t *testing.T, r *usersRun, q *inbox.Queue, cfg worker.Config, n int) {
	t.Helper()
	cfg.Poll, cfg.OnError = 20*time.Millisecond, func(err error) { r.fail("worker: %v", err) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- worker.Run(ctx, q, cfg, r.handle) }()
	eventually(t, time.Minute, "the jobs handled", func() error {
		if got := r.ran(); got < n {
			return fmt.Errorf("%d of %d", got, n)
		}
		return nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestUsersBrowseErrorText: handlers fail with a NUL byte, invalid UTF-8
// and 5,000 bytes, by an error (retried an hour later: waiting) and by a
// panic (buried: dead), on the pool naming the table plainly. Queue.Job on
// the other pool, naming it qualified, reads each text as stored, valid
// UTF-8 within MaxErrorText; the dashboard registered by the qualified
// name serves the same text in api/job and lists the jobs in api/jobs,
// whose next page's query names the queue escaped.
func TestUsersBrowseErrorText(t *testing.T) {
	eachEngine(t, nil, func(t *testing.T, e Engine) {
		ctx := context.Background()
		db1, db2 := openTwo(t, e, 8)
		_, q1, q2 := usersBrowseSetup(t, e, db1, db2, "lease")
		// The ten ready rows from before enqueued_at have no age.
		if st, err := q2.Stats(ctx); err != nil || st.Ready != 10 || st.OldestReady != 0 {
			t.Errorf("Stats = %+v, %v; want 10 ready, no oldest age", st, err)
		}
		r := &usersRun{handled: map[string]bool{}}
		var ids []any
		for i, kind := range []string{"fail", "fail", "fail", "panic", "panic", "panic"} {
			id, err := q1.Enqueue(ctx, db1, inbox.Job{Data: []any{[]byte(fmt.Sprintf("%s-%d", kind, i%3))}})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
			if i == 2 {
				// The errors wait an hour; the panics, later, are buried.
				usersRunUntil(t, r, q1, worker.Config{Workers: 4, Backoff: func(int) time.Duration { return time.Hour }}, 10+3)
			}
		}
		usersRunUntil(t, r, q1, worker.Config{Workers: 4, MaxAttempts: 1}, 10+6)
		for _, msg := range r.errs {
			t.Error(msg)
		}
		name := concQualified(t, e, db1, tableName(e, "ub_lease"))
		h, err := dashboard.New(dashboard.Config{DeadPage: 5, Queues: []dashboard.QueueConfig{{Name: "other", Queue: q1}, {Name: name, Queue: q2}}})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(h)
		defer srv.Close()
		for i, id := range ids {
			j, err := q2.Job(ctx, id)
			if err != nil {
				t.Fatalf("Job(%v): %v", id, err)
			}
			want, state := usersStorable(usersErrTexts[i%3]), inbox.StateWaiting
			if i >= 3 {
				want, state = usersStorable("inbox: handler panicked: "+usersErrTexts[i%3]), inbox.StateDead
			}
			if j.LastError != want || j.State != state {
				t.Errorf("Job(%v): %v, %d bytes %q; want %v, %d bytes %q", id, j.State, len(j.LastError), short(j.LastError), state, len(want), short(want))
			}
			var got struct {
				Queue string
				Job   struct {
					State     string
					LastError string `json:"last_error"`
				}
			}
			usersGetJSON(t, srv.URL+"/api/job?"+url.Values{"queue": {name}, "id": {fmt.Sprint(id)}}.Encode(), &got)
			if got.Queue != name || got.Job.LastError != want || got.Job.State != state.String() {
				t.Errorf("api/job %v: queue %q, %s, %q; want %q, %v, %q", id, got.Queue, got.Job.State, short(got.Job.LastError), name, state, short(want))
			}
		}
		usersDashPages(t, srv.URL, name, "waiting", 13)
		usersDashActions(t, srv.URL, name, q1, ids[0], ids[1], ids[3])
	})
}

// usersFollowLinks opens the jobs view of the queue name's dead jobs and
// follows each job's link (the queue's name escaped in its query) to the
// job's page; it returns the form token those pages carry.
func usersFollowLinks(t *testing.T, get func(string) string, base, name string) string {
	t.Helper()
	page := get(base + "/jobs?" + url.Values{"queue": {name}, "state": {"dead"}}.Encode())
	links := usersJobLinkRe.FindAllStringSubmatch(page, -1)
	if len(links) != 3 {
		t.Fatalf("the dead jobs' view: %d job links:\n%.2000s", len(links), page)
	}
	var tok []string
	for _, l := range links {
		u := html.UnescapeString(l[1])
		if v, _ := url.ParseQuery(strings.TrimPrefix(u, "job?")); v.Get("queue") != name {
			t.Errorf("link %s names queue %q", u, v.Get("queue"))
		}
		job := get(base + "/" + u)
		if !strings.Contains(job, "dead") || strings.Contains(job, "has no job") {
			t.Errorf("%s: not the dead job's page:\n%.500s", u, job)
		}
		tok = usersTokenRe.FindStringSubmatch(job)
	}
	if tok == nil {
		t.Fatal("no form token on the job pages")
	}
	return tok[1]
}

// usersFormCancel cancels job id of the queue name by the job page's form,
// which returns to the jobs view it names and shows the result there once.
func usersFormCancel(t *testing.T, c *http.Client, base, name, tok string, id any) {
	t.Helper()
	back := "jobs?" + url.Values{"queue": {name}, "state": {"waiting"}}.Encode()
	resp, err := c.PostForm(base+"/cancel", url.Values{"queue": {name}, "id": {fmt.Sprint(id)}, "kind": {"int"},
		"csrf": {tok}, "return": {back}})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := fmt.Sprintf("cancelled job %v of %s", id, name)
	if resp.StatusCode != http.StatusOK || resp.Request.URL.Path != "/jobs" || resp.Request.URL.Query().Get("queue") != name ||
		!strings.Contains(html.UnescapeString(string(b)), want) {
		t.Errorf("POST cancel returning to %s: %d at %s, want %q on the page", back, resp.StatusCode, resp.Request.URL, want)
	}
}

var (
	usersTokenRe   = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)
	usersJobLinkRe = regexp.MustCompile(`href="(job\?[^"]+)"`)
)

// usersDashActions follows the links of the queue name's jobs view, then
// cancels the waiting job and requeues the dead one through api/cancel
// and api/requeue naming the queue, q seeing both done; then cancels
// other by the job page's form.
func usersDashActions(t *testing.T, base, name string, q *inbox.Queue, waiting, other, dead any) {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Jar: jar}
	get := func(u string) string {
		t.Helper()
		resp, err := c.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %.300s", u, resp.StatusCode, b)
		}
		return string(b)
	}
	tok := usersFollowLinks(t, get, base, name)
	for _, act := range []struct {
		path string
		id   any
	}{{"/api/cancel", waiting}, {"/api/requeue", dead}} {
		resp, err := c.PostForm(base+act.path, url.Values{"queue": {name}, "id": {fmt.Sprint(act.id)}, "kind": {"int"}, "csrf": {tok}})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"ok": true`) && !strings.Contains(string(b), `"ok":true`) {
			t.Errorf("POST %s %v: %d %s", act.path, act.id, resp.StatusCode, b)
		}
		if _, err := q.Job(context.Background(), act.id); !errors.Is(err, inbox.ErrNotFound) {
			t.Errorf("after %s, Job(%v): %v; want ErrNotFound", act.path, act.id, err)
		}
	}
	usersFormCancel(t, c, base, name, tok, other)
}

func short(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// usersGetJSON GETs u, which must answer 200 with valid JSON, into v.
func usersGetJSON(t *testing.T, u string, v any) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !json.Valid(body) {
		t.Fatalf("GET %s: %d, %.300s", u, resp.StatusCode, body)
	}
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatal(err)
	}
}

// usersDashPages follows api/jobs' next pages of the queue name's jobs in
// state (the dashboard's DeadPage a page):
// want jobs in all, each once, each page of that queue.
func usersDashPages(t *testing.T, base, name, state string, want int) {
	t.Helper()
	type page struct {
		Queue      string
		Total      *int64
		Next, Prev *string
		Jobs       []struct{ ID any }
	}
	seen := map[string]bool{}
	next := "?" + url.Values{"queue": {name}, "state": {state}}.Encode()
	var last page
	for pages := 0; next != ""; pages++ {
		if pages > want {
			t.Fatalf("api/jobs: more pages than jobs")
		}
		var p page
		usersGetJSON(t, base+"/api/jobs"+next, &p)
		if p.Queue != name {
			t.Fatalf("api/jobs%s: queue %q, want %q", next, p.Queue, name)
		}
		for _, j := range p.Jobs {
			if k := fmt.Sprint(j.ID); seen[k] {
				t.Errorf("api/jobs: job %s twice", k)
			} else {
				seen[k] = true
			}
		}
		next, last = "", p
		if p.Next != nil {
			next = *p.Next
		}
	}
	if len(seen) != want || last.Total == nil || *last.Total != int64(want) {
		t.Errorf("api/jobs listed %d %s jobs, total %v; want %d", len(seen), state, last.Total, want)
	}
}

// TestUsersBrowseServerUUID: ids the server assigns (PostgreSQL's uuid
// type, SQLite's TEXT default) page both ways in their order, on the
// table named qualified, with rows from before last_error and enqueued_at
// were added; Job
// and the dashboard's api/job (a TextIDs queue registered by the qualified
// name) find each. MySQL refuses such a key (TestServerAssignedTextID).
func TestUsersBrowseServerUUID(t *testing.T) {
	eachEngine(t, func(e Engine) bool { return !e.IsMySQL() }, func(t *testing.T, e Engine) {
		ctx := context.Background()
		db1, db2 := openTwo(t, e, 4)
		decl, dead := "uuid PRIMARY KEY DEFAULT gen_random_uuid()", "uuid"
		if e.IsSQLite() {
			decl, dead = "TEXT PRIMARY KEY DEFAULT (lower(hex(randomblob(16))))", "TEXT"
		}
		table := serverIDTable(t, e, db1, "ub_uuid", decl, dead)
		tb := Table(table, "lease")
		var ids []any
		enqueue := func(q *inbox.Queue, n int) {
			for i := 0; i < n; i++ {
				id, err := q.Enqueue(ctx, db1, inbox.Job{Data: []any{[]byte("p")}})
				if err != nil {
					t.Fatal(err)
				}
				ids = append(ids, id)
			}
		}
		enqueue(newQueue(t, db1, queueConfig(e, tb, nil)), 3)
		addColumns(t, e, db1, table, "last_error", "enqueued_at")
		tb.LastError, tb.EnqueuedAt = "last_error", "enqueued_at"
		tb.Name, tb.DeadTable = concQualified(t, e, db1, table), concQualified(t, e, db1, table+"_dead")
		q := newQueue(t, db2, queueConfig(e, tb, nil))
		enqueue(q, 4)
		slices.SortFunc(ids, func(a, b any) int { return strings.Compare(fmt.Sprint(b), fmt.Sprint(a)) })

		usersPageBothWays(t, q, ids)

		h, err := dashboard.New(dashboard.Config{DeadPage: 2, Queues: []dashboard.QueueConfig{{Name: tb.Name, Queue: q, TextIDs: true}}})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(h)
		defer srv.Close()
		for _, id := range ids {
			if j, err := q.Job(ctx, id); err != nil || j.ID != id || j.State != inbox.StateReady || j.LastError != "" {
				t.Errorf("Job(%v) = %+v, %v", id, j, err)
			}
			var got struct{ Job struct{ ID any } }
			usersGetJSON(t, srv.URL+"/api/job?"+url.Values{"queue": {tb.Name}, "id": {id.(string)}}.Encode(), &got)
			if got.Job.ID != id {
				t.Errorf("api/job %v: id %v", id, got.Job.ID)
			}
		}
		usersDashPages(t, srv.URL, tb.Name, "ready", len(ids))
	})
}

// usersPageBothWays pages q's jobs two at a time down from the newest and
// up from the oldest: want are the ids in descending order.
func usersPageBothWays(t *testing.T, q *inbox.Queue, ids []any) {
	t.Helper()
	ctx := context.Background()
	var down []any
	f := inbox.JobFilter{Limit: 2}
	for pages := 0; ; pages++ {
		p, err := q.ListJobs(ctx, f)
		if err != nil || pages > len(ids) {
			t.Fatalf("ListJobs(%+v): %v, page %d", f, err, pages)
		}
		down = append(down, pageIDs(p)...)
		if !p.Older {
			break
		}
		f.After = p.Jobs[len(p.Jobs)-1].ID
	}
	var up []any
	f = inbox.JobFilter{Limit: 2, Before: ids[len(ids)-1]}
	for pages := 0; ; pages++ {
		p, err := q.ListJobs(ctx, f)
		if err != nil || pages > len(ids) {
			t.Fatalf("ListJobs(%+v): %v, page %d", f, err, pages)
		}
		up = append(pageIDs(p), up...)
		if !p.Newer {
			break
		}
		f.Before = p.Jobs[0].ID
	}
	if !slices.Equal(down, ids) || !slices.Equal(up, ids[:len(ids)-1]) {
		t.Errorf("pages down %v, up %v; want %v", down, up, ids)
	}
}
