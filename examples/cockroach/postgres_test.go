package cockroach

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/optin"
)

// postgresDB opens the PostgreSQL server of INBOX_POSTGRES_DSN.
func postgresDB(t *testing.T) *sql.DB {
	t.Helper()
	dsn := optin.DSN(t, "INBOX_POSTGRES_DSN", "the run of the statements on PostgreSQL")
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestOnPostgres runs the dialect's statements on the PostgreSQL server of
// INBOX_POSTGRES_DSN, whose grammar they also fit. No CockroachDB server
// runs here: this shows the statements well formed, their parameters typed,
// and the tokens sound end to end (every settlement a compare-and-set, a
// drain by four workers acknowledging each job once), not what CockroachDB
// plans or how it retries. Its tables stand for Schema's, in PostgreSQL's
// types.
func TestOnPostgres(t *testing.T) {
	db := postgresDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const jobs, dead = "ex_crdb_jobs", "ex_crdb_jobs_dead"
	for _, s := range []string{
		"DROP TABLE IF EXISTS " + jobs + ", " + dead,
		"CREATE TABLE " + jobs + " (id bigserial PRIMARY KEY, attempt integer NOT NULL DEFAULT 1, locked_until timestamptz, payload bytea NOT NULL)",
		"CREATE TABLE " + dead + " (id bigint PRIMARY KEY, attempt integer NOT NULL, payload bytea NOT NULL)",
	} {
		if _, err := db.ExecContext(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	defer db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+jobs+", "+dead)
	q, err := inbox.New(db, inbox.Config{Dialect: Dialect, Lease: 30 * time.Second,
		Table: inbox.Table{Name: jobs, LockedUntil: "locked_until", DeadTable: dead}})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if _, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte("job")}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte("later")}, NotBefore: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	ds, err := q.Claim(ctx, 10)
	if err != nil || len(ds) != 3 {
		t.Fatalf("Claim(10) = %d deliveries, %v; want the 3 jobs due", len(ds), err)
	}
	before := ds[0].Expiry()
	if err := ds[0].Extend(ctx); err != nil || !ds[0].Expiry().After(before) {
		t.Fatalf("Extend = %v, expiry %v after %v", err, ds[0].Expiry(), before)
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatalf("Ack after Extend = %v", err)
	}
	if err := ds[1].Release(ctx); err != nil {
		t.Fatalf("Release = %v", err)
	}
	if err := ds[2].Retry(ctx, time.Hour); err != nil {
		t.Fatalf("Retry = %v", err)
	}
	if err := ds[2].Ack(ctx); !errors.Is(err, inbox.ErrSettled) {
		t.Fatalf("Ack after Retry = %v, want ErrSettled", err)
	}
	again, err := q.Claim(ctx, 10)
	if err != nil || len(again) != 1 || again[0].ID() != ds[1].ID() || again[0].Attempt() != 1 {
		t.Fatalf("Claim after Release = %d deliveries, %v; want the released job, attempt 1 again", len(again), err)
	}
	if err := again[0].Dead(ctx); err != nil {
		t.Fatalf("Dead = %v", err)
	}
	var left, moved int
	if err := db.QueryRowContext(ctx, "SELECT (SELECT count(*) FROM "+jobs+"), (SELECT count(*) FROM "+dead+" WHERE attempt = 1)").Scan(&left, &moved); err != nil {
		t.Fatal(err)
	}
	if left != 2 || moved != 1 {
		t.Fatalf("%d rows left (want 2: the retried and the later one), %d moved with attempt 1 (want 1)", left, moved)
	}

	// A drain by four workers: every job acknowledged once.
	if _, err := db.ExecContext(ctx, "DELETE FROM "+jobs); err != nil {
		t.Fatal(err)
	}
	const n = 200
	for i := 0; i < n; i++ {
		if _, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte("drain")}}); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	acked := map[any]int{}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				ds, err := q.Claim(ctx, 8)
				if err != nil {
					errs <- err
					return
				}
				if len(ds) == 0 {
					return
				}
				for _, d := range ds {
					if err := d.Ack(ctx); err != nil {
						errs <- err
						return
					}
					mu.Lock()
					acked[d.ID()]++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(acked) != n {
		t.Fatalf("%d jobs acknowledged, want %d", len(acked), n)
	}
	for id, k := range acked {
		if k != 1 {
			t.Fatalf("job %v acknowledged %d times", id, k)
		}
	}

	// The Batcher: the row values typed by PostgreSQL, every token matched.
	b, err := q.NewBatcher(inbox.BatchConfig{MaxBatch: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for i := 0; i < 10; i++ {
		if _, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte("batch")}}); err != nil {
			t.Fatal(err)
		}
	}
	if ds, err = q.Claim(ctx, 10); err != nil || len(ds) != 10 {
		t.Fatalf("Claim(10) = %d deliveries, %v", len(ds), err)
	}
	for i, err := range b.AckAll(ctx, ds[:9]) {
		if err != nil {
			t.Fatalf("AckAll: job %d: %v", i, err)
		}
	}
	if err := b.Release(ctx, ds[9]); err != nil {
		t.Fatalf("batched Release = %v", err)
	}
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+jobs+" WHERE locked_until IS NULL AND attempt = 1").Scan(&left); err != nil || left != 1 {
		t.Fatalf("%d released rows left (%v), want the one released", left, err)
	}
}

// TestLastErrorOnPostgres: the error text a Retry records comes back with
// the next claim, and a Dead without one moves the row's to the dead table.
func TestLastErrorOnPostgres(t *testing.T) {
	db := postgresDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const jobs, dead = "ex_crdb_errs", "ex_crdb_errs_dead"
	for _, s := range []string{
		"DROP TABLE IF EXISTS " + jobs + ", " + dead,
		"CREATE TABLE " + jobs + " (id bigserial PRIMARY KEY, attempt integer NOT NULL DEFAULT 1, locked_until timestamptz, payload bytea NOT NULL, last_error text)",
		"CREATE TABLE " + dead + " (id bigint PRIMARY KEY, attempt integer NOT NULL, payload bytea NOT NULL, last_error text)",
	} {
		if _, err := db.ExecContext(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	defer db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+jobs+", "+dead)
	q, err := inbox.New(db, inbox.Config{Dialect: Dialect, Lease: 30 * time.Second,
		Table: inbox.Table{Name: jobs, LockedUntil: "locked_until", DeadTable: dead, LastError: "last_error"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte("job")}}); err != nil {
		t.Fatal(err)
	}
	ds, err := q.Claim(ctx, 1)
	if err != nil || len(ds) != 1 || ds[0].LastError() != "" {
		t.Fatalf("Claim = %d, %v", len(ds), err)
	}
	ds[0].SetError(errors.New("boom"))
	if err := ds[0].Retry(ctx, 0); err != nil {
		t.Fatalf("Retry = %v", err)
	}
	if ds, err = q.Claim(ctx, 1); err != nil || len(ds) != 1 || ds[0].LastError() != "boom" {
		t.Fatalf("Claim after Retry = %d, %v; want the job with its error", len(ds), err)
	}
	if err := ds[0].Dead(ctx); err != nil {
		t.Fatalf("Dead = %v", err)
	}
	var text string
	if err := db.QueryRowContext(ctx, "SELECT last_error FROM "+dead).Scan(&text); err != nil || text != "boom" {
		t.Fatalf("dead job's error %q, %v; want the row's boom", text, err)
	}
}

// TestPriorityOnPostgres: the claim takes the highest priority first.
func TestPriorityOnPostgres(t *testing.T) {
	db := postgresDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const jobs = "ex_crdb_prio"
	for _, s := range []string{
		"DROP TABLE IF EXISTS " + jobs,
		"CREATE TABLE " + jobs + " (id bigserial PRIMARY KEY, attempt integer NOT NULL DEFAULT 1, locked_until timestamptz, " +
			"payload bytea NOT NULL, priority integer NOT NULL DEFAULT 0, enqueued_at timestamptz NOT NULL)",
	} {
		if _, err := db.ExecContext(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	defer db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+jobs)
	q, err := inbox.New(db, inbox.Config{Dialect: Dialect, Lease: 30 * time.Second,
		Table: inbox.Table{Name: jobs, LockedUntil: "locked_until", Priority: "priority", EnqueuedAt: "enqueued_at"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []int{1, 5, 3} {
		if _, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte("job")}, Priority: p}); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := q.Claim(ctx, 2)
	if err != nil || len(ds) != 2 {
		t.Fatalf("Claim(2) = %d, %v", len(ds), err)
	}
	got := map[int]bool{ds[0].Priority(): true, ds[1].Priority(): true}
	if !got[5] || !got[3] {
		t.Fatalf("claimed priorities %d and %d, want 5 and 3", ds[0].Priority(), ds[1].Priority())
	}
	// Stats: one ready, two in work, no dead table, and an age.
	st, err := q.Stats(ctx)
	if err != nil || st.Ready != 1 || st.InWork != 2 || st.Waiting != 0 || st.Dead != -1 || st.OldestReady <= 0 {
		t.Fatalf("Stats = %+v, %v; want 1 ready, 2 in work, no dead table, an age", st, err)
	}
}
