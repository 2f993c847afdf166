// Package status builds weir's status document (api.Status, what /status
// serves, `weir status` prints and the metrics collector exports) from the
// raw counters and snapshots of its parts: the datapath, the stack and its
// NICs, the forwarder, the admission levels, the balancers' targets and the
// cluster. It maps, it does not decide: every number is one a part counted.
package status

import (
	"sort"

	"weir/balancer"
	"weir/cmd/weir/api"
	"weir/cmd/weir/internal/cluster"
	"weir/datapath"
	"weir/datapath/tun"
	"weir/netstack"
	"weir/netstack/proxy"
	proxyhttp "weir/netstack/proxy/http"
	udprelay "weir/netstack/proxy/udp"
	"weir/policy"
)

// RawStats are the raw counters of the appliance's parts at one moment:
// every counted drop of the datapath, the flow table, the stack, its NICs
// and their devices, the forwarder and the admission is in one of them.
// They are totals since the appliance started; Parts maps them into the
// status document, and so into the metrics.
type RawStats struct {
	Datapath  datapath.EngineStats
	Flows     datapath.FlowTableStats // Refused: flows the full table did not cache
	Stack     netstack.StackStats
	Forwarder netstack.ForwarderStats // the accept path
	Proxy     proxy.Stats             // the connections it handed over
	HTTP      proxyhttp.Stats         // of those, the http virtual servers' requests
	UDPFront  netstack.UDPFrontStats  // the udp services' VIP endpoints
	UDP       udprelay.Stats          // the udp services' sessions
	// NICs are the front NIC, the further front queues' and the back
	// arms', in that order.
	NICs []NICStats
	// AdmissionEventsDropped counts limit crossings the admission's event
	// buffer had no room for (their log lines are lost; the state in
	// /status is not).
	AdmissionEventsDropped uint64
}

// NICStats are one NIC's counters: the link's between stack and device
// (DroppedQueueFull: egress packets the full write queue dropped), and the
// device's own when it counts (a datapath.StatsReporter: a memory pair, a
// TUN that reports).
type NICStats struct {
	Name string
	Back bool // a back arm, not a front NIC
	Link netstack.LinkStats
	// Device holds the device's counters when HasDevice is set.
	Device    datapath.DeviceStats
	HasDevice bool
}

// Parts fills st's sections of the parts' counters from raw: datapath,
// stack, forwarder, control and NICs, and the TUN's kernel counters found
// under devs (devs[i] is the device of raw.NICs[i]; nil for none).
func Parts(st *api.Status, raw RawStats, devs []datapath.Device) {
	st.Datapath = datapathDoc(raw.Datapath, raw.Flows)
	st.Stack = stackDoc(raw.Stack)
	// Every SYN dropped for want of room, listeners' included (the stack's
	// own counter is only the tcp.Forwarder path's global bound).
	st.Stack.SYNsDroppedInFlight = raw.Forwarder.DroppedInFlight
	st.Forwarder = forwarderDoc(raw.Forwarder, raw.Proxy, raw.HTTP)
	u, f := raw.UDP, raw.UDPFront
	st.UDP = api.UDP{Sessions: u.Sessions, Endpoints: f.Endpoints, Created: u.Created, Refused: u.Refused,
		DroppedFull: u.DroppedFull, DroppedVIP: u.DroppedVIP, DialFailed: u.DialFailed,
		EndedIdle: u.EndedIdle, EndedResponses: u.EndedResponses, EndedUnanswered: u.EndedUnanswered, EndedError: u.EndedError, EndedClosed: u.EndedClosed,
		DatagramsIn: u.DatagramsIn, DatagramsOut: u.DatagramsOut, BytesIn: u.BytesIn, BytesOut: u.BytesOut,
		WriteErrors: u.WriteErrors, ReceiveDropped: f.ReceiveDropped, NoService: f.NoService}
	st.Control.DroppedEvents = raw.AdmissionEventsDropped
	for i, n := range raw.NICs {
		st.NICs = append(st.NICs, nicDoc(n))
		if i >= len(devs) {
			continue
		}
		if t, ok := findTUN(devs[i]); ok {
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
}

// Levels are the admission's levels (policy.Admission.Snapshot) as the
// status document lists them.
func Levels(snap []policy.LevelStat) []api.Level {
	var out []api.Level
	for _, l := range snap {
		out = append(out, api.Level{
			Level: l.Level.String(), Name: l.Name, Connections: l.Conns,
			MaxConnections: l.Limits.MaxConnections, EnforceConnections: l.Limits.EnforceConnections,
			Bandwidth: l.Bandwidth, MaxBandwidth: l.Limits.MaxBandwidth, EnforceBandwidth: l.Limits.EnforceBandwidth,
			Over: l.OverConns || l.OverBandwidth || l.OverBurst, Retired: l.Retired,
			Queue: queue(l.Queue),
		})
	}
	return out
}

// queue converts a queue's counters; nil for a level without a queue
// that never had one.
func queue(q policy.QueueStat) *api.Queue {
	if q.Limit == 0 && q.Waits == 0 && q.Full == 0 {
		return nil
	}
	return &api.Queue{Limit: q.Limit, TimeoutMs: q.Timeout.Milliseconds(), Waiting: q.Waiting, Waits: q.Waits,
		Served: q.Served, TimedOut: q.TimedOut, Full: q.Full, WaitedSec: q.Waited.Seconds()}
}

// Clients converts the per-client tables.
func Clients(cs []policy.ClientStat) []api.ClientTable {
	var out []api.ClientTable
	for _, c := range cs {
		v4, v6 := c.Limits.PrefixV4, c.Limits.PrefixV6
		if v4 == 0 {
			v4 = 32
		}
		if v6 == 0 {
			v6 = 128
		}
		out = append(out, api.ClientTable{
			Scope: c.Scope, MaxConnections: c.Limits.MaxConnections, EnforceConnections: c.Limits.EnforceConnections,
			MaxBandwidth: c.Limits.MaxBandwidth, EnforceBandwidth: c.Limits.EnforceBandwidth, PrefixV4: v4, PrefixV6: v6,
			Clients: c.Clients, Active: c.Active, Size: c.Size, Refused: c.Refused, Overflow: c.Overflow, Evicted: c.Evicted,
			Queue: queue(c.Queue),
		})
	}
	return out
}

// Sampled is the sampling loop's last result, as Services reads it.
type Sampled struct {
	// Explanations are the last interval's, one per target.
	Explanations []policy.Explanation
	// ActionFractions are the fractions of the action levels last given
	// to the balancers: service → action → target → percent.
	ActionFractions map[string]map[string]map[string]int
	// Segments returns a target's per-direction totals, false before its
	// first sample; nil means none.
	Segments func(policy.TargetKey) (api.Segments, bool)
	// Replies returns a udp target's reply latency, false before its
	// first request/response session; nil means none.
	Replies func(policy.TargetKey) (api.ReplyLatency, bool)
}

// Services lists cfg's virtual servers in file order with their targets:
// snapshot returns a service's balancer state (false when a reload removed
// it), clients the open client connections of an http service.
func Services(cfg *policy.Config, sm Sampled, snapshot func(service string) (balancer.Status, bool), clients func(service string) int64) []api.Service {
	byKey := map[policy.TargetKey]*policy.Explanation{}
	for i := range sm.Explanations {
		e := &sm.Explanations[i]
		byKey[policy.TargetKey{Service: e.Service, Target: e.Target}] = e
	}
	var out []api.Service
	for _, vs := range cfg.Services {
		s := api.Service{Name: vs.Name, Proto: vs.Proto.String(), Ports: vs.Ports.String(), Balancer: cfg.Balancer.Algorithm.String()}
		if cfg.Balancer.Algorithm == policy.Maglev && vs.HashBy != nil {
			s.HashBy = vs.HashBy.String()
		}
		if vs.Class != nil {
			s.Class = vs.Class.Name
		}
		if vs.Proto == policy.ProtoHTTP {
			s.Clients, s.MaxClients = clients(vs.Name), vs.HTTP.MaxClients
		}
		for _, v := range vs.VIPs {
			s.VIPs = append(s.VIPs, v.String())
		}
		if bs, ok := snapshot(vs.Name); ok {
			s.Refused = bs.Refused
			for _, t := range bs.Targets {
				k := policy.TargetKey{Service: vs.Name, Target: t.Name}
				tg := Target(t, byKey[k], sm.ActionFractions[vs.Name])
				if sm.Segments != nil {
					if sg, ok := sm.Segments(k); ok {
						tg.Segments = &sg
					}
				}
				if sm.Replies != nil && vs.Proto == policy.ProtoUDP {
					if rl, ok := sm.Replies(k); ok {
						tg.Replies = &rl
					}
				}
				s.Targets = append(s.Targets, tg)
			}
		}
		out = append(out, s)
	}
	return out
}

// Target is one target's status: its balancer state t, its last
// explanation e (nil before the first sample) and the fractions of its
// service's action levels fr (action → target → percent), as
// applyFractions gave them to the balancer.
func Target(t balancer.TargetStatus, e *policy.Explanation, fr map[string]map[string]int) api.Target {
	out := api.Target{
		Name: t.Name, Addr: t.Addr.String(), Role: t.Role.String(),
		Weight: t.Weight, Effective: t.Effective, Exact: t.Exact, SlowStart: t.SlowStart,
		Open: t.Open, Max: t.Max, Down: t.Down, DownUntil: t.DownUntil, HealthUp: t.HealthUp,
		SkippedAtLimit: t.SkippedAtLimit, Picked: t.Picked, Failed: t.Failed,
		Ejected: t.Ejected, EjectedUntil: t.EjectedUntil, Ejections: t.Ejections,
	}
	if c := t.Check; c != nil {
		out.Check = &api.HealthCheck{At: c.At, OK: c.OK, Reason: c.Reason, Streak: c.Streak, Need: c.Need}
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
			Responses:     e.Responses, ServerErrors: e.ServerErrors, FailedRequests: e.FailedRequests,
			ErrorRatio: e.ErrorRatio, ErrorFraction: e.ErrorFraction, ErrorHeld: e.ErrorHeld,
			MinResponses: e.MinResponses, PendingResponses: e.PendingResponses,
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

func datapathDoc(s datapath.EngineStats, f datapath.FlowTableStats) api.Datapath {
	out := api.Datapath{EgressMalformed: s.EgressMalformed, Fragments: s.Fragments, Marked: s.Marked, Uncached: s.Uncached}
	for i, n := range s.Dropped {
		if r := datapath.DropReason(i); r != datapath.DropNone {
			out.Dropped = append(out.Dropped, api.Drop{Reason: r.String(), Count: n})
		}
	}
	out.Flows = api.FlowTable{Live: f.Flows, Inserted: f.Inserted, Replaced: f.Replaced, Expired: f.Expired, Refused: f.Refused,
		HalfOpen: f.HalfOpen, Evicted: f.Evicted}
	return out
}

func stackDoc(s netstack.StackStats) api.Stack {
	return api.Stack{
		TCPSegmentsSent: s.TCPSegmentsSent, TCPRetransmits: s.TCPRetransmits, TCPTimeouts: s.TCPTimeouts,
		TCPResetsSent: s.TCPResetsSent, SYNsDroppedInFlight: s.TCPForwardDropFull, UDPNoSocket: s.UDPUnknownPort,
		ICMPUnreachablesSent: s.ICMPUnreachablesSent, IPMalformed: s.IPMalformed,
		TCPChecksumErrors: s.TCPChecksumErrors, IPFragmentsRefused: s.IPFragmentsRefused,
	}
}

// forwarderDoc is the forwarder section: the accept path's counters (s),
// the proxy's (p) and the http proxy's (h) in one, as before they were
// three packages; Panics and Pending are the sums of the first two.
func forwarderDoc(s netstack.ForwarderStats, p proxy.Stats, h proxyhttp.Stats) api.Forwarder {
	ld := s.ListenDropped
	sni := make([]api.Drop, len(p.SNIRefused))
	for i, n := range p.SNIRefused {
		sni[i] = api.Drop{Reason: proxy.SNIRefusalNames[i], Count: n}
	}
	pp := make([]api.Drop, len(p.ProxyRefused))
	for i, n := range p.ProxyRefused {
		pp[i] = api.Drop{Reason: proxy.ProxyReasons[i], Count: n}
	}
	return api.Forwarder{
		SNIRouted: p.SNIRouted, SNIRefused: sni, ProxyRefused: pp,
		ListenDropped: []api.Drop{{Reason: "segment_queue", Count: ld.SegmentQueue},
			{Reason: "accept_queue", Count: ld.AcceptQueue}, {Reason: "failed", Count: ld.Failed}},
		Accepted: p.Accepted, Pending: s.Handshaking + p.Pending, NoService: s.NoService, RefusedClosed: s.RefusedClosed,
		HandshakeTimedOut: s.HandshakeTimedOut, HandshakeFailed: s.HandshakeFailed,
		IdleClosed: p.IdleClosed, TimeWaitReopened: s.TimeWaitReopened, CookieReplays: s.CookieReplays, Aborted: p.Aborted, NoSession: p.NoSession,
		SYNCookiesSent: s.SYNCookiesSent, SYNCookiesValid: s.SYNCookiesValid, SYNCookiesInvalid: s.SYNCookiesInvalid,
		Listeners: s.Listeners, TargetTimedOut: p.TargetTimedOut, Panics: s.Panics + p.Panics,
		HTTPRequests: h.Requests, HTTPRefused: h.Refused, HTTPHeaderTimeout: h.HeaderTimeout,
		HTTPHeaderTooBig: h.HeaderTooBig, HTTPBadRequest: h.BadRequest, HTTPRetried: h.Retried,
		HTTPBadGateway: h.BadGateway, HTTPBodyTimeout: h.BodyTimeout, HTTPUndelivered: h.Undelivered, HTTPClients: h.Clients, TargetConns: h.TargetConns, TargetConnsIdle: h.TargetConnsIdle,
	}
}

func nicDoc(n NICStats) api.NIC {
	s := n.Link
	out := api.NIC{
		Name: n.Name, RxPackets: s.RxPackets, RxBytes: s.RxBytes, TxPackets: s.TxPackets, TxBytes: s.TxBytes,
		RxCoalesced: s.RxCoalesced,
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

// Leg is one leg of a connection (client or target side) as
// /connections lists it.
func Leg(l proxy.LegStats) api.Leg {
	return api.Leg{
		SegmentsSent: l.SegmentsSent, SegmentsReceived: l.SegmentsReceived, Retransmits: l.Retransmits,
		FastRetransmits: l.FastRetransmits, Timeouts: l.Timeouts, TimeoutsKnown: l.TimeoutsKnown,
		RTT: l.RTT, RTTVar: l.RTTVar, BytesSent: l.BytesSent, BytesReceived: l.BytesReceived,
	}
}

// Cluster is the cluster section of the status document.
func Cluster(c cluster.Status) *api.Cluster {
	out := &api.Cluster{Name: c.Name, Instance: c.Instance, Redis: c.Redis, Reachable: c.Reachable, Mode: c.Mode,
		LastError: c.LastError, Outages: c.Outages, Renewals: c.Renewals,
		Members: []api.ClusterMember{}, Levels: []api.ClusterLevel{}, Bandwidth: []api.ClusterBandwidth{},
		BandwidthRounds: c.BandwidthRounds, BandwidthFallbacks: c.BandwidthFallbacks,
		SampleRounds: c.SampleRounds, SampleFallbacks: c.SampleFallbacks, SampleMembers: c.SampleMembers, SampleError: c.SampleError,
		Clients: api.ClusterClients{Admitted: c.Clients.Admitted, Refused: c.Clients.Refused, Fallbacks: c.Clients.Fallbacks,
			Errors: c.Clients.Errors, Writes: c.Clients.Writes, Pending: c.Clients.Pending}}
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
