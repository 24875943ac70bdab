package connhook

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// TestWatch: only watched statements count, and Wait returns once the
// count is reached, from runs seen before it was called or after.
func TestWatch(t *testing.T) {
	w := NewWatch()
	w.Add("SELECT claim")
	w.Saw("SELECT claim")
	w.Saw("SELECT other")
	if n := w.Count(); n != 1 {
		t.Fatalf("Count() = %d after one watched run and one other, want 1", n)
	}
	w.Wait(t, 1, time.Minute)
	go func() {
		w.Saw("SELECT other")
		w.Saw("SELECT claim")
		w.Saw("SELECT claim")
	}()
	w.Wait(t, 3, time.Minute)
	if n := w.Count(); n != 3 {
		t.Errorf("Count() = %d, want 3", n)
	}
}

// fatalRecorder stops its goroutine at Fatalf, noting the message.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatalf(format string, a ...any) {
	f.msg = fmt.Sprintf(format, a...)
	runtime.Goexit()
}

// TestWatchTimeout: Wait fails its test when the count is not reached.
func TestWatchTimeout(t *testing.T) {
	w := NewWatch()
	w.Add("SELECT claim")
	w.Saw("SELECT claim")
	f := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Wait(f, 2, time.Millisecond)
	}()
	<-done
	if want := "waited 1ms for 2 runs of the watched statements, saw 1"; f.msg != want {
		t.Errorf("Wait failed with %q, want %q", f.msg, want)
	}
}
