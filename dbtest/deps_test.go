// Placeholder: blank imports that keep the driver requirements in go.mod
// until the real database tests exist. Delete this file once they do.
package dbtest

import (
	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"
	_ "github.com/mattn/go-sqlite3"
	_ "go.uber.org/goleak"
	_ "modernc.org/sqlite"
)
