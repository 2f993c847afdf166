package proxy

//go:generate go run golang.org/x/tools/cmd/stringer@v0.52.0 -type=DirSource -linecomment -output=direction_string.go
import (
	"net/netip"

	"weir/datapath"
)

// DirSource says how one direction of a target leg was measured.
type DirSource uint8

// The sources of a DirCounters.
const (
	// DirNone: not measured (no datapath on the leg, or no such leg).
	DirNone DirSource = iota // none
	// DirPassive: counted from the segments by the datapath (exact).
	DirPassive // passive
	// DirKernel: counted by the kernel's TCP sender (exact).
	DirKernel // kernel
	// DirCapture: counted from the segments by the host-leg capture
	// (datapath/hostcap: an AF_PACKET socket feeding the datapath's
	// sequence tracker), as exact as DirPassive while the capture loses
	// nothing.
	DirCapture // capture
	// DirEstimate: the kernel's receive-side counters: data segments and
	// out-of-order arrivals, no retransmission count (Retransmitted and
	// Timeouts are 0 and mean "unknown").
	DirEstimate // estimate
)

// DirCounters are one direction of a target leg: totals on a connection,
// deltas in a sample (AggSample).
type DirCounters struct {
	DataSegments  uint64 // segments with payload, retransmissions included
	Retransmitted uint64 // of those, retransmitted
	Timeouts      uint64 // retransmission timeouts
	OutOfOrder    uint64 // data segments that arrived beyond the next expected byte
	// IPIDPackets counts the packets the IP-ID loss signal judged (the
	// target's IPv4 IDs were sequential: datapath/ipid.go); DataSegments
	// and Retransmitted then include the losses it found. 0 means the
	// sequence rule alone.
	IPIDPackets uint64
	Source      DirSource
}

// Add adds o's counts to d; d's Source becomes the weaker of the two.
func (d *DirCounters) Add(o DirCounters) {
	d.DataSegments += o.DataSegments
	d.Retransmitted += o.Retransmitted
	d.Timeouts += o.Timeouts
	d.OutOfOrder += o.OutOfOrder
	d.IPIDPackets += o.IPIDPackets
	// An aggregate says the weakest source any of its connections had
	// (an estimate over an exact count), and none only if all had none.
	if o.Source != DirNone && (d.Source == DirNone || o.Source > d.Source) {
		d.Source = o.Source
	}
}

// SubDir is a − b field by field (0 where a counter went back: the
// datapath's flow was replaced by a new one, whose counts restart), with
// a's Source.
func SubDir(a, b DirCounters) DirCounters {
	if a.DataSegments < b.DataSegments {
		b = DirCounters{}
	}
	return DirCounters{DataSegments: sub(a.DataSegments, b.DataSegments), Retransmitted: sub(a.Retransmitted, b.Retransmitted),
		Timeouts: sub(a.Timeouts, b.Timeouts), OutOfOrder: sub(a.OutOfOrder, b.OutOfOrder), IPIDPackets: sub(a.IPIDPackets, b.IPIDPackets),
		Source: a.Source}
}

// SegmentsFunc returns the datapath's passive measurement of the back-leg
// TCP flow from local (the back arm's address and port) to remote (the
// target), or nil. (*datapath.Engine).Segments is one.
type SegmentsFunc func(local, remote netip.AddrPort) *datapath.SegStats

func sub(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}
