package netstack

// Connection flow
//
//	SYN to a listened VIP:port (each port of a service with ≤ MaxListenPorts
//	ports; the listeners follow Forwarder.Listen)
//	    ──► gVisor listening endpoint: ≤ InFlightPerVIP half-open handshakes
//	        per VIP and port; beyond that SYN cookies answer and hold no
//	        state; a full accept queue drops the SYN     DroppedInFlight
//	    ──► established ──► acceptLoop (one goroutine per listener) ──► serve
//	SYN to anything else ──► gVisor tcp.Forwarder (≤ MaxInFlight in all)
//	    ──► handle (own goroutine): Services(VIP, port)
//	          none ──► RST, no SYN-ACK                                NoService
//	          ≥ InFlightPerVIP pending for this VIP ──► dropped      DroppedInFlight
//	          ──► handshake (Handshake timeout aborts it)  HandshakeTimedOut, HandshakeFailed
//	          ──► serve
//	handOver (the connection's goroutine, client established):
//	    Services(VIP, port) again ──► none (reloaded away): RST     NoService
//	    ──► Handler.HandleConn (weir/netstack/proxy: admission, dial,
//	        splice, the HTTP proxy; see netstack/proxy/proxy.go)
//
// Why handshake first. A handshake in flight holds no admission slot and no
// target connection: a spoofed SYN never completes, so it never reaches
// Admit, never counts against maxConnections and never makes weir dial.
// The old flow (admit and dial on the SYN, SYN-ACK once the target answered)
// let 15 spoofed SYNs a second fill a maxConnections of 50 and open a real
// backend connection each. The price: a client whose connection is refused,
// or whose targets all fail, now sees its connect succeed and then a RST (or
// the 503 page) instead of a RST to its SYN.
//
// Why listening endpoints. gVisor's listening endpoints keep a SYN backlog
// per endpoint and answer with SYN cookies once it is full (accept.go,
// handleListenSegment): a flood at one VIP costs no memory and leaves every
// other VIP's backlog alone. gVisor's tcp.Forwarder has neither: one
// in-flight map for all, a goroutine and a pending endpoint per SYN. So
// every VIP and port of a service gets its own listener, bound to the VIP
// on the promiscuous (spoofing) NIC, IPv4 and IPv6 alike. A service with a
// port range wider than MaxListenPorts would need too many listeners: its
// SYNs take the tcp.Forwarder path, handshake-first too, bounded per VIP by
// InFlightPerVIP, without cookies.
//
// A panic in the accept path's goroutines is recovered, counted (Panics)
// and reported to OnPanic; the Handler recovers its own.

import (
	"net/netip"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"

	"weir/netstack/proxy"
	"weir/policy"
)

// DefaultMaxInFlight is the bound on the tcp.Forwarder path's handshakes
// (all VIPs together) where ForwarderOptions.MaxInFlight is zero: a
// transport default. The timeouts and bounds of a connection are its
// virtual server's policy.Timeouts, which policy.Compile fills: netstack
// applies no policy default of its own.
const DefaultMaxInFlight = 1024

// MaxListenPorts is the widest port range per VIP that gets listening
// endpoints (and so SYN cookies); wider services take the tcp.Forwarder
// path.
const MaxListenPorts = 256

// ForwarderOptions configure a Forwarder. The zero value works: it answers
// for no virtual server (every SYN gets RST).
type ForwarderOptions struct {
	// Services finds the virtual server for an address and port, or nil.
	// It must not allocate or block (policy.Config.Service does neither).
	// Nil means there is none. The virtual servers it returns are
	// compiled (policy.Compile): their Timeouts are used as they are.
	Services func(addr netip.Addr, port uint16) *policy.VirtualServer
	// Handler serves each established connection to a virtual server
	// (weir/netstack/proxy's Proxy); Drain and Close pass to it. Nil means
	// proxy.New(proxy.Options{}), which refuses every one with RST.
	Handler proxy.Handler
	// MaxInFlight bounds the handshakes in flight on the tcp.Forwarder path
	// (SYNs to no listener), all VIPs together; further SYNs are dropped
	// and counted. Zero means DefaultMaxInFlight.
	MaxInFlight int
	// OnPanic, if set, hears of each panic recovered in the accept path's
	// goroutines (a connection's before its hand-over): the connection (ID
	// 0: it has none yet), the value and the stack. It is called once per
	// panic, from that goroutine, and must not block.
	OnPanic func(req *proxy.ConnRequest, v any, stack []byte)
}

func (o ForwarderOptions) withDefaults() ForwarderOptions {
	if o.Handler == nil {
		o.Handler = proxy.New(proxy.Options{})
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = DefaultMaxInFlight
	}
	return o
}

// ForwarderStats are the accept path's counters, totals since the forwarder
// was created: SYNs, handshakes, listeners and cookies. What became of the
// connections it handed over is its Handler's to count (proxy.Stats).
type ForwarderStats struct {
	NoService         uint64 // SYNs to an address:port that is no virtual server (RST), and connections whose service was reloaded away before the hand-over
	RefusedClosed     uint64 // SYNs after Drain or Close (RST, no SYN-ACK)
	DroppedInFlight   uint64 // SYNs dropped: MaxInFlight or InFlightPerVIP pending (tcp.Forwarder path), or a listener's accept queue full
	SYNCookiesSent    uint64 // SYN-ACKs with a SYN cookie (a listener's backlog was full)
	SYNCookiesValid   uint64 // ACKs with a valid cookie: connections established from a cookie
	SYNCookiesInvalid uint64 // ACKs to a listener with no valid cookie (dropped)
	Listeners         int    // listening endpoints now (VIP and port pairs)
	Panics            uint64 // panics recovered in the accept path's goroutines
	HandshakeTimedOut uint64 // client handshakes aborted by HandshakeTimeout (tcp.Forwarder path; listeners' half-open sweep)
	HandshakeFailed   uint64 // client handshakes that failed otherwise (RST from the client; tcp.Forwarder path)
	TimeWaitReopened  uint64 // SYNs that ended a TIME_WAIT on their 4-tuple and opened a new connection
	CookieReplays     uint64 // connections a listener made of an ended connection's late segment (a valid-looking SYN cookie, no SYN since), aborted before admission
	UDPUnreachable    uint64 // UDP datagrams to no socket, answered with ICMP port unreachable
	Handshaking       int64  // handshakes on the tcp.Forwarder path now (between SYN and the hand-over)

	// ListenDropped: segments past the SYN that listeners dropped, by cause.
	ListenDropped ListenDrops
}

// Forwarder terminates TCP connections to virtual servers on a Stack's
// promiscuous NICs and, once the client's handshake is complete, hands each
// to its Handler.
type Forwarder struct {
	s    *Stack
	opts ForwarderOptions
	fwd  *tcp.Forwarder

	workers *proxy.WarmPool // hand-over goroutines of listeners, reused

	mu      sync.Mutex
	closed  bool                                                      // protected by mu
	pending map[stack.TransportEndpointID]tcpip.NetworkProtocolNumber // protected by mu: handshakes in progress
	wg      sync.WaitGroup                                            // handler goroutines

	tw timeWaitTable

	draining  atomic.Bool // set by Drain
	lmu       sync.Mutex
	listeners map[netip.AddrPort]*listener // protected by lmu
	lwg       sync.WaitGroup               // accept loops

	// listenClosing holds retired listeners until their accept loop ends,
	// then their drops go into listenGone (both protected by lmu).
	listenClosing map[*listener]struct{}
	listenGone    ListenDrops
	sweepStop     chan struct{} // protected by lmu: closed to stop sweepHalfOpen; nil when none runs

	vipMu      sync.Mutex
	vipPending map[netip.Addr]int // protected by vipMu: tcp.Forwarder-path handshakes per VIP
	vipDropped atomic.Uint64

	noService, refusedClosed, hsTimedOut, hsFailed, panics atomic.Uint64
	handshaking                                            atomic.Int64
}

// NewForwarder installs a TCP forwarder on s: from now on every SYN that
// matches no open connection goes through it. UDP to no socket is answered
// with ICMP port unreachable and counted. Only one Forwarder per Stack.
func NewForwarder(s *Stack, opts ForwarderOptions) *Forwarder {
	opts = opts.withDefaults()
	f := &Forwarder{
		s:       s,
		opts:    opts,
		pending: make(map[stack.TransportEndpointID]tcpip.NetworkProtocolNumber),

		listeners:  make(map[netip.AddrPort]*listener),
		vipPending: make(map[netip.Addr]int),
	}
	f.tw.init()
	f.workers = proxy.NewWarmPool(proxy.DefaultWarmIdle)
	f.fwd = tcp.NewForwarder(s.s, 0, opts.MaxInFlight, f.handle)
	s.s.SetTransportProtocolHandler(tcp.ProtocolNumber, f.fwd.HandlePacket)
	// Returning false lets the stack answer with ICMP port unreachable.
	s.s.SetTransportProtocolHandler(udp.ProtocolNumber, func(stack.TransportEndpointID, *stack.PacketBuffer) bool { return false })
	hook := f.tw.onSYN
	s.setSYNHook(&hook)
	return f
}

// Stats returns the forwarder's counters.
func (f *Forwarder) Stats() ForwarderStats {
	st := f.s.s.Stats()
	return ForwarderStats{
		NoService:         f.noService.Load(),
		RefusedClosed:     f.refusedClosed.Load(),
		DroppedInFlight:   st.TCP.ForwardMaxInFlightDrop.Value() + f.vipDropped.Load() + st.TCP.ListenOverflowSynDrop.Value(),
		SYNCookiesSent:    st.TCP.ListenOverflowSynCookieSent.Value(),
		SYNCookiesValid:   st.TCP.ListenOverflowSynCookieRcvd.Value(),
		SYNCookiesInvalid: st.TCP.ListenOverflowInvalidSynCookieRcvd.Value(),
		ListenDropped:     f.listenDrops(),
		Listeners:         f.listenerCount(),
		Panics:            f.panics.Load(),
		HandshakeTimedOut: f.hsTimedOut.Load(),
		HandshakeFailed:   f.hsFailed.Load(),
		TimeWaitReopened:  f.tw.reopened.Load(),
		CookieReplays:     f.tw.recent.replays.Load(),
		UDPUnreachable:    st.UDP.UnknownPortErrors.Value(),
		Handshaking:       f.handshaking.Load(),
	}
}

// Close stops admitting (new SYNs get RST), aborts pending handshakes,
// closes the Handler (which closes every open connection) and waits for all
// of the forwarder's goroutines. The stack stays up.
func (f *Forwarder) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	pend := make(map[stack.TransportEndpointID]tcpip.NetworkProtocolNumber, len(f.pending))
	for id, p := range f.pending {
		pend[id] = p
	}
	f.mu.Unlock()
	f.closeListeners()
	for id, p := range pend {
		f.abortHandshake(p, id)
	}
	err := f.opts.Handler.Close()
	f.wg.Wait()
	f.workers.Close()
	f.s.setSYNHook(nil)
	f.tw.recent.stop()
	return err
}

// handle runs in its own goroutine, one per SYN the gVisor forwarder admits
// into its in-flight set: SYNs to no listener.
func (f *Forwarder) handle(r *tcp.ForwarderRequest) {
	f.mu.Lock()
	if f.closed || f.draining.Load() {
		f.mu.Unlock()
		f.refusedClosed.Add(1)
		r.Complete(true)
		return
	}
	f.wg.Add(1)
	f.mu.Unlock()
	defer f.wg.Done()
	defer f.recoverConn(func() { r.Complete(true) })

	id := r.ID()
	vip := netip.AddrPortFrom(netipAddr(id.LocalAddress), id.LocalPort)
	var vs *policy.VirtualServer
	if f.opts.Services != nil {
		vs = f.opts.Services(vip.Addr(), vip.Port())
	}
	if vs == nil {
		f.noService.Add(1)
		r.Complete(true)
		return
	}
	t := vs.Timeouts
	if !f.vipEnter(vip.Addr(), t.InFlightPerVIP) {
		// Dropped, not reset: the client retries its SYN, as after a
		// full listen backlog.
		f.vipDropped.Add(1)
		r.Complete(false)
		return
	}
	f.handshaking.Add(1)
	client, err := f.handshake(r, protoOf(vip.Addr()), t.Handshake)
	f.vipLeave(vip.Addr())
	f.handshaking.Add(-1)
	if err != nil {
		return
	}
	f.handOver(client, vip)
}

// vipEnter takes one of vip's in-flight slots on the tcp.Forwarder path,
// unless max are taken.
func (f *Forwarder) vipEnter(vip netip.Addr, max int) bool {
	f.vipMu.Lock()
	defer f.vipMu.Unlock()
	if f.vipPending[vip] >= max {
		return false
	}
	f.vipPending[vip]++
	return true
}

func (f *Forwarder) vipLeave(vip netip.Addr) {
	f.vipMu.Lock()
	defer f.vipMu.Unlock()
	if f.vipPending[vip]--; f.vipPending[vip] <= 0 {
		delete(f.vipPending, vip)
	}
}

// handOver gives an established client connection to the Handler, in the
// connection's goroutine: its virtual server is looked up again (a reload
// may have taken it away since the SYN).
func (f *Forwarder) handOver(client *Conn, vip netip.AddrPort) {
	// The endpoint's ID, not RemoteAddr: that fails once the client has
	// reset the connection, which it may have by now.
	id := client.ep.Info().(*stack.TransportEndpointInfo).ID
	req := &proxy.ConnRequest{
		Client: netip.AddrPortFrom(netipAddr(id.RemoteAddress), id.RemotePort),
		VIP:    vip,
	}
	if f.opts.Services != nil {
		req.Service = f.opts.Services(req.VIP.Addr(), req.VIP.Port())
	}
	if req.Service == nil {
		// Reloaded away between the SYN and now.
		f.noService.Add(1)
		client.Reset()
		return
	}
	client.tw = &f.tw
	f.opts.Handler.HandleConn(client, req)
}

// recoverConn recovers a panic in an accept path goroutine: counts it,
// reports it to OnPanic with the stack, and runs cleanup (which closes
// what the goroutine holds). Deferred first thing in each such goroutine.
func (f *Forwarder) recoverConn(cleanup func()) {
	v := recover()
	if v == nil {
		return
	}
	if cleanup != nil {
		func() {
			defer func() { _ = recover() }()
			cleanup()
		}()
	}
	f.panics.Add(1)
	if f.opts.OnPanic != nil {
		f.opts.OnPanic(&proxy.ConnRequest{}, v, debug.Stack())
	}
}

// handshake completes the client's handshake, aborting it after timeout.
// It always completes r, and counts a failure.
func (f *Forwarder) handshake(r *tcp.ForwarderRequest, proto tcpip.NetworkProtocolNumber, timeout time.Duration) (*Conn, error) {
	id := r.ID()
	f.mu.Lock()
	f.pending[id] = proto
	f.mu.Unlock()
	var expired atomic.Bool
	timer := time.AfterFunc(timeout, func() {
		expired.Store(true)
		f.abortHandshake(proto, id)
	})
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	timer.Stop()
	r.Complete(false)
	f.mu.Lock()
	delete(f.pending, id)
	f.mu.Unlock()
	if terr != nil {
		if expired.Load() {
			f.hsTimedOut.Add(1)
		} else {
			f.hsFailed.Add(1)
		}
		return nil, asError(terr)
	}
	f.s.setKeepalive(ep)
	return newConn(&wq, ep.(*tcp.Endpoint)), nil
}

// abortHandshake aborts the endpoint of a handshake in progress, which makes
// CreateEndpoint return.
func (f *Forwarder) abortHandshake(proto tcpip.NetworkProtocolNumber, id stack.TransportEndpointID) {
	if ep := f.s.s.FindTransportEndpoint(proto, tcp.ProtocolNumber, id, 0); ep != nil {
		ep.Abort()
	}
}
