package appliance

import (
	"errors"
	"sort"
	"sync"
	"sync/atomic"

	"weir/balancer"
	"weir/cmd/weir/api"
	"weir/cmd/weir/internal/cluster"
	"weir/datapath"
	"weir/datapath/tun"
	"weir/netstack"
	"weir/policy"
)

// counters are the appliance's own totals since start.
type counters struct {
	closed          atomic.Uint64
	dialFailures    atomic.Uint64
	refusedDraining atomic.Uint64
	reloads         atomic.Uint64
	reloadFailures  atomic.Uint64

	mu       sync.Mutex
	refusals map[[2]string]uint64 // {level, limit} → count
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

// reloadError is a rejected configuration, as /status shows it.
type reloadError = api.ReloadError

// Status returns the appliance's state now: the document /status serves,
// `weir status` prints and the metrics collector exports.
func (a *Appliance) Status() api.Status {
	cfg := a.cfg.Load()
	now := a.now()
	st := api.Status{
		Instance:       cfg.Instance.Name,
		Source:         a.opts.Source,
		Generation:     a.gen.Load(),
		LoadedAt:       *a.loadedAt.Load(),
		ReloadError:    a.reloadErr.Load(),
		Reloads:        a.counters.reloads.Load(),
		ReloadFailures: a.counters.reloadFailures.Load(),
		Draining:       a.draining.Load(),
		Open:           a.OpenConnections(),
		Closed:         a.counters.closed.Load(),
		DialFailures:   a.counters.dialFailures.Load(),
		Refusals:       a.counters.refusalList(),
	}
	raw := a.RawStats()
	st.Datapath = datapathStatus(raw.Datapath, raw.Flows)
	st.Stack = stackStatus(raw.Stack)
	// Every SYN dropped for want of room, listeners' included (the stack's
	// own counter is only the tcp.Forwarder path's global bound).
	st.Stack.SYNsDroppedInFlight = raw.Forwarder.DroppedInFlight
	st.Forwarder = forwarderStatus(raw.Forwarder)
	st.Control.DroppedEvents = raw.AdmissionEventsDropped
	if a.opts.LogDrops != nil {
		st.Control.DroppedLogLines = a.opts.LogDrops()
	}
	for i, n := range raw.NICs {
		st.NICs = append(st.NICs, nicStatus(n))
		if t, ok := findTUN(a.nics[i].dev); ok {
			ts, err := t.TUNStats()
			if d := st.NICs[i].Device; d != nil {
				d.WriteErrors = ts.WriteErrors
			}
			if st.TUN == nil && err == nil {
				st.TUN = &api.TUN{Name: t.Name(), ToWeirDropped: ts.KernelTxDropped, ToWeirErrors: ts.KernelTxErrors,
					FromWeirDropped: ts.KernelRxDropped, FromWeirErrors: ts.KernelRxErrors}
				if o, ok := t.(interface{ Offload() bool }); ok {
					st.TUN.Offload = o.Offload()
				}
			}
		}
	}
	for _, l := range a.adm.Snapshot() {
		st.Levels = append(st.Levels, api.Level{
			Level: l.Level.String(), Name: l.Name, Connections: l.Conns,
			MaxConnections: l.Limits.MaxConnections, EnforceConnections: l.Limits.EnforceConnections,
			Bandwidth: l.Bandwidth, MaxBandwidth: l.Limits.MaxBandwidth, EnforceBandwidth: l.Limits.EnforceBandwidth,
			Over: l.OverConns || l.OverBandwidth || l.OverBurst, Retired: l.Retired,
		})
	}
	if a.clu != nil {
		st.Cluster = clusterStatus(a.clu.Status())
	}
	a.explMu.Lock()
	expl := a.expl
	st.SampledAt = a.explAt
	actionFr := a.actionFr
	a.explMu.Unlock()
	byKey := map[policy.TargetKey]*policy.Explanation{}
	for i := range expl {
		byKey[policy.TargetKey{Service: expl[i].Service, Target: expl[i].Target}] = &expl[i]
	}
	for _, vs := range cfg.Services {
		s := api.Service{Name: vs.Name, Proto: vs.Proto.String(), Ports: vs.Ports.String(), Balancer: cfg.Balancer.Algorithm.String()}
		if vs.Class != nil {
			s.Class = vs.Class.Name
		}
		if vs.Proto == policy.ProtoHTTP {
			s.Clients, s.MaxClients = a.clientCount(vs.Name).Load(), vs.HTTP.MaxClients
		}
		for _, v := range vs.VIPs {
			s.VIPs = append(s.VIPs, v.String())
		}
		if b := a.balancer(vs.Name); b != nil {
			bs := b.Snapshot(now)
			s.Refused = bs.Refused
			for _, t := range bs.Targets {
				k := policy.TargetKey{Service: vs.Name, Target: t.Name}
				tg := targetStatus(t, byKey[k], actionFr[vs.Name])
				if sg, ok := a.SegmentsOf(k); ok {
					tg.Segments = &sg
				}
				s.Targets = append(s.Targets, tg)
			}
		}
		st.Services = append(st.Services, s)
	}
	st.HTTP.Requests, st.HTTP.InFlight, st.HTTP.Durations = a.reqs.status()
	return st
}

// targetStatus is one target's status: its balancer state t, its last
// explanation e (nil before the first sample) and the fractions of its
// service's action levels fr (action → target → percent), as
// applyFractions gave them to the balancer.
func targetStatus(t balancer.TargetStatus, e *policy.Explanation, fr map[string]map[string]int) api.Target {
	out := api.Target{
		Name: t.Name, Addr: t.Addr.String(), Role: t.Role.String(),
		Weight: t.Weight, Effective: t.Effective, Exact: t.Exact, SlowStart: t.SlowStart,
		Open: t.Open, Max: t.Max, Down: t.Down, DownUntil: t.DownUntil, HealthUp: t.HealthUp,
		SkippedAtLimit: t.SkippedAtLimit, Picked: t.Picked, Failed: t.Failed,
	}
	// The balancer's own tables say which levels exist and their weights;
	// a target missing from a level's fractions is at its base weight
	// there (balancer.SetFractions), fraction 0.
	for action, w := range t.Levels {
		f := fr[action][t.Name]
		out.Actions = append(out.Actions, api.ActionLevel{Action: action, Fraction: f, Exact: w,
			Effective: policy.EffectiveWeight(t.Weight, f)})
	}
	sort.Slice(out.Actions, func(i, j int) bool { return out.Actions[i].Action < out.Actions[j].Action })
	if e != nil {
		out.Explanation = &api.Explanation{
			Interval: e.Interval, SegmentsSent: e.SegmentsSent, Retransmits: e.Retransmits, Timeouts: e.Timeouts,
			ActiveConns: e.ActiveConns, MaxConns: e.MaxConns, ThroughputKbps: e.ThroughputKbps,
			LossRatio: e.LossRatio, TimeoutRatio: e.TimeoutRatio, LossFraction: e.LossFraction, TimeoutFraction: e.TimeoutFraction,
			Held: e.Held, Constrained: e.Constrained, DefaultFraction: e.DefaultFraction,
			Action: e.Action, ActionConns: e.ActionConns, ActionMaxConns: e.ActionMaxConns, ActionKbps: e.ActionKbps,
			PerConnKbps: e.PerConnKbps, MinRateKbps: e.MinRateKbps, MeanRateKbps: e.MeanRateKbps,
			ConnFraction: e.ConnFraction, MinRateFraction: e.MinRateFraction, ActionFraction: e.ActionFraction,
			Fraction: e.Fraction, Winner: e.Winner.String(), BaseWeight: e.BaseWeight, Weight: e.Weight,
			MinSegments: e.MinSegments, PendingSegments: e.PendingSegments, TimeoutsUnknown: e.TimeoutsUnknown,
			DefaultWeight: e.DefaultWeight,
		}
		for _, l := range e.Levels {
			out.Explanation.Levels = append(out.Explanation.Levels, api.ExplanationLevel{
				Action: l.Action, Conns: l.Conns, ConnFraction: l.ConnFraction, MinRateFraction: l.MinRateFraction,
				Fraction: l.Fraction, Weight: l.Weight,
			})
		}
	}
	return out
}

func datapathStatus(s datapath.EngineStats, f datapath.FlowTableStats) api.Datapath {
	out := api.Datapath{EgressMalformed: s.EgressMalformed, Fragments: s.Fragments, Marked: s.Marked, Uncached: s.Uncached}
	for i, n := range s.Dropped {
		if r := datapath.DropReason(i); r != datapath.DropNone {
			out.Dropped = append(out.Dropped, api.Drop{Reason: r.String(), Count: n})
		}
	}
	out.Flows = api.FlowTable{Live: f.Flows, Inserted: f.Inserted, Replaced: f.Replaced, Expired: f.Expired, Refused: f.Refused}
	return out
}

func stackStatus(s netstack.StackStats) api.Stack {
	return api.Stack{
		TCPSegmentsSent: s.TCPSegmentsSent, TCPRetransmits: s.TCPRetransmits, TCPTimeouts: s.TCPTimeouts,
		TCPResetsSent: s.TCPResetsSent, SYNsDroppedInFlight: s.TCPForwardDropFull, UDPNoSocket: s.UDPUnknownPort,
		ICMPUnreachablesSent: s.ICMPUnreachablesSent, IPMalformed: s.IPMalformed,
		TCPChecksumErrors: s.TCPChecksumErrors, IPFragmentsRefused: s.IPFragmentsRefused,
	}
}

func forwarderStatus(s netstack.ForwarderStats) api.Forwarder {
	return api.Forwarder{
		Accepted: s.Accepted, Pending: s.Pending, NoService: s.NoService, RefusedClosed: s.RefusedClosed,
		HandshakeTimedOut: s.HandshakeTimedOut, HandshakeFailed: s.HandshakeFailed,
		IdleClosed: s.IdleClosed, TimeWaitReopened: s.TimeWaitReopened, Aborted: s.Aborted, NoSession: s.NoSession,
		SYNCookiesSent: s.SYNCookiesSent, SYNCookiesValid: s.SYNCookiesValid, SYNCookiesInvalid: s.SYNCookiesInvalid,
		Listeners: s.Listeners, TargetTimedOut: s.TargetTimedOut, Panics: s.Panics,
		HTTPRequests: s.HTTPRequests, HTTPRefused: s.HTTPRefused, HTTPHeaderTimeout: s.HTTPHeaderTimeout,
		HTTPHeaderTooBig: s.HTTPHeaderTooBig, HTTPBadRequest: s.HTTPBadRequest, HTTPRetried: s.HTTPRetried,
		HTTPBadGateway: s.HTTPBadGateway, HTTPClients: s.HTTPClients, TargetConns: s.TargetConns, TargetConnsIdle: s.TargetConnsIdle,
	}
}

func nicStatus(n NICStats) api.NIC {
	s := n.Link
	out := api.NIC{
		Name: n.Name, RxPackets: s.RxPackets, RxBytes: s.RxBytes, TxPackets: s.TxPackets, TxBytes: s.TxBytes,
		Dropped: []api.Drop{
			{Reason: "malformed", Count: s.DroppedMalformed},
			{Reason: "detached", Count: s.DroppedDetached},
			{Reason: "queue_full", Count: s.DroppedQueueFull},
			{Reason: "too_big", Count: s.DroppedTooBig},
			{Reason: "closed", Count: s.DroppedClosed},
			{Reason: "checksum", Count: s.DroppedChecksum},
		},
		Errors: []api.Drop{
			{Reason: "read", Count: s.ReadErrors},
			{Reason: "write", Count: s.WriteErrors},
			{Reason: "write_short", Count: s.WriteShort},
		},
	}
	if n.HasDevice {
		out.Device = &api.Device{DroppedFull: n.Device.DroppedFull, DroppedTooBig: n.Device.DroppedTooBig}
	}
	return out
}

// tunDevice is a TUN queue (datapath/tun.Device): its own and its
// interface's kernel counters.
type tunDevice interface {
	Name() string
	TUNStats() (tun.Stats, error)
}

// findTUN finds the TUN queue under d, looking through wrappers that say
// what they wrap (a --capture recorder).
func findTUN(d datapath.Device) (tunDevice, bool) {
	for d != nil {
		if t, ok := d.(tunDevice); ok {
			return t, true
		}
		u, ok := d.(interface{ Unwrap() datapath.Device })
		if !ok {
			return nil, false
		}
		d = u.Unwrap()
	}
	return nil, false
}

// Connections lists open connections with both legs' statistics, for
// /connections.
func (a *Appliance) Connections() []api.Connection {
	cs := a.fwd.Conns()
	out := make([]api.Connection, len(cs))
	for i, c := range cs {
		out[i] = api.Connection{
			ID: c.ID, Client: c.Client.String(), VIP: c.VIP.String(), Service: c.Service, Target: c.Target,
			Action: c.Action, Start: c.Start, ClientLeg: legStatus(c.ClientLeg), TargetLeg: legStatus(c.TargetLeg),
			Throughput: c.Throughput,
		}
	}
	return out
}

func legStatus(l netstack.LegStats) api.Leg {
	return api.Leg{
		SegmentsSent: l.SegmentsSent, SegmentsReceived: l.SegmentsReceived, Retransmits: l.Retransmits,
		FastRetransmits: l.FastRetransmits, Timeouts: l.Timeouts, TimeoutsKnown: l.TimeoutsKnown,
		RTT: l.RTT, RTTVar: l.RTTVar, BytesSent: l.BytesSent, BytesReceived: l.BytesReceived,
	}
}

// Healthy is nil while the appliance serves, an error while it drains.
func (a *Appliance) Healthy() error {
	if a.draining.Load() {
		return errors.New("draining")
	}
	return nil
}

// TargetFailures is the number of failed connects to a target so far.
func (a *Appliance) TargetFailures(k policy.TargetKey) uint64 {
	b := a.balancer(k.Service)
	if b == nil {
		return 0
	}
	for _, t := range b.Snapshot(a.now()).Targets {
		if t.Name == k.Target {
			return t.Failed
		}
	}
	return 0
}

func clusterStatus(c cluster.Status) *api.Cluster {
	out := &api.Cluster{Name: c.Name, Instance: c.Instance, Redis: c.Redis, Reachable: c.Reachable, Mode: c.Mode,
		LastError: c.LastError, Outages: c.Outages, Renewals: c.Renewals,
		Members: []api.ClusterMember{}, Levels: []api.ClusterLevel{}, Bandwidth: []api.ClusterBandwidth{},
		BandwidthRounds: c.BandwidthRounds, BandwidthFallbacks: c.BandwidthFallbacks,
		SampleRounds: c.SampleRounds, SampleFallbacks: c.SampleFallbacks, SampleMembers: c.SampleMembers, SampleError: c.SampleError}
	out.Logged = []api.ClusterLogged{}
	for _, l := range c.Logged {
		out.Logged = append(out.Logged, api.ClusterLogged{Level: l.Kind.String(), Name: l.Name, Local: l.Open, Cluster: l.Open + l.Others})
	}
	for _, b := range c.Bandwidth {
		out.Bandwidth = append(out.Bandwidth, api.ClusterBandwidth{Level: b.Kind.String(), Name: b.Name, Max: b.Limit,
			Enforced: b.Enforced, Local: b.Local, Cluster: b.Local + b.Others})
	}
	for _, m := range c.Members {
		out.Members = append(out.Members, api.ClusterMember{ID: m.ID, Started: m.Started, SeenSeconds: m.Seen.Seconds()})
	}
	for _, l := range c.Levels {
		cl := api.ClusterLevel{Level: l.Kind.String(), Name: l.Name, Limit: l.Limit,
			Share: l.Share, Open: l.Open, Held: l.Held, Refused: l.Refused}
		if l.Target != "" {
			cl.Level, cl.Name, cl.Service = "target", l.Target, l.Name
		}
		out.Levels = append(out.Levels, cl)
	}
	return out
}
