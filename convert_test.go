package inbox

import (
	"database/sql"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
)

// TestConvertAsRowsScan stores each driver value into each destination
// Delivery.Scan documents, once through convert and once through
// sql.Rows.Scan (a sqlmock row holding the same value), and requires the
// same outcome: both fail, or both store the same value.
func TestConvertAsRowsScan(t *testing.T) {
	db, mock := btMock(t)
	when := time.Date(2024, 3, 1, 12, 0, 0, 123456000, time.UTC)
	sources := []any{nil, int64(0), int64(1), int64(-7), int64(300), int64(math.MaxInt64), float64(1.5), float64(2),
		true, false, "42", "-1", "1.25", "true", "hello", "", []byte("17"), []byte("bytes"), []byte{}, when}
	dests := []func() any{
		func() any { return new(any) }, func() any { return new(string) }, func() any { return new([]byte) },
		func() any { return new(bool) }, func() any { return new(int) }, func() any { return new(int8) },
		func() any { return new(int16) }, func() any { return new(int32) }, func() any { return new(int64) },
		func() any { return new(uint) }, func() any { return new(uint8) }, func() any { return new(uint16) },
		func() any { return new(uint32) }, func() any { return new(uint64) }, func() any { return new(float32) },
		func() any { return new(float64) }, func() any { return new(time.Time) }, func() any { return new(sql.NullString) },
		func() any { return new(sql.NullInt64) }, func() any { return new(sql.NullTime) },
	}
	checked := 0
	for _, src := range sources {
		for _, newDest := range dests {
			viaConvert, viaScan := newDest(), newDest()
			errConvert := convert(viaConvert, src)
			mock.ExpectQuery("SELECT v").WillReturnRows(sqlmock.NewRows([]string{"v"}).AddRow(src))
			errScan := db.QueryRow("SELECT v").Scan(viaScan)
			if (errConvert == nil) != (errScan == nil) {
				t.Errorf("%T (%v) into %T: convert error %v, Rows.Scan error %v", src, src, viaConvert, errConvert, errScan)
				continue
			}
			if !reflect.DeepEqual(viaConvert, viaScan) {
				t.Errorf("%T (%v) into %T: convert stored %#v, Rows.Scan %#v", src, src, viaConvert,
					reflect.ValueOf(viaConvert).Elem().Interface(), reflect.ValueOf(viaScan).Elem().Interface())
			}
			checked++
		}
	}
	if checked != len(sources)*len(dests) {
		t.Errorf("compared %d pairs, want %d", checked, len(sources)*len(dests))
	}
}
