package admit

// Requests of http services
//
// For a virtual server with protocol http the forwarder asks twice: once per
// client connection (AdmitClient: the service's maxClients, a bound of its
// own, so idle keep-alive and slow-header clients cannot take the request
// slots), and once per request head (AdmitRequest: Sun's three levels and
// the balancer's MaxConnections, as Admit does for a connection). A request
// holds its admission ticket and target slot from its parsed head to its
// last response byte (its Session's End); an idle client connection holds
// neither. A request's bytes count at its ticket's levels as the proxy
// reports them (session.Moved): its client connection's datapath flow is
// never bound to a target, so the meters count none of it toward a level,
// and a refused request, which reports nothing, never counts.

import (
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"weir/cmd/weir/api"
	"weir/cmd/weir/internal/obs"
	"weir/netstack/proxy"
)

var _ proxy.RequestAdmitter = (*Admitter)(nil)

// clientCount returns the open-client counter of a service.
func (a *Admitter) clientCount(service string) *atomic.Int64 {
	if c, ok := a.clients.Load(service); ok {
		return c.(*atomic.Int64)
	}
	c, _ := a.clients.LoadOrStore(service, new(atomic.Int64))
	return c.(*atomic.Int64)
}

// AdmitClient admits an http client connection against its service's
// maxClients; release gives the slot back.
func (a *Admitter) AdmitClient(req *proxy.ConnRequest) (proxy.Decision, func()) {
	vs := req.Service
	if a.draining.Load() {
		a.counters.refusedDraining.Add(1)
		return proxy.Decision{Verdict: proxy.RefuseRST, Reason: "draining"}, nil
	}
	c := a.clientCount(vs.Name)
	max := vs.HTTP.MaxClients
	for {
		n := c.Load()
		if max > 0 && n >= max {
			a.counters.refusal("virtual server", "maxClients")
			reason := fmt.Sprintf("virtual server %s has %d client connections open (maxClients %d)", vs.Name, n, max)
			a.warnEvery("refuse:"+vs.Name+":maxClients", a.now(), func(e *zerolog.Event) {
				e.Str("service", vs.Name).Str("client", req.Client.String()).Msg("refused: " + reason)
			})
			return proxy.Decision{Verdict: proxy.Refuse503, Limit: "maxClients", Value: max, Reason: reason}, nil
		}
		if c.CompareAndSwap(n, n+1) {
			break
		}
	}
	var once sync.Once
	return proxy.Decision{Verdict: proxy.Accept}, func() { once.Do(func() { c.Add(-1) }) }
}

// AdmitRequest admits one http request as Admit admits a connection; its
// session's End (the response written) releases what it holds and writes
// the request's access-log line.
func (a *Admitter) AdmitRequest(req *proxy.ConnRequest, r *proxy.Request) (proxy.Decision, proxy.RequestSession) {
	s := &session{a: a, req: req, start: r.Start, http: r}
	if a.draining.Load() {
		a.counters.refusedDraining.Add(1)
		return refuse(req.Service, "draining", 0, "weir is draining"), s
	}
	// The pick on the admitter's clock, as DialFailed's and TargetFailed's
	// mark-downs and ejections are: a target marked down or ejected is
	// judged on one clock (they differ only under a test's manual clock).
	return a.admit(req, s, a.now())
}

// Moved counts an admitted request's bytes on its client connection at
// every level its ticket holds, as the proxy moves them: the payload, or
// with instance.bandwidthBytes wire the wire estimate. Once Released (the
// ticket given back) nothing more counts.
func (s *session) Moved(payload, wire int64) {
	n := payload
	if s.wire {
		n = wire
	}
	if n > 0 {
		s.ticket.AddBytes(uint64(n))
	}
}

// Spliced counts a tcp connection's bytes at its clients (the per-client
// bandwidth); its levels count them from the datapath's meters.
func (s *session) Spliced(n int64) {
	if n > 0 {
		s.ticket.AddClientBytes(uint64(n))
	}
}

// BadRequest counts a request refused before admission (400, 408, 431) and
// writes its access-log line.
func (a *Admitter) BadRequest(req *proxy.ConnRequest, e *proxy.RequestEnd) {
	limit := "badRequest"
	switch e.Status {
	case 408:
		limit = "headerTimeout"
	case 431:
		limit = "maxHeaderBytes"
	}
	a.counters.refusal("http", limit)
	a.reqs.done(req.Service.Name, "", e.Status, e.Duration)
	if a.opts.Access == nil {
		return
	}
	a.opts.Access.Log(obs.AccessRecord{
		Start: e.Start, Client: req.Client.String(), Proxy: proxyOf(req), VIP: req.VIP.String(), Service: req.Service.Name,
		BytesOut: uint64(e.ResponseBytes), Duration: e.Duration, Outcome: strconv.Itoa(e.Status), Reason: limit,
		RequestLine: orDashLine(e.Line), Status: e.Status,
	})
}

func orDashLine(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// requestEnd accounts one finished http request: its counters and its
// access-log line.
func (a *Admitter) requestEnd(s *session, e *proxy.End) {
	r := e.Request
	target := e.Stats.Target
	if e.Outcome == proxy.RefusedPage && e.Decision.Verdict != proxy.Accept {
		target = ""
	}
	a.reqs.done(s.req.Service.Name, target, r.Status, r.Duration)
	if e.Decision.Verdict == proxy.Accept {
		a.counters.closed.Add(1)
	}
	if a.opts.Access == nil {
		return
	}
	req := s.req
	rec := obs.AccessRecord{
		Start: r.Start, Client: req.Client.String(), Proxy: proxyOf(req), VIP: req.VIP.String(), Service: req.Service.Name,
		Target: target, BytesIn: uint64(r.RequestBytes), BytesOut: uint64(r.ResponseBytes),
		Duration: r.Duration, Outcome: e.Outcome.String(), Reason: e.Decision.Reason,
		RequestLine: orDashLine(r.Line), Status: r.Status, QueueWait: s.waited,
	}
	if e.Err != nil {
		rec.Reason = e.Err.Error()
	}
	a.opts.Access.Log(rec)
}

// DurationBuckets are weir_request_duration_seconds' upper bounds, seconds.
var DurationBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// requestStats are the per-request counters of http services.
type requestStats struct {
	mu       sync.Mutex
	total    map[[3]string]uint64 // protected by mu: {service, target, code}
	inFlight map[[2]string]int64  // protected by mu: {service, target}
	hist     map[string]*histo    // protected by mu: by service
}

type histo struct {
	counts []uint64 // per DurationBuckets bound, not cumulative
	count  uint64
	sum    float64
}

func (rs *requestStats) begin(service, target string) {
	rs.mu.Lock()
	if rs.inFlight == nil {
		rs.inFlight = map[[2]string]int64{}
	}
	rs.inFlight[[2]string{service, target}]++
	rs.mu.Unlock()
}

func (rs *requestStats) end(service, target string) {
	rs.mu.Lock()
	rs.inFlight[[2]string{service, target}]--
	rs.mu.Unlock()
}

// pending is the requests in flight at a target now: the plug-in's
// pendingConnections, for the STATS line.
func (rs *requestStats) pending(service, target string) int64 {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.inFlight[[2]string{service, target}]
}

func (rs *requestStats) done(service, target string, code int, d time.Duration) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.total == nil {
		rs.total, rs.hist = map[[3]string]uint64{}, map[string]*histo{}
	}
	rs.total[[3]string{service, target, strconv.Itoa(code)}]++
	h := rs.hist[service]
	if h == nil {
		h = &histo{counts: make([]uint64, len(DurationBuckets))}
		rs.hist[service] = h
	}
	sec := d.Seconds()
	h.count++
	h.sum += sec
	if i := sort.SearchFloat64s(DurationBuckets, sec); i < len(DurationBuckets) {
		h.counts[i]++
	}
}

// status returns the request counters for /status, sorted.
func (rs *requestStats) status() (reqs []api.RequestCount, inflight []api.RequestsInFlight, hists []api.RequestDurations) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for k, v := range rs.total {
		reqs = append(reqs, api.RequestCount{Service: k[0], Target: k[1], Code: k[2], Count: v})
	}
	for k, v := range rs.inFlight {
		inflight = append(inflight, api.RequestsInFlight{Service: k[0], Target: k[1], InFlight: v})
	}
	for svc, h := range rs.hist {
		cum := make([]uint64, len(h.counts))
		var run uint64
		for i, c := range h.counts {
			run += c
			cum[i] = run
		}
		hists = append(hists, api.RequestDurations{Service: svc, Bounds: DurationBuckets, Cumulative: cum, Count: h.count, Sum: h.sum})
	}
	sort.Slice(reqs, func(i, j int) bool {
		if reqs[i].Service != reqs[j].Service {
			return reqs[i].Service < reqs[j].Service
		}
		if reqs[i].Target != reqs[j].Target {
			return reqs[i].Target < reqs[j].Target
		}
		return reqs[i].Code < reqs[j].Code
	})
	sort.Slice(inflight, func(i, j int) bool {
		if inflight[i].Service != inflight[j].Service {
			return inflight[i].Service < inflight[j].Service
		}
		return inflight[i].Target < inflight[j].Target
	})
	sort.Slice(hists, func(i, j int) bool { return hists[i].Service < hists[j].Service })
	return reqs, inflight, hists
}
