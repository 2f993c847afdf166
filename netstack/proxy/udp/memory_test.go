package udp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"weir/netstack/proxy"
	"weir/policy"
)

// BenchmarkSessionMemory opens b.N sessions in one Relay, each from a new
// (spoofed) client address and port, each with its target socket and
// reader goroutine, and reports what one session holds once the table is
// built and a GC has run: Go heap and goroutine stack bytes per session,
// and goroutines per session. The target sockets are memNet's (in memory:
// no kernel socket, whose memory the kernel holds and this does not
// count); every session's first datagram goes to its target and the
// target's reply comes back to the client before the memory is read. The
// issue's figure is at a million sessions (about 4 GiB at the peak):
//
//	go test -run '^$' -bench SessionMemory -benchtime 1000000x ./netstack/proxy/udp/
//
// ns/op is the time to create one session (admit, dial, enter the table
// and the expiry heap, start its reader, relay its first datagram).
func BenchmarkSessionMemory(b *testing.B) {
	n := b.N
	mn := newMemNet()
	defer mn.close()
	target := netip.MustParseAddrPort("198.18.1.1:53")
	mn.serve(target)
	vs := &policy.VirtualServer{Name: "dns", Proto: policy.ProtoUDP,
		UDP:     policy.UDPOptions{IdleTimeout: 30 * time.Second},
		Targets: []*policy.Target{{Name: "t", Addr: target, Weight: 1}}}
	clock := &manualClock{now: time.Unix(1000, 0)}
	var rep countReplier
	r := New(Options{Admitter: &lightAdmitter{}, Host: mn, MaxSessions: n, Now: clock.Now})
	vip := netip.MustParseAddrPort("198.18.0.53:53")
	q := []byte("a query of some 32 bytes, as DNS")

	var before, after runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&before)
	g0 := runtime.NumGoroutine()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range n {
		r.Datagram(&rep, spoofed(i), vip, vs, q)
	}
	b.StopTimer()
	// Every first datagram answered (or lost in the target's full queue,
	// as a socket buffer loses it) before the memory is read: the readers
	// are back waiting, holding no buffer.
	deadline := time.Now().Add(time.Minute)
	for rep.n.Load()+mn.dropped.Load() < uint64(n) {
		if time.Now().After(deadline) {
			b.Fatalf("after a minute %d of %d replies relayed, %d lost", rep.n.Load(), n, mn.dropped.Load())
		}
		time.Sleep(time.Millisecond)
	}
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&after)
	gs := runtime.NumGoroutine() - g0
	st := r.Stats()
	if st.Sessions != int64(n) || st.Created != uint64(n) {
		b.Fatalf("stats %+v, want %d sessions", st, n)
	}
	heap := float64(int64(after.HeapInuse)-int64(before.HeapInuse)) / float64(n)
	stack := float64(int64(after.StackInuse)-int64(before.StackInuse)) / float64(n)
	b.ReportMetric(heap+stack, "bytes/session")
	b.ReportMetric(heap, "heap-bytes/session")
	b.ReportMetric(stack, "stack-bytes/session")
	b.ReportMetric(float64(gs)/float64(n), "goroutines/session")
	if n >= 100000 {
		b.Logf("%d sessions: %.0f bytes each (%.0f heap, %.0f goroutine stack), %.2f goroutines each; %d replies relayed, %d lost in the target's queue",
			n, heap+stack, heap, stack, float64(gs)/float64(n), rep.n.Load(), mn.dropped.Load())
	}
	r.Close()
	if st := r.Stats(); st.Sessions != 0 || st.EndedClosed != uint64(n) {
		b.Fatalf("after Close: %+v", st)
	}
}

// BenchmarkSessionMemoryHost is BenchmarkSessionMemory with weir's real
// host dialer (a connected kernel socket per session) to an echo server on
// the loopback: what a via: host session costs in Go (its net.UDPConn and
// poller state on top of the relay's) and, read off /proc/meminfo's Slab,
// in the kernel (system-wide: other processes' allocations are in it, so
// on a shared machine it is orientation). b.N is bounded by the file
// limit (two descriptors per session with the echo server's side; the
// benchmark stops at the limit):
//
//	go test -run '^$' -bench SessionMemoryHost -benchtime 10000x ./netstack/proxy/udp/
func BenchmarkSessionMemoryHost(b *testing.B) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		b.Fatal(err)
	}
	if uint64(b.N)+256 > lim.Cur {
		b.Skipf("skipping: %d sessions need %d descriptors, the limit is %d (ulimit -n)", b.N, b.N+256, lim.Cur)
	}
	srv, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	srv.SetReadBuffer(4 << 20)
	echoed := make(chan struct{})
	go func() {
		defer close(echoed)
		buf := make([]byte, MaxDatagram)
		for {
			n, from, err := srv.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			srv.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	defer func() { srv.Close(); <-echoed }()
	n := b.N
	vs := &policy.VirtualServer{Name: "dns", Proto: policy.ProtoUDP,
		UDP:     policy.UDPOptions{IdleTimeout: 30 * time.Second},
		Targets: []*policy.Target{{Name: "t", Addr: srv.LocalAddr().(*net.UDPAddr).AddrPort(), Weight: 1}}}
	clock := &manualClock{now: time.Unix(1000, 0)}
	var rep countReplier
	r := New(Options{Admitter: &lightAdmitter{}, Host: &HostDialer{}, MaxSessions: n, Now: clock.Now})
	vip := netip.MustParseAddrPort("198.18.0.53:53")
	q := []byte("a query of some 32 bytes, as DNS")

	var before, after runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&before)
	slab0 := slabBytes()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range n {
		r.Datagram(&rep, spoofed(i), vip, vs, q)
	}
	b.StopTimer()
	// The loopback may drop a reply under a burst: wait for most, bounded.
	deadline := time.Now().Add(30 * time.Second)
	for rep.n.Load() < uint64(n) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&after)
	slab1 := slabBytes()
	if st := r.Stats(); st.Sessions != int64(n) {
		b.Fatalf("stats %+v, want %d sessions", st, n)
	}
	heap := float64(int64(after.HeapInuse)-int64(before.HeapInuse)) / float64(n)
	stack := float64(int64(after.StackInuse)-int64(before.StackInuse)) / float64(n)
	slab := float64(slab1-slab0) / float64(n)
	b.ReportMetric(heap+stack, "bytes/session")
	b.ReportMetric(slab, "kernel-slab-bytes/session")
	if n >= 1000 {
		b.Logf("%d sessions on kernel sockets: %.0f bytes each in Go (%.0f heap, %.0f stack), %.0f in the kernel's slab (system-wide); %d of %d replies relayed",
			n, heap+stack, heap, stack, slab, rep.n.Load(), n)
	}
	r.Close()
}

// slabBytes is /proc/meminfo's Slab (0 where it cannot be read).
func slabBytes() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "Slab:"); ok {
			var kb int64
			fmt.Sscanf(strings.TrimSpace(rest), "%d kB", &kb)
			return kb << 10
		}
	}
	return 0
}

// TestMemNet: memNet's sockets are datagram sockets: each Write is one
// datagram to the target's server, each reply one ReadDatagram, and Close
// ends a waiting read with net.ErrClosed.
func TestMemNet(t *testing.T) {
	mn := newMemNet()
	defer mn.close()
	addr := netip.MustParseAddrPort("198.18.1.1:53")
	mn.serve(addr)
	if _, err := mn.DialUDP(context.Background(), netip.MustParseAddrPort("198.18.1.2:53")); err == nil {
		t.Fatal("dialed an address no server serves")
	}
	c, err := mn.DialUDP(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	var pool sync.Pool
	pool.New = func() any { b := make([]byte, MaxDatagram); return &b }
	for _, d := range []string{"one", "two"} {
		if n, err := c.Write([]byte(d)); n != len(d) || err != nil {
			t.Fatalf("Write %q: %d, %v", d, n, err)
		}
	}
	for _, want := range []string{"one", "two"} {
		bp, n, err := c.ReadDatagram(&pool)
		if err != nil || string((*bp)[:n]) != want {
			t.Fatalf("ReadDatagram: %q, %v; want %q", (*bp)[:n], err, want)
		}
		pool.Put(bp)
	}
	done := make(chan error, 1)
	go func() { _, _, err := c.ReadDatagram(&pool); done <- err }()
	c.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("read after Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a read waited past Close")
	}
	if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after Close: %v", err)
	}
}

// spoofed is the i-th client of a flood: 198.19.0.0/16 sources, 64 512
// ports each (unique for i below 2^32 - 1).
func spoofed(i int) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)}), uint16(1024+(i>>16)%64512))
}

// memNet is an in-memory datagram network implementing Dialer: a server
// per target address echoes each datagram a socket writes back to that
// socket. A server's inbox and a socket's receive queue are bounded and
// drop what does not fit, as a kernel socket's buffers do (dropped).
type memNet struct {
	mu      sync.Mutex
	servers map[netip.AddrPort]*memServer // by mu
	wg      sync.WaitGroup
	dropped atomic.Uint64
}

type memServer struct {
	in chan memDatagram
}

type memDatagram struct {
	b    []byte
	from *memConn
}

// memConn is one connected socket of a memNet.
type memConn struct {
	net   *memNet
	srv   *memServer
	ready chan struct{} // one token: q became non-empty
	done  chan struct{} // closed by Close
	once  sync.Once

	mu sync.Mutex
	q  [][]byte // by mu: received, not yet read
}

// memQueue bounds a memConn's receive queue and memInbox a server's inbox.
const memQueue, memInbox = 16, 4096

func newMemNet() *memNet { return &memNet{servers: map[netip.AddrPort]*memServer{}} }

// serve starts an echo server on addr, until close.
func (mn *memNet) serve(addr netip.AddrPort) {
	s := &memServer{in: make(chan memDatagram, memInbox)}
	mn.mu.Lock()
	mn.servers[addr] = s
	mn.mu.Unlock()
	mn.wg.Go(func() {
		for d := range s.in {
			d.from.deliver(d.b)
		}
	})
}

func (mn *memNet) close() {
	mn.mu.Lock()
	for a, s := range mn.servers {
		close(s.in)
		delete(mn.servers, a)
	}
	mn.mu.Unlock()
	mn.wg.Wait()
}

// DialUDP implements Dialer.
func (mn *memNet) DialUDP(_ context.Context, addr netip.AddrPort) (Target, error) {
	mn.mu.Lock()
	s := mn.servers[addr]
	mn.mu.Unlock()
	if s == nil {
		return nil, fmt.Errorf("memnet: dial %v: connection refused", addr)
	}
	return &memConn{net: mn, srv: s, ready: make(chan struct{}, 1), done: make(chan struct{})}, nil
}

// Write implements Target: b, copied, is one datagram to the server.
func (c *memConn) Write(b []byte) (int, error) {
	select {
	case <-c.done:
		return 0, net.ErrClosed
	default:
	}
	select {
	case c.srv.in <- memDatagram{append([]byte(nil), b...), c}:
	default:
		c.net.dropped.Add(1)
	}
	return len(b), nil
}

// deliver queues a datagram for the socket's reader.
func (c *memConn) deliver(b []byte) {
	c.mu.Lock()
	if len(c.q) >= memQueue {
		c.mu.Unlock()
		c.net.dropped.Add(1)
		return
	}
	c.q = append(c.q, b)
	c.mu.Unlock()
	select {
	case c.ready <- struct{}{}:
	default:
	}
}

// ReadDatagram implements Target: it waits with no buffer held.
func (c *memConn) ReadDatagram(pool *sync.Pool) (*[]byte, int, error) {
	for {
		c.mu.Lock()
		var d []byte
		if len(c.q) > 0 {
			d = c.q[0]
			c.q[0] = nil
			if c.q = c.q[1:]; len(c.q) == 0 {
				c.q = nil
			}
		}
		c.mu.Unlock()
		if d != nil {
			bp := pool.Get().(*[]byte)
			return bp, copy(*bp, d), nil
		}
		select {
		case <-c.ready:
		case <-c.done:
			return nil, 0, net.ErrClosed
		}
	}
}

// Close implements Target.
func (c *memConn) Close() error {
	c.once.Do(func() { close(c.done) })
	return nil
}

// countReplier is the VIP socket: it counts the replies it sends.
type countReplier struct{ n atomic.Uint64 }

func (r *countReplier) WriteTo([]byte, netip.AddrPort) error { r.n.Add(1); return nil }

// lightAdmitter admits every session to the service's first target and
// keeps nothing per session but its Session value (weir's admission keeps
// more: its per-session cost is not in the benchmark's figure).
type lightAdmitter struct{}

func (lightAdmitter) Admit(req *proxy.ConnRequest) (proxy.Decision, proxy.Session) {
	return proxy.Decision{Verdict: proxy.Accept, Target: req.Service.Targets[0]}, lightSession{}
}

type lightSession struct{}

func (lightSession) DialFailed(proxy.Decision, error) proxy.Decision {
	return proxy.Decision{Verdict: proxy.RefuseRST}
}
func (lightSession) TargetFailed(proxy.Decision, error) {}
func (lightSession) Spliced(int64)                      {}
func (lightSession) Released()                          {}
func (lightSession) End(*proxy.End)                     {}
