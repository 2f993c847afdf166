package datapath

// Passive TCP measurement flow (back-leg flows only: weir ⇄ target)
//
//	Port.Read (ingress, target → weir) ─► flow has SegStats ─► FromTarget.observe
//	Port.Write (egress, weir → target) ─► flow has SegStats ─► ToTarget.observe
//	observe: SYN ─► start of the sequence space (and the handshake RTT:
//	           egress SYN → ingress SYN-ACK)
//	         no payload, keepalive ─► not a data segment, ignored
//	         data ─► DataSegments++ ─► seq beyond rcv_nxt: OutOfOrder++
//	              ─► at or past the high-water mark: new data (a gap before
//	                 it opens a hole)
//	              ─► below it: fills a hole quickly (reordering) or late, or
//	                 repeats bytes already received ─► Retransmitted++
//	                 ─► after a silence ≥ the RTO estimate ─► Timeouts++
//	FromTarget, IPv4, every packet but the SYN-ACK: the IP-ID signal first
//	         (ipid.go: a gap in a sequential flow's IP IDs is a lost packet,
//	         seen even when nothing follows it), then the sequence rule; a
//	         retransmission it counts takes one waiting IP-ID loss as its
//	         repair (SegCounters.Loss counts each loss once)
//
// The counts are what a receiver (for FromTarget) or a sender-side capture
// (for ToTarget) can judge from the segments alone, the way Wireshark's
// tcp.analysis.retransmission does: a data segment that does not advance the
// sequence space is a retransmission. Wireshark calls a segment below the
// high-water mark that arrives within the first RTT of the highest one "out
// of order" instead; weir judges by the age of the hole the segment fills,
// which tells a network reordering (its hole opened a fraction of an RTT
// ago) from a sender's repair of a loss (the sender needed at least an RTT
// to learn of it):
//
//   - a segment below the high-water mark that fills bytes of a hole opened
//     at least ReorderWindow ago, or that overlaps no hole at all (every byte
//     was already received: the loss was of an ACK, or the retransmission was
//     spurious), is Retransmitted; one that fills a younger hole is reordering.
//     ReorderWindow is half the flow's handshake RTT (0 when no handshake was
//     seen: every fill is then a retransmission, as in Wireshark).
//   - a retransmission is also a Timeout when the direction was silent (no
//     data segment) for at least the RTO estimate before it: the sender
//     stopped, waited for its retransmission timer and resent. The estimate is
//     RFC 6298's first-sample RTO, 3 × the handshake RTT (SRTT = R, RTTVAR =
//     R/2, RTO = SRTT + 4·RTTVAR), raised to the direction's minimum RTO:
//     EngineOptions.TargetMinRTO for FromTarget (default 200 ms, Linux's and
//     gVisor's RTO_MIN), EngineOptions.OwnMinRTO for ToTarget (default 20 ms,
//     weir's own stack). A tail-loss probe sent after a comparable silence is
//     counted too: on the wire it cannot be told from a timer expiry.
//   - OutOfOrder counts data segments that start beyond rcv_nxt (the start of
//     the lowest hole, else the high-water mark), which a receiver has to
//     queue out of order: Linux's tcpi_rcv_ooopack. A segment may be both
//     out of order and a retransmission (a late fill of a higher hole).
//
// Holes are kept exactly up to maxHoles at a time; more gaps than that merge
// into the highest hole, which may then count a later duplicate of bytes in
// between as a late fill: still a retransmission, as it should be.
//
// Concurrency: each direction has one writer (a flow's ingress arrives on one
// TUN queue, its egress leaves through one NIC's write loop), which owns the
// sequence state; the counters are atomics read by the control plane at any
// time. Nothing here allocates.

import (
	"encoding/binary"
	"net/netip"
	"sync/atomic"
	"time"
)

// Defaults of the timeout heuristic's minimum RTOs (see the file comment).
const (
	DefaultTargetMinRTO = 200 * time.Millisecond
	DefaultOwnMinRTO    = 20 * time.Millisecond
)

// maxHoles bounds the sequence holes tracked per direction.
const maxHoles = 4

// SegCounters are the passive counts of one direction of a back-leg TCP
// flow, totals since the flow was first seen. The first four are the
// sequence rule's, the IPID ones the IP-ID signal's (FromTarget only, see
// ipid.go); Loss combines them.
type SegCounters struct {
	DataSegments  uint64 // segments carrying payload, retransmissions included
	Retransmitted uint64 // of those, retransmissions (see the file comment)
	Timeouts      uint64 // of those, sent after a silence ≥ the RTO estimate
	OutOfOrder    uint64 // data segments starting beyond rcv_nxt
	IPIDPackets   uint64 // packets judged by the IP-ID signal (0: never in force)
	IPIDLost      uint64 // packets missing from the IP ID sequence: lost
	IPIDMatched   uint64 // retransmissions (by sequence) that repaired one of those
}

// Loss returns the data segments and the retransmitted (lost) ones under the
// combined rule (ipid.go): each lost packet once, whichever signal saw it.
// Without the IP-ID signal they are DataSegments and Retransmitted.
func (c SegCounters) Loss() (dataSegments, retransmitted uint64) {
	return c.DataSegments + c.IPIDLost, c.Retransmitted + c.IPIDLost - min(c.IPIDMatched, c.Retransmitted)
}

// SegStats is one back-leg flow's passive measurement: the segments the
// target sent (FromTarget, seen on ingress) and those weir sent to it
// (ToTarget, seen on egress). The engine allocates one per back-leg flow
// (EngineOptions.BackPrefixes) and carries it over when a config swap
// replaces the Flow.
type SegStats struct {
	from, to seqDir
	fromID   ipidDir      // the IP-ID signal of the target's packets
	synAt    int64        // egress SYN time (ns); the egress writer owns it
	rtt      atomic.Int64 // handshake RTT in ns, 0 until the SYN-ACK
	// sent is the end of the highest byte weir sent (egress), acked the
	// highest acknowledgement the target sent (ingress), each as
	// seqKnown|seq once seen (0: not yet): Unacked's difference. Each
	// has its direction's one writer.
	sent, acked atomic.Uint64
}

// seqKnown marks a sent or acked word as holding a sequence number.
const seqKnown = 1 << 32

// Unacked returns the bytes weir has sent toward the target that the
// target has not acknowledged, by the segments seen: 0 when it has
// acknowledged everything (or when either side was not seen yet). A
// request that sits unacknowledged never reached the target whole: the
// loss was the path's (or weir's own sender's), not the target's silence.
func (s *SegStats) Unacked() uint32 {
	sent, acked := s.sent.Load(), s.acked.Load()
	if sent&seqKnown == 0 || acked&seqKnown == 0 {
		return 0
	}
	if d := uint32(sent) - uint32(acked); int32(d) > 0 {
		return d
	}
	return 0
}

// FromTarget returns the counts of the target's segments.
func (s *SegStats) FromTarget() SegCounters {
	// matched first: it never exceeds the lost and retransmitted counts
	// loaded after it.
	m := s.fromID.matched.Load()
	c := s.from.counters()
	c.IPIDPackets, c.IPIDLost, c.IPIDMatched = s.fromID.judged.Load(), s.fromID.lost.Load(), m
	return c
}

// ToTarget returns the counts of weir's segments toward the target.
func (s *SegStats) ToTarget() SegCounters { return s.to.counters() }

// RTT returns the handshake RTT, or 0 when no handshake was seen.
func (s *SegStats) RTT() time.Duration { return time.Duration(s.rtt.Load()) }

type hole struct {
	start, end uint32
	at         int64 // ns: when the hole opened
}

// seqDir is one direction's sequence state (owned by its one writer) and
// counters (atomics).
type seqDir struct {
	init   bool
	nholes uint8
	next   uint32 // high-water mark: the highest seq+len seen
	lastAt int64  // ns: last data segment
	holes  [maxHoles]hole

	data, retrans, timeouts, ooo atomic.Uint64
}

func (d *seqDir) counters() SegCounters {
	return SegCounters{DataSegments: d.data.Load(), Retransmitted: d.retrans.Load(),
		Timeouts: d.timeouts.Load(), OutOfOrder: d.ooo.Load()}
}

// seqLT reports a < b in sequence space (RFC 793 arithmetic modulo 2³²).
func seqLT(a, b uint32) bool { return int32(a-b) < 0 }

// tcpSeg returns the sequence number and payload length of the TCP segment
// in packet b (parsed into pk), or ok false when b is too short for them.
func tcpSeg(b []byte, pk *Packet) (seq uint32, plen int, ok bool) {
	if pk.L4Off+20 > len(b) || pk.Len > len(b) {
		return 0, 0, false
	}
	t := b[pk.L4Off:]
	doff := int(t[12]>>4) * 4
	plen = pk.Len - pk.L4Off - doff
	if plen < 0 {
		return 0, 0, false
	}
	return binary.BigEndian.Uint32(t[4:8]), plen, true
}

// ingress records a segment from the target, or a super-packet standing for
// segs of them (GRO/GSO: offload on). now is in ns.
func (s *SegStats) ingress(b []byte, pk *Packet, segs int, now, minRTO int64) {
	seq, plen, ok := tcpSeg(b, pk)
	if !ok {
		return
	}
	if pk.TCPFlags&(TCPSyn|TCPAck) == TCPSyn|TCPAck && s.rtt.Load() == 0 {
		if at := atomic.LoadInt64(&s.synAt); at != 0 && now > at {
			s.rtt.Store(now - at)
		}
	}
	if pk.TCPFlags&TCPAck != 0 {
		ack := binary.BigEndian.Uint32(b[pk.L4Off+8:])
		if old := s.acked.Load(); old&seqKnown == 0 || seqLT(uint32(old), ack) {
			s.acked.Store(seqKnown | uint64(ack))
		}
	}
	reorder := s.rtt.Load() / 2
	if pk.Version == 4 && pk.TCPFlags&TCPSyn == 0 {
		s.fromID.step(pk.IPID, segs, now, reorder)
	}
	if r := s.from.observe(seq, plen, segs, pk.TCPFlags, now, s.rto(minRTO), reorder); r > 0 {
		s.fromID.repaired(r)
	}
}

// egress records a segment toward the target, or a super-packet standing
// for segs of them.
func (s *SegStats) egress(b []byte, pk *Packet, segs int, now, minRTO int64) {
	seq, plen, ok := tcpSeg(b, pk)
	if !ok {
		return
	}
	if pk.TCPFlags&(TCPSyn|TCPAck) == TCPSyn {
		atomic.StoreInt64(&s.synAt, now)
	}
	if end := seq + uint32(plen); pk.TCPFlags&TCPSyn != 0 || plen > 0 {
		if pk.TCPFlags&TCPSyn != 0 {
			end++
		}
		if old := s.sent.Load(); old&seqKnown == 0 || seqLT(uint32(old), end) {
			s.sent.Store(seqKnown | uint64(end))
		}
	}
	s.to.observe(seq, plen, segs, pk.TCPFlags, now, s.rto(minRTO), s.rtt.Load()/2)
}

// rto is the RTO estimate in ns: 3 × the handshake RTT, at least minRTO.
func (s *SegStats) rto(minRTO int64) int64 { return max(3*s.rtt.Load(), minRTO) }

// observe judges one segment of the direction (see the file comment): seq and
// plen from its header, segs the wire segments it stands for (more than one
// for a GSO/GRO super-packet: data and retransmitted counts are in wire
// segments, so offload does not change the ratios), now its arrival (ns),
// rto the RTO estimate and reorder the reorder window (ns). A timeout and an
// out-of-order arrival are one event each, whatever the size. It returns the
// segments it counted as retransmitted (0 or segs).
func (d *seqDir) observe(seq uint32, plen, segs int, flags uint8, now, rto, reorder int64) int {
	if flags&TCPSyn != 0 {
		d.init, d.next, d.nholes, d.lastAt = true, seq+1+uint32(plen), 0, now
		return 0
	}
	if plen == 0 {
		return 0
	}
	end := seq + uint32(plen)
	if plen <= 1 && d.init && seq == d.next-1 {
		return 0 // a keepalive or zero-window probe: one old byte, not data
	}
	d.data.Add(uint64(segs))
	if !d.init {
		// The flow was first seen mid-stream (the table dropped it): start
		// from here.
		d.init, d.next, d.lastAt = true, end, now
		return 0
	}
	silence := now - d.lastAt
	d.lastAt = now
	rcvNxt := d.next
	if d.nholes > 0 {
		rcvNxt = d.holes[0].start
	}
	if seqLT(rcvNxt, seq) {
		d.ooo.Add(1)
	}
	if !seqLT(seq, d.next) {
		if seqLT(d.next, seq) {
			d.addHole(d.next, seq, now)
		}
		d.next = end
		return 0
	}
	// Below the high-water mark: a fill or a repeat.
	top := end
	if seqLT(d.next, end) {
		top = d.next
	}
	filled, oldest := d.fill(seq, top, now)
	if seqLT(d.next, end) {
		d.next = end
	}
	if filled && now-oldest < reorder {
		return 0 // a reordered segment, not a retransmission
	}
	d.retrans.Add(uint64(segs))
	if silence >= rto {
		d.timeouts.Add(1)
	}
	return segs
}

// addHole records the gap [start, end) opened at now, merging into the
// highest hole when maxHoles are open.
func (d *seqDir) addHole(start, end uint32, now int64) {
	if int(d.nholes) == maxHoles {
		d.holes[maxHoles-1].end = end
		return
	}
	d.holes[d.nholes] = hole{start: start, end: end, at: now}
	d.nholes++
}

// fill removes [s, e) from the holes. It reports whether any byte was in a
// hole and the opening time of the oldest hole touched.
func (d *seqDir) fill(s, e uint32, now int64) (filled bool, oldest int64) {
	oldest = now
	for i := 0; i < int(d.nholes); {
		h := &d.holes[i]
		if !seqLT(s, h.end) || !seqLT(h.start, e) {
			i++
			continue // no overlap
		}
		filled = true
		oldest = min(oldest, h.at)
		switch {
		case !seqLT(h.start, s) && !seqLT(e, h.end): // covers the hole
			copy(d.holes[i:], d.holes[i+1:d.nholes])
			d.nholes--
			continue
		case !seqLT(h.start, s): // covers its head
			h.start = e
		case !seqLT(e, h.end): // covers its tail
			h.end = s
		default: // in its middle: split
			if int(d.nholes) < maxHoles {
				copy(d.holes[i+2:d.nholes+1], d.holes[i+1:d.nholes])
				d.holes[i+1] = hole{start: e, end: h.end, at: h.at}
				d.nholes++
			}
			h.end = s
			i++
		}
		i++
	}
	return filled, oldest
}

// isBack reports whether a is one of the back arms' own addresses.
func isBack(prefixes []netip.Prefix, a netip.Addr) bool {
	for _, p := range prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
