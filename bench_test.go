package inbox

// Allocation benchmarks of the hot path: a Claim, a plain settlement and a
// batched one, against a tiny in-memory driver (btFake) that answers the
// Postgres lease statements with canned rows, so what is counted is the
// package, database/sql and little else. The Raw benchmarks run the same
// statements through database/sql by hand: the floor under the package.
//
//	go test -bench . -benchmem -run '^$' .

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// btFake is a database/sql connector whose connections answer the lease
// statements of the Postgres dialect from memory: a claim returns as many
// rows as its limit, a batch Ack returns the ids it was given, a plain
// settlement affects one row. When block is set, a query (but an UPDATE: a
// lease extension) signals on it and waits for its context to end; an
// UPDATE query is refused. seen, when set, sees each query first.
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
	if c.f.block != nil && !strings.HasPrefix(query, "UPDATE") {
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
func btQueue(tb testing.TB, f *btFake) *Queue {
	q, err := New(f.db(tb), Config{Dialect: Postgres, Table: Table{Name: "jobs", LockedUntil: "locked_until"}})
	if err != nil {
		tb.Fatal(err)
	}
	return q
}

// allocsPerJob reports a custom metric: heap allocations per job, over the
// timed part of the benchmark.
func allocsPerJob(b *testing.B, jobs int, run func()) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	run()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.Mallocs-before.Mallocs)/float64(jobs), "allocs/job")
}

func benchClaim(b *testing.B, n int) {
	f := newBTFake()
	q := btQueue(b, f)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	allocsPerJob(b, b.N*n, func() {
		for i := 0; i < b.N; i++ {
			ds, err := q.Claim(ctx, n)
			if err != nil || len(ds) != n {
				b.Fatal(len(ds), err)
			}
		}
	})
}

// BenchmarkClaim1 and BenchmarkClaim16 count a lease Claim of 1 and of 16
// jobs (one statement each).
func BenchmarkClaim1(b *testing.B)  { benchClaim(b, 1) }
func BenchmarkClaim16(b *testing.B) { benchClaim(b, 16) }

// BenchmarkAck counts a plain lease Ack (one statement).
func BenchmarkAck(b *testing.B) {
	f := newBTFake()
	q := btQueue(b, f)
	ctx := context.Background()
	ds := make([]*Delivery, 0, b.N)
	for len(ds) < b.N {
		got, err := q.Claim(ctx, 64)
		if err != nil {
			b.Fatal(err)
		}
		ds = append(ds, got...)
	}
	ds = ds[:b.N]
	b.ReportAllocs()
	b.ResetTimer()
	allocsPerJob(b, b.N, func() {
		for _, d := range ds {
			if err := d.Ack(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkBatcherAck16 counts 16 Acks from 16 goroutines through a
// Batcher, flushed as one statement (MaxBatch 16, a MaxWait long enough to
// fill it): allocs/op is per 16 jobs, allocs/job per job.
func BenchmarkBatcherAck16(b *testing.B) {
	f := newBTFake()
	q := btQueue(b, f)
	bt, err := q.NewBatcher(BatchConfig{MaxBatch: 16, MaxWait: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	defer bt.Close()
	ctx := context.Background()
	work := make(chan *Delivery)
	var done sync.WaitGroup
	errs := make(chan error, 16)
	for w := 0; w < 16; w++ {
		go func() {
			for d := range work {
				if err := bt.Ack(ctx, d); err != nil {
					errs <- err
				}
				done.Done()
			}
		}()
	}
	defer close(work)
	ds := make([]*Delivery, 0, 16*b.N)
	for len(ds) < 16*b.N {
		got, err := q.Claim(ctx, 64)
		if err != nil {
			b.Fatal(err)
		}
		ds = append(ds, got...)
	}
	b.ReportAllocs()
	b.ResetTimer()
	allocsPerJob(b, 16*b.N, func() {
		for i := 0; i < b.N; i++ {
			done.Add(16)
			for _, d := range ds[16*i : 16*i+16] {
				work <- d
			}
			done.Wait()
		}
	})
	b.StopTimer()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
}

// btQueueBatcher16 returns a lease queue on the fake and a Batcher of 16 on
// it, closed with the benchmark.
func btQueueBatcher16(b *testing.B) (*Queue, *Batcher) {
	q := btQueue(b, newBTFake())
	bt, err := q.NewBatcher(BatchConfig{MaxBatch: 16})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(bt.Close)
	return q, bt
}

// BenchmarkBatcherAckAll16 counts one AckAll of the 16 jobs of a claim:
// allocs/op is per 16 jobs, allocs/job per job.
func BenchmarkBatcherAckAll16(b *testing.B) {
	q, bt := btQueueBatcher16(b)
	ctx := context.Background()
	ds := make([]*Delivery, 0, 16*b.N)
	for len(ds) < 16*b.N {
		got, err := q.Claim(ctx, 64)
		if err != nil {
			b.Fatal(err)
		}
		ds = append(ds, got...)
	}
	b.ReportAllocs()
	b.ResetTimer()
	allocsPerJob(b, 16*b.N, func() {
		for i := 0; i < b.N; i++ {
			for _, err := range bt.AckAll(ctx, ds[16*i:16*i+16]) {
				if err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}

// BenchmarkRawAck16 is one statement acknowledging 16 tokens by hand, the
// floor under BenchmarkBatcherAckAll16.
func BenchmarkRawAck16(b *testing.B) {
	f := newBTFake()
	q := btQueue(b, f)
	st, err := Postgres.(BatchDialect).BatchStatements(&q.names, 16)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	args := make([]any, 0, 48)
	b.ReportAllocs()
	b.ResetTimer()
	allocsPerJob(b, 16*b.N, func() {
		for i := 0; i < b.N; i++ {
			args = args[:0]
			for k := 0; k < 16; k++ {
				args = append(args, int64(16*i+k), int64(2), f.expiry)
			}
			rows, err := q.db.QueryContext(ctx, st.Ack.SQL, args...)
			if err != nil {
				b.Fatal(err)
			}
			for rows.Next() {
				var id int64
				if err := rows.Scan(&id); err != nil {
					b.Fatal(err)
				}
			}
			rows.Close()
		}
	})
}

// BenchmarkRawClaim1, BenchmarkRawClaim16 and BenchmarkRawAck are the
// floor: the same statements through database/sql by hand, scanning into
// typed variables.
func BenchmarkRawClaim1(b *testing.B)  { benchRawClaim(b, 1) }
func BenchmarkRawClaim16(b *testing.B) { benchRawClaim(b, 16) }

func benchRawClaim(b *testing.B, n int) {
	f := newBTFake()
	q := btQueue(b, f)
	s := q.st.Claim.SQL
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	allocsPerJob(b, n*b.N, func() {
		for i := 0; i < b.N; i++ {
			rows, err := q.db.QueryContext(ctx, s, int64(n), int64(n), int64(n), int64(30000000))
			if err != nil {
				b.Fatal(err)
			}
			var id, attempt int64
			var lu time.Time
			var payload []byte
			for rows.Next() {
				if err := rows.Scan(&id, &attempt, &lu, &payload); err != nil {
					b.Fatal(err)
				}
			}
			rows.Close()
		}
	})
}

func BenchmarkRawAck(b *testing.B) {
	f := newBTFake()
	q := btQueue(b, f)
	s := q.st.Ack.SQL
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	allocsPerJob(b, b.N, func() {
		for i := 0; i < b.N; i++ {
			if _, err := q.db.ExecContext(ctx, s, int64(i), int64(2), f.expiry); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkClaimAckAll16 is the loop Work replaces, batches of 16: Claim
// and one Batcher.AckAll, one job per op.
func BenchmarkClaimAckAll16(b *testing.B) {
	q, bt := btQueueBatcher16(b)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; {
		ds, err := q.Claim(ctx, 16)
		if err != nil {
			b.Fatal(err)
		}
		for _, err := range bt.AckAll(ctx, ds) {
			if err != nil {
				b.Fatal(err)
			}
		}
		done += len(ds)
	}
}
