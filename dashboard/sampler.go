package dashboard

import (
	"context"
	"sync"
	"time"
)

// Sample is one reading of a queue's state, kept for the charts.
type Sample struct {
	At time.Time `json:"at"`
	// Ready, Waiting, InWork and Dead are inbox.Stats' (-1: not known).
	Ready   int64 `json:"ready"`
	Waiting int64 `json:"waiting"`
	InWork  int64 `json:"in_work"`
	Dead    int64 `json:"dead"`
	// Done is QueueConfig.Done's reading (jobs acked or buried so far by
	// the process); -1 without it.
	Done int64 `json:"done"`
	// PerMinute is the throughput since the sample before: Done's growth
	// per minute; -1 when not known (the first sample, no Done, or a Done
	// that went back: a restart).
	PerMinute float64 `json:"per_minute"`
}

// history keeps each queue's samples of the last Config.Keep, oldest first.
type history struct {
	mu     sync.Mutex
	keep   time.Duration
	series map[string][]Sample
}

// add appends s to name's series, computing its throughput from the last
// sample and dropping the samples older than keep.
func (h *history) add(name string, s Sample) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ss := h.series[name]
	s.PerMinute = -1
	if n := len(ss); n > 0 && s.Done >= 0 && ss[n-1].Done >= 0 && s.Done >= ss[n-1].Done {
		if dt := s.At.Sub(ss[n-1].At); dt > 0 {
			s.PerMinute = float64(s.Done-ss[n-1].Done) / dt.Minutes()
		}
	}
	ss = append(ss, s)
	cut := 0
	for cut < len(ss) && s.At.Sub(ss[cut].At) > h.keep {
		cut++
	}
	// Copy down now and then, so that the slice does not grow forever.
	if cut > 0 && cut >= len(ss)/2 {
		ss = append(ss[:0:0], ss[cut:]...)
	} else {
		ss = ss[cut:]
	}
	h.series[name] = ss
}

// get returns a copy of name's samples.
func (h *history) get(name string) []Sample {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Sample(nil), h.series[name]...)
}

// last returns the time of the last sample of any queue.
func (h *history) last() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	var t time.Time
	for _, ss := range h.series {
		if n := len(ss); n > 0 && ss[n-1].At.After(t) {
			t = ss[n-1].At
		}
	}
	return t
}

// Sample reads every queue's state once and keeps it for the charts. The
// handler calls it itself when a page or the history is asked for and the
// last sample is older than Config.SampleEvery; [Handler.Run] calls it on a
// ticker.
func (h *Handler) Sample(ctx context.Context) {
	h.sample(ctx, false)
}

// sample samples every queue; ifDue only when the last sample is older than
// the interval, checked under the lock so that concurrent requests take one.
func (h *Handler) sample(ctx context.Context, ifDue bool) {
	h.sampleMu.Lock()
	defer h.sampleMu.Unlock()
	if ifDue && h.now().Sub(h.hist.last()) < h.every {
		return
	}
	for _, q := range h.queues {
		st, err := q.Queue.Stats(ctx)
		if err != nil {
			continue // the page shows the error; the chart has a gap
		}
		s := Sample{At: h.now().UTC(), Ready: st.Ready, Waiting: st.Waiting, InWork: st.InWork, Dead: st.Dead, Done: -1}
		if q.Done != nil {
			s.Done = int64(q.Done())
		}
		h.hist.add(q.Name, s)
	}
}

// sampleViews keeps the page's readings as samples: each queue's when the
// last sample is older than the interval or counts otherwise than the
// reading (an action since, or a busy queue), so that the chart's line
// ends where the page's table and the legend (charts) read, with no
// second read.
func (h *Handler) sampleViews(views []queueView) {
	h.sampleMu.Lock()
	defer h.sampleMu.Unlock()
	due := h.now().Sub(h.hist.last()) >= h.every
	for i, v := range views {
		if v.Err != "" {
			continue // the page shows the error; the chart has a gap
		}
		q := h.queues[i]
		s := Sample{At: h.now().UTC(), Ready: v.Stats.Ready, Waiting: v.Stats.Waiting, InWork: v.Stats.InWork, Dead: v.Stats.Dead, Done: -1}
		if q.Done != nil {
			s.Done = int64(q.Done())
		}
		if ss := h.hist.get(q.Name); !due && len(ss) > 0 && sameCounts(ss[len(ss)-1], s) {
			continue
		}
		h.hist.add(q.Name, s)
	}
}

// sameCounts tells whether two samples count the same jobs.
func sameCounts(a, b Sample) bool {
	return a.Ready == b.Ready && a.Waiting == b.Waiting && a.InWork == b.InWork && a.Dead == b.Dead
}

// sampleIfDue samples when the last sample is older than the interval:
// without a Run loop, the charts fill while someone looks.
func (h *Handler) sampleIfDue(ctx context.Context) {
	h.sample(ctx, true)
}

// Run samples every Config.SampleEvery, in the caller's goroutine, until ctx
// ends; then it returns ctx's error. It is optional: without it the handler
// samples on the requests it serves, so the charts show only the times when
// someone looked.
func (h *Handler) Run(ctx context.Context) error {
	t := time.NewTicker(h.every)
	defer t.Stop()
	h.Sample(ctx)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			h.Sample(ctx)
		}
	}
}
