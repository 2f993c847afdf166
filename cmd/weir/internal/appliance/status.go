package appliance

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"weir/balancer"
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

func (c *counters) refusalsCopy() map[[2]string]uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[[2]string]uint64, len(c.refusals))
	for k, v := range c.refusals {
		out[k] = v
	}
	return out
}

// Status is the appliance's state as /status serves it and `weir status`
// prints it.
type Status struct {
	Instance     string       `json:"instance"`
	Source       string       `json:"source,omitempty"`
	Generation   int64        `json:"generation"`
	LoadedAt     time.Time    `json:"loaded_at"`
	ReloadError  *reloadError `json:"reload_error,omitempty"`
	Draining     bool         `json:"draining"`
	Open         int          `json:"open_connections"`
	Levels       []Level      `json:"levels"`
	Services     []Service    `json:"services"`
	SampledAt    time.Time    `json:"sampled_at"`
	Refusals     []Refusals   `json:"refusals"`
	Datapath     any          `json:"datapath"`
	Stack        any          `json:"stack"`
	Forwarder    any          `json:"forwarder"`
	DialFailures uint64       `json:"dial_failures"`
}

// Level is one level's limits and statistics (instance, class, virtual
// server).
type Level struct {
	Level              string `json:"level"`
	Name               string `json:"name"`
	Connections        int64  `json:"connections"`
	MaxConnections     int64  `json:"max_connections,omitempty"`
	EnforceConnections bool   `json:"enforce_connections,omitempty"`
	Bandwidth          int64  `json:"bandwidth"`
	MaxBandwidth       int64  `json:"max_bandwidth,omitempty"`
	EnforceBandwidth   bool   `json:"enforce_bandwidth,omitempty"`
	Over               bool   `json:"over,omitempty"`
	Retired            bool   `json:"retired,omitempty"`
}

// Service is one virtual server with its balancer and its targets' weight
// explanations.
type Service struct {
	Name     string               `json:"name"`
	Proto    string               `json:"protocol"`
	VIPs     []string             `json:"vips"`
	Ports    string               `json:"ports"`
	Class    string               `json:"class,omitempty"`
	Refused  uint64               `json:"refused_no_target"`
	Targets  []Target             `json:"targets"`
	Balancer string               `json:"algorithm"`
	Weights  []policy.Explanation `json:"weights,omitempty"`
}

// Target is one target's balancer state with its last weight explanation.
type Target struct {
	balancer.TargetStatus
	Explanation *policy.Explanation `json:"explanation,omitempty"`
}

// Refusals counts refused connections by the level and limit that refused
// them.
type Refusals struct {
	Level string `json:"level"`
	Limit string `json:"limit"`
	Count uint64 `json:"count"`
}

// Status returns the appliance's state now.
func (a *Appliance) Status() any { return a.StatusDoc() }

// StatusDoc is Status with its concrete type.
func (a *Appliance) StatusDoc() Status {
	cfg := a.cfg.Load()
	now := a.now()
	st := Status{
		Instance:     cfg.Instance.Name,
		Source:       a.opts.Source,
		Generation:   a.gen.Load(),
		LoadedAt:     *a.loadedAt.Load(),
		ReloadError:  a.reloadErr.Load(),
		Draining:     a.draining.Load(),
		Open:         a.OpenConnections(),
		Datapath:     a.engine.Stats(),
		Stack:        a.stack.Stats(),
		Forwarder:    a.fwd.Stats(),
		DialFailures: a.counters.dialFailures.Load(),
	}
	for _, l := range a.adm.Snapshot() {
		st.Levels = append(st.Levels, Level{
			Level: l.Level.String(), Name: l.Name, Connections: l.Conns,
			MaxConnections: l.Limits.MaxConnections, EnforceConnections: l.Limits.EnforceConnections,
			Bandwidth: l.Bandwidth, MaxBandwidth: l.Limits.MaxBandwidth, EnforceBandwidth: l.Limits.EnforceBandwidth,
			Over: l.OverConns || l.OverBandwidth || l.OverBurst, Retired: l.Retired,
		})
	}
	a.explMu.Lock()
	expl := a.expl
	st.SampledAt = a.explAt
	a.explMu.Unlock()
	byKey := map[policy.TargetKey]*policy.Explanation{}
	for i := range expl {
		byKey[policy.TargetKey{Service: expl[i].Service, Target: expl[i].Target}] = &expl[i]
	}
	for _, vs := range cfg.Services {
		s := Service{Name: vs.Name, Proto: vs.Proto.String(), Ports: vs.Ports.String(), Balancer: cfg.Balancer.Algorithm.String()}
		if vs.Class != nil {
			s.Class = vs.Class.Name
		}
		for _, v := range vs.VIPs {
			s.VIPs = append(s.VIPs, v.String())
		}
		if b := a.balancer(vs.Name); b != nil {
			bs := b.Snapshot(now)
			s.Refused = bs.Refused
			for _, t := range bs.Targets {
				s.Targets = append(s.Targets, Target{TargetStatus: t, Explanation: byKey[policy.TargetKey{Service: vs.Name, Target: t.Name}]})
			}
		}
		st.Services = append(st.Services, s)
	}
	for k, v := range a.counters.refusalsCopy() {
		st.Refusals = append(st.Refusals, Refusals{Level: k[0], Limit: k[1], Count: v})
	}
	return st
}

// Connections lists open connections with both legs' statistics.
func (a *Appliance) Connections() any { return a.fwd.Conns() }

// ConnStats is Connections with its concrete type.
func (a *Appliance) ConnStats() []netstack.ConnStats { return a.fwd.Conns() }

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
