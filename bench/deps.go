// Placeholder: blank imports that keep the driver requirements in go.mod
// until the real benchmark exists. Delete this file once it does.
package bench

import (
	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"
	_ "github.com/mattn/go-sqlite3"
	_ "modernc.org/sqlite"
)
