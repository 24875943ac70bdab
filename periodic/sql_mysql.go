package periodic

import "github.com/sqlinbox/inbox/dialect"

// mysqlSQL is the state table on MySQL and MariaDB, whose SQL is the same.
// Times are DATETIME(6) holding UTC, passed as text by the queue's dialect.
var mysqlSQL = engine{
	mark: dialect.Question,
	// Text converts to DATETIME(6) on assignment.
	caseTime: "%s",
	// Not INSERT IGNORE, which turns other errors (a name too long) into
	// warnings too. ON DUPLICATE KEY UPDATE takes an exclusive lock on the
	// duplicate at once, where a plain INSERT's shared lock would deadlock
	// two processes registering the same entries together.
	ignore: " ON DUPLICATE KEY UPDATE name = name",
	// InnoDB: the compare-and-set and the job commit in one transaction.
	// Entry names are ASCII, so any character set and collation hold them.
	ddl: `CREATE TABLE IF NOT EXISTS %s (
    name VARCHAR(200) NOT NULL PRIMARY KEY,
    last_tick DATETIME(6) NOT NULL
) ENGINE=InnoDB`,
}
