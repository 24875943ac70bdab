package main

// A line chart written as SVG with the standard library alone, for the
// figures -svg writes (depth.go, scale.go): a y axis from zero, an x axis in
// linear or log scale, labelled ticks, a legend, and points that may stand
// apart from their line (a case off the x scale, such as depth's leased
// head, drawn to the right of a dashed separator).

import (
	"errors"
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// chart is one figure.
type chart struct {
	title, xLabel, yLabel string
	logX                  bool
	xTicks                []tick
	series                []series
	// separator, when not zero, is an x where a dashed vertical line
	// parts the scale from the cases drawn beyond it.
	separator float64
}

// tick is a labelled position on the x axis.
type tick struct {
	x     float64
	label string
}

// series is one line of the chart, and its legend entry.
type series struct {
	name   string
	points []point
}

// point is one measurement. apart leaves it unjoined to the point before.
type point struct {
	x, y  float64
	apart bool
}

// The figure's size and the plot's margins within it, in SVG user units.
const (
	svgWidth, svgHeight                    = 800, 420
	plotLeft, plotRight, plotTop, plotBase = 80, 270, 40, 60
)

// palette colours the series in turn; a chart with more repeats them.
var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"}

// scale maps data to the plot: x in [xMin, xMax] (log10 of them on a log
// axis), y in [0, yMax].
type scale struct {
	logX             bool
	xMin, xMax, yMax float64
}

func (s scale) px(x float64) float64 {
	lo, hi := s.xMin, s.xMax
	if s.logX {
		x, lo, hi = math.Log10(x), math.Log10(lo), math.Log10(hi)
	}
	w := float64(svgWidth - plotLeft - plotRight)
	return plotLeft + w*0.04 + w*0.92*(x-lo)/(hi-lo)
}

func (s scale) py(y float64) float64 {
	h := float64(svgHeight - plotTop - plotBase)
	return float64(svgHeight-plotBase) - h*y/s.yMax
}

// scaleOf finds the chart's ranges. The x range spans the ticks and the
// points; a single x gets a range around it, so that no axis is 0–0. The y
// axis runs from zero to a round number above the highest point.
func (c chart) scaleOf() (scale, error) {
	s := scale{logX: c.logX, xMin: math.Inf(1), xMax: math.Inf(-1)}
	see := func(x float64) error {
		if math.IsNaN(x) || math.IsInf(x, 0) || (c.logX && x <= 0) {
			return fmt.Errorf("chart %q: x %v is off a %s axis", c.title, x, map[bool]string{true: "log", false: "linear"}[c.logX])
		}
		s.xMin, s.xMax = min(s.xMin, x), max(s.xMax, x)
		return nil
	}
	var ys []float64
	for _, t := range c.xTicks {
		if err := see(t.x); err != nil {
			return s, err
		}
	}
	for _, sr := range c.series {
		for _, p := range sr.points {
			if err := see(p.x); err != nil {
				return s, err
			}
			if math.IsNaN(p.y) || math.IsInf(p.y, 0) || p.y < 0 {
				return s, fmt.Errorf("chart %q: series %q has y %v", c.title, sr.name, p.y)
			}
			ys = append(ys, p.y)
		}
	}
	if len(ys) == 0 {
		return s, fmt.Errorf("chart %q: no points", c.title)
	}
	if s.xMin == s.xMax {
		if c.logX {
			s.xMin, s.xMax = s.xMin/2, s.xMax*2
		} else {
			s.xMin, s.xMax = s.xMin-1, s.xMax+1
		}
	}
	s.yMax = niceCeil(slicesMax(ys))
	return s, nil
}

func slicesMax(v []float64) float64 {
	m := v[0]
	for _, x := range v[1:] {
		m = max(m, x)
	}
	return m
}

// niceCeil is the smallest of 1, 2, 2.5, 5 times a power of ten at or
// above v (1 for v of zero): the top of the y axis.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// svg renders the chart.
func (c chart) svg() (string, error) {
	s, err := c.scaleOf()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		svgWidth, svgHeight, svgWidth, svgHeight)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", svgWidth, svgHeight)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", plotLeft, esc(c.title))
	c.axes(&b, s)
	for i, sr := range c.series {
		c.line(&b, s, sr, palette[i%len(palette)])
		y := plotTop + 10 + 20*i
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/>`+"\n", svgWidth-plotRight+16, y, svgWidth-plotRight+36, y, palette[i%len(palette)])
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", svgWidth-plotRight+42, y+4, esc(sr.name))
	}
	b.WriteString("</svg>\n")
	return b.String(), nil
}

// axes draws the frame, the y grid with its labels, the x ticks, the
// separator and the axis titles.
func (c chart) axes(b *strings.Builder, s scale) {
	x0, x1 := float64(plotLeft), float64(svgWidth-plotRight)
	y0, y1 := float64(svgHeight-plotBase), float64(plotTop)
	fmt.Fprintf(b, `<rect x="%g" y="%g" width="%g" height="%g" fill="none" stroke="#333"/>`+"\n", x0, y1, x1-x0, y0-y1)
	for i := 0; i <= 5; i++ {
		v := s.yMax * float64(i) / 5
		y := s.py(v)
		fmt.Fprintf(b, `<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="#ddd"/>`+"\n", x0, y, x1, y)
		fmt.Fprintf(b, `<text x="%g" y="%.1f" text-anchor="end">%s</text>`+"\n", x0-6, y+4, axisNumber(v))
	}
	for _, t := range c.xTicks {
		x := s.px(t.x)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%g" x2="%.1f" y2="%g" stroke="#333"/>`+"\n", x, y0, x, y0+5)
		fmt.Fprintf(b, `<text x="%.1f" y="%g" text-anchor="middle">%s</text>`+"\n", x, y0+18, esc(t.label))
	}
	if c.separator != 0 {
		x := s.px(c.separator)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%g" x2="%.1f" y2="%g" stroke="#999" stroke-dasharray="4 4"/>`+"\n", x, y1, x, y0)
	}
	fmt.Fprintf(b, `<text x="%g" y="%d" text-anchor="middle">%s</text>`+"\n", (x0+x1)/2, svgHeight-16, esc(c.xLabel))
	fmt.Fprintf(b, `<text x="16" y="%g" text-anchor="middle" transform="rotate(-90 16 %g)">%s</text>`+"\n", (y0+y1)/2, (y0+y1)/2, esc(c.yLabel))
}

// line draws a series: a polyline through its joined points and a marker
// on every point.
func (c chart) line(b *strings.Builder, s scale, sr series, colour string) {
	var run []string
	flush := func() {
		if len(run) > 1 {
			fmt.Fprintf(b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(run, " "), colour)
		}
		run = run[:0]
	}
	for _, p := range sr.points {
		if p.apart {
			flush()
		}
		run = append(run, fmt.Sprintf("%.1f,%.1f", s.px(p.x), s.py(p.y)))
	}
	flush()
	for _, p := range sr.points {
		fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"><title>%s: %s</title></circle>`+"\n",
			s.px(p.x), s.py(p.y), colour, esc(sr.name), axisNumber(p.y))
	}
}

// axisNumber writes a value as the axes do: 12,000 or 12.5k, 1.2M.
func axisNumber(v float64) string {
	switch {
	case v >= 1e6:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", v/1e6), ".0") + "M"
	case v >= 1e4:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", v/1e3), ".0") + "k"
	}
	return strings.TrimSuffix(fmt.Sprintf("%.1f", v), ".0")
}

func esc(s string) string { return html.EscapeString(s) }

// writeChart renders c into dir/name (dir is created), or does nothing
// when dir is empty (no -svg).
func writeChart(dir, name string, c chart) error {
	if dir == "" {
		return nil
	}
	out, err := c.svg()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if strings.ContainsAny(name, `/\`) {
		return errors.New("chart file name " + name + " has a path separator")
	}
	return os.WriteFile(filepath.Join(dir, name), []byte(out), 0o644)
}

// svgDir is where -svg writes charts ("" for none).
var svgDir string
