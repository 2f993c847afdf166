package proxy

import (
	"sort"
	"time"
)

// sampleState is what the sampler saw of a connection at its last Sample.
type sampleState struct {
	at             time.Time
	client, target LegCounters
	toClient       uint64
	toTarget       uint64
	from, to       DirCounters // the target leg's directions (see direction.go)
	stream         int64       // connEntry.streamNs
}

// delta is the activity of one connection's target leg in a sampling
// interval.
type delta struct {
	segsSent, retrans, timeouts uint64
	bytes                       uint64 // both directions
	from, to                    DirCounters
	// waiting: data streamed for at least half the time since the last
	// observation, elapsed (see AggSample.Waiting); stream is that
	// streaming time.
	waiting         bool
	elapsed, stream time.Duration
	// rtoUnknown: the target leg does not count its RTO expiries.
	rtoUnknown bool
}

// AggSample is the activity of one target, or of one target's connections
// under one policy action, over a sampling interval: raw counts of the
// target leg (weir ⇄ target), the segments the target side is measured
// on. netstack only counts; the ratios, rates and verdicts built on these
// counts (loss and timeout ratios, the MinRate verdict) are policy's.
type AggSample struct {
	// Service is the virtual server; Name the target's name, unique only
	// within its service; Action the policy action of a target-action
	// aggregate ("" in Sample.Targets).
	Service string
	Name    string
	Action  string
	Active  int // connections open at the end of the interval
	// Closed is the number of connections that ended in the interval; their
	// activity up to their end is included.
	Closed       int
	SegmentsSent uint64 // data segments weir sent on the target leg
	Retransmits  uint64 // of those, retransmitted
	Timeouts     uint64 // retransmission timeouts on the target leg
	Bytes        uint64 // payload bytes, both directions
	// FromTarget and ToTarget count the target leg's data segments per
	// direction: the segments the target sent (the z/OS monitor's
	// "outbound traffic being serviced by the target servers") and those
	// weir sent it. Pure ACKs never count. See direction.go for how each
	// kind of leg is measured; Source is the weakest of the connections'.
	FromTarget, ToTarget DirCounters
	// Waiting counts the connections that had data waiting to be sent
	// during the interval, and WaitingBytes their payload bytes. A
	// connection counts when data kept streaming through it (see
	// StreamMeter) for at least half of its time in the interval: its
	// sender had a backlog, so a low rate is the path's or the target's
	// doing, not an idle or interactive application's. (The raw counter
	// is the splice's streamNs; policy's MinRate check without a MeanRate
	// judges these connections only.)
	Waiting      int
	WaitingBytes uint64
	// WaitingTime is the sum of those connections' streaming time in the
	// interval (the time data kept moving at StreamRate or faster), so WaitingBytes/WaitingTime is their rate per
	// connection while they had data waiting: fair to a connection that
	// opened, closed or paused in the interval.
	WaitingTime time.Duration
	// OpenTime is the sum of each connection's time open in the interval
	// (to its end for one that closed, from its start for one that
	// opened): Bytes/OpenTime is the rate per connection, whatever number
	// closed before the interval ended (policy.ActionSample.OpenTime).
	OpenTime time.Duration
	// TimeoutsUnknown counts the connections whose target leg cannot count
	// RTO expiries (a host socket on a kernel before 6.7): Timeouts is then
	// a lower bound.
	TimeoutsUnknown int
}

func (a *AggSample) add(d delta) {
	a.SegmentsSent += d.segsSent
	a.Retransmits += d.retrans
	a.Timeouts += d.timeouts
	a.Bytes += d.bytes
	a.FromTarget.Add(d.from)
	a.ToTarget.Add(d.to)
	a.OpenTime += d.elapsed
	if d.waiting {
		a.Waiting++
		a.WaitingBytes += d.bytes
		a.WaitingTime += d.stream
	}
	if d.rtoUnknown {
		a.TimeoutsUnknown++
	}
}

// Sample is the activity of all connections over one sampling interval.
type Sample struct {
	Start, End time.Time
	Targets    []AggSample // per service and target, sorted
	// TargetActions splits each target's connections by policy action (the
	// z/OS policy-action fraction is per target and action): one aggregate
	// per service, target and action, sorted; connections under no action
	// are only in Targets.
	TargetActions []AggSample
}

// sampler keeps the activity of connections that closed since the last
// Sample.
type sampler struct {
	last          time.Time
	closedTargets map[aggKey]*AggSample
	closedFlows   map[aggKey]*AggSample
}

func (s *sampler) init(now time.Time) {
	s.last = now
	s.closedTargets = make(map[aggKey]*AggSample)
	s.closedFlows = make(map[aggKey]*AggSample)
}

// aggKey names an aggregate: a target (service, name) or a target's share
// under an action (service, name, action).
type aggKey struct{ service, name, action string }

func aggFor(m map[aggKey]*AggSample, k aggKey) *AggSample {
	a := m[k]
	if a == nil {
		a = &AggSample{Service: k.service, Name: k.name, Action: k.action}
		m[k] = a
	}
	return a
}

func serviceName(c *connEntry) string {
	if c.req.Service == nil {
		return ""
	}
	return c.req.Service.Name
}

// TargetName is the name of d's target as ConnStats and Sample give it:
// its Name, else its address; "" for none.
func TargetName(d Decision) string {
	if d.Target == nil {
		return ""
	}
	if d.Target.Name != "" {
		return d.Target.Name
	}
	return d.Target.Addr.String()
}

func actionName(d Decision) string {
	if d.Action == nil {
		return ""
	}
	return d.Action.Name
}

// observe reads c's counters now and returns them with the target leg's
// deltas since the last observation, which it records. Call with sampleMu
// held.
func (f *Proxy) observe(c *connEntry, now time.Time) (cl, tg LegCounters, dt delta) {
	cl = c.client.Counters()
	tg = c.target.Counters()
	from, to := f.dirs(c, tg)
	toC, toT := c.toClient.Load(), c.toTarget.Load()
	dt = delta{
		segsSent: sub(tg.SegmentsSent, c.last.target.SegmentsSent),
		retrans:  sub(tg.Retransmits, c.last.target.Retransmits),
		timeouts: sub(tg.Timeouts, c.last.target.Timeouts),
		bytes:    sub(toC, c.last.toClient) + sub(toT, c.last.toTarget),
		from:     SubDir(from, c.last.from),
		to:       SubDir(to, c.last.to),
	}
	stream := c.streamNs.Load()
	if el := now.Sub(c.last.at); el > 0 {
		dt.elapsed, dt.stream = el, time.Duration(stream-c.last.stream)
		dt.waiting = 2*dt.stream >= el
	}
	dt.rtoUnknown = !tg.TimeoutsKnown
	c.last = sampleState{at: now, client: cl, target: tg, toClient: toC, toTarget: toT, stream: stream, from: from, to: to}
	return cl, tg, dt
}

// finish takes a closing connection's final statistics, adds its last deltas
// to the sampler and removes it from the registry.
func (f *Proxy) finish(c *connEntry) ConnStats {
	f.syncHost(c) // direction.go
	now := f.Now()
	f.sampleMu.Lock()
	prev := c.last
	if c.finished { // an http target connection Close aborted first
		f.sampleMu.Unlock()
		return c.stats(c.last.client, c.last.target, prev, now)
	}
	cl, tg, dt := f.observe(c, now)
	c.finished = true
	f.settle(c, dt, 1)
	if f.opts.Meter != nil {
		f.opts.Meter.Release(c.target, &c.addrs)
	}
	f.sampleMu.Unlock()
	f.mu.Lock()
	delete(f.conns, c.req.ID)
	f.mu.Unlock()
	return c.stats(cl, tg, prev, now)
}

// settle adds a delta of c to the sampler's aggregates of ended activity:
// its target's and, unless c is pooled, its action's; closed is 1 when c
// ended. Call with sampleMu held.
func (f *Proxy) settle(c *connEntry, dt delta, closed int) {
	svc, tn := serviceName(c), TargetName(c.d)
	t := aggFor(f.sampler.closedTargets, aggKey{service: svc, name: tn})
	t.add(dt)
	t.Closed += closed
	if an := actionName(c.d); an != "" && !c.pooled {
		ta := aggFor(f.sampler.closedFlows, aggKey{service: svc, name: tn, action: an})
		ta.add(dt)
		ta.Closed += closed
	}
}

// hand settles an http target connection's activity since the last
// observation with its current owner, then gives the connection to the
// request of d (from req's client) or, with d nil, to no one: pooled. So a
// pooled connection's segments, bytes and streaming time belong to the
// request in flight on it, under that request's action, and while it is
// idle in the pool to its target alone, in no Active count.
//
// Before a park the host capture catches up (syncHost): its reader runs
// behind the traffic, and the response's segments, already past the
// capture's socket when the proxy read them, would otherwise be read
// after the hand-over and credited to the idle pool, no action's, so
// outside the monitor's (default, policy) scope.
func (f *Proxy) hand(c *connEntry, req *ConnRequest, d *Decision) {
	if d == nil {
		f.syncHost(c) // direction.go
	}
	now := f.Now()
	f.sampleMu.Lock()
	defer f.sampleMu.Unlock()
	if c.finished {
		return
	}
	_, _, dt := f.observe(c, now)
	f.settle(c, dt, 0)
	if d == nil {
		c.pooled = true
		return
	}
	c.pooled = false
	c.d = *d
	c.req.Client, c.req.VIP = req.Client, req.VIP
}

// stats builds the exported record from counters read now.
func (c *connEntry) stats(cl, tg LegCounters, prev sampleState, now time.Time) ConnStats {
	toC, toT := c.toClient.Load(), c.toTarget.Load()
	cs := ConnStats{
		ID:        c.req.ID,
		Client:    c.req.Client,
		VIP:       c.req.VIP,
		Target:    TargetName(c.d),
		Start:     c.start,
		ClientLeg: LegStats{LegCounters: cl, BytesSent: toC, BytesReceived: toT},
		TargetLeg: LegStats{LegCounters: tg, BytesSent: toT, BytesReceived: toC},
	}
	if c.req.Service != nil {
		cs.Service = c.req.Service.Name
	}
	if !c.pooled {
		cs.Action = actionName(c.d) // an idle pooled connection is no level's
	}
	if el := now.Sub(prev.at).Seconds(); el > 0 {
		cs.Throughput = float64(sub(toC, prev.toClient)+sub(toT, prev.toTarget)) / el
	}
	return cs
}

// Conns returns the statistics of every open connection, sorted by ID (for
// an admin /connections view). It reads each endpoint's counters.
func (f *Proxy) Conns() []ConnStats {
	f.mu.Lock()
	list := make([]*connEntry, 0, len(f.conns))
	for _, c := range f.conns {
		list = append(list, c)
	}
	f.mu.Unlock()
	now := f.Now()
	out := make([]ConnStats, 0, len(list))
	f.sampleMu.Lock()
	for _, c := range list {
		out = append(out, c.stats(c.client.Counters(), c.target.Counters(), c.last, now))
	}
	f.sampleMu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Sample aggregates, per target and per target and policy action, what
// happened since the previous Sample (or since New): deltas of
// every open connection's counters plus the last deltas of connections that
// closed in between. Call it once per sampling interval from one goroutine.
func (f *Proxy) Sample() Sample {
	f.mu.Lock()
	list := make([]*connEntry, 0, len(f.conns))
	for _, c := range f.conns {
		list = append(list, c)
	}
	f.mu.Unlock()

	now := f.Now()
	f.sampleMu.Lock()
	defer f.sampleMu.Unlock()
	start := f.sampler.last
	targets, flows := f.sampler.closedTargets, f.sampler.closedFlows
	f.sampler.init(now)
	for _, c := range list {
		if c.finished {
			continue
		}
		_, _, dt := f.observe(c, now)
		svc, tn := serviceName(c), TargetName(c.d)
		t := aggFor(targets, aggKey{service: svc, name: tn})
		t.add(dt)
		if c.pooled {
			continue // idle in the pool: its target's, no level's, not active
		}
		t.Active++
		if an := actionName(c.d); an != "" {
			ta := aggFor(flows, aggKey{service: svc, name: tn, action: an})
			ta.add(dt)
			ta.Active++
		}
	}
	s := Sample{Start: start, End: now}
	for _, a := range targets {
		s.Targets = append(s.Targets, *a)
	}
	for _, a := range flows {
		s.TargetActions = append(s.TargetActions, *a)
	}
	sortAgg(s.Targets)
	sortAgg(s.TargetActions)
	return s
}

// sortAgg orders aggregates by service, name, then action.
func sortAgg(a []AggSample) {
	sort.Slice(a, func(i, j int) bool {
		if a[i].Service != a[j].Service {
			return a[i].Service < a[j].Service
		}
		if a[i].Name != a[j].Name {
			return a[i].Name < a[j].Name
		}
		return a[i].Action < a[j].Action
	})
}
