// Package hostcap measures the target legs weir dials with kernel sockets
// (via: host) the way the datapath measures its back arm: it captures the
// legs' TCP segments where they leave and enter the host and feeds them to
// the datapath's sequence tracker (datapath.SegStats), one per flow, so
// that both directions of a host leg are counted segment by segment.
//
//	kernel: every interface (ifindex 0) ─► BPF filter: TCP from or to a
//	        target's address and port, cut to SnapLen ─► socket queue
//	        (SO_RCVBUF; an overrun is counted, PACKET_STATISTICS tp_drops)
//	reader: recvmmsg, a batch at a time ─► virtio-net header (GSO size:
//	        a super-packet counts as its wire segments) ─► link header
//	        skipped ─► datapath.Parse ─► direction by address and
//	        packet type:
//	          outgoing (PACKET_OUTGOING), to a target  ─► ToTarget
//	          incoming (host-bound), from a target     ─► FromTarget
//	        ─► weir's end one of the host's addresses? (else traffic
//	          the host forwards for others: counted, Forwarded)
//	        ─► the flow's SegStats (created at weir's SYN, or mid-stream
//	          at a data segment); dropped once the connection's final
//	          reading took it (Release), or after its linger
//
// The socket is a plain AF_PACKET SOCK_RAW socket with a large receive
// buffer read in batches (recvmmsg), not a TPACKET_V3 ring: a ring hands
// its packets over a block at a time, when the block fills or its retire
// timer (a jiffy or more) fires, so a connection's last segments would
// often still be in the kernel's block when weir takes the connection's
// final reading; the socket hands each packet over as soon as the reader
// runs. Each packet carries its kernel timestamp (SO_TIMESTAMPNS), so the
// tracker's reorder window and timeout heuristic read the wire's times
// however late the reader runs on a loaded host.
//
// A packet crossing two interfaces of the host is seen on each; the packet
// type keeps one copy per direction: weir's segments where they leave
// (outgoing), the target's where they arrive. A target on the host itself
// (loopback) is seen leaving and arriving, and counted once the same way.
//
// Opening the socket needs CAP_NET_RAW; changing its filter does not, so
// weir opens it before it drops its privileges and keeps it for its life.
package hostcap

import (
	"errors"
	"net/netip"
	"time"

	"weir/datapath"
)

// Defaults of Options.
const (
	DefaultRcvBuf      = 16 << 20
	DefaultIdleTimeout = 2 * time.Minute
	DefaultMaxFlows    = 1 << 16
	DefaultBatch       = 64
	// closedLinger is how long a flow that saw one FIN stays after its
	// last packet: the connection may still be half-open (the other
	// direction sending), and its final reading comes after both FINs.
	closedLinger = 30 * time.Second
	// doneLinger is how long a finished flow (a FIN each way, or a RST)
	// stays after its last packet, for the connection's final reading:
	// that reading follows the second FIN by the splice's teardown and a
	// Sync (at most 100 ms in weir run), and Release then drops the flow
	// at once; doneLinger is for the flows no reading releases. It bounds the table under a high
	// connection rate: with closedLinger's 30 s, 2 500 short connections/s
	// filled the 65 536 flows of DefaultMaxFlows (21.8 MiB) within 26 s and
	// the capture refused new flows from there on.
	doneLinger = 3 * time.Second
)

// Options configure Open. The zero value works.
type Options struct {
	// RcvBuf is the socket's receive buffer in bytes, the packets that may
	// wait for the reader; zero means DefaultRcvBuf. It is set with
	// SO_RCVBUFFORCE where the process may (CAP_NET_ADMIN), else with
	// SO_RCVBUF, which net.core.rmem_max caps. Tests make it tiny to see
	// capture loss counted.
	RcvBuf int
	// TargetMinRTO and OwnMinRTO are the timeout heuristic's floors for
	// the target's sender (FromTarget) and the host's own (ToTarget);
	// zero means datapath.DefaultTargetMinRTO and, the host's kernel
	// being Linux, datapath.DefaultTargetMinRTO too.
	TargetMinRTO, OwnMinRTO time.Duration
	// IdleTimeout drops a flow not seen for that long; zero means
	// DefaultIdleTimeout. weir's sockets send TCP keepalives every 15 s.
	IdleTimeout time.Duration
	// MaxFlows bounds the flows tracked; a packet of a new flow beyond it
	// is counted in Stats.Refused. Zero means DefaultMaxFlows.
	MaxFlows int
	// Batch is the packets read per recvmmsg; zero means DefaultBatch.
	Batch int
}

// Stats are a capture's counters, totals since Open.
type Stats struct {
	// Packets counts the packets the filter kept and the reader read.
	Packets uint64
	// Dropped counts the packets the filter kept that the kernel dropped
	// because the reader fell behind (the receive buffer was full): the
	// capture's loss. An interval in which it moved measured its flows
	// only in part.
	Dropped uint64
	// Malformed counts packets the reader could not decode (a link type
	// it does not know, a header cut short).
	Malformed uint64
	// Refused counts packets of new flows not tracked: MaxFlows reached.
	Refused uint64
	// Forwarded counts packets between a target and an address not the
	// host's own: traffic the host forwards for others (a router's
	// clients reaching the target directly), no leg of weir's. Not tracked.
	Forwarded uint64
	// Flows is the flows tracked now.
	Flows int
}

// ErrClosed is returned by a Capture's methods after Close.
var ErrClosed = errors.New("hostcap: capture closed")

type flowKey struct{ local, remote netip.AddrPort }

// flow is one tracked TCP flow: weir's end local, the target remote.
type flow struct {
	seg    datapath.SegStats
	last   int64 // ns (capture clock): the last packet; the reader owns it
	closed bool  // a FIN or RST was seen; the reader owns it
	// fins records the FINs seen (finOut: weir's, finIn: the target's)
	// and a RST (finRst); the reader owns it. Both FINs or a RST: the
	// flow is done (doneLinger).
	fins uint8
}

// Bits of flow.fins.
const (
	finOut uint8 = 1 << iota
	finIn
	finRst
)

// done reports whether the flow has ended: a FIN each way, or a RST.
func (f *flow) done() bool { return f.fins&finRst != 0 || f.fins&(finOut|finIn) == finOut|finIn }

// linger is how long the flow stays after its last packet.
func (f *flow) linger(idle time.Duration) time.Duration {
	switch {
	case f.done():
		return doneLinger
	case f.closed:
		return closedLinger
	}
	return idle
}
