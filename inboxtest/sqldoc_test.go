package inboxtest

// docs/sql.md, the reference of every statement a queue sends, per engine
// and form, laid out for reading: generated from the queues' Statements, the
// Batcher's statements, the advisory form's lock calls and the schema
// check's first statement, and kept true by TestDocSQL.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"reflect"
	"strings"
	"testing"

	"github.com/sqlinbox/inbox"
)

// TestDocSQL checks that docs/sql.md shows the statements the queues send;
// -update rewrites its generated part.
func TestDocSQL(t *testing.T) {
	checkGenerated(t, "../docs/sql.md", "TestDocSQL", generateSQLDoc(t))
}

// The descriptions of the schema files (schema/<engine>-<form>.sql), as
// examples/quickstart/forms.go gives them, so that each statement below
// runs on the tables those files create.
var sqlDocForms = []struct {
	file  string // the schema file's form part
	table inbox.Table
}{
	{"lease", inbox.Table{Name: "jobs", LockedUntil: "locked_until", DeadTable: "jobs_dead"}},
	// The lease file without its claim indexes: only the statements that
	// differ from the lease's are shown.
	{"lease-shallow", inbox.Table{Name: "jobs", LockedUntil: "locked_until", DeadTable: "jobs_dead", Shallow: true}},
	{"rowlock", inbox.Table{Name: "jobs", NotBefore: "not_before", ClaimsTable: "jobs_claims", MaxClaims: 5, DeadTable: "jobs_dead"}},
	{"advisory", inbox.Table{Name: "jobs", AdvisoryKey: "id", NotBefore: "not_before", DeadTable: "jobs_dead"}},
}

var sqlDocEngines = []struct {
	name, file string // the heading; the schema file's engine part
	d          inbox.Dialect
	like       string // the engine whose statements this one shares, shown once
	note       string // what the engine's statements do differently, in a word
}{
	{"PostgreSQL", "postgres", inbox.Postgres, "", ""},
	{"MySQL", "mysql", inbox.MySQL, "", ""},
	{"MariaDB", "mysql", inbox.MariaDB, "MySQL", "Its lease and row-lock claim reads end with " +
		"`@@tx_isolation = 'READ-COMMITTED'`: its claims begin at the session's level, without `SET TRANSACTION`, " +
		"while that column says 1, and at READ COMMITTED from the first row that says 0 on " +
		"([operations.md](operations.md#drivers))."},
	{"SQLite", "sqlite", inbox.SQLite, "", ""},
}

// sqlDocBatch is the batch size shown: a batch of n tokens repeats the
// token's places n times.
const sqlDocBatch = 2

// stmtDoc says what a statement does and when it runs.
type stmtDoc struct{ what, when string }

// stmtDocs describe every field of inbox.Statements; a field missing here
// fails the test, so that a new statement gets its description.
var stmtDocs = map[string]stmtDoc{
	"Now": {"Reads the engine's clock, for the statements after it that send times the engine cannot return itself.",
		"before a statement that sends a time computed from now (a `Settle.Retry`, an `Settle.Extend`, `Jobs.Stats`), when `Config.Now` is not set; a lease claim reads the clock with its rows instead."},
	"Claim.Take": {"Claims jobs in one statement: marks them taken (the attempt counted, under the lease the expiry written) and returns id, the attempt delivered, the expiry (lease) and the data columns.",
		"`Queue.Claim`, and so each claim of `worker.Run`. Lease: up to max jobs, outside any transaction. Row lock: one job, inside the transaction that then holds it, once per job claimed. Advisory: the candidate whose lock was just taken, if no one claimed it meanwhile."},
	"Claim.TakeOne": {"Claims one job, as `Claim.Take` does, naming its row with `=` where `Claim.Take` names a set with `IN`: SQLite then updates in one pass, without a temporary table.",
		"`Queue.Claim` of one job (each claim of `worker.Run` with a batch of one)."},
	"Claim.Select": {"Reads and locks claimable jobs in the claim's transaction, returning id, the attempt delivered and the data columns.",
		"`Queue.Claim` on an engine without `UPDATE … RETURNING`, first statement of the claim's transaction (advisory: the candidate under its lock)."},
	"Claim.Mark": {"Marks the jobs the claim read: counts their attempt and, under the lease, writes their expiry; a row marked only if it still carries the attempt read and is still claimable.",
		"`Queue.Claim`, after `Claim.Select` (or `Claim.PickLock`), in the same transaction; a lease claim marks up to 16 jobs per statement."},
	"Claim.MarkOne": {"`Claim.Mark` for one job, named by equality: counts its attempt and writes its expiry if it still carries the attempt read and is still claimable.",
		"`Queue.Claim(ctx, 1)` of a lease on MySQL and MariaDB, after the read that found the job, in the same transaction (claims of more use `Claim.Mark`, whose list of 16 places costs the server more for one row)."},
	"Claim.Marked": {"Returns which of the named jobs carry the expiry just written.",
		"`Queue.Claim`, when a lease `Claim.Mark` or `Claim.MarkOne` changed fewer rows than it named: the claim delivers those alone."},
	"Claim.SelectMore": {"Reads more claimable jobs, as `Claim.Select` does, for the places it left.",
		"`Queue.Claim` of a lease, when the first read returned fewer jobs than max."},
	"Claim.SelectFree": {"Reads free jobs, as `Claim.SelectMore` does, unless some job's lease has run out (those come first in claim order): then none.",
		"`Queue.Claim` of a lease, first; when it returns jobs they are the claim, and `Claim.Select` and `Claim.SelectMore` are not sent."},
	"Claim.SelectFreeOne": {"`Claim.SelectFree` for a claim of one job, by the path of `Claim.SelectMoreOne`.",
		"`Queue.Claim(ctx, 1)` of a lease, first (on `inbox.MariaDB`, after `Claim.WalkTake` or `Claim.WalkFirst` returned no row, and first for the 64 claims of one after the second claim running whose reads then found a job)."},
	"Claim.SelectMoreOne": {"Reads one more claimable job, as `Claim.SelectMore` does, by the path that finds one job fastest.",
		"`Queue.Claim(ctx, 1)` of a lease, when the first read returned none."},
	"Claim.Pick": {"Reads up to a page of claimable jobs' ids (and priorities) in claim order, without locking them: InnoDB keeps the lock of every row a locking read passed, so the claim locks only the rows it takes, by id (`Claim.PickLock`).",
		"`Queue.Claim`, first page of candidates."},
	"Claim.PickAfter": {"Reads the next page of candidates, past the last one read, in claim order.",
		"`Queue.Claim`, when every candidate of the page before was held by others."},
	"Claim.PickMore": {"Reads a second set of candidates (the free jobs, where `Claim.Pick` reads the expired leases); the claim merges both in claim order.",
		"`Queue.Claim` of a lease, beside `Claim.Pick`."},
	"Claim.PickMoreAfter": {"The next page of `Claim.PickMore`'s candidates.",
		"`Queue.Claim` of a lease, when the candidates before were held by others."},
	"Claim.PickLock": {"Locks, among the candidates named, the jobs still claimable and not held by another transaction, in id order, and returns them as `Claim.Select` does.",
		"`Queue.Claim`, after `Claim.Pick`, in the claim's transaction."},
	"Claim.PickFirst": {"`Claim.Pick` and `Claim.PickLock` in one statement: reads a page of candidates in claim order without locks, then locks their rows by primary key in that order, skipping rows held by another transaction, and returns the first it locked (one row, as `Claim.PickLock` does), no other row locked. MariaDB, row lock with a not-before column (with a priority, the page carries it and is sorted by it first).",
		"`Queue.Claim` of the row lock on `inbox.MariaDB`, in the claim's transaction, first where the table has no `Claim.WalkFirst` (a priority) and during the 64 claims after a walk returned no row; when it returns no row, the claim picks (`Claim.Pick`, then `Claim.PickLock`), and when that pick finds a job past the page (rows held by other processes fill it), the next 64 claims pick without it."},
	"Claim.WalkFirst": {"Locks the first claimable job in id order, reading the table by its primary key and skipping rows held by another transaction, as a table without a not-before column (row lock) or without the claim index (lease) is claimed; it gives up after reading 32 rows it cannot claim (not yet ready, or under a lease in force), returning no row. Under READ COMMITTED the rows it passed are unlocked, but the last one read when it gives up stays locked. The lease's, as `Claim.SelectFreeOne`, returns no row while some lease has run out. MariaDB, without a priority: the row lock with a not-before column, the lease with its claim index.",
		"`Queue.Claim` of the row lock on `inbox.MariaDB`, first, in the claim's transaction; when it returns no row, the claim rolls back and claims again in a new transaction by `Claim.PickFirst`, as do the 64 claims after it. `Queue.Claim(ctx, 1)` of the lease on `inbox.MariaDB` when the claim's context ends within a second (else `Claim.WalkTake`), first; when it returns no row, the claim goes on in its transaction with `Claim.SelectFreeOne`, as do the 64 claims of one after it."},
	"Claim.WalkTake": {"A claim of one job in one compound statement: sets READ COMMITTED, begins, locks the first free job in id order as `Claim.WalkFirst` does (none while a lease has run out, none past 32 rows it cannot claim), counts its attempt and writes its expiry if the row still carries the attempt read and no lease, commits, and returns the job as it read it with the expiry it wrote (no row when it claimed none). Any error rolls the transaction back and is raised again. The row is read into variables typed as its columns and returned from them: nothing is read after the commit. The table is aliased so that no column name can stand for a variable. As the statement commits at the server, a claim cut by its context may still lease the job it found, until that lease ends. MariaDB, the lease with its claim index, without a priority.",
		"`Queue.Claim(ctx, 1)` of the lease on `inbox.MariaDB`, first, with no transaction of the client's, unless the claim's context ends within a second; when it returns no row the claim goes on in a transaction with `Claim.SelectFreeOne` (no `Claim.WalkFirst`); when that finds a job twice running (no claim by this statement between), the 64 claims of one after go without the walk: once may be a job enqueued between the two."},
	"Advisory.Candidates": {"Reads up to a page of claimable jobs (id, key, attempt) in id order, without locking them.",
		"`Queue.Claim` of the advisory form, before it tries each candidate's lock."},
	"Advisory.CandidatesAfter": {"Reads the next page of candidates, past the last id read.",
		"`Queue.Claim` of the advisory form, when the page before gave fewer jobs than max."},
	"Advisory.LockFirst": {"Reads a page of candidates as `Advisory.Candidates` does and, on the server, tries each key's session lock in claim order, stopping at the first taken: returns that candidate (id, key, attempt) and true, its lock held by the session. When no key is free it returns a full page's last candidate and false (no lock), or no row for a short page. The lock key is `PostgresLockKey`'s (MariaDB: `MySQLLockName`'s, taken by `GET_LOCK`), hashed in SQL. MariaDB numbers the page's rows and also returns its last row when that key was taken, the last column then true.",
		"`Queue.Claim` of the advisory form on PostgreSQL and on `inbox.MariaDB` (there only for 64 claims after a walk from Go found a key held by another session, `Advisory.LockFirstContended`; `inbox.MySQL` calls `GET_LOCK` from Go, a key at a time), once per job, each on a connection of its own; the claim then re-reads the row on that connection (`Claim.Take`; MariaDB: `Claim.Select`, then `Claim.Mark`)."},
	"Advisory.LockFirstAfter": {"`Advisory.LockFirst` over the next page of candidates, past the last id read.",
		"`Queue.Claim` of the advisory form on PostgreSQL and `inbox.MariaDB`, when no key of a full page before was free."},
	"Settle.Extend": {"Moves a lease's expiry forward, if the row still carries the delivery's token (id, attempt, expiry).",
		"the keeper (`Delivery.Keep`, `KeepGroup`, and so `worker.Run`), every half lease while the handler runs."},
	"Settle.Exists": {"Counts the rows carrying a token, on an engine that reports only changed rows as affected.",
		"after an `Settle.Extend` or a `Settle.Retry` that affected no row: a write of the value the row already held is not a lost lease."},
	"Settle.Verdict": {"Reads the job's row as it stands (its attempt and, under the lease, its expiry), a plain read sent once no statement of the settlement can still run: what the database holds after a settlement whose outcome is unknown.",
		"a settlement whose context ended or whose connection broke mid-statement (lease: after an extension by the token found none; advisory: on the delivery's session, or under its lock), a settlement after one in the caller's transaction not yet known to have committed, and an advisory claim, for each delivery settled in a transaction never confirmed."},
	"Settle.Ack": {"Deletes the job, if its row still carries the delivery's token (lease: id, attempt, expiry; advisory: id, attempt; row lock: the held transaction's row).",
		"`Delivery.Ack`, `AckTx` (in the caller's transaction), and `worker.Run` when the handler returns nil."},
	"Settle.Retry": {"Gives the job back for a later attempt: under the lease, an expiry at the retry time; otherwise the not-before time (and, row lock, the attempt counted).",
		"`Delivery.Retry`, `RetryTx`, and `worker.Run` when the handler returns an error."},
	"Settle.Release": {"Gives the job back at once without spending its attempt.",
		"`Delivery.Release`, `ReleaseTx`, and `worker.Run` for a job claimed after its shutdown began."},
	"Settle.Dead": {"Copies the job into the dead table with the attempt delivered (where the engine can, deleting it in the same statement).",
		"`Delivery.Dead`, `DeadTx`, `worker.Run` past `MaxAttempts`; row lock: a claim past `Table.MaxClaims`."},
	"Settle.DeadDelete": {"Deletes the job the dead move copied, in the same transaction.",
		"after `Settle.Dead`, on an engine that cannot do both in one statement."},
	"RowLock.ClaimsCount": {"Counts one more delivery of the job in the claims table (returning the count where the engine can).",
		"`Queue.Claim` of the row lock, from the pool, once the claim's transaction holds the row."},
	"RowLock.ClaimsRead": {"Reads the job's delivery count.",
		"after `RowLock.ClaimsCount`, on an engine whose upsert cannot return it."},
	"RowLock.ClaimsGiveBack": {"Takes one delivery back from the count.",
		"`Delivery.Release` of the row lock, from the pool, before the held transaction rolls back."},
	"RowLock.ClaimsClear": {"Removes the job's count.",
		"every other row-lock settlement (`Settle.Ack`, `Settle.Retry`, `Dead`), in the held transaction."},
	"RowLock.Savepoint": {"Marks the held transaction before the handler writes to it.",
		"the first `Delivery.Tx()` of a row-lock delivery."},
	"RowLock.RollbackToSavepoint": {"Undoes what the handler wrote in the held transaction.",
		"a row-lock `Settle.Retry`, `Dead` or `Drop` after `Delivery.Tx()`, before it records the attempt."},
	"RowLock.Relock": {"Locks the job again if it still carries the attempt delivered, waiting for the lock up to a bound the server enforces (PostgreSQL: `lock_timeout` 30 s, set for its transaction; MySQL and MariaDB: `innodb_lock_wait_timeout`), since the holder may be the lost transaction's own session, still running a cut statement; a timed-out wait is a lost lease.",
		"a row-lock `Settle.Retry`, `Dead` or `Drop` whose held transaction cannot be used any more (a failed statement, a deadlock, a cut session), first statement of a transaction of its own."},
	"Jobs.Enqueue": {"Inserts a job with the data given; the id comes from the table.",
		"`Queue.Enqueue` without `Job.ID` or `Job.NotBefore`."},
	"Jobs.EnqueueID": {"Inserts a job with the id given.",
		"`Queue.Enqueue` with `Job.ID`; `Queue.RequeueDeadAs`."},
	"Jobs.EnqueueAt": {"Inserts a job not claimable before the time given.",
		"`Queue.Enqueue` with `Job.NotBefore`."},
	"Jobs.EnqueueIDAt": {"Inserts a job with the id and the not-before time given.",
		"`Queue.Enqueue` with both."},
	"Jobs.Probe": {"Returns a row when a claim may find a job, in one statement where the claim is a transaction of several.",
		"`Queue.Probe`: `worker.Run`, idle, when its fallback interval runs out; it claims only after a row."},
	"Dead.List": {"Lists up to a page of dead jobs, the most recent death first; with `Table.DeadAt`, those without a time of death (dead before the column was added) last.",
		"`Queue.ListDead` (the dashboard's dead list)."},
	"Dead.ListAfter": {"Lists the next page of dead jobs, past the last one listed.",
		"`Queue.ListDead` with a cursor."},
	"Dead.ListAfterNull": {"Lists the next page of the dead jobs without a time of death, past the last one listed.",
		"`Queue.ListDead` with a cursor whose `DeadAt` is zero, with `Table.DeadAt`."},
	"Dead.Take": {"Takes a dead job's data out of the dead table (deleting it, or locking it where the engine cannot return a deleted row).",
		"`Queue.RequeueDead` and `Queue.RequeueDeadAs`, in its transaction, before it enqueues the job again."},
	"Dead.TakeDelete": {"Deletes the dead job `Dead.Take` locked.",
		"`Queue.RequeueDead`, after `Dead.Take`, on an engine without `DELETE … RETURNING`."},
	"Dead.Purge": {"Deletes every dead job.",
		"`Queue.PurgeDead` with a zero time."},
	"Dead.PurgeBefore": {"Deletes the dead jobs that died before the time given.",
		"`Queue.PurgeDead(ctx, t)`."},
	"Dead.Has": {"Tells whether the dead table holds a job with the id given.",
		"`Queue.Enqueue` and `Queue.EnqueueMany` with `Job.ID`, before the insert, and `Queue.RequeueDeadAs` for its new id, before the take: a dead job's id is refused."},
	"Dead.RequeueError": {"Writes a requeued job's last error text back.",
		"`Queue.RequeueDead`, after the insert, when the dead job had an error text."},
	"Dead.Delete": {"Deletes one dead job.",
		"`Queue.DeleteDead`, and `Queue.DeleteDeadMany` once per job in one transaction."},
	"Dead.Count": {"Counts the dead jobs.",
		"`Queue.CountDead` (the count an operator confirms), and `Queue.RequeueDeadAll` before its first batch."},
	"Dead.CountOlder": {"Counts the dead jobs that died before the time given.",
		"`Queue.CountDead` and `Queue.RequeueDeadAll` with `DeadFilter.DiedBefore`."},
	"Dead.Batch": {"Reads the ids of the first batch of dead jobs, in id order.",
		"`Queue.RequeueDeadAll`, before the first batch's transaction, which requeues each (`Dead.Take` decides)."},
	"Dead.BatchAfter": {"Reads the ids of the next batch of dead jobs, past the last id of the batch before.",
		"`Queue.RequeueDeadAll`, before each later batch's transaction."},
	"Dead.BatchOlder": {"Reads the ids of the first batch of the dead jobs that died before the time given.",
		"`Queue.RequeueDeadAll` with `DeadFilter.DiedBefore`, first batch."},
	"Dead.BatchOlderAfter": {"Reads the ids of the next batch of the dead jobs that died before the time given.",
		"`Queue.RequeueDeadAll` with `DeadFilter.DiedBefore`, each later batch."},
	"Browse.All.First": {"Lists up to a page of the jobs, the highest ids first, each with its state as its row tells it.",
		"`Queue.ListJobs` (the dashboard's jobs view) without a cursor."},
	"Browse.All.After": {"Lists the next page of the jobs: a seek of the primary key below the last id listed.",
		"`Queue.ListJobs` with `JobFilter.After` (older)."},
	"Browse.All.Before": {"Lists the page of the jobs above the first id listed, the lowest first.",
		"`Queue.ListJobs` with `JobFilter.Before` (newer)."},
	"Browse.Ready.First": {"Lists up to a page of the ready jobs, the highest ids first, each with its state as its row tells it.",
		"`Queue.ListJobs` (the dashboard's jobs view) without a cursor."},
	"Browse.Ready.After": {"Lists the next page of the ready jobs: a seek of the primary key below the last id listed.",
		"`Queue.ListJobs` with `JobFilter.After` (older)."},
	"Browse.Ready.Before": {"Lists the page of the ready jobs above the first id listed, the lowest first.",
		"`Queue.ListJobs` with `JobFilter.Before` (newer)."},
	"Browse.Waiting.First": {"Lists up to a page of the waiting jobs, the highest ids first, each with its state as its row tells it.",
		"`Queue.ListJobs` (the dashboard's jobs view) without a cursor."},
	"Browse.Waiting.After": {"Lists the next page of the waiting jobs: a seek of the primary key below the last id listed.",
		"`Queue.ListJobs` with `JobFilter.After` (older)."},
	"Browse.Waiting.Before": {"Lists the page of the waiting jobs above the first id listed, the lowest first.",
		"`Queue.ListJobs` with `JobFilter.Before` (newer)."},
	"Browse.InWork.First": {"Lists up to a page of the jobs in work, the highest ids first, each with its state as its row tells it.",
		"`Queue.ListJobs` (the dashboard's jobs view) without a cursor."},
	"Browse.InWork.After": {"Lists the next page of the jobs in work: a seek of the primary key below the last id listed.",
		"`Queue.ListJobs` with `JobFilter.After` (older)."},
	"Browse.InWork.Before": {"Lists the page of the jobs in work above the first id listed, the lowest first.",
		"`Queue.ListJobs` with `JobFilter.Before` (newer)."},
	"Browse.Job": {"Reads one job's row with its state.",
		"`Queue.Job` (the dashboard's job page), and `Queue.ListJobs` with `JobFilter.ID`."},
	"Browse.Dead": {"Reads one dead job's row.",
		"`Queue.Job`, when the queue table has no such job."},
	"Jobs.Cancel": {"Deletes a job that waits (under the lease, whatever its lease: the holder learns by its keeper).",
		"`Queue.Cancel`."},
	"RowLock.CancelLock": {"Locks the job without waiting, returning it when no claim holds it.",
		"`Queue.Cancel` of the row lock, before `Jobs.Cancel`, in one transaction."},
	"Jobs.RunNow": {"Makes a waiting job claimable now: clears its not-before time, or under the lease a lease ending beyond a lease from now (a retry delay, never a holder's).",
		"`Queue.RunNow`; under the row lock after `RowLock.CancelLock`, in one transaction."},
	"Jobs.Exists": {"Tells a job in work from a missing one.",
		"`Queue.Cancel`, when nothing was deleted."},
	"Jobs.Stats": {"Counts the jobs ready, waiting, in work and dead, and the age of the oldest ready one, in one row.",
		"`Queue.Stats`: the dashboard and the metrics handler, on each scrape or page load."},
	"Jobs.InWork": {"Counts the jobs held, from the server's lock view, where `Jobs.Stats` cannot tell them apart.",
		"`Queue.Stats`, after `Jobs.Stats`; its error leaves the count at -1."},
	"Unique.Find": {"Reads the id and attempt (advisory: and key) of the job holding a unique key, a plain read.",
		"`Queue.Enqueue` of a job with `Job.UniqueKey`, once its insert found the key held."},
	"Unique.Replace": {"Writes a job's data and not-before time into the job holding its key, if that job is not in work.",
		"`Queue.Enqueue` with `Job.Replace`, after `Unique.Find`."},
	"Unique.ReplaceLock": {"Locks the job holding the key if it may be replaced, before `Unique.Replace` in the same transaction.",
		"`Queue.Enqueue` with `Job.Replace`, on engines whose UPDATE counts only changed rows."},
	"Control.Pause": {"Marks the queue paused in the control table (inserting its row if missing), keeping the first pause's time and author.",
		"`Queue.Pause`, with `Table.ControlTable`."},
	"Control.Resume": {"Clears the queue's pause in the control table.",
		"`Queue.Resume`, with `Table.ControlTable`."},
	"Control.Read": {"Reads whether the queue is paused, since when and by whom: one primary-key probe.",
		"`Queue.Paused` and `Queue.Stats`, with `Table.ControlTable`; the worker loop, once per poll interval (and after a `Pause` or `Resume` in its process)."},
}

// formDocs say it for one form, where the statement of that name differs
// by form: "Field/form", the form as in the schema file's name.
var formDocs = map[string]stmtDoc{
	"Claim.Take/lease": {"Claims up to max free or expired jobs in one statement: counts their attempt, writes their expiry, and returns id, the attempt delivered, the expiry and the data columns.",
		"`Queue.Claim` (each claim of `worker.Run`), outside any transaction."},
	"Claim.Take/rowlock": {"Locks one claimable job in the claim's transaction, which holds it until the settlement, and returns id, the attempt delivered and the data columns. It writes nothing: a crash rolls it back.",
		"`Queue.Claim`, once per job, each in a transaction of its own; a claim of fewer jobs than max ends with one that finds none."},
	"Claim.Take/advisory": {"Counts the attempt of the candidate whose lock was just taken, if it still has the attempt read and is claimable, and returns id, the attempt delivered and the data columns.",
		"`Queue.Claim` of the advisory form, after `Advisory.LockFirst` (PostgreSQL) or `TryLock`, for each candidate locked."},
	"Claim.Select/advisory": {"Reads the candidate whose lock was just taken, if it still has the attempt read and is claimable.",
		"`Queue.Claim` of the advisory form, after `TryLock`, for each candidate locked; no transaction."},
	"Claim.Mark/advisory": {"Counts the attempt of the candidate read, if it still has the attempt read and is claimable.",
		"`Queue.Claim` of the advisory form, after `Claim.Select`."},
	"Settle.Ack/lease": {"Deletes the job if its row still carries the delivery's token (id, attempt, expiry): none deleted is a lost lease.",
		"`Delivery.Ack`, `AckTx` (in the caller's transaction), and `worker.Run` when the handler returns nil."},
	"Settle.Ack/rowlock": {"Deletes the job in the held transaction; the settlement then commits it, with what the handler wrote through `Delivery.Tx()`.",
		"`Delivery.Ack`, and `worker.Run` when the handler returns nil."},
	"Settle.Ack/advisory": {"Deletes the job if its row still has the attempt delivered: none deleted means the lock was lost and the job claimed again.",
		"`Delivery.Ack`, `AckTx` (in the caller's transaction), and `worker.Run` when the handler returns nil; `Unlock` follows."},
	"Settle.Retry/lease": {"Sets the lease to expire at the retry time, when the job is claimable again, if the row still carries the delivery's token.",
		"`Delivery.Retry`, `RetryTx`, and `worker.Run` when the handler returns an error."},
	"Settle.Retry/rowlock": {"Counts the spent attempt and sets the not-before time, in the held transaction, which the settlement then commits.",
		"`Delivery.Retry`, and `worker.Run` when the handler returns an error."},
	"Settle.Retry/advisory": {"Sets the not-before time, if the row still has the attempt delivered.",
		"`Delivery.Retry` with a delay, `RetryTx`, and `worker.Run` when the handler returns an error; `Unlock` follows."},
	"Settle.Release/lease": {"Clears the lease and gives the attempt back, if the row still carries the delivery's token.",
		"`Delivery.Release`, `ReleaseTx`, and `worker.Run` for a job claimed after its shutdown began."},
	"Settle.Release/advisory": {"Gives the attempt back, if the row still has the attempt delivered.",
		"`Delivery.Release`, `ReleaseTx`, and `worker.Run` for a job claimed after its shutdown began or whose handler failed as it began; `Unlock` follows."},
}

// batchDocs describe the fields of inbox.BatchStatements.
var batchDocs = map[string]stmtDoc{
	"Ack":     {"Deletes the rows of several lease deliveries, each only while it carries its own token, returning the ids deleted where the engine can.", "`Batcher.AckAll`, and `Batcher.Ack` grouping the calls that arrive together (`worker.Run` with batches)."},
	"Release": {"Gives several leased jobs back without spending their attempts, each only while it carries its token.", "`Batcher.ReleaseAll`, `Batcher.Release`: `worker.Run` gives back so the jobs of a claim answered after its shutdown began."},
	"Retry":   {"Sets several leases to expire at the retry time, each only while it carries its token.", "`Batcher.Retry`."},
	"Lock":    {"Returns the ids of the rows still carrying their tokens and locks them until the transaction ends.", "a batch whose statement affected fewer rows than it had tokens, on an engine that cannot return the rows it changed: the batch rolls back and runs `Lock`, then the statement, in a new transaction."},
}

// sqlDocNamed is a statement with its heading.
type sqlDocNamed struct {
	name, sql string
	doc       stmtDoc
}

// captureDialect records the Names the queue hands its dialect, for the
// Batcher's statements.
type captureDialect struct {
	inbox.Dialect
	names *dialect.Names
}

func (c *captureDialect) Statements(n *dialect.Names) (*inbox.Statements, error) {
	c.names = n
	return c.Dialect.Statements(n)
}

func (c *captureDialect) Unwrap() inbox.Dialect { return c.Dialect }

// sqlDocStatements returns every statement a queue of this engine and form
// sends, in the order of inbox.Statements, then the batch, lock and schema
// check statements.
func sqlDocStatements(t *testing.T, d inbox.Dialect, form string, table inbox.Table) []sqlDocNamed {
	t.Helper()
	rec := &sqlRecorder{}
	db := sql.OpenDB(rec)
	t.Cleanup(func() { db.Close() })
	cd := &captureDialect{Dialect: d}
	q, err := inbox.New(db, inbox.Config{Dialect: cd, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	var out []sqlDocNamed
	var add func(docs map[string]stmtDoc, v reflect.Value, prefix, path string)
	add = func(docs map[string]stmtDoc, v reflect.Value, prefix, path string) {
		for i := 0; i < v.NumField(); i++ {
			f := v.Type().Field(i)
			name := path + f.Name
			if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(dialect.Stmt{}) {
				add(docs, v.Field(i), prefix, name+".") // a part of Statements
				continue
			}
			st, ok := v.Field(i).Interface().(dialect.Stmt)
			if !ok {
				continue
			}
			doc, ok := formDocs[name+"/"+form]
			if !ok || prefix != "" {
				doc, ok = docs[name]
			}
			if !ok {
				t.Errorf("%s%s has no description in sqldoc_test.go: say what it does and when it runs", prefix, name)
			}
			if st.SQL != "" {
				out = append(out, sqlDocNamed{prefix + name, st.SQL, doc})
			}
		}
	}
	add(stmtDocs, reflect.ValueOf(*q.Statements()), "", "")
	if q.Form() == inbox.Lease {
		bs, err := d.(dialect.BatchDialect).BatchStatements(cd.names, sqlDocBatch)
		if err != nil {
			t.Fatal(err)
		}
		add(batchDocs, reflect.ValueOf(*bs), "Batch ", "")
	}
	ctx := context.Background()
	if ti, ok := d.(dialect.TableIdentifier); ok && q.Form() == inbox.Advisory {
		_, _ = ti.TableIdentity(ctx, db, cd.names)
		out = append(out, rec.take(t, "TableIdentity", stmtDoc{
			"Reads the table's identity, the same for every spelling of its name: the advisory keys and lock names are made from it.",
			"The first `Queue.Claim` of each advisory queue."})...)
	}
	if l, ok := d.(dialect.Locker); ok && q.Form() == inbox.Advisory {
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = l.TryLock(ctx, conn, "public.jobs", "7")
		out = append(out, rec.take(t, "TryLock", stmtDoc{
			"Takes the session lock of one job's key without waiting; true (1) when taken.",
			"`Queue.Claim` of the advisory form, for each candidate in turn, on the connection the job keeps while in work."})...)
		_ = l.Unlock(ctx, conn, "public.jobs", "7")
		out = append(out, rec.take(t, "Unlock", stmtDoc{
			"Lets the job's lock go.",
			"after each advisory settlement, and `Queue.Shutdown` for the jobs still held."})...)
		conn.Close()
	}
	_ = q.CheckSchema(ctx)
	if first := rec.take(t, "CheckSchema", stmtDoc{
		"The schema check's first statement: which engine and version answers, read from what no user creates or sets (`pg_catalog.version()`; MySQL's read-only `version_comment`), so that a look-alike (CockroachDB, YugabyteDB, TiDB, Vitess) is told apart. On an engine of another family it fails, and the other families' first statements follow to name the engine found. The check's further reads of the catalog depend on what this one found.",
		"`Queue.CheckSchema`, at startup."}); len(first) > 0 {
		if d == inbox.SQLite {
			first[0].doc.what = "The schema check's first statement: the SQLite version. On a server it fails, and the check then sends the servers' first statements to name the engine found."
		}
		out = append(out, first[0])
	}
	return out
}

// generateSQLDoc writes docs/sql.md's generated part: per engine, the
// statements every form shares, then each form's own.
func generateSQLDoc(t *testing.T) string {
	var b strings.Builder
	byEngine := map[string]map[string][]sqlDocNamed{}
	for _, e := range sqlDocEngines {
		fmt.Fprintf(&b, "- [%s](#%s):", e.name, slugDoc(e.name))
		byEngine[e.name] = map[string][]sqlDocNamed{}
		sep := " "
		for _, f := range sqlDocForms {
			if e.d == inbox.SQLite && f.file == "rowlock" {
				continue
			}
			byEngine[e.name][f.file] = sqlDocStatements(t, e.d, f.file, f.table)
			title := formTitle(f.file)
			fmt.Fprintf(&b, "%s[%s](#%s)", sep, title, slugDoc(e.name+", "+title))
			sep = ", "
		}
		b.WriteString("\n")
	}
	for _, e := range sqlDocEngines {
		fmt.Fprintf(&b, "\n## %s\n", e.name)
		forms := byEngine[e.name]
		var like map[string][]sqlDocNamed
		if e.like != "" {
			like = byEngine[e.like]
			fmt.Fprintf(&b, "\n`inbox.%s` sends the statements of [`inbox.%s`](#%s), except those shown here.", e.name, e.like, slugDoc(e.like))
			if e.note != "" {
				b.WriteString(" " + e.note)
			}
			b.WriteString("\n")
		}
		// A statement every form sends alike is shown once, first.
		var order []string
		for _, f := range sqlDocForms {
			if forms[f.file] != nil {
				order = append(order, f.file)
			}
		}
		shared := map[string]bool{}
		for _, s := range forms[order[0]] {
			all := true
			for _, f := range order[1:] {
				all = all && hasStmt(forms[f], s)
			}
			if all && !(like != nil && hasStmtAll(like, order, s)) {
				shared[s.name] = true
			}
		}
		if len(shared) > 0 {
			fmt.Fprintf(&b, "\n### %s, every form\n", e.name)
			for _, s := range forms[order[0]] {
				if shared[s.name] {
					writeStmt(t, &b, s)
				}
			}
		}
		for _, f := range order {
			title := formTitle(f)
			fmt.Fprintf(&b, "\n### %s, %s\n\n", e.name, title)
			if base, ok := strings.CutSuffix(f, "-shallow"); ok {
				fmt.Fprintf(&b, "On [schema/%s-%s.sql](../schema/%s-%s.sql) without its claim indexes, described with `Shallow: true`. The other statements are the %s form's.\n",
					e.file, base, e.file, base, formTitle(base))
			} else {
				fmt.Fprintf(&b, "On [schema/%s-%s.sql](../schema/%s-%s.sql).\n", e.file, f, e.file, f)
			}
			n := 0
			for _, s := range forms[f] {
				if shared[s.name] && hasStmt(forms[order[0]], s) {
					continue
				}
				if like != nil && hasStmt(like[f], s) {
					continue
				}
				if base, ok := strings.CutSuffix(f, "-shallow"); ok && hasStmt(forms[base], s) {
					continue
				}
				writeStmt(t, &b, s)
				n++
			}
			if n == 0 {
				fmt.Fprintf(&b, "\nNo statement of its own: %s's.\n", e.like)
			}
		}
	}
	return b.String()
}

func formTitle(file string) string {
	return map[string]string{"lease": "lease", "lease-shallow": "shallow lease", "rowlock": "row lock", "advisory": "advisory lock"}[file]
}

// slugDoc is a heading's anchor, as GitHub makes it for these headings.
func slugDoc(heading string) string {
	return strings.ReplaceAll(strings.ReplaceAll(strings.ToLower(heading), ",", ""), " ", "-")
}

func hasStmt(list []sqlDocNamed, s sqlDocNamed) bool {
	for _, x := range list {
		if x.name == s.name && x.sql == s.sql {
			return true
		}
	}
	return false
}

func hasStmtAll(forms map[string][]sqlDocNamed, order []string, s sqlDocNamed) bool {
	for _, f := range order {
		if !hasStmt(forms[f], s) {
			return false
		}
	}
	return true
}

func writeStmt(t *testing.T, b *strings.Builder, s sqlDocNamed) {
	t.Helper()
	text := formatSQL(s.sql)
	if squeeze(text) != squeeze(s.sql) {
		t.Errorf("%s: the layout changed the statement:\n%s\nlaid out as\n%s", s.name, s.sql, text)
	}
	fmt.Fprintf(b, "\n#### %s\n\n%s *Runs:* %s\n\n```sql\n%s\n```\n", s.name, s.doc.what, s.doc.when, text)
}

// squeeze drops every space and line break: a layout may change those
// alone.
func squeeze(s string) string {
	return strings.Join(strings.Fields(s), "")
}

// sqlRecorder is a database/sql driver that records each statement's text and
// fails it: the dialect's own calls are reached for their SQL alone.
type sqlRecorder struct{ sqls []string }

var errRecorded = errors.New("recorded")

func (r *sqlRecorder) Connect(context.Context) (driver.Conn, error) { return recConn{r}, nil }
func (r *sqlRecorder) Driver() driver.Driver                        { return nil }

// take returns the statements recorded since the last take, named name.
func (r *sqlRecorder) take(t *testing.T, name string, doc stmtDoc) []sqlDocNamed {
	t.Helper()
	if len(r.sqls) == 0 {
		t.Errorf("%s sent no statement", name)
	}
	var out []sqlDocNamed
	for _, s := range r.sqls {
		out = append(out, sqlDocNamed{name, s, doc})
	}
	r.sqls = nil
	return out
}

type recConn struct{ r *sqlRecorder }

func (c recConn) Prepare(query string) (driver.Stmt, error) { return nil, errRecorded }
func (c recConn) Close() error                              { return nil }
func (c recConn) Begin() (driver.Tx, error)                 { return nil, errRecorded }
func (c recConn) QueryContext(_ context.Context, query string, _ []driver.NamedValue) (driver.Rows, error) {
	c.r.sqls = append(c.r.sqls, query)
	return nil, errRecorded
}
func (c recConn) ExecContext(_ context.Context, query string, _ []driver.NamedValue) (driver.Result, error) {
	c.r.sqls = append(c.r.sqls, query)
	return nil, errRecorded
}

// formatSQL lays a statement out for reading: each clause on a line of its
// own, a subquery longer than a short line indented in its parentheses, a
// line still too long broken after its commas or before its ANDs.
func formatSQL(sql string) string {
	var lines []string
	formatBlock(tokenize(sql), "", &lines)
	var out []string
	for _, l := range lines {
		out = append(out, wrapLine(l)...)
	}
	return strings.Join(out, "\n")
}

// token is a word, a quoted string or identifier, or one character of
// SQL, with whether a space went before it in the statement.
type token struct {
	text  string
	space bool
}

// tokenize splits SQL into tokens, keeping the statement's own spacing.
func tokenize(sql string) []token {
	var toks []token
	space := false
	for i := 0; i < len(sql); {
		c := sql[i]
		j := i + 1
		switch {
		case c == ' ' || c == '\n' || c == '\t':
			space = true
			i++
			continue
		case c == '\'' || c == '"' || c == '`':
			for j < len(sql) && (sql[j] != c || j+1 < len(sql) && sql[j+1] == c) {
				if sql[j] == c {
					j++ // a doubled quote
				}
				j++
			}
			j++
		case isWordByte(c):
			for j < len(sql) && isWordByte(sql[j]) {
				j++
			}
		case i+1 < len(sql) && isOp2(sql[i:i+2]):
			j = i + 2
		}
		toks = append(toks, token{sql[i:j], space && len(toks) > 0})
		space = false
		i = j
	}
	return toks
}

func isOp2(s string) bool {
	switch s {
	case "<=", ">=", "!=", "<>", "||", "::":
		return true
	}
	return false
}

func isWordByte(c byte) bool {
	return c == '_' || c == '$' || c == '.' || c == '?' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80
}

// clauses are the keywords that begin a line, longest first where one
// begins another; noBreak are phrases whose keyword continues the line.
var (
	clauses = [][]string{
		{"ON", "DUPLICATE", "KEY", "UPDATE"}, {"ON", "CONFLICT"}, {"FOR", "UPDATE"}, {"UNION", "ALL"},
		{"GROUP", "BY"}, {"ORDER", "BY"}, {"DELETE", "FROM"}, {"INSERT", "INTO"}, {"LEFT", "JOIN"},
		{"WITH"}, {"SELECT"}, {"FROM"}, {"WHERE"}, {"HAVING"}, {"LIMIT"}, {"UNION"}, {"UPDATE"},
		{"SET"}, {"VALUES"}, {"RETURNING"}, {"JOIN"}, {"DELETE"},
	}
	noBreak = [][]string{{"DO", "UPDATE", "SET"}, {"DO", "NOTHING"}}
	// A parenthesis whose first word is one of these holds a statement.
	subqueries = map[string]bool{"SELECT": true, "WITH": true, "DELETE": true, "UPDATE": true, "INSERT": true}
)

// inlineMax is the longest subquery kept on its parent's line.
const inlineMax = 60

func matchAt(toks []token, i int, phrase []string) bool {
	if i+len(phrase) > len(toks) {
		return false
	}
	for k, w := range phrase {
		if toks[i+k].text != w {
			return false
		}
	}
	return true
}

// closing returns the index of the parenthesis closing the one at i.
func closing(toks []token, i int) int {
	depth := 0
	for j := i; j < len(toks); j++ {
		switch toks[j].text {
		case "(":
			depth++
		case ")":
			depth--
			if depth == 0 {
				return j
			}
		}
	}
	return len(toks) - 1
}

// joinTokens writes tokens on one line, spaced as the statement spaced them.
func joinTokens(toks []token) string {
	var b strings.Builder
	for i, tok := range toks {
		if i > 0 && tok.space {
			b.WriteByte(' ')
		}
		b.WriteString(tok.text)
	}
	return b.String()
}

// formatBlock writes one statement's clauses as lines at indent, expanding
// long subqueries into blocks of their own.
func formatBlock(toks []token, indent string, lines *[]string) {
	var line strings.Builder
	flush := func() {
		if line.Len() > 0 {
			*lines = append(*lines, indent+line.String())
			line.Reset()
		}
	}
	write := func(tok token) {
		if line.Len() > 0 && tok.space {
			line.WriteByte(' ')
		}
		line.WriteString(tok.text)
	}
	depth := 0
	// After a subquery laid out as a block, the items of its list that
	// follow begin lines of their own, until the next clause.
	list := false
	for i := 0; i < len(toks); i++ {
		if n := phraseAt(toks, i, noBreak); n > 0 {
			for _, tok := range toks[i : i+n] {
				write(tok)
			}
			i += n - 1
			continue
		}
		if n := phraseAt(toks, i, clauses); n > 0 && depth == 0 {
			list = false
			flush()
			for _, tok := range toks[i : i+n] {
				write(tok)
			}
			i += n - 1
			continue
		}
		tok := toks[i]
		if tok.text == "(" && i+1 < len(toks) && subqueries[toks[i+1].text] {
			j := closing(toks, i)
			if text := joinTokens(toks[i : j+1]); len(text) <= inlineMax+2 {
				write(token{text, tok.space})
				i = j
				continue
			}
			write(tok)
			flush()
			formatBlock(toks[i+1:j], indent+"  ", lines)
			// The closing parenthesis begins the next line, at this indent.
			line.WriteString(")")
			i = j
			list = depth == 0
			continue
		}
		if list && depth == 0 && tok.text == "," {
			line.WriteString(",")
			flush()
			continue
		}
		switch tok.text {
		case "(":
			depth++
		case ")":
			depth--
		}
		write(tok)
	}
	flush()
}

// phraseAt returns the length of the phrase of phrases at toks[i], 0 for none.
func phraseAt(toks []token, i int, phrases [][]string) int {
	for _, p := range phrases {
		if matchAt(toks, i, p) {
			return len(p)
		}
	}
	return 0
}

// wrapMax is the longest line left whole.
const wrapMax = 100

// wrapLine breaks a line longer than wrapMax after its commas, or else
// before its ANDs and ORs, outside parentheses and quotes; the pieces after
// the first are indented by four more.
func wrapLine(l string) []string {
	if len(l) <= wrapMax {
		return []string{l}
	}
	indent := l[:len(l)-len(strings.TrimLeft(l, " "))]
	for _, sep := range []string{", ", " AND ", " OR "} {
		parts := splitTop(l, sep)
		if len(parts) < 2 {
			continue
		}
		pieces := []string{parts[0]}
		for _, p := range parts[1:] {
			if sep == ", " {
				pieces[len(pieces)-1] += ","
				pieces = append(pieces, indent+"    "+p)
			} else {
				pieces = append(pieces, indent+"    "+strings.TrimSpace(sep)+" "+p)
			}
		}
		var out []string
		for i, p := range pieces {
			// A piece that is the line again, but for its indent, breaks
			// no further: going on would indent it for ever.
			if i == 0 || len(p) <= wrapMax || strings.TrimSpace(p) == strings.TrimSpace(l) {
				out = append(out, p)
				continue
			}
			out = append(out, wrapLine(p)...)
		}
		return out
	}
	return []string{l}
}

// splitTop splits l at sep where it is outside parentheses and quotes.
func splitTop(l, sep string) []string {
	var parts []string
	depth, start := 0, 0
	var quote byte
	for i := 0; i < len(l); i++ {
		c := l[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"' || c == '`':
			quote = c
		case c == '(':
			depth++
		case c == ')':
			depth--
		case depth == 0 && strings.HasPrefix(l[i:], sep):
			parts = append(parts, l[start:i])
			start = i + len(sep)
			i += len(sep) - 1
		}
	}
	return append(parts, l[start:])
}
