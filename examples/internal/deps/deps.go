// Package deps is a placeholder: blank imports that keep the driver
// requirements in go.mod until the real examples exist. Delete it once they do.
package deps

import (
	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"
	_ "github.com/mattn/go-sqlite3"
	_ "modernc.org/sqlite"
)
