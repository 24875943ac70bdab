package inbox

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestStorableText(t *testing.T) {
	long := strings.Repeat("é", 3000) // 6,000 bytes
	cases := []struct{ name, in, want string }{
		{"plain", "boom", "boom"},
		{"nul", "a\x00b", "a\uFFFDb"},
		{"invalid utf8", "a\xffb\xc3", "a\uFFFDb\uFFFD"},
		{"long", long, strings.Repeat("é", MaxErrorText/2)},
	}
	for _, c := range cases {
		got := storableText(c.in)
		if got != c.want {
			t.Errorf("%s: storableText = %q, want %q", c.name, got, c.want)
		}
		if !utf8.ValidString(got) || strings.IndexByte(got, 0) >= 0 || len(got) > MaxErrorText {
			t.Errorf("%s: %q is not storable", c.name, got)
		}
	}
	// 5,000 bytes of NUL and bad bytes: cut to the limit, every one replaced.
	got := storableText(strings.Repeat("\x00\xfe", 2500))
	if len(got) > MaxErrorText || strings.ContainsAny(got, "\x00") || !utf8.ValidString(got) {
		t.Fatalf("5,000 bad bytes gave %d bytes, valid %v", len(got), utf8.ValidString(got))
	}
}

type sqlStateErr string

func (e sqlStateErr) Error() string    { return "pq: " + string(e) }
func (e sqlStateErr) SQLState() string { return string(e) }

func TestTextRejected(t *testing.T) {
	yes := []error{
		sqlStateErr("22021"),
		fmt.Errorf("inbox: retry: %w", sqlStateErr("22001")),
		errors.New("Error 1366 (22007): Incorrect string value: '\\xFF' for column `last_error`"),
		errors.New("Error 1406 (22001): Data too long for column 'last_error' at row 1"),
	}
	for _, err := range yes {
		if !textRejected(err) {
			t.Errorf("textRejected(%v) = false", err)
		}
	}
	no := []error{nil, sqlStateErr("40P01"), errors.New("Error 1213 (40001): Deadlock found"), errors.New("driver: bad connection")}
	for _, err := range no {
		if textRejected(err) {
			t.Errorf("textRejected(%v) = true", err)
		}
	}
}
