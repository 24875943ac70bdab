package inbox

import "github.com/sqlinbox/inbox/dialect"

// A Dialect turns a table description into the SQL of one engine:
// [Postgres], [MySQL] (MySQL 8, and MariaDB too), [MariaDB] and [SQLite]
// ship with the package. Another engine is added from outside by
// implementing the contract of package
// [github.com/sqlinbox/inbox/dialect], as examples/cockroach does for
// CockroachDB.
type Dialect = dialect.Dialect

// Statements is every statement a queue runs ([Queue.Statements]): tests
// that pin a queue's SQL read it there. See package dialect for each part.
type Statements = dialect.Statements

// Form is how a claimed job is held while its handler runs; the
// description chooses it ([Table.LockedUntil], [Table.AdvisoryKey]).
type Form = dialect.Form

const (
	// RowLock holds a job by the claim's transaction (FOR UPDATE SKIP LOCKED),
	// open until the settlement commits it. It is the default.
	RowLock = dialect.RowLock
	// Lease holds a job by an expiry written into its row.
	Lease = dialect.Lease
	// Advisory holds a job by a session lock on its key, on a pinned connection.
	Advisory = dialect.Advisory
)

// capability returns d's optional interface T (package dialect), or that
// of the dialect d wraps (Unwrap), and so on down.
func capability[T any](d Dialect) (T, bool) {
	for d != nil {
		if c, ok := d.(T); ok {
			return c, true
		}
		w, ok := d.(interface{ Unwrap() Dialect })
		if !ok {
			break
		}
		d = w.Unwrap()
	}
	var none T
	return none, false
}
