package appliance

import (
	"errors"

	"weir/cmd/weir/api"
	"weir/cmd/weir/internal/status"
	"weir/datapath"
	"weir/policy"
)

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
		Reloads:        a.reloads.Load(),
		ReloadFailures: a.reloadFailures.Load(),
		Draining:       a.admit.Draining(),
		Open:           a.OpenConnections(),
		Closed:         a.admit.Closed(),
		DialFailures:   a.admit.DialFailures(),
		Refusals:       a.admit.Refusals(),
	}
	devs := make([]datapath.Device, len(a.nics))
	for i, n := range a.nics {
		devs[i] = n.dev
	}
	status.Parts(&st, a.RawStats(), devs)
	if a.opts.LogDrops != nil {
		st.Control.DroppedLogLines = a.opts.LogDrops()
	}
	st.Levels = status.Levels(a.adm.Snapshot())
	if a.clu != nil {
		st.Cluster = status.Cluster(a.clu.Status())
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
			s.Clients, s.MaxClients = a.admit.Clients(vs.Name), vs.HTTP.MaxClients
		}
		for _, v := range vs.VIPs {
			s.VIPs = append(s.VIPs, v.String())
		}
		if b := a.balancer(vs.Name); b != nil {
			bs := b.Snapshot(now)
			s.Refused = bs.Refused
			for _, t := range bs.Targets {
				k := policy.TargetKey{Service: vs.Name, Target: t.Name}
				tg := status.Target(t, byKey[k], actionFr[vs.Name])
				if sg, ok := a.SegmentsOf(k); ok {
					tg.Segments = &sg
				}
				s.Targets = append(s.Targets, tg)
			}
		}
		st.Services = append(st.Services, s)
	}
	st.HTTP.Requests, st.HTTP.InFlight, st.HTTP.Durations = a.admit.Requests()
	return st
}

// Connections lists open connections with both legs' statistics, for
// /connections.
func (a *Appliance) Connections() []api.Connection {
	cs := a.fwd.Conns()
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
