package appliance

import (
	"errors"
	"time"

	"weir/balancer"
	"weir/cmd/weir/api"
	"weir/cmd/weir/internal/status"
	"weir/datapath"
	udprelay "weir/netstack/proxy/udp"
	"weir/policy"
)

// Status returns the appliance's state now: the document /status serves,
// `weir status` prints and the metrics collector exports.
func (a *Appliance) Status() api.Status {
	cfg := a.cfg.Load()
	now := a.now()
	st := api.Status{
		Instance:     cfg.Instance.Name,
		Source:       a.opts.Source,
		Draining:     a.admit.Draining(),
		Open:         a.OpenConnections(),
		Closed:       a.admit.Closed(),
		DialFailures: a.admit.DialFailures(),
		Refusals:     a.admit.Refusals(),
	}
	a.reloads.Fill(&st)
	devs := make([]datapath.Device, len(a.nics))
	for i, n := range a.nics {
		devs[i] = n.dev
	}
	status.Parts(&st, a.RawStats(), devs)
	if a.opts.LogDrops != nil {
		st.Control.DroppedLogLines = a.opts.LogDrops()
	}
	st.Levels = status.Levels(a.adm.Snapshot())
	st.Clients = status.Clients(a.adm.Clients())
	if a.clu != nil {
		st.Cluster = status.Cluster(a.clu.Status())
	}
	a.explMu.Lock()
	expl := a.expl
	st.SampledAt = a.explAt
	actionFr := a.actionFr
	a.explMu.Unlock()
	st.Services = status.Services(cfg, status.Sampled{Explanations: expl, ActionFractions: actionFr, Segments: a.segs.Of, Replies: a.replyLatency},
		func(service string) (balancer.Status, bool) {
			if b := a.balancer(service); b != nil {
				return b.Snapshot(now), true
			}
			return balancer.Status{}, false
		}, a.admit.Clients)
	st.HTTP.Requests, st.HTTP.InFlight, st.HTTP.Durations = a.admit.Requests()
	st.HostCapture = a.host.Status(cfg)
	return st
}

// Connections lists open connections with both legs' statistics, for
// /connections.
func (a *Appliance) Connections() []api.Connection {
	cs := a.px.Conns()
	out := make([]api.Connection, len(cs))
	for i, c := range cs {
		out[i] = api.Connection{
			ID: c.ID, Client: c.Client.String(), VIP: c.VIP.String(), Service: c.Service, Target: c.Target,
			Action: c.Action, Start: c.Start, ClientLeg: status.Leg(c.ClientLeg), TargetLeg: status.Leg(c.TargetLeg),
			Throughput: c.Throughput,
		}
	}
	return out
}

// Healthy is nil while the appliance serves, an error while it drains.
func (a *Appliance) Healthy() error {
	if a.admit.Draining() {
		return errors.New("draining")
	}
	return nil
}

// SegmentsOf returns a target's segment totals, false before its first
// sample.
func (a *Appliance) SegmentsOf(k policy.TargetKey) (api.Segments, bool) { return a.segs.Of(k) }

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

// replyLatency is a udp target's reply latency for /status, false before
// its first request/response session.
func (a *Appliance) replyLatency(k policy.TargetKey) (api.ReplyLatency, bool) {
	l, ok := a.relay.ReplyLatency(udprelay.TargetKey{Service: k.Service, Target: k.Target})
	if !ok {
		return api.ReplyLatency{}, false
	}
	sum := func(s udprelay.LatencySummary) api.LatencySummary {
		return api.LatencySummary{Replies: s.Replies, P50: ms(s.P50), P99: ms(s.P99)}
	}
	return api.ReplyLatency{Interval: sum(l.Interval), Total: sum(l.Total)}, true
}

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
