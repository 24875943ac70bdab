package main

import "github.com/sqlinbox/inbox"

// The descriptions of the README's PostgreSQL and MySQL schemas, one per form
// (the README's SQLite lease schema is reportTable's). readme_test.go creates
// each schema on its engine and runs a queue with these descriptions on it.

// leaseTable: naming the lease column selects the lease form.
var leaseTable = inbox.Table{
	Name:        "jobs",
	LockedUntil: "locked_until",
	DeadTable:   "jobs_dead",
}

// rowLockTable: naming neither a lease column nor an advisory key selects the
// row lock. NotBefore (optional) carries Retry delays; ClaimsTable and
// MaxClaims (optional) move a job that keeps killing its process to the dead
// table.
var rowLockTable = inbox.Table{
	Name:        "jobs",
	NotBefore:   "not_before",
	ClaimsTable: "jobs_claims",
	MaxClaims:   5,
	DeadTable:   "jobs_dead",
}

// advisoryTable: naming the key column selects the advisory lock; a key on
// id holds each job alone.
var advisoryTable = inbox.Table{
	Name:        "jobs",
	AdvisoryKey: "id",
	NotBefore:   "not_before",
	DeadTable:   "jobs_dead",
}

// customerTable: the advisory lock keyed on a column of yours runs the jobs
// of one customer one at a time. Enqueue writes the key only as a data
// value, so the column is listed in Data; CheckSchema refuses a key column
// that Enqueue would leave without a value.
var customerTable = inbox.Table{
	Name:        "jobs",
	Data:        []string{"payload", "customer"},
	AdvisoryKey: "customer",
	NotBefore:   "not_before",
	DeadTable:   "jobs_dead",
}
