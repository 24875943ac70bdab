// Package proxy is a loopback TCP proxy for tests that can stop forwarding,
// in both directions and for every connection, without closing a socket,
// and later forward again: a network partition as the client and the server
// see it, with nothing refused or reset.
package proxy

import (
	"net"
	"sync"
)

// Proxy forwards connections accepted on a loopback port to a target
// address. It is safe for concurrent use.
type Proxy struct {
	ln     net.Listener
	target string

	mu          sync.Mutex
	cond        *sync.Cond // signalled when partitioned or closed changes
	partitioned bool
	closed      bool
	conns       map[net.Conn]struct{}
	wg          sync.WaitGroup
}

// New listens on 127.0.0.1 on a free port and forwards to target.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Partition stops forwarding: bytes already read are held, nothing more is
// written either way, and every socket stays open. New connections are
// accepted but their bytes are held too.
func (p *Proxy) Partition() {
	p.mu.Lock()
	p.partitioned = true
	p.mu.Unlock()
}

// Heal forwards again, starting with the bytes held.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.partitioned = false
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Conns reports how many client connections are open.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns) / 2
}

// Close stops listening, closes every connection and waits for the
// proxy's goroutines to end.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			s.Close()
			return
		}
		p.conns[c], p.conns[s] = struct{}{}, struct{}{}
		p.mu.Unlock()
		var once sync.Once
		done := func() {
			once.Do(func() {
				c.Close()
				s.Close()
				p.mu.Lock()
				delete(p.conns, c)
				delete(p.conns, s)
				p.mu.Unlock()
			})
		}
		p.wg.Add(2)
		go p.pipe(s, c, done)
		go p.pipe(c, s, done)
	}
}

// pipe copies src to dst, holding each chunk while the proxy is
// partitioned. When either side ends, both connections close.
func (p *Proxy) pipe(dst, src net.Conn, done func()) {
	defer p.wg.Done()
	defer done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.gate() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// gate waits while the proxy is partitioned, reporting false once it is
// closed.
func (p *Proxy) gate() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.partitioned && !p.closed {
		p.cond.Wait()
	}
	return !p.closed
}
