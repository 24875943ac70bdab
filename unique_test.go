package inbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/sqlinbox/inbox"
)

// uniqueDesc describes a table with a unique key in each form.
func uniqueDesc(form string) inbox.Table {
	tb := inbox.Table{Name: "jobs", UniqueKey: "unique_key", Data: []string{"payload", "kind"}}
	switch form {
	case "lease":
		tb.LockedUntil = "locked_until"
	case "row lock":
		tb.NotBefore = "not_before"
	default:
		tb.AdvisoryKey, tb.NotBefore = "id", "not_before"
	}
	return tb
}

// The unique key's statements, pinned for each engine and form: the
// insert that skips a held key where the engine can say so, the read of
// the holder, and the replacement of a waiting one.
func TestUniqueSQL(t *testing.T) {
	dialects := map[string]inbox.Dialect{"postgres": inbox.Postgres, "mysql": inbox.MySQL, "sqlite": inbox.SQLite}
	for _, w := range []struct{ engine, form, enqueue, find, replace, replaceLock string }{
		{"postgres", "lease", "INSERT INTO \"jobs\" (\"payload\", \"kind\", \"unique_key\") VALUES ($1, $2, $3) ON CONFLICT (\"unique_key\") DO NOTHING RETURNING \"id\"", "SELECT \"id\", \"attempt\" FROM \"jobs\" WHERE \"unique_key\" = $1", "UPDATE \"jobs\" SET \"locked_until\" = $1, \"payload\" = $2, \"kind\" = $3 WHERE \"id\" = $4 AND (\"attempt\" = 1 OR \"locked_until\" IS NULL OR \"locked_until\" <= statement_timestamp())", ""},
		{"postgres", "row lock", "INSERT INTO \"jobs\" (\"payload\", \"kind\", \"unique_key\") VALUES ($1, $2, $3) ON CONFLICT (\"unique_key\") DO NOTHING RETURNING \"id\"", "SELECT \"id\", \"attempt\" FROM \"jobs\" WHERE \"unique_key\" = $1", "UPDATE \"jobs\" SET \"not_before\" = $1, \"payload\" = $2, \"kind\" = $3 WHERE \"id\" = (SELECT \"id\" FROM \"jobs\" WHERE \"id\" = $4 FOR UPDATE SKIP LOCKED)", ""},
		{"postgres", "advisory lock", "INSERT INTO \"jobs\" (\"payload\", \"kind\", \"unique_key\") VALUES ($1, $2, $3) ON CONFLICT (\"unique_key\") DO NOTHING RETURNING \"id\"", "SELECT \"id\", \"attempt\", \"id\" FROM \"jobs\" WHERE \"unique_key\" = $1", "UPDATE \"jobs\" SET \"not_before\" = $1, \"payload\" = $2, \"kind\" = $3 WHERE \"id\" = $4 AND \"attempt\" = $5", ""},
		{"mysql", "lease", "INSERT INTO `jobs` (`payload`, `kind`, `unique_key`) VALUES (?, ?, ?)", "SELECT `id`, `attempt` FROM `jobs` WHERE `unique_key` = ?", "UPDATE `jobs` SET `locked_until` = ?, `payload` = ?, `kind` = ? WHERE `id` = ?", "SELECT `id` FROM `jobs` WHERE `id` = ? AND (`attempt` = 1 OR `locked_until` IS NULL OR `locked_until` <= UTC_TIMESTAMP(6)) FOR UPDATE"},
		{"mysql", "row lock", "INSERT INTO `jobs` (`payload`, `kind`, `unique_key`) VALUES (?, ?, ?)", "SELECT `id`, `attempt` FROM `jobs` WHERE `unique_key` = ?", "UPDATE `jobs` SET `not_before` = ?, `payload` = ?, `kind` = ? WHERE `id` = ?", "SELECT `id` FROM `jobs` WHERE `id` = ? FOR UPDATE SKIP LOCKED"},
		{"mysql", "advisory lock", "INSERT INTO `jobs` (`payload`, `kind`, `unique_key`) VALUES (?, ?, ?)", "SELECT `id`, `attempt`, `id` FROM `jobs` WHERE `unique_key` = ?", "UPDATE `jobs` SET `not_before` = ?, `payload` = ?, `kind` = ? WHERE `id` = ?", "SELECT `id` FROM `jobs` WHERE `id` = ? AND `attempt` = ? FOR UPDATE"},
		{"sqlite", "lease", "INSERT INTO `jobs` (`payload`, `kind`, `unique_key`) VALUES (?, ?, ?) ON CONFLICT (`unique_key`) DO NOTHING RETURNING `id`", "SELECT `id`, `attempt` FROM `jobs` WHERE `unique_key` = ?", "UPDATE `jobs` SET `locked_until` = ?, `payload` = ?, `kind` = ? WHERE `id` = ? AND (`attempt` = 1 OR `locked_until` IS NULL OR `locked_until` <= ?)", ""},
		{"sqlite", "advisory lock", "INSERT INTO `jobs` (`payload`, `kind`, `unique_key`) VALUES (?, ?, ?) ON CONFLICT (`unique_key`) DO NOTHING RETURNING `id`", "SELECT `id`, `attempt`, `id` FROM `jobs` WHERE `unique_key` = ?", "UPDATE `jobs` SET `not_before` = ?, `payload` = ?, `kind` = ? WHERE `id` = ? AND `attempt` = ?", ""},
	} {
		q := newQueue(t, newMock(t), inbox.Config{Dialect: dialects[w.engine], Table: uniqueDesc(w.form)})
		st := q.Statements()
		for _, c := range []struct{ name, got, want string }{
			{"Jobs.Enqueue", st.Jobs.Enqueue.SQL, w.enqueue}, {"Unique.Find", st.Unique.Find.SQL, w.find},
			{"Unique.Replace", st.Unique.Replace.SQL, w.replace}, {"Unique.ReplaceLock", st.Unique.ReplaceLock.SQL, w.replaceLock},
		} {
			if c.got != c.want {
				t.Errorf("%s %s %s:\n got %s\nwant %s", w.engine, w.form, c.name, c.got, c.want)
			}
		}
	}
	// Without a unique key, none of it.
	q := newQueue(t, newMock(t), inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "jobs", LockedUntil: "locked_until"}})
	if st := q.Statements(); st.Unique.Find.SQL != "" || st.Unique.Replace.SQL != "" || st.Jobs.Enqueue.SQL != `INSERT INTO "jobs" ("payload") VALUES ($1) RETURNING "id"` {
		t.Errorf("without Table.UniqueKey: %+v, %s", st.Unique, st.Jobs.Enqueue.SQL)
	}
}

// A held key: PostgreSQL's insert returns no row, MySQL's fails on the
// index; either way the holder is read and named, and Replace writes the
// waiting holder.
func TestUniqueEnqueueSends(t *testing.T) {
	ctx := context.Background()
	job := inbox.Job{Data: []any{"p", "k"}, UniqueKey: "u1"}

	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.Postgres, Table: uniqueDesc("lease")})
	st := q.Statements()
	m.ExpectQuery(st.Jobs.Enqueue.SQL).WithArgs("p", "k", "u1").WillReturnRows(sqlmock.NewRows([]string{"id"}))
	m.ExpectQuery(st.Unique.Find.SQL).WithArgs("u1").WillReturnRows(sqlmock.NewRows([]string{"id", "attempt"}).AddRow(int64(7), int64(2)))
	_, err := q.Enqueue(ctx, m.DB, job)
	var dup *inbox.DuplicateError
	if !errors.Is(err, inbox.ErrDuplicate) || !errors.As(err, &dup) || dup.Held[0] != int64(7) {
		t.Fatalf("Enqueue of a held key = %v, want a DuplicateError naming job 7", err)
	}
	job.Replace = true
	m.ExpectQuery(st.Jobs.Enqueue.SQL).WithArgs("p", "k", "u1").WillReturnRows(sqlmock.NewRows([]string{"id"}))
	m.ExpectQuery(st.Unique.Find.SQL).WithArgs("u1").WillReturnRows(sqlmock.NewRows([]string{"id", "attempt"}).AddRow(int64(7), int64(1)))
	m.ExpectExec(st.Unique.Replace.SQL).WithArgs(nil, "p", "k", int64(7)).WillReturnResult(sqlmock.NewResult(0, 1))
	if id, err := q.Enqueue(ctx, m.DB, job); err != nil || id != int64(7) {
		t.Fatalf("Enqueue with Replace = %v, %v; want job 7 replaced", id, err)
	}

	m = newMock(t)
	q = newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: uniqueDesc("row lock")})
	st = q.Statements()
	m.ExpectExec(st.Jobs.Enqueue.SQL).WithArgs("p", "k", "u1").WillReturnError(errors.New("Error 1062: Duplicate entry"))
	m.ExpectQuery(st.Unique.Find.SQL).WithArgs("u1").WillReturnRows(sqlmock.NewRows([]string{"id", "attempt"}).AddRow(int64(9), int64(1)))
	m.ExpectBegin()
	m.ExpectQuery(st.Unique.ReplaceLock.SQL).WithArgs(int64(9)).WillReturnRows(sqlmock.NewRows([]string{"id"}))
	m.ExpectRollback()
	_, err = q.Enqueue(ctx, m.DB, job)
	if !errors.As(err, &dup) || dup.Held[0] != int64(9) {
		t.Fatalf("MySQL Enqueue with Replace of a job in work = %v, want a DuplicateError naming job 9", err)
	}
	// Another error of the insert, with no holder of the key, is the
	// database's own.
	tooLong := errors.New("Error 1406: Data too long for column 'unique_key'")
	m.ExpectExec(st.Jobs.Enqueue.SQL).WithArgs("p", "k", "u1").WillReturnError(tooLong)
	m.ExpectQuery(st.Unique.Find.SQL).WithArgs("u1").WillReturnRows(sqlmock.NewRows([]string{"id", "attempt"}))
	if _, err = q.Enqueue(ctx, m.DB, job); !errors.Is(err, tooLong) {
		t.Fatalf("MySQL Enqueue failing for another reason = %v, want the driver's error", err)
	}
}

// On MySQL a held key fails the insert (1062). When the holder is gone by
// the time it is read (acknowledged meanwhile), the insert is sent again,
// not the violation returned; a deadlock's victim is sent again on a pool
// and returned in the caller's transaction, which the deadlock ended.
func TestUniqueMySQLRetries(t *testing.T) {
	ctx := context.Background()
	job := inbox.Job{Data: []any{"p", "k"}, UniqueKey: "u1"}
	m := newMock(t)
	q := newQueue(t, m, inbox.Config{Dialect: inbox.MySQL, Table: uniqueDesc("lease")})
	st := q.Statements()
	dupErr := errors.New("Error 1062 (23000): Duplicate entry 'u1' for key 'jobs_uk'")
	m.ExpectExec(st.Jobs.Enqueue.SQL).WithArgs("p", "k", "u1").WillReturnError(dupErr)
	m.ExpectQuery(st.Unique.Find.SQL).WithArgs("u1").WillReturnRows(sqlmock.NewRows([]string{"id", "attempt"}))
	m.ExpectExec(st.Jobs.Enqueue.SQL).WithArgs("p", "k", "u1").WillReturnResult(sqlmock.NewResult(12, 1))
	if id, err := q.Enqueue(ctx, m.DB, job); err != nil || id != int64(12) {
		t.Fatalf("Enqueue after the holder left = %v, %v; want job 12", id, err)
	}

	deadlock := errors.New("Error 1213 (40001): Deadlock found when trying to get lock; try restarting transaction")
	m.ExpectExec(st.Jobs.Enqueue.SQL).WithArgs("p", "k", "u1").WillReturnError(deadlock)
	m.ExpectQuery(st.Unique.Find.SQL).WithArgs("u1").WillReturnRows(sqlmock.NewRows([]string{"id", "attempt"}))
	m.ExpectExec(st.Jobs.Enqueue.SQL).WithArgs("p", "k", "u1").WillReturnResult(sqlmock.NewResult(13, 1))
	if id, err := q.Enqueue(ctx, m.DB, job); err != nil || id != int64(13) {
		t.Fatalf("Enqueue on a pool after a deadlock = %v, %v; want job 13", id, err)
	}

	m.ExpectBegin()
	m.ExpectExec(st.Jobs.Enqueue.SQL).WithArgs("p", "k", "u1").WillReturnError(deadlock)
	m.ExpectQuery(st.Unique.Find.SQL).WithArgs("u1").WillReturnRows(sqlmock.NewRows([]string{"id", "attempt"}))
	tx, err := m.DB.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Enqueue(ctx, tx, job); !errors.Is(err, deadlock) {
		t.Fatalf("Enqueue in a transaction after a deadlock = %v, want the deadlock returned", err)
	}

	// The key held at every insert and free at every read, three tries
	// over: the documented answer, the violation in its chain. Before,
	// the driver's violation alone.
	for i := 0; i < 4; i++ {
		m.ExpectExec(st.Jobs.Enqueue.SQL).WithArgs("p", "k", "u1").WillReturnError(dupErr)
		m.ExpectQuery(st.Unique.Find.SQL).WithArgs("u1").WillReturnRows(sqlmock.NewRows([]string{"id", "attempt"}))
	}
	if _, err := q.Enqueue(ctx, m.DB, job); err == nil || !strings.Contains(err.Error(), `unique key "u1" taken and freed again and again`) || !errors.Is(err, dupErr) {
		t.Fatalf("Enqueue of a key taken and freed at every try = %v, want it said, with the violation", err)
	}
	m.Met(t)

	// A violation of the primary key (an id given twice) is no held key.
	job.ID = int64(5)
	pk := errors.New("Error 1062 (23000): Duplicate entry '5' for key 'PRIMARY'")
	m.ExpectExec(st.Jobs.EnqueueID.SQL).WithArgs(int64(5), "p", "k", "u1").WillReturnError(pk)
	m.ExpectQuery(st.Unique.Find.SQL).WithArgs("u1").WillReturnRows(sqlmock.NewRows([]string{"id", "attempt"}))
	if _, err := q.Enqueue(ctx, m.DB, job); !errors.Is(err, pk) {
		t.Fatalf("Enqueue of an id given twice = %v, want the driver's error", err)
	}
}
