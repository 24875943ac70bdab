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
)

// chart is one inline SVG chart: series of points over the kept window.
type chart struct {
	Title  string
	Max    string // the top of the scale
	Series []series
	Ticks  []tick
	Note   string // why it is empty
	W, H   float64
	Left   float64
	Bottom float64 // y of the time axis
}

type series struct {
	Name, Class string
	Points      string // "x,y x,y …"
	Last        string
}

type tick struct {
	X     float64
	Label string
}

// charts draws the depth (ready, waiting, in work, dead) and throughput of
// q's samples over the kept window, ending now.
func (h *Handler) charts(q *QueueConfig) (depth, rate chart) {
	ss := h.hist.get(q.Name)
	end := h.now()
	start := end.Add(-h.hist.keep)
	depth = newChart("Depth (jobs)", start, end)
	rate = newChart("Throughput (jobs per minute)", start, end)
	if len(ss) == 0 {
		depth.Note = "no samples yet: the dashboard samples when it is viewed, or every interval while Handler.Run runs"
		rate.Note = depth.Note
		return depth, rate
	}
	pick := []struct {
		name, class string
		get         func(Sample) float64
	}{
		{"ready", "ready", func(s Sample) float64 { return float64(s.Ready) }},
		{"waiting", "waiting", func(s Sample) float64 { return float64(s.Waiting) }},
		{"in work", "inwork", func(s Sample) float64 { return float64(s.InWork) }},
		{"dead", "dead", func(s Sample) float64 { return float64(s.Dead) }},
	}
	top := 0.0
	for _, s := range ss {
		for _, p := range pick {
			top = math.Max(top, p.get(s))
		}
	}
	for _, p := range pick {
		depth.add(p.name, p.class, ss, p.get, top, start, end)
	}
	depth.Max = scale(top)
	rtop := 0.0
	for _, s := range ss {
		rtop = math.Max(rtop, s.PerMinute)
	}
	if q.Done == nil {
		rate.Note = "no throughput: give QueueConfig.Done (metrics.Counters.Done of the workers)"
	} else {
		rate.add("done", "done", ss, func(s Sample) float64 { return s.PerMinute }, rtop, start, end)
		rate.Max = scale(rtop)
	}
	return depth, rate
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

// add draws one series; a sample whose value is unknown (negative) is left
// out. top is the value at the top of the chart.
func (c *chart) add(name, class string, ss []Sample, get func(Sample) float64, top float64, start, end time.Time) {
	if top <= 0 {
		top = 1
	}
	span := end.Sub(start).Seconds()
	var b strings.Builder
	last := ""
	for _, s := range ss {
		v := get(s)
		if v < 0 {
			continue
		}
		x := chartLeft + (chartW-chartLeft-8)*s.At.Sub(start).Seconds()/span
		y := c.Bottom - (c.Bottom-6)*v/top
		if x < chartLeft {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.FormatFloat(x, 'f', 1, 64) + "," + strconv.FormatFloat(y, 'f', 1, 64))
		last = scale(v)
	}
	if b.Len() == 0 {
		return
	}
	c.Series = append(c.Series, series{Name: name, Class: class, Points: b.String(), Last: last})
}

// scale writes a chart value: whole numbers as such, others with one decimal.
func scale(v float64) string {
	if v == math.Trunc(v) {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return fmt.Sprintf("%.1f", v)
}
