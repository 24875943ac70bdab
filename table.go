package inbox

import (
	"errors"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"strconv"
	"strings"
)

// withDefaults returns t with the reference schema's column names where t
// names none: the one place the defaults are applied.
func (t Table) withDefaults() Table {
	if t.ID == "" {
		t.ID = "id"
	}
	if t.Attempt == "" {
		t.Attempt = "attempt"
	}
	if t.Data == nil {
		t.Data = []string{"payload"}
	} else {
		// The queue is immutable: it keeps its own copy of the caller's slice.
		t.Data = append([]string{}, t.Data...)
	}
	return t
}

// describe validates t (defaults applied) and quotes its identifiers with d.
func describe(d Dialect, t Table) (dialect.Names, error) {
	n := dialect.Names{Raw: dialect.Table(t)}
	if t.Name == "" {
		return n, errors.New("inbox: new: Table.Name is empty")
	}
	switch {
	case t.LockedUntil != "" && t.AdvisoryKey != "":
		return n, fmt.Errorf("inbox: new: Table names both LockedUntil %q and AdvisoryKey %q: name one, it selects the form", t.LockedUntil, t.AdvisoryKey)
	case t.LockedUntil != "":
		n.Form = Lease
	case t.AdvisoryKey != "":
		n.Form = Advisory
	}
	n.Shallow = t.Shallow
	if err := quoteAll(&n, d, t); err != nil {
		return n, err
	}
	if err := checkOptions(&n, t); err != nil {
		return n, err
	}
	return n, checkDistinct(&n)
}

// quoteAll validates and quotes every identifier of t into n.
func quoteAll(n *dialect.Names, d Dialect, t Table) error {
	var err error
	if n.Table, n.Schema, n.TableName, err = quoteTable(d, "Table.Name", t.Name); err != nil {
		return err
	}
	for _, c := range []struct {
		field, name string
		into        *string
	}{{"ID", t.ID, &n.ID}, {"Attempt", t.Attempt, &n.Attempt}, {"LockedUntil", t.LockedUntil, &n.LockedUntil},
		{"AdvisoryKey", t.AdvisoryKey, &n.Key}, {"NotBefore", t.NotBefore, &n.NotBefore},
		{"LastError", t.LastError, &n.LastError}, {"Priority", t.Priority, &n.Priority}, {"EnqueuedAt", t.EnqueuedAt, &n.EnqueuedAt},
		{"UniqueKey", t.UniqueKey, &n.UniqueKey}} {
		if *c.into, err = quoteColumn(d, c.field, c.name); err != nil {
			return err
		}
	}
	for i, c := range t.Data {
		if c == "" {
			return fmt.Errorf("inbox: new: Table.Data[%d] is empty", i)
		}
		qc, err := quoteColumn(d, "Data["+strconv.Itoa(i)+"]", c)
		if err != nil {
			return err
		}
		n.Data = append(n.Data, qc)
	}
	if t.DeadTable != "" {
		if n.Dead, n.DeadSchema, n.DeadName, err = quoteTable(d, "Table.DeadTable", t.DeadTable); err != nil {
			return err
		}
	}
	if n.DeadAt, err = quoteColumn(d, "DeadAt", t.DeadAt); err != nil {
		return err
	}
	if t.ClaimsTable != "" {
		if n.ClaimsTable, n.ClaimsSchema, n.ClaimsName, err = quoteTable(d, "Table.ClaimsTable", t.ClaimsTable); err != nil {
			return err
		}
	}
	if t.ControlTable != "" {
		if n.ControlTable, n.ControlSchema, n.ControlName, err = quoteTable(d, "Table.ControlTable", t.ControlTable); err != nil {
			return err
		}
	}
	return nil
}

// quoteColumn validates and quotes the column name of field, empty when
// the field names none.
func quoteColumn(d Dialect, field, name string) (string, error) {
	if name == "" {
		return "", nil
	}
	if err := checkIdent(name); err != nil {
		return "", fmt.Errorf("inbox: new: Table.%s %q: %v", field, name, err)
	}
	q, err := d.QuoteIdent(name)
	if err != nil {
		return "", fmt.Errorf("inbox: new: Table.%s %q: %v", field, name, err)
	}
	return q, nil
}

// checkOptions refuses optional fields that do not fit together or the form.
func checkOptions(n *dialect.Names, t Table) error {
	switch {
	case n.Dead != "" && n.Dead == n.Table:
		return fmt.Errorf("inbox: new: Table.DeadTable %q is the queue table itself", t.DeadTable)
	case n.ClaimsTable != "" && (n.ClaimsTable == n.Table || n.ClaimsTable == n.Dead):
		return fmt.Errorf("inbox: new: Table.ClaimsTable %q must be a table of its own", t.ClaimsTable)
	case n.ControlTable != "" && (n.ControlTable == n.Table || n.ControlTable == n.Dead || n.ControlTable == n.ClaimsTable):
		return fmt.Errorf("inbox: new: Table.ControlTable %q must be a table of its own", t.ControlTable)
	case t.ClaimsTable != "" && n.Form != RowLock:
		return fmt.Errorf("inbox: new: Table.ClaimsTable %q is for the row-lock form; under the %s form a crash already spends an attempt", t.ClaimsTable, n.Form)
	case t.ClaimsTable != "" && t.MaxClaims <= 0:
		return fmt.Errorf("inbox: new: Table.MaxClaims %d must be positive with Table.ClaimsTable %q", t.MaxClaims, t.ClaimsTable)
	case t.ClaimsTable == "" && t.MaxClaims != 0:
		return fmt.Errorf("inbox: new: Table.MaxClaims %d needs Table.ClaimsTable", t.MaxClaims)
	case t.DeadAt != "" && t.DeadTable == "":
		return fmt.Errorf("inbox: new: Table.DeadAt %q is a column of the dead table: name Table.DeadTable too", t.DeadAt)
	case t.ClaimsTable != "" && t.DeadTable == "":
		return fmt.Errorf("inbox: new: Table.ClaimsTable %q needs Table.DeadTable, where a job past MaxClaims goes", t.ClaimsTable)
	case t.Shallow && n.Form != Lease:
		return fmt.Errorf("inbox: new: Table.Shallow is for the lease form (Table.LockedUntil); the %s form's claim reads the table in id order already", n.Form)
	case n.Form == Lease && t.NotBefore != "":
		return fmt.Errorf("inbox: new: Table.NotBefore %q: the lease form delays jobs with its lease column %q", t.NotBefore, t.LockedUntil)
	}
	return nil
}

// checkDistinct refuses two roles named by one column. Data columns may
// repeat the id (a job's id is data too); the advisory key may be the id.
func checkDistinct(n *dialect.Names) error {
	seen := map[string]string{}
	for _, c := range []struct{ field, v string }{{"ID", n.ID}, {"Attempt", n.Attempt}, {"LockedUntil", n.LockedUntil}, {"NotBefore", n.NotBefore},
		{"LastError", n.LastError}, {"Priority", n.Priority}, {"EnqueuedAt", n.EnqueuedAt}} {
		if c.v == "" {
			continue
		}
		if f, dup := seen[strings.ToLower(c.v)]; dup {
			return fmt.Errorf("inbox: new: Table.%s and Table.%s name the same column %s", f, c.field, c.v)
		}
		seen[strings.ToLower(c.v)] = c.field
	}
	if n.Key != "" && !strings.EqualFold(n.Key, n.ID) {
		if f, dup := seen[strings.ToLower(n.Key)]; dup {
			return fmt.Errorf("inbox: new: Table.AdvisoryKey and Table.%s name the same column %s", f, n.Key)
		}
	}
	for i, c := range n.Data {
		if f, dup := seen[strings.ToLower(c)]; dup && f != "ID" {
			return fmt.Errorf("inbox: new: Table.Data[%d] names the column of Table.%s, %s", i, f, c)
		}
	}
	return nil
}

// quoteTable validates and quotes a possibly schema-qualified table name.
func quoteTable(d Dialect, field, name string) (quoted, schema, table string, err error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return "", "", "", fmt.Errorf("inbox: new: %s %q: at most one dot, between schema and table", field, name)
	}
	var q []string
	for _, p := range parts {
		if err := checkIdent(p); err != nil {
			return "", "", "", fmt.Errorf("inbox: new: %s %q: %v", field, name, err)
		}
		qp, err := d.QuoteIdent(p)
		if err != nil {
			return "", "", "", fmt.Errorf("inbox: new: %s %q: %v", field, name, err)
		}
		q = append(q, qp)
	}
	if len(parts) == 2 {
		schema = parts[0]
	}
	return strings.Join(q, "."), schema, parts[len(parts)-1], nil
}

// maxIdent is the longest identifier every supported engine keeps whole
// (PostgreSQL truncates past 63 bytes).
const maxIdent = 63

// checkIdent enforces the package's identifier rule: an ASCII letter or
// underscore, then letters, digits or underscores, at most 63 bytes. The rule
// is narrower than what quoting could carry, so that every accepted name means
// the same table or column on every engine and in every tool.
func checkIdent(s string) error {
	if s == "" {
		return errors.New("empty identifier")
	}
	if len(s) > maxIdent {
		return fmt.Errorf("identifier longer than %d bytes", maxIdent)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		letter := c == '_' || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z')
		if !letter && (i == 0 || c < '0' || c > '9') {
			return fmt.Errorf("character %q at byte %d: identifiers are letters, digits and underscores, not starting with a digit", c, i)
		}
	}
	return nil
}
