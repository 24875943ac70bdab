package inbox

// Allocation benchmarks of the hot path: a Claim, a plain settlement and a
// batched one, against the fake driver answering the Postgres lease statements
// from memory (fakedb.Lease), so what is counted is the
// package, database/sql and little else. The Raw benchmarks run the same
// statements through database/sql by hand: the floor under the package.
//
//	go test -bench . -benchmem -run '^$' .

import (
	"context"
	"github.com/sqlinbox/inbox/dialect"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/sqlinbox/inbox/internal/fakedb"
)

// btQueue is a lease queue on f, with the engine's clock.
func btQueue(tb testing.TB, f *fakedb.Lease) *Queue {
	q, err := New(f.DB(tb).DB, Config{Dialect: Postgres, Table: Table{Name: "jobs", LockedUntil: "locked_until"}})
	if err != nil {
		tb.Fatal(err)
	}
	return q
}

// claimJobs claims n jobs, 64 at a time, before a benchmark's timer starts.
func claimJobs(b *testing.B, q *Queue, n int) []*Delivery {
	ds := make([]*Delivery, 0, n+64)
	for len(ds) < n {
		got, err := q.Claim(context.Background(), 64)
		if err != nil {
			b.Fatal(err)
		}
		ds = append(ds, got...)
	}
	return ds[:n]
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
	f := fakedb.NewLease()
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
	f := fakedb.NewLease()
	q := btQueue(b, f)
	ctx := context.Background()
	ds := claimJobs(b, q, b.N)
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
	f := fakedb.NewLease()
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
	ds := claimJobs(b, q, 16*b.N)
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
	q := btQueue(b, fakedb.NewLease())
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
	ds := claimJobs(b, q, 16*b.N)
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

// BenchmarkRawAck16 is one statement acknowledging 16 tokens, its arguments
// bound as the Batcher binds them, the floor under BenchmarkBatcherAckAll16.
func BenchmarkRawAck16(b *testing.B) {
	f := fakedb.NewLease()
	q := btQueue(b, f)
	st, err := Postgres.(dialect.BatchDialect).BatchStatements(&q.names, 16)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	toks := make([]token, 16)
	b.ReportAllocs()
	b.ResetTimer()
	allocsPerJob(b, 16*b.N, func() {
		for i := 0; i < b.N; i++ {
			for k := range toks {
				toks[k] = token{id: int64(16*i + k), attempt: 1, expiry: f.Expiry}
			}
			args := q.args(st.Ack, &values{tokens: toks})
			rows, err := q.db.QueryContext(ctx, st.Ack.SQL, *args...)
			freeArgs(args)
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
	f := fakedb.NewLease()
	q := btQueue(b, f)
	s := q.st.Claim.Take.SQL
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
	f := fakedb.NewLease()
	q := btQueue(b, f)
	s := q.st.Settle.Ack.SQL
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	allocsPerJob(b, b.N, func() {
		for i := 0; i < b.N; i++ {
			if _, err := q.db.ExecContext(ctx, s, int64(i), int64(2), f.Expiry); err != nil {
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
