package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// How TestDocGoBlocks checks a ```go block, chosen per block:
//
//   - A copy: the line before the fence is <!-- compile: copy of PATH -->,
//     PATH a Go file from the repository's root. The block must be a run of
//     that file's lines (dedented, blank lines aside), or the whole file when
//     it has a package clause; the file is compiled and tested where it lives.
//     For code shown in its context: a function of an example, a few lines
//     of a handler.
//   - A file: the block has a package clause. It is written alone into a
//     package of its own and vetted; a test file (package …_test, or one
//     importing "testing") also runs with go test.
//   - A fragment: anything else. Declarations (funcs, vars, types, imports)
//     go at the top of a file; statements go in the body of a function
//     returning error, so that they may `return err`. Either way the names of
//     fragmentScope are declared, the imports the fragment uses are added
//     (fragmentImports), and each variable the statements declare at their
//     top level counts as used, as the code after a fragment would use it.
//
// Fragments and files are vetted together in one temporary module, outside
// the working tree: a copy of the examples module's go.mod and go.sum, so
// that they resolve what the examples do, from the module cache. Each is
// written under //line directives, so a compiler error names the document
// and its line.

// fragmentScope declares the names a fragment may use as if declared before
// it. docs/howto.md lists them for its readers.
const fragmentScope = `
// The names a document's fragment may use.
var (
	ctx    context.Context
	db     *sql.DB
	q      *inbox.Queue
	d      *inbox.Delivery
	tx     *sql.Tx
	t      *testing.T
	handle worker.Handler
)
`

// fragmentImports are the packages a fragment may name without importing
// them, by the name it uses.
var fragmentImports = map[string]string{
	"context":   "context",
	"errors":    "errors",
	"fmt":       "fmt",
	"http":      "net/http",
	"log":       "log",
	"os":        "os",
	"signal":    "os/signal",
	"slog":      "log/slog",
	"sql":       "database/sql",
	"strings":   "strings",
	"syscall":   "syscall",
	"testing":   "testing",
	"time":      "time",
	"inbox":     "github.com/sqlinbox/inbox",
	"worker":    "github.com/sqlinbox/inbox/worker",
	"inboxtest": "github.com/sqlinbox/inbox/inboxtest",
	"metrics":   "github.com/sqlinbox/inbox/metrics",
	"dashboard": "github.com/sqlinbox/inbox/dashboard",
	"pgxlisten": "github.com/sqlinbox/inbox/listen/pgxlisten",
	"sqlmock":   "github.com/DATA-DOG/go-sqlmock",
}

// goBlock is one ```go block of a document and how it is checked.
type goBlock struct {
	doc  string // relative to the repository's root
	b    block
	kind string // "copy", "file" or "fragment"
	path string // a copy's file, relative to the repository's root
	src  string // a file or fragment as written to its package
	test bool   // a file of tests, which also run
}

// where is the block's place, as an error names it.
func (g goBlock) where() string { return fmt.Sprintf("%s:%d", g.doc, g.b.line) }

// TestDocGoBlocks checks that every ```go block of the documents compiles:
// a copy is a run of the lines of the Go file it names, a whole file and a
// fragment are vetted (and a file of tests run) in a module of their own. A
// block that is not Go on purpose (output, pseudo-code) is fenced as
// something else, ```text.
func TestDocGoBlocks(t *testing.T) {
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []goBlock
	inReadme := 0
	for _, doc := range docs(t) {
		rel, err := filepath.Rel(repoRoot, doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range codeBlocks(t, doc) {
			if b.lang != "go" {
				if b.marker != "" {
					t.Errorf("%s:%d: a compile marker before a ```%s block: only ```go blocks are compiled", rel, b.line, b.lang)
				}
				continue
			}
			if doc == readme {
				inReadme++
			}
			g := goBlock{doc: filepath.ToSlash(rel), b: b}
			if err := g.prepare(filepath.Join(root, rel)); err != nil {
				t.Errorf("%s: %s", g.where(), strings.ReplaceAll(err.Error(), root+string(filepath.Separator), ""))
				continue
			}
			blocks = append(blocks, g)
		}
	}
	// The README's is the quick start; the rest are in docs/.
	if inReadme < 1 || len(blocks) < 30 {
		t.Errorf("found %d Go blocks in the README and %d in all, want at least 1 and 30: did the fences change?", inReadme, len(blocks))
	}

	var built []goBlock
	for _, g := range blocks {
		if g.kind == "copy" {
			checkCopy(t, root, g)
		} else {
			built = append(built, g)
		}
	}
	if len(built) > 0 {
		buildBlocks(t, root, built)
	}
}

// prepare decides how g is checked and, for a file or a fragment, writes
// its source; abs is the document's absolute path, for //line directives.
func (g *goBlock) prepare(abs string) error {
	if g.b.marker != "" {
		path, ok := strings.CutPrefix(g.b.marker, "copy of ")
		if !ok || !strings.HasSuffix(path, ".go") || strings.ContainsAny(path, " \t") {
			return fmt.Errorf("marker %q: the one marker is <!-- compile: copy of PATH.go -->, PATH from the repository's root", g.b.marker)
		}
		g.kind, g.path = "copy", path
		return nil
	}
	text := strings.Join(g.b.text, "\n")
	first := fmt.Sprintf("//line %s:%d\n", abs, g.b.line+1)
	last := fmt.Sprintf("\n//line %s:%d\n", abs, g.b.line+len(g.b.text)+1)
	fset := token.NewFileSet()

	// A whole file: its package clause parses.
	if f, err := parser.ParseFile(fset, "", text, parser.PackageClauseOnly); err == nil {
		g.kind, g.src = "file", first+text+"\n"
		f, err = parser.ParseFile(fset, "", g.src, parser.ImportsOnly)
		if err != nil {
			return err
		}
		g.test = strings.HasSuffix(f.Name.Name, "_test")
		for _, im := range f.Imports {
			g.test = g.test || im.Path.Value == `"testing"`
		}
		return nil
	}
	g.kind = "fragment"

	// Declarations, when they parse as a file's; the scope comes after
	// them, so that their imports stay first.
	src := "package doc\n" + first + text + last + fragmentScope
	f, declErr := parser.ParseFile(fset, "", src, 0)
	if declErr == nil {
		g.src = withImports(src, f)
		return nil
	}

	// Statements, in a function's body.
	src = "package doc\n" + fragmentScope + "\nfunc _() error {\n" + first + text + last + "}\n"
	f, err := parser.ParseFile(fset, "", src, 0)
	if err != nil {
		return fmt.Errorf("the block parses neither as declarations (%v) nor as statements (%v): fence it as ```text if it is not Go", declErr, err)
	}
	var body []ast.Stmt
	for _, decl := range f.Decls {
		if fn, ok := decl.(*ast.FuncDecl); ok && fn.Name.Name == "_" {
			body = fn.Body.List
		}
	}
	var names []string
	for _, s := range body {
		names = append(names, declared(s)...)
	}
	lines := strings.Split(src, "\n")
	// The closing brace is the last line but the empty one after it.
	at := len(lines) - 2
	var ret []string
	if len(body) == 0 || !isReturn(body[len(body)-1]) {
		ret = []string{"return nil"}
	} else if len(names) > 0 {
		// The uses go before the final return, and the lines after them
		// get their own numbers back.
		end := body[len(body)-1]
		at = fset.PositionFor(end.Pos(), false).Line - 1
		ret = []string{fmt.Sprintf("//line %s:%d", abs, fset.Position(end.Pos()).Line)}
	}
	var uses []string
	for _, n := range names {
		// By address: a value holding a lock must not be copied.
		uses = append(uses, "_ = &"+n)
	}
	lines = slices.Insert(lines, at, append(uses, ret...)...)
	src = strings.Join(lines, "\n")
	if f, err = parser.ParseFile(fset, "", src, 0); err != nil {
		return fmt.Errorf("wrapping the statements: %v", err)
	}
	g.src = withImports(src, f)
	return nil
}

// declared returns the names a statement of a fragment's top level declares.
func declared(s ast.Stmt) []string {
	var names []string
	add := func(id *ast.Ident) {
		if id.Name != "_" && !slices.Contains(names, id.Name) {
			names = append(names, id.Name)
		}
	}
	switch s := s.(type) {
	case *ast.AssignStmt:
		if s.Tok == token.DEFINE {
			for _, e := range s.Lhs {
				if id, ok := e.(*ast.Ident); ok {
					add(id)
				}
			}
		}
	case *ast.DeclStmt:
		if gd, ok := s.Decl.(*ast.GenDecl); ok && gd.Tok == token.VAR {
			for _, spec := range gd.Specs {
				for _, id := range spec.(*ast.ValueSpec).Names {
					add(id)
				}
			}
		}
	}
	return names
}

func isReturn(s ast.Stmt) bool {
	_, ok := s.(*ast.ReturnStmt)
	return ok
}

// withImports adds to src, a fragment's file parsed as f, the imports of
// fragmentImports that it names and does not import itself.
func withImports(src string, f *ast.File) string {
	have := map[string]bool{}
	for _, im := range f.Imports {
		path, _ := strconv.Unquote(im.Path.Value)
		have[path] = true
	}
	var add []string
	for _, id := range f.Unresolved {
		if path, ok := fragmentImports[id.Name]; ok && !have[path] {
			have[path] = true
			add = append(add, strconv.Quote(path))
		}
	}
	if len(add) == 0 {
		return src
	}
	slices.Sort(add)
	clause, rest, _ := strings.Cut(src, "\n")
	return clause + "\nimport (\n" + strings.Join(add, "\n") + "\n)\n" + rest
}

// checkCopy checks that g, a copy, is a run of the lines of its file (or
// the whole file, for a block with a package clause).
func checkCopy(t *testing.T, root string, g goBlock) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(g.path)))
	if err != nil {
		t.Errorf("%s: the block's marker names %s: %v", g.where(), g.path, err)
		return
	}
	src := significant(strings.Split(string(b), "\n"))
	want := significant(g.b.text)
	if len(want) == 0 {
		t.Errorf("%s: an empty block", g.where())
		return
	}
	if slices.ContainsFunc(want, func(l string) bool { return strings.HasPrefix(l, "package ") }) {
		n := 0
		for n < len(want) && n < len(src) && want[n] == src[n] {
			n++
		}
		switch {
		case n < len(want):
			t.Errorf("%s: the block has a package clause but is not the whole of %s, which its marker names; change the two together. First line that differs, block line %d:\n\t%s",
				g.where(), g.path, blockLine(g.b, n), want[n])
		case n < len(src):
			t.Errorf("%s: the block has a package clause but ends before the end of %s, which its marker names, at:\n\t%s", g.where(), g.path, src[n])
		}
		return
	}
	if n := longestRun(src, want); n < len(want) {
		t.Errorf("%s: the block is marked as a copy of %s but is not a run of its lines (dedented, blank lines aside); change the two together. First line not found there in sequence, block line %d:\n\t%s",
			g.where(), g.path, blockLine(g.b, n), want[n])
	}
}

// longestRun returns how many of needle's first lines follow each other
// somewhere in hay: len(needle) when hay contains needle.
func longestRun(hay, needle []string) int {
	best := 0
	for i := range hay {
		n := 0
		for n < len(needle) && i+n < len(hay) && hay[i+n] == needle[n] {
			n++
		}
		best = max(best, n)
	}
	return best
}

// blockLine returns the document line of the n-th significant line of b.
func blockLine(b block, n int) int {
	for i, l := range b.text {
		if strings.TrimSpace(l) == "" {
			continue
		}
		if n == 0 {
			return b.line + 1 + i
		}
		n--
	}
	return b.line
}

// buildBlocks vets the files and fragments, each a package of its own in a
// temporary module that resolves what the examples module does, and runs
// those that are tests. A failure names the block.
func buildBlocks(t *testing.T, root string, blocks []goBlock) {
	t.Helper()
	dir := t.TempDir()
	mod, err := os.ReadFile(filepath.Join(root, "examples", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(docModule(string(mod), filepath.Join(root, "examples"))), 0o644); err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile(filepath.Join(root, "examples", "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644); err != nil {
		t.Fatal(err)
	}
	var pkgs, tests []string
	for i, g := range blocks {
		pkg := fmt.Sprintf("b%02d", i)
		if err := os.Mkdir(filepath.Join(dir, pkg), 0o755); err != nil {
			t.Fatal(err)
		}
		name := "doc.go"
		if g.test {
			name = "doc_test.go"
			tests = append(tests, "./"+pkg)
		}
		if err := os.WriteFile(filepath.Join(dir, pkg, name), []byte(g.src), 0o644); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, "./"+pkg)
	}
	report := func(args []string) (ok bool) {
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		// The module's own go.mod decides, whatever the caller's go.work.
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
		out, err := cmd.CombinedOutput()
		if err == nil {
			return true
		}
		text := strings.ReplaceAll(string(out), root+string(filepath.Separator), "")
		// go vet's lines name the document's; go test's output comes
		// before the line naming its package, its stack between.
		byBlock, rest := blockOutput(text, blocks, args[0] == "vet")
		for i, msg := range byBlock {
			verb := "does not compile"
			if args[0] == "test" {
				verb = "fails its test"
			}
			t.Errorf("%s: this ```go block (a %s) %s:\n%s", blocks[i].where(), blocks[i].kind, verb, msg)
		}
		if len(byBlock) == 0 || strings.TrimSpace(rest) != "" {
			t.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, rest)
		}
		return false
	}
	// The tests run once everything compiles.
	if report(append([]string{"vet"}, pkgs...)) && len(tests) > 0 {
		report(append([]string{"test", "-count=1"}, tests...))
	}
}

// docModule is the examples module's go.mod made the temporary module's: its
// own path, and the examples' local replacements made absolute.
func docModule(mod, examples string) string {
	mod = regexp.MustCompile(`(?m)^module .*$`).ReplaceAllString(mod, "module doccheck")
	return regexp.MustCompile(`=>\s*(\.\.?(/\S*)?)`).ReplaceAllStringFunc(mod, func(m string) string {
		rel := strings.TrimSpace(strings.TrimPrefix(m, "=>"))
		return "=> " + filepath.Join(examples, rel)
	})
}

// blockPackage finds a block's package in the go command's output.
var blockPackage = regexp.MustCompile(`doccheck/b(\d+)`)

// docPosition finds a document's line in the go command's output, which
// the //line directives put there.
var docPosition = regexp.MustCompile(`(\S+\.md):(\d+)`)

// blockOutput splits the go command's output by the block each line is
// about: with byLine the block holding the document line it names, else the
// package of the last "# doccheck/b03" header, else the next "FAIL
// doccheck/b03" line (go test's, after the test's output). It returns the
// rest apart: a dependency's errors, say.
func blockOutput(out string, blocks []goBlock, byLine bool) (parts map[int]string, rest string) {
	parts = map[int]string{}
	cur := -1
	var pending []string
	for _, l := range strings.Split(out, "\n") {
		if at := blockAt(l, blocks); byLine && at >= 0 {
			parts[at] += "\t" + l + "\n"
			continue
		}
		m := blockPackage.FindStringSubmatch(l)
		switch {
		case m != nil && strings.HasPrefix(l, "# "):
			cur, _ = strconv.Atoi(m[1])
		case strings.HasPrefix(l, "# "):
			cur = -1
			pending = append(pending, l)
		case m != nil && strings.HasPrefix(l, "FAIL"):
			i, _ := strconv.Atoi(m[1])
			for _, p := range pending {
				parts[i] += "\t" + p + "\n"
			}
			pending = nil
		case strings.TrimSpace(l) == "" || l == "FAIL" || strings.HasPrefix(l, "ok "):
		case cur >= 0:
			parts[cur] += "\t" + l + "\n"
		default:
			pending = append(pending, l)
		}
	}
	return parts, strings.Join(pending, "\n")
}

// blockAt returns the index of the block holding the document line that l
// names, or -1.
func blockAt(l string, blocks []goBlock) int {
	m := docPosition.FindStringSubmatch(l)
	if m == nil {
		return -1
	}
	n, _ := strconv.Atoi(m[2])
	for i, g := range blocks {
		if g.doc == m[1] && g.b.line <= n && n <= g.b.line+len(g.b.text)+1 {
			return i
		}
	}
	return -1
}
