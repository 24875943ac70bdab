package inbox

import "time"

// SetHeldClock sets the clock by which q's advisory walk passes over keys
// it found held by another session (heldSet), so that a test decides when
// heldFor has passed.
func SetHeldClock(q *Queue, now func() time.Time) { q.elsewhere.clock = now }

// HeldFor is how long a key found held elsewhere is passed over.
const HeldFor = heldFor
