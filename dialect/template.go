package dialect

import (
	"strconv"
	"strings"
)

// Builder writes one statement, recording its parameters in order.
type Builder struct {
	b    strings.Builder
	args []Arg
	mark func(n int) string
}

// NewBuilder returns a Builder whose n-th parameter is written as mark(n):
// [Dollar] or [Question].
func NewBuilder(mark func(n int) string) *Builder { return &Builder{mark: mark} }

// Write appends text.
func (s *Builder) Write(parts ...string) *Builder {
	for _, p := range parts {
		s.b.WriteString(p)
	}
	return s
}

// Param records a as the next parameter and returns its placeholder.
func (s *Builder) Param(a Arg) string {
	s.args = append(s.args, a)
	return s.mark(len(s.args))
}

// again returns the placeholder of a parameter already written, which
// only numbered placeholders can name twice; anything else is a mistake in
// the caller's templates (at is the template, for the panic).
func (s *Builder) again(a Arg, at string) string {
	for i := len(s.args) - 1; i >= 0; i-- {
		if s.args[i] == a && s.mark(i+1) != s.mark(i+2) {
			return s.mark(i + 1)
		}
	}
	panic("dialect: template parameter named again before it is written, or with unnumbered placeholders, in " + at)
}

// Stmt returns the statement written, returning rows or not.
func (s *Builder) Stmt(rows bool) Stmt {
	return Stmt{SQL: s.b.String(), Args: s.args, Rows: rows}
}

// Dollar is PostgreSQL's placeholder: $1, $2, …
func Dollar(n int) string { return "$" + strconv.Itoa(n) }

// Question is the placeholder of MySQL, MariaDB and SQLite: ? for every
// parameter.
func Question(int) string { return "?" }

// A Template writes the statements of one description for one engine
// from templates that read as the statements they become: {name} is a
// fragment (a quoted identifier of the description, or a piece of SQL that
// is itself a template) and $name a parameter, numbered in the order it
// appears ($^name: the number of the $name written before, with numbered
// placeholders only). Fragments: {table} {id} {attempt} {lease} {key}
// {notBefore} {dead} {claims} {control}; {data}, {, data} and {, j.data} the data
// columns (the latter two with a leading comma, empty when there are
// none); {now} and {until} the clock, the engine's or parameters;
// {where ready} and {and ready} the not-before condition, empty without the
// column. Optional columns: {lastError} {priority} {enqueuedAt} {deadAt};
// {, extra} and {, j.extra} what a claim returns after the data (last
// error, priority); {, priority} and {, lastError}; {order} and {pick} the
// claim order and the columns it needs; {, error} and {, set error} the
// error a Retry or Dead writes; {, deadAt} and {, deadAt now} the dead
// table's time column and what Dead writes in it; all empty or plain
// without the columns.
// The unique key: {unique} its column; {, set data} assigns each data
// column its value ($data0, $data1, …), with a leading comma.
// Parameters: $id $attempt $delivered $expiry $now $until $micros $limit
// $at $error $priority $ids $attempts $expiries $identity $unique $queue
// $by, and $data0, $data1, … the data columns' values.
//
// A template naming an unknown fragment or parameter is a mistake in the
// dialect, which every test of its statements meets: it panics.
type Template struct {
	mark  func(int) string
	frags map[string]string
}

var templateArgs = map[string]Arg{
	"id": ArgID, "attempt": ArgAttempt, "delivered": ArgDelivered, "expiry": ArgExpiry,
	"now": ArgNow, "until": ArgUntil, "micros": ArgMicros, "limit": ArgLimit,
	"error": ArgError, "priority": ArgPriority, "at": ArgNotBefore,
	"ids": ArgIDs, "attempts": ArgAttempts, "expiries": ArgExpiries, "identity": ArgIdentity,
	"unique": ArgUniqueKey, "queue": ArgQueue, "by": ArgBy,
}

// NewTemplate returns the templates of n, each parameter written by mark
// ([Dollar] or [Question]), with now and until the SQL of the clock
// (templates themselves: "$now" and "$until" for the caller's clock).
func NewTemplate(n *Names, mark func(int) string, now, until string) *Template {
	f := map[string]string{
		"table": n.Table, "id": n.ID, "attempt": n.Attempt, "lease": n.LockedUntil, "key": n.Key,
		"notBefore": n.NotBefore, "dead": n.Dead, "claims": n.ClaimsTable, "control": n.ControlTable,
		"lastError": n.LastError, "priority": n.Priority, "enqueuedAt": n.EnqueuedAt,
		"data": JoinColumns("", n.Data), ", data": "", ", j.data": "",
		"now": now, "until": until, "where ready": "", "and ready": "",
		// Optional columns: what a claim returns after the data, how it
		// orders, what a Retry or Dead writes of the error.
		", extra": "", ", j.extra": "", ", priority": "", ", lastError": "", ", error": "", ", set error": "",
		"order": "{id}", "pick": "{id}",
		// The dead table's time of death: the column and what Dead writes.
		"deadAt": n.DeadAt, ", deadAt": "", ", deadAt now": "",
		// The unique key column, and the data columns set from the job's
		// values ($data0, $data1, …).
		"unique": n.UniqueKey, ", set data": "",
	}
	for i, c := range n.Data {
		f[", set data"] += ", " + c + " = $data" + strconv.Itoa(i)
	}
	if n.DeadAt != "" {
		f[", deadAt"], f[", deadAt now"] = ", {deadAt}", ", {now}"
	}
	if len(n.Data) > 0 {
		f[", data"], f[", j.data"] = ", "+JoinColumns("", n.Data), ", "+JoinColumns("j.", n.Data)
	}
	if n.NotBefore != "" {
		f["where ready"] = " WHERE ({notBefore} IS NULL OR {notBefore} <= {now})"
		f["and ready"] = " AND ({notBefore} IS NULL OR {notBefore} <= {now})"
	}
	if n.LastError != "" {
		f[", extra"], f[", j.extra"] = ", {lastError}", ", j.{lastError}"
		f[", lastError"] = ", {lastError}"
		// A Retry or Dead without an error recorded keeps the row's.
		f[", error"] = ", COALESCE($error, {lastError})"
		f[", set error"] = ", {lastError} = COALESCE($error, {lastError})"
	}
	if n.Priority != "" {
		f[", extra"] += ", {priority}"
		f[", j.extra"] += ", j.{priority}"
		f[", priority"] = ", {priority}"
		f["order"], f["pick"] = "{priority} DESC, {id}", "{id}, {priority}"
	}
	return &Template{mark: mark, frags: f}
}

// Query is a statement returning rows; Exec one that does not.
func (t *Template) Query(tmpl string) Stmt { return t.stmt(tmpl, true) }
func (t *Template) Exec(tmpl string) Stmt  { return t.stmt(tmpl, false) }

// Fragment returns the fragment name as written in templates (a quoted
// identifier, or SQL), "" for an optional column not described. It panics
// for an unknown name, as a template naming it would.
func (t *Template) Fragment(name string) string {
	f, ok := t.frags[name]
	if !ok {
		panic("dialect: unknown template fragment " + name)
	}
	return f
}

func (t *Template) stmt(tmpl string, rows bool) Stmt {
	s := NewBuilder(t.mark)
	t.expand(s, tmpl)
	return s.Stmt(rows)
}

// expand writes tmpl into s.
func (t *Template) expand(s *Builder, tmpl string) {
	for i := 0; i < len(tmpl); {
		switch c := tmpl[i]; {
		case c == '{':
			end := strings.IndexByte(tmpl[i:], '}')
			frag, ok := "", false
			if end > 0 {
				frag, ok = t.frags[tmpl[i+1:i+end]]
			}
			if !ok {
				panic("dialect: unknown template fragment in " + tmpl[i:])
			}
			t.expand(s, frag)
			i += end + 1
		case c == '$':
			again := i+1 < len(tmpl) && tmpl[i+1] == '^'
			start := i + 1
			if again {
				start++
			}
			j := start
			for j < len(tmpl) && ('a' <= tmpl[j] && tmpl[j] <= 'z' || 'A' <= tmpl[j] && tmpl[j] <= 'Z') {
				j++
			}
			a, ok := templateArgs[tmpl[start:j]]
			if tmpl[start:j] == "data" {
				// $data0, $data1, …: the data columns' values.
				k := j
				for k < len(tmpl) && '0' <= tmpl[k] && tmpl[k] <= '9' {
					k++
				}
				n, err := strconv.Atoi(tmpl[j:k])
				a, ok, j = ArgData+Arg(n), err == nil, k
			}
			if !ok {
				panic("dialect: unknown template parameter in " + tmpl[i:])
			}
			if again {
				s.Write(s.again(a, tmpl[i:]))
			} else {
				s.Write(s.Param(a))
			}
			i = j
		default:
			s.b.WriteByte(c)
			i++
		}
	}
}

// JoinColumns joins the columns with ", ", each prefixed when prefix is
// not empty.
func JoinColumns(prefix string, cols []string) string {
	var b strings.Builder
	for i, c := range cols {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(prefix)
		b.WriteString(c)
	}
	return b.String()
}
