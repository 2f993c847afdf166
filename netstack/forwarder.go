package netstack

// Connection flow
//
//	SYN ──► gVisor forwarder (≤ MaxInFlight pending, else dropped and counted)
//	    ──► handle (own goroutine): Services(VIP, port)
//	          none        ──► RST                                 NoService
//	          Admit ──► RefuseRST ──► RST, no SYN-ACK ever sent   RefusedRST
//	                ──► Refuse503 ──► handshake ──► 503 page ──► close   Refused503
//	                ──► Accept ──► dial target (DialFailed may pick another)
//	                                 all failed ──► RST or 503    DialFailed
//	                               ──► handshake (HandshakeTimeout aborts it)
//	                               ──► splice client ⇄ target ──► Closed(final stats)
//
// The target is dialed before the client's handshake completes, so a client
// is never left connected to nothing: it gets a SYN-ACK only once its target
// answered.

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
	DefaultMaxDialAttempts  = 3               // dials per connection
	DefaultRequestTimeout   = 2 * time.Second // reading a refused HTTP request
	DefaultRetryAfter       = 5 * time.Second // the 503's Retry-After
)

// ConnRequest describes a new connection asking to be admitted.
type ConnRequest struct {
	// ID identifies the connection in Conns and Closed; it is unique for
	// the forwarder's life.
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
	// Action is the policy action the connection falls under, for the
	// per-action aggregation and the MinRate verdict; nil: none.
	Action *policy.Action
	// Dialer dials Target; nil means the forwarder's dialer for Target.Via.
	Dialer Dialer
	// Limit names the limit that tripped ("MaxConnections",
	// "MaxBandwidth", …) and Value is its configured value; Reason is a
	// sentence for the 503 page. They are reported in refusals.
	Limit  string
	Value  int64
	Reason string
	// RetryAfter is the 503's Retry-After; zero means DefaultRetryAfter.
	RetryAfter time.Duration
}

// Admitter decides about new connections. It is called from many goroutines
// at once. Every Decision with Verdict Accept is followed by exactly one call
// of DialFailed (its dial failed) or Closed (the connection ended, for any
// reason), so an implementation can count open connections per target.
type Admitter interface {
	// Admit is called before any SYN-ACK is sent.
	Admit(req *ConnRequest) Decision
	// DialFailed reports that dialing failed.Target failed with err and
	// asks what to do next: another Accept to try another target, or a
	// refusal. After ForwarderOptions.MaxDialAttempts failures the
	// forwarder refuses whatever it answers (and reports an Accept it
	// returned then through DialFailed again, with ErrDialAttempts).
	DialFailed(req *ConnRequest, failed Decision, err error) Decision
	// Closed reports the end of an accepted connection with its final
	// statistics.
	Closed(req *ConnRequest, d Decision, final ConnStats)
}

// RefusalReporter is implemented by an Admitter that wants to hear how each
// refused connection to a virtual server ended, for an access log. Refused
// is called once per refusal, after the RST was sent or the 503 page
// written; it must not block.
type RefusalReporter interface {
	Refused(req *ConnRequest, d Decision, r Refusal)
}

// Refusal is how a refused connection ended.
type Refusal struct {
	// Status is 503 when a page was served, 0 for a RST.
	Status int
	// RequestLine is the HTTP request line read before the 503 page ("" if
	// none arrived in time); Bytes is the size of the response sent.
	RequestLine string
	Bytes       int
}

// ErrDialAttempts is passed to DialFailed for an Accept decision the
// forwarder did not try because MaxDialAttempts dials had failed.
var ErrDialAttempts = errors.New("netstack: too many failed dial attempts")

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
	// MaxDialAttempts bounds the dials for one connection; zero means
	// DefaultMaxDialAttempts.
	MaxDialAttempts int
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
	if o.MaxDialAttempts <= 0 {
		o.MaxDialAttempts = DefaultMaxDialAttempts
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
	adm := f.opts.Admitter
	d := adm.Admit(req)
	var target Leg
	for d.Verdict == Accept {
		if req.Attempt >= f.opts.MaxDialAttempts {
			adm.DialFailed(req, d, ErrDialAttempts)
			d = Decision{Verdict: Refuse503, Limit: "MaxDialAttempts", Value: int64(f.opts.MaxDialAttempts),
				Reason: "No target of this service could be reached."}
			break
		}
		var err error
		target, err = f.dial(d)
		if err == nil {
			break
		}
		f.dialFailed.Add(1)
		req.Attempt++
		d = adm.DialFailed(req, d, err)
	}
	isHTTP := req.Service.Proto == policy.ProtoHTTP
	rep, _ := adm.(RefusalReporter)
	if d.Verdict == RefuseRST || d.Verdict == Refuse503 && !isHTTP || d.Verdict > Refuse503 {
		f.refusedRST.Add(1)
		r.Complete(true)
		if rep != nil {
			rep.Refused(req, d, Refusal{})
		}
		return
	}

	proto := protoOf(req.VIP.Addr())
	client, err := f.handshake(r, proto)
	if err != nil {
		if target != nil {
			final := ConnStats{ID: req.ID, Client: req.Client, VIP: req.VIP, Start: time.Now()}
			target.Close()
			adm.Closed(req, d, final)
		}
		return
	}
	pendingDone()
	if d.Verdict == Refuse503 {
		f.refused503.Add(1)
		line, n := f.serve503(client, d)
		if rep != nil {
			rep.Refused(req, d, Refusal{Status: 503, RequestLine: line, Bytes: n})
		}
		return
	}
	f.accepted.Add(1)
	f.splice(req, d, client, target)
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
// HandshakeTimeout. It always completes r.
func (f *Forwarder) handshake(r *tcp.ForwarderRequest, proto tcpip.NetworkProtocolNumber) (*Conn, error) {
	id := r.ID()
	f.mu.Lock()
	f.pending[id] = proto
	f.mu.Unlock()
	var timedOut atomic.Bool
	timer := time.AfterFunc(f.opts.HandshakeTimeout, func() {
		timedOut.Store(true)
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
		if timedOut.Load() {
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
