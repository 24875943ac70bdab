package dialect

// Arg names a value a statement takes, so that a dialect places its
// parameters in whatever order and style its SQL needs and the core fills them.
type Arg int

const (
	ArgID        Arg = iota + 1 // the job's id
	ArgAttempt                  // the attempt as stored in the row: the delivered one plus one
	ArgDelivered                // the attempt delivered to the handler
	ArgExpiry                   // the lease's expiry as stored: the ownership token's third part
	ArgNow                      // now, by the caller's clock or the one [Statements.Now] read
	ArgUntil                    // a new time computed from now: now+lease, now+retry delay
	ArgMicros                   // the lease or retry delay in microseconds, for a statement reading the engine's clock
	ArgLimit                    // the most rows a statement may claim
	ArgNotBefore                // a time the caller gave: Enqueue's not-before, ListDead's cursor, PurgeDead's cutoff; NULL for the zero time
	ArgError                    // the error text a Retry or Dead records (NULL for none: the row keeps its own)
	ArgPriority                 // a job's priority: Enqueue's, or the last candidate's for the next page
	ArgIDs                      // a batch's ids, one PostgreSQL array literal ("{1,2}"): a batch statement's per-row fence in three parameters
	ArgAttempts                 // a batch's stored attempts (ArgAttempt of each token), an array literal as ArgIDs
	ArgExpiries                 // a batch's expiries, an array literal as ArgIDs of timestamptz text in UTC to the microsecond
	ArgIdentity                 // the table's identity ([TableIdentifier]), which names its advisory locks
	ArgUniqueKey                // a job's unique key (Names.UniqueKey), NULL for none
	ArgQueue                    // the queue's key in the control table: the table's name without its schema (Names.TableName)
	ArgBy                       // who pauses a queue (inbox's Queue.Pause), NULL for no one named
	ArgData                     // ArgData+i is the value of the i-th data column (Enqueue)
)

// Stmt is one statement: its text and the values of its parameters, in
// order. A Stmt whose SQL is empty is one the dialect does not send: the
// field that holds it says what the core does instead.
type Stmt struct {
	SQL  string
	Args []Arg
	// Rows is true when the statement returns rows (RETURNING, SELECT).
	Rows bool
	// Clock is true when each row it returns ends with the engine's clock,
	// as Now returns it. A lease Claim.Select and Claim.SelectMore under
	// the engine's clock may: they then compare with that clock in place,
	// the claim reads no clock apart, and the ArgNow and ArgUntil of its
	// Claim.Mark come from the first reading that came with rows.
	Clock bool
	// Level is true when each row it returns ends, after the clock, with
	// whether the transaction runs at READ COMMITTED (1 or 0), as a claim
	// read of the lease or row lock may. When every claim read a form
	// sends has it, the core begins the claim's transaction at the
	// session's own level, sparing the round trip that sets one, and
	// claims again at READ COMMITTED when a row says 0, as every claim of
	// the queue then does.
	Level bool
}

// Takes reports whether s takes the parameter a.
func (s Stmt) Takes(a Arg) bool {
	for _, x := range s.Args {
		if x == a {
			return true
		}
	}
	return false
}
