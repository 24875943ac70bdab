package dashboard

import (
	"context"
	"errors"
	"fmt"

	"github.com/sqlinbox/inbox"
)

// pausable reports whether q can be paused: a [Pauser] whose description,
// where it tells one (*inbox.Queue's Config), names a control table.
func pausable(q Queue) bool {
	if _, ok := q.(Pauser); !ok {
		return false
	}
	if c, ok := q.(interface{ Config() inbox.Config }); ok {
		return c.Config().Table.ControlTable != ""
	}
	return true
}

// pauseAction pauses or resumes q, naming the dashboard as who paused.
func pauseAction(ctx context.Context, q *QueueConfig, action string) result {
	p, ok := q.Queue.(Pauser)
	if !ok || !pausable(q.Queue) {
		return result{Text: fmt.Sprintf("bad request: queue %s cannot be paused (name inbox.Table.ControlTable); nothing was changed", q.Name)}
	}
	var err error
	if action == "pause" {
		err = p.Pause(ctx, "dashboard")
	} else {
		err = p.Resume(ctx)
	}
	switch {
	case errors.Is(err, inbox.ErrNoControlTable):
		return result{Text: fmt.Sprintf("bad request: queue %s cannot be paused (name inbox.Table.ControlTable); nothing was changed", q.Name)}
	case err != nil:
		return result{Text: "failed: " + err.Error()}
	case action == "pause":
		return result{OK: true, Text: fmt.Sprintf("paused %s: its workers claim no job until it is resumed", q.Name)}
	}
	return result{OK: true, Text: fmt.Sprintf("resumed %s", q.Name)}
}
