package balancer

import (
	"net/netip"
	"time"

	"weir/policy"
)

// Status is a balancer's state at one moment, for the admin API and metrics.
type Status struct {
	Service   string
	Algorithm policy.Algorithm
	// Refused counts picks that returned a *NoTargetError since New.
	Refused uint64
	// Targets lists primaries in configured order, then backups.
	Targets []TargetStatus
}

// TargetStatus is one target's state at one moment.
type TargetStatus struct {
	Name   string
	Addr   netip.AddrPort
	Role   policy.Role
	Weight int // WLM weight from the configuration
	// Effective is the default level's weight after the QoS fraction, in
	// whole weights (rounded down, at least 1 while positive); Exact is the
	// weight balanced on, unrounded (weight 1 at 25 % is 0.75).
	Effective int
	Exact     float64
	// Levels holds, per policy action with weights of its own
	// (SetFractions), the target's unrounded weight for that action's new
	// connections. nil when no action has its own weights.
	Levels map[string]float64
	// SlowStart is the slow-start factor in (0, 1]: 1 at full weight.
	SlowStart float64
	Open      int64 // open connections through this balancer
	Max       int64 // MaxConnections; ≤ 0: no limit
	// Capacity is this instance's share of a cluster-wide Max
	// (SetCapacity), -1 when none is set.
	Capacity int64
	// Down is set while a failed connect keeps the target out, until
	// DownUntil.
	Down      bool
	DownUntil time.Time
	// HealthUp is false while active health checks mark the target down.
	HealthUp bool
	// Check is the last active health check, nil before the first.
	Check *CheckStatus
	// SkippedAtLimit counts picks that passed the target over because it was
	// at MaxConnections (the WebSphere plug-in's "has reached maximum
	// connections and is not selected" warning, as a counter).
	SkippedAtLimit uint64
	// SkippedAtShare counts picks that passed the target over at its share
	// of a cluster-wide MaxConnections (Capacity), below Max: the demand the
	// share did not meet.
	SkippedAtShare uint64
	Picked         uint64 // connections given to the target
	Failed         uint64 // connects reported failed
	// Ejected is set while outlier ejection keeps the target out, until
	// EjectedUntil; Ejections counts its ejections, Consecutive the
	// failures reported in a row now.
	Ejected      bool
	EjectedUntil time.Time
	Ejections    uint64
	Consecutive  int64
}

// Snapshot returns the balancer's state at now. It allocates and is meant for
// the control plane, not the datapath.
func (b *Balancer) Snapshot(now time.Time) Status {
	t := b.tab.Load()
	s := Status{
		Service:   t.vs.Name,
		Algorithm: t.settings.Algorithm,
		Refused:   b.refused.Load(),
		Targets:   make([]TargetStatus, len(t.entries)),
	}
	ns := now.UnixNano()
	for i := range t.entries {
		e := &t.entries[i]
		du := e.st.downUntil.Load()
		ts := TargetStatus{
			Name:           e.t.Name,
			Addr:           e.t.Addr,
			Role:           e.t.Role,
			Weight:         e.base,
			Effective:      displayWeight(e.weight),
			Exact:          float64(e.weight) / 100,
			SlowStart:      float64(e.st.rampPermille(ns, t.slowStart)) / 1000,
			Open:           e.st.open.Load(),
			Max:            e.max,
			Down:           ns < du,
			HealthUp:       !e.st.healthDown.Load(),
			Check:          e.st.lastCheck(),
			Capacity:       capOut(e.st.capacity.Load()),
			SkippedAtLimit: e.st.skippedAtLimit.Load(),
			SkippedAtShare: e.st.skippedAtShare.Load(),
			Picked:         e.st.picked.Load(),
			Failed:         e.st.failed.Load(),
		}
		for name, lt := range t.levels {
			if ts.Levels == nil {
				ts.Levels = make(map[string]float64, len(t.levels))
			}
			ts.Levels[name] = float64(lt.entries[i].weight) / 100
		}
		if ts.Down {
			ts.DownUntil = time.Unix(0, du).In(now.Location())
		}
		if eu := e.st.ejectedUntil.Load(); ns < eu {
			ts.Ejected, ts.EjectedUntil = true, time.Unix(0, eu).In(now.Location())
		}
		ts.Ejections, ts.Consecutive = e.st.ejections.Load(), e.st.consecutive.Load()
		s.Targets[i] = ts
	}
	return s
}

func capOut(c int64) int64 {
	if c == noCapacity {
		return -1
	}
	return c
}
