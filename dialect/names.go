package dialect

import "strconv"

// Form is how a claimed job is held while its handler runs.
type Form int

const (
	// RowLock holds a job by the claim's transaction (FOR UPDATE SKIP LOCKED),
	// open until the settlement commits it. It is the default.
	RowLock Form = iota
	// Lease holds a job by an expiry written into its row.
	Lease
	// Advisory holds a job by a session lock on its key, on a pinned connection.
	Advisory
)

func (f Form) String() string {
	switch f {
	case RowLock:
		return "row lock"
	case Lease:
		return "lease"
	case Advisory:
		return "advisory lock"
	}
	return "form(" + strconv.Itoa(int(f)) + ")"
}

// Names is a table description after validation, as a [Dialect] receives it:
// every identifier already quoted by that dialect, the optional ones empty when
// the description leaves them out.
type Names struct {
	Form Form
	// Table is the quoted, possibly schema-qualified table name; Schema and
	// TableName are its unquoted parts (Schema empty when not qualified).
	Table, Schema, TableName string
	ID, Attempt              string
	// Data are the quoted data columns, in the order deliveries scan them.
	Data []string
	// LockedUntil is the lease column (Lease form), Key the advisory key column
	// (Advisory form).
	LockedUntil, Key string
	// Shallow is Table.Shallow: the lease claim reads free and expired
	// rows in one ordered read, needing no index on the lease column.
	Shallow bool
	// NotBefore is the optional not-before column.
	NotBefore string
	// LastError, Priority and EnqueuedAt are the optional columns of the
	// last error text, the priority (higher first) and the enqueue time.
	LastError, Priority, EnqueuedAt string
	// UniqueKey is the optional column of a job's unique key, which a
	// unique index covers alone; empty when none is named.
	UniqueKey string
	// Dead is the quoted dead-letter table, empty when none is named.
	Dead, DeadSchema, DeadName string
	// DeadAt is the dead table's quoted time of death column, empty when
	// none is named.
	DeadAt string
	// ClaimsTable is the quoted side table of the row-lock claims counter,
	// empty when none is named; its columns are ID and claims.
	ClaimsTable, ClaimsSchema, ClaimsName string
	// ControlTable is the quoted control table, holding whether the queue
	// is paused ([ControlStatements]), empty when none is named.
	ControlTable, ControlSchema, ControlName string
	// NotifyChannel is the channel Enqueue notifies (inbox's
	// Config.NotifyChannel), validated as an identifier; empty for none.
	NotifyChannel string
	// DBClock is true when the engine's clock decides: statements may read it
	// themselves. When false, they take [ArgNow] and [ArgUntil] instead.
	DBClock bool
	// Raw is the description as given, unquoted.
	Raw Table
}

// Table is the description as its user wrote it: inbox.Table, whose
// fields it has in the same order (inbox converts one into the other), for
// the errors and catalog queries that name the columns as written. See
// inbox.Table for each field.
type Table struct {
	Name, ID, Attempt               string
	Data                            []string
	LockedUntil                     string
	Shallow                         bool
	AdvisoryKey, NotBefore          string
	ClaimsTable                     string
	MaxClaims                       int
	DeadTable, DeadAt               string
	LastError, Priority, EnqueuedAt string
	UniqueKey                       string
	ControlTable                    string
}
