package main

import (
	"io"

	"weir/policy"
)

// writeMeasurement prints, per target and direction, where the monitor's
// counts will come from, the direction the monitor reads, and once per
// source what it is and why: what `weir check` says about measurement
// (/status says the same of a running weir: segments.*.source and why,
// segments.direction_why).
func writeMeasurement(w io.Writer, cfg *policy.Config) error {
	s := &summary{w: w}
	m := &cfg.Monitor
	n := 0
	for _, vs := range cfg.Services {
		n += len(vs.Targets)
	}
	if !m.Enabled || n == 0 {
		return nil
	}
	s.printf("measurement (monitor.direction %s, monitor.hostCapture %s):", m.Direction, onOff(!m.HostCaptureOff))
	used := map[string]bool{}
	var order []string
	for _, vs := range cfg.Services {
		for _, t := range vs.Targets {
			from, to := targetSources(m, t)
			for _, k := range []string{from, to} {
				if !used[k] {
					used[k] = true
					order = append(order, k)
				}
			}
			s.printf("  %s/%s via %s: from_target %s, to_target %s; the monitor reads %s", vs.Name, t.Name, t.Via, from, to, readsText(m, t))
		}
	}
	for _, k := range order {
		s.printf("  %s: %s", k, sourceNotes[k])
	}
	return s.err
}

// The sources a target's direction may have, by configuration.
const (
	srcBackArm = "measured (back arm)"
	srcCapture = "measured (host capture)"
	srcKernel  = "measured (kernel)"
	srcEstim   = "estimate"
)

var sourceNotes = map[string]string{
	srcBackArm: "the datapath's passive count of the back arm's segments, both directions",
	srcCapture: "the host capture's count of the kernel socket's segments (AF_PACKET, the datapath's sequence tracker), both directions; " +
		"weir needs CAP_NET_RAW at start, else from_target is an estimate and to_target the kernel's count; " +
		"an interval in which the capture lost packets is partial, and the monitor reads the other direction",
	srcKernel: "the kernel sender's own count of the socket (TCP_INFO data_segs_out, total_retrans)",
	srcEstim: "TCP_INFO's receive counters (data segments, out of order) with no retransmission count (monitor.hostCapture: off); " +
		"the monitor gives way to the other direction",
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

// targetSources says how each direction of t's legs is measured.
func targetSources(m *policy.Monitor, t *policy.Target) (from, to string) {
	switch {
	case t.Via == policy.DialNetstack:
		return srcBackArm, srcBackArm
	case m.HostCaptureOff:
		return srcEstim, srcKernel
	}
	return srcCapture, srcCapture
}

// readsText says which direction the monitor reads for t.
func readsText(m *policy.Monitor, t *policy.Target) string {
	switch m.Direction {
	case policy.DirectionBoth:
		return "the one with the larger loss ratio"
	case policy.FromTarget:
		if t.Via == policy.DialHost && m.HostCaptureOff {
			return "to_target (from_target is an estimate)"
		}
		return "from_target"
	}
	return "to_target"
}
