package periodic

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/sqlinbox/inbox"
)

// engine is what differs between the engines in the state table's SQL; the
// engines' values are in sql_postgres.go, sql_mysql.go and sql_sqlite.go.
// Times are passed and read with the queue's dialect (TimeArg, ScanTime), so
// the last tick is the engine's time type, as a lease column is: timestamptz,
// DATETIME(6) in UTC, or TEXT in inbox.SQLiteTimeFormat.
type engine struct {
	// mark is the n-th parameter's placeholder, from 1.
	mark func(n int) string
	// caseTime is how a time parameter reads where the engine cannot infer
	// its type from a column, as a result of CASE: a format of one %s.
	caseTime string
	// ignore ends an INSERT so that it skips a name already in the table
	// instead of failing.
	ignore string
	// ddl is the state table's definition, a format of one %s, the table.
	ddl string
}

// engines are the engines by dialect name (inbox.Dialect.Name).
var engines = map[string]*engine{
	"postgres": &postgresSQL,
	"mysql":    &mysqlSQL,
	"mariadb":  &mysqlSQL,
	"sqlite":   &sqliteSQL,
}

// engineOf returns the engine of d, or of the dialect d wraps (Unwrap), and
// so on down.
func engineOf(d inbox.Dialect) (*engine, error) {
	if d == nil {
		return nil, errors.New("the queue has no dialect")
	}
	for x := d; x != nil; {
		if e, ok := engines[x.Name()]; ok {
			return e, nil
		}
		w, ok := x.(interface{ Unwrap() inbox.Dialect })
		if !ok {
			break
		}
		x = w.Unwrap()
	}
	return nil, fmt.Errorf("dialect %q: periodic writes SQL for postgres, mysql, mariadb and sqlite, and dialects wrapping them (Unwrap)", d.Name())
}

// CreateTableSQL returns the CREATE TABLE IF NOT EXISTS statement of the state
// table named table (empty for [DefaultTable]) in dialect d: a name of at most
// [MaxNameLen] bytes, its primary key, and the last tick, of the time type a
// lease column has in d (timestamptz, DATETIME(6) in UTC, or TEXT in
// inbox.SQLiteTimeFormat). It returns an error for a dialect [New] would
// refuse and a bad table name.
func CreateTableSQL(d inbox.Dialect, table string) (string, error) {
	e, err := engineOf(d)
	if err != nil {
		return "", fmt.Errorf("periodic: %w", err)
	}
	t, err := quoteTable(d, table)
	if err != nil {
		return "", fmt.Errorf("periodic: %w", err)
	}
	return fmt.Sprintf(e.ddl, t), nil
}

// quoteTable validates and quotes a table name, optionally
// schema-qualified, by the rule of package inbox's identifiers: an ASCII
// letter or underscore, then letters, digits or underscores, at most 63
// bytes, so that a name means one table on every engine.
func quoteTable(d inbox.Dialect, name string) (string, error) {
	if name == "" {
		name = DefaultTable
	}
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return "", fmt.Errorf("table %q: at most one dot, between schema and table", name)
	}
	for i, p := range parts {
		if err := checkIdent(p); err != nil {
			return "", fmt.Errorf("table %q: %v", name, err)
		}
		q, err := d.QuoteIdent(p)
		if err != nil {
			return "", fmt.Errorf("table %q: %v", name, err)
		}
		parts[i] = q
	}
	return strings.Join(parts, "."), nil
}

// checkIdent is package inbox's identifier rule.
func checkIdent(s string) error {
	if s == "" {
		return errors.New("empty identifier")
	}
	if len(s) > 63 {
		return errors.New("identifier longer than 63 bytes")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		letter := c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
		if !letter && (i == 0 || c < '0' || c > '9') {
			return fmt.Errorf("character %q at byte %d: identifiers are letters, digits and underscores, not starting with a digit", c, i)
		}
	}
	return nil
}

// maxBatch is the most entries one statement names: 5,000 parameters in an
// UPDATE, under every engine's limit (SQLite's is 32,766), so that a
// scheduler of a thousand entries reads and advances them in one statement
// each.
const maxBatch = 1000

// statements writes the state table's statements for a number of entries,
// each shape once: a scheduler sends a few sizes over and over.
type statements struct {
	e     *engine
	table string // quoted

	mu    sync.Mutex
	cache map[[2]int]string // by kind and number of entries
}

const (
	kindRead = iota
	kindRegister
	kindAdvance
)

func newStatements(d inbox.Dialect, table string) (*statements, error) {
	e, err := engineOf(d)
	if err != nil {
		return nil, err
	}
	t, err := quoteTable(d, table)
	if err != nil {
		return nil, err
	}
	return &statements{e: e, table: t, cache: map[[2]int]string{}}, nil
}

func (s *statements) get(kind, n int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	q, ok := s.cache[[2]int{kind, n}]
	if !ok {
		q = s.write(kind, n)
		s.cache[[2]int{kind, n}] = q
	}
	return q
}

// read reads the last ticks of n entries: the one statement of a wake-up
// that finds every due tick done by another process. Its arguments are the
// names.
func (s *statements) read(n int) string { return s.get(kindRead, n) }

// register inserts n entries unless there, each with its registration time
// as its last tick: the first process to register an entry decides. Its
// arguments are each entry's name and time.
func (s *statements) register(n int) string { return s.get(kindRegister, n) }

// advance is the compare-and-set that wins ticks: each of n entries moves
// from the last tick the process read to its new last tick, if still at
// the former. Rows affected tells how many moved. A row another process
// moved first fails the comparison: on PostgreSQL, once that process has
// committed, READ COMMITTED evaluates the WHERE again on the row it wrote;
// InnoDB's UPDATE reads the latest committed row under its lock whatever
// the isolation; SQLite runs one writer at a time. One entry is the common
// case and has the plain shape: its arguments are the new time, the name and
// the old time. More move in one statement whose conditions are flat, an IN
// list and a CASE, where an OR per entry would nest a thousand deep (SQLite
// refuses an expression deeper than 1,000); its arguments are each entry's
// name and new time, the names, then each entry's name and old time.
func (s *statements) advance(n int) string { return s.get(kindAdvance, n) }

func (s *statements) write(kind, n int) string {
	var b strings.Builder
	m := s.e.mark
	switch kind {
	case kindRead:
		fmt.Fprintf(&b, "SELECT name, last_tick FROM %s WHERE name IN (", s.table)
		for i := 1; i <= n; i++ {
			if i > 1 {
				b.WriteString(", ")
			}
			b.WriteString(m(i))
		}
		b.WriteString(")")
	case kindRegister:
		fmt.Fprintf(&b, "INSERT INTO %s (name, last_tick) VALUES ", s.table)
		for i := 0; i < n; i++ {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "(%s, %s)", m(2*i+1), m(2*i+2))
		}
		b.WriteString(s.e.ignore)
	case kindAdvance:
		if n == 1 {
			fmt.Fprintf(&b, "UPDATE %s SET last_tick = %s WHERE name = %s AND last_tick = %s", s.table, m(1), m(2), m(3))
			break
		}
		fmt.Fprintf(&b, "UPDATE %s SET last_tick = CASE name", s.table)
		for i := 0; i < n; i++ {
			fmt.Fprintf(&b, " WHEN %s THEN "+s.e.caseTime, m(2*i+1), m(2*i+2))
		}
		b.WriteString(" END WHERE name IN (")
		for i := 0; i < n; i++ {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(m(2*n + i + 1))
		}
		b.WriteString(") AND last_tick = CASE name")
		for i := 0; i < n; i++ {
			fmt.Fprintf(&b, " WHEN %s THEN "+s.e.caseTime, m(3*n+2*i+1), m(3*n+2*i+2))
		}
		b.WriteString(" END")
	}
	return b.String()
}
