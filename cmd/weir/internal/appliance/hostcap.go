package appliance

import (
	"fmt"
	"net/netip"
	"sync"

	"weir/cmd/weir/api"
	"weir/datapath/hostcap"
	"weir/policy"
)

// The host-leg capture
//
// weir run opens a datapath/hostcap capture (Options.HostCapture) before it
// drops its privileges, unless monitor.hostCapture is off; the appliance
// points its filter at the via: host targets of every configuration it runs
// (New, Reload) and the forwarder reads the host legs' segments from it
// (netstack.LegMeter.HostSegments). A sampling interval in which the capture
// lost packets (its socket buffer overran) marks the directions it counted
// partial (samplesFrom).

// hostState is the capture's side of the appliance.
type hostState struct {
	cap *hostcap.Capture // nil: off or not opened
	why string           // why cap is nil ("" while on)

	mu       sync.Mutex
	dropped  uint64 // capture drops at the last sample
	lastLost uint64 // drops during the last interval
	setErr   error  // the last SetTargets failure
}

// hostTargets are the addresses and ports of cfg's via: host targets.
func hostTargets(cfg *policy.Config) []netip.AddrPort {
	var out []netip.AddrPort
	for _, vs := range cfg.Services {
		for _, t := range vs.Targets {
			if t.Via == policy.DialHost && t.Addr.Port() != 0 {
				out = append(out, t.Addr)
			}
		}
	}
	return out
}

// setHostTargets points the capture at cfg's host targets; with
// monitor.hostCapture off it captures nothing.
func (a *Appliance) setHostTargets(cfg *policy.Config) {
	h := &a.host
	if h.cap == nil {
		return
	}
	var targets []netip.AddrPort
	if !cfg.Monitor.HostCaptureOff {
		targets = hostTargets(cfg)
	}
	err := h.cap.SetTargets(targets)
	h.mu.Lock()
	h.setErr = err
	h.mu.Unlock()
	if err != nil {
		a.log.Error().Err(err).Msg("host capture: the filter on the via: host targets could not be set; their from_target is an estimate")
	}
}

// captureLost reads the capture's drops and reports whether it lost
// packets since the last call (one sampling interval).
func (a *Appliance) captureLost() bool {
	h := &a.host
	if h.cap == nil {
		return false
	}
	st := h.cap.Stats()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastLost = st.Dropped - min(h.dropped, st.Dropped)
	h.dropped = st.Dropped
	if h.lastLost > 0 {
		a.log.Warn().Uint64("dropped", h.lastLost).Msg("host capture lost packets in the last interval (its socket buffer overran): the via: host legs' counts are partial")
	}
	return h.lastLost > 0
}

// hostCaptureStatus is the capture's part of /status.
func (a *Appliance) hostCaptureStatus(cfg *policy.Config) *api.HostCapture {
	h := &a.host
	out := &api.HostCapture{Targets: len(hostTargets(cfg))}
	switch {
	case h.cap == nil:
		out.State, out.Reason = "off", h.why
		return out
	case cfg.Monitor.HostCaptureOff:
		out.State, out.Reason = "off", "monitor.hostCapture: off"
	default:
		out.State = "on"
	}
	st := h.cap.Stats()
	out.Packets, out.Dropped, out.Malformed, out.Refused, out.Flows = st.Packets, st.Dropped, st.Malformed, st.Refused, st.Flows
	h.mu.Lock()
	out.DroppedLastInterval = h.lastLost
	setErr := h.setErr
	h.mu.Unlock()
	if err := h.cap.Err(); err != nil {
		out.State, out.Reason = "failed", err.Error()
	} else if setErr != nil {
		out.State, out.Reason = "failed", setErr.Error()
	}
	return out
}

// sourceWhy says where a target's direction's counts come from, and why.
func (a *Appliance) sourceWhy(cfg *policy.Config, t *policy.Target, d *DirTotals) string {
	if t.Via == policy.DialNetstack {
		if d.Source == "none" {
			return "no connection the monitor covers had data in this direction yet"
		}
		return "the datapath's passive count of the back arm's segments (via: netstack)"
	}
	hs := a.hostCaptureStatus(cfg)
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
