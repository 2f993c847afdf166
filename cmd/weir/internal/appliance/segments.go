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
