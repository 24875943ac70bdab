package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox/periodic"
)

// fakeSchedules answers Entries with its entries or its error.
type fakeSchedules struct {
	entries []periodic.EntryState
	err     error
}

func (f fakeSchedules) Entries(context.Context) ([]periodic.EntryState, error) {
	return f.entries, f.err
}

// The page and api/schedules show each periodic entry's last and next
// tick, names escaped; an entry never run shows dashes (null in JSON); a
// failed read is shown, not hidden; without Schedules the section is gone.
func TestSchedules(t *testing.T) {
	last := time.Date(2026, 12, 5, 9, 50, 0, 0, time.UTC)
	s := fakeSchedules{entries: []periodic.EntryState{
		{Name: "<i>report</i>", Last: last, Next: last.Add(10 * time.Minute)},
		{Name: "new"},
	}}
	c := newClient(t, newHandler(t, Config{Queues: []QueueConfig{{Name: "mail", Queue: newFake()}}, Schedules: s}))
	_, body := c.get("/")
	for _, want := range []string{
		`<h2>Periodic jobs</h2>`,
		`<tr><td>&lt;i&gt;report&lt;/i&gt;</td><td class="when">` + when(last) + `</td><td class="when">` + when(last.Add(10*time.Minute)) + `</td></tr>`,
		`<tr><td>new</td><td class="when">—</td><td class="when">—</td></tr>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %s:\n%s", want, body)
		}
	}
	status, api := c.get("/api/schedules")
	var got struct {
		Schedules []struct {
			Name string     `json:"name"`
			Last *time.Time `json:"last_tick"`
			Next *time.Time `json:"next_tick"`
		} `json:"schedules"`
	}
	if err := json.Unmarshal([]byte(api), &got); err != nil || status != 200 || len(got.Schedules) != 2 {
		t.Fatalf("api/schedules = %d %s (%v)", status, api, err)
	}
	if g := got.Schedules[0]; g.Name != "<i>report</i>" || g.Last == nil || !g.Last.Equal(last) || !g.Next.Equal(last.Add(10*time.Minute)) {
		t.Errorf("api/schedules entry 0 = %+v", g)
	}
	if g := got.Schedules[1]; g.Last != nil || g.Next != nil {
		t.Errorf("api/schedules of an entry never run = %+v, want null ticks", g)
	}

	c = newClient(t, newHandler(t, Config{Queues: []QueueConfig{{Name: "mail", Queue: newFake()}}, Schedules: fakeSchedules{err: errors.New("state table gone")}}))
	if _, body := c.get("/"); !strings.Contains(body, `<p class="result err" id="schedules-error">state table gone</p>`) {
		t.Errorf("a failed read of the entries is not shown:\n%s", body)
	}
	if status, _ := c.get("/api/schedules"); status != 500 {
		t.Errorf("api/schedules on a failed read = %d, want 500", status)
	}

	c = newClient(t, newHandler(t, Config{Queues: []QueueConfig{{Name: "mail", Queue: newFake()}}}))
	if _, body := c.get("/"); strings.Contains(body, "Periodic jobs") {
		t.Errorf("the page shows periodic jobs without Schedules")
	}
	if status, _ := c.get("/api/schedules"); status != 404 {
		t.Errorf("api/schedules without Schedules = %d, want 404", status)
	}
}

// A scheduler of package periodic is what Config.Schedules takes.
var _ Schedules = (*periodic.Scheduler)(nil)
