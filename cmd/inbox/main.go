// Command inbox inspects and operates the queue table of package
// github.com/sqlinbox/inbox from a shell: stats, jobs, show, requeue, purge,
// cancel, delete-dead, run-now, pause, resume and check, each one call of
// the package's API.
//
// The queue is described by flags or a JSON file holding an inbox.Table,
// the DSN is read from INBOX_DSN (never a flag: it holds a password), and the
// exit code tells a script what happened (see usage). It is a module of its
// own so that the root module stays free of drivers.
package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/lib/pq"
	"github.com/sqlinbox/inbox"
	_ "modernc.org/sqlite"
)

// Exit codes: a script reads them, so they never change meaning.
const (
	exitOK       = 0 // the command did what it was asked
	exitFailed   = 1 // the operation failed: the database's error, a schema problem
	exitUsage    = 2 // bad flags or arguments, no INBOX_DSN: nothing was sent
	exitNotFound = 3 // no such job (ErrNotFound), no such dead job (ErrNotDead)
	exitRefused  = 4 // refused: the API's refusals, purge without -yes
)

const usageText = `usage: inbox [global flags] <command> [args]

The DSN is read from the environment variable INBOX_DSN.

Commands:
  stats                         counts per state, age of the oldest ready job, pause
  jobs [-state S] [-limit n] [-after id | -before id]
                                a page of jobs, highest id first; S is ready,
                                waiting, inwork, dead or all (default all)
  show ID                       one job, from the queue or the dead table
  requeue ID                    put a dead job back; prints its new id
  requeue -as NEWID ID          the same under NEWID (a table whose ids you give)
  requeue -all [-older 168h] [-batch 200] [-max N] -yes
                                put every dead job back (older than the age),
                                -batch jobs per transaction, at most -max;
                                without -yes it prints the count and exits 4
  delete-dead ID                delete one dead job
  run-now ID                    make a waiting job (not-before time, retry
                                delay) ready now
  purge [-older 168h] -yes      delete dead jobs (older than the age, or all)
  cancel ID                     delete a job before it runs
  pause [-by name]              pause the queue's worker loops
  resume                        end a pause
  check                         check the table against the description

Exit codes:
  0  success
  1  the operation failed (a database error, or check found schema problems)
  2  usage error: bad flags or arguments, INBOX_DSN unset; nothing was sent
  3  not found: no job with the id (show, cancel, run-now), no dead job
     (requeue, delete-dead)
  4  refused: the job is in work (cancel under the row lock, run-now), is
     not waiting (run-now), requeue -all without -yes, the description lacks
     what the command needs (control table, dead table, dead-at,
     enqueued-at), in-work jobs cannot be listed, purge without -yes,
     requeue without -as on a table that assigns no ids, -as a dead id

With -json every command prints one JSON object on stdout, and an error
prints {"error": "...", "code": N} there too.

Global flags:
`

// opener opens the database; tests replace it to see that nothing is sent.
var opener = sql.Open

// drivers maps -engine to the dialect and the database/sql driver.
var drivers = map[string]struct {
	dialect inbox.Dialect
	driver  string
}{
	"postgres": {inbox.Postgres, "postgres"},
	"mysql":    {inbox.MySQL, "mysql"},
	"mariadb":  {inbox.MariaDB, "mysql"},
	"sqlite":   {inbox.SQLite, "sqlite"},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// cliError is an error with the exit code it ends the command with.
type cliError struct {
	code     int
	err      error
	problems []string       // a *inbox.SchemaError's
	extra    map[string]any // more fields of the JSON error (requeue -all's count)
}

func (e *cliError) Error() string { return e.err.Error() }

func usageErr(format string, a ...any) error {
	return &cliError{code: exitUsage, err: fmt.Errorf(format, a...)}
}

// global is what the global flags say.
type global struct {
	engine   string
	config   string
	json     bool
	textIDs  bool
	timeout  time.Duration
	lease    time.Duration
	table    inbox.Table
	commands []string // the command and its arguments
}

// run runs the command line args (without the program's name) and returns
// the exit code. env reads the environment (INBOX_DSN).
func run(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) int {
	g, err := parseGlobal(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	var out bytes.Buffer
	if err == nil {
		err = dispatch(ctx, g, env, &out)
	}
	if g.json {
		stdout.Write(out.Bytes())
	} else {
		io.WriteString(stdout, visible(out.String()))
	}
	if err == nil {
		return exitOK
	}
	code, problems, extra := exitFailed, []string(nil), map[string]any(nil)
	var ce *cliError
	if errors.As(err, &ce) {
		code, problems, extra = ce.code, ce.problems, ce.extra
	} else {
		code = codeOf(err)
	}
	if g.json || jsonAsked(args) {
		out := map[string]any{"error": err.Error(), "code": code}
		if problems != nil {
			out["problems"] = problems
		}
		for k, v := range extra {
			out[k] = v
		}
		writeJSON(stdout, out)
	} else {
		msg := err.Error()
		if !strings.HasPrefix(msg, "inbox: ") { // the API's errors say it already
			msg = "inbox: " + msg
		}
		fmt.Fprintln(stderr, visible(msg))
		for _, p := range problems {
			fmt.Fprintf(stderr, "  %s\n", visible(p))
		}
		if code == exitUsage {
			fmt.Fprintln(stderr, "run inbox -h for usage")
		}
	}
	return code
}

// visible returns s with what a terminal would act on written as a Go
// escape (\x1b, \u009b, \xff): the control characters but newline and
// tab, the bidirectional controls, and bytes that are not UTF-8. An error
// text, a payload, a text id or a pauser's name comes from whoever wrote
// the row, and an escape sequence in it could clear the screen, retitle
// the window or rewrite the lines above. -json needs none of this: its
// encoder escapes them.
func visible(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n' || r == '\t':
			b.WriteRune(r)
		case r < utf8.RuneSelf && unicode.IsControl(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// jsonAsked reports whether -json is among the global flags of args, for an
// error met before they were all parsed.
func jsonAsked(args []string) bool {
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			return false
		}
		switch strings.TrimLeft(a, "-") {
		case "json", "json=true", "json=1":
			return true
		}
	}
	return false
}

// codeOf maps the API's errors to exit codes.
func codeOf(err error) int {
	switch {
	case errors.Is(err, inbox.ErrNotFound), errors.Is(err, inbox.ErrNotDead):
		return exitNotFound
	case errors.Is(err, inbox.ErrInWork), isRefusal(err),
		errors.Is(err, inbox.ErrNoControlTable),
		errors.Is(err, inbox.ErrNoDeadTable),
		errors.Is(err, inbox.ErrNoDeadAt),
		errors.Is(err, inbox.ErrNoEnqueuedAt),
		errors.Is(err, inbox.ErrNoInWorkList),
		errors.Is(err, inbox.ErrRequeueNeedsID),
		errors.Is(err, inbox.ErrDeadID):
		return exitRefused
	}
	return exitFailed
}

func parseGlobal(args []string, stderr io.Writer) (global, error) {
	var g global
	fs := flag.NewFlagSet("inbox", flag.ContinueOnError)
	// The error alone is reported on a bad flag, the usage on -h only.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.StringVar(&g.engine, "engine", "", "the database: postgres, mysql, mariadb or sqlite (required)")
	fs.StringVar(&g.config, "config", "", "a JSON `file` holding an inbox.Table; flags override its fields")
	fs.BoolVar(&g.json, "json", false, "print one JSON object per command")
	fs.BoolVar(&g.textIDs, "text-ids", false, "ids are text (UUIDs), not integers")
	fs.DurationVar(&g.timeout, "timeout", 30*time.Second, "how long the command may take")
	fs.DurationVar(&g.lease, "lease", 0, "the lease form's lease (default inbox.DefaultLease)")
	var t inbox.Table
	var data string
	for _, c := range tableFlags {
		if c.name == "data" {
			fs.StringVar(&data, c.name, "", c.usage)
		} else {
			fs.StringVar(c.field(&t), c.name, "", c.usage)
		}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stderr, usageText)
			fs.SetOutput(stderr)
			fs.PrintDefaults()
			return g, err
		}
		return g, &cliError{code: exitUsage, err: err}
	}
	if err := g.readConfig(); err != nil {
		return g, err
	}
	// The flags given override the file's fields.
	fs.Visit(func(f *flag.Flag) {
		for _, c := range tableFlags {
			switch {
			case c.name != f.Name:
			case c.name == "data":
				g.table.Data = strings.Split(data, ",")
			default:
				*c.field(&g.table) = *c.field(&t)
			}
		}
	})
	if _, ok := drivers[g.engine]; !ok {
		if g.engine == "" {
			return g, usageErr("-engine is required: postgres, mysql, mariadb or sqlite")
		}
		return g, usageErr("-engine %q: want postgres, mysql, mariadb or sqlite", g.engine)
	}
	if g.timeout <= 0 {
		return g, usageErr("-timeout must be positive")
	}
	g.commands = fs.Args()
	if len(g.commands) == 0 {
		return g, usageErr("no command given")
	}
	return g, nil
}

// readConfig reads -config's inbox.Table into g.table, refusing fields
// it does not know.
func (g *global) readConfig() error {
	if g.config == "" {
		return nil
	}
	b, err := os.ReadFile(g.config)
	if err != nil {
		return usageErr("-config: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&g.table); err != nil {
		return usageErr("-config %s: %v", g.config, err)
	}
	return nil
}

// parseID reads an id argument: an int64, or text under -text-ids.
func (g global) parseID(s string) (any, error) {
	if g.textIDs {
		if s == "" {
			return nil, usageErr("empty id")
		}
		return s, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return nil, usageErr("id %q is not an integer (use -text-ids for text ids)", s)
	}
	return n, nil
}

// open opens the database and the queue. Neither sql.Open nor inbox.New
// does I/O, so that an error here has sent nothing; the first statement is
// the command's.
func (g global) open(env func(string) string) (*sql.DB, *inbox.Queue, error) {
	dsn := env("INBOX_DSN")
	if dsn == "" {
		return nil, nil, usageErr("INBOX_DSN is not set")
	}
	d := drivers[g.engine]
	cfg := inbox.Config{Dialect: d.dialect, Table: g.table, Lease: g.lease}
	db, err := opener(d.driver, dsn)
	if err != nil {
		return nil, nil, &cliError{code: exitUsage, err: err}
	}
	q, err := inbox.New(db, cfg)
	if err != nil {
		db.Close()
		return nil, nil, &cliError{code: exitUsage, err: err}
	}
	return db, q, nil
}

// tableFlags are the flags describing the table, each naming its field
// of inbox.Table (Data, a comma list, is read apart).
var tableFlags = []struct {
	name, usage string
	field       func(*inbox.Table) *string
}{
	{"table", "the queue table (Table.Name)", func(t *inbox.Table) *string { return &t.Name }},
	{"id", "the id column (default id)", func(t *inbox.Table) *string { return &t.ID }},
	{"attempt", "the attempt column (default attempt)", func(t *inbox.Table) *string { return &t.Attempt }},
	{"data", "the data columns, a comma list (default payload)", nil},
	{"lease-column", "the lease column: the lease form", func(t *inbox.Table) *string { return &t.LockedUntil }},
	{"advisory-key", "the advisory key column: the advisory form", func(t *inbox.Table) *string { return &t.AdvisoryKey }},
	{"not-before", "the not-before column", func(t *inbox.Table) *string { return &t.NotBefore }},
	{"dead-table", "the dead table", func(t *inbox.Table) *string { return &t.DeadTable }},
	{"dead-at", "the dead table's time of death column", func(t *inbox.Table) *string { return &t.DeadAt }},
	{"last-error", "the last error column", func(t *inbox.Table) *string { return &t.LastError }},
	{"priority", "the priority column", func(t *inbox.Table) *string { return &t.Priority }},
	{"enqueued-at", "the enqueued-at column", func(t *inbox.Table) *string { return &t.EnqueuedAt }},
	{"unique-key", "the unique key column", func(t *inbox.Table) *string { return &t.UniqueKey }},
	{"control-table", "the control table (pause)", func(t *inbox.Table) *string { return &t.ControlTable }},
}
