package appliance

import (
	"errors"
	"sort"
	"sync"
	"sync/atomic"

	"weir/cmd/weir/api"
	"weir/cmd/weir/internal/status"
	"weir/datapath"
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
				tg := status.Target(t, byKey[k], actionFr[vs.Name])
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
