package datapath

// The IP-ID loss signal (FromTarget, IPv4)
//
// The sequence rule (seqtrack.go) sees a loss only when a copy of the lost
// bytes or bytes after them arrive: a segment lost with nothing of the
// target's behind it (a one-segment response, the last segment of a burst)
// is resent by a tail-loss probe or an RTO, and that resend is the first copy
// weir sees, so the sequence numbers show no loss at all. The IPv4 header
// numbers the packets instead: Linux stamps a connected TCP socket's packets
// with a per-socket IP ID that steps by one per packet it sends, pure ACKs
// and retransmissions included (a GSO/TSO super-packet of n segments by n,
// each segment of it one ID), so a gap in the IDs of a flow's packets is a
// packet lost on the way (data or pure ACK), whatever followed it.
//
//	packet from the target (SYN-ACKs skipped: Linux sends them from the
//	listener, ID 0 with DF) ─► d = ID − expected (16-bit, modulo 2¹⁶) ─┬─ 0: in step ─► confidence +1
//	  ├─ 1..maxIDGap: a gap of d packets ─► confidence −idGapCost; counted
//	  │    only while the signal is in force (opened as a gap: see below)
//	  ├─ −maxIDLate..−1: a late packet ─► it fills an open gap (reordering,
//	  │    it was not lost) or it is a repeat ─► confidence −idOddCost
//	  └─ anything else: foreign (another sender's ID: a control socket's
//	       RST or TIME_WAIT ACK, a random-ID stack) ─► confidence −idOddCost;
//	       two foreign packets in step with each other resynchronise (the
//	       counter jumped)
//
// Whether a flow's IDs are sequential is learnt per flow: the signal is in
// force once the confidence, which starts at 0, reaches idOn (16 in-step
// packets net) and stays so while it stays there. A stack that stamps
// random IDs (macOS, OpenBSD, some middleboxes) never gets there, nor does
// one whose global counter is shared by the host's other flows (Windows;
// the target's other connections to weir take IDs in between, so the steps
// are rarely exactly 1); gaps are counted only in force, so those flows keep
// the sequence rule alone. A shared counter on a host that sends nothing
// else looks sequential, and its rare packets to others read as losses. A
// gap event costs idGapCost: the signal stays in force below about one loss
// event in five packets.
//
// A gap is confirmed lost when a packet arrives at least the reorder window
// (half the handshake RTT, as for the sequence holes; 0 without a handshake)
// after it opened; a late packet within the window fills it instead. At most
// maxIDGaps gaps wait at a time; a newer one confirms the oldest.
//
// Combined with the sequence rule, one loss is counted once (SegCounters.
// Loss): every confirmed gap is a lost packet (IPIDLost) and, weir never
// having seen it, also a segment sent, so it adds one to the data segments
// and one to the retransmitted ones; a retransmission the sequence rule
// counts while confirmed gaps are waiting for their repair takes one of them
// (IPIDMatched) and adds nothing more. A retransmission with no gap waiting
// (a spurious one, the repair of a packet lost before the signal was in
// force, a resend of bytes whose ACK was lost) counts as before. So
//
//	data segments = seen data segments + IP-ID losses
//	retransmitted = IP-ID losses + sequence retransmissions − matched
//
// which for a Linux target is its own count (TcpRetransSegs over
// data_segs_out) up to lost pure ACKs: the IDs cannot tell which packet is
// missing, so a lost pure ACK counts as a lost segment, and a spurious
// resend that meets a lost ACK's gap is taken for its repair. The timeout
// count stays the sequence rule's. What stays invisible: IPv6 (no ID in
// the fixed header), targets with random or shared IDs, losses while a
// flow's signal is not (yet) in force (its first 16 packets), and the loss
// of a flow's last packets (no later packet shows the gap).

import "sync/atomic"

// Tuning of the IP-ID signal (see the file comment).
const (
	maxIDGap  = 1024 // larger steps forward are foreign, not losses
	maxIDLate = 64   // a packet this many IDs behind may fill a gap
	maxIDGaps = 4    // gaps awaiting confirmation
	idMax     = 32   // confidence ceiling
	idOn      = 16   // in force at or above
	idGapCost = 4
	idOddCost = 8
)

// idGap is a run of n missing IDs from start, opened at at (ns).
type idGap struct {
	start, n uint16
	at       int64
}

// ipidDir is the IP-ID signal of one direction: state owned by the
// direction's writer, counters atomic.
type ipidDir struct {
	init, cand bool
	score      uint8
	ngaps      uint8
	next       uint16 // the ID expected next
	candNext   uint16 // after a foreign packet: the ID that confirms a jump
	pending    uint32 // confirmed losses no retransmission has taken yet
	gaps       [maxIDGaps]idGap

	judged, lost, matched atomic.Uint64
}

// step judges one packet's ID; segs is the wire packets it stands for.
func (d *ipidDir) step(id uint16, segs int, now, reorder int64) {
	d.confirm(now, reorder)
	n := uint16(segs)
	if !d.init {
		d.init, d.next = true, id+n
		return
	}
	in := d.score >= idOn
	switch delta := int16(id - d.next); {
	case delta == 0:
		d.next, d.cand = id+n, false
		d.score = min(d.score+1, idMax)
		if in {
			d.judged.Add(uint64(segs))
		}
	case delta > 0 && delta <= maxIDGap:
		if in {
			d.open(d.next, uint16(delta), now, reorder)
			d.judged.Add(uint64(segs))
		}
		d.next, d.cand = id+n, false
		d.score -= min(d.score, idGapCost)
	case delta < 0 && delta >= -maxIDLate:
		if d.fill(id, n) {
			return // a reordered packet: it was not lost
		}
		d.score -= min(d.score, idOddCost)
	default:
		if d.cand && id == d.candNext {
			d.next, d.cand = id+n, false // the counter jumped: follow it
			return
		}
		d.cand, d.candNext = true, id+n
		d.score -= min(d.score, idOddCost)
	}
}

// open records n missing IDs from start; with no reorder window they are
// lost at once.
func (d *ipidDir) open(start, n uint16, now, reorder int64) {
	if reorder <= 0 {
		d.lose(n)
		return
	}
	if d.ngaps == maxIDGaps {
		d.lose(d.gaps[0].n)
		copy(d.gaps[:], d.gaps[1:])
		d.ngaps--
	}
	d.gaps[d.ngaps] = idGap{start: start, n: n, at: now}
	d.ngaps++
}

// confirm turns the gaps opened at least reorder ago into losses.
func (d *ipidDir) confirm(now, reorder int64) {
	i := 0
	for i < int(d.ngaps) && now-d.gaps[i].at >= reorder {
		d.lose(d.gaps[i].n)
		i++
	}
	if i > 0 {
		copy(d.gaps[:], d.gaps[i:d.ngaps])
		d.ngaps -= uint8(i)
	}
}

func (d *ipidDir) lose(n uint16) {
	if n == 0 {
		return
	}
	d.lost.Add(uint64(n))
	d.pending += uint32(n)
}

// fill takes the IDs [id, id+n) out of the open gaps, reporting whether any
// was in one. A fill in a gap's middle splits it (with no room for the
// split, the part above the fill is dropped: neither lost nor waiting).
func (d *ipidDir) fill(id, n uint16) bool {
	for i := 0; i < int(d.ngaps); i++ {
		g := &d.gaps[i]
		off := id - g.start
		if off >= g.n {
			continue
		}
		end := min(off+n, g.n) // the fill's end within the gap
		switch {
		case off == 0 && end == g.n:
			copy(d.gaps[i:], d.gaps[i+1:d.ngaps])
			d.ngaps--
		case off == 0:
			g.start, g.n = g.start+end, g.n-end
		case end == g.n:
			g.n = off
		default:
			rest := idGap{start: g.start + end, n: g.n - end, at: g.at}
			g.n = off
			if d.ngaps < maxIDGaps {
				copy(d.gaps[i+2:d.ngaps+1], d.gaps[i+1:d.ngaps])
				d.gaps[i+1] = rest
				d.ngaps++
			}
		}
		return true
	}
	return false
}

// repaired takes up to segs confirmed losses as repaired by a
// retransmission the sequence rule counted (segs of them).
func (d *ipidDir) repaired(segs int) {
	if m := min(uint32(segs), d.pending); m > 0 {
		d.pending -= m
		d.matched.Add(uint64(m))
	}
}
