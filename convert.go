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
	var err error
	switch d := dest.(type) {
	case *int:
		err = setInt(d, text, strconv.IntSize)
	case *int8:
		err = setInt(d, text, 8)
	case *int16:
		err = setInt(d, text, 16)
	case *int32:
		err = setInt(d, text, 32)
	case *int64:
		err = setInt(d, text, 64)
	case *uint:
		err = setUint(d, text, strconv.IntSize)
	case *uint8:
		err = setUint(d, text, 8)
	case *uint16:
		err = setUint(d, text, 16)
	case *uint32:
		err = setUint(d, text, 32)
	case *uint64:
		err = setUint(d, text, 64)
	case *float32:
		err = setFloat(d, text, 32)
	case *float64:
		err = setFloat(d, text, 64)
	default:
		return fmt.Errorf("unsupported Scan, storing driver.Value type %T into type %T", src, dest)
	}
	if err != nil {
		return fmt.Errorf("converting driver.Value type %T (%q) to %T: %w", src, text, dest, err)
	}
	return nil
}

// setInt, setUint and setFloat store the parsed text into d, leaving d as
// it was when the text does not fit.
func setInt[T int | int8 | int16 | int32 | int64](d *T, text string, bits int) error {
	n, err := strconv.ParseInt(text, 10, bits)
	if err == nil {
		*d = T(n)
	}
	return err
}

func setUint[T uint | uint8 | uint16 | uint32 | uint64](d *T, text string, bits int) error {
	n, err := strconv.ParseUint(text, 10, bits)
	if err == nil {
		*d = T(n)
	}
	return err
}

func setFloat[T float32 | float64](d *T, text string, bits int) error {
	f, err := strconv.ParseFloat(text, bits)
	if err == nil {
		*d = T(f)
	}
	return err
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
