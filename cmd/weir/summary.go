package main

import (
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	"weir/policy"
)

// summary writes lines and keeps the first write error.
type summary struct {
	w   io.Writer
	err error
}

func (s *summary) printf(format string, args ...any) {
	if s.err == nil {
		_, s.err = fmt.Fprintf(s.w, format+"\n", args...)
	}
}

// writeSummary prints a short human description of a compiled config: the
// instance and its limits, classes, services with their targets, rules and
// their actions in priority order, the monitor thresholds as percentages and
// the balancer settings.
func writeSummary(w io.Writer, c *policy.Config) error {
	s := &summary{w: w}
	in := c.Instance
	s.printf("instance %s: %s", in.Name, limitsText(in.Limits))
	if t := clientLimitsText(in.ClientLimits); t != "" {
		s.printf("  %s", t)
	}
	s.printf("  bandwidth averaged over %v, recomputed every %v", in.MetricInterval, in.RecomputeInterval)
	s.printf("  timeouts: %s", timeoutsText(in.Timeouts))

	if len(c.Classes) > 0 {
		s.printf("classes:")
		for _, cl := range c.Classes {
			parent := "instance"
			if cl.Parent != nil {
				parent = "class " + cl.Parent.Name
			}
			s.printf("  %s (under %s): %s", cl.Name, parent, limitsText(cl.Limits))
		}
	}

	if len(c.Services) == 0 {
		s.printf("services: none")
	} else {
		s.printf("services:")
	}
	for _, vs := range c.Services {
		class := "instance"
		if vs.Class != nil {
			class = "class " + vs.Class.Name
		}
		s.printf("  %s: %s %s, port %v, under %s", vs.Name, vs.Proto, addrsText(vs.VIPs), vs.Ports, class)
		s.printf("    limits: %s", limitsText(vs.Limits))
		if t := clientLimitsText(vs.ClientLimits); t != "" {
			s.printf("    %s", t)
		}
		if vs.Timeouts != in.Timeouts {
			s.printf("    timeouts: %s", timeoutsText(vs.Timeouts))
		}
		if vs.AcceptProxy != policy.ProxyNone {
			s.printf("    accepts a PROXY-protocol header (%v) from %v, within the handshake timeout; others refused", vs.AcceptProxy, vs.TrustedProxies)
		}
		for _, t := range vs.Targets {
			maxc := "no connection limit"
			if t.MaxConnections > 0 {
				maxc = fmt.Sprintf("maxConnections %d", t.MaxConnections)
			}
			addr := t.Addr.String()
			if t.KeepsPort() {
				addr = t.Addr.Addr().String()
			}
			name := t.Name + " " + addr
			if t.Name == addr {
				name = t.Name
			}
			s.printf("    target %s: weight %d, %s, %s, via %s", name, t.Weight, maxc, t.Role, t.Via)
			if t.ProxyProtocol != policy.ProxyNone {
				s.printf("      sends a PROXY-protocol %v header first on each connection (health checks: the address-less one)", t.ProxyProtocol)
			}
			if t.KeepsPort() {
				s.printf("      keeps the client's port: a connection to port p of %v goes to %s port p (health checks: port %d)",
					vs.Ports, addr, vs.Ports.Lo)
			}
		}
	}

	if len(c.Rules) == 0 {
		s.printf("rules: none")
	} else {
		s.printf("rules (first match wins):")
	}
	for i, r := range c.Rules {
		s.printf("  %d. %s: %s → %s", i+1, r.Name, ruleText(r), actionText(r.Action))
	}

	m := c.Monitor
	if !m.Enabled {
		s.printf("monitor: off")
	} else {
		s.printf("monitor: on, sampling every %v", m.SamplingInterval)
		s.printf("  loss > %s → %d %%, step, max %d %%", tenths(m.LossThreshold), m.LossStep, m.LossMax)
		s.printf("  timeouts > %s → %d %%, step, max %d %%", tenths(m.TimeoutThreshold), m.TimeoutStep, m.TimeoutMax)
		l := m.MaxConnLevels
		s.printf("  connections at %d / %d / %d %% of an action's maxConnections → 50 / 85 / 100 %%", l[0], l[1], l[2])
	}

	b := c.Balancer
	refresh := "off"
	if b.RefreshInterval > 0 {
		refresh = "every " + b.RefreshInterval.String()
	}
	s.printf("balancer: %v, a failed target rests %v, %d attempts, config refresh %s", b.Algorithm, b.RetryInterval, b.MaxAttempts, refresh)
	if h := b.Health; h.Interval > 0 {
		s.printf("  health checks every %v, timeout %v, up after %d, down after %d", h.Interval, h.Timeout, h.Rise, h.Fall)
	}
	if b.SlowStart > 0 {
		s.printf("  slow start over %v", b.SlowStart)
	}
	return s.err
}

// limitsText describes one level's limits.
func limitsText(l policy.Limits) string {
	if !l.Any() {
		return "no limits"
	}
	var parts []string
	if l.MaxBandwidth > 0 {
		p := fmt.Sprintf("bandwidth %d B/s %s", l.MaxBandwidth, enforced(l.EnforceBandwidth))
		if l.BurstBytes > 0 {
			p += fmt.Sprintf(", burst %d B", l.BurstBytes)
		}
		parts = append(parts, p)
	}
	if l.MaxConnections > 0 {
		p := fmt.Sprintf("connections %d %s", l.MaxConnections, enforced(l.EnforceConnections))
		if l.Queue > 0 {
			to := l.QueueTimeout
			if to == 0 {
				to = policy.DefaultQueueTimeout
			}
			p += fmt.Sprintf(", queue %d for %v", l.Queue, to)
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}

// clientLimitsText is a clientLimits line for weir check, "" for none.
func clientLimitsText(c policy.ClientLimits) string {
	if !c.Any() {
		return ""
	}
	v4, v6 := c.PrefixV4, c.PrefixV6
	if v4 == 0 {
		v4 = 32
	}
	if v6 == 0 {
		v6 = 128
	}
	size := c.TableSize
	if size == 0 {
		size = policy.DefaultClientTableSize
	}
	return fmt.Sprintf("per client (/%d, /%d; %d kept): %s", v4, v6, size, limitsText(c.Limits))
}

func enforced(b bool) string {
	if b {
		return "enforced"
	}
	return "log only"
}

func addrsText(as []netip.Addr) string {
	ss := make([]string, len(as))
	for i, a := range as {
		ss[i] = a.String()
	}
	return strings.Join(ss, ", ")
}

// tenths prints a ratio in tenths of a percent as a percentage.
func tenths(v int) string { return fmt.Sprintf("%d.%d %%", v/10, v%10) }

func ruleText(r *policy.Rule) string {
	var parts []string
	if !(r.ProtoLo == 0 && r.ProtoHi == 0) {
		if r.ProtoLo == r.ProtoHi {
			parts = append(parts, fmt.Sprintf("protocol %d", r.ProtoLo))
		} else {
			parts = append(parts, fmt.Sprintf("protocol %d-%d", r.ProtoLo, r.ProtoHi))
		}
	}
	if r.Src.IsValid() {
		parts = append(parts, "server "+r.Src.String())
	}
	if !r.SrcPort.Any() {
		parts = append(parts, "server port "+r.SrcPort.String())
	}
	if r.Dst.IsValid() {
		parts = append(parts, "client "+r.Dst.String())
	}
	if !r.DstPort.Any() {
		parts = append(parts, "client port "+r.DstPort.String())
	}
	if r.Service != nil {
		parts = append(parts, "service "+r.Service.Name)
	}
	if len(parts) == 0 {
		return "any flow"
	}
	return strings.Join(parts, ", ")
}

func actionText(a *policy.Action) string {
	var parts []string
	if a.SetTOS {
		parts = append(parts, fmt.Sprintf("ToS 0x%02X (%08b)", a.OutgoingTOS, a.OutgoingTOS))
	}
	if a.MinRate > 0 {
		parts = append(parts, fmt.Sprintf("minRate %d Kbit/s", a.MinRate))
	}
	if a.MeanRate > 0 {
		parts = append(parts, fmt.Sprintf("meanRate %d Kbit/s", a.MeanRate))
	}
	if a.MaxConnections > 0 {
		parts = append(parts, fmt.Sprintf("maxConnections %d", a.MaxConnections))
	}
	if len(parts) == 0 {
		return a.Name
	}
	return a.Name + " (" + strings.Join(parts, ", ") + ")"
}

// timeoutsText prints compiled timeouts the way the config spells them.
func timeoutsText(t policy.Timeouts) string {
	off := func(d time.Duration) string {
		if d < 0 {
			return "off"
		}
		return d.String()
	}
	return fmt.Sprintf("handshake %v, connect %v, firstByte %s, idle %s, requestRead %v, inFlightPerVIP %d",
		t.Handshake, t.Connect, off(t.FirstByte), off(t.Idle), t.RequestRead, t.InFlightPerVIP)
}
