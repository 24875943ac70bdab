package browsertest

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
)

// TestPhoneWidth (issue 37 item 7) opens every view in a phone-wide
// window (390 CSS pixels): none scrolls sideways, the long error and the
// tables included. The layout is the same on every engine: SQLite's data
// stands for them.
func TestPhoneWidth(t *testing.T) {
	browserCtx := browser(t)
	f := newFixture(t, engines[0], nil)
	tab := newTab(t, browserCtx)
	run(t, tab, chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile))
	views := []string{
		"?queue=jobs", "jobs?queue=jobs&state=all", "jobs?queue=jobs&state=dead",
		fmt.Sprintf("job?queue=jobs&id=%v", f.dead["dies-long"]), fmt.Sprintf("job?queue=jobs&id=%v", f.dead["dies-html"]),
	}
	check := func(view string) {
		t.Helper()
		run(t, tab, chromedp.Navigate(f.url+view))
		// A phone widens its layout to hold what overflows (the window's
		// width then grows past 390) and a scroll bar narrows it: both
		// are checked.
		w := value(t, tab, chromedp.Evaluate[[]int](`[document.scrollingElement.scrollWidth, document.documentElement.clientWidth, window.innerWidth]`))
		if w[2] != 390 || w[0] > w[1] {
			t.Errorf("%s: %d pixels wide in a window of %d (%d without the scroll bar)", view, w[0], w[2], w[1])
		}
	}
	for _, v := range views {
		check(v)
	}
	if err := f.q.Pause(context.Background(), "phone test"); err != nil {
		t.Fatal(err)
	}
	check("?queue=jobs")
	if !strings.Contains(text(t, tab, "p.paused-banner"), "is paused since") {
		t.Errorf("no banner on the paused page")
	}
	if err := f.held.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
}
