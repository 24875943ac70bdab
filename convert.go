package inbox

import (
	"database/sql"
	"fmt"
	"strconv"
	"time"
)

// convert stores src, as a driver returned it, into dest.
func convert(dest, src any) error {
	if s, ok := dest.(sql.Scanner); ok {
		return s.Scan(src)
	}
	switch d := dest.(type) {
	case *any:
		*d = src
		return nil
	case *[]byte:
		switch s := src.(type) {
		case []byte:
			*d = append([]byte(nil), s...)
			return nil
		case string:
			*d = []byte(s)
			return nil
		case nil:
			*d = nil
			return nil
		}
	case *string:
		switch s := src.(type) {
		case []byte:
			*d = string(s)
			return nil
		case string:
			*d = s
			return nil
		case int64:
			*d = strconv.FormatInt(s, 10)
			return nil
		}
	case *int64:
		n, err := toInt(src)
		*d = n
		return err
	case *int:
		n, err := toInt(src)
		*d = int(n)
		return err
	case *int32:
		n, err := toInt(src)
		*d = int32(n)
		return err
	case *float64:
		switch s := src.(type) {
		case float64:
			*d = s
			return nil
		case int64:
			*d = float64(s)
			return nil
		case []byte:
			f, err := strconv.ParseFloat(string(s), 64)
			*d = f
			return err
		}
	case *bool:
		switch s := src.(type) {
		case bool:
			*d = s
			return nil
		case int64:
			*d = s != 0
			return nil
		}
	case *time.Time:
		if s, ok := src.(time.Time); ok {
			*d = s
			return nil
		}
	}
	return fmt.Errorf("cannot store %T into %T", src, dest)
}

func toInt(src any) (int64, error) {
	switch s := src.(type) {
	case int64:
		return s, nil
	case []byte:
		return strconv.ParseInt(string(s), 10, 64)
	case string:
		return strconv.ParseInt(s, 10, 64)
	}
	return 0, fmt.Errorf("cannot store %T into an integer", src)
}
