package inbox

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"time"
)

// sessionCheckEvery is how often the keeper of an advisory delivery asks
// the session holding its lock whether it still answers.
const sessionCheckEvery = time.Second

// sessionPingLimit bounds one ping. Cutting a statement ends the session
// with most drivers (and the lock with it), so pings are never cut by the
// handler's context or the watch's end: only a session silent this long is
// given up.
const sessionPingLimit = 30 * time.Second

// sessionWatch is the advisory form's keeper. The job's lock lives with the
// session pinned to the delivery, and nothing else tells the holder when
// that session ends (a failover, a killed connection, a restarted server):
// the next claim takes the job while the first handler still runs it. Every
// sessionCheckEvery the watch pings the session, and cancels the handler's
// context with cause [ErrLeaseLost] once a ping fails before the delivery
// settled. A ping cannot see a lock the server dropped while the session
// lives, and a session that dies between two pings leaves the handler
// running until the next: it narrows the overlap to that interval.
//
// With the real clock no goroutine waits between pings: each is a timer's.
type sessionWatch struct {
	d      *Delivery
	conn   *sql.Conn
	cancel context.CancelCauseFunc // the handler's context
	done   chan struct{}           // closed by stop

	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
}

// watchSession starts the watch of d's session, whose failure cancels the
// handler's context through cancel, and returns the function that stops
// it. d.mu is held.
func (d *Delivery) watchSession(cancel context.CancelCauseFunc) func() {
	w := &sessionWatch{d: d, conn: d.adv.conn, cancel: cancel, done: make(chan struct{})}
	if d.q.after != nil {
		// A test clock's timers are channels: a goroutine waits on them.
		go func() {
			for {
				select {
				case <-w.done:
					return
				case <-d.q.after(sessionCheckEvery):
				}
				if !w.check() {
					return
				}
			}
		}()
	} else {
		// Under mu, as tick's re-arming: the timer may fire before the
		// assignment is done.
		w.mu.Lock()
		w.timer = time.AfterFunc(sessionCheckEvery, w.tick)
		w.mu.Unlock()
	}
	return w.stop
}

// tick is one ping of the real clock's watch, arming the next.
func (w *sessionWatch) tick() {
	if !w.check() {
		return
	}
	w.mu.Lock()
	if !w.stopped {
		w.timer = time.AfterFunc(sessionCheckEvery, w.tick)
	}
	w.mu.Unlock()
}

// check pings the session once. It reports whether to go on watching;
// false after it cancelled the handler, or once the watch has stopped.
func (w *sessionWatch) check() bool {
	pctx, done := context.WithTimeout(context.Background(), sessionPingLimit)
	err := w.conn.PingContext(pctx)
	done()
	w.mu.Lock()
	stopped := w.stopped
	w.mu.Unlock()
	if stopped {
		return false // the settlement has the session now
	}
	if err == nil {
		return true
	}
	w.d.mu.Lock()
	settled := w.d.settled
	w.d.mu.Unlock()
	if !settled {
		w.cancel(fmt.Errorf("%w: the session holding the job's advisory lock did not answer (%v); another worker may take the job", ErrLeaseLost, err))
	}
	return false
}

// stop ends the watch. A ping in flight runs to its end, its answer
// unheeded: cut, it would end the session.
func (w *sessionWatch) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	w.stopped = true
	if w.timer != nil {
		w.timer.Stop()
	}
	close(w.done)
}
