package proxy

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// echo serves connections that write back what they read, until closed.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

func roundTrip(t *testing.T, c net.Conn, msg string, wait time.Duration) (string, error) {
	t.Helper()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, len(msg))
	n, err := io.ReadFull(c, buf)
	return string(buf[:n]), err
}

func TestPartitionHoldsAndHeals(t *testing.T) {
	p, err := New(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := roundTrip(t, c, "one", 10*time.Second); err != nil || got != "one" {
		t.Fatalf("before the partition: %q, %v", got, err)
	}
	p.Partition()
	// Nothing may come back while partitioned, and the socket stays open:
	// the read times out rather than ending.
	got, err := roundTrip(t, c, "two", 300*time.Millisecond)
	if !errors.Is(err, os.ErrDeadlineExceeded) || got != "" {
		t.Fatalf("during the partition: %q, %v; want nothing and a timeout", got, err)
	}
	// A connection made during the partition is accepted but carries nothing.
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if got, err := roundTrip(t, c2, "new", 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) || got != "" {
		t.Fatalf("new connection during the partition: %q, %v", got, err)
	}
	p.Heal()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 3)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "two" {
		t.Fatalf("held bytes after healing: %q, %v", buf, err)
	}
	c2.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c2, buf); err != nil || string(buf) != "new" {
		t.Fatalf("held bytes of the new connection after healing: %q, %v", buf, err)
	}
	if n := p.Conns(); n != 2 {
		t.Fatalf("Conns = %d, want 2", n)
	}
	p.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(buf); !errors.Is(err, io.EOF) {
		t.Fatalf("after Close: %v, want EOF", err)
	}
}
