package pqlisten

import (
	"errors"
	"math"
	"net"
	"os"
	"testing"
	"time"
)

// A read that waits idle without a byte fails; one that gets bytes does
// not; a deadline set by lib/pq that comes first holds.
func TestIdleConn(t *testing.T) {
	for _, c := range []struct {
		name     string
		idle     time.Duration
		deadline time.Duration // lib/pq's, from now; zero for none
	}{
		{"idle", 20 * time.Millisecond, 0},
		{"lib/pq's deadline first", time.Hour, 20 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			client, server := net.Pipe()
			defer server.Close()
			conn := &idleConn{Conn: client, idle: c.idle}
			defer conn.Close()
			if c.deadline > 0 {
				if err := conn.SetDeadline(time.Now().Add(c.deadline)); err != nil {
					t.Fatal(err)
				}
			}
			go func() { _, _ = server.Write([]byte("x")) }()
			buf := make([]byte, 1)
			if _, err := conn.Read(buf); err != nil {
				t.Fatalf("a read with a byte to read: %v", err)
			}
			done := make(chan error, 1)
			go func() {
				_, err := conn.Read(buf)
				done <- err
			}()
			select {
			case err := <-done:
				if !errors.Is(err, os.ErrDeadlineExceeded) {
					t.Errorf("a silent read: %v, want a timeout", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("a silent read still waits after 30 s")
			}
		})
	}
}

func TestIdleFor(t *testing.T) {
	for _, c := range []struct{ health, want time.Duration }{
		{30 * time.Second, time.Minute},
		{math.MaxInt64, math.MaxInt64},
	} {
		if got := idleFor(c.health); got != c.want {
			t.Errorf("idleFor(%v) = %v, want %v", c.health, got, c.want)
		}
	}
}
