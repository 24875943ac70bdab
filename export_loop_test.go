package inbox

// The schema check's first statements, for the worker loop's tests in
// package inbox_test: the loop runs the check after an error.
const (
	ServerProbe = serverProbe
	SQLiteProbe = sqliteProbe
)
