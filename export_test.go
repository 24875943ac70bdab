package inbox

import "time"

// SetHeldClock sets the clock by which q's advisory walk passes over keys
// it found held by another session (heldSet), so that a test decides when
// heldFor has passed.
func SetHeldClock(q *Queue, now func() time.Time) { q.elsewhere.clock = now }

// HeldFor is how long a key found held elsewhere is passed over.
const HeldFor = heldFor

// Linger marks key (of q's table, whose identity a claim has resolved) as
// held by a session of this process that is letting it go, as unlock does
// between the set's drop and the session's unlock; the func ends the mark.
func Linger(q *Queue, key string) func() {
	inProcess := q.ident + "\x00" + key
	q.keys.linger(inProcess)
	return func() { q.keys.unlinger(inProcess) }
}
