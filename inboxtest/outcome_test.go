package inboxtest_test

// A test that fails says so in the package's terms: which call on which
// job was expected, which was made, with its delay and error; the SQL
// after. Queues with Config.Prepare are tested like any other, and a retry
// after the worker's jittered default backoff is expected with AnyDelay.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/inboxtest"
	"github.com/sqlinbox/inbox/worker"
)

// fakeTB records what a helper reports through Errorf; a Fatalf, which
// none of these tests expects, panics with its message.
type fakeTB struct {
	testing.TB // the real test's: Cleanup, Name, …
	mu         sync.Mutex
	msgs       []string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.msgs = append(f.msgs, fmt.Sprintf(format, args...))
}

func (f *fakeTB) Error(args ...any) { f.Errorf("%s", fmt.Sprint(args...)) }

func (f *fakeTB) Fatalf(format string, args ...any) {
	panic("fakeTB.Fatalf: " + fmt.Sprintf(format, args...))
}

func (f *fakeTB) Fatal(args ...any) { f.Fatalf("%s", fmt.Sprint(args...)) }

func (f *fakeTB) messages() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.msgs...)
}

// reported checks that f got one message, beginning with want.
func reported(t *testing.T, f *fakeTB, want string) string {
	t.Helper()
	msgs := f.messages()
	if len(msgs) != 1 || !strings.HasPrefix(msgs[0], want) {
		t.Errorf("reported %q,\nwant one message beginning %q", msgs, want)
		return ""
	}
	t.Log(msgs[0])
	return msgs[0]
}

// setupDB is setup on a database of NewDB, which reports to f.
func setupDB(f *fakeTB, cfg inbox.Config) (*inbox.Queue, *inboxtest.Mock, sqlmock.Sqlmock) {
	q, m, mock, _ := setupWithDB(f, cfg)
	return q, m, mock
}

func setupWithDB(f *fakeTB, cfg inbox.Config) (*inbox.Queue, *inboxtest.Mock, sqlmock.Sqlmock, *sql.DB) {
	db, mock := inboxtest.NewDB(f)
	q, err := inbox.New(db, cfg)
	if err != nil {
		f.TB.Fatal(err)
	}
	return q, inboxtest.New(mock, q, cfg), mock, db
}

// The newcomer's case: Ack expected, the worker retries. On MySQL the
// retry's first statement reads the engine's clock, which sqlmock called
// "not expected"; the test now says what the worker did, on every form,
// engine and clock, the job's error too where the table records it.
func TestWrongFateSaysOutcome(t *testing.T) {
	each(t, func(t *testing.T, cfg inbox.Config) {
		for _, withError := range []bool{false, true} {
			t.Run(fmt.Sprintf("error=%v", withError), func(t *testing.T) {
				f := &fakeTB{TB: t}
				// Where the queue reads time.Now (SQLite without
				// Config.Now), the delay is known only about.
				after := "after 2s"
				if cfg.Dialect == inbox.SQLite && cfg.Now == nil {
					after = "after about 2s"
				}
				want := "inboxtest: expected Ack of job 7, got Retry(" + after + ")"
				if withError {
					cfg.Table.LastError = "last_error"
					want = "inboxtest: expected Ack of job 7, got Retry(" + after + `, error "carrier down")`
				}
				q, m, mock := setupDB(f, cfg)
				m.ExpectClaim(1, inboxtest.Job{ID: 7, Data: []any{[]byte("p")}})
				m.ExpectAck(7)
				ctx := context.Background()
				ds, err := q.Claim(ctx, 1)
				if err != nil || len(ds) != 1 {
					t.Fatalf("Claim: %d, %v (%q)", len(ds), err, f.messages())
				}
				ds[0].SetError(errors.New("carrier down"))
				err = ds[0].Retry(ctx, 2*time.Second)
				msg := reported(t, f, want)
				first := strings.SplitN(msg, "\n", 2)[0]
				if err == nil || !strings.Contains(err.Error(), first) {
					t.Errorf("Retry returned %v, want the report's first line %q", err, first)
				}
				if !strings.Contains(msg, "\n\tsqlmock: ") {
					t.Errorf("no SQL detail after the outcomes: %q", msg)
				}
				if err := mock.ExpectationsWereMet(); err == nil || err.Error() != first {
					t.Errorf("ExpectationsWereMet = %v, want %q", err, first)
				}
				if err := m.ExpectationsWereMet(); err == nil || err.Error() != first {
					t.Errorf("Mock.ExpectationsWereMet = %v, want %q", err, first)
				}
			})
		}
	})
}

// Each kind of mistake, named by call, job, delay; the SQL only after.
func TestWrongCallSaysOutcome(t *testing.T) {
	pg := inbox.Config{Dialect: inbox.Postgres, Table: leaseTable}
	myRowLock := inbox.Config{Dialect: inbox.MySQL, Table: rowLockTable}
	myLease := inbox.Config{Dialect: inbox.MySQL, Table: leaseTable, Now: stopped}
	two := []inboxtest.Job{{ID: 7, Data: []any{[]byte("a")}}, {ID: 8, Data: []any{[]byte("b")}}}
	cases := []struct {
		name   string
		cfg    inbox.Config
		expect func(m *inboxtest.Mock, mock sqlmock.Sqlmock)
		do     func(ctx context.Context, q *inbox.Queue, db *sql.DB) error
		want   string
	}{
		{"another job", pg, func(m *inboxtest.Mock, _ sqlmock.Sqlmock) {
			m.ExpectClaim(2, two...)
			m.ExpectAck(7)
			m.ExpectAck(8)
		}, func(ctx context.Context, q *inbox.Queue, _ *sql.DB) error {
			ds, _ := q.Claim(ctx, 2)
			return ds[1].Ack(ctx)
		}, "inboxtest: expected Ack of job 7, got Ack of job 8"},
		{"another delay", myLease, func(m *inboxtest.Mock, _ sqlmock.Sqlmock) {
			m.ExpectClaim(1, two[0])
			m.ExpectRetry(7, time.Minute)
		}, func(ctx context.Context, q *inbox.Queue, _ *sql.DB) error {
			ds, _ := q.Claim(ctx, 1)
			return ds[0].Retry(ctx, 2*time.Minute)
		}, "inboxtest: expected Retry(after 1m0s) of job 7, got Retry(after 2m0s)"},
		{"release under the row lock", myRowLock, func(m *inboxtest.Mock, _ sqlmock.Sqlmock) {
			m.ExpectClaim(1, two[0])
			m.ExpectDead(7)
		}, func(ctx context.Context, q *inbox.Queue, _ *sql.DB) error {
			ds, _ := q.Claim(ctx, 1)
			return ds[0].Release(ctx)
		}, "inboxtest: expected Dead of job 7, got Release"},
		{"a claim where a settlement was expected", pg, func(m *inboxtest.Mock, _ sqlmock.Sqlmock) {
			m.ExpectClaim(1, two[0])
			m.ExpectAck(7)
		}, func(ctx context.Context, q *inbox.Queue, _ *sql.DB) error {
			q.Claim(ctx, 1)
			_, err := q.Claim(ctx, 5)
			return err
		}, "inboxtest: expected Ack of job 7, got Claim(ctx, 5)"},
		{"a claim of another max", pg, func(m *inboxtest.Mock, _ sqlmock.Sqlmock) {
			m.ExpectClaim(1, two[0])
		}, func(ctx context.Context, q *inbox.Queue, _ *sql.DB) error {
			_, err := q.Claim(ctx, 5)
			return err
		}, "inboxtest: expected Claim(ctx, 1) returning job 7, got Claim(ctx, 5)"},
		{"the test's own statement skipped", myRowLock, func(m *inboxtest.Mock, mock sqlmock.Sqlmock) {
			m.ExpectClaim(1, two[0])
			m.ExpectTx(7)
			mock.ExpectExec("INSERT INTO reports (job) VALUES (7)").WillReturnResult(sqlmock.NewResult(0, 1))
			m.ExpectAck(7)
		}, func(ctx context.Context, q *inbox.Queue, _ *sql.DB) error {
			ds, _ := q.Claim(ctx, 1)
			ds[0].Tx()
			return ds[0].Ack(ctx)
		}, "inboxtest: expected the test's own ExpectExec(INSERT INTO reports (job) VALUES (7)), got Ack of job 7"},
		{"a statement not the queue's", pg, func(m *inboxtest.Mock, _ sqlmock.Sqlmock) {
			m.ExpectClaim(1, two[0])
			m.ExpectAck(7)
		}, func(ctx context.Context, q *inbox.Queue, db *sql.DB) error {
			q.Claim(ctx, 1)
			_, err := db.ExecContext(ctx, "INSERT INTO audit (job) VALUES (7)")
			return err
		}, "inboxtest: expected Ack of job 7, got a statement not the queue's (exec INSERT INTO audit (job) VALUES (7))"},
		{"all as expected", pg, func(m *inboxtest.Mock, _ sqlmock.Sqlmock) {
			m.ExpectClaim(1, two[0])
			m.ExpectRelease(7)
		}, func(ctx context.Context, q *inbox.Queue, _ *sql.DB) error {
			ds, _ := q.Claim(ctx, 1)
			return ds[0].Release(ctx)
		}, ""},
		{"more than expected", pg, func(m *inboxtest.Mock, _ sqlmock.Sqlmock) {
			m.ExpectClaim(1, two[0])
		}, func(ctx context.Context, q *inbox.Queue, _ *sql.DB) error {
			ds, _ := q.Claim(ctx, 1)
			return ds[0].Dead(ctx)
		}, "inboxtest: expected nothing more, got Dead of job 7"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := &fakeTB{TB: t}
			q, m, mock, db := setupWithDB(f, c.cfg)
			c.expect(m, mock)
			err := c.do(context.Background(), q, db)
			if c.want == "" {
				if msgs := f.messages(); len(msgs) != 0 || err != nil {
					t.Errorf("a matching call reported %q, %v", msgs, err)
				}
				return
			}
			reported(t, f, c.want)
			if err == nil {
				t.Error("the call returned nil")
			}
		})
	}
}

// An expectation the worker never met is named at the end, in outcome
// words, on NewDB's database (which knows nothing more was sent) and on a
// sqlmock of the test's own (which cannot know what was sent instead).
func TestUnmetSaysOutcome(t *testing.T) {
	cfg := inbox.Config{Dialect: inbox.Postgres, Table: leaseTable}
	f := &fakeTB{TB: t}
	q, m, mock := setupDB(f, cfg)
	m.ExpectClaim(1, inboxtest.Job{ID: 7, Data: []any{[]byte("p")}})
	m.ExpectRetry(7, time.Minute)
	if _, err := q.Claim(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	want := "inboxtest: expected Retry(after 1m0s) of job 7, got no further call\n\tsqlmock: there is a remaining expectation"
	if err := mock.ExpectationsWereMet(); err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("ExpectationsWereMet = %v, want %q…", err, want)
	}
	if msgs := f.messages(); len(msgs) != 0 {
		t.Errorf("reported %q while nothing went wrong yet", msgs)
	}

	q, m, _ = setup(t, cfg)
	m.ExpectClaim(1, inboxtest.Job{ID: 7, Data: []any{[]byte("p")}})
	m.ExpectDead(7)
	if _, err := q.Claim(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	want = "inboxtest: expected Dead of job 7, which was not done"
	if err := m.ExpectationsWereMet(); err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("Mock.ExpectationsWereMet on sqlmock.New = %v, want %q…", err, want)
	}
}

// A test that passes on NewDB's database reports nothing: the worker tests
// of every form, engine and clock, on it.
func TestNewDBPasses(t *testing.T) {
	each(t, func(t *testing.T, cfg inbox.Config) {
		f := &fakeTB{TB: t}
		q, m, mock := setupDB(f, cfg)
		m.ExpectClaim(1, inboxtest.Job{ID: 7, Attempt: 2, Data: []any{[]byte("p")}})
		m.ExpectLeaseLost(7, inboxtest.Retry(time.Minute))
		m.ExpectClaim(20, inboxtest.Job{ID: 1, Data: []any{nil}}, inboxtest.Job{ID: 2, Data: []any{nil}})
		m.ExpectDead(1)
		m.ExpectRelease(2)
		ctx := context.Background()
		if did, err := work(ctx, q, verdict(retryError{time.Minute})); did != "retry" || !errors.Is(err, lostErr(cfg)) {
			t.Errorf("work = %q, %v", did, err)
		}
		ds, err := q.Claim(ctx, 20)
		if err != nil || len(ds) != 2 {
			t.Fatalf("Claim: %d, %v", len(ds), err)
		}
		if err := errors.Join(ds[0].Dead(ctx), ds[1].Release(ctx)); err != nil {
			t.Error(err)
		}
		if err := mock.ExpectationsWereMet(); err != nil {
			t.Error(err)
		}
		if msgs := f.messages(); len(msgs) != 0 {
			t.Errorf("reported %q", msgs)
		}
	})
}

// Config.Prepare: the helper expects the prepares where the queue makes
// them, on every form, engine and clock: at a statement's first use on a
// connection, and before the transactions the queue begins.
func TestWorkerPrepared(t *testing.T) {
	each(t, func(t *testing.T, cfg inbox.Config) {
		if !cfg.Prepare {
			return // each runs it prepared too
		}
		for _, fresh := range []func(t *testing.T, cfg inbox.Config) (*inbox.Queue, *inboxtest.Mock, sqlmock.Sqlmock){
			setup,
			func(t *testing.T, cfg inbox.Config) (*inbox.Queue, *inboxtest.Mock, sqlmock.Sqlmock) {
				return setupDB(&fakeTB{TB: t}, cfg)
			},
		} {
			q, m, _ := fresh(t, cfg)
			ctx := context.Background()
			m.ExpectClaim(1, inboxtest.Job{ID: 7, Data: []any{[]byte("p")}})
			m.ExpectAck(7)
			m.ExpectClaim(1, inboxtest.Job{ID: 7, Attempt: 2, Data: []any{[]byte("p")}})
			m.ExpectRetry(7, 90*time.Second)
			m.ExpectClaim(1, inboxtest.Job{ID: 7, Attempt: 3, Data: []any{[]byte("p")}})
			m.ExpectLeaseLost(7, inboxtest.Dead)
			for _, v := range []error{nil, retryError{90 * time.Second}, errPoison} {
				if _, err := work(ctx, q, verdict(v)); err != nil && !errors.Is(err, lostErr(cfg)) {
					t.Fatalf("work(%v): %v", v, err)
				}
			}
			for round, n := range []int{5, 2, 0} {
				var jobs []inboxtest.Job
				for i := 0; i < n; i++ {
					jobs = append(jobs, inboxtest.Job{ID: int64(100*round + i + 1), Data: []any{[]byte("p")}})
				}
				m.ExpectClaim(8, jobs...)
				for _, j := range jobs {
					m.ExpectRelease(j.ID)
				}
				if ids, err := settleAll(ctx, q, 8, (*inbox.Delivery).Release); err != nil || len(ids) != n {
					t.Fatalf("round %d: %v, %v", round, ids, err)
				}
			}
			if err := m.ExpectationsWereMet(); err != nil {
				t.Error(err)
			}
		}
	})
}

// RunHandler takes a queue with Config.Prepare, which the docs recommend
// for SQLite, lib/pq and MySQL, on each engine and form.
func TestRunHandlerPrepared(t *testing.T) {
	failed := errors.New("smtp down")
	for _, d := range []struct {
		name string
		d    inbox.Dialect
	}{{"postgres", inbox.Postgres}, {"mysql", inbox.MySQL}, {"mariadb", inbox.MariaDB}, {"sqlite", inbox.SQLite}} {
		for _, fm := range forms {
			if d.d == inbox.SQLite && fm.table.LockedUntil == "" && fm.table.AdvisoryKey == "" {
				continue
			}
			t.Run(d.name+"/"+fm.name, func(t *testing.T) {
				opts := inboxtest.HandlerOptions{Queue: inbox.Config{Dialect: d.d, Table: fm.table, Prepare: true},
					Worker: worker.Config{MaxAttempts: 3, Backoff: func(int) time.Duration { return time.Minute }}}
				job := inboxtest.Job{ID: 7, Data: []any{[]byte("ada")}}
				inboxtest.RunHandler(t, func(context.Context, *inbox.Delivery) error { return nil }, job, opts).
					Expect(t, inboxtest.Result{Outcome: worker.OutcomeAcked})
				inboxtest.RunHandler(t, func(context.Context, *inbox.Delivery) error { return failed }, job, opts).
					Expect(t, inboxtest.Result{Outcome: worker.OutcomeRetried, Delay: time.Minute, Err: failed})
				job.Attempt = 3
				inboxtest.RunHandler(t, func(context.Context, *inbox.Delivery) error { return failed }, job, opts).
					Expect(t, inboxtest.Result{Outcome: worker.OutcomeDead, Err: failed})
				inboxtest.RunHandler(t, func(ctx context.Context, d *inbox.Delivery) error { return d.Release(ctx) }, job, opts).
					Expect(t, inboxtest.Result{Outcome: worker.OutcomeSettled, Settled: "release"})
			})
		}
	}
}

// Result.Expect names what was expected and what the loop did.
func TestResultExpect(t *testing.T) {
	carrier := func(context.Context, *inbox.Delivery) error { return errors.New("carrier down") }
	fixed := inboxtest.HandlerOptions{Worker: worker.Config{Backoff: func(int) time.Duration { return 2 * time.Second }}}
	job := inboxtest.Job{ID: 7, Data: []any{[]byte("x")}}
	cases := []struct {
		name   string
		handle worker.Handler
		opts   inboxtest.HandlerOptions
		want   inboxtest.Result
		report string // "": none
	}{
		{"retry for ack", carrier, fixed, inboxtest.Result{Outcome: worker.OutcomeAcked},
			`inboxtest: expected Ack of job 7, got Retry(after 2s, error "carrier down")`},
		{"other delay", carrier, fixed, inboxtest.Result{Outcome: worker.OutcomeRetried, Delay: time.Minute},
			`inboxtest: expected Retry(after 1m0s) of job 7, got Retry(after 2s, error "carrier down")`},
		{"any delay", carrier, fixed, inboxtest.Result{Outcome: worker.OutcomeRetried, Delay: inboxtest.AnyDelay}, ""},
		{"the default backoff", carrier, inboxtest.HandlerOptions{},
			inboxtest.Result{Outcome: worker.OutcomeRetried, Delay: inboxtest.AnyDelay, Err: errors.New("carrier down")}, ""},
		{"other error", carrier, fixed, inboxtest.Result{Outcome: worker.OutcomeRetried, Delay: inboxtest.AnyDelay, Err: errors.New("timeout")},
			`inboxtest: expected Retry(after any delay, error "timeout") of job 7, got Retry(after 2s, error "carrier down")`},
		{"own settlement", func(ctx context.Context, d *inbox.Delivery) error { return d.Dead(ctx) }, fixed,
			inboxtest.Result{Outcome: worker.OutcomeSettled, Settled: "ack"},
			`inboxtest: expected the handler's own Ack of job 7, got the handler's own Dead`},
		{"ack for retry", func(context.Context, *inbox.Delivery) error { return nil }, fixed,
			inboxtest.Result{Outcome: worker.OutcomeRetried, Delay: inboxtest.AnyDelay},
			`inboxtest: expected Retry(after any delay) of job 7, got Ack`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := &fakeTB{TB: t}
			ok := inboxtest.RunHandler(t, c.handle, job, c.opts).Expect(f, c.want)
			msgs := f.messages()
			switch {
			case c.report == "" && (!ok || len(msgs) != 0):
				t.Errorf("Expect = %v, reported %q, want a match", ok, msgs)
			case c.report != "" && (ok || len(msgs) != 1 || msgs[0] != c.report):
				t.Errorf("Expect = %v, reported %q, want %q", ok, msgs, c.report)
			}
		})
	}
}

// The worker's default backoff is jittered: ExpectRetry with AnyDelay
// matches whatever it gives, through the loop's own code (worker.Handle),
// on every form, engine and clock, a retry that records the error and one
// that finds its hold gone too; a retry at once does not match it where the
// retry's time is known.
func TestExpectRetryAnyDelay(t *testing.T) {
	failing := func(context.Context, *inbox.Delivery) error { return errors.New("carrier down") }
	each(t, func(t *testing.T, cfg inbox.Config) {
		cfg.Table.LastError = "last_error"
		q, m, mock := setup(t, cfg)
		ctx := context.Background()
		m.ExpectClaim(1, inboxtest.Job{ID: 7, Data: []any{[]byte("p")}})
		m.ExpectRetryWithError(7, inboxtest.AnyDelay)
		m.ExpectClaim(1, inboxtest.Job{ID: 7, Attempt: 2, Data: []any{[]byte("p")}})
		m.ExpectLeaseLost(7, inboxtest.Retry(inboxtest.AnyDelay))
		for i := 0; i < 2; i++ {
			ds, err := q.Claim(ctx, 1)
			if err != nil || len(ds) != 1 {
				t.Fatalf("Claim: %d, %v", len(ds), err)
			}
			end, err := worker.Handle(ctx, q, worker.Config{MaxAttempts: 5}, ds[0], failing)
			if err != nil || end.Outcome != worker.OutcomeRetried || end.Delay <= 0 {
				t.Fatalf("Handle: %+v, %v", end, err)
			}
			if i == 0 && end.SettleErr != nil {
				t.Errorf("the retry after %v: %v", end.Delay, end.SettleErr)
			}
			if i == 1 && !errors.Is(end.SettleErr, lostErr(cfg)) {
				t.Errorf("the retry after %v: %v, want %v", end.Delay, end.SettleErr, lostErr(cfg))
			}
		}
		met(t, mock)

		if cfg.Dialect == inbox.SQLite && cfg.Now == nil && cfg.Table.LockedUntil != "" {
			return // the lease's time.Now: a zero delay cannot be told from another
		}
		q, m, mock = setup(t, cfg)
		m.ExpectClaim(1, inboxtest.Job{ID: 7, Data: []any{[]byte("p")}})
		m.ExpectRetry(7, inboxtest.AnyDelay)
		// (The advisory form's retry at once sends only its unlock, whose
		// failure the call does not return.)
		work(ctx, q, verdict(retryError{0}))
		if mock.ExpectationsWereMet() == nil {
			t.Error("ExpectationsWereMet = nil with a retry at once for AnyDelay")
		}
	})
}

// Retry(AnyDelay) says so.
func TestCallStringAnyDelay(t *testing.T) {
	if got := inboxtest.Retry(inboxtest.AnyDelay).String(); got != "Retry(any delay)" {
		t.Errorf("String = %q", got)
	}
	if got := inboxtest.Retry(time.Minute).String(); got != "Retry(1m0s)" {
		t.Errorf("String = %q", got)
	}
}
