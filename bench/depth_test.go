package main

// The CI check of -run depth: it runs at a small size on PostgreSQL and
// with -svg writes a chart that parses, of the three claims it draws.
// Speed is not looked at.

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestDepthRun(t *testing.T) {
	e := needEngine(t, "pgx")
	dir := t.TempDir()
	defer func(d string) { svgDir = d }(svgDir)
	svgDir = filepath.Join(dir, "charts")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := runDepth(ctx, &out, io.Discard, []engine{e}, 20000, 12, dir); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"| postgres | inbox's shallow (Table.Shallow) | primary key |", "| postgres | minimal queue (issue 25) | primary key |"} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("no line %q in:\n%s", line, out.String())
		}
	}
	b, err := os.ReadFile(filepath.Join(svgDir, "depth-pgx.svg"))
	if err != nil {
		t.Fatal(err)
	}
	els := parseSVG(t, string(b))
	if n := len(checkPlot(t, els)); n != 9 { // three claims on 10k, 20k and the leased head
		t.Errorf("%d markers, want 9", n)
	}
}
