package dbtest

import (
	"context"
	"strings"
	"testing"

	"github.com/sqlinbox/inbox"
)

// TestSchemaWrongDialect (issue 21 item 10): a dialect that does not match
// the database is told by the check's first statement, with one problem
// naming the engine found and the dialect to use, and the database is left
// as it was; on every engine and driver, against every other dialect.
func TestSchemaWrongDialect(t *testing.T) {
	found := func(e Engine) []string {
		switch {
		case e.IsPostgres():
			return []string{"PostgreSQL", "use inbox.Postgres"}
		case e.IsMySQL():
			return []string{"MariaDB", "use inbox.MariaDB or inbox.MySQL"}
		}
		return []string{"SQLite", "use inbox.SQLite"}
	}
	eachEngine(t, nil, func(t *testing.T, e Engine) {
		db := e.Open(t, 2)
		table := newTable(t, e, db, "wrongdialect")
		mustExec(t, e, db, "INSERT INTO "+table+" (payload) VALUES (?)", []byte("keep me"))
		for _, d := range []inbox.Dialect{inbox.Postgres, inbox.MySQL, inbox.MariaDB, inbox.SQLite} {
			same := (d == inbox.Postgres) == e.IsPostgres() && (d == inbox.SQLite) == e.IsSQLite()
			if same {
				continue
			}
			t.Run(d.Name(), func(t *testing.T) {
				q := newQueue(t, db, inbox.Config{Dialect: d, Table: Table(table, "lease")})
				ps := problemsOf(t, checkUnchanged(t, e, db, q, table, table+"_dead"))
				t.Log(ps)
				if len(ps) != 1 {
					t.Fatalf("%d problems, want 1:\n%s", len(ps), strings.Join(ps, "\n"))
				}
				hasProblem(t, ps, append(found(e), "not", "inbox."+map[string]string{"postgres": "Postgres", "mysql": "MySQL", "mariadb": "MariaDB", "sqlite": "SQLite"}[d.Name()]+" cannot run there")...)
			})
		}
	})
}

// TestSchemaStorageEngine (issue 21 item 10): on MySQL and MariaDB a queue,
// dead or claims table that is not InnoDB is reported in every form, naming
// the table, its engine and the statement that converts it; converted, the
// tables pass.
func TestSchemaStorageEngine(t *testing.T) {
	eachForm(t, func(e Engine) []string {
		if !e.IsMySQL() {
			return nil
		}
		return append(formsWithKey(e), "rowlock-claims")
	}, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, 2)
		table := newTable(t, e, db, "engine_"+form)
		mustExec(t, e, db, "ALTER TABLE "+table+" ENGINE=MyISAM")
		mustExec(t, e, db, "ALTER TABLE "+table+"_dead ENGINE=Aria")
		tables := []string{table, table + "_dead"}
		if form == "rowlock-claims" {
			mustExec(t, e, db, "ALTER TABLE "+table+"_claims ENGINE=MyISAM")
			tables = append(tables, table+"_claims")
		}
		q := newQueue(t, db, queueConfig(e, Table(table, form), nil))
		ps := problemsOf(t, checkUnchanged(t, e, db, q, tables...))
		if len(ps) != len(tables) {
			t.Errorf("%d problems, want %d:\n%s", len(ps), len(tables), strings.Join(ps, "\n"))
		}
		hasProblem(t, ps, "table "+table+" has MyISAM storage engine", "not InnoDB", "ALTER TABLE "+table+" ENGINE=InnoDB")
		hasProblem(t, ps, "table "+table+"_dead has Aria storage engine", "ALTER TABLE "+table+"_dead ENGINE=InnoDB")
		if form == "rowlock-claims" {
			hasProblem(t, ps, "table "+table+"_claims has MyISAM storage engine")
		}
		for _, tb := range tables {
			mustExec(t, e, db, "ALTER TABLE "+tb+" ENGINE=InnoDB")
		}
		if err := checkUnchanged(t, e, db, q, tables...); err != nil {
			t.Errorf("converted to InnoDB: %v", err)
		}
	})
}

// TestSchemaLastErrorLength (issue 21 item 3): on PostgreSQL and MariaDB a
// LastError column that cannot hold MaxErrorText bytes, in the queue table
// and in the dead table, is reported with its length and the statement
// that widens it; run, that statement makes the check pass. SQLite's TEXT
// holds any length, whatever is declared.
func TestSchemaLastErrorLength(t *testing.T) {
	eachEngine(t, nil, func(t *testing.T, e Engine) {
		db := e.Open(t, 2)
		table := newTable(t, e, db, "lasterror_len")
		mustExec(t, e, db, "ALTER TABLE "+table+" ADD COLUMN last_error varchar(100)")
		mustExec(t, e, db, "ALTER TABLE "+table+"_dead ADD COLUMN last_error varchar(1999)")
		tb := Table(table, "lease")
		tb.LastError = "last_error"
		q := newQueue(t, db, queueConfig(e, tb, nil))
		err := checkUnchanged(t, e, db, q, table, table+"_dead")
		if e.IsSQLite() {
			if err != nil {
				t.Errorf("SQLite: %v, want nil", err)
			}
			return
		}
		ps := problemsOf(t, err)
		if len(ps) != 2 {
			t.Fatalf("%d problems, want 2:\n%s", len(ps), strings.Join(ps, "\n"))
		}
		hasProblem(t, ps, "column "+table+".last_error (Table.LastError)", "holds 100 characters", "MaxErrorText (2000 bytes)")
		hasProblem(t, ps, "column "+table+"_dead.last_error", "holds 1999 characters")
		for _, p := range ps {
			_, fix, ok := strings.Cut(p, "widen it: ")
			if !ok {
				t.Fatalf("problem %q names no fix", p)
			}
			mustExec(t, e, db, fix)
		}
		// A new pool: pgx's statements cached before the ALTER would fail.
		db = e.OpenDSN(t, e.DSN(t, ""), 2)
		q = newQueue(t, db, queueConfig(e, tb, nil))
		if err := checkUnchanged(t, e, db, q, table, table+"_dead"); err != nil {
			t.Errorf("after the fixes: %v", err)
		}
		// A job retried with the longest text keeps it all.
		enqueueOne(t, q, db, "p")
		d := claimOne(t, q)
		long := strings.Repeat("e", inbox.MaxErrorText)
		d.SetError(errString(long))
		if err := d.Retry(context.Background(), 0); err != nil {
			t.Fatal(err)
		}
		d = claimOne(t, q)
		if got := d.LastError(); got != long {
			t.Errorf("last error is %d bytes, want %d", len(got), len(long))
		}
		if err := d.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
		mustBeIdle(t, db, q)
	})
}

// errString is an error whose text is itself.
type errString string

func (e errString) Error() string { return string(e) }
