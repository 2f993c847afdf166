package appliance

import "weir/policy"

// Segments are one target's data segments per direction, totals since
// start over the connections the monitor's scope covers (monitor.scope):
// what /status, `weir status`, the STATS lines and the
// weir_target_*_segments_total metrics show. They grow once per sampling
// interval.
type Segments struct {
	FromTarget DirTotals `json:"from_target"` // the target's segments toward weir
	ToTarget   DirTotals `json:"to_target"`   // weir's segments toward the target
	// Direction is the one the last interval's loss and timeout ratios
	// read: from_target or to_target (monitor.direction; an unmeasured
	// direction gives way to the other).
	Direction string `json:"direction"`
}

// DirTotals are one direction's totals.
type DirTotals struct {
	DataSegments  uint64 `json:"data_segments"`
	Retransmitted uint64 `json:"retransmitted"`
	Timeouts      uint64 `json:"timeouts"`
	OutOfOrder    uint64 `json:"out_of_order"`
	// Source says how they were measured: "measured" (the datapath's
	// passive count on a via: netstack leg, or the kernel's own sender
	// count on a via: host leg's to_target), "estimate" (a via: host leg's
	// from_target: the kernel's receive-side TCP_INFO counters give data
	// segments and out-of-order arrivals but no retransmission count, so
	// retransmitted and timeouts read 0 and mean unknown) or "none".
	Source string `json:"source"`
}

func (d *DirTotals) add(s policy.DirSample) {
	d.DataSegments += s.DataSegments
	d.Retransmitted += s.Retransmitted
	d.Timeouts += s.Timeouts
	d.OutOfOrder += s.OutOfOrder
	switch {
	case s.Estimate:
		d.Source = "estimate"
	case s.Measured:
		d.Source = "measured"
	case d.Source == "":
		d.Source = "none"
	}
}

// LossTenths is the loss ratio of the totals in tenths of a percent.
func (d DirTotals) LossTenths() int { return policy.RatioTenths(d.Retransmitted, d.DataSegments) }

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
		s.FromTarget.add(ts.FromTarget)
		s.ToTarget.add(ts.ToTarget)
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
