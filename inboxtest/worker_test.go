package inboxtest_test

// A user's worker, tested with the helper on every form, engine and clock:
// the tests a user writes, each outcome in a few lines, each run against
// the queue itself on sqlmock and checked with ExpectationsWereMet.

import (
	"context"
	"errors"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/inboxtest"
)

// retryError asks the worker to retry the job after a delay.
type retryError struct{ after time.Duration }

func (e retryError) Error() string { return fmt.Sprintf("retry in %v", e.after) }

var (
	errShutdown = errors.New("shutting down: give the job back")
	errPoison   = errors.New("cannot ever handle this job")
)

// work is the worker under test: it claims one job, runs handle on its
// payload and settles it by handle's verdict: nil acks, a retryError
// retries, errShutdown releases, any other error moves it to the dead table.
// It reports what it did.
func work(ctx context.Context, q *inbox.Queue, handle func(payload []byte) error) (string, error) {
	ds, err := q.Claim(ctx, 1)
	if err != nil {
		return "", err
	}
	if len(ds) == 0 {
		return "idle", nil
	}
	d := ds[0]
	var payload []byte
	if err := d.Scan(&payload); err != nil {
		return "", err
	}
	herr := handle(payload)
	var re retryError
	switch {
	case herr == nil:
		return "ack", d.Ack(ctx)
	case errors.As(herr, &re):
		return "retry", d.Retry(ctx, re.after)
	case errors.Is(herr, errShutdown):
		return "release", d.Release(ctx)
	default:
		return "dead", d.Dead(ctx)
	}
}

// verdict is a handler that returns err whatever the payload.
func verdict(err error) func([]byte) error { return func([]byte) error { return err } }

// t0 is a stopped test clock's reading: not UTC, with nanoseconds, so that
// the exact match of every time argument is tried.
var t0 = time.Date(2024, 3, 1, 14, 0, 0, 123456789, time.FixedZone("CEST", 2*3600))

func stopped() time.Time { return t0 }

var (
	leaseTable    = inbox.Table{Name: "jobs", LockedUntil: "locked_until", DeadTable: "dead_jobs"}
	rowLockTable  = inbox.Table{Name: "jobs", NotBefore: "not_before", DeadTable: "dead_jobs"}
	claimsTable   = inbox.Table{Name: "jobs", NotBefore: "not_before", ClaimsTable: "job_claims", MaxClaims: 3, DeadTable: "dead_jobs"}
	advisoryTable = inbox.Table{Name: "jobs", AdvisoryKey: "id", NotBefore: "not_before", DeadTable: "dead_jobs"}
)

// setup returns a queue on a fresh sqlmock with exact matching, the
// helper for it, and the sqlmock.
func setup(t *testing.T, cfg inbox.Config) (*inbox.Queue, *inboxtest.Mock, sqlmock.Sqlmock) {
	t.Helper()
	db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	q, err := inbox.New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return q, inboxtest.New(mock, q, cfg), mock
}

func met(t *testing.T, mock sqlmock.Sqlmock) {
	t.Helper()
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Error(err)
	}
}

type engine struct {
	name    string
	dialect inbox.Dialect
}

var engines = []engine{{"postgres", inbox.Postgres}, {"mysql", inbox.MySQL}, {"sqlite", inbox.SQLite}}

type form struct {
	name  string
	table inbox.Table
}

var forms = []form{{"lease", leaseTable}, {"rowlock", rowLockTable}, {"claims", claimsTable}, {"advisory", advisoryTable}}

type clock struct {
	name string
	now  func() time.Time
}

var clocks = []clock{{"dbclock", nil}, {"injected", stopped}}

// each runs f for every form, engine and clock the package serves
// (SQLite has no row lock), with statements sent as text and, under
// "prepared", with Config.Prepare.
func each(t *testing.T, f func(t *testing.T, cfg inbox.Config)) {
	for _, e := range engines {
		for _, fm := range forms {
			if e.dialect == inbox.SQLite && fm.table.LockedUntil == "" && fm.table.AdvisoryKey == "" {
				continue
			}
			for _, c := range clocks {
				cfg := inbox.Config{Dialect: e.dialect, Table: fm.table, Now: c.now}
				t.Run(e.name+"/"+fm.name+"/"+c.name, func(t *testing.T) { f(t, cfg) })
				cfg.Prepare = true
				t.Run(e.name+"/"+fm.name+"/"+c.name+"/prepared", func(t *testing.T) { f(t, cfg) })
			}
		}
	}
}

// lostErr is what a settlement whose hold is gone returns under the form
// of cfg: ErrLeaseLost, or under the row lock the session's error.
func lostErr(cfg inbox.Config) error {
	if cfg.Table.LockedUntil == "" && cfg.Table.AdvisoryKey == "" {
		return inboxtest.ErrSessionLost
	}
	return inbox.ErrLeaseLost
}

func TestWorkerAck(t *testing.T) {
	each(t, func(t *testing.T, cfg inbox.Config) {
		q, m, mock := setup(t, cfg)
		m.ExpectClaim(1, inboxtest.Job{ID: 7, Data: []any{[]byte("resize a.png")}})
		m.ExpectAck(7)
		var got string
		did, err := work(context.Background(), q, func(p []byte) error { got = string(p); return nil })
		if did != "ack" || err != nil || got != "resize a.png" {
			t.Errorf("work = %q, %v (payload %q), want ack, nil", did, err, got)
		}
		met(t, mock)
	})
}

func TestWorkerRetry(t *testing.T) {
	each(t, func(t *testing.T, cfg inbox.Config) {
		q, m, mock := setup(t, cfg)
		m.ExpectClaim(1, inboxtest.Job{ID: 7, Attempt: 3, Data: []any{[]byte("p")}})
		m.ExpectRetry(7, 90*time.Second)
		did, err := work(context.Background(), q, verdict(retryError{90 * time.Second}))
		if did != "retry" || err != nil {
			t.Errorf("work = %q, %v, want retry, nil", did, err)
		}
		met(t, mock)
	})
}

// A retry without a delay writes nothing under the row lock and advisory
// forms, and still needs its own expectation: the commit, the unlock.
func TestWorkerRetryNow(t *testing.T) {
	each(t, func(t *testing.T, cfg inbox.Config) {
		q, m, mock := setup(t, cfg)
		m.ExpectClaim(1, inboxtest.Job{ID: 7, Data: []any{[]byte("p")}})
		m.ExpectRetry(7, 0)
		did, err := work(context.Background(), q, verdict(retryError{0}))
		if did != "retry" || err != nil {
			t.Errorf("work = %q, %v, want retry, nil", did, err)
		}
		met(t, mock)
	})
}

func TestWorkerRelease(t *testing.T) {
	each(t, func(t *testing.T, cfg inbox.Config) {
		q, m, mock := setup(t, cfg)
		m.ExpectClaim(1, inboxtest.Job{ID: 7, Data: []any{[]byte("p")}})
		m.ExpectRelease(7)
		did, err := work(context.Background(), q, verdict(errShutdown))
		if did != "release" || err != nil {
			t.Errorf("work = %q, %v, want release, nil", did, err)
		}
		met(t, mock)
	})
}

func TestWorkerDead(t *testing.T) {
	each(t, func(t *testing.T, cfg inbox.Config) {
		q, m, mock := setup(t, cfg)
		m.ExpectClaim(1, inboxtest.Job{ID: 7, Attempt: 5, Data: []any{[]byte("p")}})
		m.ExpectDead(7)
		did, err := work(context.Background(), q, verdict(errPoison))
		if did != "dead" || err != nil {
			t.Errorf("work = %q, %v, want dead, nil", did, err)
		}
		met(t, mock)
	})
}

func TestWorkerIdle(t *testing.T) {
	each(t, func(t *testing.T, cfg inbox.Config) {
		q, m, mock := setup(t, cfg)
		m.ExpectEmptyClaim(1)
		did, err := work(context.Background(), q, func([]byte) error {
			t.Error("handler called without a job")
			return nil
		})
		if did != "idle" || err != nil {
			t.Errorf("work = %q, %v, want idle, nil", did, err)
		}
		met(t, mock)
	})
}

// Every settlement can find its hold gone: the lease ran out and another
// worker took the job (lease), the row changed under a cut session
// (advisory), the session itself ended (row lock).
func TestWorkerLeaseLost(t *testing.T) {
	settlements := []struct {
		name    string
		call    inboxtest.Call
		handler func([]byte) error
		did     string
	}{
		{"ack", inboxtest.Ack, verdict(nil), "ack"},
		{"retry", inboxtest.Retry(time.Minute), verdict(retryError{time.Minute}), "retry"},
		{"release", inboxtest.Release, verdict(errShutdown), "release"},
		{"dead", inboxtest.Dead, verdict(errPoison), "dead"},
	}
	each(t, func(t *testing.T, cfg inbox.Config) {
		for _, s := range settlements {
			s := s
			t.Run(s.name, func(t *testing.T) {
				q, m, mock := setup(t, cfg)
				m.ExpectClaim(1, inboxtest.Job{ID: 7, Attempt: 2, Data: []any{[]byte("p")}})
				m.ExpectLeaseLost(7, s.call)
				did, err := work(context.Background(), q, s.handler)
				if did != s.did || !errors.Is(err, lostErr(cfg)) {
					t.Errorf("work = %q, %v, want %s and %v", did, err, s.did, lostErr(cfg))
				}
				met(t, mock)
			})
		}
	})
}

// A job Queue.Cancel deleted while held: each settlement of the lease and
// advisory forms returns ErrCancelled, which matches ErrLeaseLost.
func TestWorkerCancelled(t *testing.T) {
	settlements := []struct {
		name    string
		call    inboxtest.Call
		handler func([]byte) error
		did     string
	}{
		{"ack", inboxtest.Ack, verdict(nil), "ack"},
		{"retry", inboxtest.Retry(time.Minute), verdict(retryError{time.Minute}), "retry"},
		{"dead", inboxtest.Dead, verdict(errPoison), "dead"},
	}
	each(t, func(t *testing.T, cfg inbox.Config) {
		if cfg.Table.LockedUntil == "" && cfg.Table.AdvisoryKey == "" {
			// The row lock's Cancel refuses a held job: nothing to expect.
			_, m, _ := setup(t, cfg)
			m.ExpectClaim(1, inboxtest.Job{ID: 7, Data: []any{[]byte("p")}})
			defer func() {
				if r := fmt.Sprint(recover()); !strings.Contains(r, "ErrInWork") {
					t.Errorf("ExpectCancelled under the row lock: panic %q, want one naming ErrInWork", r)
				}
			}()
			m.ExpectCancelled(7, inboxtest.Ack)
			return
		}
		for _, s := range settlements {
			t.Run(s.name, func(t *testing.T) {
				q, m, mock := setup(t, cfg)
				m.ExpectClaim(1, inboxtest.Job{ID: 7, Attempt: 2, Data: []any{[]byte("p")}})
				m.ExpectCancelled(7, s.call)
				did, err := work(context.Background(), q, s.handler)
				if did != s.did || !errors.Is(err, inbox.ErrCancelled) || !errors.Is(err, inbox.ErrLeaseLost) {
					t.Errorf("work = %q, %v, want %s and ErrCancelled", did, err, s.did)
				}
				met(t, mock)
			})
		}
	})
}

// A retry to the very expiry the lease already has changes no row, which
// MySQL reports as none affected: the lost lease is then confirmed by
// counting the token, which the helper expects too.
func TestWorkerLeaseLostSameExpiry(t *testing.T) {
	for _, e := range engines {
		t.Run(e.name, func(t *testing.T) {
			cfg := inbox.Config{Dialect: e.dialect, Table: leaseTable, Now: stopped, Lease: time.Minute}
			q, m, mock := setup(t, cfg)
			m.ExpectClaim(1, inboxtest.Job{ID: 7, Data: []any{[]byte("p")}})
			m.ExpectLeaseLost(7, inboxtest.Retry(time.Minute))
			did, err := work(context.Background(), q, verdict(retryError{time.Minute}))
			if did != "retry" || !errors.Is(err, inbox.ErrLeaseLost) {
				t.Errorf("work = %q, %v, want retry and ErrLeaseLost", did, err)
			}
			met(t, mock)
		})
	}
}

// workAll claims up to max jobs and acks each; it returns the ids.
func workAll(ctx context.Context, q *inbox.Queue, max int) ([]any, error) {
	return settleAll(ctx, q, max, (*inbox.Delivery).Ack)
}

// settleAll claims up to max jobs and settles each with settle; it returns
// the ids settled.
func settleAll(ctx context.Context, q *inbox.Queue, max int, settle func(*inbox.Delivery, context.Context) error) ([]any, error) {
	ds, err := q.Claim(ctx, max)
	if err != nil {
		return nil, err
	}
	var ids []any
	for _, d := range ds {
		if err := settle(d, ctx); err != nil {
			return ids, err
		}
		ids = append(ids, d.ID())
	}
	return ids, nil
}

// Claims of several jobs, and of fewer than asked: MySQL's lease marks its
// rows sixteen ids at a time, the row lock takes one transaction per job
// and tries once more when it got fewer than max, the advisory form reads
// the table's identity at its first claim only.
func TestWorkerClaimsMany(t *testing.T) {
	each(t, func(t *testing.T, cfg inbox.Config) {
		q, m, mock := setup(t, cfg)
		for round, n := range []int{18, 3, 0} {
			var jobs []inboxtest.Job
			var want []any
			for i := 0; i < n; i++ {
				id := int64(100*round + i + 1)
				jobs = append(jobs, inboxtest.Job{ID: id, Attempt: i%3 + 1, Data: []any{[]byte(fmt.Sprint("job ", id))}})
				want = append(want, id)
			}
			m.ExpectClaim(20, jobs...)
			for _, j := range jobs {
				m.ExpectAck(j.ID)
			}
			ids, err := workAll(context.Background(), q, 20)
			if err != nil || fmt.Sprint(ids) != fmt.Sprint(want) {
				t.Fatalf("round %d: workAll = %v, %v, want %v", round, ids, err, want)
			}
		}
		met(t, mock)
	})
}

// The keeper's extension moves the lease's expiry, which the later
// settlement's token carries.
func TestWorkerExtend(t *testing.T) {
	each(t, func(t *testing.T, cfg inbox.Config) {
		q, m, mock := setup(t, cfg)
		ctx := context.Background()
		m.ExpectClaim(1, inboxtest.Job{ID: "0190d2f4-7d1c-7c3a-9a4e-2f1c0b5e8a11", Data: []any{[]byte("p")}})
		m.ExpectExtend("0190d2f4-7d1c-7c3a-9a4e-2f1c0b5e8a11")
		m.ExpectExtend("0190d2f4-7d1c-7c3a-9a4e-2f1c0b5e8a11")
		m.ExpectRetry("0190d2f4-7d1c-7c3a-9a4e-2f1c0b5e8a11", time.Hour)
		ds, err := q.Claim(ctx, 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("Claim: %d, %v", len(ds), err)
		}
		for i := 0; i < 2; i++ {
			if err := ds[0].Extend(ctx); err != nil {
				t.Fatalf("Extend: %v", err)
			}
		}
		if err := ds[0].Retry(ctx, time.Hour); err != nil {
			t.Fatalf("Retry: %v", err)
		}
		met(t, mock)
	})
}

func TestWorkerExtendLost(t *testing.T) {
	for _, e := range engines {
		for _, c := range clocks {
			t.Run(e.name+"/"+c.name, func(t *testing.T) {
				cfg := inbox.Config{Dialect: e.dialect, Table: leaseTable, Now: c.now}
				q, m, mock := setup(t, cfg)
				ctx := context.Background()
				m.ExpectClaim(1, inboxtest.Job{ID: 7, Data: []any{[]byte("p")}})
				m.ExpectLeaseLost(7, inboxtest.Extend)
				ds, err := q.Claim(ctx, 1)
				if err != nil || len(ds) != 1 {
					t.Fatalf("Claim: %d, %v", len(ds), err)
				}
				if err := ds[0].Extend(ctx); !errors.Is(err, inbox.ErrLeaseLost) {
					t.Errorf("Extend = %v, want ErrLeaseLost", err)
				}
				// Finished by the verdict: nothing more is sent.
				if err := ds[0].Ack(ctx); !errors.Is(err, inbox.ErrSettled) {
					t.Errorf("Ack after a lost lease = %v, want ErrSettled", err)
				}
				met(t, mock)
			})
		}
	}
}

// A description with a schema, several data columns and, for the advisory
// form, a key column other than the id, whose jobs are held one at a time.
func TestWorkerOwnColumns(t *testing.T) {
	tables := map[string]inbox.Table{
		"lease": {Name: "app.report_jobs", ID: "job_id", Attempt: "tries", Data: []string{"kind", "body"},
			LockedUntil: "lease_until", DeadTable: "app.dead_reports"},
		"rowlock": {Name: "app.report_jobs", ID: "job_id", Attempt: "tries", Data: []string{"kind", "body"},
			NotBefore: "run_after", DeadTable: "app.dead_reports", ClaimsTable: "app.report_claims", MaxClaims: 5},
		"advisory": {Name: "app.report_jobs", ID: "job_id", Attempt: "tries", Data: []string{"kind", "body"},
			AdvisoryKey: "tenant", NotBefore: "run_after", DeadTable: "app.dead_reports"},
	}
	for _, e := range engines {
		for name, tb := range tables {
			if e.dialect == inbox.SQLite && name == "rowlock" {
				continue
			}
			for _, c := range clocks {
				cfg := inbox.Config{Dialect: e.dialect, Table: tb, Now: c.now, Lease: time.Minute}
				if name != "lease" {
					cfg.Lease = 0
				}
				t.Run(e.name+"/"+name+"/"+c.name, func(t *testing.T) {
					q, m, mock := setup(t, cfg)
					ctx := context.Background()
					m.ExpectClaim(3,
						inboxtest.Job{ID: 1, Key: "acme", Data: []any{"pdf", []byte("q1")}},
						inboxtest.Job{ID: 2, Key: "initech", Attempt: 2, Data: []any{"csv", []byte("q2")}})
					m.ExpectDead(2)
					m.ExpectLeaseLost(1, inboxtest.Ack)
					ds, err := q.Claim(ctx, 3)
					if err != nil || len(ds) != 2 {
						t.Fatalf("Claim: %d, %v", len(ds), err)
					}
					var kind string
					var body []byte
					if err := ds[1].Scan(&kind, &body); err != nil || kind != "csv" || string(body) != "q2" || ds[1].Attempt() != 2 {
						t.Errorf("job 2: %q %q attempt %d, %v", kind, body, ds[1].Attempt(), err)
					}
					if err := ds[1].Dead(ctx); err != nil {
						t.Errorf("Dead: %v", err)
					}
					if err := ds[0].Ack(ctx); !errors.Is(err, lostErr(cfg)) {
						t.Errorf("Ack = %v, want %v", err, lostErr(cfg))
					}
					met(t, mock)
				})
			}
		}
	}
}

// rewritten wraps a dialect and changes the text of every statement it
// returns: a stand-in for a new version of the package's SQL. Its Unwrap
// keeps the wrapped dialect's locks and identity.
type rewritten struct{ inbox.Dialect }

func (r rewritten) Unwrap() inbox.Dialect { return r.Dialect }

func (r rewritten) Statements(n *dialect.Names) (*inbox.Statements, error) {
	st, err := r.Dialect.Statements(n)
	if err != nil {
		return nil, err
	}
	for _, s := range []*dialect.Stmt{&st.Now, &st.Claim.Take, &st.Claim.TakeOne, &st.Claim.Select, &st.Claim.SelectMore, &st.Claim.Mark, &st.Claim.MarkOne, &st.Advisory.Candidates,
		&st.Advisory.CandidatesAfter, &st.Settle.Extend, &st.Settle.Exists, &st.Settle.Ack, &st.Settle.Retry, &st.Settle.Release, &st.Settle.Dead,
		&st.Settle.DeadDelete, &st.RowLock.ClaimsCount, &st.RowLock.ClaimsRead, &st.RowLock.ClaimsGiveBack, &st.RowLock.ClaimsClear} {
		if s.SQL != "" {
			s.SQL = "/* v2 */ " + s.SQL
		}
	}
	return st, nil
}

// The helper follows the package: the worker's tests, unchanged, pass
// against statements whose text changed.
func TestWorkerFollowsChangedSQL(t *testing.T) {
	for _, e := range engines {
		for _, fm := range forms {
			if e.dialect == inbox.SQLite && fm.table.LockedUntil == "" && fm.table.AdvisoryKey == "" {
				continue
			}
			cfg := inbox.Config{Dialect: rewritten{e.dialect}, Table: fm.table}
			t.Run(e.name+"/"+fm.name, func(t *testing.T) {
				q, m, mock := setup(t, cfg)
				m.ExpectClaim(1, inboxtest.Job{ID: 7, Data: []any{[]byte("p")}})
				m.ExpectDead(7)
				if did, err := work(context.Background(), q, verdict(errPoison)); did != "dead" || err != nil {
					t.Errorf("work = %q, %v", did, err)
				}
				met(t, mock)
			})
		}
	}
}

// The row lock's handler writes through the claim's transaction; its
// statements are the test's own, between the claim and the settlement,
// after the savepoint Tx takes (ExpectTx), which a Retry rolls back to.
func TestWorkerRowLockTx(t *testing.T) {
	for _, e := range engines[:2] {
		for _, fail := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/fail=%v", e.name, fail), func(t *testing.T) {
				cfg := inbox.Config{Dialect: e.dialect, Table: rowLockTable}
				q, m, mock := setup(t, cfg)
				ctx := context.Background()
				m.ExpectClaim(1, inboxtest.Job{ID: 7, Data: []any{[]byte("p")}})
				m.ExpectTx(7)
				mock.ExpectExec("INSERT INTO reports (job) VALUES (7)").WillReturnResult(sqlmock.NewResult(0, 1))
				if fail {
					m.ExpectRetry(7, 0)
				} else {
					m.ExpectAck(7)
				}
				ds, err := q.Claim(ctx, 1)
				if err != nil || len(ds) != 1 {
					t.Fatalf("Claim: %d, %v", len(ds), err)
				}
				if _, err := ds[0].Tx().ExecContext(ctx, "INSERT INTO reports (job) VALUES (7)"); err != nil {
					t.Fatal(err)
				}
				if fail {
					err = ds[0].Retry(ctx, 0)
				} else {
					err = ds[0].Ack(ctx)
				}
				if err != nil {
					t.Fatal(err)
				}
				met(t, mock)
			})
		}
	}
}

// panics runs f and returns the message it panicked with.
func panics(f func()) (msg string) {
	defer func() {
		if r := recover(); r != nil {
			msg = fmt.Sprint(r)
		}
	}()
	f()
	return ""
}

// A mistake in the test is named, at the line that makes it.
func TestMisuse(t *testing.T) {
	lease := inbox.Config{Dialect: inbox.Postgres, Table: leaseTable}
	rowLock := inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "jobs"}}
	advisory := inbox.Config{Dialect: inbox.MySQL, Table: inbox.Table{Name: "jobs", AdvisoryKey: "id"}}
	tenant := inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "jobs", AdvisoryKey: "tenant"}}
	job := inboxtest.Job{ID: 7, Data: []any{[]byte("p")}}
	cases := []struct {
		name string
		cfg  inbox.Config
		f    func(m *inboxtest.Mock)
		want string
	}{
		{"not claimed", lease, func(m *inboxtest.Mock) { m.ExpectAck(7) }, "job 7 is not held"},
		{"settled twice", lease, func(m *inboxtest.Mock) { m.ExpectClaim(1, job); m.ExpectAck(7); m.ExpectAck(7) }, "job 7 is not held"},
		{"more than max", lease, func(m *inboxtest.Mock) { m.ExpectClaim(1, job, inboxtest.Job{ID: 8, Data: []any{nil}}) }, "2 jobs for a claim of at most 1"},
		{"twice", lease, func(m *inboxtest.Mock) { m.ExpectClaim(2, job, job) }, "listed twice"},
		{"data", lease, func(m *inboxtest.Mock) { m.ExpectClaim(1, inboxtest.Job{ID: 7}) }, "0 data values for the 1 data columns"},
		{"id", lease, func(m *inboxtest.Mock) { m.ExpectClaim(1, inboxtest.Job{ID: 1.5, Data: []any{nil}}) }, "want an integer or a string"},
		{"no dead table", rowLock, func(m *inboxtest.Mock) { m.ExpectClaim(1, job); m.ExpectDead(7) }, "no dead table"},
		{"no not-before", rowLock, func(m *inboxtest.Mock) { m.ExpectClaim(1, job); m.ExpectRetry(7, time.Minute) }, "needs Table.NotBefore"},
		{"no probe", lease, func(m *inboxtest.Mock) { m.ExpectProbe(true) }, "claims at once, without a probe"},
		{"row lock extend lost", rowLock, func(m *inboxtest.Mock) { m.ExpectClaim(1, job); m.ExpectLeaseLost(7, inboxtest.Extend) }, "Extend under the row lock form sends nothing"},
		{"advisory retry lost", advisory, func(m *inboxtest.Mock) { m.ExpectClaim(1, job); m.ExpectLeaseLost(7, inboxtest.Retry(0)) }, "Retry(0s) under the advisory lock form sends nothing"},
		{"key needed", tenant, func(m *inboxtest.Mock) { m.ExpectClaim(1, job) }, `Job.Key is needed: the advisory key column "tenant" is not the id`},
		{"shared key", tenant, func(m *inboxtest.Mock) {
			m.ExpectClaim(2, inboxtest.Job{ID: 1, Key: "acme", Data: []any{nil}}, inboxtest.Job{ID: 2, Key: "acme", Data: []any{nil}})
		}, "the queue claims 1 of the 2 jobs"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			q, err := inbox.New(db, c.cfg)
			if err != nil {
				t.Fatal(err)
			}
			m := inboxtest.New(mock, q, c.cfg)
			if msg := panics(func() { c.f(m) }); !strings.Contains(msg, c.want) {
				t.Errorf("panic %q, want one containing %q", msg, c.want)
			}
		})
	}

	// A configuration other than the queue's.
	db, mock, _ := sqlmock.New()
	defer db.Close()
	q, _ := inbox.New(db, lease)
	other := lease
	other.Table.Name = "other_jobs"
	if msg := panics(func() { inboxtest.New(mock, q, other) }); !strings.Contains(msg, "cfg is not the configuration q was made with") {
		t.Errorf("New with another configuration: panic %q", msg)
	}

	// A queue that prepares its statements is no mistake: the helper
	// expects the prepares too (TestWorkerPrepared).
	prepared := lease
	prepared.Prepare = true
	pq, _ := inbox.New(db, prepared)
	if msg := panics(func() { inboxtest.New(mock, pq, prepared) }); msg != "" {
		t.Errorf("New with Config.Prepare: panic %q", msg)
	}
}

// The pool decides how many jobs the row lock and advisory forms claim,
// each in work holding a connection and the last one left free: the
// helper assumes room for every job it is told of, so a test whose pool is
// limited leaves room for the largest claim plus one.
func TestWorkerPoolRoom(t *testing.T) {
	for _, tb := range []inbox.Table{rowLockTable, advisoryTable} {
		db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		db.SetMaxOpenConns(3) // two jobs in work, one connection for the rest
		cfg := inbox.Config{Dialect: inbox.Postgres, Table: tb}
		q, err := inbox.New(db, cfg)
		if err != nil {
			t.Fatal(err)
		}
		m := inboxtest.New(mock, q, cfg)
		m.ExpectClaim(2, inboxtest.Job{ID: 1, Data: []any{nil}}, inboxtest.Job{ID: 2, Data: []any{nil}})
		m.ExpectRelease(1)
		m.ExpectRelease(2)
		if ids, err := settleAll(context.Background(), q, 2, (*inbox.Delivery).Release); err != nil || len(ids) != 2 {
			t.Fatalf("%v: claimed %v, %v", q.Form(), ids, err)
		}
		met(t, mock)
	}
}

// The expectations are tight: a worker that does something else than
// expected fails, on every form, engine and clock.
func TestWorkerWrongOutcomeFails(t *testing.T) {
	each(t, func(t *testing.T, cfg inbox.Config) {
		q, m, mock := setup(t, cfg)
		m.ExpectClaim(1, inboxtest.Job{ID: 7, Data: []any{[]byte("p")}})
		m.ExpectDead(7)
		if did, err := work(context.Background(), q, verdict(errShutdown)); err == nil {
			t.Errorf("work = %q, nil: a release passed for an expected move to the dead table", did)
		}
		if mock.ExpectationsWereMet() == nil {
			t.Error("ExpectationsWereMet = nil with the dead move unmet")
		}
	})
}

// Times from Config.Now are matched exactly: a clock that moved between
// the expectation and the worker's call fails the test.
func TestWorkerClockMatchedExactly(t *testing.T) {
	for _, e := range engines {
		t.Run(e.name, func(t *testing.T) {
			now := t0
			cfg := inbox.Config{Dialect: e.dialect, Table: leaseTable, Now: func() time.Time { return now }}
			q, m, mock := setup(t, cfg)
			m.ExpectClaim(1, inboxtest.Job{ID: 7, Data: []any{[]byte("p")}})
			m.ExpectRetry(7, time.Minute)
			ctx := context.Background()
			ds, err := q.Claim(ctx, 1)
			if err != nil || len(ds) != 1 {
				t.Fatalf("Claim: %d, %v", len(ds), err)
			}
			now = now.Add(time.Microsecond)
			if err := ds[0].Retry(ctx, time.Minute); err == nil {
				t.Error("Retry at another time than expected passed")
			}
			if mock.ExpectationsWereMet() == nil {
				t.Error("ExpectationsWereMet = nil with the retry unmet")
			}
		})
	}
}
