package inbox

import (
	"errors"
	"strings"
	"unicode/utf8"
)

// storableText returns s as every supported engine stores it in a text
// column: valid UTF-8 (PostgreSQL refuses invalid bytes with 22021, MariaDB
// in strict mode with 1366), without NUL (PostgreSQL refuses it in text),
// each bad byte and NUL replaced by U+FFFD, and cut at a character boundary
// to at most MaxErrorText bytes. A panic value or a parse error quoting raw
// input must never stop a job from being retried or buried.
func storableText(s string) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 && len(s) <= MaxErrorText {
		return s
	}
	var b strings.Builder
	b.Grow(min(len(s), MaxErrorText))
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == 0 {
			r = utf8.RuneError
		}
		if b.Len()+utf8.RuneLen(r) > MaxErrorText {
			break
		}
		b.WriteRune(r)
		i += size
	}
	return b.String()
}

// textRejected reports whether err is the database refusing a text value:
// a character it cannot store or a value longer than the column (a
// last_error narrower than MaxErrorText). A settlement that carried an
// error text and failed so is sent again without the text, so that the
// text can never keep a job from settling.
func textRejected(err error) bool {
	if err == nil {
		return false
	}
	var st interface{ SQLState() string }
	if errors.As(err, &st) {
		switch st.SQLState() {
		case "22021", "22001", "22P05": // bad byte, too long, untranslatable
			return true
		}
	}
	msg := err.Error()
	// go-sql-driver/mysql: "Error 1366 (22007): Incorrect string value",
	// "Error 1406 (22001): Data too long for column".
	return strings.Contains(msg, "Error 1366") || strings.Contains(msg, "Error 1406") ||
		strings.Contains(msg, "SQLSTATE 22021") || strings.Contains(msg, "SQLSTATE 22001")
}
