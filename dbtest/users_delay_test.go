package dbtest

import (
	"context"
	"fmt"
	"net/http/httptest"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/dashboard"
)

// TestUsersShortDelay: under the lease, a job enqueued with a not-before
// time within a lease (never claimed: its attempt is 1) waits, in Job,
// in ListJobs' states and in Stats' counts, and the dashboard offers to
// cancel it; a job a claim holds is in work, and so is one retried after
// a delay shorter than a lease (documented: its row cannot tell). Before,
// the short delay read as in work, and the dashboard offered no cancel.
// Two pools, the second naming the table qualified.
func TestUsersShortDelay(t *testing.T) {
	eachEngine(t, nil, func(t *testing.T, e Engine) {
		ctx := context.Background()
		db1, db2 := openTwo(t, e, 4)
		table := newTable(t, e, db1, "ushort")
		addColumns(t, e, db1, table, "enqueued_at")
		tb := Table(table, "lease")
		tb.EnqueuedAt = "enqueued_at"
		q1 := newQueue(t, db1, queueConfig(e, tb, nil))
		tb.Name = concQualified(t, e, db1, table)
		q2 := newQueue(t, db2, queueConfig(e, tb, nil))
		enqueue := func(after time.Duration) any {
			id, err := q1.Enqueue(ctx, db1, inbox.Job{Data: []any{[]byte("p")}, NotBefore: time.Now().Add(after)})
			if err != nil {
				t.Fatal(err)
			}
			return id
		}
		held, retried := enqueue(0), enqueue(0)
		ds, err := q1.Claim(ctx, 2)
		if err != nil || len(ds) != 2 {
			t.Fatalf("claim: %d, %v", len(ds), err)
		}
		defer ds[0].Release(ctx)
		if err := ds[1].Retry(ctx, 20*time.Second); err != nil {
			t.Fatal(err)
		}
		delayed := enqueue(20 * time.Second)
		usersShortStates(t, q2, map[any]inbox.JobState{held: inbox.StateInWork, retried: inbox.StateInWork, delayed: inbox.StateWaiting})

		h, err := dashboard.New(dashboard.Config{Queues: []dashboard.QueueConfig{{Name: tb.Name, Queue: q2}}})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(h)
		defer srv.Close()
		var got struct{ Job struct{ Actions []string } }
		usersGetJSON(t, srv.URL+"/api/job?"+url.Values{"queue": {tb.Name}, "id": {fmt.Sprint(delayed)}}.Encode(), &got)
		if !slices.Contains(got.Job.Actions, "cancel") {
			t.Errorf("api/job of the delayed job: actions %v, want cancel", got.Job.Actions)
		}
	})
}

// usersShortStates checks each job's state in Job, the lists of waiting
// and in-work jobs, and Stats' counts.
func usersShortStates(t *testing.T, q *inbox.Queue, want map[any]inbox.JobState) {
	t.Helper()
	ctx := context.Background()
	counts := map[inbox.JobState]int64{}
	for id, state := range want {
		counts[state]++
		if j, err := q.Job(ctx, id); err != nil || j.State != state {
			t.Errorf("Job(%v) = %v, %v; want %v", id, j.State, err, state)
		}
	}
	for _, state := range []inbox.JobState{inbox.StateWaiting, inbox.StateInWork} {
		p, err := q.ListJobs(ctx, inbox.JobFilter{State: state})
		if err != nil {
			t.Fatal(err)
		}
		for id, s := range want {
			if listed := slices.Contains(pageIDs(p), id); listed != (s == state) {
				t.Errorf("%v listed %v: %v, want %v", state, pageIDs(p), id, s)
			}
		}
		if p.StatsErr != nil || p.Stats.Waiting != counts[inbox.StateWaiting] || p.Stats.InWork != counts[inbox.StateInWork] {
			t.Errorf("Stats = %+v, %v; want %d waiting, %d in work", p.Stats, p.StatsErr, counts[inbox.StateWaiting], counts[inbox.StateInWork])
		}
	}
}
