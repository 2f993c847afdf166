package status

import (
	"fmt"
	"sync"

	"weir/cmd/weir/api"
	"weir/policy"
)

// Totals are every target's per-direction segment totals since the start
// (api.Segments), which the sampling loop adds each interval's samples to,
// with why each direction's count is what it is. Safe for concurrent use;
// the zero value is empty.
type Totals struct {
	mu sync.Mutex
	m  map[policy.TargetKey]*api.Segments
}

func addDirTotals(d *api.DirTotals, s policy.DirSample) {
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

// Add adds one interval's samples of cfg's targets to the totals; host is
// the host capture's status now (HostCapture), for the why of the via: host
// legs' counts.
func (t *Totals) Add(cfg *policy.Config, samples map[policy.TargetKey]*policy.TargetSample, host *api.HostCapture) {
	targets := map[policy.TargetKey]*policy.Target{}
	for _, vs := range cfg.Services {
		for _, tg := range vs.Targets {
			targets[policy.TargetKey{Service: vs.Name, Target: tg.Name}] = tg
		}
	}
	m := &cfg.Monitor
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[policy.TargetKey]*api.Segments{}
	}
	for k, ts := range samples {
		s := t.m[k]
		if s == nil {
			s = &api.Segments{}
			t.m[k] = s
		}
		addDirTotals(&s.FromTarget, ts.FromTarget)
		addDirTotals(&s.ToTarget, ts.ToTarget)
		s.Direction = "from_target"
		if policy.SelectDirection(m, ts) == policy.ToTarget {
			s.Direction = "to_target"
		}
		s.DirectionWhy = directionWhy(m, ts, s.Direction)
		if tg := targets[k]; tg != nil {
			s.FromTarget.Why = sourceWhy(tg, &s.FromTarget, host)
			s.ToTarget.Why = sourceWhy(tg, &s.ToTarget, host)
		}
	}
}

// Of returns a copy of a target's totals, false before its first sample.
func (t *Totals) Of(k policy.TargetKey) (api.Segments, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.m[k]; s != nil {
		return *s, true
	}
	return api.Segments{}, false
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

// sourceWhy says where a target's direction's counts come from, and why.
func sourceWhy(t *policy.Target, d *api.DirTotals, hs *api.HostCapture) string {
	if t.Via == policy.DialNetstack {
		if d.Source == "none" {
			return "no connection the monitor covers had data in this direction yet"
		}
		return "the datapath's passive count of the back arm's segments (via: netstack)"
	}
	switch d.Source {
	case "partial":
		return fmt.Sprintf("the host capture lost %d packets in the last interval (its socket buffer overran): its counts of this via: host leg are incomplete, and the monitor reads the other direction if that is measured", hs.DroppedLastInterval)
	case "measured":
		if hs.State == "on" {
			return "the host capture's count of the via: host leg's segments (AF_PACKET, datapath sequence tracker)"
		}
		return "the kernel sender's own count (TCP_INFO data_segs_out, total_retrans) of the via: host socket"
	case "estimate":
		why := "the host capture is " + hs.State
		if hs.Reason != "" {
			why += ": " + hs.Reason
		}
		if hs.State == "on" {
			why = "the host capture has not seen these connections"
		}
		return "TCP_INFO receive counters only (data_segs_in, rcv_ooopack; no retransmission count): " + why
	}
	return "no connection the monitor covers had data in this direction yet"
}
