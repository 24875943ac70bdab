package listentest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/worker"
)

// HalfOpen: the listener's connection goes silent without a word, as
// behind a NAT or load balancer that forgot it: a proxy between the
// listener and the server drops every byte of it from then on, both ways,
// and closes nothing. With HealthCheck at 250 ms (far above a ping's
// round trip, even on a loaded machine) the listener finds it dead
// by its pings, reports it, connects again through the proxy, and wakes
// the loops, so that a job enqueued after the cut is handled (the fallback
// poll is ten minutes); notifications then arrive on the new connection,
// and the listener returns when its context ends, leaving no goroutine.
func HalfOpen(t *testing.T, d Driver) {
	_, wdb, wq, count, odb, oq := setup(t, d, "halfopen")
	leaks := d.NoLeaks(t)
	p := startProxy(t, dsn(t))
	app := fmt.Sprintf("inbox_halfopen_%s_%d", d.Name, os.Getpid())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wakes := make(chan struct{}, 8)
	lost := make(chan error, 8)
	l := d.Listener(withAppName(t, p.dsn, app), health, report(lost))
	listened := started(func() error { return worker.Listen(ctx, wq, observed{l, wakes}) })
	recv(t, wakes, "the listener to listen")
	handled := make(chan any, 2)
	worked := started(func() error {
		return worker.Run(ctx, wq, worker.Config{Poll: never}, func(_ context.Context, del *inbox.Delivery) error {
			handled <- del.ID()
			return nil
		})
	})
	count.Wait(t, 1, deadline)

	old := listenerPID(t, odb, app, 0)
	if n := p.blackhole(); n != 1 {
		t.Fatalf("%d connections through the proxy, want the listener's one", n)
	}
	id := enqueueQuietly(t, odb, oq)
	if got := recv(t, handled, "the job enqueued after the connection went silent"); got != id {
		t.Errorf("handled %v, want %v", got, id)
	}
	t.Logf("the listener reported: %v", recv(t, lost, "the listener to report the silent connection"))

	// A new session listens (the old one lives on, behind the black hole),
	// and notifications arrive again.
	pid := listenerPID(t, odb, app, old)
	drain(wakes)
	drain(lost)
	if _, err := odb.Exec("SELECT pg_notify($1, '')", channel); err != nil {
		t.Fatal(err)
	}
	recv(t, wakes, "a notification on the new connection")
	keptAlive(t, p, p.linkOf(t, odb, pid), lost)

	cancel()
	if err := recv(t, worked, "Run to return"); err != nil {
		t.Errorf("Run: %v", err)
	}
	if err := recv(t, listened, "Listen to return"); err != nil {
		t.Errorf("Listen: %v", err)
	}
	wdb.Close()
	p.close()
	leaks()
}

// health is the listeners' HealthCheck in HalfOpen.
const health = 250 * time.Millisecond

// keptAlive checks that the pings keep a quiet connection: five more of the
// listener's messages (its pings, 1.25 s at least, well past the 500 ms a
// pqlisten connection may stay idle) pass through connection l, and the
// listener neither loses it nor opens another.
func keptAlive(t *testing.T, p *proxy, l *link, lost <-chan error) {
	t.Helper()
	n := p.connections()
	from := l.sent.Load()
	untilOK(t, "five pings on the quiet connection", func() error {
		select {
		case err := <-lost:
			t.Fatalf("the listener lost its quiet connection: %v", err)
		default:
		}
		if got := l.sent.Load() - from; got < 5 {
			return fmt.Errorf("%d messages from the listener", got)
		}
		return nil
	})
	if got := p.connections(); got != n {
		t.Errorf("%d connections through the proxy, %d before the pings", got, n)
	}
}

// proxy forwards TCP connections to the server; blackhole makes the
// connections open at the time drop all their bytes from then on.
type proxy struct {
	ln    net.Listener
	dsn   string // the test's DSN, through the proxy
	wg    sync.WaitGroup
	mu    sync.Mutex
	links []*link
}

// link is one connection through the proxy: its two ends and whether its
// bytes are dropped.
type link struct {
	client, server net.Conn
	dropped        atomic.Bool
	sent           atomic.Int64 // reads from the client forwarded
}

// startProxy listens on a local port, forwarding to dsn's server.
func startProxy(t *testing.T, dsn string) *proxy {
	t.Helper()
	target, via, err := rehost(dsn)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, dsn: via(ln.Addr().String())}
	t.Cleanup(p.close)
	p.wg.Add(1)
	go p.accept(target)
	return p
}

func (p *proxy) accept(target string) {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		s, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			continue
		}
		l := &link{client: c, server: s}
		p.mu.Lock()
		p.links = append(p.links, l)
		p.mu.Unlock()
		p.wg.Add(2)
		go l.pipe(&p.wg, s, c, &l.sent)
		go l.pipe(&p.wg, c, s, new(atomic.Int64))
	}
}

// pipe copies from src to dst until either fails, dropping what it reads
// once the link is dropped, counting the reads it forwards.
func (l *link) pipe(wg *sync.WaitGroup, dst io.Writer, src io.Reader, forwarded *atomic.Int64) {
	defer wg.Done()
	defer l.client.Close()
	defer l.server.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !l.dropped.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			forwarded.Add(1)
		}
		if err != nil {
			return
		}
	}
}

// blackhole drops the bytes of every connection open now, and returns
// their number.
func (p *proxy) blackhole() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.links {
		l.dropped.Store(true)
	}
	return len(p.links)
}

// linkOf returns the connection through the proxy of the session pid.
func (p *proxy) linkOf(t *testing.T, db *sql.DB, pid int) *link {
	t.Helper()
	var port int
	if err := db.QueryRow("SELECT client_port FROM pg_stat_activity WHERE pid = $1", pid).Scan(&port); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.links {
		if a, ok := l.server.LocalAddr().(*net.TCPAddr); ok && a.Port == port {
			return l
		}
	}
	t.Fatalf("no connection through the proxy from port %d, session %d's", port, pid)
	return nil
}

// connections returns the number of connections made through the proxy.
func (p *proxy) connections() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// close closes the listening socket and every connection, and waits for
// the proxy's goroutines.
func (p *proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, l := range p.links {
		l.client.Close()
		l.server.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// rehost returns the TCP address of dsn's server, and a function giving
// dsn with that address replaced (a URL, or key=value pairs).
func rehost(dsn string) (string, func(addr string) string, error) {
	if strings.Contains(dsn, "://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", nil, err
		}
		target := u.Host
		if u.Port() == "" {
			target = net.JoinHostPort(u.Hostname(), "5432")
		}
		return target, func(addr string) string {
			v := *u
			v.Host = addr
			return v.String()
		}, nil
	}
	host, port := "", "5432"
	for _, f := range strings.Fields(dsn) {
		if k, v, ok := strings.Cut(f, "="); ok && k == "host" {
			host = v
		} else if ok && k == "port" {
			port = v
		}
	}
	if host == "" || strings.HasPrefix(host, "/") {
		return "", nil, errors.New("listentest: the half-open test needs INBOX_POSTGRES_DSN to name a TCP host")
	}
	return net.JoinHostPort(host, port), func(addr string) string {
		h, p, _ := net.SplitHostPort(addr)
		return fmt.Sprintf("%s host=%s port=%s", dsn, h, p)
	}, nil
}
