package netstack

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"weir/datapath"
	"weir/internal/testutil"
	"weir/netstack/proxy"
	proxyhttp "weir/netstack/proxy/http"
	"weir/policy"
)

// TestMain fails the package if a test leaves a goroutine running: every
// forwarder, link and splice goroutine must end with its stack.
func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

var (
	clientV4 = netip.MustParsePrefix("198.18.0.2/15")
	clientV6 = netip.MustParsePrefix("fd00::2/64")
	vipV4    = netip.MustParseAddr("198.19.0.80")
	vipV6    = netip.MustParseAddr("fd00::80")
)

// testAdmitter is an Admitter built from functions; nil functions accept to
// target (or refuse when target is nil). Its sessions record every End.
type testAdmitter struct {
	target     *policy.Target
	action     *policy.Action
	admit      func(*proxy.ConnRequest) proxy.Decision
	dialFailed func(*proxy.ConnRequest, proxy.Decision, error) proxy.Decision
	keep       bool // keep the final stats of accepted connections

	mu            sync.Mutex
	closed        []proxy.ConnStats // protected by mu: final stats of accepted connections, if keep
	ends          []proxy.Outcome   // protected by mu: every End's outcome, in order
	refusals      []proxy.Refusal   // protected by mu: what refused clients were sent
	nClosed       atomic.Int64      // Ends of connections whose last decision was Accept
	nFailed       atomic.Int64      // DialFailed calls
	nTargetFailed atomic.Int64      // TargetFailed calls
	nFailedLate   atomic.Int64      // TargetFailed calls after Released (the lease already given back)
	nReleased     atomic.Int64      // Released calls
	nEnds         atomic.Int64      // End calls
	nAdmit        atomic.Int64      // Admit calls
}

func (a *testAdmitter) Admit(r *proxy.ConnRequest) (proxy.Decision, proxy.Session) {
	a.nAdmit.Add(1)
	var d proxy.Decision
	switch {
	case a.admit != nil:
		d = a.admit(r)
	case a.target == nil:
		d = proxy.Decision{Verdict: proxy.RefuseRST}
	default:
		d = proxy.Decision{Verdict: proxy.Accept, Target: a.target, Action: a.action}
	}
	return d, &testSession{a: a, req: r}
}

// testSession is one connection's Session of a testAdmitter. It checks the
// contract: End exactly once, nothing after it; Released at most once, and
// before the End of a connection served by its target; TargetFailed only
// with the first-byte timeout and a target.
type testSession struct {
	a        *testAdmitter
	req      *proxy.ConnRequest
	ended    atomic.Bool
	released atomic.Bool
}

func (s *testSession) DialFailed(d proxy.Decision, err error) proxy.Decision {
	if s.ended.Load() {
		panic("DialFailed after End")
	}
	s.a.nFailed.Add(1)
	if s.a.dialFailed != nil {
		return s.a.dialFailed(s.req, d, err)
	}
	return proxy.Decision{Verdict: proxy.RefuseRST}
}

func (s *testSession) TargetFailed(d proxy.Decision, err error) {
	if s.ended.Load() {
		panic("TargetFailed after End")
	}
	if !errors.Is(err, proxy.ErrFirstByteTimeout) || d.Target == nil {
		panic("TargetFailed without the timeout or a target")
	}
	s.a.nTargetFailed.Add(1)
	if s.released.Load() {
		s.a.nFailedLate.Add(1)
	}
}
func (*testSession) Spliced(int64) {}

func (s *testSession) Released() {
	if s.ended.Load() {
		panic("Released after End")
	}
	if s.released.Swap(true) {
		panic("Released called twice")
	}
	s.a.nReleased.Add(1)
}

func (s *testSession) End(e *proxy.End) {
	if s.ended.Swap(true) {
		panic("End called twice")
	}
	if (e.Outcome == proxy.Served || e.Outcome == proxy.IdleClosed) && e.Request == nil && !s.released.Load() {
		panic("End of a spliced connection before Released")
	}
	a := s.a
	a.mu.Lock()
	a.ends = append(a.ends, e.Outcome)
	if e.Outcome == proxy.RefusedReset || e.Outcome == proxy.RefusedPage {
		a.refusals = append(a.refusals, e.Refusal)
	}
	if e.Decision.Verdict == proxy.Accept && a.keep {
		a.closed = append(a.closed, e.Stats)
	}
	a.mu.Unlock()
	if e.Decision.Verdict == proxy.Accept {
		a.nClosed.Add(1)
	}
	a.nEnds.Add(1)
}

// closedStats returns a copy of the kept final records.
func (a *testAdmitter) closedStats() []proxy.ConnStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]proxy.ConnStats(nil), a.closed...)
}

// outcomes returns the outcomes of the Ends so far.
func (a *testAdmitter) outcomes() []proxy.Outcome {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]proxy.Outcome(nil), a.ends...)
}

// lastRefusal returns what the last refused client was sent.
func (a *testAdmitter) lastRefusal() proxy.Refusal {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.refusals) == 0 {
		return proxy.Refusal{}
	}
	return a.refusals[len(a.refusals)-1]
}

// refusalCount returns the number of refusals reported.
func (a *testAdmitter) refusalCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.refusals)
}

// rig is a weir front stack and a client stack joined by a memory pair.
type rig struct {
	weir, client *Stack
	fwd          *Forwarder
	px           *proxy.Proxy      // fwd's Handler
	hs           *proxyhttp.Server // px's http server, when RequestAdmitter is set
	front        *NIC
	clientNIC    *NIC
	clientDev    datapath.Device // the client's end, possibly wrapped
}

type rigOptions struct {
	fwd       fwdOptions
	stack     Options
	wrapFront func(datapath.Device) datapath.Device // wraps weir's device end
	rawClient bool                                  // no client stack: the test drives clientDev
	listen    []*policy.VirtualServer               // Forwarder.Listen on these
	client    Options                               // the client stack's options
}

func newRig(t testing.TB, o rigOptions) *rig {
	t.Helper()
	a, b := datapath.NewPipe(datapath.PipeOptions{QueueLen: 4096})
	var front datapath.Device = a
	if o.wrapFront != nil {
		front = o.wrapFront(a)
	}
	w, err := New(o.stack)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{weir: w, clientDev: b}
	if r.front, err = w.AddNIC(front, NICOptions{Name: "front", Promiscuous: true}); err != nil {
		t.Fatal(err)
	}
	if o.fwd.Services == nil {
		o.fwd.Services = func(addr netip.Addr, port uint16) *policy.VirtualServer { return nil }
	}
	// The forwarder takes a virtual server's Timeouts and HTTP options as
	// policy.Compile filled them; the tests' hand-built ones get theirs here.
	inner := o.fwd.Services
	o.fwd.Services = func(addr netip.Addr, port uint16) *policy.VirtualServer {
		vs := inner(addr, port)
		compiled(t, vs)
		return vs
	}
	for _, vs := range o.listen {
		compiled(t, vs)
	}
	r.fwd, r.px, r.hs = o.fwd.build(w)
	t.Cleanup(r.close)
	if o.listen != nil {
		if err := r.fwd.Listen(o.listen); err != nil {
			t.Fatal(err)
		}
	}
	if o.rawClient {
		return r
	}
	c, err := New(o.client)
	if err != nil {
		t.Fatal(err)
	}
	r.client = c
	if r.clientNIC, err = c.AddNIC(b, NICOptions{Name: "client", Addrs: []netip.Prefix{clientV4, clientV6}}); err != nil {
		t.Fatal(err)
	}
	return r
}

// fwdOptions are a rig's accept path, proxy and http server options in
// one, as weir's appliance wires them: the forwarder hands its connections
// to a proxy.Proxy, which gives those of http services to a
// proxyhttp.Server when RequestAdmitter is set. Host nil means a zero
// HostDialer, Back nil a zero StackDialer (ErrNoBackArm).
type fwdOptions struct {
	Services        func(addr netip.Addr, port uint16) *policy.VirtualServer
	Admitter        proxy.Admitter
	RequestAdmitter proxy.RequestAdmitter
	Host, Back      proxy.Dialer
	MaxInFlight     int
	Segments        proxy.SegmentsFunc
	Now             func() time.Time
	OnPanic         func(req *proxy.ConnRequest, v any, stack []byte)
}

func (o fwdOptions) build(s *Stack) (*Forwarder, *proxy.Proxy, *proxyhttp.Server) {
	po := proxy.Options{Admitter: o.Admitter, Host: o.Host, Back: o.Back, Meter: &LegMeter{Segments: o.Segments},
		Now: o.Now, OnPanic: o.OnPanic}
	if po.Host == nil {
		po.Host = &HostDialer{}
	}
	if po.Back == nil {
		po.Back = &StackDialer{}
	}
	var hs *proxyhttp.Server
	if o.RequestAdmitter != nil {
		hs = proxyhttp.New(proxyhttp.Options{RequestAdmitter: o.RequestAdmitter})
		po.HTTP = hs
	}
	px := proxy.New(po)
	f := NewForwarder(s, ForwarderOptions{Services: o.Services, Handler: px, MaxInFlight: o.MaxInFlight, OnPanic: o.OnPanic})
	return f, px, hs
}

// fwdStats are the counters of a rig's forwarder, proxy and http server
// in one, named as weir's status document names them.
type fwdStats struct {
	ForwarderStats
	Accepted, RefusedRST, Refused503, TargetTimedOut, DialFailed, IdleClosed, Aborted, NoSession uint64
	Panics                                                                                       uint64 // the accept path's and the proxy's
	Open, Pending                                                                                int64  // Pending: handshaking too
	HTTPRequests, HTTPRefused, HTTPHeaderTimeout, HTTPHeaderTooBig, HTTPBadRequest               uint64
	HTTPRetried, HTTPBadGateway, HTTPBodyTimeout                                                 uint64
	HTTPClients, TargetConns                                                                     int64
	TargetConnsIdle                                                                              int
}

func (r *rig) stats() fwdStats {
	fs, ps := r.fwd.Stats(), r.px.Stats()
	st := fwdStats{ForwarderStats: fs,
		Accepted: ps.Accepted, RefusedRST: ps.RefusedRST, Refused503: ps.Refused503, TargetTimedOut: ps.TargetTimedOut,
		DialFailed: ps.DialFailed, IdleClosed: ps.IdleClosed, Aborted: ps.Aborted, NoSession: ps.NoSession,
		Panics: fs.Panics + ps.Panics, Open: ps.Open, Pending: fs.Handshaking + ps.Pending}
	if r.hs != nil {
		hs := r.hs.Stats()
		st.HTTPRequests, st.HTTPRefused, st.HTTPHeaderTimeout, st.HTTPHeaderTooBig, st.HTTPBadRequest = hs.Requests, hs.Refused, hs.HeaderTimeout, hs.HeaderTooBig, hs.BadRequest
		st.HTTPRetried, st.HTTPBadGateway, st.HTTPBodyTimeout = hs.Retried, hs.BadGateway, hs.BodyTimeout
		st.HTTPClients, st.TargetConns, st.TargetConnsIdle = hs.Clients, hs.TargetConns, hs.TargetConnsIdle
	}
	return st
}

func (r *rig) close() {
	r.fwd.Close()
	if r.client != nil {
		r.client.Close()
	} else {
		r.clientDev.Close()
	}
	r.weir.Close()
}

var (
	compiledMu   sync.Mutex
	compiledDone = map[*policy.VirtualServer]bool{} // protected by compiledMu
)

// compiled fills, once, the zero Timeouts and HTTP options of a virtual
// server a test built by hand, from what policy.Compile makes of a copy
// (the one owner of those defaults). Safe from the forwarder's goroutines.
func compiled(t testing.TB, vs *policy.VirtualServer) {
	if vs == nil {
		return
	}
	compiledMu.Lock()
	defer compiledMu.Unlock()
	if compiledDone[vs] {
		return
	}
	compiledDone[vs] = true
	c := &policy.VirtualServer{Name: vs.Name, VIPs: vs.VIPs, Ports: vs.Ports, Proto: vs.Proto,
		Timeouts: vs.Timeouts, HTTP: vs.HTTP, Targets: []*policy.Target{{Name: "t", Addr: netip.MustParseAddrPort("127.0.0.1:1"), Weight: 1}}}
	cfg, err := policy.Compile(&policy.Config{Services: []*policy.VirtualServer{c}})
	if err != nil {
		t.Errorf("compiling %s: %v", vs.Name, err)
		return
	}
	vs.Timeouts, vs.HTTP = cfg.Services[0].Timeouts, cfg.Services[0].HTTP
}

// services returns a Services func answering for one virtual server.
func services(vs *policy.VirtualServer) func(netip.Addr, uint16) *policy.VirtualServer {
	return func(addr netip.Addr, port uint16) *policy.VirtualServer {
		for _, v := range vs.VIPs {
			if v == addr.Unmap() && vs.Ports.Contains(port) {
				return vs
			}
		}
		return nil
	}
}

// echoServer serves on a host loopback listener, echoing every connection,
// and closes after echoing when closeFirst (the target closes first).
func echoServer(t testing.TB, network, addr string) (netip.AddrPort, func()) {
	t.Helper()
	l, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return l.Addr().(*net.TCPAddr).AddrPort(), func() { l.Close(); wg.Wait() }
}

// serveListener runs handle for every connection l accepts until l closes.
func serveListener(l net.Listener, handle func(net.Conn)) (stop func()) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				handle(c)
			}()
		}
	}()
	return func() { l.Close(); wg.Wait() }
}

// wantReset checks that a dial, whose result is c and err, ended in a RST:
// handshake-first, the dial itself may succeed (the RST arrives after the
// final ACK) or see the RST; either way no byte ever comes.
func wantReset(t testing.TB, c *Conn, err error) {
	t.Helper()
	if err != nil {
		if !errors.Is(err, ErrConnectionReset) && !errors.Is(err, ErrConnectionRefused) {
			t.Fatalf("dial: %v, want a reset", err)
		}
		return
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, rerr := c.Read(make([]byte, 1))
	if n != 0 || rerr == nil || errors.Is(rerr, os.ErrDeadlineExceeded) || rerr == io.EOF {
		t.Fatalf("read after a refusal: %d, %v; want a reset", n, rerr)
	}
}

func dial(t testing.TB, s *Stack, addr netip.AddrPort) *Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := s.DialTCP(ctx, netip.AddrPort{}, addr)
	if err != nil {
		t.Fatalf("dial %v: %v", addr, err)
	}
	return c
}

// manualClock is a proxy.Options.Now that moves only when the test
// advances it, so intervals and streaming times are exact.
type manualClock struct {
	mu sync.Mutex
	t  time.Time // protected by mu
}

func newManualClock() *manualClock {
	return &manualClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// duplexEcho echoes c until the client closes its side, then closes its
// own. Its reads never wait on its writes: a queue between them holds what
// is read and not yet written (at most a transfer's size in a test).
//
// An echo that stops reading while a write waits (io.Copy(c, c)) can
// deadlock against gVisor's receive path: once its receive buffer is full
// the stack advertises a window rounded down to zero by the window scale
// while the client still has up to 2^scale-1 bytes in flight under the
// window advertised before; gVisor then finds the client's segments
// unacceptable (a zero window accepts only a segment with no data at
// exactly RCV.NXT, header.Acceptable) and drops them with the ACKs they
// carry, so the echo's write never completes and it never reads again.
// Linux accepts the ACK of such a segment and drops only its data.
// TestOffloadTUN stalled that way about once in 200 runs beside 3 busy
// processes (the client's TCPDSACKOldSent rising, 16 RTOs at weir's side,
// no packet lost anywhere). A proxy in front of an echo-like target can
// meet the same; weir's own splice reads a leg while its other direction
// waits.
func duplexEcho(c net.Conn) {
	defer c.Close()
	var (
		mu    sync.Mutex
		queue [][]byte
		eof   bool
		ready = make(chan struct{}, 1)
	)
	go func() {
		defer func() {
			mu.Lock()
			eof = true
			mu.Unlock()
			select {
			case ready <- struct{}{}:
			default:
			}
		}()
		for {
			b := make([]byte, 64<<10)
			n, err := c.Read(b)
			if n > 0 {
				mu.Lock()
				queue = append(queue, b[:n])
				mu.Unlock()
				select {
				case ready <- struct{}{}:
				default:
				}
			}
			if err != nil {
				return
			}
		}
	}()
	for {
		mu.Lock()
		q, done := queue, eof
		queue = nil
		mu.Unlock()
		for _, b := range q {
			if _, err := c.Write(b); err != nil {
				return
			}
		}
		if len(q) == 0 {
			if done {
				if cw, ok := c.(interface{ CloseWrite() error }); ok {
					cw.CloseWrite()
				}
				return
			}
			<-ready
		}
	}
}
