package inbox

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
)

// colKind is what a column of the description must hold.
type colKind int

const (
	kindID     colKind = iota // integer or text
	kindInt                   // integer
	kindTime                  // the engine's time representation
	kindAny                   // data: whatever the caller stores
	kindString                // text
)

var kindText = map[colKind]string{kindID: "an integer or text type", kindInt: "an integer type", kindAny: "any type", kindString: "a text type"}

type colWant struct {
	field, name string
	kind        colKind
}

// tableRole is which of a description's tables a check reads.
type tableRole int

const (
	queueTable tableRole = iota
	deadTable
	claimsTable
)

// checkedTable is one table a schema check reads: schema (empty when not
// qualified), name, and its role.
type checkedTable struct {
	schema, name string
	role         tableRole
}

// checkedTables lists the tables the description names.
func checkedTables(n *Names) []checkedTable {
	ts := []checkedTable{{n.Schema, n.TableName, queueTable}}
	if n.Dead != "" {
		ts = append(ts, checkedTable{n.DeadSchema, n.DeadName, deadTable})
	}
	if n.ClaimsTable != "" {
		ts = append(ts, checkedTable{n.ClaimsSchema, n.ClaimsName, claimsTable})
	}
	return ts
}

// wantedColumns lists the columns the description names, unquoted; for the
// dead table, the ones a move copies; for the claims table, id and claims.
func wantedColumns(n *Names, role tableRole) []colWant {
	r := n.Raw
	if role == claimsTable {
		return []colWant{{"ID", r.ID, kindID}, {"ClaimsTable", "claims", kindInt}}
	}
	w := []colWant{{"ID", r.ID, kindID}, {"Attempt", r.Attempt, kindInt}}
	for i, c := range r.Data {
		w = append(w, colWant{"Data[" + strconv.Itoa(i) + "]", c, kindAny})
	}
	if r.LastError != "" {
		w = append(w, colWant{"LastError", r.LastError, kindString})
	}
	if role == deadTable {
		return w
	}
	if r.Priority != "" {
		w = append(w, colWant{"Priority", r.Priority, kindInt})
	}
	if r.EnqueuedAt != "" {
		w = append(w, colWant{"EnqueuedAt", r.EnqueuedAt, kindTime})
	}
	if r.LockedUntil != "" {
		w = append(w, colWant{"LockedUntil", r.LockedUntil, kindTime})
	}
	if r.AdvisoryKey != "" && r.AdvisoryKey != r.ID {
		w = append(w, colWant{"AdvisoryKey", r.AdvisoryKey, kindID})
	}
	if r.NotBefore != "" {
		w = append(w, colWant{"NotBefore", r.NotBefore, kindTime})
	}
	return w
}

// readColumns runs a query returning (name, type) rows, keyed by name.
func readColumns(ctx context.Context, db *sql.DB, query string, args ...any) (map[string]string, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	cols := map[string]string{}
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			return nil, err
		}
		cols[name] = typ
	}
	return cols, rows.Err()
}

// compareColumns reports the wanted columns that are missing or of a type
// fits refuses.
// exactNames is true for engines whose quoted names are case-sensitive
// (PostgreSQL); MySQL and SQLite column names are not.
func compareColumns(schema, table string, cols map[string]string, want []colWant, fits func(colKind, string) bool, timeType string, exactNames bool) []string {
	name := table
	if schema != "" {
		name = schema + "." + table
	}
	if len(cols) == 0 {
		return []string{fmt.Sprintf("table %s does not exist", name)}
	}
	var problems []string
	for _, w := range want {
		typ, ok := cols[w.name]
		if !ok && !exactNames {
			for c, t := range cols {
				if strings.EqualFold(c, w.name) {
					typ, ok = t, true
				}
			}
		}
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("table %s has no column %s (Table.%s)", name, w.name, w.field))
		case !fits(w.kind, typ):
			wantText := kindText[w.kind]
			if w.kind == kindTime {
				wantText = timeType
			}
			problems = append(problems, fmt.Sprintf("column %s.%s (Table.%s) is %s, want %s", name, w.name, w.field, typ, wantText))
		}
	}
	return problems
}

// versionBelow reports whether a version string ("10.11.19-MariaDB",
// "8.0.36", "3.46.1") is below major.minor.
func versionBelow(v string, major, minor int) bool {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return true
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(strings.TrimFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	if err1 != nil || err2 != nil {
		return true
	}
	return ma < major || (ma == major && mi < minor)
}

// checkTables compares the queue table and the dead table with the
// description, reading each table's columns with query (schema, table).
func checkTables(ctx context.Context, db *sql.DB, n *Names, query string, fits func(colKind, string) bool, timeType string, exactNames bool) ([]string, error) {
	var problems []string
	for _, tb := range checkedTables(n) {
		cols, err := readColumns(ctx, db, query, tb.schema, tb.name)
		if err != nil {
			return nil, err
		}
		problems = append(problems, compareColumns(tb.schema, tb.name, cols, wantedColumns(n, tb.role), fits, timeType, exactNames)...)
	}
	return problems, nil
}

// SchemaError lists every problem a schema check found.
type SchemaError struct {
	Table    string
	Problems []string
}

func (e *SchemaError) Error() string {
	return fmt.Sprintf("inbox: schema of %s: %s", e.Table, strings.Join(e.Problems, "; "))
}

// CheckSchema verifies the table against the description: the table and
// every column exist with fitting types, the dead table too, and the server
// supports the form. It reports every problem at once in a [*SchemaError].
// It changes nothing.
func (q *Queue) CheckSchema(ctx context.Context) error {
	c, ok := capability[SchemaChecker](q.dialect)
	if !ok {
		return fmt.Errorf("inbox: check schema: dialect %s has no schema check", q.dialect.Name())
	}
	problems, err := c.CheckSchema(ctx, q.db, &q.names)
	if err != nil {
		return opErr("check schema", err)
	}
	if len(problems) > 0 {
		return &SchemaError{Table: q.names.Raw.Name, Problems: problems}
	}
	return nil
}

// claimsKeyProblem says that the claims table's id is not a key of its own.
func claimsKeyProblem(n *Names) string {
	return fmt.Sprintf("table %s: column %s is not its primary key (nor alone in a unique index), which the claims count's upsert needs",
		n.Raw.ClaimsTable, n.Raw.ID)
}
