module github.com/sqlinbox/inbox

go 1.21

require github.com/DATA-DOG/go-sqlmock v1.5.2
