package periodic

import "github.com/sqlinbox/inbox/dialect"

// sqliteSQL is the state table on SQLite. Times are TEXT in
// inbox.SQLiteTimeFormat, fixed-width UTC, compared as text by equality
// only.
var sqliteSQL = engine{
	mark:     dialect.Question,
	caseTime: "%s",
	// SQLite 3.24's upsert; the package needs 3.35 anyway.
	ignore: " ON CONFLICT (name) DO NOTHING",
	ddl: `CREATE TABLE IF NOT EXISTS %s (
    name TEXT NOT NULL PRIMARY KEY,
    last_tick TEXT NOT NULL
)`,
}
