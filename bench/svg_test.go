package main

import (
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// svgElement is what the tests read back from a chart: every element's
// name and attributes, and the text inside it.
type svgElement struct {
	name  string
	attrs map[string]string
	text  string
}

// parseSVG decodes out as XML, failing the test on any error, and returns
// its elements in document order.
func parseSVG(t *testing.T, out string) []svgElement {
	t.Helper()
	dec := xml.NewDecoder(strings.NewReader(out))
	var els []svgElement
	var open []int
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, out)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			e := svgElement{name: tok.Name.Local, attrs: map[string]string{}}
			for _, a := range tok.Attr {
				e.attrs[a.Name.Local] = a.Value
			}
			els = append(els, e)
			open = append(open, len(els)-1)
		case xml.EndElement:
			open = open[:len(open)-1]
		case xml.CharData:
			if len(open) > 0 {
				els[open[len(open)-1]].text += string(tok)
			}
		}
	}
	if len(els) == 0 || els[0].name != "svg" {
		t.Fatalf("the document does not open with <svg>:\n%s", out)
	}
	return els
}

func attrFloat(t *testing.T, e svgElement, name string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(e.attrs[name], 64)
	if err != nil {
		t.Fatalf("<%s %s=%q>: %v", e.name, name, e.attrs[name], err)
	}
	return v
}

// checkPlot fails unless every marker lies inside the plot's frame, and
// returns the markers' centres.
func checkPlot(t *testing.T, els []svgElement) [][2]float64 {
	t.Helper()
	var centres [][2]float64
	for _, e := range els {
		if e.name != "circle" {
			continue
		}
		x, y := attrFloat(t, e, "cx"), attrFloat(t, e, "cy")
		if x < plotLeft || x > svgWidth-plotRight || y < plotTop || y > svgHeight-plotBase {
			t.Errorf("marker at (%v, %v) outside the plot (%d–%d, %d–%d)", x, y, plotLeft, svgWidth-plotRight, plotTop, svgHeight-plotBase)
		}
		centres = append(centres, [2]float64{x, y})
	}
	return centres
}

func texts(els []svgElement) string {
	var s []string
	for _, e := range els {
		if e.name == "text" {
			s = append(s, e.text)
		}
	}
	return strings.Join(s, "|")
}

func TestChartDepth(t *testing.T) {
	c := chart{
		title: "jobs/s & depth <pgx>", xLabel: "jobs waiting", yLabel: "jobs/s", logX: true,
		xTicks:    []tick{{1e4, "10k"}, {1e5, "100k"}, {1e6, "1M"}, {1e7, "100k leased + 10k"}},
		separator: 3e6,
		series: []series{
			{"inbox, indexed", []point{{x: 1e4, y: 1600}, {x: 1e5, y: 1580}, {x: 1e6, y: 1590}, {x: 1e7, y: 1570, apart: true}}},
			{"minimal", []point{{x: 1e4, y: 1900}, {x: 1e5, y: 1700}, {x: 1e6, y: 1500}, {x: 1e7, y: 40, apart: true}}},
		},
	}
	out, err := c.svg()
	if err != nil {
		t.Fatal(err)
	}
	els := parseSVG(t, out)
	centres := checkPlot(t, els)
	if len(centres) != 8 {
		t.Fatalf("%d markers, want 8", len(centres))
	}
	// Log x: 10k, 100k and 1M evenly spaced, and left to right.
	if d1, d2 := centres[1][0]-centres[0][0], centres[2][0]-centres[1][0]; d1 <= 0 || math.Abs(d1-d2) > 0.2 {
		t.Errorf("x of 10k, 100k, 1M at %v: not evenly spaced on a log axis", centres[:3])
	}
	// A higher rate is higher on the page (smaller y).
	if centres[4][1] >= centres[0][1] || centres[7][1] <= centres[3][1] {
		t.Errorf("y of the markers %v does not follow their rates", centres)
	}
	// The apart point is not on a line: each series has one polyline of
	// three points.
	var lines int
	for _, e := range els {
		if e.name == "polyline" {
			lines++
			if n := len(strings.Fields(e.attrs["points"])); n != 3 {
				t.Errorf("a polyline of %d points, want 3: %s", n, e.attrs["points"])
			}
		}
	}
	if lines != 2 {
		t.Errorf("%d polylines, want 2", lines)
	}
	all := texts(els)
	for _, want := range []string{"jobs/s & depth <pgx>", "jobs waiting", "jobs/s", "10k", "1M", "100k leased + 10k", "inbox, indexed", "minimal", "2000", "0"} {
		if !strings.Contains("|"+all+"|", "|"+want+"|") {
			t.Errorf("no text %q among %s", want, all)
		}
	}
}

// A chart of one point, or of zero rates, still has axes of some length.
func TestChartNeverZeroAxes(t *testing.T) {
	for _, c := range []chart{
		{title: "one", logX: true, series: []series{{"s", []point{{x: 16, y: 500}}}}},
		{title: "flat zero", series: []series{{"s", []point{{x: 1, y: 0}, {x: 4, y: 0}}}}},
	} {
		s, err := c.scaleOf()
		if err != nil {
			t.Fatal(err)
		}
		if s.xMin >= s.xMax || s.yMax <= 0 {
			t.Errorf("%s: axes x %v–%v, y 0–%v", c.title, s.xMin, s.xMax, s.yMax)
		}
		out, err := c.svg()
		if err != nil {
			t.Fatal(err)
		}
		checkPlot(t, parseSVG(t, out))
		if strings.Contains(out, "NaN") || strings.Contains(out, "Inf") {
			t.Errorf("%s: NaN or Inf in the SVG:\n%s", c.title, out)
		}
	}
}

func TestChartRefusesBadPoints(t *testing.T) {
	for name, c := range map[string]chart{
		"no points":      {title: "t", series: []series{{"s", nil}}},
		"x 0 on log":     {title: "t", logX: true, series: []series{{"s", []point{{x: 0, y: 1}}}}},
		"NaN y":          {title: "t", series: []series{{"s", []point{{x: 1, y: math.NaN()}}}}},
		"negative y":     {title: "t", series: []series{{"s", []point{{x: 1, y: -1}}}}},
		"infinite x":     {title: "t", series: []series{{"s", []point{{x: math.Inf(1), y: 1}}}}},
		"log tick at -1": {title: "t", logX: true, xTicks: []tick{{-1, "x"}}, series: []series{{"s", []point{{x: 1, y: 1}}}}},
	} {
		if _, err := c.svg(); err == nil {
			t.Errorf("%s: rendered", name)
		}
	}
}

func TestNiceCeil(t *testing.T) {
	for v, want := range map[float64]float64{0: 1, 0.3: 0.5, 1: 1, 1.1: 2, 2.2: 2.5, 3: 5, 7: 10, 1234: 2000, 20001: 25000} {
		if got := niceCeil(v); math.Abs(got-want) > 1e-9 {
			t.Errorf("niceCeil(%v) = %v, want %v", v, got, want)
		}
	}
}

func TestWriteChart(t *testing.T) {
	c := chart{title: "t", series: []series{{"s", []point{{x: 1, y: 1}, {x: 2, y: 3}}}}}
	if err := writeChart("", "x.svg", c); err != nil {
		t.Errorf("no -svg: %v", err)
	}
	dir := filepath.Join(t.TempDir(), "charts")
	if err := writeChart(dir, "a.svg", c); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "a.svg"))
	if err != nil {
		t.Fatal(err)
	}
	parseSVG(t, string(b))
	if err := writeChart(dir, "../b.svg", c); err == nil {
		t.Error("a name with a separator was written")
	}
}

// The scale charts: single jobs and batches apart, a series per form and
// per number of processes, x the workers of all processes together.
func TestScaleChart(t *testing.T) {
	e := engine{name: "pgx", family: "postgres", label: "pgx/v5/stdlib"}
	lines := []scaleLine{
		{"lease", 1, scalePlanEntry{1, 1, 0, 0}}, {"lease", 1, scalePlanEntry{1, 64, 0, 0}}, {"lease", 1, scalePlanEntry{4, 16, 0, 0}},
		{"lease", 16, scalePlanEntry{1, 1, 0, 0}}, {"advisory", 1, scalePlanEntry{1, 16, 0, 0}},
	}
	medians := []float64{100, 400, 300, 2000, 250}
	single := scaleChart(e, lines, medians, false)
	var names []string
	for _, s := range single.series {
		names = append(names, fmt.Sprintf("%s %v", s.name, s.points))
	}
	want := []string{"lease [{1 100 false} {64 400 false}]", "lease, 4 processes [{64 300 false}]", "advisory [{16 250 false}]"}
	if !slices.Equal(names, want) {
		t.Errorf("single-job series %q, want %q", names, want)
	}
	batched := scaleChart(e, lines, medians, true)
	if len(batched.series) != 1 || batched.series[0].name != "lease, 16 per claim" {
		t.Errorf("batch series %+v", batched.series)
	}
	for _, c := range []chart{single, batched} {
		out, err := c.svg()
		if err != nil {
			t.Fatal(err)
		}
		checkPlot(t, parseSVG(t, out))
	}
}

// The depth chart: jobs/s of one worker (a second over the median), the
// leased head a decade right of the deepest case, apart from the line.
func TestDepthChart(t *testing.T) {
	e := engine{name: "pgx", family: "postgres", label: "pgx/v5/stdlib"}
	cases := depthCases(1000000)
	ms := func(d ...time.Duration) [][]time.Duration {
		var out [][]time.Duration
		for _, x := range d {
			out = append(out, []time.Duration{x})
		}
		return out
	}
	samples := map[string][][]time.Duration{
		"inbox+idx": ms(500*time.Microsecond, 500*time.Microsecond, time.Millisecond, time.Millisecond),
		"shallow":   ms(400*time.Microsecond, 400*time.Microsecond, 400*time.Microsecond, 10*time.Millisecond),
		"minimal":   ms(250*time.Microsecond, 400*time.Microsecond, 400*time.Microsecond, 20*time.Millisecond),
	}
	c := depthChart(e, cases, samples)
	if len(c.series) != 3 || c.series[0].name != "inbox, indexed lease" {
		t.Fatalf("series %+v", c.series)
	}
	got := c.series[2].points
	want := []point{{x: 1e4, y: 4000}, {x: 1e5, y: 2500}, {x: 1e6, y: 2500}, {x: 1e7, y: 50, apart: true}}
	if !slices.Equal(got, want) {
		t.Errorf("minimal queue's points %v, want %v", got, want)
	}
	if c.separator <= 1e6 || c.separator >= 1e7 {
		t.Errorf("separator at %v, want between the deepest case and the leased head", c.separator)
	}
	out, err := c.svg()
	if err != nil {
		t.Fatal(err)
	}
	checkPlot(t, parseSVG(t, out))
}
