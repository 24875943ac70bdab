package periodic

import "github.com/sqlinbox/inbox/dialect"

// postgresSQL is the state table on PostgreSQL.
var postgresSQL = engine{
	mark: dialect.Dollar,
	// A parameter in a CASE whose results are all parameters would be
	// resolved as text, which a timestamptz column does not take.
	caseTime: "CAST(%s AS timestamptz)",
	// ON CONFLICT DO NOTHING skips a name that is there, or that a
	// concurrent registration inserts first (it waits for that one to
	// commit), and fails on nothing else.
	ignore: " ON CONFLICT (name) DO NOTHING",
	ddl: `CREATE TABLE IF NOT EXISTS %s (
    name text PRIMARY KEY,
    last_tick timestamptz NOT NULL
)`,
}
