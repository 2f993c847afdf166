package netstack

import (
	"net"
	"net/netip"

	"weir/netstack/proxy"
)

// Per-direction measurement of a target leg
//
//	target leg ─┬─ gVisor back arm (*Conn) ─► LegMeter.Segments: the
//	            │    datapath's passive counts of the flow (datapath.SegStats),
//	            │    both directions, exact by the segments on the wire; the
//	            │    to_target timeouts from the gVisor endpoint (exact);
//	            │    from_target adds the IP-ID losses (SegCounters.Loss)
//	            └─ host socket (*HostConn) ─┬─ capture on and the flow seen
//	                 │  (LegMeter.HostSegments: datapath/hostcap's
//	                 │  SegStats): both directions counted from the segments
//	                 │  like a back-arm leg, from_target with the IP-ID
//	                 │  losses; the to_target timeouts from TCP_INFO
//	                 │  (total_rto, exact)
//	                 └─ else TCP_INFO: to_target exact from the kernel
//	                    sender (data_segs_out, total_retrans, total_rto);
//	                    from_target only an estimate: the kernel gives
//	                    data_segs_in and rcv_ooopack per socket, but no
//	                    count of the retransmissions it received
//
// Every count is of data segments (a payload), never of pure ACKs, so a
// download's ACK stream does not dilute weir's own loss ratio.

// LegMeter measures weir's target legs per direction: a proxy.LegMeter
// (proxy.Options.Meter) for the legs of HostDialer and StackDialer. The
// zero value measures host sockets by TCP_INFO alone and back-arm legs not
// at all.
type LegMeter struct {
	// Segments gives the datapath's passive measurement of a gVisor target
	// leg; nil means those legs have no per-direction counts
	// (proxy.DirNone).
	Segments proxy.SegmentsFunc
	// HostSegments gives the host-leg capture's passive measurement of a
	// host socket target leg (local: the socket's address, remote: the
	// target); nil, or a nil result, means TCP_INFO alone.
	HostSegments proxy.SegmentsFunc
	// HostSync, when set, is called before a host socket leg's final
	// reading and before a pooled one goes back to the pool: it waits
	// (briefly; at once when the capture is idle) until the capture
	// behind HostSegments has caught up with the traffic.
	HostSync func()
	// HostRelease, when set, is called after a host socket leg's final
	// reading with its addresses: the capture may drop the flow.
	HostRelease func(local, remote netip.AddrPort)
}

var _ proxy.LegMeter = (*LegMeter)(nil)

// Directions implements proxy.LegMeter: the leg's per-direction totals now,
// from the target and to it. tg are the leg's counters read at the same
// time; addrs caches the leg's local and remote addresses.
func (m *LegMeter) Directions(target proxy.Leg, tg proxy.LegCounters, addrs *[2]netip.AddrPort) (from, to proxy.DirCounters) {
	switch leg := target.(type) {
	case *HostConn:
		if m.HostSegments != nil {
			if !addrs[0].IsValid() {
				addrs[0] = addrPortOf(leg.LocalAddr())
				addrs[1] = addrPortOf(leg.RemoteAddr())
			}
			if s := m.HostSegments(addrs[0], addrs[1]); s != nil {
				fr, tt := s.FromTarget(), s.ToTarget()
				data, lost := fr.Loss() // as a back-arm leg's: sequence and IP ID
				from = proxy.DirCounters{DataSegments: data, Retransmitted: lost, Timeouts: fr.Timeouts, OutOfOrder: fr.OutOfOrder,
					IPIDPackets: fr.IPIDPackets, Source: proxy.DirCapture}
				to = proxy.DirCounters{DataSegments: tt.DataSegments, Retransmitted: tt.Retransmitted, Timeouts: tg.Timeouts, OutOfOrder: tt.OutOfOrder, Source: proxy.DirCapture}
				return from, to
			}
		}
		from = proxy.DirCounters{DataSegments: tg.DataSegmentsIn, OutOfOrder: tg.OutOfOrderIn, Source: proxy.DirEstimate}
		to = proxy.DirCounters{DataSegments: tg.DataSegmentsOut, Retransmitted: tg.Retransmits, Timeouts: tg.Timeouts, Source: proxy.DirKernel}
	case *Conn:
		if m.Segments == nil {
			return
		}
		if !addrs[0].IsValid() {
			addrs[0] = addrPortOf(leg.LocalAddr())
			addrs[1] = addrPortOf(leg.RemoteAddr())
		}
		s := m.Segments(addrs[0], addrs[1])
		if s == nil {
			return
		}
		fr, tt := s.FromTarget(), s.ToTarget()
		// The target's direction combines the sequence rule with the
		// IP-ID signal, each loss once (SegCounters.Loss).
		data, lost := fr.Loss()
		from = proxy.DirCounters{DataSegments: data, Retransmitted: lost, Timeouts: fr.Timeouts, OutOfOrder: fr.OutOfOrder,
			IPIDPackets: fr.IPIDPackets, Source: proxy.DirPassive}
		// weir's own timeouts are the gVisor endpoint's, exact; the
		// passive heuristic is for a sender weir cannot ask.
		to = proxy.DirCounters{DataSegments: tt.DataSegments, Retransmitted: tt.Retransmitted, Timeouts: tg.Timeouts, OutOfOrder: tt.OutOfOrder, Source: proxy.DirPassive}
	}
	return from, to
}

// Unacked implements proxy.LegMeter: for a host socket the kernel's own
// figure (TCP_INFO, in tg), for a back-arm leg the datapath's (the bytes
// weir's stack sent past the target's highest acknowledgement: gVisor
// does not say how much of its send queue is acknowledged). 0 when the
// back-arm flow is not measured.
func (m *LegMeter) Unacked(target proxy.Leg, tg proxy.LegCounters, addrs *[2]netip.AddrPort) uint64 {
	leg, ok := target.(*Conn)
	if !ok {
		return tg.Unacked
	}
	if m.Segments == nil {
		return 0
	}
	if !addrs[0].IsValid() {
		addrs[0] = addrPortOf(leg.LocalAddr())
		addrs[1] = addrPortOf(leg.RemoteAddr())
	}
	if s := m.Segments(addrs[0], addrs[1]); s != nil {
		return uint64(s.Unacked())
	}
	return 0
}

func addrPortOf(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}

// Release implements proxy.LegMeter: a host socket leg's flow leaves the
// capture once its final reading has taken it (HostRelease).
func (m *LegMeter) Release(target proxy.Leg, addrs *[2]netip.AddrPort) {
	if _, ok := target.(*HostConn); ok && m.HostRelease != nil && addrs[0].IsValid() {
		m.HostRelease(addrs[0], addrs[1])
	}
}

// Sync implements proxy.LegMeter: the host capture catches up before a
// host socket leg's final reading or a pooled one's park (HostSync).
func (m *LegMeter) Sync(target proxy.Leg) {
	if _, ok := target.(*HostConn); ok && m.HostSync != nil {
		m.HostSync()
	}
}
