package dbtest

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/sqlinbox/inbox"
)

// serverIDTable creates a lease table whose id the server assigns by idDecl
// ("varchar(36) DEFAULT (uuid())"), and its dead table with deadID.
func serverIDTable(t *testing.T, e Engine, db *sql.DB, what, idDecl, deadID string) string {
	t.Helper()
	table := tableName(e, what)
	timeType, blob := "timestamptz", "bytea"
	switch {
	case e.IsMySQL():
		timeType, blob = "DATETIME(6) NULL", "blob"
	case e.IsSQLite():
		timeType, blob = "TEXT", "BLOB"
	}
	for _, s := range []string{
		"DROP TABLE IF EXISTS " + table, "DROP TABLE IF EXISTS " + table + "_dead",
		"CREATE TABLE " + table + " (id " + idDecl + ", attempt integer NOT NULL DEFAULT 1, locked_until " + timeType +
			", payload " + blob + " NOT NULL)",
		"CREATE TABLE " + table + "_dead (id " + deadID + " PRIMARY KEY, attempt integer NOT NULL, payload " + blob + " NOT NULL)",
	} {
		mustExec(t, e, db, s)
	}
	dropAtEnd(t, e, db, table, table+"_dead")
	return table
}

// TestServerAssignedTextID: a text id the server assigns comes back as the
// row's own id from Enqueue, EnqueueMany and RequeueDead where the insert
// returns it (PostgreSQL's uuid and text defaults, SQLite's TEXT default:
// RETURNING, not the rowid), and the claim delivers the same ids. On MySQL
// and MariaDB, which report only AUTO_INCREMENT's ids, the schema check
// refuses a DEFAULT (uuid()) key naming the fix, and a call that inserts
// without a Job.ID is ErrIDNotReturned: in a transaction it rolls back, and
// RequeueDead changes nothing. Before: the check passed, Enqueue and
// RequeueDead returned 0 and EnqueueMany 0, 1, 2.
func TestServerAssignedTextID(t *testing.T) {
	eachEngine(t, nil, func(t *testing.T, e Engine) {
		db := e.Open(t, 4)
		switch {
		case e.IsMySQL():
			unreadIDs(t, e, db)
		case e.IsPostgres():
			returnedIDs(t, e, db, "uuid", "uuid PRIMARY KEY DEFAULT gen_random_uuid()", "uuid")
			returnedIDs(t, e, db, "text", "text PRIMARY KEY DEFAULT gen_random_uuid()::text", "text")
		default:
			returnedIDs(t, e, db, "text", "TEXT PRIMARY KEY DEFAULT (lower(hex(randomblob(16))))", "TEXT")
			// A TEXT primary key with no default takes NULL: no id.
			table := serverIDTable(t, e, db, "nullid", "TEXT PRIMARY KEY", "TEXT")
			q := newQueue(t, db, queueConfig(e, Table(table, "lease"), nil))
			if id, err := q.Enqueue(context.Background(), db, inbox.Job{Data: []any{[]byte("p")}}); !errors.Is(err, inbox.ErrIDNotReturned) {
				t.Errorf("Enqueue into a TEXT key without a default = %v, %v; want ErrIDNotReturned", id, err)
			}
		}
	})
}

// returnedIDs checks that ids the server assigns come back as they are
// stored, from every call that inserts, and are the ids claims deliver.
func returnedIDs(t *testing.T, e Engine, db *sql.DB, what, idDecl, deadID string) {
	t.Helper()
	ctx := context.Background()
	table := serverIDTable(t, e, db, "serverid_"+what, idDecl, deadID)
	q := newQueue(t, db, queueConfig(e, Table(table, "lease"), nil))
	if err := checkUnchanged(t, e, db, q, table, table+"_dead"); err != nil {
		t.Fatalf("%s: schema check: %v", idDecl, err)
	}
	stored := func(id any) bool {
		t.Helper()
		s, ok := id.(string)
		if !ok || len(s) < 32 {
			t.Errorf("%s: id %v (%T), want the text the server assigned", idDecl, id, id)
			return false
		}
		var n int
		cast := "id"
		if e.IsPostgres() {
			cast = "id::text"
		}
		if err := db.QueryRow(bind(e, "SELECT COUNT(*) FROM "+table+" WHERE "+cast+" = ?"), s).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	want := map[any]string{}
	id := enqueueOne(t, q, db, "one")
	if !stored(id) {
		t.Fatalf("%s: Enqueue returned %v, no row has it", idDecl, id)
	}
	want[id] = "one"
	ids, err := q.EnqueueMany(ctx, db, []inbox.Job{{Data: []any{[]byte("two")}}, {Data: []any{[]byte("three")}}})
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		if !stored(id) {
			t.Fatalf("%s: EnqueueMany returned %v, no row has it", idDecl, id)
		}
		want[id] = []string{"two", "three"}[i]
	}
	ds, err := q.Claim(ctx, 10)
	if err != nil || len(ds) != 3 {
		t.Fatalf("claimed %d jobs, %v; want 3", len(ds), err)
	}
	var dead any
	for _, d := range ds {
		if p := payloadOf(t, d); want[d.ID()] != p {
			t.Errorf("%s: delivered id %v with %q, enqueued with %q", idDecl, d.ID(), p, want[d.ID()])
		}
		if dead == nil {
			dead = d.ID()
			if err := d.Dead(ctx); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	again, err := q.RequeueDead(ctx, dead)
	if err != nil || again == dead || !stored(again) {
		t.Fatalf("%s: RequeueDead(%v) = %v, %v; want a new id of a stored row", idDecl, dead, again, err)
	}
	d := claimOne(t, q)
	if d.ID() != again || payloadOf(t, d) != want[dead] {
		t.Errorf("%s: claimed %v, want the requeued %v", idDecl, d.ID(), again)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	mustBeIdle(t, db, q)
}

// unreadIDs checks MySQL's and MariaDB's refusal of a key they assign by a
// default, at the schema check and at run time.
func unreadIDs(t *testing.T, e Engine, db *sql.DB) {
	t.Helper()
	ctx := context.Background()
	table := serverIDTable(t, e, db, "uuidid", "varchar(36) DEFAULT (uuid()) PRIMARY KEY", "varchar(36)")
	q := newQueue(t, db, queueConfig(e, Table(table, "lease"), nil))
	ps := problemsOf(t, checkUnchanged(t, e, db, q, table, table+"_dead"))
	if len(ps) != 1 {
		t.Fatalf("%d problems, want 1:\n%s", len(ps), strings.Join(ps, "\n"))
	}
	hasProblem(t, ps, "column "+table+".id (Table.ID)", "DEFAULT uuid()", "LastInsertId is 0", "AUTO_INCREMENT integer key", "give every Job an ID")

	p := []any{[]byte("p")}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if id, err := q.Enqueue(ctx, tx, inbox.Job{Data: p}); !errors.Is(err, inbox.ErrIDNotReturned) {
		t.Errorf("Enqueue = %v, %v; want ErrIDNotReturned", id, err)
	}
	if ids, err := q.EnqueueMany(ctx, tx, []inbox.Job{{Data: p}, {Data: p}}); !errors.Is(err, inbox.ErrIDNotReturned) {
		t.Errorf("EnqueueMany = %v, %v; want ErrIDNotReturned", ids, err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, db, table); n != 0 {
		t.Errorf("%d jobs after the rollback, want 0", n)
	}
	mustExec(t, e, db, "INSERT INTO "+table+"_dead (id, attempt, payload) VALUES ('dead-1', 3, 'p')")
	before := dumpRows(t, db, table+"_dead")
	if id, err := q.RequeueDead(ctx, "dead-1"); !errors.Is(err, inbox.ErrIDNotReturned) {
		t.Errorf("RequeueDead = %v, %v; want ErrIDNotReturned", id, err)
	}
	if after := dumpRows(t, db, table+"_dead"); countRows(t, db, table) != 0 || strings.Join(after, "\n") != strings.Join(before, "\n") {
		t.Errorf("RequeueDead changed the tables: %d jobs, dead %q (was %q)", countRows(t, db, table), after, before)
	}
	// Ids given are what the check's fix names.
	if id, err := q.Enqueue(ctx, db, inbox.Job{ID: "given-1", Data: p}); err != nil || id != "given-1" {
		t.Errorf("Enqueue with an id = %v, %v; want given-1", id, err)
	}
	mustBeIdle(t, db, q)
}

// keyTable creates an advisory table with a key column customer declared
// as keyDecl, in the queue and dead tables.
func keyTable(t *testing.T, e Engine, db *sql.DB, what, keyDecl string) string {
	t.Helper()
	table := tableName(e, what)
	id, timeType, blob, text := "bigserial PRIMARY KEY", "timestamptz", "bytea", "text"
	switch {
	case e.IsMySQL():
		id, timeType, blob, text = "bigint AUTO_INCREMENT PRIMARY KEY", "DATETIME(6) NULL", "blob", "varchar(64)"
	case e.IsSQLite():
		id, timeType, blob, text = "INTEGER PRIMARY KEY AUTOINCREMENT", "TEXT", "BLOB", "TEXT"
	}
	for _, s := range []string{
		"DROP TABLE IF EXISTS " + table, "DROP TABLE IF EXISTS " + table + "_dead",
		"CREATE TABLE " + table + " (id " + id + ", attempt integer NOT NULL DEFAULT 1, payload " + blob +
			" NOT NULL, customer " + strings.ReplaceAll(keyDecl, "TEXT", text) + ", not_before " + timeType + ")",
		"CREATE TABLE " + table + "_dead (id bigint PRIMARY KEY, attempt integer NOT NULL, payload " + blob + " NOT NULL, customer " + text + ")",
	} {
		mustExec(t, e, db, s)
	}
	dropAtEnd(t, e, db, table, table+"_dead")
	return table
}

// TestSchemaKeyNotWritten: an advisory key on a column Enqueue does not
// write (not the id, not in Table.Data) is refused by the schema check
// unless the database fills it, naming the fix and changing nothing;
// listed in Data, or with a default or as a generated column, it passes,
// and jobs of one customer hold one key. Before: the check passed, and the
// first Enqueue failed (MariaDB's error 1364, PostgreSQL's 23502).
func TestSchemaKeyNotWritten(t *testing.T) {
	eachEngine(t, nil, func(t *testing.T, e Engine) {
		db := e.Open(t, 4)
		ctx := context.Background()
		gen := "TEXT GENERATED ALWAYS AS (hex(payload))"
		switch {
		case e.IsPostgres():
			gen = "TEXT GENERATED ALWAYS AS (encode(payload, 'hex')) STORED"
		case e.IsMySQL():
			gen = "TEXT AS (hex(payload)) STORED"
		}
		tb := Table("", "advisory")
		tb.AdvisoryKey = "customer"

		table := keyTable(t, e, db, "key_unwritten", "TEXT NOT NULL")
		tb.Name, tb.DeadTable = table, table+"_dead"
		q := newQueue(t, db, queueConfig(e, tb, nil))
		ps := problemsOf(t, checkUnchanged(t, e, db, q, table, table+"_dead"))
		if len(ps) != 1 {
			t.Fatalf("%d problems, want 1:\n%s", len(ps), strings.Join(ps, "\n"))
		}
		hasProblem(t, ps, "column "+table+".customer (Table.AdvisoryKey)", "not in Table.Data", "has no default", "list it in Table.Data")

		// The fix: the key among the data, each job given its customer.
		withData := tb
		withData.Data = []string{"payload", "customer"}
		q = newQueue(t, db, queueConfig(e, withData, nil))
		if err := checkUnchanged(t, e, db, q, table, table+"_dead"); err != nil {
			t.Fatalf("key in Table.Data: %v", err)
		}
		for _, c := range []string{"acme", "acme", "globex"} {
			if _, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte("p"), c}}); err != nil {
				t.Fatal(err)
			}
		}
		ds, err := q.Claim(ctx, 10)
		if err != nil || len(ds) != 2 || ds[0].Key() != "acme" || ds[1].Key() != "globex" {
			t.Fatalf("claimed %d jobs, %v; want one of each customer", len(ds), err)
		}
		for _, d := range ds {
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
		d := claimOne(t, q)
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
		mustBeIdle(t, db, q)

		// Or the database fills it: a default, a generated column.
		for _, decl := range []string{"TEXT NOT NULL DEFAULT 'none'", gen} {
			table := keyTable(t, e, db, "key_filled", decl)
			tb.Name, tb.DeadTable = table, table+"_dead"
			q := newQueue(t, db, queueConfig(e, tb, nil))
			if err := checkUnchanged(t, e, db, q, table, table+"_dead"); err != nil {
				t.Errorf("customer %s: %v", decl, err)
			}
			enqueueOne(t, q, db, "p")
			d := claimOne(t, q)
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
			mustBeIdle(t, db, q)
		}
	})
}

// TestSchemaLookalikeNames: schemas, databases and functions a user names
// after a look-alike's (crdb_internal, _vt, yb_servers, and on PostgreSQL
// an INFORMATION_SCHEMA.TIDB_SERVERS_INFO of the user's) do not make the
// check take PostgreSQL or MariaDB for CockroachDB, Vitess, YugabyteDB or
// TiDB: every form passes. Before: PostgreSQL was taken for CockroachDB
// (the row lock and advisory forms refused), MariaDB for CockroachDB (a
// wrong dialect in every form).
func TestSchemaLookalikeNames(t *testing.T) {
	eachEngine(t, notSQLite, func(t *testing.T, e Engine) {
		db := e.Open(t, 4)
		var create, drop []string
		if e.IsPostgres() {
			// Schemas are the test database's own.
			create = []string{"CREATE SCHEMA crdb_internal", "CREATE SCHEMA _vt", `CREATE SCHEMA "INFORMATION_SCHEMA"`,
				`CREATE TABLE "INFORMATION_SCHEMA"."TIDB_SERVERS_INFO" (ddl_id text)`,
				"CREATE FUNCTION yb_servers() RETURNS integer LANGUAGE sql AS 'SELECT 1'"}
			drop = []string{"DROP SCHEMA IF EXISTS crdb_internal", "DROP SCHEMA IF EXISTS _vt", `DROP SCHEMA IF EXISTS "INFORMATION_SCHEMA" CASCADE`,
				"DROP FUNCTION IF EXISTS yb_servers()"}
		} else {
			// Databases are the server's: made for this test alone, and
			// dropped at its end whatever it found.
			create = []string{"CREATE DATABASE crdb_internal", "CREATE DATABASE _vt",
				"CREATE FUNCTION yb_servers() RETURNS integer DETERMINISTIC RETURN 1"}
			drop = []string{"DROP DATABASE IF EXISTS crdb_internal", "DROP DATABASE IF EXISTS _vt", "DROP FUNCTION IF EXISTS yb_servers"}
		}
		for _, s := range drop {
			mustExec(t, e, db, s)
		}
		t.Cleanup(func() {
			for _, s := range drop {
				if _, err := db.Exec(s); err != nil {
					t.Errorf("%s: %v", s, err)
				}
			}
		})
		for _, s := range create {
			mustExec(t, e, db, s)
		}
		for _, form := range formsWithKey(e) {
			table := newTable(t, e, db, "lookalike_"+form)
			q := newQueue(t, db, queueConfig(e, Table(table, form), nil))
			if err := checkUnchanged(t, e, db, q, table, table+"_dead"); err != nil {
				t.Errorf("%s form: %v", form, err)
			}
		}
	})
}
