package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/optin"
)

// The repository's documents and schema files, relative to this directory.
const (
	repoRoot  = "../.."
	readme    = repoRoot + "/README.md"
	schemaDir = repoRoot + "/schema"
)

// docs are the Markdown files whose Go blocks and links the tests check.
func docs(t *testing.T) []string {
	t.Helper()
	files := []string{readme, repoRoot + "/CONTRIBUTING.md", repoRoot + "/bench/README.md"}
	for _, pattern := range []string{"/docs/*.md", "/docs/design/*.md"} {
		more, err := filepath.Glob(repoRoot + pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, more...)
	}
	return files
}

// block is one fenced code block of a Markdown file.
type block struct {
	lang   string // the info string's first word: "go", "sh"
	line   int    // of the opening fence
	text   []string
	marker string // what follows "compile:" in an HTML comment on the line before the fence
}

// blockMarker is the HTML comment before a fence that tells TestDocGoBlocks
// how to check the block: <!-- compile: copy of examples/hello/main.go -->.
// It does not render.
var blockMarker = regexp.MustCompile(`^<!--\s*compile:\s*(.*?)\s*-->$`)

// isFence reports whether l opens or closes a fenced code block, which may be
// indented (inside a list item).
func isFence(l string) bool {
	return strings.HasPrefix(strings.TrimLeft(l, " "), "```")
}

// mdLines returns the lines of a Markdown file.
func mdLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(string(b), "\n")
}

// codeBlocks returns the fenced code blocks of a Markdown file.
func codeBlocks(t *testing.T, path string) []block {
	t.Helper()
	var blocks []block
	var cur *block
	indent := ""
	lines := mdLines(t, path)
	for i, l := range lines {
		switch {
		case cur == nil && isFence(l):
			trimmed := strings.TrimLeft(l, " ")
			indent = l[:len(l)-len(trimmed)]
			cur = &block{line: i + 1}
			if info := strings.Fields(strings.TrimPrefix(trimmed, "```")); len(info) > 0 {
				cur.lang = info[0]
			}
			if i > 0 {
				if m := blockMarker.FindStringSubmatch(strings.TrimSpace(lines[i-1])); m != nil {
					cur.marker = m[1]
				}
			}
		case cur != nil && strings.TrimSpace(l) == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.text = append(cur.text, strings.TrimPrefix(l, indent))
		}
	}
	if cur != nil {
		t.Fatalf("%s: code block at line %d never closes", path, cur.line)
	}
	return blocks
}

// significant returns the lines without their indentation, blank ones
// dropped: a block that copies source code is compared dedented.
func significant(lines []string) []string {
	var out []string
	for _, l := range lines {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// readmeMaxLines is the README's length at most: it is the front door, and
// reference material goes to docs/.
const readmeMaxLines = 300

// TestReadmeLength checks that the README stays within readmeMaxLines.
func TestReadmeLength(t *testing.T) {
	if n := len(mdLines(t, readme)) - 1; n > readmeMaxLines {
		t.Errorf("the README has %d lines, want at most %d: move reference material to docs/", n, readmeMaxLines)
	}
}

// TestReadmeCommands checks that the README still gives the two commands a
// newcomer runs first, exactly as .ci/run and the examples expect them.
func TestReadmeCommands(t *testing.T) {
	var commands []string
	for _, b := range codeBlocks(t, readme) {
		if b.lang == "sh" {
			commands = append(commands, significant(b.text)...)
		}
	}
	for _, want := range []string{
		"go run ./examples/report",
		readmeTestCommand,
	} {
		found := false
		for _, c := range commands {
			found = found || c == want
		}
		if !found {
			t.Errorf("the README has no sh block with %q", want)
		}
	}
	ci, err := os.ReadFile(repoRoot + "/.ci/run")
	if err != nil {
		t.Fatal(err)
	}
	// CI runs the README's line itself, so that the two cannot differ.
	if !strings.Contains(string(ci), "grep -m1 '^go test ' README.md") {
		t.Error(".ci/run no longer reads its test command from the README")
	}
	for _, c := range commands {
		if strings.HasPrefix(c, "go test ") && c != readmeTestCommand {
			t.Errorf("the README's first go test line is %q, which .ci/run would run; want %q", c, readmeTestCommand)
		}
		if strings.HasPrefix(c, "go test ") {
			break
		}
	}
}

// readmeTestCommand is the README's test command, the line .ci/run runs
// with -race added.
const readmeTestCommand = "go test -count=1 -timeout 60m ./... ./dbtest/... ./examples/... ./bench/... ./dashboard/browsertest/... ./listen/pgxlisten/... ./listen/pqlisten/... ./periodic/cron/... ./cmd/inbox/..."

// mdLink is a Markdown link or image: [text](target).
var mdLink = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)\)`)

// slug is GitHub's anchor for a heading: lower case, punctuation dropped,
// spaces turned into hyphens.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || ('a' <= r && r <= 'z') || ('0' <= r && r <= '9') || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the heading anchors of a Markdown file.
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	fenced := false
	for _, l := range mdLines(t, path) {
		if isFence(l) {
			fenced = !fenced
		}
		if !fenced && strings.HasPrefix(l, "#") {
			out[slug(strings.TrimLeft(l, "#"))] = true
		}
	}
	return out
}

// TestDocLinks checks that every relative link of the documents names a
// file or directory of the repository, and every anchor a heading.
func TestDocLinks(t *testing.T) {
	for _, doc := range docs(t) {
		fenced := false
		for i, l := range mdLines(t, doc) {
			if isFence(l) {
				fenced = !fenced
			}
			if fenced {
				continue
			}
			for _, m := range mdLink.FindAllStringSubmatch(l, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, anchor, _ := strings.Cut(target, "#")
				path := doc
				if file != "" {
					path = filepath.Join(filepath.Dir(doc), file)
					if _, err := os.Stat(path); err != nil {
						t.Errorf("%s line %d: link %q: %v", doc, i+1, target, err)
						continue
					}
				}
				if anchor != "" && strings.HasSuffix(path, ".md") && !anchors(t, path)[anchor] {
					t.Errorf("%s line %d: link %q: no heading with that anchor", doc, i+1, target)
				}
			}
		}
	}
}

// schemaFile is one of the schema files: schema/<engine>-<form>.sql.
type schemaFile struct {
	path, engine, form string
}

var schemaName = regexp.MustCompile(`^(postgres|mysql|sqlite)-(lease|rowlock|advisory)\.sql$`)

// schemaFiles returns the schema files; every .sql file there must be named
// for an engine and a form, and every pair but SQLite's row lock must have
// one.
func schemaFiles(t *testing.T) []schemaFile {
	t.Helper()
	paths, err := filepath.Glob(schemaDir + "/*.sql")
	if err != nil {
		t.Fatal(err)
	}
	var files []schemaFile
	have := map[string]bool{}
	for _, p := range paths {
		m := schemaName.FindStringSubmatch(filepath.Base(p))
		if m == nil {
			t.Errorf("%s: a schema file is named <postgres|mysql|sqlite>-<lease|rowlock|advisory>.sql", p)
			continue
		}
		files = append(files, schemaFile{p, m[1], m[2]})
		have[m[1]+"-"+m[2]] = true
	}
	for _, engine := range []string{"postgres", "mysql", "sqlite"} {
		for _, form := range []string{"lease", "rowlock", "advisory"} {
			want := !(engine == "sqlite" && form == "rowlock")
			if have[engine+"-"+form] != want {
				t.Errorf("schema/%s-%s.sql: present %v, want %v", engine, form, have[engine+"-"+form], want)
			}
		}
	}
	return files
}

// statements splits a schema file into its statements, comments dropped.
func statements(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range strings.Split(stripComments(string(b)), ";") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// stripComments drops SQL line comments.
func stripComments(s string) string {
	return regexp.MustCompile(`--[^\n]*`).ReplaceAllString(s, "")
}

// TestReadmeLinksSchemas checks that the README links every schema file.
func TestReadmeLinksSchemas(t *testing.T) {
	b, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range schemaFiles(t) {
		if link := "(schema/" + filepath.Base(f.path) + ")"; !strings.Contains(string(b), link) {
			t.Errorf("the README does not link %s", f.path)
		}
	}
}

// TestQuickstartSchema checks that the quick start's schema is
// schema/sqlite-lease.sql with its tables named report_jobs, as the README
// says.
func TestQuickstartSchema(t *testing.T) {
	var want []string
	for _, s := range statements(t, schemaDir+"/sqlite-lease.sql") {
		want = append(want, strings.Join(strings.Fields(regexp.MustCompile(`\bjobs`).ReplaceAllString(s, "report_jobs")), " "))
	}
	var got []string
	for _, s := range schema {
		got = append(got, strings.Join(strings.Fields(stripComments(s)), " "))
	}
	if strings.Join(got, ";\n") != strings.Join(want, ";\n") {
		t.Errorf("examples/quickstart's schema:\n%s\nschema/sqlite-lease.sql, renamed:\n%s", strings.Join(got, ";\n"), strings.Join(want, ";\n"))
	}
}

// schemaPrefix keeps the schema files' tables apart from every other test's
// on the shared servers.
const schemaPrefix = "ex_rd_"

// TestSchemaFiles creates each schema file on its engine and runs a queue
// with the description of forms.go on it: CheckSchema finds nothing wrong,
// and a job goes through a claim and an ack, another to the dead table. On
// the lease form docs/worker.md's Batcher sample then settles a claim of three.
//
// With optional, the file's commented lines run too, and the description
// names every optional column they add: the buried job is listed with its
// time of death, and the dead table has the index on (dead_at, id) that
// ListDead pages by.
func TestSchemaFiles(t *testing.T) {
	for _, f := range schemaFiles(t) {
		for _, optional := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/%s/optional=%v", f.engine, f.form, optional), func(t *testing.T) {
				schemaFileRun(t, f, optional)
			})
		}
	}
}

// schemaFileRun is one run of TestSchemaFiles.
func schemaFileRun(t *testing.T, f schemaFile, optional bool) {
	tb := map[string]inbox.Table{"lease": leaseTable, "rowlock": rowLockTable, "advisory": advisoryTable}[f.form]
	stmts := statements(t, f.path)
	if optional {
		stmts = append(stmts, optionalStatements(t, f.path)...)
		tb.LastError, tb.Priority, tb.EnqueuedAt, tb.DeadAt = "last_error", "priority", "enqueued_at", "dead_at"
		tb.ControlTable = "jobs_control"
	}
	var db *sql.DB
	var dialect inbox.Dialect
	switch f.engine {
	case "sqlite":
		dialect = inbox.SQLite
		db = open(t, "sqlite", "file:"+filepath.Join(t.TempDir(), "schema.db")+"?_pragma=busy_timeout(5000)")
	case "postgres":
		dialect = inbox.Postgres
		db = open(t, "pgx", dsn(t, "INBOX_POSTGRES_DSN"))
	case "mysql":
		dialect = inbox.MySQL
		db = open(t, "mysql", dsn(t, "INBOX_MYSQL_DSN"))
	}
	if f.engine != "sqlite" {
		// The shared servers: the file's tables and indexes get
		// this test's prefix.
		for i, s := range stmts {
			stmts[i] = regexp.MustCompile(`\bjobs`).ReplaceAllString(s, schemaPrefix+"jobs")
		}
		tb.Name = schemaPrefix + tb.Name
		tb.DeadTable = schemaPrefix + tb.DeadTable
		if tb.ClaimsTable != "" {
			tb.ClaimsTable = schemaPrefix + tb.ClaimsTable
		}
		if tb.ControlTable != "" {
			tb.ControlTable = schemaPrefix + tb.ControlTable
		}
		drop := func() {
			for _, name := range []string{tb.Name, tb.DeadTable, tb.ClaimsTable, tb.ControlTable} {
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
	for _, stmt := range stmts {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatalf("%s: %v\n%s", f.path, err, stmt)
		}
	}
	ctx := context.Background()
	q, err := inbox.New(db, inbox.Config{Dialect: dialect, Table: tb})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.CheckSchema(ctx); err != nil {
		t.Fatalf("%s: %v", f.path, err)
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
	if left, dead := count(t, db, tb.Name), count(t, db, tb.DeadTable); left != 0 || dead != 1 {
		t.Errorf("%d jobs left, %d dead; want 0 and 1", left, dead)
	}
	if optional {
		schemaDeadAt(t, ctx, db, q, f.engine, tb.DeadTable)
		schemaPause(t, ctx, q)
	}
	if f.form == "lease" {
		tryAckBatch(t, ctx, db, q, tb.Name)
	}
}

// optionalStatements are the statements a schema file leaves commented out,
// for the optional columns: its lines "-- ALTER …", "-- CREATE …" and
// "-- DROP …", which may run on over several lines ending with ";".
func optionalStatements(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		s, ok := strings.CutPrefix(line, "-- ")
		if ok && regexp.MustCompile(`^(ALTER|CREATE|DROP) `).MatchString(s) {
			out = append(out, strings.TrimSuffix(s, ";"))
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s: no optional statements", path)
	}
	return out
}

// schemaDeadAt checks the dead job the file's optional columns keep: its
// error and time of death listed, and the index (dead_at, id) on the dead
// table.
func schemaDeadAt(t *testing.T, ctx context.Context, db *sql.DB, q *inbox.Queue, engine, dead string) {
	t.Helper()
	jobs, err := q.ListDead(ctx, 10, nil)
	if err != nil || len(jobs) != 1 || jobs[0].DeadAt.IsZero() {
		t.Fatalf("ListDead = %+v, %v; want one job with its time of death", jobs, err)
	}
	var cols []string
	var rows *sql.Rows
	switch engine {
	case "postgres":
		rows, err = db.Query("SELECT indexdef FROM pg_indexes WHERE tablename = $1", dead)
	case "mysql":
		rows, err = db.Query("SELECT GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX) FROM information_schema.STATISTICS "+
			"WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? GROUP BY INDEX_NAME", dead)
	default:
		rows, err = db.Query("SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql IS NOT NULL", dead)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			t.Fatal(err)
		}
		cols = append(cols, strings.ReplaceAll(c, " ", ""))
	}
	for _, c := range cols {
		if c == "dead_at,id" || strings.HasSuffix(c, "(dead_at,id)") {
			return
		}
	}
	t.Errorf("%s has no index on (dead_at, id): %v", dead, cols)
}

// tryAckBatch runs docs/worker.md's Batcher sample on q: of three jobs, the two
// that succeed are acknowledged together, the one that fails waits for its
// retry.
func tryAckBatch(t *testing.T, ctx context.Context, db *sql.DB, q *inbox.Queue, table string) {
	t.Helper()
	for _, payload := range []string{"one", "two", "fails"} {
		if _, err := q.Enqueue(ctx, db, inbox.Job{Data: []any{[]byte(payload)}}); err != nil {
			t.Fatal(err)
		}
	}
	b, err := q.NewBatcher(inbox.BatchConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var ran []string
	run := func(d *inbox.Delivery) error {
		var payload []byte
		if err := d.Scan(&payload); err != nil {
			return err
		}
		ran = append(ran, string(payload))
		if string(payload) == "fails" {
			return errors.New("it fails")
		}
		return nil
	}
	if err := ackBatch(ctx, q, b, run); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(ran) != "[one two fails]" {
		t.Errorf("ran %v, want [one two fails]", ran)
	}
	if left := count(t, db, table); left != 1 {
		t.Errorf("%d jobs left after the batch, want the one waiting for its retry", left)
	}
	if ds, err := q.Claim(ctx, 16); err != nil || len(ds) != 0 {
		t.Errorf("Claim after the batch: %d deliveries, %v; want none before the retry is due", len(ds), err)
	}
}

// ackBatch is docs/worker.md's Batcher sample: it claims up to 16 lease jobs,
// runs each, and acknowledges the ones that succeeded together.
func ackBatch(ctx context.Context, q *inbox.Queue, b *inbox.Batcher, run func(*inbox.Delivery) error) error {
	ds, err := q.Claim(ctx, 16)
	if err != nil {
		return err
	}
	var done []*inbox.Delivery
	for _, d := range ds {
		if run(d) == nil {
			done = append(done, d)
		} else if err := d.Retry(ctx, time.Minute); err != nil {
			return err
		}
	}
	// One statement deletes them all, each row only while it still
	// carries its delivery's token. A lost lease is another worker's job now.
	for _, err := range b.AckAll(ctx, done) {
		if err != nil && !errors.Is(err, inbox.ErrLeaseLost) {
			return err
		}
	}
	return nil
}

func count(t *testing.T, db *sql.DB, table string) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM " + table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
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
	return optin.DSN(t, env, "the schema files on its database")
}

// schemaPause pauses and resumes the queue through the file's control
// table.
func schemaPause(t *testing.T, ctx context.Context, q *inbox.Queue) {
	t.Helper()
	if err := q.Pause(ctx, "schema test"); err != nil {
		t.Fatal(err)
	}
	if ps, err := q.Paused(ctx); err != nil || !ps.Paused || ps.By != "schema test" {
		t.Errorf("Paused = %+v, %v; want paused by the schema test", ps, err)
	}
	if err := q.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if ps, err := q.Paused(ctx); err != nil || ps.Paused {
		t.Errorf("Paused after Resume = %+v, %v; want running", ps, err)
	}
}
