package pqlisten

import (
	"context"
	"net"
	"sync"
	"time"
)

// idleFor is how long a connection pinged after health of silence may wait
// for a byte: twice health, as a live one answers its ping well before.
func idleFor(health time.Duration) time.Duration {
	if idle := 2 * health; idle > health {
		return idle
	}
	return health // 2 × health overflowed
}

// idleDialer dials as lib/pq's own dialer does, and gives each connection
// a deadline from every read and write. The listener's pings keep a live
// connection talking; one that went silent without a word (a half-open
// TCP connection, behind a NAT or load balancer that forgot it) then fails
// and lib/pq reconnects. Without the deadline a ping waits on it forever,
// holding the pq.Listener's lock, and Close with it.
type idleDialer struct {
	idle time.Duration
}

func (d idleDialer) Dial(network, address string) (net.Conn, error) {
	return d.DialContext(context.Background(), network, address)
}

func (d idleDialer) DialTimeout(network, address string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return d.DialContext(ctx, network, address)
}

func (d idleDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	return &idleConn{Conn: c, idle: d.idle}, nil
}

// idleConn fails a read or write that waits idle without a byte. A
// deadline lib/pq sets itself (connect_timeout, for the handshake) still
// holds when it is the earlier.
type idleConn struct {
	net.Conn
	idle time.Duration

	mu  sync.Mutex
	set time.Time // lib/pq's deadline; zero for none
}

func (c *idleConn) Read(b []byte) (int, error) {
	if err := c.Conn.SetReadDeadline(c.deadline()); err != nil {
		return 0, err
	}
	return c.Conn.Read(b)
}

func (c *idleConn) Write(b []byte) (int, error) {
	if err := c.Conn.SetWriteDeadline(c.deadline()); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

func (c *idleConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	c.set = t
	c.mu.Unlock()
	return c.Conn.SetDeadline(t)
}

// deadline is idle from now, or lib/pq's deadline when that is earlier.
func (c *idleConn) deadline() time.Time {
	d := time.Now().Add(c.idle)
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.set.IsZero() && c.set.Before(d) {
		return c.set
	}
	return d
}
