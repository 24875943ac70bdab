package cockroach

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/dialect"
)

// jobsTable is the description of Schema's tables.
var jobsTable = inbox.Table{Name: "jobs", LockedUntil: "locked_until", DeadTable: "jobs_dead"}

// The statements, exactly as the dialect writes them for jobsTable: with the
// engine's clock (the default), then with the caller's (Config.Now).
const (
	claimSQL = `UPDATE "jobs" SET "attempt" = "attempt" + 1, "locked_until" = statement_timestamp() + $1::INT8 * INTERVAL '1 microsecond' ` +
		`WHERE "id" IN (SELECT "id" FROM "jobs" WHERE "locked_until" IS NULL OR "locked_until" <= statement_timestamp() ` +
		`ORDER BY "id" LIMIT $2 FOR UPDATE SKIP LOCKED) AND ("locked_until" IS NULL OR "locked_until" <= statement_timestamp()) ` +
		`RETURNING "id", "attempt" - 1, "locked_until", "payload"`
	extendSQL = `UPDATE "jobs" SET "locked_until" = statement_timestamp() + $1::INT8 * INTERVAL '1 microsecond' ` +
		`WHERE "id" = $2 AND "attempt" = $3 AND "locked_until" = $4 RETURNING "locked_until"`
	ackSQL   = `DELETE FROM "jobs" WHERE "id" = $1 AND "attempt" = $2 AND "locked_until" = $3`
	retrySQL = `UPDATE "jobs" SET "locked_until" = statement_timestamp() + $1::INT8 * INTERVAL '1 microsecond' ` +
		`WHERE "id" = $2 AND "attempt" = $3 AND "locked_until" = $4`
	releaseSQL = `UPDATE "jobs" SET "locked_until" = NULL, "attempt" = "attempt" - 1 WHERE "id" = $1 AND "attempt" = $2 AND "locked_until" = $3`
	deadSQL    = `WITH gone AS (DELETE FROM "jobs" WHERE "id" = $1 AND "attempt" = $2 AND "locked_until" = $3 RETURNING "id", "payload") ` +
		`INSERT INTO "jobs_dead" ("id", "attempt", "payload") SELECT "id", $4::INT8, "payload" FROM gone`
	enqueueSQL     = `INSERT INTO "jobs" ("payload") VALUES ($1) RETURNING "id"`
	enqueueIDSQL   = `INSERT INTO "jobs" ("id", "payload") VALUES ($1, $2) RETURNING "id"`
	enqueueAtSQL   = `INSERT INTO "jobs" ("payload", "locked_until") VALUES ($1, $2) RETURNING "id"`
	enqueueIDAtSQL = `INSERT INTO "jobs" ("id", "payload", "locked_until") VALUES ($1, $2, $3) RETURNING "id"`

	claimCallerSQL = `UPDATE "jobs" SET "attempt" = "attempt" + 1, "locked_until" = $1 ` +
		`WHERE "id" IN (SELECT "id" FROM "jobs" WHERE "locked_until" IS NULL OR "locked_until" <= $2 ` +
		`ORDER BY "id" LIMIT $3 FOR UPDATE SKIP LOCKED) AND ("locked_until" IS NULL OR "locked_until" <= $4) ` +
		`RETURNING "id", "attempt" - 1, "locked_until", "payload"`
	extendCallerSQL = `UPDATE "jobs" SET "locked_until" = $1 WHERE "id" = $2 AND "attempt" = $3 AND "locked_until" = $4`
)

// TestStatements pins each statement's text, parameters and whether it
// returns rows, under both clocks.
func TestStatements(t *testing.T) {
	a := func(args ...dialect.Arg) []dialect.Arg { return args }
	data := dialect.ArgData
	for _, tc := range []struct {
		clock string
		now   func() time.Time
		want  map[string]dialect.Stmt
	}{
		{"engine", nil, map[string]dialect.Stmt{
			"Claim":       {SQL: claimSQL, Args: a(dialect.ArgMicros, dialect.ArgLimit), Rows: true},
			"Extend":      {SQL: extendSQL, Args: a(dialect.ArgMicros, dialect.ArgID, dialect.ArgAttempt, dialect.ArgExpiry), Rows: true},
			"Ack":         {SQL: ackSQL, Args: a(dialect.ArgID, dialect.ArgAttempt, dialect.ArgExpiry)},
			"Retry":       {SQL: retrySQL, Args: a(dialect.ArgMicros, dialect.ArgID, dialect.ArgAttempt, dialect.ArgExpiry)},
			"Release":     {SQL: releaseSQL, Args: a(dialect.ArgID, dialect.ArgAttempt, dialect.ArgExpiry)},
			"Dead":        {SQL: deadSQL, Args: a(dialect.ArgID, dialect.ArgAttempt, dialect.ArgExpiry, dialect.ArgDelivered)},
			"Enqueue":     {SQL: enqueueSQL, Args: a(data), Rows: true},
			"EnqueueID":   {SQL: enqueueIDSQL, Args: a(dialect.ArgID, data), Rows: true},
			"EnqueueAt":   {SQL: enqueueAtSQL, Args: a(data, dialect.ArgNotBefore), Rows: true},
			"EnqueueIDAt": {SQL: enqueueIDAtSQL, Args: a(dialect.ArgID, data, dialect.ArgNotBefore), Rows: true},
		}},
		{"caller", time.Now, map[string]dialect.Stmt{
			"Claim":  {SQL: claimCallerSQL, Args: a(dialect.ArgUntil, dialect.ArgNow, dialect.ArgLimit, dialect.ArgNow), Rows: true},
			"Extend": {SQL: extendCallerSQL, Args: a(dialect.ArgUntil, dialect.ArgID, dialect.ArgAttempt, dialect.ArgExpiry)},
			"Retry":  {SQL: extendCallerSQL, Args: a(dialect.ArgUntil, dialect.ArgID, dialect.ArgAttempt, dialect.ArgExpiry)},
			"Ack":    {SQL: ackSQL, Args: a(dialect.ArgID, dialect.ArgAttempt, dialect.ArgExpiry)},
		}},
	} {
		t.Run(tc.clock, func(t *testing.T) {
			q, err := inbox.New(&sql.DB{}, inbox.Config{Dialect: Dialect, Table: jobsTable, Now: tc.now})
			if err != nil {
				t.Fatal(err)
			}
			st := q.Statements()
			got := map[string]dialect.Stmt{
				"Claim": st.Claim.Take, "Extend": st.Settle.Extend, "Ack": st.Settle.Ack, "Retry": st.Settle.Retry,
				"Release": st.Settle.Release, "Dead": st.Settle.Dead, "Enqueue": st.Jobs.Enqueue, "EnqueueID": st.Jobs.EnqueueID,
				"EnqueueAt": st.Jobs.EnqueueAt, "EnqueueIDAt": st.Jobs.EnqueueIDAt,
			}
			for name, want := range tc.want {
				g := got[name]
				if g.SQL != want.SQL || g.Rows != want.Rows || !equalArgs(g.Args, want.Args) {
					t.Errorf("%s:\n got %q %v rows=%v\nwant %q %v rows=%v", name, g.SQL, g.Args, g.Rows, want.SQL, want.Args, want.Rows)
				}
			}
			// The two-statement forms are not used: every statement is one
			// implicit transaction, which CockroachDB may retry on its own.
			// Nor are the bounded claims: the claim is Take alone.
			if st.Claim.Select.SQL != "" || st.Claim.Mark.SQL != "" || st.Claim.TakeOne.SQL != "" || len(st.Claim.TakeBounded) != 0 ||
				st.Settle.DeadDelete.SQL != "" || st.Now.SQL != "" || st.Settle.Exists.SQL != "" {
				t.Errorf("unexpected statements: %+v", st)
			}
		})
	}
}

func equalArgs(a, b []dialect.Arg) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// newMockQueue is a lease queue of Schema's tables on sqlmock, matching SQL
// exactly, with the engine's clock and a 30 s lease.
func newMockQueue(t *testing.T) (*inbox.Queue, *sql.DB, sqlmock.Sqlmock) {
	t.Helper()
	db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	q, err := inbox.New(db, inbox.Config{Dialect: Dialect, Table: jobsTable, Lease: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return q, db, mock
}

const leaseMicros = int64(30 * time.Second / time.Microsecond)

// claimRows is a claim's answer: id, delivered attempt, stored expiry,
// payload.
func claimRows(id int64, delivered int, expiry time.Time, payload string) *sqlmock.Rows {
	return sqlmock.NewRows([]string{"id", "?column?", "locked_until", "payload"}).AddRow(id, delivered, expiry, []byte(payload))
}

// retryErr is CockroachDB's transaction retry error as pgx returns it.
var retryErr = &pgconn.PgError{Severity: "ERROR", Code: "40001", Message: "restart transaction: TransactionRetryWithProtoRefreshError: WriteTooOldError"}

// TestLifecycle runs a job through the queue on sqlmock: enqueue, a claim
// that CockroachDB made a retry victim and the queue sent again, an
// extension adopting the engine's new expiry, a retry, then a second
// delivery released, a third moved to the dead table, a fourth acked.
func TestLifecycle(t *testing.T) {
	q, db, mock := newMockQueue(t)
	ctx := context.Background()
	exp1 := time.Date(2025, 3, 14, 9, 27, 23, 123456000, time.UTC)
	exp2 := exp1.Add(20 * time.Second)

	mock.ExpectQuery(enqueueSQL).WithArgs([]byte("render 7")).WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(7)))
	id, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte("render 7")}})
	if err != nil || id != int64(7) {
		t.Fatalf("Enqueue = %v, %v", id, err)
	}

	// The claim: a retry error (40001) the first time, the rows the second.
	mock.ExpectQuery(claimSQL).WithArgs(leaseMicros, 1).WillReturnError(retryErr)
	mock.ExpectQuery(claimSQL).WithArgs(leaseMicros, 1).WillReturnRows(claimRows(7, 1, exp1, "render 7"))
	ds, err := q.Claim(ctx, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Claim = %d deliveries, %v; want 1 after the retry error was sent again", len(ds), err)
	}
	d := ds[0]
	var p []byte
	if err := d.Scan(&p); err != nil || string(p) != "render 7" || d.Attempt() != 1 || !d.Expiry().Equal(exp1) {
		t.Fatalf("delivery: %q attempt %d expiry %v, %v", p, d.Attempt(), d.Expiry(), err)
	}

	// Extend: compare-and-set on (7, 2, exp1); the engine's new expiry
	// becomes the token.
	mock.ExpectQuery(extendSQL).WithArgs(leaseMicros, int64(7), int64(2), exp1).
		WillReturnRows(sqlmock.NewRows([]string{"locked_until"}).AddRow(exp2))
	if err := d.Extend(ctx); err != nil || !d.Expiry().Equal(exp2) {
		t.Fatalf("Extend = %v, expiry %v; want %v", err, d.Expiry(), exp2)
	}
	// Retry in 5 s, on the new token.
	mock.ExpectExec(retrySQL).WithArgs(int64(5*time.Second/time.Microsecond), int64(7), int64(2), exp2).WillReturnResult(sqlmock.NewResult(0, 1))
	if err := d.Retry(ctx, 5*time.Second); err != nil {
		t.Fatalf("Retry = %v", err)
	}

	// Second delivery (attempt 2): released, which gives the attempt back.
	mock.ExpectQuery(claimSQL).WithArgs(leaseMicros, 1).WillReturnRows(claimRows(7, 2, exp1, "render 7"))
	mock.ExpectExec(releaseSQL).WithArgs(int64(7), int64(3), exp1).WillReturnResult(sqlmock.NewResult(0, 1))
	if ds, err = q.Claim(ctx, 1); err != nil || len(ds) != 1 {
		t.Fatalf("Claim = %d, %v", len(ds), err)
	}
	if err := ds[0].Release(ctx); err != nil {
		t.Fatalf("Release = %v", err)
	}

	// Third: to the dead table in one statement, with the delivered attempt.
	mock.ExpectQuery(claimSQL).WithArgs(leaseMicros, 1).WillReturnRows(claimRows(7, 2, exp1, "render 7"))
	mock.ExpectExec(deadSQL).WithArgs(int64(7), int64(3), exp1, int64(2)).WillReturnResult(sqlmock.NewResult(0, 1))
	if ds, err = q.Claim(ctx, 1); err != nil || len(ds) != 1 {
		t.Fatalf("Claim = %d, %v", len(ds), err)
	}
	if err := ds[0].Dead(ctx); err != nil {
		t.Fatalf("Dead = %v", err)
	}

	// Fourth: an ack that was a retry victim once, sent again.
	mock.ExpectQuery(claimSQL).WithArgs(leaseMicros, 1).WillReturnRows(claimRows(8, 1, exp1, "render 8"))
	mock.ExpectExec(ackSQL).WithArgs(int64(8), int64(2), exp1).WillReturnError(retryErr)
	mock.ExpectExec(ackSQL).WithArgs(int64(8), int64(2), exp1).WillReturnResult(sqlmock.NewResult(0, 1))
	if ds, err = q.Claim(ctx, 1); err != nil || len(ds) != 1 {
		t.Fatalf("Claim = %d, %v", len(ds), err)
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatalf("Ack = %v", err)
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Error(err)
	}
}

// TestLostLease: a settlement whose token the row no longer carries
// changed nothing and says so.
func TestLostLease(t *testing.T) {
	q, _, mock := newMockQueue(t)
	ctx := context.Background()
	exp := time.Date(2025, 3, 14, 9, 27, 23, 0, time.UTC)
	mock.ExpectQuery(claimSQL).WithArgs(leaseMicros, 1).WillReturnRows(claimRows(9, 1, exp, "x"))
	mock.ExpectExec(ackSQL).WithArgs(int64(9), int64(2), exp).WillReturnResult(sqlmock.NewResult(0, 0))
	ds, err := q.Claim(ctx, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Claim = %d, %v", len(ds), err)
	}
	if err := ds[0].Ack(ctx); !errors.Is(err, inbox.ErrLeaseLost) {
		t.Fatalf("Ack = %v, want ErrLeaseLost", err)
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Error(err)
	}
}

// TestAmbiguous: an ambiguous result (40003) may have committed, so the
// queue does not send the claim again; the driver's error comes back.
func TestAmbiguous(t *testing.T) {
	q, _, mock := newMockQueue(t)
	ambiguous := &pgconn.PgError{Severity: "ERROR", Code: "40003", Message: "result is ambiguous"}
	mock.ExpectQuery(claimSQL).WithArgs(leaseMicros, 1).WillReturnError(ambiguous)
	_, err := q.Claim(context.Background(), 1)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "40003" {
		t.Fatalf("Claim = %v, want the 40003 error", err)
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Error(err)
	}
}

func TestIsDeadlock(t *testing.T) {
	d := Dialect.(dialect.DeadlockDetector)
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{retryErr, true},
		{&pgconn.PgError{Code: "40003"}, false},
		{&pgconn.PgError{Code: "40P01"}, false}, // PostgreSQL's deadlock: CockroachDB reports its own as 40001
		{errors.New("pq: restart transaction: TransactionRetryWithProtoRefreshError"), true},
		{errors.New("connection reset by peer"), false},
	} {
		if got := d.IsDeadlock(tc.err); got != tc.want {
			t.Errorf("IsDeadlock(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestRefusals: the forms CockroachDB cannot hold, and the optional columns
// these statements do not write, are refused at New, naming what to use.
func TestRefusals(t *testing.T) {
	for _, tc := range []struct {
		table inbox.Table
		cfg   inbox.Config
		want  []string
	}{
		{inbox.Table{Name: "jobs"}, inbox.Config{}, []string{"row-lock form", "best-effort", "lease form"}},
		{inbox.Table{Name: "jobs", AdvisoryKey: "id"}, inbox.Config{}, []string{"advisory form", "#13546", "lease form"}},
		{inbox.Table{Name: "jobs", LockedUntil: "locked_until"}, inbox.Config{NotifyChannel: "jobs"}, []string{"NotifyChannel"}},
	} {
		cfg := tc.cfg
		cfg.Dialect, cfg.Table = Dialect, tc.table
		_, err := inbox.New(&sql.DB{}, cfg)
		if err == nil {
			t.Errorf("New(%+v) succeeded", tc.table)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("New(%+v) = %q, which does not name %q", tc.table, err, w)
			}
		}
	}
}

// TestCheckSchema feeds the check each server's version() and the table's
// columns.
func TestCheckSchema(t *testing.T) {
	const (
		versionSQL = "SELECT version()"
		columnsSQL = "SELECT column_name, data_type FROM information_schema.columns " +
			"WHERE table_schema = COALESCE(NULLIF($1, ''), current_schema()) AND table_name = $2"
		crdb = "CockroachDB CCL v23.1.11 (x86_64-pc-linux-gnu, built 2023/09/27 01:53:43, go1.19.10)"
	)
	cols := func(lease string) *sqlmock.Rows {
		r := sqlmock.NewRows([]string{"column_name", "data_type"}).AddRow("id", "bigint").AddRow("attempt", "integer").AddRow("payload", "bytea")
		if lease != "" {
			r.AddRow("locked_until", lease)
		}
		return r
	}
	deadCols := func() *sqlmock.Rows {
		return sqlmock.NewRows([]string{"column_name", "data_type"}).AddRow("id", "bigint").AddRow("attempt", "integer").AddRow("payload", "bytea")
	}
	for _, tc := range []struct {
		name    string
		version string
		lease   string
		want    string // a word of the one problem; empty for none
	}{
		{"cockroach", crdb, "timestamp with time zone", ""},
		{"too old", "CockroachDB CCL v22.1.22 (x86_64-pc-linux-gnu)", "timestamp with time zone", "older than v22.2"},
		{"postgres", "PostgreSQL 15.20 (Debian 15.20-0+deb12u1) on x86_64-pc-linux-gnu", "timestamp with time zone", "not CockroachDB"},
		{"no lease column", crdb, "", "no column locked_until"},
		{"timestamp", crdb, "timestamp without time zone", "want TIMESTAMPTZ"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, _, mock := newMockQueue(t)
			mock.ExpectQuery(versionSQL).WithoutArgs().WillReturnRows(sqlmock.NewRows([]string{"version"}).AddRow(tc.version))
			mock.ExpectQuery(columnsSQL).WithArgs("", "jobs").WillReturnRows(cols(tc.lease))
			mock.ExpectQuery(columnsSQL).WithArgs("", "jobs_dead").WillReturnRows(deadCols())
			err := q.CheckSchema(context.Background())
			if err := mock.ExpectationsWereMet(); err != nil {
				t.Error(err)
			}
			if tc.want == "" {
				if err != nil {
					t.Fatalf("CheckSchema = %v", err)
				}
				return
			}
			var se *inbox.SchemaError
			if !errors.As(err, &se) || len(se.Problems) != 1 || !strings.Contains(se.Problems[0], tc.want) {
				t.Fatalf("CheckSchema = %v, want one problem naming %q", err, tc.want)
			}
		})
	}
}

// TestBatch: the Batcher settles the claimed jobs in one statement each,
// every row a compare-and-set on its token, each delivery its own result.
func TestBatch(t *testing.T) {
	q, _, mock := newMockQueue(t)
	ctx := context.Background()
	exp := time.Date(2025, 3, 14, 9, 27, 23, 0, time.UTC)
	b, err := q.NewBatcher(inbox.BatchConfig{MaxBatch: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	mock.ExpectQuery(claimSQL).WithArgs(leaseMicros, 3).WillReturnRows(claimRows(1, 1, exp, "a").AddRow(int64(2), int64(1), exp, []byte("b")).
		AddRow(int64(3), int64(1), exp, []byte("c")))
	ds, err := q.Claim(ctx, 3)
	if err != nil || len(ds) != 3 {
		t.Fatalf("Claim = %d, %v", len(ds), err)
	}
	mock.ExpectQuery(`DELETE FROM "jobs" WHERE ("id", "attempt", "locked_until") IN (($1, $2, $3), ($4, $5, $6)) RETURNING "id"`).
		WithArgs(int64(1), int64(2), exp, int64(2), int64(2), exp).WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(1)))
	errs := b.AckAll(ctx, ds[:2])
	if errs[0] != nil || !errors.Is(errs[1], inbox.ErrLeaseLost) {
		t.Fatalf("AckAll = %v, want nil and ErrLeaseLost", errs)
	}
	mock.ExpectQuery(`UPDATE "jobs" SET "locked_until" = statement_timestamp() + $1::INT8 * INTERVAL '1 microsecond' `+
		`WHERE ("id", "attempt", "locked_until") IN (($2, $3, $4)) RETURNING "id"`).
		WithArgs(int64(time.Minute/time.Microsecond), int64(3), int64(2), exp).WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(3)))
	if err := b.Retry(ctx, ds[2], time.Minute); err != nil {
		t.Fatalf("Retry = %v", err)
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Error(err)
	}
}

// TestLastError: with Table.LastError a claim returns the text, a Retry or
// Dead writes the one the handler recorded (SetError) and keeps the row's
// without one.
func TestLastError(t *testing.T) {
	db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	table := jobsTable
	table.LastError = "last_error"
	q, err := inbox.New(db, inbox.Config{Dialect: Dialect, Table: table, Lease: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	exp := time.Date(2025, 3, 14, 9, 27, 23, 0, time.UTC)
	claim := strings.Replace(claimSQL, `"payload"`, `"payload", "last_error"`, 1)
	mock.ExpectQuery(claim).WithArgs(leaseMicros, 1).WillReturnRows(sqlmock.NewRows([]string{"id", "attempt", "locked_until", "payload", "last_error"}).
		AddRow(int64(7), int64(1), exp, []byte("x"), "boom"))
	ds, err := q.Claim(ctx, 1)
	if err != nil || len(ds) != 1 || ds[0].LastError() != "boom" {
		t.Fatalf("Claim = %d, %v; want job 7 with its last error", len(ds), err)
	}
	mock.ExpectExec(`UPDATE "jobs" SET "locked_until" = statement_timestamp() + $1::INT8 * INTERVAL '1 microsecond', `+
		`"last_error" = COALESCE($2::TEXT, "last_error") WHERE "id" = $3 AND "attempt" = $4 AND "locked_until" = $5`).
		WithArgs(int64(time.Second/time.Microsecond), "again", int64(7), int64(2), exp).WillReturnResult(sqlmock.NewResult(0, 1))
	ds[0].SetError(errors.New("again"))
	if err := ds[0].Retry(ctx, time.Second); err != nil {
		t.Fatalf("Retry = %v", err)
	}
	mock.ExpectQuery(claim).WithArgs(leaseMicros, 1).WillReturnRows(sqlmock.NewRows([]string{"id", "attempt", "locked_until", "payload", "last_error"}).
		AddRow(int64(7), int64(2), exp, []byte("x"), "again"))
	mock.ExpectExec(`WITH gone AS (DELETE FROM "jobs" WHERE "id" = $1 AND "attempt" = $2 AND "locked_until" = $3 RETURNING "id", "payload", "last_error") `+
		`INSERT INTO "jobs_dead" ("id", "attempt", "payload", "last_error") SELECT "id", $4::INT8, "payload", COALESCE($5::TEXT, "last_error") FROM gone`).
		WithArgs(int64(7), int64(3), exp, int64(2), nil).WillReturnResult(sqlmock.NewResult(0, 1))
	if ds, err = q.Claim(ctx, 1); err != nil || len(ds) != 1 {
		t.Fatalf("Claim = %d, %v", len(ds), err)
	}
	if err := ds[0].Dead(ctx); err != nil {
		t.Fatalf("Dead = %v", err)
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Error(err)
	}
}

// TestPriority: with Table.Priority and Table.EnqueuedAt, Enqueue writes
// the job's priority and the clock, and a claim takes the highest first and
// returns the priority.
func TestPriority(t *testing.T) {
	db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	table := jobsTable
	table.Priority, table.EnqueuedAt = "priority", "enqueued_at"
	q, err := inbox.New(db, inbox.Config{Dialect: Dialect, Table: table, Lease: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	mock.ExpectQuery(`INSERT INTO "jobs" ("payload", "priority", "enqueued_at") VALUES ($1, $2, statement_timestamp()) RETURNING "id"`).
		WithArgs([]byte("x"), int64(5)).WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(7)))
	if _, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte("x")}, Priority: 5}); err != nil {
		t.Fatalf("Enqueue = %v", err)
	}
	claim := strings.Replace(claimSQL, `ORDER BY "id"`, `ORDER BY "priority" DESC, "id"`, 1)
	claim = strings.Replace(claim, `"payload"`, `"payload", "priority"`, 1)
	exp := time.Date(2025, 3, 14, 9, 27, 23, 0, time.UTC)
	mock.ExpectQuery(claim).WithArgs(leaseMicros, 1).WillReturnRows(sqlmock.NewRows([]string{"id", "attempt", "locked_until", "payload", "priority"}).
		AddRow(int64(7), int64(1), exp, []byte("x"), int64(5)))
	ds, err := q.Claim(ctx, 1)
	if err != nil || len(ds) != 1 || ds[0].Priority() != 5 {
		t.Fatalf("Claim = %d, %v; want job 7 with priority 5", len(ds), err)
	}
	until := `statement_timestamp() + $%d::INT8 * INTERVAL '1 microsecond'`
	ready := `"locked_until" IS NULL OR "locked_until" <= statement_timestamp()`
	mock.ExpectQuery(`SELECT (SELECT count(*) FROM "jobs" WHERE `+ready+`), `+
		`(SELECT count(*) FROM "jobs" WHERE "locked_until" > `+fmt.Sprintf(until, 1)+`), `+
		`(SELECT count(*) FROM "jobs" WHERE "locked_until" > statement_timestamp() AND "locked_until" <= `+fmt.Sprintf(until, 2)+`), `+
		`(SELECT count(*) FROM "jobs_dead"), `+
		`CAST(EXTRACT(EPOCH FROM (statement_timestamp() - (SELECT min("enqueued_at") FROM "jobs" WHERE `+ready+`))) * 1000000 AS INT8)`).
		WithArgs(leaseMicros, leaseMicros).WillReturnRows(sqlmock.NewRows([]string{"r", "w", "i", "d", "a"}).AddRow(1, 0, 2, 0, 1500))
	if st, err := q.Stats(ctx); err != nil || st.Ready != 1 || st.InWork != 2 || st.OldestReady != 1500*time.Microsecond {
		t.Fatalf("Stats = %+v, %v", st, err)
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Error(err)
	}
}
