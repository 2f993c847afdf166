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
//	serve (own goroutine, client established):
//	    http virtual server and a RequestAdmitter ──► serveHTTP (httpproxy.go):
//	        admitted, routed and counted request by request
//	    Admit ──► (Decision, Session)
//	          ──► RefuseRST ──► RST                                   RefusedRST   End(RefusedReset)
//	          ──► Refuse503 ──► 503 page ──► close                    Refused503   End(RefusedPage)
//	          ──► Accept ──► dial target (Connect timeout); failed: Session.DialFailed
//	                         answers (another Accept, until the tried-set refuses)
//	                         ──► RST or 503                           DialFailed
//	                     ──► splice client ⇄ target ──► Released once the
//	                         client has seen it finished (proxy/release.go)
//	                         ──► End(Served | IdleClosed)
//	                         target silent FirstByte after the client's first
//	                         byte ──► Session.TargetFailed, 503 page or RST
//	                                                                  End(TargetTimedOut)
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
// Every Session gets exactly one End, whatever happens, panics included: a
// panic in a connection's goroutines is recovered, counted (Panics),
// reported to OnPanic with the stack, and ends that connection only.

import (
	"context"
	"errors"
	"fmt"
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

// Transport defaults applied where a ForwarderOptions field is zero. The
// timeouts and bounds of a connection are its virtual server's
// policy.Timeouts, which policy.Compile fills: netstack applies no policy
// default of its own.
const (
	DefaultMaxInFlight = 1024     // tcp.Forwarder path, all VIPs together
	DefaultBufferSize  = 32 << 10 // splice buffer per direction, bytes
)

// pageOf is the 503 page for a refusal.
func pageOf(d proxy.Decision) proxy.Page503 {
	return proxy.Page503{Limit: d.Limit, Value: d.Value, Reason: d.Reason, Limits: d.Limits, RetryAfter: d.RetryAfter}
}

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
	// Admitter decides about each connection to a virtual server; nil
	// refuses every one with RST.
	Admitter proxy.Admitter
	// RequestAdmitter admits the client connections and requests of the
	// http virtual servers one request at a time; nil: an http virtual
	// server's connections are admitted by Admitter and spliced as a tcp
	// one's.
	RequestAdmitter proxy.RequestAdmitter
	// Host dials DialHost targets; nil means a zero HostDialer.
	Host proxy.Dialer
	// Back dials DialNetstack targets; nil means such dials fail with
	// ErrNoBackArm.
	Back proxy.Dialer
	// MaxInFlight bounds the handshakes in flight on the tcp.Forwarder path
	// (SYNs to no listener), all VIPs together; further SYNs are dropped
	// and counted. Zero means DefaultMaxInFlight.
	MaxInFlight int

	// BufferSize is the splice buffer per direction, in bytes; zero means
	// DefaultBufferSize.
	BufferSize int
	// Segments gives the datapath's passive measurement of a gVisor target
	// leg (see direction.go); nil means those legs have no per-direction
	// counts (proxy.DirNone).
	Segments proxy.SegmentsFunc
	// HostSegments gives the host-leg capture's passive measurement of a
	// host socket target leg (local: the socket's address, remote: the
	// target); nil, or a nil result, means TCP_INFO alone (see
	// direction.go).
	HostSegments proxy.SegmentsFunc
	// HostSync, when set, is called before a host socket leg's final
	// reading and before a pooled one goes back to the pool: it waits
	// (briefly; at once when the capture is idle) until the capture
	// behind HostSegments has caught up with the traffic.
	HostSync func()
	// Now is the clock of the per-connection samples and the streaming
	// meter (ConnStats.Start, Throughput, Sample's intervals, the
	// streaming time of AggSample.Waiting) and of the idle watchdog's
	// reckoning; nil means time.Now. Deadlines on the legs and the
	// timers' own waits stay on the wall clock.
	Now func() time.Time
	// OnPanic, if set, hears of each panic recovered in a connection's
	// goroutines: the connection (ID 0 before admission), the value and
	// the stack. It is called once per panic, from that goroutine, and must
	// not block.
	OnPanic func(req *proxy.ConnRequest, v any, stack []byte)
}

func (o ForwarderOptions) withDefaults() ForwarderOptions {
	if o.Host == nil {
		o.Host = &HostDialer{}
	}
	if o.Back == nil {
		o.Back = &StackDialer{}
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = DefaultMaxInFlight
	}
	if o.BufferSize <= 0 {
		o.BufferSize = DefaultBufferSize
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// ForwarderStats are the forwarder's counters, totals since it was created.
type ForwarderStats struct {
	Accepted          uint64 // connections spliced to a target; for http services, client connections admitted
	RefusedRST        uint64 // refused with RST
	Refused503        uint64 // answered with a 503 page
	NoService         uint64 // SYNs to an address:port that is no virtual server (RST)
	RefusedClosed     uint64 // SYNs after Drain or Close (RST, no SYN-ACK)
	DroppedInFlight   uint64 // SYNs dropped: MaxInFlight or InFlightPerVIP pending (tcp.Forwarder path), or a listener's accept queue full
	SYNCookiesSent    uint64 // SYN-ACKs with a SYN cookie (a listener's backlog was full)
	SYNCookiesValid   uint64 // ACKs with a valid cookie: connections established from a cookie
	SYNCookiesInvalid uint64 // ACKs to a listener with no valid cookie (dropped)
	Listeners         int    // listening endpoints now (VIP and port pairs)
	TargetTimedOut    uint64 // spliced connections whose target sent nothing within FirstByteTimeout
	Panics            uint64 // panics recovered in connection goroutines (each ended its connection)
	DialFailed        uint64 // failed dials to targets
	HandshakeTimedOut uint64 // client handshakes aborted by HandshakeTimeout (tcp.Forwarder path)
	HandshakeFailed   uint64 // client handshakes that failed otherwise (RST from the client; tcp.Forwarder path)
	IdleClosed        uint64 // connections closed by IdleTimeout
	Aborted           uint64 // connections Close ended (pending or spliced)
	NoSession         uint64 // Accepts without a Session, refused with RST (an Admitter bug)
	TimeWaitReopened  uint64 // SYNs that ended a TIME_WAIT on their 4-tuple and opened a new connection
	CookieReplays     uint64 // connections a listener made of an ended connection's late segment (a valid-looking SYN cookie, no SYN since), aborted before admission
	UDPUnreachable    uint64 // UDP datagrams to no socket, answered with ICMP port unreachable
	HTTPRequests      uint64 // http requests whose head was parsed (http virtual servers)
	HTTPRefused       uint64 // of those, answered with the 503 page (also in Refused503)
	HTTPHeaderTimeout uint64 // request heads not complete within HeaderTimeout (408)
	HTTPHeaderTooBig  uint64 // request heads over MaxHeaderBytes (431)
	HTTPBadRequest    uint64 // malformed heads, Content-Length with Transfer-Encoding, bodies the client malformed or cut short (400)
	HTTPRetried       uint64 // idempotent requests sent again on a fresh target connection after a pooled one failed
	HTTPBadGateway    uint64 // requests whose target failed mid-exchange (502, or a cut response)
	HTTPBodyTimeout   uint64 // admitted requests whose client stalled its body past the idle timeout (408)
	HTTPClients       int64  // http client connections open now
	TargetConns       int64  // http target connections open now (in use or pooled)
	TargetConnsIdle   int    // of those, idle in the pool
	Open              int64  // connections open now (spliced)
	Pending           int64  // connections between SYN (or accept) and splice now (handshake on the tcp.Forwarder path, admission, dial)

	// ListenDropped: segments past the SYN that listeners dropped, by cause.
	ListenDropped ListenDrops
}

// Forwarder terminates TCP connections to virtual servers on a Stack's
// promiscuous NICs, asks an Admitter about each once the client's handshake
// is complete, and splices accepted ones to their targets.
type Forwarder struct {
	s    *Stack
	opts ForwarderOptions
	fwd  *tcp.Forwarder
	ctx  context.Context // cancelled by Close: ends dials
	stop context.CancelFunc

	nextID  atomic.Uint64
	bufPool sync.Pool       // *[]byte of BufferSize
	workers *proxy.WarmPool // serve and splice goroutines, reused

	mu      sync.Mutex
	closed  bool                                                      // protected by mu
	conns   map[uint64]*connEntry                                     // protected by mu: open connections
	pending map[stack.TransportEndpointID]tcpip.NetworkProtocolNumber // protected by mu: handshakes in progress
	wg      sync.WaitGroup                                            // handler goroutines and the splices they start

	tw      timeWaitTable
	closing proxy.ClosingSet // spliced connections waiting for the client's FIN (proxy/release.go)

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

	sampleMu sync.Mutex
	sampler  sampler // protected by sampleMu

	accepted, refusedRST, refused503, noService, refusedClosed atomic.Uint64
	dialFailed, hsTimedOut, hsFailed, idleClosed               atomic.Uint64
	aborted, noSession, targetTimedOut, panics                 atomic.Uint64
	open, pendingN                                             atomic.Int64

	// http virtual servers (httpproxy.go, pool.go)
	pool                                                                   pool
	httpConns                                                              map[*Conn]struct{} // protected by mu: open http client connections
	requests, requestsRefused, httpRetried                                 atomic.Uint64
	httpHeaderTimedOut, httpHeaderTooLarge, httpBadRequest, httpBadGateway atomic.Uint64
	httpBodyTimedOut                                                       atomic.Uint64
	httpClients, backends                                                  atomic.Int64
}

// NewForwarder installs a TCP forwarder on s: from now on every SYN that
// matches no open connection goes through it. UDP to no socket is answered
// with ICMP port unreachable and counted. Only one Forwarder per Stack.
func NewForwarder(s *Stack, opts ForwarderOptions) *Forwarder {
	opts = opts.withDefaults()
	ctx, stop := context.WithCancel(context.Background())
	f := &Forwarder{
		s:       s,
		opts:    opts,
		ctx:     ctx,
		stop:    stop,
		conns:   make(map[uint64]*connEntry),
		pending: make(map[stack.TransportEndpointID]tcpip.NetworkProtocolNumber),

		listeners:  make(map[netip.AddrPort]*listener),
		vipPending: make(map[netip.Addr]int),
	}
	f.bufPool.New = func() any {
		b := make([]byte, opts.BufferSize)
		return &b
	}
	f.tw.init()
	f.workers = proxy.NewWarmPool(proxy.DefaultWarmIdle)
	f.sampler.init(f.now())
	f.fwd = tcp.NewForwarder(s.s, 0, opts.MaxInFlight, f.handle)
	s.s.SetTransportProtocolHandler(tcp.ProtocolNumber, f.fwd.HandlePacket)
	// Returning false lets the stack answer with ICMP port unreachable.
	s.s.SetTransportProtocolHandler(udp.ProtocolNumber, func(stack.TransportEndpointID, *stack.PacketBuffer) bool { return false })
	hook := f.tw.onSYN
	s.setSYNHook(&hook)
	return f
}

// now reads the forwarder's clock (ForwarderOptions.Now).
func (f *Forwarder) now() time.Time { return f.opts.Now() }

// Stats returns the forwarder's counters.
func (f *Forwarder) Stats() ForwarderStats {
	st := f.s.s.Stats()
	return ForwarderStats{
		Accepted:          f.accepted.Load(),
		RefusedRST:        f.refusedRST.Load(),
		Refused503:        f.refused503.Load(),
		NoService:         f.noService.Load(),
		RefusedClosed:     f.refusedClosed.Load(),
		DroppedInFlight:   st.TCP.ForwardMaxInFlightDrop.Value() + f.vipDropped.Load() + st.TCP.ListenOverflowSynDrop.Value(),
		SYNCookiesSent:    st.TCP.ListenOverflowSynCookieSent.Value(),
		SYNCookiesValid:   st.TCP.ListenOverflowSynCookieRcvd.Value(),
		SYNCookiesInvalid: st.TCP.ListenOverflowInvalidSynCookieRcvd.Value(),
		ListenDropped:     f.listenDrops(),
		Listeners:         f.listenerCount(),
		TargetTimedOut:    f.targetTimedOut.Load(),
		Panics:            f.panics.Load(),
		DialFailed:        f.dialFailed.Load(),
		HandshakeTimedOut: f.hsTimedOut.Load(),
		HandshakeFailed:   f.hsFailed.Load(),
		IdleClosed:        f.idleClosed.Load(),
		Aborted:           f.aborted.Load(),
		NoSession:         f.noSession.Load(),
		TimeWaitReopened:  f.tw.reopened.Load(),
		CookieReplays:     f.tw.recent.replays.Load(),
		UDPUnreachable:    st.UDP.UnknownPortErrors.Value(),
		HTTPRequests:      f.requests.Load(),
		HTTPRefused:       f.requestsRefused.Load(),
		HTTPHeaderTimeout: f.httpHeaderTimedOut.Load(),
		HTTPHeaderTooBig:  f.httpHeaderTooLarge.Load(),
		HTTPBadRequest:    f.httpBadRequest.Load(),
		HTTPRetried:       f.httpRetried.Load(),
		HTTPBadGateway:    f.httpBadGateway.Load(),
		HTTPBodyTimeout:   f.httpBodyTimedOut.Load(),
		HTTPClients:       f.httpClients.Load(),
		TargetConns:       f.backends.Load(),
		TargetConnsIdle:   f.pool.idleCount(),
		Open:              f.open.Load(),
		Pending:           f.pendingN.Load(),
	}
}

// Close stops admitting (new SYNs get RST), aborts pending handshakes and
// dials, closes every open connection and waits for all of the forwarder's
// goroutines. The stack stays up.
func (f *Forwarder) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	conns := make([]*connEntry, 0, len(f.conns))
	for _, c := range f.conns {
		conns = append(conns, c)
	}
	pend := make(map[stack.TransportEndpointID]tcpip.NetworkProtocolNumber, len(f.pending))
	for id, p := range f.pending {
		pend[id] = p
	}
	f.mu.Unlock()
	f.stop()
	f.closeListeners()
	for id, p := range pend {
		f.abortHandshake(p, id)
	}
	for _, c := range conns {
		c.aborted.Store(true)
		c.abort()
	}
	f.mu.Lock()
	for c := range f.httpConns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
	f.pool.closeAll(f)
	f.workers.Close()
	f.s.setSYNHook(nil)
	f.tw.recent.stop()
	return nil
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
	var req *proxy.ConnRequest
	defer f.recoverConn(&req, func() { r.Complete(true) })

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
	f.pendingN.Add(1)
	client, err := f.handshake(r, protoOf(vip.Addr()), t.Handshake)
	f.vipLeave(vip.Addr())
	if err != nil {
		f.pendingN.Add(-1)
		return
	}
	f.serve(&req, client, vip)
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

// serve admits an established client connection, dials its target and
// splices the two, or refuses it. It runs in the connection's goroutine;
// Pending has been counted for it and serve uncounts it. *reqp is set as
// soon as the request exists, for the caller's panic report.
func (f *Forwarder) serve(reqp **proxy.ConnRequest, client *Conn, vip netip.AddrPort) {
	pendingDone := sync.OnceFunc(func() { f.pendingN.Add(-1) })
	defer pendingDone()
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
		client.reset()
		return
	}
	req.ID = f.nextID.Add(1)
	*reqp = req
	if f.opts.Admitter == nil {
		f.refusedRST.Add(1)
		client.reset()
		return
	}
	t := req.Service.Timeouts
	var (
		d      proxy.Decision
		sess   proxy.Session
		target proxy.Leg
		ended  bool
	)
	end := proxy.End{Stats: proxy.ConnStats{ID: req.ID, Client: req.Client, VIP: req.VIP, Service: req.Service.Name, Start: f.now()}}
	report := func(o proxy.Outcome, d proxy.Decision, err error) {
		if sess == nil || ended {
			return
		}
		ended = true
		end.Outcome, end.Decision, end.Err, end.Dials = o, d, err, req.Attempt
		if end.Stats.Target == "" {
			end.Stats.Target = targetName(d)
		}
		sess.End(&end)
	}
	defer func() {
		// A panic (in Admit, a Session, a dial) still gives the session
		// its End and closes what the connection holds; the caller's
		// recoverConn counts and reports it.
		if v := recover(); v != nil {
			client.reset()
			if target != nil {
				target.Close()
			}
			func() {
				defer func() { _ = recover() }() // a Session that panics again in End
				report(proxy.Panicked, d, fmt.Errorf("panic: %v", v))
			}()
			panic(v)
		}
	}()
	if ra := f.opts.RequestAdmitter; ra != nil && req.Service.Proto == policy.ProtoHTTP {
		f.serveHTTP(req, client, ra, t, pendingDone)
		return
	}
	hook("admit")
	since := f.closing.Gen()
	f.closing.PreSettle(req.Client.Addr())
	req.SettleFunc = func() bool { return f.closing.Settle(req.Client.Addr(), proxy.SettleWait, since) }
	d, sess = f.opts.Admitter.Admit(req)
	if d.Verdict == proxy.Accept && sess == nil {
		f.noSession.Add(1)
		d = proxy.Decision{Verdict: proxy.RefuseRST, Reason: "accepted without a session"}
	}
	for d.Verdict == proxy.Accept {
		var err error
		target, err = f.dial(d, t.Connect)
		if err == nil {
			break
		}
		if f.ctx.Err() != nil {
			// Close cut the dial: no fault of the target's to report.
			f.aborted.Add(1)
			client.reset()
			report(proxy.Aborted, d, err)
			return
		}
		f.dialFailed.Add(1)
		req.Attempt++
		d = sess.DialFailed(d, err)
	}
	pendingDone()
	isHTTP := req.Service.Proto == policy.ProtoHTTP
	switch {
	case d.Verdict == proxy.Refuse503 && isHTTP:
		f.refused503.Add(1)
		line, n := proxy.Serve503(client, pageOf(d), t.RequestRead)
		end.Refusal = proxy.Refusal{Status: 503, RequestLine: line, Bytes: n}
		report(proxy.RefusedPage, d, nil)
		return
	case d.Verdict != proxy.Accept:
		f.refusedRST.Add(1)
		client.reset()
		report(proxy.RefusedReset, d, nil)
		return
	}
	f.accepted.Add(1)
	ended = true // splice reports the End
	f.splice(req, d, sess, client, target, t)
}

// hook is a test hook: tests set testHook to make a stage panic. Unset in
// production, where it costs one atomic load and a compare per call.
func hook(stage string) {
	if h := testHook.Load(); h != nil {
		(*h)(stage)
	}
}

// testHook, when set by a test, is called with the name of each hooked
// stage ("admit", "splice").
var testHook atomic.Pointer[func(stage string)]

// recoverConn recovers a panic in a connection goroutine: counts it,
// reports it to OnPanic with the stack, and runs cleanup (which closes
// what the goroutine holds). Deferred first thing in each such goroutine;
// *reqp is the connection's request once it has one.
func (f *Forwarder) recoverConn(reqp **proxy.ConnRequest, cleanup func()) {
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
	f.recoverConnValue(reqp, v)
}

// recoverConnValue counts a recovered panic and reports it to OnPanic.
func (f *Forwarder) recoverConnValue(reqp **proxy.ConnRequest, v any) {
	f.panics.Add(1)
	if f.opts.OnPanic != nil {
		req := *reqp
		if req == nil {
			req = &proxy.ConnRequest{}
		}
		f.opts.OnPanic(req, v, debug.Stack())
	}
}

// dial opens the target leg of an Accept decision, within timeout.
func (f *Forwarder) dial(d proxy.Decision, timeout time.Duration) (proxy.Leg, error) {
	if d.Target == nil {
		return nil, errors.New("netstack: accept decision without a target")
	}
	dl := d.Dialer
	if dl == nil {
		dl = f.opts.Host
		if d.Target.Via == policy.DialNetstack {
			dl = f.opts.Back
		}
	}
	ctx, cancel := context.WithTimeout(f.ctx, timeout)
	defer cancel()
	return dl.DialTarget(ctx, d.Target.Addr)
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
