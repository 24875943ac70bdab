package inbox_test

// The SQL of the operators' tools, pinned per dialect: listing, requeueing
// and purging dead jobs, cancelling a job that waits, and the time of death
// a Dead writes into Table.DeadAt.

import (
	"context"
	"errors"
	"github.com/sqlinbox/inbox/dialect"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqlinbox/inbox"
)

// deadDesc is a lease table with a dead table that keeps the error and the
// time of death.
func deadDesc(form string) inbox.Table {
	t := inbox.Table{Name: "jobs", DeadTable: "dead_jobs", LastError: "last_error", DeadAt: "dead_at"}
	switch form {
	case "lease":
		t.LockedUntil = "locked_until"
	case "advisory":
		t.AdvisoryKey = "id"
	}
	return t
}

// The dead list of deadDesc: a page is the deaths past the cursor and the
// jobs with no time of death (dead before the column was added), each read
// from the index on (dead_at, id), then sorted together, those last.
const (
	pgDeadList          = `SELECT c0, c1, c2, c3, c4 FROM (SELECT * FROM (SELECT "id" AS c0, "attempt" AS c1, "payload" AS c2, "last_error" AS c3, "dead_at" AS c4 FROM "dead_jobs" WHERE "dead_at" IS NOT NULL ORDER BY c4 DESC, c0 DESC LIMIT $1) AS dated UNION ALL SELECT * FROM (SELECT "id" AS c0, "attempt" AS c1, "payload" AS c2, "last_error" AS c3, "dead_at" AS c4 FROM "dead_jobs" WHERE "dead_at" IS NULL ORDER BY c4 DESC, c0 DESC LIMIT $2) AS undated) AS page ORDER BY (c4 IS NULL), c4 DESC, c0 DESC LIMIT $3`
	pgDeadListAfter     = `SELECT c0, c1, c2, c3, c4 FROM (SELECT * FROM (SELECT "id" AS c0, "attempt" AS c1, "payload" AS c2, "last_error" AS c3, "dead_at" AS c4 FROM "dead_jobs" WHERE ("dead_at", "id") < ($1, $2) ORDER BY c4 DESC, c0 DESC LIMIT $3) AS dated UNION ALL SELECT * FROM (SELECT "id" AS c0, "attempt" AS c1, "payload" AS c2, "last_error" AS c3, "dead_at" AS c4 FROM "dead_jobs" WHERE "dead_at" IS NULL ORDER BY c4 DESC, c0 DESC LIMIT $4) AS undated) AS page ORDER BY (c4 IS NULL), c4 DESC, c0 DESC LIMIT $5`
	pgDeadListAfterNull = `SELECT "id", "attempt", "payload", "last_error", "dead_at" FROM "dead_jobs" WHERE "dead_at" IS NULL AND "id" < $1 ORDER BY "dead_at" DESC, "id" DESC LIMIT $2`
	myDeadList          = "SELECT c0, c1, c2, c3, c4 FROM (SELECT * FROM (SELECT `id` AS c0, `attempt` AS c1, `payload` AS c2, `last_error` AS c3, `dead_at` AS c4 FROM `dead_jobs` WHERE `dead_at` IS NOT NULL ORDER BY c4 DESC, c0 DESC LIMIT ?) AS dated UNION ALL SELECT * FROM (SELECT `id` AS c0, `attempt` AS c1, `payload` AS c2, `last_error` AS c3, `dead_at` AS c4 FROM `dead_jobs` WHERE `dead_at` IS NULL ORDER BY c0 DESC LIMIT ?) AS undated) AS page ORDER BY (c4 IS NULL), c4 DESC, c0 DESC LIMIT ?"
	myDeadListAfter     = "SELECT c0, c1, c2, c3, c4 FROM (SELECT * FROM (SELECT `id` AS c0, `attempt` AS c1, `payload` AS c2, `last_error` AS c3, `dead_at` AS c4 FROM `dead_jobs` WHERE `dead_at` <= ? AND (`dead_at` < ? OR `id` < ?) ORDER BY c4 DESC, c0 DESC LIMIT ?) AS dated UNION ALL SELECT * FROM (SELECT `id` AS c0, `attempt` AS c1, `payload` AS c2, `last_error` AS c3, `dead_at` AS c4 FROM `dead_jobs` WHERE `dead_at` IS NULL ORDER BY c0 DESC LIMIT ?) AS undated) AS page ORDER BY (c4 IS NULL), c4 DESC, c0 DESC LIMIT ?"
	myDeadListAfterNull = "SELECT `id`, `attempt`, `payload`, `last_error`, `dead_at` FROM `dead_jobs` IGNORE INDEX (PRIMARY) WHERE `dead_at` IS NULL AND `id` < ? ORDER BY `id` DESC LIMIT ?"
)

func TestDeadJobStatements(t *testing.T) {
	type pins struct {
		list, listAfter, listAfterNull, take, takeDelete, purge, purgeBefore, requeueErr, cancel, cancelLock, exists, dead string
	}
	cases := []struct {
		name    string
		dialect inbox.Dialect
		form    string
		now     func() time.Time
		want    pins
	}{
		{"postgres lease", inbox.Postgres, "lease", nil, pins{
			list:          pgDeadList,
			listAfter:     pgDeadListAfter,
			listAfterNull: pgDeadListAfterNull,
			take:          `DELETE FROM "dead_jobs" WHERE "id" = $1 RETURNING "id", "payload", "last_error"`,
			purge:         `DELETE FROM "dead_jobs"`,
			purgeBefore:   `DELETE FROM "dead_jobs" WHERE "dead_at" < $1`,
			requeueErr:    `UPDATE "jobs" SET "last_error" = $1 WHERE "id" = $2`,
			cancel:        `DELETE FROM "jobs" WHERE "id" = $1`,
			exists:        `SELECT 1 FROM "jobs" WHERE "id" = $1`,
			dead: `WITH gone AS (DELETE FROM "jobs" WHERE "id" = $1 AND "attempt" = $2 AND "locked_until" = $3 RETURNING "id", "payload", "last_error") ` +
				`INSERT INTO "dead_jobs" ("id", "attempt", "payload", "last_error", "dead_at") SELECT "id", $4, "payload", COALESCE($5, "last_error"), statement_timestamp() FROM gone`,
		}},
		{"postgres row lock, injected clock", inbox.Postgres, "rowlock", time.Now, pins{
			list:          pgDeadList,
			listAfter:     pgDeadListAfter,
			listAfterNull: pgDeadListAfterNull,
			take:          `DELETE FROM "dead_jobs" WHERE "id" = $1 RETURNING "id", "payload", "last_error"`,
			purge:         `DELETE FROM "dead_jobs"`,
			purgeBefore:   `DELETE FROM "dead_jobs" WHERE "dead_at" < $1`,
			requeueErr:    `UPDATE "jobs" SET "last_error" = $1 WHERE "id" = $2`,
			cancel:        `DELETE FROM "jobs" WHERE "id" = $1`,
			cancelLock:    `SELECT "id" FROM "jobs" WHERE "id" = $1 FOR UPDATE SKIP LOCKED`,
			exists:        `SELECT 1 FROM "jobs" WHERE "id" = $1`,
			dead: `WITH gone AS (DELETE FROM "jobs" WHERE "id" = $1 RETURNING "id", "payload", "last_error") ` +
				`INSERT INTO "dead_jobs" ("id", "attempt", "payload", "last_error", "dead_at") SELECT "id", $2, "payload", COALESCE($3, "last_error"), $4 FROM gone`,
		}},
		{"mysql advisory", inbox.MySQL, "advisory", nil, pins{
			list:          myDeadList,
			listAfter:     myDeadListAfter,
			listAfterNull: myDeadListAfterNull,
			take:          "SELECT `id`, `payload`, `last_error` FROM `dead_jobs` WHERE `id` = ? FOR UPDATE",
			takeDelete:    "DELETE FROM `dead_jobs` WHERE `id` = ?",
			purge:         "DELETE FROM `dead_jobs`",
			purgeBefore:   "DELETE FROM `dead_jobs` WHERE `dead_at` < ?",
			requeueErr:    "UPDATE `jobs` SET `last_error` = ? WHERE `id` = ?",
			cancel:        "DELETE FROM `jobs` WHERE `id` = ?",
			exists:        "SELECT 1 FROM `jobs` WHERE `id` = ?",
			dead:          "INSERT INTO `dead_jobs` (`id`, `attempt`, `payload`, `last_error`, `dead_at`) SELECT `id`, ?, `payload`, COALESCE(?, `last_error`), UTC_TIMESTAMP(6) FROM `jobs` WHERE `id` = ? AND `attempt` = ?",
		}},
		{"mysql row lock", inbox.MySQL, "rowlock", nil, pins{
			list:          myDeadList,
			listAfter:     myDeadListAfter,
			listAfterNull: myDeadListAfterNull,
			take:          "SELECT `id`, `payload`, `last_error` FROM `dead_jobs` WHERE `id` = ? FOR UPDATE",
			takeDelete:    "DELETE FROM `dead_jobs` WHERE `id` = ?",
			purge:         "DELETE FROM `dead_jobs`",
			purgeBefore:   "DELETE FROM `dead_jobs` WHERE `dead_at` < ?",
			requeueErr:    "UPDATE `jobs` SET `last_error` = ? WHERE `id` = ?",
			cancel:        "DELETE FROM `jobs` WHERE `id` = ?",
			cancelLock:    "SELECT `id` FROM `jobs` WHERE `id` = ? FOR UPDATE SKIP LOCKED",
			exists:        "SELECT 1 FROM `jobs` WHERE `id` = ?",
			dead:          "INSERT INTO `dead_jobs` (`id`, `attempt`, `payload`, `last_error`, `dead_at`) SELECT `id`, ?, `payload`, COALESCE(?, `last_error`), UTC_TIMESTAMP(6) FROM `jobs` WHERE `id` = ?",
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			q, err := inbox.New(newMock(t).DB, inbox.Config{Dialect: c.dialect, Table: deadDesc(c.form), Now: c.now})
			if err != nil {
				t.Fatal(err)
			}
			st := q.Statements()
			got := pins{st.Dead.List.SQL, st.Dead.ListAfter.SQL, st.Dead.ListAfterNull.SQL, st.Dead.Take.SQL, st.Dead.TakeDelete.SQL, st.Dead.Purge.SQL,
				st.Dead.PurgeBefore.SQL, st.Dead.RequeueError.SQL, st.Jobs.Cancel.SQL, st.RowLock.CancelLock.SQL, st.Jobs.Exists.SQL, st.Settle.Dead.SQL}
			if got != c.want {
				t.Errorf("statements:\n got %+v\nwant %+v", got, c.want)
			}
		})
	}
}

// SQLite's identifiers are quoted as the schema helper's quoting makes them;
// the shapes are compared with the quotes taken out.
func TestDeadJobStatementsSQLite(t *testing.T) {
	q, err := inbox.New(newMock(t).DB, inbox.Config{Dialect: inbox.SQLite, Table: deadDesc("lease")})
	if err != nil {
		t.Fatal(err)
	}
	st := q.Statements()
	for _, c := range []struct{ got, want string }{
		{st.Dead.List.SQL, "SELECT c0, c1, c2, c3, c4 FROM (SELECT * FROM (SELECT id AS c0, attempt AS c1, payload AS c2, last_error AS c3, dead_at AS c4 FROM dead_jobs WHERE dead_at IS NOT NULL ORDER BY c4 DESC, c0 DESC LIMIT ?) AS dated " +
			"UNION ALL SELECT * FROM (SELECT id AS c0, attempt AS c1, payload AS c2, last_error AS c3, dead_at AS c4 FROM dead_jobs WHERE dead_at IS NULL ORDER BY c4 DESC, c0 DESC LIMIT ?) AS undated) AS page ORDER BY (c4 IS NULL), c4 DESC, c0 DESC LIMIT ?"},
		{st.Dead.ListAfter.SQL, "SELECT c0, c1, c2, c3, c4 FROM (SELECT * FROM (SELECT id AS c0, attempt AS c1, payload AS c2, last_error AS c3, dead_at AS c4 FROM dead_jobs WHERE (dead_at, id) < (?, ?) ORDER BY c4 DESC, c0 DESC LIMIT ?) AS dated " +
			"UNION ALL SELECT * FROM (SELECT id AS c0, attempt AS c1, payload AS c2, last_error AS c3, dead_at AS c4 FROM dead_jobs WHERE dead_at IS NULL ORDER BY c4 DESC, c0 DESC LIMIT ?) AS undated) AS page ORDER BY (c4 IS NULL), c4 DESC, c0 DESC LIMIT ?"},
		{st.Dead.ListAfterNull.SQL, "SELECT id, attempt, payload, last_error, dead_at FROM dead_jobs WHERE dead_at IS NULL AND id < ? ORDER BY dead_at DESC, id DESC LIMIT ?"},
		{st.Dead.Take.SQL, "DELETE FROM dead_jobs WHERE id = ? RETURNING id, payload, last_error"},
		{st.Dead.PurgeBefore.SQL, "DELETE FROM dead_jobs WHERE dead_at < ?"},
		{st.Settle.Dead.SQL, "INSERT INTO dead_jobs (id, attempt, payload, last_error, dead_at) SELECT id, ?, payload, COALESCE(?, last_error), ? FROM jobs WHERE id = ? AND attempt = ? AND locked_until = ?"},
	} {
		if g := unquote(c.got); g != c.want {
			t.Errorf("got  %s\nwant %s", g, c.want)
		}
	}
}

func unquote(s string) string {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '"' && s[i] != '`' && s[i] != '[' && s[i] != ']' {
			out = append(out, s[i])
		}
	}
	return string(out)
}

// A requeue on PostgreSQL: the dead row taken (the arbiter), the job
// inserted anew, its last error written back; all in one transaction.
func TestRequeueDeadPostgres(t *testing.T) {
	m := newMock(t)
	q, err := inbox.New(m.DB, inbox.Config{Dialect: inbox.Postgres, Table: deadDesc("lease")})
	if err != nil {
		t.Fatal(err)
	}
	st := q.Statements()
	m.ExpectBegin()
	m.ExpectQuery(st.Dead.Take.SQL).WithArgs(int64(7)).
		WillReturnRows(sqlmock.NewRows([]string{"id", "payload", "last_error"}).AddRow(int64(7), []byte("p"), "boom"))
	m.ExpectQuery(st.Jobs.Enqueue.SQL).WithArgs([]byte("p")).WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(8)))
	m.ExpectExec(st.Dead.RequeueError.SQL).WithArgs("boom", int64(8)).WillReturnResult(sqlmock.NewResult(0, 1))
	m.ExpectCommit()
	id, err := q.RequeueDead(context.Background(), int64(7))
	if err != nil || id != int64(8) {
		t.Fatalf("RequeueDead = %v, %v; want 8", id, err)
	}
	// A second requeue finds no dead row: ErrNotDead, rolled back.
	m.ExpectBegin()
	m.ExpectQuery(st.Dead.Take.SQL).WithArgs(int64(7)).WillReturnRows(sqlmock.NewRows([]string{"id", "payload", "last_error"}))
	m.ExpectRollback()
	if _, err := q.RequeueDead(context.Background(), int64(7)); !errors.Is(err, inbox.ErrNotDead) {
		t.Fatalf("second RequeueDead = %v, want ErrNotDead", err)
	}
	m.Met(t)
}

// RequeueDeadAs on PostgreSQL and MySQL: the new id probed in the dead
// table first (before the take removes the dead row, so that the job's own
// id is refused), the dead row taken, the job inserted under the new id,
// its last error written back; one transaction. A dead new id rolls back
// with nothing else sent.
func TestRequeueDeadAsSQL(t *testing.T) {
	for _, d := range []inbox.Dialect{inbox.Postgres, inbox.MySQL} {
		t.Run(d.Name(), func(t *testing.T) {
			m := newMock(t)
			q, err := inbox.New(m.DB, inbox.Config{Dialect: d, Table: deadDesc("lease")})
			if err != nil {
				t.Fatal(err)
			}
			st := q.Statements()
			m.ExpectBegin()
			m.ExpectQuery(st.Dead.Has.SQL).WithArgs("new-7").WillReturnRows(sqlmock.NewRows([]string{"one"}))
			m.ExpectQuery(st.Dead.Take.SQL).WithArgs("old-7").
				WillReturnRows(sqlmock.NewRows([]string{"id", "payload", "last_error"}).AddRow("old-7", []byte("p"), "boom"))
			if st.Dead.TakeDelete.SQL != "" {
				m.ExpectExec(st.Dead.TakeDelete.SQL).WithArgs("old-7").WillReturnResult(sqlmock.NewResult(0, 1))
			}
			if st.Jobs.EnqueueID.Rows {
				m.ExpectQuery(st.Jobs.EnqueueID.SQL).WithArgs("new-7", []byte("p")).WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow("new-7"))
			} else {
				m.ExpectExec(st.Jobs.EnqueueID.SQL).WithArgs("new-7", []byte("p")).WillReturnResult(sqlmock.NewResult(0, 1))
			}
			m.ExpectExec(st.Dead.RequeueError.SQL).WithArgs("boom", "new-7").WillReturnResult(sqlmock.NewResult(0, 1))
			m.ExpectCommit()
			if err := q.RequeueDeadAs(context.Background(), "old-7", "new-7"); err != nil {
				t.Fatalf("RequeueDeadAs = %v", err)
			}
			m.ExpectBegin()
			m.ExpectQuery(st.Dead.Has.SQL).WithArgs("old-8").WillReturnRows(sqlmock.NewRows([]string{"one"}).AddRow(1))
			m.ExpectRollback()
			if err := q.RequeueDeadAs(context.Background(), "old-8", "old-8"); !errors.Is(err, inbox.ErrDeadID) {
				t.Fatalf("RequeueDeadAs under its own id = %v, want ErrDeadID", err)
			}
			m.Met(t)
		})
	}
}

// Bad input is refused before anything is sent.
func TestDeadJobsRefuse(t *testing.T) {
	m := newMock(t)
	ctx := context.Background()
	q, err := inbox.New(m.DB, inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "jobs", LockedUntil: "locked_until", DeadTable: "dead_jobs"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.ListDead(ctx, 0, nil); err == nil {
		t.Error("ListDead with limit 0: no error")
	}
	if _, err := q.ListDead(ctx, inbox.MaxList+1, nil); err == nil {
		t.Error("ListDead past MaxList: no error")
	}
	if _, err := q.RequeueDead(ctx, nil); err == nil {
		t.Error("RequeueDead(nil): no error")
	}
	if _, err := q.RequeueDead(ctx, 1.5); err == nil {
		t.Error("RequeueDead(1.5): no error")
	}
	if err := q.Cancel(ctx, struct{}{}); err == nil {
		t.Error("Cancel(struct{}{}): no error")
	}
	if _, err := q.PurgeDead(ctx, time.Now()); !errors.Is(err, inbox.ErrNoDeadAt) {
		t.Errorf("PurgeDead with a cutoff and no DeadAt = %v, want ErrNoDeadAt", err)
	}
	noDead, err := inbox.New(m.DB, inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "jobs", LockedUntil: "locked_until"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := noDead.ListDead(ctx, 10, nil); !errors.Is(err, inbox.ErrNoDeadTable) {
		t.Errorf("ListDead without a dead table = %v, want ErrNoDeadTable", err)
	}
	if _, err := inbox.New(m.DB, inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "jobs", LockedUntil: "locked_until", DeadAt: "dead_at"}}); err == nil {
		t.Error("DeadAt without DeadTable: New gave no error")
	}
	if n := m.Sent(); n != 0 {
		t.Errorf("%d calls reached the driver, want 0: %v", n, m.Log(0))
	}
}

// The next page on MySQL and MariaDB names the last job's time of death
// twice (the two ranges MariaDB seeks) and its id once, then the limit of
// each read.
func TestListDeadAfterMySQL(t *testing.T) {
	m := newMock(t)
	q, err := inbox.New(m.DB, inbox.Config{Dialect: inbox.MySQL, Table: deadDesc("lease")})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 3, 8, 0, 0, 123456000, time.UTC)
	m.ExpectQuery(myDeadListAfter).
		WithArgs("2026-12-03 08:00:00.123456", "2026-12-03 08:00:00.123456", int64(9), 2, 2, 2).
		WillReturnRows(sqlmock.NewRows([]string{"id", "attempt", "payload", "last_error", "dead_at"}).
			AddRow(int64(8), int64(3), []byte("p"), "boom", "2026-12-03 07:59:00.000000"))
	jobs, err := q.ListDead(context.Background(), 2, &inbox.DeadJob{ID: int64(9), DeadAt: at})
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 1 || jobs[0].ID != int64(8) || jobs[0].LastError != "boom" || !jobs[0].DeadAt.Equal(at.Add(-time.Minute).Truncate(time.Second)) {
		t.Errorf("ListDead = %+v", jobs)
	}
	m.Met(t)
}

// Jobs that died before Table.DeadAt was added have none: listed last with
// a zero DeadAt, and such a job as after asks for the page past it among
// them (Dead.ListAfterNull). A dialect from outside without that statement
// is refused before anything is sent; without DeadAt the id alone pages.
func TestListDeadNullDeadAt(t *testing.T) {
	m := newMock(t)
	ctx := context.Background()
	q, err := inbox.New(m.DB, inbox.Config{Dialect: inbox.Postgres, Table: deadDesc("lease")})
	if err != nil {
		t.Fatal(err)
	}
	cols := []string{"id", "attempt", "payload", "last_error", "dead_at"}
	at := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	m.ExpectQuery(pgDeadList).WithArgs(2, 2, 2).
		WillReturnRows(sqlmock.NewRows(cols).AddRow(int64(9), int64(3), []byte("p"), "boom", at).AddRow(int64(4), int64(2), []byte("q"), nil, nil))
	page, err := q.ListDead(ctx, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(page) != 2 || page[0].ID != int64(9) || !page[0].DeadAt.Equal(at) || page[1].ID != int64(4) || !page[1].DeadAt.IsZero() {
		t.Fatalf("first page = %+v", page)
	}
	m.ExpectQuery(pgDeadListAfterNull).WithArgs(int64(4), 2).
		WillReturnRows(sqlmock.NewRows(cols).AddRow(int64(2), int64(1), []byte("r"), nil, nil))
	page, err = q.ListDead(ctx, 2, &page[1])
	if err != nil || len(page) != 1 || page[0].ID != int64(2) || !page[0].DeadAt.IsZero() {
		t.Fatalf("page past a job with no DeadAt = %+v, %v", page, err)
	}
	m.Met(t)

	// The id as data too: the derived tables name each column once, by
	// position.
	idData := deadDesc("lease")
	idData.Data = []string{"id", "payload"}
	qd, err := inbox.New(m.DB, inbox.Config{Dialect: inbox.Postgres, Table: idData})
	if err != nil {
		t.Fatal(err)
	}
	if s := qd.Statements().Dead.List.SQL; !strings.HasPrefix(s, `SELECT c0, c1, c2, c3, c4, c5 FROM (SELECT * FROM (SELECT "id" AS c0, "attempt" AS c1, "id" AS c2, "payload" AS c3, "last_error" AS c4, "dead_at" AS c5 FROM "dead_jobs" WHERE`) ||
		!strings.HasSuffix(s, `ORDER BY (c5 IS NULL), c5 DESC, c0 DESC LIMIT $3`) {
		t.Errorf("Dead.List with the id as data: %s", s)
	}

	sent := m.Sent()
	outside, err := inbox.New(m.DB, inbox.Config{Dialect: editedDialect{inbox.Postgres, func(st *inbox.Statements) { st.Dead.ListAfterNull = dialect.Stmt{} }}, Table: deadDesc("lease")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outside.ListDead(ctx, 2, &inbox.DeadJob{ID: int64(4)}); err == nil || !strings.Contains(err.Error(), "Dead.ListAfterNull") {
		t.Errorf("ListDead past a job with no DeadAt, without Dead.ListAfterNull = %v, want an error naming it", err)
	}
	if n := m.Sent(); n != sent {
		t.Errorf("%d calls reached the driver, want none: %v", n-sent, m.Log(sent))
	}

	noAt := deadDesc("lease")
	noAt.DeadAt = ""
	byID, err := inbox.New(m.DB, inbox.Config{Dialect: inbox.Postgres, Table: noAt})
	if err != nil {
		t.Fatal(err)
	}
	if s := byID.Statements().Dead.ListAfterNull.SQL; s != "" {
		t.Errorf("Dead.ListAfterNull without DeadAt: %s", s)
	}
	m.ExpectQuery(`SELECT "id", "attempt", "payload", "last_error" FROM "dead_jobs" WHERE "id" < $1 ORDER BY "id" DESC LIMIT $2`).WithArgs(int64(4), 2).
		WillReturnRows(sqlmock.NewRows(cols[:4]).AddRow(int64(2), int64(1), []byte("r"), nil))
	if page, err := byID.ListDead(ctx, 2, &inbox.DeadJob{ID: int64(4)}); err != nil || len(page) != 1 || page[0].ID != int64(2) {
		t.Errorf("ListDead without DeadAt = %+v, %v", page, err)
	}
	m.Met(t)
}

// An id a dead job has is refused before anything is inserted: Enqueue and
// EnqueueMany (the job named by its index); without a dead table nothing is
// probed.
func TestEnqueueDeadID(t *testing.T) {
	m := newMock(t)
	ctx := context.Background()
	q, err := inbox.New(m.DB, inbox.Config{Dialect: inbox.Postgres, Table: deadDesc("lease")})
	if err != nil {
		t.Fatal(err)
	}
	probe := q.Statements().Dead.Has.SQL
	if probe != `SELECT 1 FROM "dead_jobs" WHERE "id" = $1` {
		t.Errorf("Dead.Has = %s", probe)
	}
	m.ExpectQuery(probe).WithArgs(int64(7)).WillReturnRows(sqlmock.NewRows([]string{"1"}).AddRow(1))
	if _, err := q.Enqueue(ctx, m.DB, inbox.Job{ID: int64(7), Data: []any{[]byte("p")}}); !errors.Is(err, inbox.ErrDeadID) || !strings.Contains(err.Error(), "id 7") {
		t.Errorf("Enqueue of a dead job's id = %v, want ErrDeadID naming it", err)
	}
	m.ExpectQuery(probe).WithArgs(int64(8)).WillReturnRows(sqlmock.NewRows([]string{"1"}))
	m.ExpectQuery(probe).WithArgs(int64(7)).WillReturnRows(sqlmock.NewRows([]string{"1"}).AddRow(1))
	_, err = q.EnqueueMany(ctx, m.DB, []inbox.Job{{Data: []any{[]byte("a")}}, {ID: int64(8), Data: []any{[]byte("b")}}, {ID: int64(7), Data: []any{[]byte("c")}}})
	if !errors.Is(err, inbox.ErrDeadID) || !strings.Contains(err.Error(), "job 2: id 7") {
		t.Errorf("EnqueueMany with a dead job's id = %v, want ErrDeadID naming job 2", err)
	}
	m.Met(t)

	noDead, err := inbox.New(m.DB, inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "jobs", LockedUntil: "locked_until"}})
	if err != nil {
		t.Fatal(err)
	}
	if noDead.Statements().Dead.Has.SQL != "" {
		t.Errorf("Dead.Has without a dead table: %s", noDead.Statements().Dead.Has.SQL)
	}
	m.ExpectQuery(`INSERT INTO "jobs" ("id", "payload") VALUES ($1, $2) RETURNING "id"`).WithArgs(int64(7), []byte("p")).
		WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(7)))
	if _, err := noDead.Enqueue(ctx, m.DB, inbox.Job{ID: int64(7), Data: []any{[]byte("p")}}); err != nil {
		t.Errorf("Enqueue without a dead table: %v", err)
	}
	m.Met(t)
}
