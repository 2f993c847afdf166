package netstack

// Connection flow
//
//	SYN ──► gVisor forwarder (≤ MaxInFlight pending, else dropped and counted)
//	    ──► handle (own goroutine): Services(VIP, port)
//	          none        ──► RST                                 NoService
//	          Admit ──► (Decision, Session)
//	                ──► RefuseRST ──► RST, no SYN-ACK ever sent   RefusedRST   End(RefusedRST)
//	                ──► Refuse503 ──► handshake ──► 503 page ──► close   Refused503   End(Refused503)
//	                ──► Accept ──► dial target; failed: Session.DialFailed answers
//	                               (another Accept, until the balancer's tried-set
//	                               refuses) ──► RST or 503               DialFailed
//	                               ──► handshake (HandshakeTimeout aborts it)  End(HandshakeFailed)
//	                               ──► splice client ⇄ target ──► End(Served | IdleClosed)
//
// The target is dialed before the client's handshake completes, so a client
// is never left connected to nothing: it gets a SYN-ACK only once its target
// answered. Every Session gets exactly one End, whatever happens.

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"

	"weir/policy"
)

// Defaults applied where a ForwarderOptions field is zero.
const (
	DefaultMaxInFlight      = 1024            // connections between SYN and splice
	DefaultHandshakeTimeout = 5 * time.Second // client handshake, SYN-ACK to final ACK
	DefaultDialTimeout      = 3 * time.Second // one dial to a target
	DefaultIdleTimeout      = 5 * time.Minute // no byte either way
	DefaultBufferSize       = 32 << 10        // splice buffer per direction, bytes
	DefaultRequestTimeout   = 2 * time.Second // reading a refused HTTP request
	DefaultRetryAfter       = 5 * time.Second // the 503's Retry-After
)

// ConnRequest describes a new connection asking to be admitted. The
// forwarder owns it; a Session may read it (it does not change after Admit
// except Attempt) until its End returns.
type ConnRequest struct {
	// ID identifies the connection in Conns and in its End's Stats; it is
	// unique for the forwarder's life.
	ID      uint64
	Client  netip.AddrPort        // the client's address and port
	VIP     netip.AddrPort        // the virtual server address and port it asked for
	Service *policy.VirtualServer // the virtual server found for VIP; never nil
	// Attempt is 0 in Admit and counts the failed dials in DialFailed.
	Attempt int
}

// Verdict is an admission answer.
type Verdict uint8

const (
	// Accept connects the client to Decision.Target.
	Accept Verdict = iota
	// RefuseRST answers the SYN with RST; no SYN-ACK is sent.
	RefuseRST
	// Refuse503 completes the handshake and answers with an HTTP 503 page
	// naming Decision.Limit and Decision.Value, then closes. For a tcp
	// virtual server it acts as RefuseRST.
	Refuse503
)

// String returns the verdict's name.
func (v Verdict) String() string {
	switch v {
	case Accept:
		return "accept"
	case RefuseRST:
		return "refuse-rst"
	case Refuse503:
		return "refuse-503"
	}
	return "verdict(?)"
}

// Decision is the Admitter's answer for one connection request.
type Decision struct {
	Verdict Verdict
	// Target is where an accepted connection goes; Accept needs it.
	Target *policy.Target
	// Action is the policy action the connection falls under (the datapath
	// flow's), for the per-target, per-action aggregation of Sample; nil:
	// none.
	Action *policy.Action
	// Dialer dials Target; nil means the forwarder's dialer for Target.Via.
	Dialer Dialer
	// Limit names the limit that tripped, as the Admitter spells it: weir's
	// appliance sends policy.LimitKind's configuration names,
	// "maxConnections" and "maxBandwidth", and "targets" when no target
	// could serve. Value is the limit's configured value (for "targets",
	// how many targets were named); Reason is a sentence for the 503 page.
	// The page shows all three as given.
	Limit  string
	Value  int64
	Reason string
	// RetryAfter is the 503's Retry-After; zero means DefaultRetryAfter.
	RetryAfter time.Duration
}

// Admitter decides about new connections. Admit is called from many
// goroutines at once, once per SYN to a virtual server, before any SYN-ACK.
type Admitter interface {
	// Admit returns the first decision and the connection's Session. The
	// Session may be nil only with a refusal, when the Admitter wants to
	// hear nothing more of the connection; an Accept without a Session is
	// refused with RST. Admit must not keep req past the Session's End.
	Admit(req *ConnRequest) (Decision, Session)
}

// Session follows one connection after Admit: it is where the Admitter keeps
// what it reserved for the connection (an admission ticket, a target slot)
// and learns what became of them. The forwarder calls it only from the
// connection's own goroutine, one call at a time: DialFailed once per failed
// dial, then End exactly once. After End returns the forwarder holds no
// reference to the Session, and the Session must release what it holds.
type Session interface {
	// DialFailed reports that dialing failed.Target failed with err and
	// asks what to do next: another Accept to try another target, or a
	// refusal. The forwarder dials every Accept it is given: bounding the
	// attempts is the Session's (weir's balancer tried-set does it). A dial
	// cut short by Forwarder.Close is not reported here; the connection
	// ends with Aborted.
	DialFailed(failed Decision, err error) Decision
	// End reports how the connection ended. e is valid only during the
	// call. It must not block.
	End(e *End)
}

// Outcome is how a connection ended.
type Outcome uint8

// The outcomes End reports. Their String forms are the access log's.
const (
	// Served: spliced to its target, then closed by the client or target.
	Served Outcome = iota
	// IdleClosed: spliced, then closed by IdleTimeout.
	IdleClosed
	// RefusedReset: refused with RST before any SYN-ACK (a RefuseRST, or a
	// Refuse503 for a tcp virtual server).
	RefusedReset
	// RefusedPage: answered with the 503 page.
	RefusedPage
	// HandshakeFailed: the client's handshake failed (RST from the client)
	// after the target was dialed, or before a 503 page.
	HandshakeFailed
	// HandshakeTimedOut: HandshakeTimeout aborted the client's handshake.
	HandshakeTimedOut
	// Aborted: Forwarder.Close ended the connection.
	Aborted
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"ok", "idle", "reset", "503", "handshake-failed", "handshake-timeout", "aborted"}

// String returns the outcome as the access log writes it: "ok", "idle",
// "reset", "503", "handshake-failed", "handshake-timeout", "aborted".
func (o Outcome) String() string {
	if o < numOutcomes {
		return outcomeNames[o]
	}
	return "outcome(?)"
}

// End is how one connection ended, for Session.End.
type End struct {
	Outcome Outcome
	// Decision is the last decision made: the Accept whose target was
	// dialed (Served, IdleClosed, handshake failures after a dial), or the
	// refusal with its Limit, Value and Reason.
	Decision Decision
	// Refusal says what a refused client was sent (RefusedReset,
	// RefusedPage).
	Refusal Refusal
	// Stats are the connection's final statistics. For a connection never
	// spliced only ID, Client, VIP, Service, Target and Start are set.
	Stats ConnStats
	// Dials is the number of failed dials before the end.
	Dials int
	// Err is the handshake's error for the handshake outcomes, the dial's
	// for an Aborted dial; nil otherwise.
	Err error
}

// Refusal is what a refused client was sent.
type Refusal struct {
	// Status is 503 when a page was served, 0 for a RST.
	Status int
	// RequestLine is the HTTP request line read before the 503 page ("" if
	// none arrived in time); Bytes is the size of the response sent.
	RequestLine string
	Bytes       int
}

// ForwarderOptions configure a Forwarder. The zero value works: it answers
// for no virtual server (every SYN gets RST).
type ForwarderOptions struct {
	// Services finds the virtual server for an address and port, or nil.
	// It must not allocate or block (policy.Config.Service does neither).
	// Nil means there is none.
	Services func(addr netip.Addr, port uint16) *policy.VirtualServer
	// Admitter decides about each connection to a virtual server; nil
	// refuses every one with RST.
	Admitter Admitter
	// Host dials DialHost targets; nil means a zero HostDialer.
	Host Dialer
	// Back dials DialNetstack targets; nil means such dials fail with
	// ErrNoBackArm.
	Back Dialer
	// MaxInFlight bounds connections between SYN and established (admission,
	// dial, handshake); further SYNs are dropped and counted. Zero means
	// DefaultMaxInFlight.
	MaxInFlight int
	// HandshakeTimeout aborts a client handshake that has not completed, and
	// frees its slot; zero means DefaultHandshakeTimeout (gVisor alone would
	// hold it about two minutes).
	HandshakeTimeout time.Duration
	// DialTimeout bounds one dial to a target; zero means DefaultDialTimeout.
	DialTimeout time.Duration
	// IdleTimeout closes a connection with no byte in either direction for
	// this long; zero means DefaultIdleTimeout, negative means never.
	IdleTimeout time.Duration
	// BufferSize is the splice buffer per direction, in bytes; zero means
	// DefaultBufferSize.
	BufferSize int
	// RequestTimeout bounds reading an HTTP request before a 503 answer;
	// zero means DefaultRequestTimeout.
	RequestTimeout time.Duration
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
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.IdleTimeout == 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.BufferSize <= 0 {
		o.BufferSize = DefaultBufferSize
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = DefaultRequestTimeout
	}
	return o
}

// ForwarderStats are the forwarder's counters, totals since it was created.
type ForwarderStats struct {
	Accepted          uint64 // connections spliced to a target
	RefusedRST        uint64 // refused with RST before any SYN-ACK
	Refused503        uint64 // answered with a 503 page
	NoService         uint64 // SYNs to an address:port that is no virtual server (RST)
	RefusedClosed     uint64 // SYNs after Close (RST)
	DroppedInFlight   uint64 // SYNs dropped because MaxInFlight were pending
	DialFailed        uint64 // failed dials to targets
	HandshakeTimedOut uint64 // client handshakes aborted by HandshakeTimeout
	HandshakeFailed   uint64 // client handshakes that failed otherwise (RST from the client)
	IdleClosed        uint64 // connections closed by IdleTimeout
	Aborted           uint64 // connections Close ended (pending or spliced)
	NoSession         uint64 // Accepts without a Session, refused with RST (an Admitter bug)
	TimeWaitReopened  uint64 // SYNs that ended a TIME_WAIT on their 4-tuple and opened a new connection
	UDPUnreachable    uint64 // UDP datagrams to no socket, answered with ICMP port unreachable
	Open              int64  // connections open now (spliced)
	Pending           int64  // connections between SYN and splice now (admission, dial, handshake)
}

// Forwarder terminates TCP connections to virtual servers on a Stack's
// promiscuous NICs, asks an Admitter about each before any SYN-ACK, and
// splices accepted ones to their targets.
type Forwarder struct {
	s    *Stack
	opts ForwarderOptions
	fwd  *tcp.Forwarder
	ctx  context.Context // cancelled by Close: ends dials
	stop context.CancelFunc

	nextID  atomic.Uint64
	bufPool sync.Pool // *[]byte of BufferSize

	mu      sync.Mutex
	closed  bool                                                      // protected by mu
	conns   map[uint64]*connEntry                                     // protected by mu: open connections
	pending map[stack.TransportEndpointID]tcpip.NetworkProtocolNumber // protected by mu: handshakes in progress
	wg      sync.WaitGroup                                            // handler goroutines

	tw timeWaitTable

	sampleMu sync.Mutex
	sampler  sampler // protected by sampleMu

	accepted, refusedRST, refused503, noService, refusedClosed atomic.Uint64
	dialFailed, hsTimedOut, hsFailed, idleClosed               atomic.Uint64
	aborted, noSession                                         atomic.Uint64
	open, pendingN                                             atomic.Int64
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
	}
	f.bufPool.New = func() any {
		b := make([]byte, opts.BufferSize)
		return &b
	}
	f.tw.init()
	f.sampler.init(time.Now())
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
		Accepted:          f.accepted.Load(),
		RefusedRST:        f.refusedRST.Load(),
		Refused503:        f.refused503.Load(),
		NoService:         f.noService.Load(),
		RefusedClosed:     f.refusedClosed.Load(),
		DroppedInFlight:   st.TCP.ForwardMaxInFlightDrop.Value(),
		DialFailed:        f.dialFailed.Load(),
		HandshakeTimedOut: f.hsTimedOut.Load(),
		HandshakeFailed:   f.hsFailed.Load(),
		IdleClosed:        f.idleClosed.Load(),
		Aborted:           f.aborted.Load(),
		NoSession:         f.noSession.Load(),
		TimeWaitReopened:  f.tw.reopened.Load(),
		UDPUnreachable:    st.UDP.UnknownPortErrors.Value(),
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
	for id, p := range pend {
		f.abortHandshake(p, id)
	}
	for _, c := range conns {
		c.aborted.Store(true)
		c.abort()
	}
	f.wg.Wait()
	f.s.setSYNHook(nil)
	return nil
}

// handle runs in its own goroutine, one per SYN the gVisor forwarder admits
// into its in-flight set.
func (f *Forwarder) handle(r *tcp.ForwarderRequest) {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		f.refusedClosed.Add(1)
		r.Complete(true)
		return
	}
	f.wg.Add(1)
	f.mu.Unlock()
	defer f.wg.Done()

	id := r.ID()
	req := &ConnRequest{
		Client: netip.AddrPortFrom(netipAddr(id.RemoteAddress), id.RemotePort),
		VIP:    netip.AddrPortFrom(netipAddr(id.LocalAddress), id.LocalPort),
	}
	if f.opts.Services != nil {
		req.Service = f.opts.Services(req.VIP.Addr(), req.VIP.Port())
	}
	if req.Service == nil {
		f.noService.Add(1)
		r.Complete(true)
		return
	}
	req.ID = f.nextID.Add(1)
	// Pending counts the connection from here until it is spliced, refused
	// or failed.
	f.pendingN.Add(1)
	pendingDone := sync.OnceFunc(func() { f.pendingN.Add(-1) })
	defer pendingDone()
	if f.opts.Admitter == nil {
		f.refusedRST.Add(1)
		r.Complete(true)
		return
	}
	d, sess := f.opts.Admitter.Admit(req)
	if d.Verdict == Accept && sess == nil {
		f.noSession.Add(1)
		d = Decision{Verdict: RefuseRST, Reason: "accepted without a session"}
	}
	end := End{Stats: ConnStats{ID: req.ID, Client: req.Client, VIP: req.VIP, Service: req.Service.Name, Start: time.Now()}}
	report := func(o Outcome, d Decision, err error) {
		if sess == nil {
			return
		}
		end.Outcome, end.Decision, end.Err, end.Dials = o, d, err, req.Attempt
		if end.Stats.Target == "" {
			end.Stats.Target = targetName(d)
		}
		sess.End(&end)
	}
	var target Leg
	for d.Verdict == Accept {
		var err error
		target, err = f.dial(d)
		if err == nil {
			break
		}
		if f.ctx.Err() != nil {
			// Close cut the dial: no fault of the target's to report.
			f.aborted.Add(1)
			r.Complete(true)
			report(Aborted, d, err)
			return
		}
		f.dialFailed.Add(1)
		req.Attempt++
		d = sess.DialFailed(d, err)
	}
	isHTTP := req.Service.Proto == policy.ProtoHTTP
	if d.Verdict != Accept && (d.Verdict != Refuse503 || !isHTTP) {
		f.refusedRST.Add(1)
		r.Complete(true)
		report(RefusedReset, d, nil)
		return
	}

	proto := protoOf(req.VIP.Addr())
	client, timedOut, err := f.handshake(r, proto)
	if err != nil {
		if target != nil {
			target.Close()
		}
		switch {
		case f.ctx.Err() != nil:
			f.aborted.Add(1)
			report(Aborted, d, err)
		case timedOut:
			report(HandshakeTimedOut, d, err)
		default:
			report(HandshakeFailed, d, err)
		}
		return
	}
	pendingDone()
	if d.Verdict == Refuse503 {
		f.refused503.Add(1)
		line, n := f.serve503(client, d)
		end.Refusal = Refusal{Status: 503, RequestLine: line, Bytes: n}
		report(RefusedPage, d, nil)
		return
	}
	f.accepted.Add(1)
	f.splice(req, d, sess, client, target)
}

// dial opens the target leg of an Accept decision.
func (f *Forwarder) dial(d Decision) (Leg, error) {
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
	ctx, cancel := context.WithTimeout(f.ctx, f.opts.DialTimeout)
	defer cancel()
	return dl.DialTarget(ctx, d.Target.Addr)
}

// handshake completes the client's handshake, aborting it after
// HandshakeTimeout (then timedOut is set). It always completes r.
func (f *Forwarder) handshake(r *tcp.ForwarderRequest, proto tcpip.NetworkProtocolNumber) (c *Conn, timedOut bool, err error) {
	id := r.ID()
	f.mu.Lock()
	f.pending[id] = proto
	f.mu.Unlock()
	var expired atomic.Bool
	timer := time.AfterFunc(f.opts.HandshakeTimeout, func() {
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
		return nil, expired.Load(), asError(terr)
	}
	f.s.setKeepalive(ep)
	return newConn(&wq, ep.(*tcp.Endpoint)), false, nil
}

// abortHandshake aborts the endpoint of a handshake in progress, which makes
// CreateEndpoint return.
func (f *Forwarder) abortHandshake(proto tcpip.NetworkProtocolNumber, id stack.TransportEndpointID) {
	if ep := f.s.s.FindTransportEndpoint(proto, tcp.ProtocolNumber, id, 0); ep != nil {
		ep.Abort()
	}
}
