package inbox

// Unit tests of the Batcher: sqlmock (exact SQL) pins the batch statements
// of every engine and the way each caller gets its own verdict; the fake
// driver's lease answers (fakedb.Lease) block a statement for the
// cancellation test and serve the concurrency and cancellation stress tests. The tests live
// inside the package so that they can wait for a settlement to be pending
// (Batcher.pending) instead of sleeping; everything they check is public
// behaviour.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"math/rand"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqlinbox/inbox/internal/fakeclock"
	"github.com/sqlinbox/inbox/internal/fakedb"
)

// btNow is the injected clock; btExp a lease expiry after it.
var (
	btNow = time.Date(2024, 3, 1, 12, 0, 0, 123456000, time.UTC)
	btExp = btNow.Add(30 * time.Second)
)

var btLease = Table{Name: "jobs", LockedUntil: "locked_until"}

// btMock returns a database on the fake driver and its sqlmock.
func btMock(t *testing.T) (*sql.DB, sqlmock.Sqlmock) {
	t.Helper()
	m := fakedb.New(t)
	return m.DB, m.Sqlmock
}

// btNew returns a lease queue on db; callerClock injects btNow as Config.Now.
func btNew(t *testing.T, db *sql.DB, d Dialect, callerClock bool) *Queue {
	t.Helper()
	cfg := Config{Dialect: d, Table: btLease}
	if callerClock {
		cfg.Now = func() time.Time { return btNow }
	}
	q, err := New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func btBatcher(t *testing.T, q *Queue, cfg BatchConfig) *Batcher {
	t.Helper()
	b, err := q.NewBatcher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b
}

// btDel is a lease delivery as a claim would have made it: delivered
// attempt, stored attempt+1, expiry as stored.
func btDel(q *Queue, id any, attempt int64, expiry time.Time) *Delivery {
	return &Delivery{q: q, id: id, attempt: attempt, lease: leaseHold{expiry: expiry}, data: []any{[]byte("p")}}
}

func btPending(b *Batcher) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.pending)
}

// btStart runs settle in a goroutine and waits until the batcher holds one
// more pending settlement (or the goroutine returned), so that settlements
// enter the batch in the order they are started.
func btStart(t *testing.T, b *Batcher, settle func() error) <-chan error {
	t.Helper()
	before := btPending(b)
	res := make(chan error, 1)
	go func() { res <- settle() }()
	deadline := time.Now().Add(10 * time.Second)
	for btPending(b) <= before {
		if len(res) > 0 {
			return res
		}
		if time.Now().After(deadline) {
			t.Fatal("the settlement never became pending")
		}
		runtime.Gosched()
		time.Sleep(100 * time.Microsecond)
	}
	return res
}

// btWait returns the result of a settlement, failing the test if it takes
// longer than a generous deadline.
func btWait(t *testing.T, res <-chan error) error {
	t.Helper()
	select {
	case err := <-res:
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("settlement did not return")
		return nil
	}
}

func btWant(t *testing.T, what string, err, want error) {
	t.Helper()
	if want == nil && err != nil || want != nil && !errors.Is(err, want) {
		t.Fatalf("%s: got %v, want %v", what, err, want)
	}
}

func btMet(t *testing.T, sm sqlmock.Sqlmock) {
	t.Helper()
	if err := sm.ExpectationsWereMet(); err != nil {
		t.Fatal(err)
	}
}

// pgBatchWhere is the Postgres batch statements' condition: the tokens as
// three arrays, the ids named twice by one parameter (the $n after it
// counting on).
func pgBatchWhere(n int) string {
	p := func(k int) string { return fmt.Sprintf("$%d", n+k) }
	return `"id" = ANY (` + p(0) + `) AND ("id", "attempt", "locked_until") IN (SELECT * FROM unnest(` + p(0) +
		`, CAST(` + p(1) + ` AS bigint[]), CAST(` + p(2) + ` AS timestamptz[])))`
}

// pgBatchArgs are the arrays of pgBatchWhere: ids, stored attempts,
// expiries (UTC, microseconds).
func pgBatchArgs(ids, attempts, expiries string) []driver.Value {
	return []driver.Value{ids, attempts, expiries}
}

// btExps is the expiries' array of n tokens expiring at btExp.
func btExps(n int) string {
	return "{" + strings.TrimSuffix(strings.Repeat(`"2024-03-01 12:00:30.123456+00",`, n), ",") + "}"
}

// A batch of any size is one statement of three arrays, one place per
// token; the ids returned name the jobs acknowledged, and the others lost
// their leases. Every delivery is finished: settling again changes nothing.
func TestBatchAckPostgresArrays(t *testing.T) {
	db, sm := btMock(t)
	q := btNew(t, db, Postgres, false)
	b := btBatcher(t, q, BatchConfig{MaxBatch: 8, MaxWait: time.Hour})
	e3 := btExp.Add(time.Microsecond)
	ds := []*Delivery{btDel(q, int64(1), 1, btExp), btDel(q, int64(2), 1, btExp), btDel(q, int64(3), 2, e3)}
	sm.ExpectQuery(`DELETE FROM "jobs" WHERE ` + pgBatchWhere(1) + ` RETURNING "id"`).
		WithArgs(pgBatchArgs("{1,2,3}", "{2,2,3}",
			`{"2024-03-01 12:00:30.123456+00","2024-03-01 12:00:30.123456+00","2024-03-01 12:00:30.123457+00"}`)...).
		WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(1)).AddRow(int64(3)))
	var res []<-chan error
	for _, d := range ds {
		d := d
		res = append(res, btStart(t, b, func() error { return b.Ack(context.Background(), d) }))
	}
	b.Close() // sends what is pending: three tokens, under MaxBatch
	btWant(t, "ack 1", btWait(t, res[0]), nil)
	btWant(t, "ack 2 (stale)", btWait(t, res[1]), ErrLeaseLost)
	btWant(t, "ack 3", btWait(t, res[2]), nil)
	for i, d := range ds {
		btWant(t, "ack again "+string(rune('1'+i)), d.Ack(context.Background()), ErrSettled)
	}
	btWant(t, "after Close", b.Ack(context.Background(), btDel(q, int64(4), 1, btExp)), ErrBatcherClosed)
	btMet(t, sm)
}

// The arrays are text that the server reads whatever the session's time
// zone: an expiry given in another zone is written in UTC with its offset,
// to the microsecond; text ids are quoted, their quotes and backslashes
// escaped.
func TestPgTokenArray(t *testing.T) {
	east := time.FixedZone("UTC+05:30", 5*3600+1800)
	toks := []token{
		{id: `a"b\c`, attempt: 1, expiry: time.Date(2024, 3, 1, 17, 30, 0, 1000, east)},
		{id: "d,e} f", attempt: 41, expiry: time.Date(2024, 3, 1, 12, 0, 0, 999999000, time.UTC)},
	}
	for _, c := range []struct {
		a    dialect.Arg
		want string
	}{
		{dialect.ArgIDs, `{"a\"b\\c","d,e} f"}`},
		{dialect.ArgAttempts, "{2,42}"},
		{dialect.ArgExpiries, `{"2024-03-01 12:00:00.000001+00","2024-03-01 12:00:00.999999+00"}`},
	} {
		if got := pgTokenArray(c.a, toks, token{}); got != c.want {
			t.Errorf("arg %d: got %s, want %s", c.a, got, c.want)
		}
	}
	if got := pgTokenArray(dialect.ArgIDs, nil, token{id: int64(-7)}); got != "{-7}" {
		t.Errorf("the single token: got %s, want {-7}", got)
	}
}

// Text ids come back as bytes from some drivers: they are matched as text.
func TestBatchAckTextIDs(t *testing.T) {
	db, sm := btMock(t)
	q := btNew(t, db, Postgres, true)
	b := btBatcher(t, q, BatchConfig{MaxBatch: 2, MaxWait: time.Hour})
	sm.ExpectQuery(`DELETE FROM "jobs" WHERE ` + pgBatchWhere(1) + ` RETURNING "id"`).
		WithArgs(pgBatchArgs(`{"a","b"}`, "{2,2}", `{"2024-03-01 12:00:30.123456+00","2024-03-01 12:00:30.123456+00"}`)...).
		WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow([]byte("b")))
	ra := btStart(t, b, func() error { return b.Ack(context.Background(), btDel(q, "a", 1, btExp)) })
	rb := btStart(t, b, func() error { return b.Ack(context.Background(), btDel(q, "b", 1, btExp)) })
	btWant(t, "ack a", btWait(t, ra), ErrLeaseLost)
	btWant(t, "ack b", btWait(t, rb), nil)
	btMet(t, sm)
}

// SQLite tests each token by rowid in an OR, and times are its fixed text.
func TestBatchAckSQLite(t *testing.T) {
	db, sm := btMock(t)
	q := btNew(t, db, SQLite, false)
	b := btBatcher(t, q, BatchConfig{MaxBatch: 2, MaxWait: time.Hour})
	sm.ExpectQuery("DELETE FROM `jobs` WHERE (`id` = ? AND `attempt` = ? AND `locked_until` = ?) OR (`id` = ? AND `attempt` = ? AND `locked_until` = ?) RETURNING `id`").
		WithArgs(int64(5), int64(2), "2024-03-01T12:00:30.123456Z", int64(6), int64(4), "2024-03-01T12:00:30.123456Z").
		WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(5)).AddRow(int64(6)))
	r5 := btStart(t, b, func() error { return b.Ack(context.Background(), btDel(q, int64(5), 1, btExp)) })
	r6 := btStart(t, b, func() error { return b.Ack(context.Background(), btDel(q, int64(6), 3, btExp)) })
	btWant(t, "ack 5", btWait(t, r5), nil)
	btWant(t, "ack 6", btWait(t, r6), nil)
	btMet(t, sm)
}

const btMySQLAck2 = "DELETE FROM `jobs` WHERE (`id`, `attempt`, `locked_until`) IN ((?, ?, ?), (?, ?, ?))"

// MySQL: one DELETE in a transaction; when it deleted a row per token,
// every token matched and it commits.
func TestBatchAckMySQL(t *testing.T) {
	db, sm := btMock(t)
	q := btNew(t, db, MySQL, false)
	b := btBatcher(t, q, BatchConfig{MaxBatch: 2, MaxWait: time.Hour})
	sm.ExpectBegin()
	sm.ExpectExec(btMySQLAck2).
		WithArgs(int64(1), int64(2), "2024-03-01 12:00:30.123456", int64(2), int64(2), "2024-03-01 12:00:30.123456").
		WillReturnResult(sqlmock.NewResult(0, 2))
	sm.ExpectCommit()
	r1 := btStart(t, b, func() error { return b.Ack(context.Background(), btDel(q, int64(1), 1, btExp)) })
	r2 := btStart(t, b, func() error { return b.Ack(context.Background(), btDel(q, int64(2), 1, btExp)) })
	btWant(t, "ack 1", btWait(t, r1), nil)
	btWant(t, "ack 2", btWait(t, r2), nil)
	btMet(t, sm)
}

// MySQL, a stale token: the DELETE falls short, rolls back, and the tokens
// still in place are locked and named before the DELETE runs again.
func TestBatchAckMySQLStale(t *testing.T) {
	db, sm := btMock(t)
	q := btNew(t, db, MySQL, false)
	b := btBatcher(t, q, BatchConfig{MaxBatch: 2, MaxWait: time.Hour})
	args := []driver.Value{int64(1), int64(2), "2024-03-01 12:00:30.123456", int64(2), int64(2), "2024-03-01 12:00:30.123456"}
	sm.ExpectBegin()
	sm.ExpectExec(btMySQLAck2).WithArgs(args...).WillReturnResult(sqlmock.NewResult(0, 1))
	sm.ExpectRollback()
	sm.ExpectBegin()
	sm.ExpectQuery("SELECT `id` FROM `jobs` WHERE (`id`, `attempt`, `locked_until`) IN ((?, ?, ?), (?, ?, ?)) FOR UPDATE").
		WithArgs(args...).WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(2)))
	sm.ExpectExec(btMySQLAck2).WithArgs(args...).WillReturnResult(sqlmock.NewResult(0, 1))
	sm.ExpectCommit()
	r1 := btStart(t, b, func() error { return b.Ack(context.Background(), btDel(q, int64(1), 1, btExp)) })
	r2 := btStart(t, b, func() error { return b.Ack(context.Background(), btDel(q, int64(2), 1, btExp)) })
	btWant(t, "ack 1 (stale)", btWait(t, r1), ErrLeaseLost)
	btWant(t, "ack 2", btWait(t, r2), nil)
	btMet(t, sm)
}

// A batch of mixed outcomes runs one statement per outcome and delay, in the
// order each first arrived, with the engine's clock on Postgres.
func TestBatchOutcomesPostgres(t *testing.T) {
	db, sm := btMock(t)
	q := btNew(t, db, Postgres, false)
	b := btBatcher(t, q, BatchConfig{MaxBatch: 6, MaxWait: time.Hour})
	exp := `"2024-03-01 12:00:30.123456+00"`
	toks := func(ids string, n int) []driver.Value {
		return pgBatchArgs("{"+ids+"}", "{"+strings.TrimSuffix(strings.Repeat("2,", n), ",")+"}",
			"{"+strings.TrimSuffix(strings.Repeat(exp+",", n), ",")+"}")
	}
	cat := func(parts ...[]driver.Value) []driver.Value {
		var out []driver.Value
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	ids := func(ids ...int64) *sqlmock.Rows {
		r := sqlmock.NewRows([]string{"id"})
		for _, id := range ids {
			r.AddRow(id)
		}
		return r
	}
	retry := `UPDATE "jobs" SET "locked_until" = (statement_timestamp() + $1 * interval '1 microsecond') WHERE ` + pgBatchWhere(2) + ` RETURNING "id"`
	sm.ExpectQuery(`DELETE FROM "jobs" WHERE ` + pgBatchWhere(1) + ` RETURNING "id"`).
		WithArgs(toks("1,6", 2)...).WillReturnRows(ids(1, 6))
	sm.ExpectQuery(retry).
		WithArgs(cat([]driver.Value{int64(5000000)}, toks("2,4", 2))...).WillReturnRows(ids(2))
	sm.ExpectQuery(`UPDATE "jobs" SET "locked_until" = NULL, "attempt" = "attempt" - 1 WHERE ` + pgBatchWhere(1) + ` RETURNING "id"`).
		WithArgs(toks("3", 1)...).WillReturnRows(ids(3))
	sm.ExpectQuery(retry).
		WithArgs(cat([]driver.Value{int64(1000000)}, toks("5", 1))...).WillReturnRows(ids(5))
	ctx := context.Background()
	d := func(id int64) *Delivery { return btDel(q, id, 1, btExp) }
	r1 := btStart(t, b, func() error { return b.Ack(ctx, d(1)) })
	r2 := btStart(t, b, func() error { return b.Retry(ctx, d(2), 5*time.Second) })
	r3 := btStart(t, b, func() error { return b.Release(ctx, d(3)) })
	r4 := btStart(t, b, func() error { return b.Retry(ctx, d(4), 5*time.Second) })
	r5 := btStart(t, b, func() error { return b.Retry(ctx, d(5), time.Second) })
	r6 := btStart(t, b, func() error { return b.Ack(ctx, d(6)) })
	btWant(t, "ack 1", btWait(t, r1), nil)
	btWant(t, "retry 2", btWait(t, r2), nil)
	btWant(t, "release 3", btWait(t, r3), nil)
	btWant(t, "retry 4 (stale)", btWait(t, r4), ErrLeaseLost)
	btWant(t, "retry 5", btWait(t, r5), nil)
	btWant(t, "ack 6", btWait(t, r6), nil)
	btMet(t, sm)
}

// MySQL, a lone Ack: one statement outside any transaction, whose rows
// affected, one or none, is the verdict.
func TestBatchAckMySQLAlone(t *testing.T) {
	db, sm := btMock(t)
	q := btNew(t, db, MySQL, false)
	b := btBatcher(t, q, BatchConfig{MaxBatch: 1})
	// One token: plain conditions, which MariaDB plans by key where it
	// scans for a one-row IN.
	const one = "DELETE FROM `jobs` WHERE (`id` = ? AND `attempt` = ? AND COALESCE(`locked_until`) = ?)"
	sm.ExpectExec(one).WithArgs(int64(1), int64(2), "2024-03-01 12:00:30.123456").WillReturnResult(sqlmock.NewResult(0, 1))
	sm.ExpectExec(one).WithArgs(int64(2), int64(2), "2024-03-01 12:00:30.123456").WillReturnResult(sqlmock.NewResult(0, 0))
	btWant(t, "ack 1", b.Ack(context.Background(), btDel(q, int64(1), 1, btExp)), nil)
	btWant(t, "ack 2 (stale)", b.Ack(context.Background(), btDel(q, int64(2), 1, btExp)), ErrLeaseLost)
	btMet(t, sm)
}

// MySQL Retry and Release: the engine's clock is read in place; with the
// caller's clock the new expiry is a parameter.
func TestBatchOutcomesMySQL(t *testing.T) {
	for _, callerClock := range []bool{false, true} {
		db, sm := btMock(t)
		q := btNew(t, db, MySQL, callerClock)
		b := btBatcher(t, q, BatchConfig{MaxBatch: 2, MaxWait: time.Hour})
		exp := "2024-03-01 12:00:30.123456"
		sm.ExpectBegin()
		if callerClock {
			sm.ExpectExec("UPDATE `jobs` SET `locked_until` = ? WHERE (`id` = ? AND `attempt` = ? AND COALESCE(`locked_until`) = ?)").
				WithArgs("2024-03-01 12:00:02.123456", int64(1), int64(2), exp).WillReturnResult(sqlmock.NewResult(0, 1))
		} else {
			sm.ExpectExec("UPDATE `jobs` SET `locked_until` = DATE_ADD(UTC_TIMESTAMP(6), INTERVAL ? MICROSECOND) WHERE (`id` = ? AND `attempt` = ? AND COALESCE(`locked_until`) = ?)").
				WithArgs(int64(2000000), int64(1), int64(2), exp).WillReturnResult(sqlmock.NewResult(0, 1))
		}
		sm.ExpectCommit()
		// A lone Release needs no transaction: its rows affected decide.
		sm.ExpectExec("UPDATE `jobs` SET `locked_until` = NULL, `attempt` = `attempt` - 1 WHERE (`id` = ? AND `attempt` = ? AND COALESCE(`locked_until`) = ?)").
			WithArgs(int64(2), int64(2), exp).WillReturnResult(sqlmock.NewResult(0, 1))
		ctx := context.Background()
		r1 := btStart(t, b, func() error { return b.Retry(ctx, btDel(q, int64(1), 1, btExp), 2*time.Second) })
		r2 := btStart(t, b, func() error { return b.Release(ctx, btDel(q, int64(2), 1, btExp)) })
		btWant(t, "retry", btWait(t, r1), nil)
		btWant(t, "release", btWait(t, r2), nil)
		btMet(t, sm)
	}
}

// SQLite Retry: the caller's clock, as always on SQLite.
func TestBatchRetrySQLite(t *testing.T) {
	db, sm := btMock(t)
	q := btNew(t, db, SQLite, true)
	b := btBatcher(t, q, BatchConfig{MaxBatch: 1})
	sm.ExpectQuery("UPDATE `jobs` SET `locked_until` = ? WHERE (`id` = ? AND `attempt` = ? AND `locked_until` = ?) RETURNING `id`").
		WithArgs("2024-03-01T12:01:00.123456Z", int64(9), int64(2), "2024-03-01T12:00:30.123456Z").
		WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(9)))
	btWant(t, "retry", b.Retry(context.Background(), btDel(q, int64(9), 1, btExp), time.Minute), nil)
	btMet(t, sm)
}

// Two deliveries of one job (one stale) never share a statement, whose
// returned ids could not tell them apart: the later waits for the next.
// Batches of up to smallSet are scanned for the id, larger ones looked up.
func TestBatchDuplicateIDs(t *testing.T) {
	for _, max := range []int{4, 64} {
		db, sm := btMock(t)
		q := btNew(t, db, Postgres, false)
		b := btBatcher(t, q, BatchConfig{MaxBatch: max, MaxWait: time.Hour, Flushers: 1})
		e2 := btExp.Add(time.Second)
		one := `DELETE FROM "jobs" WHERE ` + pgBatchWhere(1) + ` RETURNING "id"`
		sm.ExpectQuery(one).WithArgs(pgBatchArgs("{7,8}", "{2,2}", btExps(2))...).WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(8)))
		sm.ExpectQuery(one).WithArgs(pgBatchArgs("{7}", "{3}", `{"2024-03-01 12:00:31.123456+00"}`)...).WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(7)))
		stale := btStart(t, b, func() error { return b.Ack(context.Background(), btDel(q, int64(7), 1, btExp)) })
		live := btStart(t, b, func() error { return b.Ack(context.Background(), btDel(q, int64(7), 2, e2)) })
		other := btStart(t, b, func() error { return b.Ack(context.Background(), btDel(q, int64(8), 1, btExp)) })
		b.Close() // sends what is pending, under MaxBatch, in two batches
		btWant(t, fmt.Sprintf("MaxBatch %d: stale", max), btWait(t, stale), ErrLeaseLost)
		btWant(t, fmt.Sprintf("MaxBatch %d: live", max), btWait(t, live), nil)
		btWant(t, fmt.Sprintf("MaxBatch %d: another job", max), btWait(t, other), nil)
		btMet(t, sm)
	}
}

// A driver error fails every job of the batch and finishes none: each can
// be settled again.
func TestBatchDriverError(t *testing.T) {
	db, sm := btMock(t)
	q := btNew(t, db, Postgres, false)
	b := btBatcher(t, q, BatchConfig{MaxBatch: 2, MaxWait: time.Hour})
	boom := errors.New("connection reset")
	two := `DELETE FROM "jobs" WHERE ` + pgBatchWhere(1) + ` RETURNING "id"`
	args := pgBatchArgs("{1,2}", "{2,2}", btExps(2))
	sm.ExpectQuery(two).WithArgs(args...).WillReturnError(boom)
	sm.ExpectQuery(two).WithArgs(args...).WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(1)).AddRow(int64(2)))
	d1, d2 := btDel(q, int64(1), 1, btExp), btDel(q, int64(2), 1, btExp)
	for round, want := range []error{boom, nil} {
		r1 := btStart(t, b, func() error { return b.Ack(context.Background(), d1) })
		r2 := btStart(t, b, func() error { return b.Ack(context.Background(), d2) })
		btWant(t, "round "+string(rune('1'+round))+" ack 1", btWait(t, r1), want)
		btWant(t, "round "+string(rune('1'+round))+" ack 2", btWait(t, r2), want)
	}
	btMet(t, sm)
}

// A caller whose context ends while its settlement is pending withdraws it:
// nothing is sent and the delivery can still be settled.
func TestBatchCancelPending(t *testing.T) {
	db, sm := btMock(t)
	q := btNew(t, db, Postgres, false)
	b := btBatcher(t, q, BatchConfig{MaxBatch: 2, MaxWait: time.Hour})
	d := btDel(q, int64(1), 1, btExp)
	ctx, cancel := context.WithCancel(context.Background())
	res := btStart(t, b, func() error { return b.Ack(ctx, d) })
	cancel()
	btWant(t, "cancelled ack", btWait(t, res), context.Canceled)
	if n := btPending(b); n != 0 {
		t.Fatalf("%d settlements still pending after the withdrawal", n)
	}
	b.Close()
	btMet(t, sm) // nothing was sent
	sm.ExpectExec(q.st.Settle.Ack.SQL).WithArgs(int64(1), int64(2), btExp).WillReturnResult(sqlmock.NewResult(0, 1))
	btWant(t, "plain ack after", d.Ack(context.Background()), nil)
	btMet(t, sm)
}

// A caller whose context ends while its batch is in flight gives up its
// place in it and reads its outcome back (here the extension that would
// tell fails: the outcome is unknown, the delivery not settled); when every
// caller of the batch has given up, the statement is cancelled.
func TestBatchCancelInFlight(t *testing.T) {
	f := fakedb.NewLease()
	f.Block = make(chan struct{})
	q := btQueue(t, f)
	b, err := q.NewBatcher(BatchConfig{})
	if err != nil {
		t.Fatal(err)
	}
	d := btDel(q, int64(1), 1, btExp)
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan error, 1)
	go func() { res <- b.Ack(ctx, d) }()
	select {
	case <-f.Block: // the statement is in flight
	case <-time.After(20 * time.Second):
		t.Fatal("the batch was never sent")
	}
	cancel()
	err = btWait(t, res)
	btWant(t, "ack", err, context.Canceled)
	btWant(t, "ack", err, ErrOutcomeUnknown)
	closed := make(chan error, 1)
	go func() { b.Close(); closed <- nil }()
	// Close returns only once the flush ended: its statement was cancelled.
	btWait(t, closed)
	if d.settled {
		t.Fatal("a cancelled, failed batch settled the delivery")
	}
}

// The settlement stops the delivery's keeper first, as a plain one does.
func TestBatchStopsKeeper(t *testing.T) {
	db, sm := btMock(t)
	q, err := New(db, Config{Dialect: Postgres, Table: btLease,
		After: func(time.Duration) <-chan time.Time { return nil }}) // a keeper that never fires
	if err != nil {
		t.Fatal(err)
	}
	b := btBatcher(t, q, BatchConfig{})
	d := btDel(q, int64(1), 1, btExp)
	_, stop := d.Keep(context.Background())
	defer stop()
	if n := q.InWork(); n != 1 {
		t.Fatalf("InWork %d with a keeper running, want 1", n)
	}
	sm.ExpectQuery(`DELETE FROM "jobs" WHERE ` + pgBatchWhere(1) + ` RETURNING "id"`).
		WithArgs(pgBatchArgs("{1}", "{2}", btExps(1))...).WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(1)))
	btWant(t, "ack", b.Ack(context.Background(), d), nil)
	if n := q.InWork(); n != 0 {
		t.Fatalf("InWork %d after the ack, want 0: the keeper still runs", n)
	}
	btMet(t, sm)
}

// Bad configurations and misuse return errors and send nothing.
func TestBatchErrors(t *testing.T) {
	db, sm := btMock(t)
	q := btNew(t, db, Postgres, false)
	for _, c := range []struct {
		cfg  BatchConfig
		want string
	}{
		{BatchConfig{MaxBatch: -1}, "MaxBatch -1"},
		{BatchConfig{MaxBatch: 257}, "MaxBatch 257"},
		{BatchConfig{MaxWait: -time.Second}, "MaxWait -1s is negative"},
		{BatchConfig{Flushers: -1}, "Flushers -1 is negative"},
	} {
		if _, err := q.NewBatcher(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewBatcher(%+v): got %v, want an error with %q", c.cfg, err, c.want)
		}
	}
	rl, err := New(db, Config{Dialect: Postgres, Table: Table{Name: "jobs"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rl.NewBatcher(BatchConfig{}); err == nil || !strings.Contains(err.Error(), "lease form") {
		t.Errorf("NewBatcher on a row-lock queue: %v", err)
	}
	nb, err := New(db, Config{Dialect: btNoBatch{Postgres}, Table: btLease})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nb.NewBatcher(BatchConfig{}); err == nil || !strings.Contains(err.Error(), "BatchDialect") {
		t.Errorf("NewBatcher with a dialect lacking batches: %v", err)
	}

	b := btBatcher(t, q, BatchConfig{})
	other := btNew(t, db, Postgres, false)
	if err := b.Ack(context.Background(), btDel(other, int64(1), 1, btExp)); err == nil || !strings.Contains(err.Error(), "another queue") {
		t.Errorf("ack of another queue's delivery: %v", err)
	}
	d := btDel(q, int64(1), 1, btExp)
	if err := b.Retry(context.Background(), d, -time.Second); err == nil || !strings.Contains(err.Error(), "negative") {
		t.Errorf("retry with a negative delay: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	btWant(t, "ack with an ended context", b.Ack(ctx, d), context.Canceled)
	d.settled = true
	btWant(t, "ack of a settled delivery", b.Ack(context.Background(), d), ErrSettled)
	b.Close()
	b.Close() // idempotent
	btWant(t, "ack after close", b.Ack(context.Background(), btDel(q, int64(2), 1, btExp)), ErrBatcherClosed)
	btMet(t, sm)
}

// btNoBatch is a dialect without batch statements.
type btNoBatch struct{ Dialect }

// AckAll queues a caller's deliveries together: one statement, and each
// delivery its own result; the settled, foreign and repeated ones are
// refused without being sent.
func TestBatchAckAll(t *testing.T) {
	db, sm := btMock(t)
	q := btNew(t, db, Postgres, false)
	other := btNew(t, db, Postgres, false)
	b := btBatcher(t, q, BatchConfig{MaxBatch: 4})
	d1, d2 := btDel(q, int64(1), 1, btExp), btDel(q, int64(2), 1, btExp)
	settled := btDel(q, int64(3), 1, btExp)
	settled.settled = true
	foreign := btDel(other, int64(4), 1, btExp)
	sm.ExpectQuery(`DELETE FROM "jobs" WHERE ` + pgBatchWhere(1) + ` RETURNING "id"`).
		WithArgs(pgBatchArgs("{1,2}", "{2,2}", btExps(2))...).
		WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(1)))
	errs := b.AckAll(context.Background(), []*Delivery{d1, d2, settled, foreign, d1})
	btWant(t, "ack 1", errs[0], nil)
	btWant(t, "ack 2 (stale)", errs[1], ErrLeaseLost)
	btWant(t, "ack of a settled delivery", errs[2], ErrSettled)
	for i, want := range map[int]string{3: "another queue", 4: "given twice"} {
		if errs[i] == nil || !strings.Contains(errs[i].Error(), want) {
			t.Errorf("result %d: %v, want an error with %q", i, errs[i], want)
		}
	}
	if !d1.settled || !d2.settled {
		t.Error("the acknowledged and the stale delivery are not finished")
	}
	btMet(t, sm)
}

// A claim's worth of deliveries (past smallSet, where AckAll and the
// returned ids go through maps): each delivery gets the result of its own
// id, and a delivery given twice is still refused.
func TestBatchAckAllLarge(t *testing.T) {
	db, sm := btMock(t)
	q := btNew(t, db, Postgres, false)
	b := btBatcher(t, q, BatchConfig{MaxBatch: 64})
	const n = 40
	ds := make([]*Delivery, n)
	ids, attempts := make([]string, n), make([]string, n)
	rows := sqlmock.NewRows([]string{"id"})
	for i := range ds {
		ds[i] = btDel(q, int64(100+i), 1, btExp)
		ids[i], attempts[i] = fmt.Sprint(100+i), "2"
		if i%3 != 0 { // every third job lost its lease
			rows.AddRow(int64(100 + i))
		}
	}
	sm.ExpectQuery(`DELETE FROM "jobs" WHERE ` + pgBatchWhere(1) + ` RETURNING "id"`).
		WithArgs(pgBatchArgs("{"+strings.Join(ids, ",")+"}", "{"+strings.Join(attempts, ",")+"}", btExps(n))...).
		WillReturnRows(rows)
	errs := b.AckAll(context.Background(), append(ds, ds[7]))
	for i := 0; i < n; i++ {
		var want error
		if i%3 == 0 {
			want = ErrLeaseLost
		}
		btWant(t, fmt.Sprintf("ack of job %d", 100+i), errs[i], want)
	}
	if errs[n] == nil || !strings.Contains(errs[n].Error(), "given twice") {
		t.Errorf("a delivery given twice among %d: %v", n+1, errs[n])
	}
	btMet(t, sm)
}

// ReleaseAll gives a claim's lease jobs back in one statement, their
// attempts restored, each token checked.
func TestReleaseAll(t *testing.T) {
	const claim = `WITH picked AS MATERIALIZED (SELECT "id" FROM (` +
		`(SELECT "id" FROM (SELECT "id" FROM "jobs" WHERE "locked_until" IS NULL ORDER BY "id" LIMIT 2 FOR UPDATE SKIP LOCKED) AS free LIMIT $1) UNION ALL ` +
		`(SELECT "id" FROM (SELECT "id" FROM "jobs" WHERE "locked_until" <= statement_timestamp() ORDER BY "locked_until" LIMIT 2 FOR UPDATE SKIP LOCKED) AS expired LIMIT $2)` +
		`) AS c ORDER BY "id" LIMIT $3) ` +
		`UPDATE "jobs" AS j SET "attempt" = j."attempt" + 1, "locked_until" = (statement_timestamp() + $4 * interval '1 microsecond') WHERE j."id" = ANY (ARRAY(SELECT "id" FROM picked)) ` +
		`RETURNING j."id", j."attempt" - 1, j."locked_until", j."payload"`
	batchRelease := `UPDATE "jobs" SET "locked_until" = NULL, "attempt" = "attempt" - 1 WHERE ` + pgBatchWhere(1) + ` RETURNING "id"`
	db, sm := btMock(t)
	q, err := New(db, Config{Dialect: Postgres, Table: Table{Name: "jobs", LockedUntil: "locked_until", DeadTable: "dead_jobs"}, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	exp := btNow.Add(time.Minute)
	sm.ExpectQuery(claim).WithArgs(2, 2, 2, int64(time.Minute/time.Microsecond)).WillReturnRows(sqlmock.NewRows([]string{"id", "attempt", "locked_until", "payload"}).
		AddRow(int64(1), int64(1), exp, []byte("p")).AddRow(int64(2), int64(1), exp, []byte("p")))
	sm.ExpectQuery(batchRelease).WithArgs(pgBatchArgs("{1,2}", "{2,2}", `{"2024-03-01 12:01:00.123456+00","2024-03-01 12:01:00.123456+00"}`)...).
		WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(1)))
	ds, err := q.Claim(context.Background(), 2)
	if err != nil || len(ds) != 2 || ds[0].ID() != int64(1) || ds[1].ID() != int64(2) {
		t.Fatalf("Claim(2) = %v, %v; want jobs 1 and 2", ds, err)
	}
	b := btBatcher(t, q, BatchConfig{MaxBatch: 2})
	errs := b.ReleaseAll(context.Background(), ds)
	if len(errs) != 2 || errs[0] != nil || !errors.Is(errs[1], ErrLeaseLost) {
		t.Errorf("ReleaseAll = %v, want nil and ErrLeaseLost for the job whose token no longer matched", errs)
	}
	btMet(t, sm)
}

// markReturned clears the error of every token whose id a row names, by a
// scan for a few tokens and by a map for many: both ways give the same
// verdicts, two tokens of one id included.
func TestMarkReturned(t *testing.T) {
	for _, n := range []int{5, smallSet + 1, 300} {
		db, sm := btMock(t)
		toks := make([]token, n)
		for i := range toks {
			toks[i] = token{id: int64(i / 2)} // two tokens an id (one alone if n is odd)
		}
		rows := sqlmock.NewRows([]string{"id"})
		for id := 0; id < (n+1)/2; id += 2 { // every other id returned
			rows.AddRow(int64(id))
		}
		sm.ExpectQuery("SELECT ids").WillReturnRows(rows)
		r, err := db.Query("SELECT ids")
		if err != nil {
			t.Fatal(err)
		}
		errs := make([]error, n)
		fill(errs, ErrLeaseLost)
		if err := markReturned(r, toks, errs); err != nil {
			t.Fatal(err)
		}
		for i, err := range errs {
			var want error
			if (i/2)%2 == 1 {
				want = ErrLeaseLost
			}
			btWant(t, fmt.Sprintf("%d tokens, token %d (id %d)", n, i, i/2), err, want)
		}
		btMet(t, sm)
	}
}

// Many callers and two flushers: every job gets its result, in fewer
// statements than jobs; run under -race, this is the concurrency check.
func TestBatchConcurrent(t *testing.T) {
	f := fakedb.NewLease()
	q := btQueue(t, f)
	for _, cfg := range []BatchConfig{{MaxBatch: 16, Flushers: 2}, {MaxBatch: 16, Flushers: 1}, {MaxBatch: 5, MaxWait: time.Millisecond}} {
		before := f.Queries()
		b := btBatcher(t, q, cfg)
		const jobs = 200
		errs := make(chan error, jobs+70)
		var wg sync.WaitGroup
		for i := 0; i < jobs; i++ {
			d := btDel(q, int64(i), 1, btExp)
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- b.Ack(context.Background(), d)
			}()
		}
		// And callers acknowledging several at once.
		for i := 0; i < 10; i++ {
			ds := make([]*Delivery, 7)
			for k := range ds {
				ds[k] = btDel(q, int64(1000+10*i+k), 1, btExp)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for _, err := range b.AckAll(context.Background(), ds) {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		n := 0
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
			n++
		}
		if n != jobs+70 {
			t.Fatalf("%d results for %d jobs", n, jobs+70)
		}
		b.Close()
		sent := f.Queries() - before
		if sent < int64((jobs+70+cfg.MaxBatch-1)/cfg.MaxBatch) || sent > jobs+70 {
			t.Fatalf("%+v: %d statements for %d jobs", cfg, sent, jobs+70)
		}
	}
}

// Settlements whose contexts end at random points, on the in-memory driver,
// so that thousands of batches end within a second: no flusher slot may be
// lost (with Flushers 1 a lost one hangs every later settlement and Close),
// every settlement returns nil or its context's error, and under -race no
// settlement is read after it was given back. Many callers with one
// settlement each hit a lost slot soonest. dbtest/batch_cancel_test.go runs
// the same on every real database.
func TestBatchCancelStress(t *testing.T) {
	f := fakedb.NewLease()
	q := btQueue(t, f)
	var next int64
	for _, cfg := range []BatchConfig{{Flushers: 1}, {}, {Flushers: 1, MaxBatch: 4}} {
		start := time.Now()
		rounds := 0
		for ; rounds < 5000 && (rounds < 20 || time.Since(start) < time.Second); rounds++ {
			b, err := q.NewBatcher(cfg)
			if err != nil {
				t.Fatal(err)
			}
			// 128 callers; every sixteenth acknowledges four jobs at once.
			const callers, group = 128, 4
			ds := make([][]*Delivery, callers)
			errs := make([][]error, callers)
			for c := range ds {
				n := 1
				if c%16 == 15 {
					n = group
				}
				for k := 0; k < n; k++ {
					next++
					ds[c] = append(ds[c], btDel(q, next, 1, btExp))
				}
			}
			var wg sync.WaitGroup
			for c := range ds {
				c := c
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx, cancel := btRandomContext()
					defer cancel()
					if len(ds[c]) > 1 {
						errs[c] = b.AckAll(ctx, ds[c])
					} else {
						errs[c] = []error{b.Ack(ctx, ds[c][0])}
					}
				}()
			}
			btWithin(t, fmt.Sprintf("%+v round %d: the settlements", cfg, rounds), wg.Wait)
			btWithin(t, fmt.Sprintf("%+v round %d: Close", cfg, rounds), b.Close)
			for c := range ds {
				for k, d := range ds[c] {
					err := errs[c][k]
					if err != nil && !errors.Is(err, context.DeadlineExceeded) {
						t.Fatalf("%+v round %d: job %v: %v, want nil or the context's error", cfg, rounds, d.ID(), err)
					}
					if again := d.Ack(context.Background()); err == nil && !errors.Is(again, ErrSettled) {
						t.Fatalf("%+v round %d: job %v acknowledged, then acked again: %v, want ErrSettled", cfg, rounds, d.ID(), again)
					}
				}
			}
		}
		t.Logf("%+v: %d rounds", cfg, rounds)
	}
}

// btRandomContext ends at a random point in the next 200µs, or, one time in
// eight, never.
func btRandomContext() (context.Context, context.CancelFunc) {
	if rand.Intn(8) == 0 {
		return context.Background(), func() {}
	}
	return context.WithTimeout(context.Background(), time.Duration(rand.Int63n(int64(200*time.Microsecond)+1)))
}

// btWithin runs fn and fails the test with every goroutine's stack when fn
// does not return within a minute: a hang is reported, never waited out.
func btWithin(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		t.Fatalf("%s did not return within a minute (a lost flusher slot?); goroutines:\n%s", what, buf)
	}
}

// A Batcher settlement of a finished delivery returns what the same
// settlement called on the delivery returns, word for word: ErrSettled, and
// ErrLeaseLost with it when the verdict that finished the delivery was a
// lost lease, whichever way that verdict came.
func TestBatchSettledAsDelivery(t *testing.T) {
	db, sm := btMock(t)
	q := btNew(t, db, Postgres, false)
	b := btBatcher(t, q, BatchConfig{MaxBatch: 1})
	ctx := context.Background()
	one := `DELETE FROM "jobs" WHERE ` + pgBatchWhere(1) + ` RETURNING "id"`
	sm.ExpectQuery(one).WithArgs(pgBatchArgs("{1}", "{2}", btExps(1))...).WillReturnRows(sqlmock.NewRows([]string{"id"}))
	sm.ExpectExec(q.st.Settle.Ack.SQL).WithArgs(int64(2), int64(2), btExp).WillReturnResult(sqlmock.NewResult(0, 0))
	sm.ExpectQuery(one).WithArgs(pgBatchArgs("{3}", "{2}", btExps(1))...).WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(3)))
	lostInBatch, lostAlone, acked := btDel(q, int64(1), 1, btExp), btDel(q, int64(2), 1, btExp), btDel(q, int64(3), 1, btExp)
	btWant(t, "batch ack of a lost lease", b.Ack(ctx, lostInBatch), ErrLeaseLost)
	btWant(t, "plain ack of a lost lease", lostAlone.Ack(ctx), ErrLeaseLost)
	btWant(t, "batch ack", b.Ack(ctx, acked), nil)
	btMet(t, sm)
	for _, c := range []struct {
		name string
		d    *Delivery
		lost bool
	}{{"lost in a batch", lostInBatch, true}, {"lost alone", lostAlone, true}, {"acknowledged", acked, false}} {
		for _, s := range []struct {
			name         string
			batch, plain func(d *Delivery) error
		}{
			{"ack", func(d *Delivery) error { return b.Ack(ctx, d) }, func(d *Delivery) error { return d.Ack(ctx) }},
			{"retry", func(d *Delivery) error { return b.Retry(ctx, d, time.Second) }, func(d *Delivery) error { return d.Retry(ctx, time.Second) }},
			{"release", func(d *Delivery) error { return b.Release(ctx, d) }, func(d *Delivery) error { return d.Release(ctx) }},
			{"retry with a negative delay", func(d *Delivery) error { return b.Retry(ctx, d, -time.Second) }, func(d *Delivery) error { return d.Retry(ctx, -time.Second) }},
			{"ack all", func(d *Delivery) error { return b.AckAll(ctx, []*Delivery{d})[0] }, func(d *Delivery) error { return d.Ack(ctx) }},
		} {
			got, want := s.batch(c.d), s.plain(c.d)
			if got == nil || want == nil || got.Error() != want.Error() {
				t.Errorf("%s, %s: the batcher returns %v, the delivery %v", c.name, s.name, got, want)
			}
			if s.name == "retry with a negative delay" {
				continue
			}
			if !errors.Is(got, ErrSettled) || errors.Is(got, ErrLeaseLost) != c.lost {
				t.Errorf("%s, %s: %v, want ErrSettled, and ErrLeaseLost %v", c.name, s.name, got, c.lost)
			}
		}
	}
	btMet(t, sm) // nothing more was sent
}

// A Batcher settlement pauses the keeper's extensions first. Without a
// verdict (a driver error) the keeper's deadline stays armed and stops the
// handler before the lease runs out; a verdict ends the keeper, which then
// cancels nothing.
func TestBatchKeeper(t *testing.T) {
	db, sm := btMock(t)
	clk := fakeclock.New(btNow)
	q, err := New(db, Config{Dialect: Postgres, Table: btLease, Lease: time.Minute, Now: clk.Now, After: clk.After})
	if err != nil {
		t.Fatal(err)
	}
	b := btBatcher(t, q, BatchConfig{})
	ctx := context.Background()
	one := `DELETE FROM "jobs" WHERE ` + pgBatchWhere(1) + ` RETURNING "id"`
	boom := errors.New("driver: bad connection")

	d := btDel(q, int64(1), 1, btExp)
	d.lease.sentAt = btNow
	handler, stop := d.Keep(ctx)
	defer stop()
	clk.WaitAfters(t, 1) // the first extension, due at half the lease
	sm.ExpectQuery(one).WithArgs(pgBatchArgs("{1}", "{2}", btExps(1))...).WillReturnError(boom)
	btWant(t, "ack failing", b.Ack(ctx, d), boom)
	clk.WaitAfters(t, 2) // paused: the deadline alone
	clk.Advance(time.Minute)
	select {
	case <-handler.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the handler was not stopped by the lease's end")
	}
	if cause := context.Cause(handler); !errors.Is(cause, ErrLeaseLost) {
		t.Fatalf("handler cancelled with %v, want ErrLeaseLost", cause)
	}
	sm.ExpectQuery(one).WithArgs(pgBatchArgs("{1}", "{2}", btExps(1))...).WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(1)))
	btWant(t, "ack after the failure", b.Ack(ctx, d), nil)
	if n := q.InWork(); n != 0 {
		t.Fatalf("InWork %d after the ack, want 0", n)
	}

	d2 := btDel(q, int64(2), 1, btExp.Add(time.Minute))
	d2.lease.sentAt = clk.Now()
	handler2, stop2 := d2.Keep(ctx)
	defer stop2()
	clk.WaitAfters(t, 3)
	sm.ExpectQuery(one).WithArgs(pgBatchArgs("{2}", "{2}", `{"2024-03-01 12:01:30.123456+00"}`)...).WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(2)))
	btWant(t, "ack", b.Ack(ctx, d2), nil)
	if n := q.InWork(); n != 0 {
		t.Fatalf("InWork %d after the ack, want 0: the keeper still runs", n)
	}
	clk.Advance(5 * time.Minute)
	if err := handler2.Err(); err != nil {
		t.Fatalf("handler of an acknowledged job cancelled: %v", context.Cause(handler2))
	}
	btMet(t, sm)
}

// A delivery settled in the caller's transaction that committed, without
// Committed, and then settled through a batch that finds its token gone,
// reads the row back as its settlement alone does: ErrSettled when the row
// shows the pending settlement (AckTx: the row gone; RetryTx: its expiry
// moved by the token's holder), ErrLeaseLost when another claim has the
// job. A transaction rolled back leaves the token in place and the batch's
// own settlement takes effect. Each result is the one the same settlement
// of a twin delivery alone returns, word for word.
func TestBatchPendingTx(t *testing.T) {
	db, sm := btMock(t)
	q := btNew(t, db, Postgres, false)
	b := btBatcher(t, q, BatchConfig{MaxBatch: 8})
	ctx := context.Background()
	row := func(attempt int64, exp time.Time) *sqlmock.Rows {
		return sqlmock.NewRows([]string{"attempt", "locked_until"}).AddRow(attempt, exp)
	}
	cases := []struct {
		name string
		inTx func(d *Delivery, tx *sql.Tx) error
		// commit ends the transaction by Commit, else by Rollback.
		commit bool
		// row is the row as the read back finds it; nil for no row.
		row  func() *sqlmock.Rows
		want error
	}{
		{"AckTx committed", func(d *Delivery, tx *sql.Tx) error { return d.AckTx(ctx, tx) }, true, nil, ErrSettled},
		{"RetryTx committed", func(d *Delivery, tx *sql.Tx) error { return d.RetryTx(ctx, tx, time.Hour) }, true,
			func() *sqlmock.Rows { return row(2, btExp.Add(time.Hour)) }, ErrSettled},
		{"RetryTx committed, then claimed by another", func(d *Delivery, tx *sql.Tx) error { return d.RetryTx(ctx, tx, time.Hour) }, true,
			func() *sqlmock.Rows { return row(3, btExp.Add(time.Hour)) }, ErrLeaseLost},
		{"AckTx rolled back", func(d *Delivery, tx *sql.Tx) error { return d.AckTx(ctx, tx) }, false, nil, nil},
	}
	inTx := func(c int, d *Delivery) {
		sm.ExpectBegin()
		if strings.HasPrefix(cases[c].name, "RetryTx") {
			sm.ExpectExec(q.st.Settle.Retry.SQL).WithArgs(int64(time.Hour/time.Microsecond), d.id, int64(2), btExp).WillReturnResult(sqlmock.NewResult(0, 1))
		} else {
			sm.ExpectExec(q.st.Settle.Ack.SQL).WithArgs(d.id, int64(2), btExp).WillReturnResult(sqlmock.NewResult(0, 1))
		}
		if cases[c].commit {
			sm.ExpectCommit()
		} else {
			sm.ExpectRollback()
		}
		tx, err := db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		if err := cases[c].inTx(d, tx); err != nil {
			t.Fatalf("%s: %v", cases[c].name, err)
		}
		if cases[c].commit {
			err = tx.Commit()
		} else {
			err = tx.Rollback()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	verdict := func(c int, id int64) {
		e := sm.ExpectQuery(q.st.Settle.Verdict.SQL).WithArgs(id)
		if cases[c].row == nil {
			e.WillReturnRows(sqlmock.NewRows([]string{"attempt", "locked_until"}))
		} else {
			e.WillReturnRows(cases[c].row())
		}
	}
	// The batch: ids 1 to 4, the rolled back one still holding its token.
	var batched []*Delivery
	for c := range cases {
		d := btDel(q, int64(c+1), 1, btExp)
		inTx(c, d)
		batched = append(batched, d)
	}
	sm.ExpectQuery(`DELETE FROM "jobs" WHERE ` + pgBatchWhere(1) + ` RETURNING "id"`).
		WithArgs(pgBatchArgs("{1,2,3,4}", "{2,2,2,2}", btExps(4))...).
		WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(4)))
	for c := range cases {
		if cases[c].commit { // a token in place needs no read
			verdict(c, int64(c+1))
		}
	}
	got := b.AckAll(ctx, batched)
	btMet(t, sm)

	// The same settlements of twins alone: ids 11 to 14.
	for c := range cases {
		d := btDel(q, int64(c+11), 1, btExp)
		inTx(c, d)
		affected := int64(1)
		if cases[c].commit {
			affected = 0
		}
		sm.ExpectExec(q.st.Settle.Ack.SQL).WithArgs(d.id, int64(2), btExp).WillReturnResult(sqlmock.NewResult(0, affected))
		if cases[c].commit {
			verdict(c, d.id.(int64))
		}
		alone := d.Ack(ctx)
		btWant(t, cases[c].name+", alone", alone, cases[c].want)
		btWant(t, cases[c].name+", in a batch", got[c], cases[c].want)
		if fmt.Sprint(got[c]) != fmt.Sprint(alone) {
			t.Errorf("%s: the batch returns %v, the delivery alone %v", cases[c].name, got[c], alone)
		}
		if cases[c].want == ErrSettled && errors.Is(got[c], ErrLeaseLost) {
			t.Errorf("%s: the batch returns %v, which reads as a lost lease", cases[c].name, got[c])
		}
		if !batched[c].settled || batched[c].pending != nil {
			t.Errorf("%s: the delivery of the batch is not finished (settled %v, pending %+v)", cases[c].name, batched[c].settled, batched[c].pending)
		}
	}
	btMet(t, sm)
}
