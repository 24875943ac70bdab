package browsertest

import "flag"

// The pictures of docs/operations.md are this package's: go generate in
// this directory takes them all again from the views as they are now.
//go:generate go test -count=1 -run ^(TestScreenshot|TestBrowseJobs|TestPauseResume)$/^sqlite$ . -args -screenshot ../../docs/dashboard.png -screenshot-jobs ../../docs/dashboard-jobs.png -screenshot-job ../../docs/dashboard-job.png -screenshot-paused ../../docs/dashboard-paused.png

var screenshotPaused = flag.String("screenshot-paused", "", "TestPauseResume writes the paused page's PNG here (SQLite)")
