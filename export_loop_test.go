package inbox

// The schema check's first statements, for the worker loop's tests in
// package inbox_test: the loop runs the check after an error.
const (
	PgProbe     = pgProbe
	MyProbe     = myProbe
	SQLiteProbe = sqliteProbe
)

// The Postgres batch statements' condition and arguments (batch_test.go),
// for the loop's pins.
var (
	PgBatchWhere = pgBatchWhere
	PgBatchArgs  = pgBatchArgs
)
