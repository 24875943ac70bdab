package worker

import (
	"container/heap"
	"sync"
	"time"

	"github.com/sqlinbox/inbox"
)

// dueWaker wakes a queue's idle loops when jobs its loops delayed become
// due (a retry's backoff), whatever their fallback interval: a 300 ms
// backoff under a 5 s Poll started after 4.5 to 5.3 s. One timer serves the
// loops of a poll duty, set to the earliest time it knows of; the times
// after it wait in a heap of at most maxDue (beyond, the fallback interval
// finds the job).
type dueWaker struct {
	q *inbox.Queue

	mu    sync.Mutex
	times dueHeap
	timer *time.Timer
	at    time.Time // what timer is set for; zero when unset
}

const maxDue = 4096

// add schedules a wake-up at t.
func (w *dueWaker) add(t time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.times) >= maxDue {
		return
	}
	heap.Push(&w.times, t)
	w.armLocked()
}

// armLocked sets the timer for the earliest time, if it is not set so.
func (w *dueWaker) armLocked() {
	if len(w.times) == 0 {
		return
	}
	first := w.times[0]
	if !w.at.IsZero() && !first.Before(w.at) {
		return
	}
	w.at = first
	d := time.Until(first)
	if w.timer == nil {
		w.timer = time.AfterFunc(d, w.fire)
	} else {
		w.timer.Reset(d)
	}
}

// fire wakes the loops for every time now past, and sets the timer for
// the next.
func (w *dueWaker) fire() {
	w.mu.Lock()
	now := time.Now()
	for len(w.times) > 0 && !w.times[0].After(now) {
		heap.Pop(&w.times)
	}
	w.at = time.Time{}
	w.armLocked()
	w.mu.Unlock()
	w.q.Wake()
}

// stop disarms the timer, when the last loop of the duty returns.
func (w *dueWaker) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.timer != nil {
		w.timer.Stop()
	}
	w.times, w.at = nil, time.Time{}
}

type dueHeap []time.Time

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].Before(h[j]) }
func (h dueHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *dueHeap) Push(x any)        { *h = append(*h, x.(time.Time)) }
func (h *dueHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	*h = old[:len(old)-1]
	return t
}
