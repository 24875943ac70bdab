package dashboard

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// The charts' drawing area, in SVG user units.
const (
	chartW, chartH = 640.0, 140.0
	chartLeft      = 48.0 // room for the scale
	chartBottom    = 18.0 // room for the time axis
	chartTop       = 6.0  // the y of the scale's top
)

// chart is one inline SVG chart: series of points over the kept window.
// A chart with a Note is empty: the page shows the Note in its place and
// draws no axis, since a scale of nothing would read 0 to 0.
type chart struct {
	Title  string
	Note   string  // why it is empty
	YTicks []ytick // the scale, from 0 up
	Series []series
	Ticks  []tick // the time axis
	W, H   float64
	Left   float64
	Bottom float64 // y of the time axis
	top    float64 // the value at the top of the scale
}

type series struct {
	Name, Class string
	Points      string  // "x,y x,y …"; empty when no sample knows the value
	X, Y        float64 // the last point, marked: a line of one sample is a dot
	Last        string  // the legend's value
}

type tick struct {
	X     float64
	Label string
}

type ytick struct {
	Y     float64
	Label string
}

// depthSeries are the depth chart's lines: a sample's count and the
// page's reading of it.
var depthSeries = []struct {
	name, class string
	sample      func(Sample) int64
	read        func(queueView) int64
}{
	{"ready", "ready", func(s Sample) int64 { return s.Ready }, func(v queueView) int64 { return v.Stats.Ready }},
	{"waiting", "waiting", func(s Sample) int64 { return s.Waiting }, func(v queueView) int64 { return v.Stats.Waiting }},
	{"in work", "inwork", func(s Sample) int64 { return s.InWork }, func(v queueView) int64 { return v.Stats.InWork }},
	{"dead", "dead", func(s Sample) int64 { return s.Dead }, func(v queueView) int64 { return v.Stats.Dead }},
}

// charts draws the depth (ready, waiting, in work, dead) and throughput of
// q's samples over the kept window, ending now. The depth legend's values
// are v's, the Stats read the page's table shows, so that the two cannot
// disagree; sampleViews has made that read the chart's latest sample too.
func (h *Handler) charts(q *QueueConfig, v queueView) (depth, rate chart) {
	end := h.now()
	start := end.Add(-h.hist.keep)
	ss := inWindow(h.hist.get(q.Name), start)
	depth = newChart("Depth (jobs)", start, end)
	rate = newChart("Throughput (jobs per minute)", start, end)
	if len(ss) == 0 {
		depth.Note = "no samples yet — the first arrives within " + h.every.String()
		if v.Err != "" {
			depth.Note = "no samples yet — the queue's counts could not be read (the table says why); the dashboard tries again within " + h.every.String()
		}
	} else {
		top := 0.0
		for _, s := range ss {
			for _, p := range depthSeries {
				top = math.Max(top, float64(p.sample(s)))
			}
		}
		depth.scale(top, true)
		for _, p := range depthSeries {
			get := func(s Sample) float64 { return float64(p.sample(s)) }
			depth.add(p.name, p.class, ss, get, start, end, countText(p.read(v)))
		}
	}
	switch rtop, known := rateTop(ss); {
	case q.Done == nil:
		rate.Note = "no throughput: give QueueConfig.Done (metrics.Counters.Done of the workers)"
	case !known:
		rate.Note = "no throughput yet — it is the growth between two samples; the next arrives within " + h.every.String()
	default:
		rate.scale(rtop, false)
		get := func(s Sample) float64 { return s.PerMinute }
		rate.add("done", "done", ss, get, start, end, scaleText(lastKnown(ss, get)))
	}
	return depth, rate
}

// inWindow drops the samples from before start, which the chart cannot place.
func inWindow(ss []Sample, start time.Time) []Sample {
	for len(ss) > 0 && ss[0].At.Before(start) {
		ss = ss[1:]
	}
	return ss
}

// rateTop returns the highest known throughput of ss, and whether any is known.
func rateTop(ss []Sample) (float64, bool) {
	top, known := 0.0, false
	for _, s := range ss {
		if s.PerMinute >= 0 {
			top, known = math.Max(top, s.PerMinute), true
		}
	}
	return top, known
}

// lastKnown returns the latest value of ss that get knows (not negative).
func lastKnown(ss []Sample, get func(Sample) float64) float64 {
	for i := len(ss) - 1; i >= 0; i-- {
		if v := get(ss[i]); v >= 0 {
			return v
		}
	}
	return -1
}

func newChart(title string, start, end time.Time) chart {
	c := chart{Title: title, W: chartW, H: chartH, Left: chartLeft, Bottom: chartH - chartBottom}
	span := end.Sub(start)
	for i := 0; i <= 4; i++ {
		ago := span - span*time.Duration(i)/4
		label := "now"
		if ago > 0 {
			label = "−" + ago.Round(time.Minute).String()
			label = strings.TrimSuffix(label, "0s")
		}
		c.Ticks = append(c.Ticks, tick{X: chartLeft + (chartW-chartLeft-8)*float64(i)/4, Label: label})
	}
	return c
}

// scale sets the chart's scale to hold values up to top.
func (c *chart) scale(top float64, whole bool) {
	var marks []float64
	c.top, marks = yScale(top, whole)
	for _, m := range marks {
		c.YTicks = append(c.YTicks, ytick{Y: c.y(m), Label: scaleText(m)})
	}
}

// yScale returns the top of a scale that holds values up to top, and its
// marks: 0 and steps of 1, 2 or 5 times a power of ten, at most five
// marks, whole steps for counts. So a flat series of zeros gets 0 to 1,
// never 0 to 0, and a flat series of n a scale from 0 that holds n.
func yScale(top float64, whole bool) (float64, []float64) {
	if top <= 0 || math.IsNaN(top) {
		top = 1
	}
	step := math.Pow(10, math.Floor(math.Log10(top/4)))
	for _, m := range []float64{1, 2, 5, 10} {
		if step*m >= top/4 {
			step *= m
			break
		}
	}
	if whole && step < 1 {
		step = 1
	}
	n := math.Ceil(top / step)
	marks := make([]float64, 0, int(n)+1)
	for i := 0.0; i <= n; i++ {
		marks = append(marks, i*step)
	}
	return n * step, marks
}

// y is the height of value v on the chart's scale.
func (c *chart) y(v float64) float64 {
	return c.Bottom - (c.Bottom-chartTop)*v/c.top
}

// add draws one series, its legend reading last; a sample whose value is
// unknown (negative) is left out.
func (c *chart) add(name, class string, ss []Sample, get func(Sample) float64, start, end time.Time, last string) {
	span := end.Sub(start).Seconds()
	var b strings.Builder
	var x, y float64
	for _, s := range ss {
		v := get(s)
		if v < 0 {
			continue
		}
		x, y = chartLeft+(chartW-chartLeft-8)*s.At.Sub(start).Seconds()/span, c.y(v)
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.FormatFloat(x, 'f', 1, 64) + "," + strconv.FormatFloat(y, 'f', 1, 64))
	}
	c.Series = append(c.Series, series{Name: name, Class: class, Points: b.String(), X: x, Y: y, Last: last})
}

// countText writes a count, a dash when it is not known.
func countText(n int64) string {
	if n < 0 {
		return "—"
	}
	return strconv.FormatInt(n, 10)
}

// scaleText writes a chart value: whole numbers as such, others with one
// decimal; a dash when it is not known.
func scaleText(v float64) string {
	switch {
	case v < 0:
		return "—"
	case v == math.Trunc(v):
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return fmt.Sprintf("%.1f", v)
}
