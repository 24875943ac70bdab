package inbox

import (
	"bytes"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"strconv"
	"time"
)

// convert stores src, a data column's value as the driver returned it, into
// dest, as sql.Rows.Scan does for the same destination ([Delivery.Scan]
// lists them); convert_test.go checks the two agree.
func convert(dest, src any) error {
	if done := convertExact(dest, src); done {
		return nil
	}
	switch d := dest.(type) {
	case *string:
		if s, ok := scalarText(src); ok {
			*d = s
			return nil
		}
	case *[]byte:
		if s, ok := scalarText(src); ok {
			*d = []byte(s)
			return nil
		}
	case *bool:
		b, err := driver.Bool.ConvertValue(src)
		if err == nil {
			*d = b.(bool)
		}
		return err
	case *any:
		*d = src
		return nil
	}
	if s, ok := dest.(sql.Scanner); ok {
		return s.Scan(src)
	}
	return convertNumber(dest, src)
}

// convertExact stores the values that need no parsing: text and bytes into
// text and bytes (copied), a time into a time or its RFC 3339 text, NULL
// into *any or *[]byte.
func convertExact(dest, src any) bool {
	switch s := src.(type) {
	case string:
		switch d := dest.(type) {
		case *string:
			*d = s
			return true
		case *[]byte:
			*d = []byte(s)
			return true
		}
	case []byte:
		switch d := dest.(type) {
		case *string:
			*d = string(s)
			return true
		case *any:
			*d = bytes.Clone(s)
			return true
		case *[]byte:
			*d = bytes.Clone(s)
			return true
		}
	case time.Time:
		switch d := dest.(type) {
		case *time.Time:
			*d = s
			return true
		case *string:
			*d = s.Format(time.RFC3339Nano)
			return true
		case *[]byte:
			*d = []byte(s.Format(time.RFC3339Nano))
			return true
		}
	case nil:
		switch d := dest.(type) {
		case *any:
			*d = nil
			return true
		case *[]byte:
			*d = nil
			return true
		}
	}
	return false
}

// convertNumber parses src's text into an integer or float destination.
func convertNumber(dest, src any) error {
	text, ok := scalarText(src)
	if s, isStr := src.(string); isStr {
		text, ok = s, true
	} else if b, isBytes := src.([]byte); isBytes {
		text, ok = string(b), true
	}
	if src == nil {
		return fmt.Errorf("converting NULL to %T is unsupported", dest)
	}
	if !ok {
		return fmt.Errorf("unsupported Scan, storing driver.Value type %T into type %T", src, dest)
	}
	for _, store := range numberStores {
		handled, err := store(dest, text)
		if !handled {
			continue
		}
		if err != nil {
			return fmt.Errorf("converting driver.Value type %T (%q) to %T: %w", src, text, dest, err)
		}
		return nil
	}
	return fmt.Errorf("unsupported Scan, storing driver.Value type %T into type %T", src, dest)
}

// numberStores parse text into each number destination, leaving it as it
// was when the text does not fit; each reports whether dest was its kind.
var numberStores = [...]func(dest any, text string) (bool, error){
	number(signed[int](strconv.IntSize)), number(signed[int8](8)), number(signed[int16](16)),
	number(signed[int32](32)), number(signed[int64](64)),
	number(unsigned[uint](strconv.IntSize)), number(unsigned[uint8](8)), number(unsigned[uint16](16)),
	number(unsigned[uint32](32)), number(unsigned[uint64](64)),
	number(float[float32](32)), number(float[float64](64)),
}

func number[T any](parse func(string) (T, error)) func(any, string) (bool, error) {
	return func(dest any, text string) (bool, error) {
		d, ok := dest.(*T)
		if !ok {
			return false, nil
		}
		v, err := parse(text)
		if err == nil {
			*d = v
		}
		return true, err
	}
}

func signed[T int | int8 | int16 | int32 | int64](bits int) func(string) (T, error) {
	return func(s string) (T, error) { n, err := strconv.ParseInt(s, 10, bits); return T(n), err }
}

func unsigned[T uint | uint8 | uint16 | uint32 | uint64](bits int) func(string) (T, error) {
	return func(s string) (T, error) { n, err := strconv.ParseUint(s, 10, bits); return T(n), err }
}

func float[T float32 | float64](bits int) func(string) (T, error) {
	return func(s string) (T, error) { f, err := strconv.ParseFloat(s, bits); return T(f), err }
}

// scalarText is the text of a number or a bool, as database/sql writes it.
func scalarText(src any) (string, bool) {
	switch s := src.(type) {
	case int64:
		return strconv.FormatInt(s, 10), true
	case int32:
		return strconv.FormatInt(int64(s), 10), true
	case int:
		return strconv.Itoa(s), true
	case uint64:
		return strconv.FormatUint(s, 10), true
	case float64:
		return strconv.FormatFloat(s, 'g', -1, 64), true
	case float32:
		return strconv.FormatFloat(float64(s), 'g', -1, 32), true
	case bool:
		return strconv.FormatBool(s), true
	}
	return "", false
}
