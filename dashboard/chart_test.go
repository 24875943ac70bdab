package dashboard

import (
	"context"
	"encoding/xml"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
)

// svgChart is what a test reads of a chart drawn on the page.
type svgChart struct {
	Texts []struct {
		Class string `xml:"class,attr"`
		Text  string `xml:",chardata"`
	} `xml:"text"`
	Lines []struct {
		Class  string `xml:"class,attr"`
		Points string `xml:"points,attr"`
	} `xml:"polyline"`
	Dots []struct {
		Class string `xml:"class,attr"`
	} `xml:"circle"`
}

var svgRe = regexp.MustCompile(`(?s)<svg .*?</svg>`)

// svgCharts parses the page's charts as XML.
func svgCharts(t *testing.T, body string) []svgChart {
	t.Helper()
	var out []svgChart
	for _, s := range svgRe.FindAllString(body, -1) {
		var c svgChart
		if err := xml.Unmarshal([]byte(s), &c); err != nil {
			t.Fatalf("a chart is not XML: %v\n%s", err, s)
		}
		out = append(out, c)
	}
	return out
}

// scaleOf returns the values of a chart's scale, bottom to top.
func scaleOf(t *testing.T, c svgChart) []float64 {
	t.Helper()
	var marks []float64
	for _, x := range c.Texts {
		if x.Class != "ytick" {
			continue
		}
		v, err := strconv.ParseFloat(x.Text, 64)
		if err != nil {
			t.Fatalf("scale mark %q is not a number", x.Text)
		}
		marks = append(marks, v)
	}
	return marks
}

// checkScale fails unless the chart's scale starts at 0, rises, and holds
// every point of its lines within the drawing area.
func checkScale(t *testing.T, name string, c svgChart) {
	t.Helper()
	marks := scaleOf(t, c)
	if len(marks) < 2 || marks[0] != 0 || marks[len(marks)-1] <= marks[0] {
		t.Errorf("%s: scale %v, want 0 up to something above 0", name, marks)
	}
	for i := 1; i < len(marks); i++ {
		if marks[i] <= marks[i-1] {
			t.Errorf("%s: scale %v does not rise", name, marks)
		}
	}
	for _, l := range c.Lines {
		for _, p := range strings.Fields(l.Points) {
			y, _ := strconv.ParseFloat(p[strings.IndexByte(p, ',')+1:], 64)
			if y < chartTop || y > chartH-chartBottom {
				t.Errorf("%s: point %s of %s outside the drawing area", name, p, l.Class)
			}
		}
	}
}

// TestYScale: every scale starts at 0 and ends above it, counts in whole
// steps; the top holds the highest value.
func TestYScale(t *testing.T) {
	for _, w := range []struct {
		top   float64
		whole bool
		want  []float64
	}{
		{0, true, []float64{0, 1}},
		{0, false, []float64{0, 0.5, 1}},
		{1, true, []float64{0, 1}},
		{3, true, []float64{0, 1, 2, 3}},
		{5, true, []float64{0, 2, 4, 6}},
		{12, true, []float64{0, 5, 10, 15}},
		{30, false, []float64{0, 10, 20, 30}},
		{0.3, false, []float64{0, 0.1, 0.2, 0.3}},
		{1234, true, []float64{0, 500, 1000, 1500}},
	} {
		top, marks := yScale(w.top, w.whole)
		if len(marks) != len(w.want) || top != marks[len(marks)-1] {
			t.Errorf("yScale(%v, %v) = %v, %v; want marks %v", w.top, w.whole, top, marks, w.want)
			continue
		}
		for i := range marks {
			if diff := marks[i] - w.want[i]; diff > 1e-9 || diff < -1e-9 {
				t.Errorf("yScale(%v, %v) marks %v, want %v", w.top, w.whole, marks, w.want)
				break
			}
		}
	}
}

// TestEmptyCharts (issue 37 item 5): a chart without samples says why and
// draws no axis at all; the throughput of a single sample, which is not
// known yet, says so too.
func TestEmptyCharts(t *testing.T) {
	h := newHandler(t, Config{Queues: []QueueConfig{{Name: "mail", Queue: newFake(), Done: func() uint64 { return 0 }}}})
	depth, rate := h.charts(&h.queues[0], queueView{Name: "mail"})
	if depth.Note != "no samples yet — the first arrives within 10s" || len(depth.YTicks) != 0 || len(depth.Series) != 0 {
		t.Errorf("depth without samples: note %q, %d marks, %d series", depth.Note, len(depth.YTicks), len(depth.Series))
	}
	if !strings.HasPrefix(rate.Note, "no throughput yet") || len(rate.YTicks) != 0 {
		t.Errorf("throughput without samples: note %q, %d marks", rate.Note, len(rate.YTicks))
	}

	// A queue whose counts cannot be read gets no sample: its page says
	// why the chart is empty, and draws no chart at all.
	c := newClient(t, newHandler(t, Config{Queues: []QueueConfig{{Name: "broken", Queue: brokenQueue{newFake()}}}}))
	_, body := c.get("/")
	if !strings.Contains(body, `<p class="note chart-empty">no samples yet — the queue&#39;s counts could not be read`) || strings.Contains(body, "<svg") {
		t.Errorf("a queue that cannot be read: the page draws a chart or does not say why it is empty:\n%s", body)
	}

	// One sample: the depth is drawn, each known count a dot; the
	// throughput needs a second sample.
	c = newClient(t, h)
	_, body = c.get("/")
	charts := svgCharts(t, body)
	if len(charts) != 1 || !strings.Contains(body, "no throughput yet — it is the growth between two samples; the next arrives within 10s") {
		t.Fatalf("one sample: %d charts drawn, want the depth alone and the throughput explained:\n%s", len(charts), body)
	}
	if len(charts[0].Lines) != 3 || len(charts[0].Dots) != 3 {
		t.Errorf("one sample: %d lines and %d dots, want a dot for each of ready, waiting and dead", len(charts[0].Lines), len(charts[0].Dots))
	}
}

// TestFlatCharts (issue 37 item 5): all-zero and constant series get a
// scale from 0 to above 0 with whole steps for counts, never 0 to 0, and
// their lines stay inside the chart.
func TestFlatCharts(t *testing.T) {
	for _, w := range []struct {
		name  string
		stats inbox.Stats
		top   float64
	}{
		{"all zero", inbox.Stats{}, 1},
		{"constant", inbox.Stats{Ready: 7, Waiting: 7, InWork: 7}, 8},
	} {
		t.Run(w.name, func(t *testing.T) {
			f := newFake()
			f.stats, f.dead = w.stats, nil
			now := t0
			var done uint64
			h := newHandler(t, Config{Queues: []QueueConfig{{Name: "mail", Queue: f, Done: func() uint64 { return done }}},
				Now: func() time.Time { return now }})
			for i := 0; i < 5; i++ {
				h.Sample(context.Background())
				now = now.Add(time.Minute)
			}
			_, body := newClient(t, h).get("/")
			charts := svgCharts(t, body)
			if len(charts) != 2 {
				t.Fatalf("%d charts drawn, want depth and throughput", len(charts))
			}
			checkScale(t, "depth", charts[0])
			checkScale(t, "throughput", charts[1])
			if marks := scaleOf(t, charts[0]); marks[len(marks)-1] != w.top {
				t.Errorf("depth scale %v, want 0 to %v in whole steps", marks, w.top)
			}
			if len(charts[0].Lines) != 4 || len(charts[1].Lines) != 1 {
				t.Errorf("%d depth lines and %d throughput lines, want 4 and 1", len(charts[0].Lines), len(charts[1].Lines))
			}
		})
	}
}

// countingQueue is a pausingQueue whose counts follow its jobs: the
// waiting ones and the dead ones.
type countingQueue struct{ pausingQueue }

func (c countingQueue) Stats(context.Context) (inbox.Stats, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.stats
	st.Waiting, st.Dead = int64(len(c.waiting)), int64(len(c.dead))
	return st, nil
}

var legendRe = regexp.MustCompile(`<span class="(\w+)" data-last="([^"]*)">`)
var countRe = regexp.MustCompile(`<td class="n (\w+)-count"[^>]*>([^<]*)</td>`)

// legendAndTable returns the depth legend's values and the table's counts
// of a page's queue, by series.
func legendAndTable(body string) (legend, table map[string]string) {
	legend, table = map[string]string{}, map[string]string{}
	for _, m := range legendRe.FindAllStringSubmatch(body, -1) {
		legend[m[1]] = m[2]
	}
	for _, m := range countRe.FindAllStringSubmatch(body, -1) {
		table[m[1]] = m[2]
	}
	return legend, table
}

// TestLegendMatchesTable (issue 37 item 5): after each action, within the
// sampling interval, the depth legend reads what the table reads, series
// by series, an unknown in-work count a dash in both.
func TestLegendMatchesTable(t *testing.T) {
	f := countingQueue{pausingQueue{newFake()}}
	f.waiting[44] = true
	h := newHandler(t, Config{Queues: []QueueConfig{{Name: "mail", Queue: f}}, SampleEvery: time.Hour})
	c := newClient(t, h)
	tok := c.token()
	check := func(step, body string, wantDead, wantWaiting string) {
		t.Helper()
		legend, table := legendAndTable(body)
		for _, s := range []string{"ready", "waiting", "inwork", "dead"} {
			if legend[s] == "" || legend[s] != table[s] {
				t.Errorf("%s: legend %s %q, table %q", step, s, legend[s], table[s])
			}
		}
		if legend["dead"] != wantDead || legend["waiting"] != wantWaiting || legend["inwork"] != "—" {
			t.Errorf("%s: legend %v, want dead %s, waiting %s, in work unknown", step, legend, wantDead, wantWaiting)
		}
	}
	_, body := c.get("/")
	check("before", body, "2", "2")
	for _, a := range []struct {
		path                string
		form                url.Values
		dead, waiting, says string
	}{
		{"/requeue", url.Values{"id": {"7"}}, "1", "2", "requeued dead job 7"},
		{"/cancel", url.Values{"id": {"40"}}, "1", "1", "cancelled job 40"},
		{"/pause", url.Values{}, "1", "1", "paused mail"},
		{"/resume", url.Values{}, "1", "1", "resumed mail"},
		{"/purge", url.Values{"older": {"all"}, "confirm": {"yes"}}, "0", "1", "purged 1 dead jobs"},
	} {
		a.form.Set("queue", "mail")
		a.form.Set("csrf", tok)
		status, body := c.post(a.path, a.form)
		if status != 200 || !strings.Contains(body, a.says) {
			t.Fatalf("%s: %d, want 200 saying %q", a.path, status, a.says)
		}
		check(a.path, body, a.dead, a.waiting)
	}
}
