// Package admit is weir's admission of connections and requests: the
// netstack Admitter (one decision per accepted TCP connection) and
// HTTPAdmitter (one per http client connection and one per request head).
// It asks policy's Admission for the limits (virtual server, class chain,
// instance) and the service's balancer for a target, and hands the
// forwarder a session per connection (or request) that holds what was
// reserved until the connection ends:
//
//	Admit / AdmitRequest ─► policy.Admission.Admit (ticket) ─► balancer.PickAction (lease)
//	   ─► Decision{Accept, Target} and the datapath flow bound to the target
//	DialFailed ─► the lease's target marked down ─► the next pick, until the tried-set refuses
//	Released / End ─► lease and ticket back ─► counters, access-log line
//
// It decides nothing itself: the limits are policy's, the picks the
// balancer's; it counts and logs (rate-limited) what they answered.
package admit

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"weir/balancer"
	"weir/cmd/weir/api"
	"weir/cmd/weir/internal/obs"
	"weir/datapath"
	"weir/netstack/proxy"
	"weir/policy"
)

// Flows is what admission needs of the datapath engine (a
// *datapath.Engine): the flow a connection's SYN was classified into, and
// the meters' configuration and generation to bind that flow to its target.
type Flows interface {
	Flow(client, server netip.AddrPort, proto uint8) *datapath.Flow
	// Reclassify decides the flow again for the client a PROXY-protocol
	// header named (datapath.Engine.Reclassify).
	Reclassify(client, server netip.AddrPort, proto uint8, as netip.AddrPort) *datapath.Flow
	// Reroute moves a tls flow its ClientHello routed to vs
	// (datapath.Engine.Reroute).
	Reroute(client, server netip.AddrPort, vs *policy.VirtualServer) *datapath.Flow
	Meters() *datapath.Meters
	Generation() uint64
}

// Options are an Admitter's inputs. Admission, Balancer and Flows are
// required; the zero value of the rest works.
type Options struct {
	// Admission holds the policy limits and their tickets.
	Admission *policy.Admission
	// Balancer returns a virtual server's balancer, nil when a reload
	// removed it.
	Balancer func(service string) *balancer.Balancer
	// Flows is the datapath engine.
	Flows Flows
	// Log gets refusals, failed dials and silent targets, at most one line
	// a second per kind; nil discards.
	Log *zerolog.Logger
	// Access, when set, gets one line per connection or request.
	Access *obs.AccessLog
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Borrow, when set, is asked for more slots of a level whose refusal
	// was this instance's full share of a cluster-wide limit (a Refusal
	// with Shared set); it returns true when the share grew, and the
	// connection or request is admitted again. It waits at most the
	// cluster's borrowTimeout (cluster.Cluster.Borrow): the client's
	// handshake has completed, so the wait is inside the connection.
	Borrow func(ctx context.Context, kind policy.LevelKind, name string) bool
	// BorrowTarget, when set, is Borrow for a target's maxConnections: a
	// pick that found no target free, one or more of them at this
	// instance's share of their cluster-wide limit (a balancer.Reason with
	// Shared set), asks for a slot of each such target in turn and picks
	// again once one grants (cluster.Cluster.BorrowTarget).
	BorrowTarget func(ctx context.Context, service, target string) bool
}

// maxBorrows bounds the borrows one pick makes when the targets are at
// their share (Options.BorrowTarget): the wait is at most maxBorrows times
// the cluster's borrowTimeout. policy.Wait bounds a level's borrows alike.
const maxBorrows = 8

// retry is Wait's Retry: a borrow from the cluster for a refusal at this
// instance's full share (policy.Wait bounds the attempts).
func (a *Admitter) retry() func(context.Context, policy.Refusal) bool {
	if a.opts.Borrow == nil {
		return nil
	}
	return func(ctx context.Context, r policy.Refusal) bool { return a.opts.Borrow(ctx, r.Level, r.Name) }
}

// Admitter admits connections and requests. Its methods may be called from
// any number of goroutines.
type Admitter struct {
	opts     Options
	log      zerolog.Logger
	now      func() time.Time
	open     atomic.Int64 // sessions that hold a target slot and have not ended
	draining atomic.Bool
	// drained ends the queue waits when Drain is called: a connection
	// waiting for a slot is refused then, not held until its timeout.
	drained  context.Context
	drain    context.CancelFunc
	counters counters
	reqs     requestStats // http requests (http.go)
	outcomes outcomes     // per target, for the error fraction (outcomes.go)
	clients  sync.Map     // service name → *atomic.Int64: open http client connections
	limiter  obs.Limiter
}

var _ proxy.Admitter = (*Admitter)(nil)

// New returns an Admitter over opts.
func New(opts Options) *Admitter {
	a := &Admitter{opts: opts, log: zerolog.Nop(), now: opts.Now}
	a.drained, a.drain = context.WithCancel(context.Background())
	if opts.Log != nil {
		a.log = *opts.Log
	}
	if a.now == nil {
		a.now = time.Now
	}
	return a
}

func (a *Admitter) balancer(name string) *balancer.Balancer { return a.opts.Balancer(name) }

// Drain makes every later admission refuse (RST, or 503 for a request):
// weir is going away.
func (a *Admitter) Drain() {
	a.draining.Store(true)
	a.drain()
}

// Draining reports whether Drain was called.
func (a *Admitter) Draining() bool { return a.draining.Load() }

// Open is the number of admitted connections (and requests) not yet ended:
// a counter the sessions keep, not a scan.
func (a *Admitter) Open() int { return int(a.open.Load()) }

// Closed is the number of accepted connections and requests that ended.
func (a *Admitter) Closed() uint64 { return a.counters.closed.Load() }

// DialFailures is the number of failed target connects.
func (a *Admitter) DialFailures() uint64 { return a.counters.dialFailures.Load() }

// Refusals are the refusal counts sorted by level then limit, draining ones
// as level "instance", limit "draining".
func (a *Admitter) Refusals() []api.Refusal { return a.counters.refusalList() }

// Clients is the number of open http client connections of a service.
func (a *Admitter) Clients(service string) int64 { return a.clientCount(service).Load() }

// Requests are the http request counters for /status, sorted: by service,
// target and code; in flight by service and target; durations by service.
func (a *Admitter) Requests() ([]api.RequestCount, []api.RequestsInFlight, []api.RequestDurations) {
	return a.reqs.status()
}

// Pending is the number of requests in flight at a target now: the
// WebSphere plug-in's pendingConnections, for the STATS line.
func (a *Admitter) Pending(service, target string) int64 { return a.reqs.pending(service, target) }

// counters are admission's own totals since start.
type counters struct {
	closed          atomic.Uint64
	dialFailures    atomic.Uint64
	refusedDraining atomic.Uint64

	mu       sync.Mutex
	refusals map[[2]string]uint64 // {level, limit} → count; by mu
}

func (c *counters) refusal(level, limit string) {
	c.mu.Lock()
	if c.refusals == nil {
		c.refusals = map[[2]string]uint64{}
	}
	c.refusals[[2]string{level, limit}]++
	c.mu.Unlock()
}

// refusalList is the refusal counts sorted by level then limit, with the
// draining refusals as level "instance", limit "draining".
func (c *counters) refusalList() []api.Refusal {
	c.mu.Lock()
	out := make([]api.Refusal, 0, len(c.refusals)+1)
	for k, v := range c.refusals {
		out = append(out, api.Refusal{Level: k[0], Limit: k[1], Count: v})
	}
	c.mu.Unlock()
	if n := c.refusedDraining.Load(); n > 0 {
		out = append(out, api.Refusal{Level: policy.LevelInstance.String(), Limit: "draining", Count: n})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Level != out[j].Level {
			return out[i].Level < out[j].Level
		}
		return out[i].Limit < out[j].Limit
	})
	return out
}

// Admit is the netstack admission hook: policy limits first (virtual server,
// class chain, instance), then the balancer. It runs once the client's handshake has completed, and
// returns the connection's session, which holds what admission reserved and
// hears how the connection ends.
func (a *Admitter) Admit(req *proxy.ConnRequest) (proxy.Decision, proxy.Session) {
	now := a.now()
	s := &session{a: a, req: req, start: now}
	if a.draining.Load() {
		a.counters.refusedDraining.Add(1)
		return proxy.Decision{Verdict: proxy.RefuseRST, Reason: "draining"}, s
	}
	return a.admit(req, s, now)
}

// admit runs the policy limits and the balancer for a connection (tcp) or
// a request (http), whose session s is.
func (a *Admitter) admit(req *proxy.ConnRequest, s *session, now time.Time) (proxy.Decision, *session) {
	vs := req.Service
	// The client's address is an input: the carried one when a PROXY
	// header gave it (req.Client).
	opts := policy.WaitOptions{Client: req.Client.Addr(), Retry: a.retry()}
	// Wait admits at once when every limit is under. The share was full,
	// not the cluster: it borrows (Retry) and admits again; a borrow that
	// grew the share may have been taken by a concurrent connection of
	// the same burst, so it borrows again while the cluster grants (each
	// attempt bounded by borrowTimeout, 8 at most). A level (or client) at
	// its limit with a queue holds the connection in it, first in first
	// out, up to its queueTimeout.
	ref, w, ok := a.opts.Admission.Wait(a.drained, vs, &s.ticket, opts)
	if !ok && !w.Queued && req.Settle() {
		// The client's previous connection was over for it, its release
		// still on the way: check again.
		ref, w, ok = a.opts.Admission.Wait(a.drained, vs, &s.ticket, opts)
	}
	s.waited = w.Duration
	if w.Queued {
		now = a.now()
	}
	if !ok {
		a.counters.refusal(ref.Level.String(), ref.Limit.String())
		a.warnEvery("refuse:"+vs.Name+":"+ref.Limit.String(), now, func(e *zerolog.Event) {
			e.Str("service", vs.Name).Str("client", req.Client.String()).Msg("refused: " + ref.Error())
		})
		d := refuse(vs, ref.Limit.String(), ref.Value, ref.Error())
		if ref.NAlso > 0 { // the 503 page names every limit over
			for _, o := range ref.Limits() {
				d.Limits = append(d.Limits, proxy.PageLimit{Level: o.Level.String() + " " + strconv.Quote(o.Name),
					Limit: o.Limit.String(), Value: o.Value, Measured: o.Measured})
			}
		}
		return d, s
	}
	b := a.balancer(vs.Name)
	if b == nil { // reloaded away between lookup and admission
		s.ticket.Release()
		return proxy.Decision{Verdict: proxy.RefuseRST, Reason: "virtual server " + vs.Name + " removed"}, s
	}
	// The datapath classified the connection when its SYN passed: its flow
	// holds the service's action, and binding it to the target makes the
	// target's meters count it. Maglev maps the service's hashBy key
	// (pickHash: the flow's 5-tuple by default) to a target.
	s.hash = pickHash(vs, req.Client, req.VIP, s.http)
	s.flow = a.flow(req)
	if s.flow != nil && s.flow.Service != vs && vs.Proto == policy.ProtoTLS {
		// The SYN was classified into the first tls service of the VIP
		// and port; the ClientHello routed it to vs: its action, ToS and
		// meters are vs's from here on (datapath/tlsroute.go). The flow's
		// key holds the sender of the packets: the load balancer when a
		// PROXY header named the client.
		from := req.Client
		if req.Peer.IsValid() {
			from = req.Peer
		}
		s.flow = a.opts.Flows.Reroute(from, req.VIP, vs)
	}
	lease, err := a.pick(b, s, now)
	if err != nil && req.Settle() {
		lease, err = a.pick(b, s, now)
	}
	if err != nil {
		s.ticket.Release()
		return a.noTarget(vs, req, err, now), s
	}
	s.lease = lease
	s.counted = true
	a.open.Add(1)
	if s.http != nil {
		s.inflight = lease.Name()
		a.reqs.begin(vs.Name, s.inflight)
	}
	return s.accept(), s
}

// flow is the datapath flow req's connection arrived on, decided for its
// client: a connection whose PROXY-protocol header named the client (Peer
// set) is decided again for that client, so that its rule (its action, ToS
// and meters) is the real client's, not the outer load balancer's.
func (a *Admitter) flow(req *proxy.ConnRequest) *datapath.Flow {
	if req.Peer.IsValid() {
		return a.opts.Flows.Reclassify(req.Peer, req.VIP, datapath.ProtoTCP, req.Client)
	}
	return a.opts.Flows.Flow(req.Client, req.VIP, datapath.ProtoTCP)
}

// pick asks the balancer for s's target. When every target that could
// serve was full, some at this instance's share of a cluster-wide
// maxConnections, it borrows a slot of one of those (Options.BorrowTarget)
// and picks again, up to maxBorrows times, as admit borrows for a level.
func (a *Admitter) pick(b *balancer.Balancer, s *session, now time.Time) (balancer.Lease, error) {
	lease, err := b.PickAction(now, s.hash, s.action(), &s.tried)
	for i := 0; err != nil && a.opts.BorrowTarget != nil && i < maxBorrows && a.borrowTarget(s.req.Service.Name, err); i++ {
		lease, err = b.PickAction(now, s.hash, s.action(), &s.tried)
	}
	return lease, err
}

// borrowTarget asks the cluster for a slot of each target the refusal err
// found at its share, in the balancer's order, and reports whether one
// granted.
func (a *Admitter) borrowTarget(service string, err error) bool {
	var nte *balancer.NoTargetError
	if !errors.As(err, &nte) {
		return false
	}
	for _, r := range nte.Reasons {
		if r.Why == balancer.AtLimit && r.Shared && a.opts.BorrowTarget(context.Background(), service, r.Target) {
			return true
		}
	}
	return false
}

// session is one connection's proxy.Session: what admission reserved for
// it (an admission ticket, a balancer lease and the targets it tried), the
// datapath flow it arrived on. The forwarder calls it from the connection's
// goroutine only, so its fields need no lock.
type session struct {
	a      *Admitter
	req    *proxy.ConnRequest
	start  time.Time
	flow   *datapath.Flow // nil when the flow table refused the flow
	hash   uint64         // the flow key's hash, for Maglev
	ticket policy.Ticket
	lease  balancer.Lease
	tried  balancer.Tried
	// counted is set while the session is in Admitter.open: from an
	// admitted pick to End.
	counted bool
	// http is the request of an http service's session (one per request,
	// see http.go); nil for a tcp connection's.
	http     *proxy.Request
	inflight string // the target the request counts in flight at
	wire     bool   // an http request's bytes count as wire bytes (Moved)
	// waited is how long the connection (request) waited in a queue
	// before its admission or refusal.
	waited time.Duration
}

// action is the policy action the datapath classified the connection into,
// nil for none: the balancer picks on that service level's weights.
func (s *session) action() *policy.Action {
	if s.flow == nil {
		return nil
	}
	return s.flow.Action
}

// accept answers with the session's lease and binds the datapath flow to
// the lease's target.
func (s *session) accept() proxy.Decision {
	d := proxy.Decision{Verdict: proxy.Accept, Target: keepPort(s.lease.Target(), s.req.VIP.Port())}
	if s.http != nil {
		// An http request counts its own bytes (Moved): its client
		// connection's flow is never bound, so the meters do not count the
		// connection as a whole (its refused requests, its first head
		// missed) toward the levels.
		d.Action = s.action()
		s.wire = s.a.opts.Flows.Meters().Config().Instance.BandwidthBytes == policy.CountWire
		return d
	}
	if f := s.flow; f != nil {
		d.Action = f.Action
		// The target's index in the meters' config: -1 when the lease
		// comes from another config than the meters' (a reload between
		// the two), and a flow of an older generation is reclassified on
		// its next packet; neither is bound, rather than bound wrong.
		m := s.a.opts.Flows.Meters()
		if id := m.Config().TargetIndex(s.lease.Target()); id >= 0 && uint64(f.Gen) == s.a.opts.Flows.Generation() {
			f.Bind(id)
		}
	}
	return d
}

// refuse answers a refusal the way the service speaks: an http service gets
// the 503 page naming the limit, a tcp one RST.
func refuse(vs *policy.VirtualServer, limit string, value int64, reason string) proxy.Decision {
	v := proxy.RefuseRST
	if vs.Proto == policy.ProtoHTTP {
		v = proxy.Refuse503
	}
	return proxy.Decision{Verdict: v, Limit: limit, Value: value, Reason: reason}
}

func (a *Admitter) noTarget(vs *policy.VirtualServer, req *proxy.ConnRequest, err error, now time.Time) proxy.Decision {
	a.counters.refusal("balancer", "targets")
	var value int64
	var nte *balancer.NoTargetError
	if errors.As(err, &nte) {
		value = int64(len(nte.Reasons) + nte.More)
	}
	a.errorEvery("notarget:"+vs.Name, now, func(e *zerolog.Event) {
		e.Str("service", vs.Name).Str("client", req.Client.String()).Msg("no target can serve: " + err.Error())
	})
	return refuse(vs, "targets", value, err.Error())
}

// DialFailed marks the failed target down for the retry interval and asks
// the balancer for another, excluding those tried; the tried-set's
// MaxAttempts is the only bound, so a target is marked down only when it
// was dialed and failed.
func (s *session) DialFailed(failed proxy.Decision, err error) proxy.Decision {
	a, req, vs := s.a, s.req, s.req.Service
	now := a.now()
	name := s.lease.Name()
	s.lease.Failed(now)
	a.counters.dialFailures.Add(1)
	a.warnEvery("dial:"+vs.Name+":"+name, now, func(e *zerolog.Event) {
		e.Str("service", vs.Name).Str("target", name).Err(err).Msg("target connect failed; marked down for the retry interval")
	})
	if b := a.balancer(vs.Name); b != nil {
		lease, perr := a.pick(b, s, now)
		if perr == nil {
			s.lease = lease
			if s.http != nil && s.counted {
				a.reqs.end(vs.Name, s.inflight)
				s.inflight = lease.Name()
				a.reqs.begin(vs.Name, s.inflight)
			}
			return s.accept()
		}
		err = perr
	}
	s.ticket.Release() // refused: the admission slot is free now
	return a.noTarget(vs, req, err, now)
}

// TargetFailed marks a target that went silent after its dial succeeded
// (the first-byte timeout) down for the retry interval, as a failed dial
// is: passive health.
func (s *session) TargetFailed(d proxy.Decision, err error) {
	a, vs := s.a, s.req.Service
	now := a.now()
	name := s.lease.Name()
	s.lease.Failed(now) // weir_forwarder_target_timed_out_total counts it
	a.warnEvery("firstbyte:"+vs.Name+":"+name, now, func(e *zerolog.Event) {
		e.Str("service", vs.Name).Str("target", name).Err(err).Msg("target sent nothing in time; marked down for the retry interval")
	})
}

// Released gives the target slot and the admission ticket back as soon as
// the client is done with the connection (proxy.Session.Released): a client that
// reconnects at once finds them free, whatever weir's teardown still does.
// The forwarder calls it before End and never concurrently with another
// Session call, so the lease needs no lock.
func (s *session) Released() {
	s.lease.Release()
	s.ticket.Release()
}

// End releases the connection's target slot and admission ticket (if
// Released has not) and writes its access-log line, whose outcome is the
// forwarder's account of the end. The session leaves Open last: whoever
// waits for Open to reach 0 finds every ended connection and request
// counted (TakeResponses included) and its access-log line written.
func (s *session) End(e *proxy.End) {
	a := s.a
	if e.Request != nil {
		a.requestOutcome(s, e, e.Stats.Target)
	}
	s.Released()
	if s.counted {
		s.counted = false
		defer a.open.Add(-1)
		if s.http != nil {
			a.reqs.end(s.req.Service.Name, s.inflight)
		}
	}
	if e.Request != nil {
		a.requestEnd(s, e)
		return
	}
	if e.Decision.Verdict == proxy.Accept {
		a.counters.closed.Add(1)
	}
	a.connOutcome(s, e)
	if a.opts.Access == nil {
		return
	}
	req := s.req
	r := obs.AccessRecord{
		Start: s.start, Client: req.Client.String(), Proxy: proxyOf(req), VIP: req.VIP.String(), Service: req.Service.Name, ServerName: req.ServerName,
		Target: e.Stats.Target, BytesIn: e.Stats.TargetLeg.BytesSent, BytesOut: e.Stats.ClientLeg.BytesSent,
		Duration: a.now().Sub(s.start), Outcome: e.Outcome.String(), Reason: e.Decision.Reason,
		QueueWait: s.waited,
	}
	switch e.Outcome {
	case proxy.RefusedReset, proxy.RefusedPage:
		// For an http service the request line and 503 with the page's
		// size, as the WebSphere plug-in's web server logs it.
		r.Target, r.BytesIn = "", 0
		r.BytesOut = uint64(e.Refusal.Bytes)
		r.RequestLine, r.Status = e.Refusal.RequestLine, e.Refusal.Status
	case proxy.Aborted, proxy.TargetTimedOut, proxy.Panicked:
		if e.Err != nil {
			r.Reason = e.Err.Error()
		}
	}
	a.opts.Access.Log(r)
}

// warnEvery and errorEvery write a line at most once per second per key,
// Panic logs a panic recovered in a connection's goroutines, once, with
// the connection and the stack; the forwarder has counted it
// (weir_forwarder_panics_total) and closed that connection.
func (a *Admitter) Panic(req *proxy.ConnRequest, v any, stack []byte) {
	ev := a.log.Error().Str("panic", fmt.Sprint(v)).Bytes("stack", stack)
	if req.ID != 0 {
		ev = ev.Uint64("conn", req.ID).Str("client", req.Client.String()).Str("vip", req.VIP.String())
		if req.Service != nil {
			ev = ev.Str("service", req.Service.Name)
		}
	}
	ev.Msg("panic in a connection; that connection was closed")
}

// proxyOf is the access log's proxy field: the outer load balancer that
// sent req's PROXY-protocol header, "" for none.
func proxyOf(req *proxy.ConnRequest) string {
	if req.Peer.IsValid() {
		return req.Peer.String()
	}
	return ""
}

// ProxyRefused logs (at most once a second per service and reason) a
// connection refused for its PROXY-protocol header; the proxy counted it
// (weir_forwarder_proxy_protocol_refused_total).
func (a *Admitter) ProxyRefused(req *proxy.ConnRequest, r proxy.ProxyRefusal) {
	a.warnEvery("proxyproto:"+req.Service.Name+":"+r.Reason, a.now(), func(e *zerolog.Event) {
		e = e.Str("service", req.Service.Name).Str("peer", r.Peer.String()).Str("vip", r.VIP.String()).Str("reason", r.Reason)
		if r.Err != nil {
			e = e.Err(r.Err)
		}
		e.Msg("refused: no valid PROXY-protocol header from a trusted proxy")
	})
}

// saying how many were held back since.
func (a *Admitter) warnEvery(key string, now time.Time, f func(*zerolog.Event)) {
	a.logEvery(zerolog.WarnLevel, key, now, f)
}

func (a *Admitter) errorEvery(key string, now time.Time, f func(*zerolog.Event)) {
	a.logEvery(zerolog.ErrorLevel, key, now, f)
}

func (a *Admitter) logEvery(level zerolog.Level, key string, now time.Time, f func(*zerolog.Event)) {
	if ok, n := a.limiter.Allow(key, now); ok {
		e := a.log.WithLevel(level)
		if n > 0 {
			e = e.Uint64("suppressed", n)
		}
		f(e)
	}
}
