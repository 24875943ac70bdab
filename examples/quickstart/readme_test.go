package main

import (
	"context"
	"database/sql"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/sqlinbox/inbox"
)

// readme is the repository's README, relative to this directory.
const readme = "../../README.md"

// block is one fenced code block of the README.
type block struct {
	lang string
	tag  string // the <!-- ... --> comment on the line before, if any
	line int    // of the opening fence
	text []string
}

func readmeBlocks(t *testing.T) []block {
	t.Helper()
	b, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []block
	var cur *block
	prev := ""
	for i, l := range strings.Split(string(b), "\n") {
		switch {
		case cur == nil && strings.HasPrefix(l, "```"):
			cur = &block{lang: strings.TrimPrefix(l, "```"), line: i + 1}
			if strings.HasPrefix(prev, "<!--") {
				cur.tag = strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(prev, "<!--"), "-->"))
			}
		case cur != nil && l == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.text = append(cur.text, l)
		}
		prev = l
	}
	if cur != nil {
		t.Fatalf("README: code block at line %d never closes", cur.line)
	}
	return blocks
}

// significant returns the lines without their indentation, blank ones
// dropped: a README sample is a copy of source code, dedented.
func significant(lines []string) []string {
	var out []string
	for _, l := range lines {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

func contains(hay, needle []string) bool {
	for i := 0; i+len(needle) <= len(hay); i++ {
		match := true
		for j := range needle {
			if hay[i+j] != needle[j] {
				match = false
				break
			}
		}
		if match {
			return true
		}
	}
	return false
}

// TestReadmeGoSamples checks that every Go sample of the README is a copy of
// code of this module, which compiles and is tested, so the README cannot
// drift from it.
func TestReadmeGoSamples(t *testing.T) {
	sources := map[string][]string{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		sources[path] = significant(strings.Split(string(b), "\n"))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, b := range readmeBlocks(t) {
		if b.lang != "go" {
			continue
		}
		n++
		want := significant(b.text)
		found := false
		for _, src := range sources {
			if contains(src, want) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("README line %d: the Go sample is not a copy of any .go file of the examples module:\n%s", b.line, strings.Join(b.text, "\n"))
		}
	}
	if n < 8 {
		t.Errorf("found %d Go samples in the README, want at least 8: did the fences change?", n)
	}
}

// schemaTag reads "schema <engine> <form>".
var schemaTag = regexp.MustCompile(`^schema (postgres|mysql|sqlite) (lease|rowlock|advisory)$`)

// readmePrefix keeps the README's tables apart from every other test's on the
// shared servers.
const readmePrefix = "ex_rd_"

// TestReadmeSchemas creates each schema of the README on its engine and runs
// a queue with the README's description on it: CheckSchema finds nothing
// wrong, and a job goes through a claim and an ack, another to the dead
// table.
func TestReadmeSchemas(t *testing.T) {
	n := 0
	for _, b := range readmeBlocks(t) {
		m := schemaTag.FindStringSubmatch(b.tag)
		if m == nil {
			continue
		}
		n++
		engine, form := m[1], m[2]
		t.Run(engine+"/"+form, func(t *testing.T) {
			tb := map[string]inbox.Table{"lease": leaseTable, "rowlock": rowLockTable, "advisory": advisoryTable}[form]
			if engine == "sqlite" && form == "lease" {
				tb = reportTable
			}
			sqlText := strings.Join(b.text, "\n")
			var db *sql.DB
			var dialect inbox.Dialect
			switch engine {
			case "sqlite":
				dialect = inbox.SQLite
				db = open(t, "sqlite", "file:"+filepath.Join(t.TempDir(), "readme.db")+"?_pragma=busy_timeout(5000)")
			case "postgres":
				dialect = inbox.Postgres
				db = open(t, "pgx", dsn(t, "INBOX_POSTGRES_DSN"))
			case "mysql":
				dialect = inbox.MySQL
				db = open(t, "mysql", dsn(t, "INBOX_MYSQL_DSN"))
			}
			if engine != "sqlite" {
				// The shared servers: the README's jobs and jobs_dead get
				// this test's prefix, index names too.
				sqlText = regexp.MustCompile(`\bjobs`).ReplaceAllString(sqlText, readmePrefix+"jobs")
				tb.Name = readmePrefix + tb.Name
				tb.DeadTable = readmePrefix + tb.DeadTable
				if tb.ClaimsTable != "" {
					tb.ClaimsTable = readmePrefix + tb.ClaimsTable
				}
				drop := func() {
					for _, name := range []string{tb.Name, tb.DeadTable, tb.ClaimsTable} {
						if name == "" {
							continue
						}
						if _, err := db.Exec("DROP TABLE IF EXISTS " + name); err != nil {
							t.Fatal(err)
						}
					}
				}
				drop()
				t.Cleanup(drop)
			}
			for _, stmt := range strings.Split(sqlText, ";\n") {
				if strings.TrimSpace(stripComments(stmt)) == "" {
					continue
				}
				if _, err := db.Exec(stmt); err != nil {
					t.Fatalf("README line %d: %v\n%s", b.line, err, stmt)
				}
			}
			ctx := context.Background()
			q, err := inbox.New(db, inbox.Config{Dialect: dialect, Table: tb})
			if err != nil {
				t.Fatal(err)
			}
			if err := q.CheckSchema(ctx); err != nil {
				t.Fatalf("README line %d: %v", b.line, err)
			}
			for _, payload := range []string{"ack me", "bury me"} {
				if _, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte(payload)}}); err != nil {
					t.Fatal(err)
				}
			}
			for _, settle := range []func(*inbox.Delivery) error{
				func(d *inbox.Delivery) error { return d.Ack(ctx) },
				func(d *inbox.Delivery) error { return d.Dead(ctx) },
			} {
				ds, err := q.Claim(ctx, 1)
				if err != nil || len(ds) != 1 {
					t.Fatalf("Claim: %d deliveries, %v", len(ds), err)
				}
				if ds[0].Attempt() != 1 {
					t.Errorf("attempt %d, want 1", ds[0].Attempt())
				}
				if err := settle(ds[0]); err != nil {
					t.Fatal(err)
				}
			}
			var left, dead int
			if err := db.QueryRow("SELECT COUNT(*) FROM " + tb.Name).Scan(&left); err != nil {
				t.Fatal(err)
			}
			if err := db.QueryRow("SELECT COUNT(*) FROM " + tb.DeadTable).Scan(&dead); err != nil {
				t.Fatal(err)
			}
			if left != 0 || dead != 1 {
				t.Errorf("%d jobs left, %d dead; want 0 and 1", left, dead)
			}
		})
	}
	if n != 8 {
		t.Errorf("found %d tagged schemas in the README, want 8 (3 PostgreSQL, 3 MySQL, 2 SQLite)", n)
	}
}

// stripComments drops SQL line comments.
func stripComments(s string) string {
	return regexp.MustCompile(`--[^\n]*`).ReplaceAllString(s, "")
}

func open(t *testing.T, driver, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Ping(); err != nil {
		t.Fatal(err)
	}
	return db
}

// dsn returns the DSN in env, skipping the test when it is unset, or failing
// it under INBOX_REQUIRE_DBS=1.
func dsn(t *testing.T, env string) string {
	t.Helper()
	v := os.Getenv(env)
	if v == "" {
		if os.Getenv("INBOX_REQUIRE_DBS") == "1" {
			t.Fatalf("%s is not set and INBOX_REQUIRE_DBS=1: the README's schemas must be tried on it", env)
		}
		t.Skipf("%s is not set: skipping the README's schema on it (set INBOX_REQUIRE_DBS=1 to make this a failure)", env)
	}
	return v
}
