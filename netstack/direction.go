package netstack

import (
	"net"
	"net/netip"

	"weir/netstack/proxy"
)

// Per-direction measurement of a target leg
//
//	target leg ─┬─ gVisor back arm (*Conn) ─► ForwarderOptions.Segments: the
//	            │    datapath's passive counts of the flow (datapath.SegStats),
//	            │    both directions, exact by the segments on the wire; the
//	            │    to_target timeouts from the gVisor endpoint (exact);
//	            │    from_target adds the IP-ID losses (SegCounters.Loss)
//	            └─ host socket (*HostConn) ─┬─ capture on and the flow seen
//	                 │  (ForwarderOptions.HostSegments: datapath/hostcap's
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

// dirs returns the leg's per-direction totals now: from the target and to
// it. tg are the leg's counters read at the same time.
func (f *Forwarder) dirs(c *connEntry, tg proxy.LegCounters) (from, to proxy.DirCounters) {
	switch leg := c.target.(type) {
	case *HostConn:
		if f.opts.HostSegments != nil {
			if !c.local.IsValid() {
				c.local = addrPortOf(leg.LocalAddr())
				c.remote = addrPortOf(leg.RemoteAddr())
			}
			if s := f.opts.HostSegments(c.local, c.remote); s != nil {
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
		if f.opts.Segments == nil {
			return
		}
		if !c.local.IsValid() {
			c.local = addrPortOf(leg.LocalAddr())
			c.remote = addrPortOf(leg.RemoteAddr())
		}
		s := f.opts.Segments(c.local, c.remote)
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

func addrPortOf(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}

// syncHost lets the host capture catch up before c's final reading or a
// pooled c's park, when c's target leg is a host socket
// (ForwarderOptions.HostSync).
func (f *Forwarder) syncHost(c *connEntry) {
	if _, ok := c.target.(*HostConn); ok && f.opts.HostSync != nil {
		f.opts.HostSync()
	}
}
