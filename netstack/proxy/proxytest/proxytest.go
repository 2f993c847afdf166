// Package proxytest has in-memory doubles for testing weir/netstack/proxy and
// weir/netstack/proxy/http without a TCP/IP stack: a full-duplex connection
// with half-close and deadlines whose ends are proxy.Clients and
// proxy.Legs (Pipe), a proxy.Dialer whose dials a test accepts like a
// listener's connections (Listener: an http.Server can serve them), and a
// manual clock (Clock) for proxy.Options.Now.
package proxytest

import (
	"context"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"weir/netstack/proxy"
)

// Conn is one end of a Pipe: a proxy.Client (and so a proxy.Leg) over two
// synchronous net.Pipes, one per direction, so that each direction closes
// on its own (CloseWrite). A Write blocks until the far end has read it.
// Its counters are zero: it has no segments.
type Conn struct {
	in  net.Conn // what the far end writes
	out net.Conn // what the far end reads

	peerFIN atomic.Bool // a Read saw the far end's CloseWrite (or its close)
	reset   atomic.Bool
}

var _ proxy.Client = (*Conn)(nil)

// Pipe returns the two ends of a new in-memory connection.
func Pipe() (a, b *Conn) {
	aIn, bOut := net.Pipe()
	bIn, aOut := net.Pipe()
	return &Conn{in: aIn, out: aOut}, &Conn{in: bIn, out: bOut}
}

// Read implements net.Conn.
func (c *Conn) Read(p []byte) (int, error) {
	n, err := c.in.Read(p)
	if err == io.EOF {
		c.peerFIN.Store(true)
	}
	return n, err
}

// Write implements net.Conn.
func (c *Conn) Write(p []byte) (int, error) { return c.out.Write(p) }

// CloseWrite implements proxy.Leg: the far end reads EOF.
func (c *Conn) CloseWrite() error { return c.out.Close() }

// Close implements net.Conn: both directions close.
func (c *Conn) Close() error {
	err := c.in.Close()
	if e := c.out.Close(); err == nil {
		err = e
	}
	return err
}

// LocalAddr implements net.Conn.
func (c *Conn) LocalAddr() net.Addr { return c.in.LocalAddr() }

// RemoteAddr implements net.Conn.
func (c *Conn) RemoteAddr() net.Addr { return c.in.RemoteAddr() }

// SetDeadline implements net.Conn.
func (c *Conn) SetDeadline(t time.Time) error {
	err := c.in.SetDeadline(t)
	if e := c.out.SetDeadline(t); err == nil {
		err = e
	}
	return err
}

// SetReadDeadline implements net.Conn.
func (c *Conn) SetReadDeadline(t time.Time) error { return c.in.SetReadDeadline(t) }

// SetWriteDeadline implements net.Conn.
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.out.SetWriteDeadline(t) }

// Counters implements proxy.Leg: zero, a pipe has no segments.
func (c *Conn) Counters() proxy.LegCounters { return proxy.LegCounters{} }

// ReadLent implements proxy.Leg: a pipe cannot wait without reading, so it
// keeps its buffer (proxy.ReadHeld).
func (c *Conn) ReadLent(pool *sync.Pool, bp *[]byte) (*[]byte, int, error) {
	return proxy.ReadHeld(c, pool, bp)
}

// Reset implements proxy.Client: it closes both directions (a pipe has no
// RST) and records the reset.
func (c *Conn) Reset() {
	c.reset.Store(true)
	_ = c.Close()
}

// WasReset reports whether Reset was called.
func (c *Conn) WasReset() bool { return c.reset.Load() }

// PeerClosed implements proxy.Client: a Read has seen the far end's
// CloseWrite or close.
func (c *Conn) PeerClosed() bool { return c.peerFIN.Load() }

// Segments implements proxy.Client: 0.
func (c *Conn) Segments() uint64 { return 0 }

// Closing implements proxy.Client: nothing to do.
func (c *Conn) Closing() {}

// Listener is a proxy.Dialer whose dials a test accepts, as a net.Listener's
// connections: each DialTarget makes a Pipe, returns one end and hands the
// other to Accept (it waits for Accept, the dial's context or Close). The
// dialed address is not used.
type Listener struct {
	ch   chan *Conn
	done chan struct{}
	once sync.Once
}

var (
	_ proxy.Dialer = (*Listener)(nil)
	_ net.Listener = (*Listener)(nil)
)

// NewListener returns a Listener.
func NewListener() *Listener {
	return &Listener{ch: make(chan *Conn), done: make(chan struct{})}
}

// DialTarget implements proxy.Dialer.
func (l *Listener) DialTarget(ctx context.Context, _ netip.AddrPort) (proxy.Leg, error) {
	a, b := Pipe()
	select {
	case l.ch <- b:
		return a, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Accept implements net.Listener: the far end of the next dial.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener: dials and Accepts fail from now on.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr implements net.Listener.
func (l *Listener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }

// Clock is a manual clock for proxy.Options.Now: it moves only when the
// test advances it. The zero value is not ready; use NewClock.
type Clock struct {
	mu sync.Mutex
	t  time.Time // protected by mu
}

// NewClock returns a clock at a fixed instant.
func NewClock() *Clock { return &Clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}
