package netstack

import (
	"net/netip"
	"sort"
	"time"
)

// LegStats are one leg's counters plus the bytes weir moved on it.
type LegStats struct {
	LegCounters
	BytesSent     uint64 // bytes weir wrote to this leg
	BytesReceived uint64 // bytes weir read from this leg
}

// ConnStats is one connection's record: both legs, measured.
type ConnStats struct {
	ID      uint64
	Client  netip.AddrPort
	VIP     netip.AddrPort
	Service string // virtual server name
	Target  string // target name ("" when no target leg was opened)
	Action  string // policy action name, "" for none
	Start   time.Time
	// ClientLeg is weir ⇄ client, TargetLeg weir ⇄ target.
	ClientLeg LegStats
	TargetLeg LegStats
	// Throughput is bytes per second, both directions, since the last
	// Sample (or since Start).
	Throughput float64
}

// sampleState is what the sampler saw of a connection at its last Sample.
type sampleState struct {
	at             time.Time
	client, target LegCounters
	toClient       uint64
	toTarget       uint64
}

// delta is the activity of one connection in a sampling interval.
type delta struct {
	segsSent, retrans, timeouts uint64 // on the measured leg
	bytes                       uint64 // both directions
	toClient                    uint64
}

func sub(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

// AggSample is the activity of one target or one policy action over a
// sampling interval. For a target the segment counts are the target leg's
// (weir → target), for an action the client leg's (weir → client, the
// outbound traffic a z/OS policy governs).
type AggSample struct {
	// Service is the virtual server of a target's or a target-action
	// aggregate; Name the target's or the action's name; Action the action
	// of a target-action aggregate. Target names are unique only within
	// their service.
	Service string
	Name    string
	Action  string
	Active  int // connections open at the end of the interval
	// Closed is the number of connections that ended in the interval; their
	// activity up to their end is included.
	Closed       int
	SegmentsSent uint64
	Retransmits  uint64
	Timeouts     uint64
	// LossRatio = Retransmits / SegmentsSent; TimeoutRatio = Timeouts /
	// SegmentsSent; both 0 when nothing was sent.
	LossRatio    float64
	TimeoutRatio float64
	Bytes        uint64  // both directions
	Throughput   float64 // Bytes per second of the interval
	// MinRate verdict (actions only): connections open through the whole
	// interval whose rate toward the client was below the action's
	// MinRate, and their mean rate toward the client in Kbit/s.
	BelowMinRate int
	MeanRateKbit float64
}

func (a *AggSample) add(d delta) {
	a.SegmentsSent += d.segsSent
	a.Retransmits += d.retrans
	a.Timeouts += d.timeouts
	a.Bytes += d.bytes
}

func (a *AggSample) finish(interval time.Duration) {
	if a.SegmentsSent > 0 {
		a.LossRatio = float64(a.Retransmits) / float64(a.SegmentsSent)
		a.TimeoutRatio = float64(a.Timeouts) / float64(a.SegmentsSent)
	}
	if s := interval.Seconds(); s > 0 {
		a.Throughput = float64(a.Bytes) / s
	}
}

// Sample is the activity of all connections over one sampling interval.
type Sample struct {
	Start, End time.Time
	Targets    []AggSample // per service and target, sorted
	Actions    []AggSample // per action, sorted by name
	// TargetActions splits each target's connections by policy action (the
	// z/OS policy-action fraction is per target and action); segment counts
	// are the target leg's, as in Targets.
	TargetActions []AggSample
}

// sampler keeps the activity of connections that closed since the last
// Sample.
type sampler struct {
	last          time.Time
	closedTargets map[aggKey]*AggSample
	closedActions map[aggKey]*AggSample
	closedFlows   map[aggKey]*AggSample
}

func (s *sampler) init(now time.Time) {
	s.last = now
	s.closedTargets = make(map[aggKey]*AggSample)
	s.closedActions = make(map[aggKey]*AggSample)
	s.closedFlows = make(map[aggKey]*AggSample)
}

// aggKey names an aggregate: a target (service, name), an action (name) or
// a target's share under an action (service, name, action).
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

func targetName(d Decision) string {
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

// observe reads c's counters now and returns them with the deltas since the
// last observation, which it records. Call with sampleMu held.
func observe(c *connEntry, now time.Time) (cl, tg LegCounters, dt, da delta) {
	cl = c.client.Counters()
	tg = c.target.Counters()
	toC, toT := c.toClient.Load(), c.toTarget.Load()
	bytes := sub(toC, c.last.toClient) + sub(toT, c.last.toTarget)
	dt = delta{
		segsSent: sub(tg.SegmentsSent, c.last.target.SegmentsSent),
		retrans:  sub(tg.Retransmits, c.last.target.Retransmits),
		timeouts: sub(tg.Timeouts, c.last.target.Timeouts),
		bytes:    bytes,
	}
	da = delta{
		segsSent: sub(cl.SegmentsSent, c.last.client.SegmentsSent),
		retrans:  sub(cl.Retransmits, c.last.client.Retransmits),
		timeouts: sub(cl.Timeouts, c.last.client.Timeouts),
		bytes:    bytes,
		toClient: sub(toC, c.last.toClient),
	}
	c.last = sampleState{at: now, client: cl, target: tg, toClient: toC, toTarget: toT}
	return cl, tg, dt, da
}

// finish takes a closing connection's final statistics, adds its last deltas
// to the sampler and removes it from the registry.
func (f *Forwarder) finish(c *connEntry) ConnStats {
	now := time.Now()
	f.sampleMu.Lock()
	prev := c.last
	cl, tg, dt, da := observe(c, now)
	c.finished = true
	svc, tn := serviceName(c), targetName(c.d)
	closedT := aggFor(f.sampler.closedTargets, aggKey{service: svc, name: tn})
	closedT.add(dt)
	closedT.Closed++
	if an := actionName(c.d); an != "" {
		a := aggFor(f.sampler.closedActions, aggKey{name: an})
		a.add(da)
		a.Closed++
		ta := aggFor(f.sampler.closedFlows, aggKey{service: svc, name: tn, action: an})
		ta.add(dt)
		ta.Closed++
	}
	f.sampleMu.Unlock()
	f.mu.Lock()
	delete(f.conns, c.req.ID)
	f.mu.Unlock()
	return c.stats(cl, tg, prev, now)
}

// stats builds the exported record from counters read now.
func (c *connEntry) stats(cl, tg LegCounters, prev sampleState, now time.Time) ConnStats {
	toC, toT := c.toClient.Load(), c.toTarget.Load()
	cs := ConnStats{
		ID:        c.req.ID,
		Client:    c.req.Client,
		VIP:       c.req.VIP,
		Target:    targetName(c.d),
		Action:    actionName(c.d),
		Start:     c.start,
		ClientLeg: LegStats{LegCounters: cl, BytesSent: toC, BytesReceived: toT},
		TargetLeg: LegStats{LegCounters: tg, BytesSent: toT, BytesReceived: toC},
	}
	if c.req.Service != nil {
		cs.Service = c.req.Service.Name
	}
	if el := now.Sub(prev.at).Seconds(); el > 0 {
		cs.Throughput = float64(sub(toC, prev.toClient)+sub(toT, prev.toTarget)) / el
	}
	return cs
}

// Conns returns the statistics of every open connection, sorted by ID (for
// an admin /connections view). It reads each endpoint's counters.
func (f *Forwarder) Conns() []ConnStats {
	f.mu.Lock()
	list := make([]*connEntry, 0, len(f.conns))
	for _, c := range f.conns {
		list = append(list, c)
	}
	f.mu.Unlock()
	now := time.Now()
	out := make([]ConnStats, 0, len(list))
	f.sampleMu.Lock()
	for _, c := range list {
		out = append(out, c.stats(c.client.Counters(), c.target.Counters(), c.last, now))
	}
	f.sampleMu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Sample aggregates, per target and per policy action, what happened since
// the previous Sample (or since NewForwarder): deltas of every open
// connection's counters plus the last deltas of connections that closed in
// between. Call it once per sampling interval from one goroutine.
func (f *Forwarder) Sample() Sample {
	f.mu.Lock()
	list := make([]*connEntry, 0, len(f.conns))
	for _, c := range f.conns {
		list = append(list, c)
	}
	f.mu.Unlock()

	now := time.Now()
	f.sampleMu.Lock()
	defer f.sampleMu.Unlock()
	start := f.sampler.last
	targets, actions, flows := f.sampler.closedTargets, f.sampler.closedActions, f.sampler.closedFlows
	f.sampler.init(now)
	type rateAcc struct {
		sum float64
		n   int
	}
	rates := map[string]*rateAcc{}
	for _, c := range list {
		if c.finished {
			continue
		}
		prevAt := c.last.at
		_, _, dt, da := observe(c, now)
		svc, tn := serviceName(c), targetName(c.d)
		t := aggFor(targets, aggKey{service: svc, name: tn})
		t.add(dt)
		t.Active++
		an := actionName(c.d)
		if an == "" {
			continue
		}
		a := aggFor(actions, aggKey{name: an})
		a.add(da)
		a.Active++
		ta := aggFor(flows, aggKey{service: svc, name: tn, action: an})
		ta.add(dt)
		ta.Active++
		// The MinRate verdict looks only at connections open through the
		// whole interval: a connection that just opened has no rate yet.
		if !prevAt.After(start) {
			el := now.Sub(prevAt).Seconds()
			if el <= 0 {
				continue
			}
			kbit := float64(da.toClient) * 8 / 1000 / el
			r := rates[an]
			if r == nil {
				r = &rateAcc{}
				rates[an] = r
			}
			r.sum += kbit
			r.n++
			if c.d.Action.MinRate > 0 && kbit < float64(c.d.Action.MinRate) {
				a.BelowMinRate++
			}
		}
	}
	s := Sample{Start: start, End: now}
	interval := now.Sub(start)
	for _, a := range targets {
		a.finish(interval)
		s.Targets = append(s.Targets, *a)
	}
	for k, a := range actions {
		a.finish(interval)
		if r := rates[k.name]; r != nil && r.n > 0 {
			a.MeanRateKbit = r.sum / float64(r.n)
		}
		s.Actions = append(s.Actions, *a)
	}
	for _, a := range flows {
		a.finish(interval)
		s.TargetActions = append(s.TargetActions, *a)
	}
	sortAgg(s.Targets)
	sortAgg(s.Actions)
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
