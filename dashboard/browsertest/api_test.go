package browsertest

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/sqlinbox/inbox/dashboard"
)

type apiJob struct {
	ID         any
	State      string
	LastError  string  `json:"last_error"`
	EnqueuedAt *string `json:"enqueued_at"`
	DeadAt     *string `json:"dead_at"`
	Data       []struct{ Format, Text string }
	Actions    []string
}

type apiJobs struct {
	Total      *int64
	Next, Prev *string
	Jobs       []apiJob
}

func apiIDs(jobs []apiJob) []string {
	var ids []string
	for _, j := range jobs {
		ids = append(ids, fmt.Sprint(j.ID))
	}
	return ids
}

// TestJobsAPI (issue 37) reads api/jobs and api/job over HTTP on every
// engine it can reach: each state's jobs and total, a dead job whole, and
// pages of one job followed older to the end and back newer.
func TestJobsAPI(t *testing.T) {
	for _, e := range engines {
		t.Run(e.name, func(t *testing.T) {
			f := newFixture(t, e, nil)
			for _, w := range []struct {
				state string
				total int64
			}{{"ready", 2}, {"waiting", 1}, {"inwork", 1}, {"dead", 3}} {
				var p apiJobs
				if status := getJSON(t, f.url+"api/jobs?queue=jobs&state="+w.state, &p); status != 200 || p.Total == nil || *p.Total != w.total || int64(len(p.Jobs)) != w.total {
					t.Errorf("api/jobs %s: %d, total %v, %d jobs; want %d", w.state, status, p.Total, len(p.Jobs), w.total)
				}
			}
			var dead apiJobs
			getJSON(t, f.url+"api/jobs?queue=jobs&state=dead", &dead)
			want := []string{fmt.Sprint(f.dead["dies-long"]), fmt.Sprint(f.dead["dies-html"]), fmt.Sprint(f.dead["dies-plain"])}
			if got := apiIDs(dead.Jobs); !slices.Equal(got, want) {
				t.Errorf("dead ids %v, want %v, newest first", got, want)
			}
			var one struct{ Job apiJob }
			if status := getJSON(t, fmt.Sprintf("%sapi/job?queue=jobs&id=%v", f.url, f.dead["dies-html"]), &one); status != 200 {
				t.Fatalf("api/job: %d", status)
			}
			j := one.Job
			if j.State != "dead" || j.LastError != htmlError || j.DeadAt == nil || len(j.Data) != 1 || j.Data[0].Text != "dies-html" ||
				j.Data[0].Format != "text, 9 bytes" || !slices.Equal(j.Actions, []string{"requeue"}) {
				t.Errorf("api/job of a dead job: %+v", j)
			}
			var missing struct{ Error string }
			if status := getJSON(t, f.url+"api/job?queue=jobs&id=987654321", &missing); status != 404 || missing.Error == "" {
				t.Errorf("api/job of no job: %d %q", status, missing.Error)
			}

			// Pages of one job: all four jobs of the table, then back.
			one1, err := dashboard.New(dashboard.Config{Queues: []dashboard.QueueConfig{{Name: "jobs", Queue: f.q}}, DeadPage: 1})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(http.StripPrefix("/admin", one1))
			t.Cleanup(srv.Close)
			var seen []string
			var p apiJobs
			getJSON(t, srv.URL+"/admin/api/jobs?queue=jobs&state=all", &p)
			for {
				seen = append(seen, apiIDs(p.Jobs)...)
				if p.Next == nil {
					break
				}
				getJSON(t, srv.URL+"/admin/api/jobs"+*p.Next, &p)
			}
			distinct := map[string]bool{}
			for _, id := range seen {
				distinct[id] = true
			}
			if len(seen) != 4 || len(distinct) != 4 {
				t.Errorf("pages of one: %v, want the table's four jobs", seen)
			}
			for i := len(seen) - 2; i >= 0; i-- {
				if p.Prev == nil {
					t.Fatalf("no newer page before %v", seen[i+1])
				}
				getJSON(t, srv.URL+"/admin/api/jobs"+*p.Prev, &p)
				if got := apiIDs(p.Jobs); len(got) != 1 || got[0] != seen[i] {
					t.Errorf("newer page: %v, want %s", got, seen[i])
				}
			}
			if err := f.held.Ack(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}
