package worker

import (
	"context"
	"errors"

	"github.com/sqlinbox/inbox"
)

// A Listener relays wake-ups from other processes: on PostgreSQL, the
// notifications that Enqueue sends when [inbox.Config.NotifyChannel] is
// set. Listening needs the driver's own API (pgx's WaitForNotification,
// lib/pq's Listener), so this package defines only the interface; a module
// per driver implements it, importing that driver only:
// github.com/sqlinbox/inbox/listen/pgxlisten and
// github.com/sqlinbox/inbox/listen/pqlisten.
type Listener interface {
	// Listen calls wake for every notification on channel until ctx ends,
	// reconnecting when its connection is lost, and then returns. A
	// notification lost while it reconnects costs at most the loops'
	// fallback interval.
	Listen(ctx context.Context, channel string, wake func()) error
}

// Listen runs l on q's notification channel, waking q's idle loops
// ([inbox.Queue.Wake]), until ctx ends. Run it in a goroutine of your own,
// one per process. It returns an error at once when q has no
// [inbox.Config.NotifyChannel].
func Listen(ctx context.Context, q *inbox.Queue, l Listener) error {
	ch := q.Config().NotifyChannel
	if ch == "" {
		return errors.New("worker: listen: inbox.Config.NotifyChannel is empty")
	}
	return l.Listen(ctx, ch, q.Wake)
}
