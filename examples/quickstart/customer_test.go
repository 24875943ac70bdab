package main

import (
	"context"
	"database/sql"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/sqlinbox/inbox"
)

// TestCustomerKey creates the tables of docs/forms.md's "A key of your own"
// on each engine and runs customerTable on them: CheckSchema finds nothing
// wrong, and of three jobs, two of one customer, a claim takes one of each
// customer, the second of the first after the first is acked; one goes to
// the dead table with its customer.
func TestCustomerKey(t *testing.T) {
	blocks := map[string][]string{}
	for _, b := range codeBlocks(t, repoRoot+"/docs/forms.md") {
		if b.lang == "sql" && len(b.text) > 0 {
			engine := map[string]string{"-- PostgreSQL": "postgres", "-- MySQL, MariaDB": "mysql", "-- SQLite": "sqlite"}[b.text[0]]
			if engine != "" {
				blocks[engine] = b.text
			}
		}
	}
	for _, engine := range []string{"postgres", "mysql", "sqlite"} {
		t.Run(engine, func(t *testing.T) {
			if blocks[engine] == nil {
				t.Fatalf("docs/forms.md has no SQL block for %s", engine)
			}
			customerKeyRun(t, engine, strings.Join(blocks[engine], "\n"))
		})
	}
}

func customerKeyRun(t *testing.T, engine, ddl string) {
	var stmts []string
	for _, s := range strings.Split(stripComments(ddl), ";") {
		if s = strings.TrimSpace(s); s != "" {
			stmts = append(stmts, s)
		}
	}
	tb := customerTable
	var db *sql.DB
	var dialect inbox.Dialect
	switch engine {
	case "sqlite":
		dialect = inbox.SQLite
		db = open(t, "sqlite", "file:"+filepath.Join(t.TempDir(), "customer.db")+"?_pragma=busy_timeout(5000)")
	case "postgres":
		dialect = inbox.Postgres
		db = open(t, "pgx", dsn(t, "INBOX_POSTGRES_DSN"))
	case "mysql":
		dialect = inbox.MySQL
		db = open(t, "mysql", dsn(t, "INBOX_MYSQL_DSN"))
	}
	db.SetMaxOpenConns(4) // the advisory form holds a connection per job
	if engine != "sqlite" {
		// The shared servers: the tables and index get this test's prefix.
		const prefix = "ex_cust_"
		for i, s := range stmts {
			stmts[i] = regexp.MustCompile(`\bjobs`).ReplaceAllString(s, prefix+"jobs")
		}
		tb.Name, tb.DeadTable = prefix+tb.Name, prefix+tb.DeadTable
		drop := func() {
			for _, name := range []string{tb.Name, tb.DeadTable} {
				if _, err := db.Exec("DROP TABLE IF EXISTS " + name); err != nil {
					t.Fatal(err)
				}
			}
		}
		drop()
		t.Cleanup(drop)
	}
	for _, s := range stmts {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	ctx := context.Background()
	q, err := inbox.New(db, inbox.Config{Dialect: dialect, Table: tb})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.CheckSchema(ctx); err != nil {
		t.Fatal(err)
	}
	for _, customer := range []string{"acme", "acme", "globex"} {
		payload := []byte("invoice of " + customer)
		if _, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{payload, customer}}); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := q.Claim(ctx, 10)
	if err != nil || len(ds) != 2 || ds[0].Key() != "acme" || ds[1].Key() != "globex" {
		t.Fatalf("Claim: %d deliveries, %v; want one of acme's, one of globex's", len(ds), err)
	}
	for _, d := range ds {
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	ds, err = q.Claim(ctx, 10)
	if err != nil || len(ds) != 1 || ds[0].Key() != "acme" {
		t.Fatalf("Claim: %d deliveries, %v; want acme's second", len(ds), err)
	}
	if err := ds[0].Dead(ctx); err != nil {
		t.Fatal(err)
	}
	var customer string
	if err := db.QueryRow("SELECT customer FROM " + tb.DeadTable).Scan(&customer); err != nil || customer != "acme" {
		t.Errorf("dead job's customer %q, %v; want acme", customer, err)
	}
	if n := count(t, db, tb.Name); n != 0 {
		t.Errorf("%d jobs left, want 0", n)
	}
}
