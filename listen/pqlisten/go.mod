module github.com/sqlinbox/inbox/listen/pqlisten

go 1.21

// The tests run on the package in this repository.
replace github.com/sqlinbox/inbox => ../../

require (
	github.com/lib/pq v1.12.3
	github.com/sqlinbox/inbox v0.0.0-00010101000000-000000000000
	go.uber.org/goleak v1.3.0
)
