package proxy

// Connection flow, from the accept path's hand-over (weir/netstack accepts
// and hands each established client connection to HandleConn)
//
//	HandleConn (the accept path's goroutine, client established):
//	    tls virtual server ──► its ClientHello read and routed by server
//	        name (tlsroute.go); a bad one or no match: RST     SNIRefused
//	    http virtual server and an Options.HTTP ──► RequestServer.ServeClient
//	        (weir/netstack/proxy/http): admitted, routed and counted
//	        request by request
//	    Admit ──► (Decision, Session)
//	          ──► RefuseRST ──► RST                                   RefusedRST   End(RefusedReset)
//	          ──► Refuse503 ──► 503 page ──► close                    Refused503   End(RefusedPage)
//	          ──► Accept ──► dial target (Connect timeout); failed: Session.DialFailed
//	                         answers (another Accept, until the tried-set refuses)
//	                         ──► RST or 503                           DialFailed
//	                     ──► splice client ⇄ target (splice.go) ──► Released once
//	                         the client has seen it finished (release.go)
//	                         ──► End(Served | IdleClosed)
//	                         target silent FirstByte after the client's first
//	                         byte ──► Session.TargetFailed, 503 page or RST
//	                                                                  End(TargetTimedOut)
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

	"weir/policy"
)

// DefaultBufferSize is the splice buffer per direction, in bytes, where
// Options.BufferSize is zero: a transport default, not a policy one.
const DefaultBufferSize = 32 << 10

// Client is an accepted client connection as the accept path hands it to a
// Handler: a Leg that can be reset and tells its TCP state.
// weir/netstack's Conn is the one weir uses.
type Client interface {
	Leg
	// Reset aborts the connection with a RST and closes it.
	Reset()
	// PeerClosed reports whether the client's FIN has arrived (or the
	// connection is gone).
	PeerClosed() bool
	// Segments is the number of segments the connection sent and received
	// so far, pure ACKs and retransmissions too. It must be cheap (two
	// atomic loads in weir/netstack).
	Segments() uint64
	// Closing is called once a spliced connection has ended, before the
	// proxy closes it: weir/netstack keeps a client leg weir closed first
	// in its TIME_WAIT table.
	Closing()
}

// Handler serves the client connections an accept path (weir/netstack's
// Forwarder) hands it, as tailscale's GetTCPHandlerForFlow handler and
// tcpproxy's Target.HandleConn do. *Proxy is weir's.
type Handler interface {
	// HandleConn serves c, established and asking for req.Service at
	// req.VIP, in the calling goroutine until the connection is spliced
	// (its copying then runs on goroutines of the handler's) or over.
	// req.Client, VIP and Service are set; the rest is the handler's.
	// It is called from many goroutines at once.
	HandleConn(c Client, req *ConnRequest)
	// Drain makes the handler finish the requests in flight and take no
	// new one on a kept-alive connection (Forwarder.Drain).
	Drain()
	// Close ends every connection the handler serves and waits for its
	// goroutines, the HandleConn calls in progress included
	// (Forwarder.Close calls it once it has stopped accepting).
	Close() error
}

// RequestServer serves the client connections of http virtual servers
// request by request (weir/netstack/proxy/http's Server).
type RequestServer interface {
	// ServeClient serves one client connection in the calling goroutine;
	// pendingDone uncounts it from Pending once it is admitted or
	// refused.
	ServeClient(p *Proxy, req *ConnRequest, client Client, pendingDone func())
	// Close closes what the server keeps between connections (its idle
	// target connections); Proxy.Close calls it once every connection
	// has ended.
	Close()
}

// LegMeter measures a target leg per direction (weir/netstack's: the
// datapath's passive counts of a back-arm leg, the host capture or TCP_INFO
// of a host socket). See direction.go.
type LegMeter interface {
	// Directions returns the leg's per-direction totals now, from the
	// target and to it; tg are its counters read at the same time. addrs
	// caches the leg's local and remote addresses between calls (zero the
	// first time); it is the connection's, read under the sampler's lock.
	Directions(target Leg, tg LegCounters, addrs *[2]netip.AddrPort) (from, to DirCounters)
	// Unacked returns the bytes written to the target leg that the target
	// has not acknowledged yet (in flight, or waiting for its window); tg
	// are its counters read at the same time, addrs as for Directions. 0:
	// all acknowledged, or the meter cannot tell.
	Unacked(target Leg, tg LegCounters, addrs *[2]netip.AddrPort) uint64
	// Sync is called before a target leg's final reading and before a
	// pooled one goes back to its pool: it waits (briefly) until the
	// measurement behind Directions has caught up with the traffic.
	Sync(target Leg)
	// Release is called after a target leg's final reading: the
	// measurement behind Directions may forget the leg. addrs as for
	// Directions.
	Release(target Leg, addrs *[2]netip.AddrPort)
}

// Options configure a Proxy. The zero value works: it refuses every
// connection with RST.
type Options struct {
	// Admitter decides about each connection to a virtual server (but
	// those HTTP serves); nil refuses every one with RST.
	Admitter Admitter
	// HTTP serves the connections of http virtual servers request by
	// request; nil: they are admitted by Admitter and spliced as a tcp
	// one's.
	HTTP RequestServer
	// Host dials DialHost targets, Back DialNetstack ones (weir/netstack's
	// HostDialer and StackDialer); nil makes such dials fail with
	// ErrNoDialer.
	Host, Back Dialer
	// BufferSize is the splice buffer per direction, in bytes; zero means
	// DefaultBufferSize.
	BufferSize int
	// Meter measures the target legs per direction; nil means they have
	// none (DirNone).
	Meter LegMeter
	// Now is the clock of the per-connection samples and the streaming
	// meter (ConnStats.Start, Throughput, Sample's intervals, the
	// streaming time of AggSample.Waiting) and of the idle watchdog's
	// reckoning; nil means time.Now. Deadlines on the legs and the
	// timers' own waits stay on the wall clock.
	Now func() time.Time
	// RouteSNI chooses the tls virtual server of a connection by its
	// ClientHello's server name, among those on its VIP and port (weir's:
	// the config in force's policy.Config.RouteSNI); nil: the service the
	// accept path found, if it answers the name (policy's AnswersSNI).
	RouteSNI RouteSNIFunc
	// OnPanic, if set, hears of each panic recovered in a connection's
	// goroutines: the connection (ID 0 before admission), the value and
	// the stack. It is called once per panic, from that goroutine, and must
	// not block.
	OnPanic func(req *ConnRequest, v any, stack []byte)
	// OnProxyRefused, if set, hears of each connection refused for its
	// PROXY-protocol header (a service's AcceptProxy, see proxyhdr.go),
	// counted in Stats.ProxyRefused. It is called from the connection's
	// goroutine before the refusal is sent and must not block.
	OnProxyRefused func(req *ConnRequest, r ProxyRefusal)
}

// ErrNoDialer is the error of a dial through a Dialer that Options left
// nil.
var ErrNoDialer = errors.New("proxy: no dialer for the target's via")

// ErrClosed is the error of a dial after Close.
var ErrClosed = errors.New("proxy: closed")

func (o Options) withDefaults() Options {
	if o.BufferSize <= 0 {
		o.BufferSize = DefaultBufferSize
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// Counters are a Proxy's counts, shared with its RequestServer, which
// counts its connections and requests in them too. Totals since New but
// Open and Pending.
type Counters struct {
	Accepted       atomic.Uint64 // connections spliced to a target; for http services, client connections admitted
	RefusedRST     atomic.Uint64 // refused with RST
	Refused503     atomic.Uint64 // answered with a 503 page
	TargetTimedOut atomic.Uint64 // targets silent within FirstByteTimeout
	Panics         atomic.Uint64 // panics recovered in connection goroutines
	DialFailed     atomic.Uint64 // failed dials to targets
	IdleClosed     atomic.Uint64 // connections closed by IdleTimeout
	Aborted        atomic.Uint64 // connections Close ended (pending or spliced)
	NoSession      atomic.Uint64 // Accepts without a Session (an Admitter bug)
	SNIRouted      atomic.Uint64 // tls connections routed by their ClientHello (tlsroute.go)
	// SNIRefused counts tls connections reset before admission, by
	// SNIRefusalNames' reason.
	SNIRefused [NumSNIRefusals]atomic.Uint64
	// ProxyRefused counts connections refused for their PROXY-protocol
	// header, by reason (ProxyReasons).
	ProxyRefused [NumProxyReasons]atomic.Uint64
	Open         atomic.Int64 // spliced connections open now
	Pending      atomic.Int64 // connections between the hand-over and the splice (admission, dial)
}

// Stats are a Proxy's counters at one moment (see Counters).
type Stats struct {
	Accepted       uint64 // connections spliced to a target; for http services, client connections admitted
	RefusedRST     uint64 // refused with RST
	Refused503     uint64 // answered with a 503 page
	TargetTimedOut uint64 // spliced connections (http requests) whose target sent nothing within FirstByteTimeout
	Panics         uint64 // panics recovered in connection goroutines (each ended its connection)
	DialFailed     uint64 // failed dials to targets
	IdleClosed     uint64 // connections closed by IdleTimeout
	Aborted        uint64 // connections Close ended (pending or spliced)
	NoSession      uint64 // Accepts without a Session, refused (an Admitter bug)
	SNIRouted      uint64 // tls connections routed by their ClientHello's server name
	// SNIRefused are the tls connections reset before admission, by
	// reason (SNIRefusalNames): a bad, oversized, cut-short or slow
	// ClientHello, or a name no service answers.
	SNIRefused [NumSNIRefusals]uint64
	// ProxyRefused are the connections refused for their PROXY-protocol
	// header (RST, or 400 for http), by reason: ProxyReasons[i] names i.
	ProxyRefused [NumProxyReasons]uint64
	Open         int64 // connections open now (spliced)
	Pending      int64 // connections between the hand-over and the splice now (admission, dial)
}

// Proxy admits the client connections an accept path hands it, dials their
// targets and splices the two, or hands an http virtual server's to its
// RequestServer; it keeps every target connection's statistics for Sample
// and Conns. Make one with New; it is a Handler.
type Proxy struct {
	opts Options
	ctx  context.Context // cancelled by Close: ends dials
	stop context.CancelFunc

	nextID  atomic.Uint64
	bufPool sync.Pool // *[]byte of BufferSize
	workers *WarmPool // splice goroutines, reused
	count   Counters

	mu      sync.Mutex
	closed  bool                  // protected by mu
	conns   map[uint64]*connEntry // protected by mu: open target connections
	clients map[Client]struct{}   // protected by mu: open http client connections
	wg      sync.WaitGroup        // HandleConn calls and the splices they start

	closing  ClosingSet // spliced connections waiting for the client's FIN (release.go)
	draining atomic.Bool

	sampleMu sync.Mutex
	sampler  sampler // protected by sampleMu
}

var _ Handler = (*Proxy)(nil)

// New returns a Proxy.
func New(opts Options) *Proxy {
	opts = opts.withDefaults()
	ctx, stop := context.WithCancel(context.Background())
	p := &Proxy{opts: opts, ctx: ctx, stop: stop, conns: make(map[uint64]*connEntry)}
	p.bufPool.New = func() any {
		b := make([]byte, opts.BufferSize)
		return &b
	}
	p.workers = NewWarmPool(DefaultWarmIdle)
	p.sampler.init(p.Now())
	return p
}

// Now reads the proxy's clock (Options.Now).
func (p *Proxy) Now() time.Time { return p.opts.Now() }

// Counters returns the proxy's counters, for its RequestServer to count in.
func (p *Proxy) Counters() *Counters { return &p.count }

// Stopping reports whether the proxy is draining or closed: a kept-alive
// connection takes no further request.
func (p *Proxy) Stopping() bool { return p.draining.Load() || p.ctx.Err() != nil }

// Closed reports whether Close has begun (it cuts dials short: a dial that
// failed then is no fault of its target's).
func (p *Proxy) Closed() bool { return p.ctx.Err() != nil }

// Stats returns the proxy's counters.
func (p *Proxy) Stats() Stats {
	c := &p.count
	st := Stats{
		Accepted: c.Accepted.Load(), RefusedRST: c.RefusedRST.Load(), Refused503: c.Refused503.Load(),
		TargetTimedOut: c.TargetTimedOut.Load(), Panics: c.Panics.Load(), DialFailed: c.DialFailed.Load(),
		IdleClosed: c.IdleClosed.Load(), Aborted: c.Aborted.Load(), NoSession: c.NoSession.Load(),
		SNIRouted: c.SNIRouted.Load(),
		Open:      c.Open.Load(), Pending: c.Pending.Load(),
	}
	for i := range c.SNIRefused {
		st.SNIRefused[i] = c.SNIRefused[i].Load()
	}
	for i := range c.ProxyRefused {
		st.ProxyRefused[i] = c.ProxyRefused[i].Load()
	}
	return st
}

// Drain implements Handler: kept-alive http connections take no further
// request.
func (p *Proxy) Drain() { p.draining.Store(true) }

// Close implements Handler: it aborts dials, closes every open connection
// and waits for all of the proxy's goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	conns := make([]*connEntry, 0, len(p.conns))
	for _, c := range p.conns {
		conns = append(conns, c)
	}
	for c := range p.clients {
		c.Close()
	}
	p.mu.Unlock()
	p.stop()
	for _, c := range conns {
		c.aborted.Store(true)
		c.abort()
	}
	p.wg.Wait()
	if p.opts.HTTP != nil {
		p.opts.HTTP.Close()
	}
	p.workers.Close()
	return nil
}

// Hold registers an http client connection for Close (which must end its
// goroutine) while it is open; the caller calls the release it returns when
// the connection is over. After Close it closes c at once.
func (p *Proxy) Hold(c Client) (release func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.clients == nil {
		p.clients = make(map[Client]struct{})
	}
	p.clients[c] = struct{}{}
	if p.closed {
		c.Close()
	}
	return func() {
		p.mu.Lock()
		delete(p.clients, c)
		p.mu.Unlock()
	}
}

// PageOf is the 503 page for a refusal.
func PageOf(d Decision) Page503 {
	return Page503{Limit: d.Limit, Value: d.Value, Reason: d.Reason, Limits: d.Limits, RetryAfter: d.RetryAfter}
}

// HandleConn implements Handler: it admits an established client
// connection, dials its target and splices the two, or refuses it.
func (p *Proxy) HandleConn(client Client, req *ConnRequest) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.count.Aborted.Add(1)
		client.Reset()
		return
	}
	p.wg.Add(1)
	p.mu.Unlock()
	defer p.wg.Done()
	p.count.Pending.Add(1)
	var reqp *ConnRequest
	defer p.recoverConn(&reqp, client.Reset)
	p.serve(&reqp, req, client)
}

// serve admits an established client connection, dials its target and
// splices the two, or refuses it. It runs in the connection's goroutine;
// Pending has been counted for it and serve uncounts it. *reqp is set as
// soon as the request has its ID, for the caller's panic report.
func (p *Proxy) serve(reqp **ConnRequest, req *ConnRequest, client Client) {
	pendingDone := sync.OnceFunc(func() { p.count.Pending.Add(-1) })
	defer pendingDone()
	req.ID = p.nextID.Add(1)
	*reqp = req
	// The PROXY header comes first on the wire, then the ClientHello.
	if !p.readProxyHeader(req, client) {
		return
	}
	if req.Service.Proto == policy.ProtoTLS {
		var ok bool
		if client, ok = p.routeTLS(req, client); !ok {
			return
		}
	}
	if hs := p.opts.HTTP; hs != nil && req.Service.Proto == policy.ProtoHTTP {
		hs.ServeClient(p, req, client, pendingDone)
		return
	}
	if p.opts.Admitter == nil {
		p.count.RefusedRST.Add(1)
		client.Reset()
		return
	}
	t := req.Service.Timeouts
	var (
		d      Decision
		sess   Session
		target Leg
		ended  bool
	)
	end := End{Stats: ConnStats{ID: req.ID, Client: req.Client, VIP: req.VIP, Service: req.Service.Name, Start: p.Now()}}
	report := func(o Outcome, d Decision, err error) {
		if sess == nil || ended {
			return
		}
		ended = true
		end.Outcome, end.Decision, end.Err, end.Dials = o, d, err, req.Attempt
		if end.Stats.Target == "" {
			end.Stats.Target = TargetName(d)
		}
		sess.End(&end)
	}
	defer func() {
		// A panic (in Admit, a Session, a dial) still gives the session
		// its End and closes what the connection holds; the caller's
		// recoverConn counts and reports it.
		if v := recover(); v != nil {
			client.Reset()
			if target != nil {
				target.Close()
			}
			func() {
				defer func() { _ = recover() }() // a Session that panics again in End
				report(Panicked, d, fmt.Errorf("panic: %v", v))
			}()
			panic(v)
		}
	}()
	since := p.closing.Gen()
	p.closing.PreSettle(req.Client.Addr())
	req.SettleFunc = func() bool { return p.closing.Settle(req.Client.Addr(), SettleWait, since) }
	d, sess = p.opts.Admitter.Admit(req)
	if d.Verdict == Accept && sess == nil {
		p.count.NoSession.Add(1)
		d = Decision{Verdict: RefuseRST, Reason: "accepted without a session"}
	}
	for d.Verdict == Accept {
		var err error
		target, err = p.dial(req, d, t.Connect)
		if err == nil {
			break
		}
		if p.Closed() {
			// Close cut the dial: no fault of the target's to report.
			p.count.Aborted.Add(1)
			client.Reset()
			report(Aborted, d, err)
			return
		}
		p.count.DialFailed.Add(1)
		req.Attempt++
		d = sess.DialFailed(d, err)
	}
	pendingDone()
	isHTTP := req.Service.Proto == policy.ProtoHTTP
	switch {
	case d.Verdict == Refuse503 && isHTTP:
		p.count.Refused503.Add(1)
		line, n := Serve503(client, PageOf(d), t.RequestRead)
		end.Refusal = Refusal{Status: 503, RequestLine: line, Bytes: n}
		report(RefusedPage, d, nil)
		return
	case d.Verdict != Accept:
		p.count.RefusedRST.Add(1)
		client.Reset()
		report(RefusedReset, d, nil)
		return
	}
	p.count.Accepted.Add(1)
	ended = true // splice reports the End
	p.splice(req, d, sess, client, target, t)
}

// recoverConn recovers a panic in a connection goroutine: counts it,
// reports it to OnPanic with the stack, and runs cleanup (which closes
// what the goroutine holds). Deferred first thing in each such goroutine;
// *reqp is the connection's request once it has one.
func (p *Proxy) recoverConn(reqp **ConnRequest, cleanup func()) {
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
	p.recoverConnValue(reqp, v)
}

// recoverConnValue counts a recovered panic and reports it to OnPanic.
func (p *Proxy) recoverConnValue(reqp **ConnRequest, v any) {
	p.count.Panics.Add(1)
	if p.opts.OnPanic != nil {
		req := *reqp
		if req == nil {
			req = &ConnRequest{}
		}
		p.opts.OnPanic(req, v, debug.Stack())
	}
}

// dial opens the target leg of an Accept decision for req, within timeout,
// and writes the PROXY-protocol header first where the target takes one.
func (p *Proxy) dial(req *ConnRequest, d Decision, timeout time.Duration) (Leg, error) {
	if d.Target == nil {
		return nil, errors.New("proxy: accept decision without a target")
	}
	dl := d.Dialer
	if dl == nil {
		dl = p.opts.Host
		if d.Target.Via == policy.DialNetstack {
			dl = p.opts.Back
		}
	}
	if dl == nil {
		return nil, ErrNoDialer
	}
	ctx, cancel := context.WithTimeout(p.ctx, timeout)
	defer cancel()
	leg, err := dl.DialTarget(ctx, d.Target.Addr)
	if err != nil || d.Target.ProxyProtocol == policy.ProxyNone {
		return leg, err
	}
	if err := sendProxyHeader(ctx, leg, d.Target.ProxyProtocol, req.Client, req.VIP); err != nil {
		leg.Close()
		return nil, err
	}
	return leg, nil
}

// returnBuffer gives bp back to the splice buffer pool; nil is allowed.
func (p *Proxy) returnBuffer(bp *[]byte) {
	if bp != nil {
		p.bufPool.Put(bp)
	}
}

// dirs returns c's target leg's per-direction totals now (Options.Meter);
// tg are the leg's counters read at the same time. Call with sampleMu held.
func (p *Proxy) dirs(c *connEntry, tg LegCounters) (from, to DirCounters) {
	if p.opts.Meter == nil {
		return DirCounters{}, DirCounters{}
	}
	return p.opts.Meter.Directions(c.target, tg, &c.addrs)
}

// unacked returns the bytes written to c's target leg that the target
// has not acknowledged (LegMeter.Unacked); without a meter, what the leg's
// own counters say (a host socket's TCP_INFO; 0 for a gVisor leg).
func (p *Proxy) unacked(c *connEntry) uint64 {
	tg := c.target.Counters()
	if p.opts.Meter == nil {
		return tg.Unacked
	}
	p.sampleMu.Lock()
	defer p.sampleMu.Unlock()
	return p.opts.Meter.Unacked(c.target, tg, &c.addrs)
}

// syncHost lets the target leg's measurement catch up before c's final
// reading or a pooled c's park (LegMeter.Sync).
func (p *Proxy) syncHost(c *connEntry) {
	if p.opts.Meter != nil {
		p.opts.Meter.Sync(c.target)
	}
}
