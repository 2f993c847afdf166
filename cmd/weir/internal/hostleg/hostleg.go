// Package hostleg is the host-leg capture as the appliance runs it.
//
// weir run opens a datapath/hostcap capture (appliance Options.HostCapture)
// before it drops its privileges, unless monitor.hostCapture is off; the
// appliance points its filter at the via: host targets of every
// configuration it runs (SetTargets, on New and Reload) and the forwarder
// reads the host legs' segments from it (netstack.LegMeter.HostSegments). A
// sampling interval in which the capture lost packets (its socket buffer
// overran) marks the directions it counted partial (Lost).
package hostleg

import (
	"net/netip"
	"sync"

	"weir/cmd/weir/api"
	"weir/datapath/hostcap"
	"weir/policy"
)

// Capture is the capture's side of the appliance. Its methods may be called
// from any goroutine; those of a Capture with no capture (Open found none)
// do nothing.
type Capture struct {
	cap *hostcap.Capture // nil: off or not opened
	why string           // why cap is nil ("" while on)

	mu       sync.Mutex
	dropped  uint64 // capture drops at the last Lost
	lastLost uint64 // drops during the last interval
	setErr   error  // the last SetTargets failure
}

// New wraps c, the capture weir run opened; a nil c comes with why it is
// nil, for /status.
func New(c *hostcap.Capture, why string) *Capture {
	if c == nil && why == "" {
		why = "no capture was opened"
	}
	return &Capture{cap: c, why: why}
}

// Capture returns the capture itself; nil when none was opened.
func (h *Capture) Capture() *hostcap.Capture { return h.cap }

// Targets are the addresses and ports of cfg's via: host targets.
func Targets(cfg *policy.Config) []netip.AddrPort {
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

// SetTargets points the capture at cfg's host targets; with
// monitor.hostCapture off it captures nothing. The error, which Status
// shows until the next SetTargets, means the via: host legs' from_target
// is an estimate.
func (h *Capture) SetTargets(cfg *policy.Config) error {
	if h.cap == nil {
		return nil
	}
	var targets []netip.AddrPort
	if !cfg.Monitor.HostCaptureOff {
		targets = Targets(cfg)
	}
	err := h.cap.SetTargets(targets)
	h.mu.Lock()
	h.setErr = err
	h.mu.Unlock()
	return err
}

// Lost returns the packets the capture lost since the last call (one
// sampling interval).
func (h *Capture) Lost() uint64 {
	if h.cap == nil {
		return 0
	}
	st := h.cap.Stats()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastLost = st.Dropped - min(h.dropped, st.Dropped)
	h.dropped = st.Dropped
	return h.lastLost
}

// Status is the capture's part of /status under cfg.
func (h *Capture) Status(cfg *policy.Config) *api.HostCapture {
	out := &api.HostCapture{Targets: len(Targets(cfg))}
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
	out.Packets, out.Dropped, out.Malformed, out.Refused, out.Forwarded, out.Flows = st.Packets, st.Dropped, st.Malformed, st.Refused, st.Forwarded, st.Flows
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
