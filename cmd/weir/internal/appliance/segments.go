package appliance

import (
	"weir/cmd/weir/api"
	"weir/policy"
)

// Segments and DirTotals are the per-direction totals of a target (see
// api.Segments); the appliance adds each interval's samples to them.
type (
	Segments  = api.Segments
	DirTotals = api.DirTotals
)

func addDirTotals(d *DirTotals, s policy.DirSample) {
	d.DataSegments += s.DataSegments
	d.Retransmitted += s.Retransmitted
	d.Timeouts += s.Timeouts
	d.OutOfOrder += s.OutOfOrder
	// The signal of the last interval that measured any packet: a quiet
	// one keeps it.
	if s.Measured && (s.DataSegments > 0 || s.IPIDPackets > 0) {
		d.Signal = "sequence"
		if s.IPIDPackets > 0 {
			d.Signal = "sequence+ip_id"
		}
	}
	switch {
	case s.Partial:
		d.Source = "partial"
	case s.Estimate:
		d.Source = "estimate"
	case s.Measured:
		d.Source = "measured"
	case d.Source == "":
		d.Source = "none"
	}
}

// addSegments adds one interval's samples to the totals. Call with explMu
// held.
func (a *Appliance) addSegments(m *policy.Monitor, samples map[policy.TargetKey]*policy.TargetSample) {
	if a.segs == nil {
		a.segs = map[policy.TargetKey]*Segments{}
	}
	cfg := a.cfg.Load()
	targets := map[policy.TargetKey]*policy.Target{}
	for _, vs := range cfg.Services {
		for _, t := range vs.Targets {
			targets[policy.TargetKey{Service: vs.Name, Target: t.Name}] = t
		}
	}
	for k, ts := range samples {
		s := a.segs[k]
		if s == nil {
			s = &Segments{}
			a.segs[k] = s
		}
		addDirTotals(&s.FromTarget, ts.FromTarget)
		addDirTotals(&s.ToTarget, ts.ToTarget)
		s.Direction = "from_target"
		if policy.SelectDirection(m, ts) == policy.ToTarget {
			s.Direction = "to_target"
		}
		s.DirectionWhy = directionWhy(m, ts, s.Direction)
		if t := targets[k]; t != nil {
			s.FromTarget.Why = a.sourceWhy(cfg, t, &s.FromTarget)
			s.ToTarget.Why = a.sourceWhy(cfg, t, &s.ToTarget)
		}
	}
}

// SegmentsOf returns a copy of a target's totals.
func (a *Appliance) SegmentsOf(k policy.TargetKey) (Segments, bool) {
	a.explMu.Lock()
	defer a.explMu.Unlock()
	if s := a.segs[k]; s != nil {
		return *s, true
	}
	return Segments{}, false
}

// directionWhy says why the monitor read dir (from_target or to_target).
func directionWhy(m *policy.Monitor, ts *policy.TargetSample, dir string) string {
	why := "monitor.direction: " + m.Direction.String()
	switch {
	case m.Direction == policy.DirectionBoth:
		return why + " (the direction with the larger loss ratio)"
	case m.Direction == policy.FromTarget && dir == "to_target":
		return why + "; from_target was not measured in the last interval (" + unmeasured(&ts.FromTarget) + "), so the monitor read to_target"
	case m.Direction == policy.ToTarget && dir == "from_target":
		return why + "; to_target was not measured in the last interval (" + unmeasured(&ts.ToTarget) + "), so the monitor read from_target"
	}
	return why
}

func unmeasured(d *policy.DirSample) string {
	switch {
	case d.Partial:
		return "partial: the host capture lost packets"
	case d.Estimate:
		return "an estimate"
	}
	return "no data"
}
