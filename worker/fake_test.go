package worker

// The loop's batches against btFake, a tiny in-memory driver answering the
// Postgres lease statements (a copy of the root's bench_test.go fake, which
// a test of this package cannot import).

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
)

// btFake is a database/sql connector whose connections answer the lease
// statements of the Postgres dialect from memory: a claim returns as many
// rows as its limit, a batch Ack returns the ids it was given, a plain
// settlement affects one row. When block is set, a query signals on it and
// waits for its context to end. seen, when set, sees each query first.
type btFake struct {
	payload []byte
	expiry  time.Time
	nextID  atomic.Int64
	block   chan struct{}
	queries atomic.Int64
	// seen, when set, is called with each query before it is answered,
	// and may hold it.
	seen func(query string, args []driver.NamedValue)
}

func newBTFake() *btFake {
	return &btFake{payload: make([]byte, 128), expiry: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (f *btFake) db(tb testing.TB) *sql.DB {
	db := sql.OpenDB(f)
	db.SetMaxIdleConns(64)
	tb.Cleanup(func() { db.Close() })
	return db
}

func (f *btFake) Connect(context.Context) (driver.Conn, error) { return &btConn{f: f}, nil }
func (f *btFake) Driver() driver.Driver                        { return btDriver{f} }

type btDriver struct{ f *btFake }

func (d btDriver) Open(string) (driver.Conn, error) { return &btConn{f: d.f}, nil }

type btConn struct {
	f    *btFake
	rows btRows
}

func (c *btConn) Prepare(string) (driver.Stmt, error) {
	return nil, errors.New("btFake: no prepared statements")
}
func (c *btConn) Close() error              { return nil }
func (c *btConn) Begin() (driver.Tx, error) { return nil, errors.New("btFake: no transactions") }

func (c *btConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	c.f.queries.Add(1)
	return driver.RowsAffected(1), nil
}

func (c *btConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	c.f.queries.Add(1)
	if c.f.seen != nil {
		c.f.seen(query, args)
	}
	if c.f.block != nil {
		c.f.block <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	r := &c.rows
	r.f, r.i, r.vals = c.f, 0, r.vals[:0]
	switch {
	case strings.HasPrefix(query, "WITH picked"):
		// The limit is the first integer parameter under either clock
		// (the claim passes it once per branch and once for the union).
		n := 1
		for _, a := range args {
			if v, ok := a.Value.(int64); ok {
				n = int(v)
				break
			}
		}
		r.cols = btClaimCols
		for i := 0; i < n; i++ {
			r.vals = append(r.vals, c.f.nextID.Add(1))
		}
	case strings.HasPrefix(query, "DELETE"):
		// A batch Ack: every token matches; its ids are every third
		// parameter.
		r.cols = btIDCols
		for i := 0; i < len(args); i += 3 {
			r.vals = append(r.vals, args[i].Value)
		}
	default:
		return nil, errors.New("btFake: unexpected query " + query)
	}
	return r, nil
}

var (
	btClaimCols = []string{"id", "attempt", "locked_until", "payload"}
	btIDCols    = []string{"id"}
)

// btRows is reused by its connection: database/sql closes rows before the
// connection serves another statement.
type btRows struct {
	f    *btFake
	cols []string
	vals []driver.Value
	i    int
}

func (r *btRows) Columns() []string { return r.cols }
func (r *btRows) Close() error      { return nil }

func (r *btRows) Next(dest []driver.Value) error {
	if r.i == len(r.vals) {
		return io.EOF
	}
	dest[0] = r.vals[r.i]
	if len(dest) == 4 {
		dest[1], dest[2], dest[3] = int64(1), r.f.expiry, r.f.payload
	}
	r.i++
	return nil
}

// btQueue is a lease queue on the fake, with the engine's clock.
func btQueue(tb testing.TB, f *btFake) *inbox.Queue {
	q, err := inbox.New(f.db(tb), inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "jobs", LockedUntil: "locked_until"}})
	if err != nil {
		tb.Fatal(err)
	}
	return q
}

// The batch loop settles a lease claim's jobs through a Batcher whose
// batches are full at the claim's size: handlers that succeed together are
// acknowledged in one statement (the wait here is an hour, so only the
// full batch can have sent it), and one that runs on does not hold back the
// others past the wait.
func TestWorkBatchSharesStatements(t *testing.T) {
	run := func(t *testing.T, wait time.Duration, handle func(id any, acks func() [][]any) error) [][]any {
		f := newBTFake()
		q := btQueue(t, f)
		var mu sync.Mutex
		var acks [][]any // the distinct ids of each batch Ack, in order
		seen := func() [][]any {
			mu.Lock()
			defer mu.Unlock()
			return append([][]any(nil), acks...)
		}
		f.seen = func(query string, args []driver.NamedValue) {
			if !strings.HasPrefix(query, "DELETE") {
				return
			}
			var ids []any
			for i := 0; i < len(args); i += 3 {
				if len(ids) == 0 || ids[len(ids)-1] != args[i].Value {
					ids = append(ids, args[i].Value)
				}
			}
			mu.Lock()
			acks = append(acks, ids)
			mu.Unlock()
		}
		w, err := newLoop(context.Background(), q, Config{Batch: 3, RetryForever: true}, func(_ context.Context, d *inbox.Delivery) error { return handle(d.ID(), seen) })
		if err != nil {
			t.Fatal(err)
		}
		w.batchWait = wait
		defer func() {
			for _, b := range w.batchers {
				b.Close()
			}
		}()
		ds, err := q.Claim(context.Background(), 3)
		if err != nil || len(ds) != 3 {
			t.Fatalf("Claim: %d jobs, %v", len(ds), err)
		}
		w.handleAll(context.Background(), ds)
		for _, d := range ds {
			if err := d.Release(context.Background()); !errors.Is(err, inbox.ErrSettled) {
				t.Errorf("job %v not settled: Release says %v", d.ID(), err)
			}
		}
		return seen()
	}
	sorted := func(acks [][]any) string {
		for _, ids := range acks {
			sort.Slice(ids, func(i, j int) bool { return ids[i].(int64) < ids[j].(int64) })
		}
		return fmt.Sprint(acks)
	}

	t.Run("together", func(t *testing.T) {
		acks := run(t, time.Hour, func(any, func() [][]any) error { return nil })
		if got := sorted(acks); got != "[[1 2 3]]" {
			t.Fatalf("batch acks %s, want one of [1 2 3]", got)
		}
	})
	t.Run("one runs on", func(t *testing.T) {
		acks := run(t, time.Millisecond, func(id any, seen func() [][]any) error {
			if id != int64(3) {
				return nil
			}
			// Job 3 finishes only once its siblings were acknowledged
			// (together, or apart on a machine too loaded to start both
			// within the wait).
			deadline := time.Now().Add(20 * time.Second)
			acked := func() (n int) {
				for _, ids := range seen() {
					n += len(ids)
				}
				return n
			}
			for acked() < 2 {
				if time.Now().After(deadline) {
					return errors.New("jobs 1 and 2 waited for job 3")
				}
				runtime.Gosched()
				time.Sleep(100 * time.Microsecond)
			}
			return nil
		})
		if got := sorted(acks); got != "[[1 2] [3]]" && got != "[[1] [2] [3]]" && got != "[[2] [1] [3]]" {
			t.Fatalf("batch acks %s, want [1 2] (or each alone) then [3]", got)
		}
	})
	t.Run("the first runs on", func(t *testing.T) {
		// The loop runs quick handlers in its own goroutine: job 1's,
		// which waits for its siblings' acknowledgements, must not keep
		// them from starting, or from being acknowledged, past the wait.
		acks := run(t, time.Millisecond, func(id any, seen func() [][]any) error {
			if id != int64(1) {
				return nil
			}
			deadline := time.Now().Add(20 * time.Second)
			for {
				n := 0
				for _, ids := range seen() {
					n += len(ids)
				}
				if n >= 2 {
					return nil
				}
				if time.Now().After(deadline) {
					return errors.New("jobs 2 and 3 waited for job 1")
				}
				runtime.Gosched()
				time.Sleep(100 * time.Microsecond)
			}
		})
		if got := sorted(acks); got != "[[2 3] [1]]" && got != "[[2] [3] [1]]" && got != "[[3] [2] [1]]" {
			t.Fatalf("batch acks %s, want [2 3] (or each alone) then [1]", got)
		}
	})
}

// BenchmarkWork16 is Run with Config.Batch 16 and a no-op
// handler, one job per op: the loop's own cost over the root's BenchmarkClaimAckAll16
// (goroutines, keepers, the gathering of a batch's acks).
func BenchmarkWork16(b *testing.B) {
	f := newBTFake()
	q := btQueue(b, f)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var handled atomic.Int64
	n := int64(b.N)
	b.ReportAllocs()
	b.ResetTimer()
	err := Run(ctx, q, Config{Batch: 16, RetryForever: true}, func(context.Context, *inbox.Delivery) error {
		if handled.Add(1) >= n {
			cancel()
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}
