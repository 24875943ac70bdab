// Package quiet is a passing package that go test reports after skipping's
// (TestNoticeInPipedRun).
package quiet

import "testing"

func TestQuiet(t *testing.T) {}
