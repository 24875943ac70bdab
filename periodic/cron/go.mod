module github.com/sqlinbox/inbox/periodic/cron

// As low as the root's: the package needs nothing newer, and the test
// drivers are versions that declare no more (go-sql-driver/mysql 1.9; the
// workspace builds with the repository's newer ones).
go 1.21.0

// The tests run on the packages in this repository.
replace github.com/sqlinbox/inbox => ../..

require (
	github.com/go-sql-driver/mysql v1.9.3
	github.com/lib/pq v1.12.3
	github.com/mattn/go-sqlite3 v1.14.53
	github.com/robfig/cron/v3 v3.0.1
	github.com/sqlinbox/inbox v0.0.0-00010101000000-000000000000
)

require filippo.io/edwards25519 v1.1.0 // indirect
