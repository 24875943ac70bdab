package dbtest

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
)

// TestLeaseWalkTake: inbox.MariaDB's lease claim of one is one compound
// statement (Claim.WalkTake) that walks, marks and commits at the server.
//
//   - On a table with text ids, two data columns and a last-error column,
//     rows from before those columns were filled (NULLs) and rows with a
//     NUL byte, invalid UTF-8 (in the blob) and 5,000 bytes: each claim of one is that
//     statement alone, it delivers the row's id, attempt, data and error as
//     read, and the row carries the claim's token (attempt counted, the
//     expiry delivered), which its Ack fences on.
//   - A claim whose context ends within a second goes from the client
//     (Claim.WalkFirst in a transaction), never as the compound statement.
//   - Eight workers over two pools (the table named plainly and
//     schema-qualified), their claims cancelled at random points: no job
//     is delivered twice, and the jobs neither acknowledged nor free are
//     leases in force, at most one for each claim cut (the statement ran
//     on at the server); once those leases end, the jobs are claimed.
func TestLeaseWalkTake(t *testing.T) {
	eachEngine(t, func(e Engine) bool { return e.Dialect == inbox.MariaDB }, func(t *testing.T, e Engine) {
		ctx := context.Background()
		db1, log := loggedPool(t, e)
		db2 := e.Open(t, 16)
		table := tableName(e, "wtake")
		mustExec(t, e, db1, "DROP TABLE IF EXISTS "+table)
		mustExec(t, e, db1, "CREATE TABLE "+table+" (id varchar(36) PRIMARY KEY, attempt integer NOT NULL DEFAULT 1,"+
			" locked_until DATETIME(6) NULL, payload blob NULL, note text NULL, last_error text NULL,"+
			" INDEX "+table+"_claimable (locked_until, id)) ENGINE=InnoDB")
		dropAtEnd(t, e, db1, table)
		tb := inbox.Table{Name: table, ID: "id", Attempt: "attempt", LockedUntil: "locked_until", Data: []string{"payload", "note"}, LastError: "last_error"}
		q1 := newQueue(t, db1, queueConfig(e, tb, nil))
		tb.Name = concQualified(t, e, db2, table)
		q2 := newQueue(t, db2, queueConfig(e, tb, nil))
		take := q1.Statements().Claim.WalkTake.SQL
		if take == "" {
			t.Fatal("inbox.MariaDB has no Claim.WalkTake for an indexed lease table")
		}

		long := strings.Repeat("é", 2500) // 5,000 bytes
		type want struct {
			id      string
			payload []byte
			note    any
			lastErr string
		}
		wants := []want{
			{"a-01", nil, nil, ""},
			{"a-02", []byte{0, 0xff, 0xfe}, "x\x00y", "fail\x00ed"},
			{"a-03", append([]byte("\xff\xfe not UTF-8 "), long...), long, long},
		}
		for _, w := range wants {
			var lastErr any
			if w.lastErr != "" {
				lastErr = w.lastErr
			}
			mustExec(t, e, db1, "INSERT INTO "+table+" (id, payload, note, last_error) VALUES (?, ?, ?, ?)", w.id, w.payload, w.note, lastErr)
		}
		for _, w := range wants {
			n := log.mark()
			ds, err := q1.Claim(ctx, 1)
			if err != nil || len(ds) != 1 {
				t.Fatalf("Claim(1) = %d jobs, %v", len(ds), err)
			}
			d := ds[0]
			if got := log.since(n); len(got) != 1 || got[0] != take {
				t.Errorf("a claim of one sent:\n%s\nwant Claim.WalkTake alone", strings.Join(got, "\n"))
			}
			var payload []byte
			var note sql.NullString
			if err := d.Scan(&payload, &note); err != nil {
				t.Fatal(err)
			}
			if d.ID() != w.id || d.Attempt() != 1 || string(payload) != string(w.payload) || d.LastError() != w.lastErr {
				t.Errorf("delivered %v attempt %d payload %q error %q, want %s attempt 1 payload %q error %q",
					d.ID(), d.Attempt(), payload, d.LastError(), w.id, w.payload, w.lastErr)
			}
			if note.Valid != (w.note != nil) || note.Valid && note.String != w.note {
				t.Errorf("job %s: note %v, want %v", w.id, note, w.note)
			}
			var attempt int
			var until string
			if err := db2.QueryRowContext(ctx, "SELECT attempt, CAST(locked_until AS CHAR) FROM "+table+" WHERE id = ?", w.id).Scan(&attempt, &until); err != nil {
				t.Fatal(err)
			}
			if exp := d.Expiry().UTC().Format("2006-01-02 15:04:05.000000"); attempt != 2 || until != exp {
				t.Errorf("job %s row: attempt %d, expiry %s; want 2 and the delivery's %s", w.id, attempt, until, exp)
			}
			if err := d.Ack(ctx); err != nil {
				t.Errorf("ack %s: %v", w.id, err)
			}
		}

		// A claim whose context ends within a second is not the compound
		// statement.
		mustExec(t, e, db1, "INSERT INTO "+table+" (id, payload) VALUES ('b-01', x'00')")
		n := log.mark()
		ds, err := claimFromClient(ctx, q1, true)
		if err != nil || len(ds) != 1 {
			t.Fatalf("Claim(1) with a near deadline = %d jobs, %v", len(ds), err)
		}
		if got := log.since(n); countSent(got, take) != 0 || countSent(got, q1.Statements().Claim.WalkFirst.SQL) != 1 {
			t.Errorf("a claim whose context ends within a second sent:\n%s\nwant Claim.WalkFirst, no Claim.WalkTake", strings.Join(got, "\n"))
		}
		if err := ds[0].Ack(ctx); err != nil {
			t.Fatal(err)
		}

		// Eight workers over both pools, claims cut at random.
		const jobs = 300
		mustExec(t, e, db1, fmt.Sprintf("INSERT INTO %s (id, payload) SELECT CONCAT('c-', LPAD(seq, 4, '0')), x'00' FROM seq_1_to_%d", table, jobs))
		var acked sync.Map
		var cut atomic.Int64
		drain := func(cutting bool) {
			for _, err := range onTwoPools(8, q1, q2, func(q *inbox.Queue) error {
				for misses := 0; misses < 3; {
					cctx, cancel := context.WithCancel(ctx)
					if cutting && rand.IntN(3) == 0 {
						time.AfterFunc(time.Duration(rand.IntN(2000))*time.Microsecond, cancel)
					}
					ds, err := q.Claim(cctx, 1)
					wasCut := cctx.Err() != nil
					cancel()
					if err != nil {
						// A cut claim fails with the context's error, or
						// with the driver's for the connection it closed.
						if wasCut {
							cut.Add(1)
							continue
						}
						return err
					}
					if len(ds) == 0 {
						misses++
						continue
					}
					misses = 0
					if err := ds[0].Ack(ctx); err != nil {
						return fmt.Errorf("ack %v: %w", ds[0].ID(), err)
					}
					if _, twice := acked.LoadOrStore(ds[0].ID(), true); twice {
						return fmt.Errorf("job %v delivered twice", ds[0].ID())
					}
				}
				return nil
			}) {
				t.Error(err)
			}
		}
		drain(true)
		var left, leased int
		if err := db2.QueryRowContext(ctx, "SELECT COUNT(*), COUNT(CASE WHEN locked_until > UTC_TIMESTAMP(6) THEN 1 END) FROM "+table).Scan(&left, &leased); err != nil {
			t.Fatal(err)
		}
		if left != leased || int64(left) > cut.Load() {
			t.Fatalf("%d jobs left, %d of them under a lease in force, after %d claims cut; want only leases, at most one a cut claim", left, leased, cut.Load())
		}
		t.Logf("%d claims cut, %d jobs left leased", cut.Load(), left)
		// The leases end: those jobs are claimed once.
		mustExec(t, e, db1, "UPDATE "+table+" SET locked_until = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND")
		drain(false)
		n = 0
		acked.Range(func(any, any) bool { n++; return true })
		if err := db2.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+table).Scan(&left); err != nil || left != 0 || n != jobs {
			t.Errorf("%d jobs left (%v), %d of %d acknowledged", left, err, n, jobs)
		}
	})
}
