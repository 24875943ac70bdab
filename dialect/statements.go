package dialect

// Statements is every statement one queue runs, in parts: how a claim
// takes jobs, how a delivery is held and settled, what the row lock and
// the advisory form add, the job statements and the dead jobs. Which
// fields are set depends on the form and the engine; each field says what
// it must return, and what leaving it empty means.
type Statements struct {
	// Now returns the engine's clock (one row, one column). Set by engines
	// whose UPDATE cannot return the times it writes (MySQL): their
	// statements then take ArgNow and ArgUntil, which the core computes
	// from this reading. Empty: the engine's statements read its clock, or
	// the caller's clock decides.
	Now Stmt

	Claim    ClaimStatements
	Settle   SettleStatements
	RowLock  RowLockStatements
	Advisory AdvisoryStatements
	Jobs     JobStatements
	Unique   UniqueStatements
	Dead     DeadStatements
	Browse   BrowseStatements
	Control  ControlStatements
}

// ClaimStatements take jobs, in one of three ways an engine chooses: one
// statement (Take, with TakeOne and TakeBounded), a read then a mark
// (Select, SelectMore, Mark, Marked), or a pick then a lock (Pick…,
// PickLock, then Mark under the lease).
type ClaimStatements struct {
	// Take claims in one statement. Rows: id, delivered attempt, then
	// (lease form) the stored expiry, then the data columns. Lease: up to
	// ArgLimit rows, outside any transaction. Row lock: one row, inside the
	// held transaction. Advisory: the row ArgID, after its lock was taken,
	// if it still has the attempt ArgDelivered and is claimable. Empty: the
	// claim is Select then Mark, or Pick then PickLock.
	Take Stmt
	// TakeOne (lease, optional) is Take for a claim of one job, with the
	// same arguments and rows, where the engine runs a statement that
	// names one row faster than one that names a set: SQLite updates
	// "id = (SELECT …)" in one pass, and "id IN (SELECT …)" through a
	// temporary table (a claim of one cost 4 to 6 times as much).
	TakeOne Stmt
	// TakeBounded (lease, optional) is Take for claims of at most 1, 2,
	// 4, …, 512 and inbox.MaxClaim jobs, in that order, each with Take's
	// arguments and rows: a claim sends the first whose bound is at or
	// above its limit ([ClaimStatements.For]). An engine that plans a
	// prepared statement once only when the plan expects few rows
	// (PostgreSQL) learns the bound from the text, which a parameter
	// cannot tell it.
	TakeBounded []Stmt
	// Select and Mark claim in two statements, for engines without
	// UPDATE … RETURNING; set instead of Take. Select returns id, delivered
	// attempt and the data columns, locking the rows in the transaction
	// (lease, row lock); Mark counts the attempt of the row ArgID (and,
	// lease form, writes ArgUntil as its expiry). A lease Mark may take
	// ArgID (and ArgDelivered) several times: it then marks that many rows
	// at once, the core filling the places in order and repeating the last
	// row when fewer rows were claimed. It should mark a row only if the
	// row still has the attempt ArgDelivered and is still claimable at
	// ArgNow, so that a lock the engine does not hold cluster-wide (a
	// Galera node's) cannot hand one job to two claims.
	Select, Mark Stmt
	// MarkOne (lease, optional) is Mark for a claim of one job, naming
	// ArgID and ArgDelivered once, with Mark's other arguments and checks:
	// an engine finds one row by equality faster than it matches a list
	// (on MariaDB a list of 16 repeated places cost 20 to 40 µs more a
	// claim, and a list of one pair is planned as a full scan).
	MarkOne Stmt
	// Marked (lease, with Mark) returns the ids, among its ArgIDs, of the
	// rows carrying ArgUntil. When a lease Mark changed fewer rows than it
	// named, the claim delivers those rows alone; empty, such a claim
	// rolls back and returns an error.
	Marked Stmt
	// SelectMore (lease, optional) reads more rows, as Select does, for
	// the places Select left: ArgLimit is the number left.
	SelectMore Stmt
	// SelectMoreOne (lease, optional) is SelectMore for a claim of one
	// job, with the same arguments and rows, where the engine finds one
	// row faster by another path than it finds several.
	SelectMoreOne Stmt
	// SelectFree and SelectFreeOne (lease, optional) read free rows, as
	// SelectMore and SelectMoreOne do, with ArgLimit the claim's max, and
	// none while any row's lease has run out (the claim order puts those
	// first). A claim sends the one for its size first; when it returns
	// rows they are the claim, and Select and SelectMore are not sent.
	SelectFree, SelectFreeOne Stmt

	// Pick, PickAfter and PickLock claim in two steps, for an engine whose
	// locking read keeps the lock of every row it read before a sort,
	// returned or not (InnoDB): a claim must lock only the rows it returns.
	// Pick returns the id (and, with Table.Priority, the priority) of up to
	// ArgLimit claimable rows in claim order, without locking them;
	// PickAfter the same past the row ArgID (and ArgPriority) in claim
	// order, for the next page. PickMore and PickMoreAfter (lease, optional)
	// read a second set of claimable rows the same way (free rows, where
	// Pick reads the expired ones); the core merges the two in claim order.
	// PickLock locks, among its ArgIDs, up to ArgLimit rows still claimable,
	// in id order, skipping rows others hold, and returns them as Select
	// does; the core fills its ArgIDs with candidates of one priority, in
	// claim order, repeating the last, so that id order is claim order.
	// Set, they replace Take (row lock) or Select and SelectMore (lease); a
	// lease claim marks the rows with Mark.
	Pick, PickAfter, PickMore, PickMoreAfter, PickLock Stmt
	// PickFirst (row lock, optional) is Pick and PickLock in one
	// statement: it reads the first page of ArgLimit candidates in claim
	// order without locks, then locks them by primary key in that order,
	// skipping rows others hold, and returns the first it locked (one row,
	// as PickLock returns it), having locked no other. No row: the page
	// held none free, and the claim picks as it would without PickFirst.
	PickFirst Stmt
	// WalkFirst (row lock and lease, optional) claims one row without a
	// page: a locking read along the primary key in claim order, skipping
	// rows others hold, that returns the first claimable row. It gives up
	// after a bound of rows it read and could not claim (not yet ready,
	// under a lease in force): then it returns no row, and may leave the
	// last of them locked. The row lock's claim then rolls back and claims
	// without it (PickFirst, then the pick) for a span of claims; a lease
	// claim of one goes on in its transaction with SelectFreeOne, which it
	// otherwise stands for, and leaves it out for a span of claims.
	WalkFirst Stmt
	// WalkTake (lease, optional) is a claim of one job in one statement
	// where the engine runs a transaction inside a statement (MariaDB's
	// compound statement): it begins, walks as WalkFirst does, marks the
	// row it found as Mark would, commits, and returns the row as Take
	// does (id, delivered attempt, the expiry written, the data columns),
	// or no row when it claimed none (the walk's bound, a lease run out,
	// an empty queue, a mark that changed nothing). Any error rolls back.
	// The claim then goes on as without it, in a transaction from the
	// client, leaving WalkFirst out; when that finds a job twice running,
	// the claims of one leave WalkTake out for a span. As the statement
	// commits at the server, a claim cut by its context may still lease
	// the job it found; the core sends it only when the claim's context
	// has no deadline within a second.
	WalkTake Stmt
}

// For returns the statement a lease claim of max jobs (1 to
// inbox.MaxClaim) sends: the first of TakeBounded whose bound is at or
// above max, else TakeOne for one job, else Take (empty where the claim is
// Select then Mark). Tests that expect a claim's SQL take it from here.
func (c *ClaimStatements) For(max int) Stmt {
	if len(c.TakeBounded) > 0 {
		i, bound := 0, 1
		for bound < max && i < len(c.TakeBounded)-1 {
			i, bound = i+1, bound*2
		}
		return c.TakeBounded[i]
	}
	if max == 1 && c.TakeOne.SQL != "" {
		return c.TakeOne
	}
	return c.Take
}

// ClaimBounds is the number of statements TakeBounded holds when set: one
// per bound 1, 2, 4, …, 512, then one for inbox.MaxClaim.
const ClaimBounds = 11

// SettleStatements hold a delivery and settle it: each is a compare-and-set
// on the delivery's token (lease: id, attempt and expiry; advisory: id and
// attempt; row lock: the id, the held transaction being the fence).
type SettleStatements struct {
	// Extend (lease form) moves the expiry of the token's row. With Rows it
	// returns the new expiry; otherwise it wrote ArgUntil.
	Extend Stmt
	// Ack deletes; Retry delays (lease form: always, the expiry; other
	// forms: the not-before column, only for a delay, empty when there is
	// none); Release gives the attempt back (lease: clears the expiry too;
	// row lock: empty, it rolls back).
	Ack, Retry, Release Stmt
	// Dead copies the row into the dead table with ArgDelivered as its
	// attempt; DeadDelete, when set, deletes it after in the same
	// transaction. An engine that does both in one statement leaves
	// DeadDelete empty.
	Dead, DeadDelete Stmt
	// Exists counts the rows matching a token (lease: id, attempt, expiry;
	// advisory: id and attempt). Set by engines that report only changed
	// rows as affected (MySQL): an extension or a Retry writing the value a
	// row already holds is confirmed with it instead of read as a lost
	// lease. Empty: an affected count of 0 is a lost token.
	Exists Stmt
	// Verdict (lease and advisory forms) reads the row ArgID as it stands:
	// its stored attempt and (lease form) its expiry; no row when it is
	// gone. A plain read, which must not wait for a transaction still open
	// on the row: the package sends it once no statement of a settlement
	// can still be running, so that a settlement whose outcome is unknown
	// (its context ended, its connection broke mid-statement), or one in
	// the caller's transaction not yet known to have committed, learns what
	// the database holds. Empty: such a settlement returns
	// inbox.ErrOutcomeUnknown.
	Verdict Stmt
}

// RowLockStatements are what the row lock adds: the undo of a failed
// attempt, a cancel that does not wait, and the claims counter.
type RowLockStatements struct {
	// Savepoint marks the held transaction when the handler first asks
	// for it (inbox's Delivery.Tx), before it can write;
	// RollbackToSavepoint undoes what the handler wrote, before a Retry or
	// Dead records the attempt. Relock locks the row ArgID if it still has
	// the attempt ArgDelivered, waiting a bounded time for another
	// transaction holding it, and returns its id: a Retry or Dead whose
	// held transaction cannot be restored (a deadlock rolled it back, its
	// session was cut) runs in a new transaction that begins with it.
	// inbox.New refuses a row-lock dialect without the three.
	Savepoint, RollbackToSavepoint, Relock Stmt
	// CancelLock locks the row ArgID without waiting, returning its id
	// when no claim holds it (inbox's Queue.Cancel). Empty: Cancel refuses
	// under the row lock.
	CancelLock Stmt
	// The claims counter (Table.ClaimsTable). ClaimsCount adds one
	// delivery of the row ArgID to the side table, sent outside the held
	// transaction once it holds the row; with Rows it returns the count,
	// otherwise ClaimsRead does. ClaimsGiveBack subtracts one (Release),
	// outside the held transaction before it rolls back. ClaimsClear
	// removes the row's count inside the held transaction (Ack, Retry,
	// Dead). Empty: no counter is kept.
	ClaimsCount, ClaimsRead, ClaimsGiveBack, ClaimsClear Stmt
}

// AdvisoryStatements find the advisory form's candidates; the claim of
// one is ClaimStatements.Take, once its key's lock is taken.
type AdvisoryStatements struct {
	// Candidates returns id, key and attempt of up to ArgLimit claimable
	// rows in id order, without locking them; CandidatesAfter the same
	// past the id ArgID, for the next page.
	Candidates, CandidatesAfter Stmt
	// LockFirst and LockFirstAfter (engines whose lock function SQL can
	// call) read the candidates of Candidates and CandidatesAfter and try
	// each key's session lock in claim order, stopping at the first taken.
	// They return at most one row: the columns of Candidates and a
	// boolean, true for the candidate whose lock the session on which they
	// ran now holds; false for the page's last candidate, when no key was
	// free in a full page (no lock taken: the next page starts past it).
	// No row: no key free and the page short. The key is locked as
	// [Locker] locks it (ArgIdentity names the table), so that
	// [Locker.Unlock] lets it go. Empty: a lock call from Go per
	// candidate.
	LockFirst, LockFirstAfter Stmt
	// LockFirstContended sends LockFirst only for a while after a walk
	// from Go found a key held by another session (another process's); the
	// walk serves the claims otherwise. For an engine where the statement
	// costs the server more than a page read and a lock call: in one
	// process the walk passes the process's own keys over without a call,
	// and LockFirst pays off only once other processes hold keys ahead.
	LockFirstContended bool
}

// JobStatements insert, find, cancel and count jobs.
type JobStatements struct {
	// Enqueue inserts a job; the variants take an explicit id and/or a
	// not-before time. With Rows they return the id; otherwise the core
	// uses the given id or LastInsertId. EnqueueAt and EnqueueIDAt are
	// empty without a not-before column (a delayed job is refused).
	Enqueue, EnqueueID, EnqueueAt, EnqueueIDAt Stmt
	// Probe (optional) returns a row when a claim may find a job: one ready
	// by time, whether or not a claim holds it. It must return one whenever
	// the claim would deliver a job. An idle loop sends it (Queue.Probe)
	// when its fallback interval runs out and claims only when it returns a
	// row, so that an idle process costs one statement per interval where
	// the claim is a transaction of several (MySQL's lease, every row
	// lock). Empty: the loop claims.
	Probe Stmt
	// Cancel deletes the job ArgID that waits (inbox's Queue.Cancel;
	// lease: under any lease, the holder learns by its keeper). Exists
	// returns a row when job ArgID exists at all, to tell a job in work
	// from a missing one. Empty Cancel: Cancel refuses.
	Cancel, Exists Stmt
	// RunNow (inbox's Queue.RunNow) makes the job ArgID claimable now if it
	// waits: lease form, its lease ends beyond ArgUntil (a retry delay, not
	// a holder's lease), and the lease is cleared; other forms, its
	// not-before time is after the clock's now, and it is cleared. One row
	// affected: it ran early. Under the row lock the core sends
	// RowLock.CancelLock first, in the same transaction, so that a row a
	// claim holds is refused rather than waited for. Empty: no job of the
	// table can wait, and RunNow refuses.
	RunNow Stmt
	// Stats (inbox's Queue.Stats) returns one row: jobs ready by time
	// (claimable now, held ones included where the engine cannot tell them
	// apart), waiting for a later time, in work (-1 where the engine cannot
	// tell), in the dead table (-1 without one), and the age in
	// microseconds of the oldest ready job (NULL without Table.EnqueuedAt
	// or a ready job). A lease in force counts as in work when it ends
	// within a lease, as waiting beyond.
	Stats Stmt
	// InWork (optional) returns one count: the jobs held, read from the
	// server's lock tables where Stats returns -1 for them and the server
	// can tell only through a view that may be missing or not granted (a
	// plugin, performance_schema). Queue.Stats sends it after Stats; its
	// error leaves InWork at -1 and is reported in Stats.InWorkErr.
	InWork Stmt
}

// UniqueStatements serve the unique key (Names.UniqueKey), set when the
// description names one. The Enqueue statements then write the key
// (ArgUniqueKey) and, where the engine can say so, insert nothing when
// another row holds it (PostgreSQL's and SQLite's ON CONFLICT DO NOTHING:
// no row returned); elsewhere the insert fails on the unique index and
// the core finds the job that holds the key.
type UniqueStatements struct {
	// Find returns the id and the stored attempt (then, advisory form,
	// the key column) of the job holding ArgUniqueKey: a plain read,
	// waiting for no lock.
	Find Stmt
	// Replace writes the job's data ($data0, …) and not-before time
	// (ArgNotBefore, NULL for none; the lease form's is its lease
	// column) into the job ArgID, if it is not in work: lease, its
	// attempt is the first or its lease is not in force (a lapsed holder
	// is fenced by the new expiry); row lock, no transaction holds its
	// row (locked without waiting, in the statement or by ReplaceLock
	// before it in the same transaction); advisory, its stored attempt is
	// still ArgAttempt, once the core has taken its key's lock. One row
	// affected: replaced.
	Replace Stmt
	// ReplaceLock (optional) locks the row ArgID if Replace may replace
	// it (the same condition; row lock: without waiting) and returns its
	// id, for an engine whose UPDATE counts only changed rows as affected
	// or cannot lock its own table in a subquery (MySQL). The core sends
	// it, then Replace by id alone, in one transaction, and a row from it
	// means replaced.
	ReplaceLock Stmt
}

// DeadStatements list, requeue and purge dead jobs (inbox's
// Queue.ListDead, RequeueDead, PurgeDead), set when the description names
// a dead table.
type DeadStatements struct {
	// List returns id, attempt, the data columns, then LastError and DeadAt
	// where named, of up to ArgLimit dead jobs, the most recent death first
	// (DeadAt descending, then id descending; id descending without
	// DeadAt), those whose DeadAt is NULL (dead before the column was
	// added) last, by id descending; ListAfter the same past the job ArgID
	// (and ArgNotBefore, its DeadAt) in that order. ListAfterNull (with
	// DeadAt) is the page after a job whose DeadAt is NULL: the dead jobs
	// with a NULL DeadAt and an id below ArgID, by id descending;
	// ListDead sends it for an after with a zero DeadAt, and refuses such
	// an after when it is empty. Each of the three may name ArgLimit more
	// than once.
	List, ListAfter, ListAfterNull Stmt
	// Take returns the data columns and LastError of the dead job ArgID
	// and, with TakeDelete empty, deletes it (DELETE … RETURNING); where
	// the engine cannot return deleted rows it locks the row, and
	// TakeDelete deletes it in the same transaction.
	Take, TakeDelete Stmt
	// Purge deletes every dead job, PurgeBefore those whose DeadAt is
	// before ArgNotBefore.
	Purge, PurgeBefore Stmt
	// RequeueError writes ArgError into the LastError of the job ArgID,
	// for a requeued job that keeps its text. Has returns a row when the
	// dead table holds the job ArgID: an Enqueue given that id is refused
	// (inbox.ErrDeadID). Empty Has: no such check.
	RequeueError, Has Stmt
	// Delete deletes the dead job ArgID (inbox's Queue.DeleteDead); no row
	// affected means none had it.
	Delete Stmt
	// Count returns the number of dead jobs; CountOlder (with DeadAt) of
	// those whose DeadAt is before ArgNotBefore. Batch returns the ids of
	// up to ArgLimit dead jobs in id order; BatchAfter those past ArgID;
	// BatchOlder and BatchOlderAfter the same among those whose DeadAt is
	// before ArgNotBefore (inbox's Queue.CountDead and RequeueDeadAll).
	Count, CountOlder, Batch, BatchAfter, BatchOlder, BatchOlderAfter Stmt
}

// BrowseStatements show the queue table's jobs to an operator (inbox's
// Queue.ListJobs and Queue.Job), each page a seek of the primary key:
// never an OFFSET, so a page costs the same at any depth. Their rows are
// the id, the stored attempt, the state as the row tells it (1 ready, 2
// waiting, 3 in work), the row's time (the lease column under the lease
// form, else the not-before column; NULL without one), the data columns,
// then LastError, Priority and EnqueuedAt where named. Under the lease a
// lease in force is in work when it ends within a lease (ArgUntil), and
// waiting beyond, as Stats counts them; under the row lock and advisory
// forms a row ready by its time is ready, held or not.
type BrowseStatements struct {
	// All, Ready, Waiting and InWork list the jobs of one state (All: any).
	// An empty Waiting: no job can wait (no not-before column), the list
	// is empty. An empty InWork: the row cannot tell (row lock, advisory),
	// and the listing is refused.
	All, Ready, Waiting, InWork BrowseList
	// Job returns the job ArgID's row, in the lists' columns; no row when
	// the table has none.
	Job Stmt
	// Dead (with a dead table) returns the dead job ArgID's row, in the
	// columns of Dead.List; no row when the dead table has none.
	Dead Stmt
}

// BrowseList pages through the jobs of one state by id.
type BrowseList struct {
	// First returns up to ArgLimit jobs, the highest ids first; After the
	// same below the id ArgID; Before up to ArgLimit jobs above the id
	// ArgID, the lowest first (the core reverses them).
	First, After, Before Stmt
}

// BatchStatements settle Size lease tokens (id, stored attempt, expiry) at
// once, each a compare-and-set on its own token as the single-job
// settlements are. A statement takes each token's ArgID, ArgAttempt and
// ArgExpiry in turn: the n-th of each is the n-th token's, and the last
// token fills the places past the batch, so a statement's size need not
// match the batch's exactly. Or it takes the whole batch as ArgIDs,
// ArgAttempts and ArgExpiries, each once or more, whatever its size.
type BatchStatements struct {
	Size int
	// Ack deletes the rows; Release clears their leases and gives their
	// attempts back; Retry sets their expiry to ArgUntil, or to the engine's
	// clock plus ArgMicros.
	// Each returns the ids of the rows it settled (Rows) or, where the
	// engine cannot, relies on Lock.
	Ack, Release, Retry Stmt
	// Lock returns the ids of the rows still carrying their tokens and locks
	// them until the transaction ends. Engines whose statements cannot
	// return the rows they changed (MySQL; MariaDB's Release and Retry) set
	// it: when a statement affects fewer rows than the batch has tokens, the
	// batcher rolls back and runs Lock then the statement again in a new
	// transaction, so that each job learns its own result.
	Lock Stmt
}

// ManyStatements insert many jobs at once ([BulkEnqueuer]).
type ManyStatements struct {
	// Insert inserts the jobs: the parameters of Enqueue's statement, job
	// after job. With Rows it returns the new ids, one column; integer ids
	// may come in any order, as the core sorts them (an id the engine
	// assigns grows within a statement), other ids must come in job order.
	// Without Rows the ids the engine assigns are LastInsertId, the first
	// job's, and the next ones Step apart.
	Insert Stmt
	// Step (with an Insert without Rows) returns one integer: the
	// difference between the ids one statement assigns to consecutive rows.
	// Empty: 1.
	Step Stmt
}

// ControlStatements pause and resume a queue (inbox's Queue.Pause,
// Resume and Paused), set when the description names a control table
// (Names.ControlTable): one row per queue table, keyed by ArgQueue (the
// table's name without its schema), with the columns queue (text, the primary
// key), paused_at (a time, NULL while the queue runs) and paused_by
// (text, NULL). inbox.New refuses a control table to a dialect that
// leaves them empty.
type ControlStatements struct {
	// Pause writes the row of ArgQueue as paused since the clock's now
	// (ArgNow, or the engine's) by ArgBy, inserting it if missing; a
	// queue already paused keeps its time and its ArgBy.
	Pause Stmt
	// Resume clears the row's paused_at and paused_by; no row is a queue
	// that runs already.
	Resume Stmt
	// Read returns paused_at and paused_by of the row of ArgQueue; no row,
	// or a NULL paused_at, is a queue that runs. A plain read.
	Read Stmt
}
