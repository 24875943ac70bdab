package inbox

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
)

// expectClockReads expects CheckSchema's reads of the engine's clock
// (MySQL's), one per offset, each answering this process's clock moved by
// the offset, taken now: the test runs within milliseconds.
func expectClockReads(sm sqlmock.Sqlmock, offsets ...time.Duration) {
	for _, o := range offsets {
		sm.ExpectQuery("SELECT UTC_TIMESTAMP(6)").WithoutArgs().WillReturnRows(sqlmock.NewRows([]string{"now"}).
			AddRow(time.Now().Add(o).UTC().Format("2006-01-02 15:04:05.000000")))
	}
}

// TestClockProblem pins the arithmetic: an offset beyond the margin by more
// than half its round trip, or two offsets apart by more than the margin
// and half their round trips, is a problem; within the error it is not.
func TestClockProblem(t *testing.T) {
	const ms = time.Millisecond
	margin, lease := 400*ms, 4*time.Second
	for _, tc := range []struct {
		name string
		rs   []clockReading
		want []string // substrings; nil: no problem
	}{
		{"agree", []clockReading{{10 * ms, 2 * ms}, {-5 * ms, 2 * ms}}, nil},
		{"ahead", []clockReading{{3200 * ms, 2 * ms}}, []string{"3.2s ahead", "±1ms", "connection 1 of 1", "Config.KeepMargin (400ms)", "half the lease (2s)"}},
		{"behind", []clockReading{{0, 2 * ms}, {-500 * ms, 20 * ms}}, []string{"500ms behind", "±10ms", "connection 2 of 2"}},
		// 450ms off, but the round trip of 200ms leaves it 350ms to 550ms:
		// not surely beyond the margin.
		{"within error", []clockReading{{450 * ms, 200 * ms}}, nil},
		{"spread", []clockReading{{300 * ms, 2 * ms}, {0, 2 * ms}, {-300 * ms, 2 * ms}}, []string{"connections 1 and 3 of 3", "differ by 600ms", "±2ms", "disagree"}},
		{"spread within error", []clockReading{{300 * ms, 300 * ms}, {-300 * ms, 300 * ms}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := clockProblem(tc.rs, margin, lease)
			if tc.want == nil {
				if got != "" {
					t.Fatalf("clockProblem = %q, want none", got)
				}
				return
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("clockProblem = %q, want it to name %q", got, w)
				}
			}
		})
	}
}

// TestCheckSchemaClock: on MySQL under the engine's clock CheckSchema reads
// the clock on clockSamples connections and reports a server ahead of this
// process by more than the margin; with Config.Now it reads none.
func TestCheckSchemaClock(t *testing.T) {
	for _, tc := range []struct {
		name    string
		offsets []time.Duration
		want    string
	}{
		{"in step", []time.Duration{0, 0, 0, 0}, ""},
		// The reading comes milliseconds after the answer was made: 4.99…s.
		{"one ahead", []time.Duration{0, 0, 5 * time.Second, 0}, "s ahead of this process's"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, sm := btMock(t)
			q := btNew(t, db, MariaDB, false)
			expectMariaDBFit(sm)
			expectClockReads(sm, tc.offsets...)
			err := q.CheckSchema(context.Background())
			btMet(t, sm)
			var se *SchemaError
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("CheckSchema = %v, want nil", err)
			case tc.want != "" && (!errors.As(err, &se) || len(se.Problems) != 1 || !strings.Contains(se.Problems[0], tc.want) ||
				!strings.Contains(se.Problems[0], "connection 3 of 4")):
				t.Fatalf("CheckSchema = %v, want one problem naming %q", err, tc.want)
			}
		})
	}
	// A pool of two whose other connection is held: one reading, after
	// clockConnWait, and no error.
	t.Run("busy pool", func(t *testing.T) {
		db, sm := btMock(t)
		db.SetMaxOpenConns(2)
		q := btNew(t, db, MariaDB, false)
		c, err := db.Conn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		expectMariaDBFit(sm)
		expectClockReads(sm, 0)
		if err := q.CheckSchema(context.Background()); err != nil {
			t.Fatalf("CheckSchema = %v, want nil", err)
		}
		btMet(t, sm)
	})
	t.Run("Config.Now", func(t *testing.T) {
		db, sm := btMock(t)
		q := btNew(t, db, MariaDB, true)
		expectMariaDBFit(sm)
		if err := q.CheckSchema(context.Background()); err != nil {
			t.Fatalf("CheckSchema = %v, want nil", err)
		}
		btMet(t, sm)
	})
}

// expectMariaDBFit expects the schema check's reads of a fit MariaDB 10.11
// lease table (as TestCheckSchemaMariaDB's first case).
func expectMariaDBFit(sm sqlmock.Sqlmock) {
	sm.ExpectQuery("SELECT version(), @@version_comment").WithoutArgs().WillReturnRows(sqlmock.NewRows([]string{"version", "version_comment"}).
		AddRow("10.11.19-MariaDB-0+deb12u1", "Debian 12"))
	sm.ExpectQuery("SELECT column_name, column_type FROM information_schema.columns WHERE table_schema = COALESCE(NULLIF(?, ''), DATABASE()) AND table_name = ?").
		WithArgs("", "jobs").WillReturnRows(sqlmock.NewRows([]string{"column_name", "column_type"}).
		AddRow("id", "bigint").AddRow("attempt", "int").AddRow("payload", "blob").AddRow("locked_until", "datetime(6)"))
	sm.ExpectQuery("SELECT column_name, column_default, extra, COALESCE(generation_expression, '') FROM information_schema.columns "+
		"WHERE table_schema = COALESCE(NULLIF(?, ''), DATABASE()) AND table_name = ? AND column_name IN (?, ?)").
		WithArgs("", "jobs", "id", "id").WillReturnRows(sqlmock.NewRows([]string{"column_name", "column_default", "extra", "generation_expression"}).
		AddRow("id", nil, "auto_increment", ""))
	sm.ExpectQuery("SELECT COALESCE(engine, '') FROM information_schema.tables WHERE table_schema = COALESCE(NULLIF(?, ''), DATABASE()) AND table_name = ?").
		WithArgs("", "jobs").WillReturnRows(sqlmock.NewRows([]string{"engine"}).AddRow("InnoDB"))
	expectIDPrimary(sm)
}

// myIDPrimaryCheck is the schema check's question whether a lease table's
// primary key is its id alone.
const myIDPrimaryCheck = "SELECT COUNT(*) FROM information_schema.statistics s WHERE s.table_schema = COALESCE(NULLIF(?, ''), DATABASE()) " +
	"AND s.table_name = ? AND s.index_name = 'PRIMARY' AND s.seq_in_index = 1 AND s.column_name = ? AND NOT EXISTS (SELECT 1 " +
	"FROM information_schema.statistics o WHERE o.table_schema = s.table_schema AND o.table_name = s.table_name " +
	"AND o.index_name = 'PRIMARY' AND o.seq_in_index = 2)"

// expectIDPrimary answers it: yes.
func expectIDPrimary(sm sqlmock.Sqlmock) {
	sm.ExpectQuery(myIDPrimaryCheck).WithArgs("", "jobs", "id").WillReturnRows(sqlmock.NewRows([]string{"n"}).AddRow(1))
}
