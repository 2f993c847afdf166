package netstack

import (
	"net"
	"net/netip"

	"weir/datapath"
)

// Per-direction measurement of a target leg
//
//	target leg ─┬─ gVisor back arm (*Conn) ─► ForwarderOptions.Segments: the
//	            │    datapath's passive counts of the flow (datapath.SegStats),
//	            │    both directions, exact by the segments on the wire; the
//	            │    to_target timeouts from the gVisor endpoint (exact)
//	            └─ host socket (*HostConn) ─► TCP_INFO: to_target exact from
//	                 the kernel sender (data_segs_out, total_retrans,
//	                 total_rto); from_target only an estimate: the kernel
//	                 gives data_segs_in and rcv_ooopack per socket, but no
//	                 count of the retransmissions it received
//
// Every count is of data segments (a payload), never of pure ACKs, so a
// download's ACK stream does not dilute weir's own loss ratio.

// DirSource says how one direction of a target leg was measured.
type DirSource uint8

// The sources of a DirCounters.
const (
	// DirNone: not measured (no datapath on the leg, or no such leg).
	DirNone DirSource = iota
	// DirPassive: counted from the segments by the datapath (exact).
	DirPassive
	// DirKernel: counted by the kernel's TCP sender (exact).
	DirKernel
	// DirEstimate: the kernel's receive-side counters: data segments and
	// out-of-order arrivals, no retransmission count (Retransmitted and
	// Timeouts are 0 and mean "unknown").
	DirEstimate
)

// String returns "none", "passive", "kernel" or "estimate".
func (s DirSource) String() string {
	switch s {
	case DirPassive:
		return "passive"
	case DirKernel:
		return "kernel"
	case DirEstimate:
		return "estimate"
	}
	return "none"
}

// DirCounters are one direction of a target leg: totals on a connection,
// deltas in an AggSample.
type DirCounters struct {
	DataSegments  uint64 // segments with payload, retransmissions included
	Retransmitted uint64 // of those, retransmitted
	Timeouts      uint64 // retransmission timeouts
	OutOfOrder    uint64 // data segments that arrived beyond the next expected byte
	Source        DirSource
}

func (d *DirCounters) add(o DirCounters) {
	d.DataSegments += o.DataSegments
	d.Retransmitted += o.Retransmitted
	d.Timeouts += o.Timeouts
	d.OutOfOrder += o.OutOfOrder
	// An aggregate says the weakest source any of its connections had
	// (an estimate over an exact count), and none only if all had none.
	if o.Source != DirNone && (d.Source == DirNone || o.Source > d.Source) {
		d.Source = o.Source
	}
}

// subDir is a − b field by field (0 where a counter went back: the
// datapath's flow was replaced by a new one, whose counts restart).
func subDir(a, b DirCounters) DirCounters {
	if a.DataSegments < b.DataSegments {
		b = DirCounters{}
	}
	return DirCounters{DataSegments: sub(a.DataSegments, b.DataSegments), Retransmitted: sub(a.Retransmitted, b.Retransmitted),
		Timeouts: sub(a.Timeouts, b.Timeouts), OutOfOrder: sub(a.OutOfOrder, b.OutOfOrder), Source: a.Source}
}

// SegmentsFunc returns the datapath's passive measurement of the back-leg
// TCP flow from local (the back arm's address and port) to remote (the
// target), or nil. (*datapath.Engine).Segments is one.
type SegmentsFunc func(local, remote netip.AddrPort) *datapath.SegStats

// dirs returns the leg's per-direction totals now: from the target and to
// it. tg are the leg's counters read at the same time.
func (f *Forwarder) dirs(c *connEntry, tg LegCounters) (from, to DirCounters) {
	switch leg := c.target.(type) {
	case *HostConn:
		from = DirCounters{DataSegments: tg.DataSegmentsIn, OutOfOrder: tg.OutOfOrderIn, Source: DirEstimate}
		to = DirCounters{DataSegments: tg.DataSegmentsOut, Retransmitted: tg.Retransmits, Timeouts: tg.Timeouts, Source: DirKernel}
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
		from = DirCounters{DataSegments: fr.DataSegments, Retransmitted: fr.Retransmitted, Timeouts: fr.Timeouts, OutOfOrder: fr.OutOfOrder, Source: DirPassive}
		// weir's own timeouts are the gVisor endpoint's, exact; the
		// passive heuristic is for a sender weir cannot ask.
		to = DirCounters{DataSegments: tt.DataSegments, Retransmitted: tt.Retransmitted, Timeouts: tg.Timeouts, OutOfOrder: tt.OutOfOrder, Source: DirPassive}
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
