package datapath

// Application bytes are new sequence space
//
// The payload rows of the meters (Meters.TargetPayload, what
// bandwidthBytes: payload limits count) hold the application bytes of a
// bound flow: a TCP payload byte counts once, however often it crosses the
// engine. Per flow and direction an appSpace keeps the high-water mark of
// the sequence space seen (the highest seq+len) and the bytes skipped by
// gaps below it (the hole credit):
//
//	SYN ─► mark = ISN+1 (no payload is counted before a SYN unless the flow
//	       was first seen mid-stream: its first segment counts whole and
//	       sets the mark)
//	segment at or beyond the mark ─► its payload counts; a gap before it
//	       (bytes lost or reordered before weir) adds to the credit
//	segment below the mark ─► counts only what the credit still holds:
//	       a hole's fill (the bytes' first copy at weir) counts, a
//	       retransmission of bytes already seen does not
//
// So a resent 1000-byte segment counts 1000 application bytes once, while
// the wire rows (bandwidthBytes: wire) count both copies, 2000 bytes of
// payload. Toward a client (egress) weir sees every original before any
// loss: a resend is always below the mark with no credit. From a client
// (ingress) losses happen before weir, and the credit lets the repair
// count. Over a flow's life the count is its sequence space less what is
// still owed to open holes; it is never more than the payload bytes the
// flow really carried, so a segment with a forged sequence number far ahead
// cannot make weir count bytes that were not sent. A repeat of bytes seen
// while a hole is open takes credit the hole's repair then misses: the
// total stays right, its timing does not (rare: a spurious resend during a
// loss). UDP and a flow the table had no room for count every payload byte.
//
// The state is one atomic word per direction (mark, credit, a set bit),
// updated by compare-and-swap: a flow's packets written from several
// goroutines at once are still counted once.

import "sync/atomic"

// appSpace is one direction's sequence-space state for the application
// byte count: bits 0–31 the mark, 32–62 the hole credit, 63 set.
type appSpace struct{ w atomic.Uint64 }

const (
	appSet       = 1 << 63
	appCreditMax = 1<<31 - 1
)

// count returns the application bytes of a TCP segment (seq, plen payload
// bytes, flags) and records it.
func (a *appSpace) count(seq uint32, plen int, flags uint8) int {
	for {
		old := a.w.Load()
		mark, credit := uint32(old), uint32(old>>32)&appCreditMax
		n := plen
		switch {
		case flags&TCPSyn != 0:
			mark, credit = seq+1+uint32(plen), 0
		case old&appSet == 0:
			mark = seq + uint32(plen)
		case plen == 0:
			return 0
		default:
			end := seq + uint32(plen)
			switch {
			case !seqLT(seq, mark): // at or beyond the mark
				credit = uint32(min(uint64(credit)+uint64(seq-mark), appCreditMax))
				mark = end
			case seqLT(mark, end): // straddles it: the part above is new
				above := int(end - mark)
				take := min(plen-above, int(credit))
				n, credit, mark = above+take, credit-uint32(take), end
			default: // below it: a fill takes credit, a repeat none
				n = min(plen, int(credit))
				credit -= uint32(n)
			}
		}
		if a.w.CompareAndSwap(old, appSet|uint64(credit)<<32|uint64(mark)) {
			return n
		}
	}
}

// appPayload returns the bytes of parsed packet b (payload of them its
// transport payload) for the payload rows: for a TCP flow bound to a target
// with sequence state app, its new sequence space in direction d; else
// payload.
func appPayload(app *[2]appSpace, d Dir, target int32, b []byte, pk *Packet, payload int) int {
	if app == nil || target < 0 || pk.Proto != ProtoTCP || pk.Fragment {
		return payload
	}
	seq, plen, ok := tcpSeg(b, pk)
	if !ok {
		return payload
	}
	return app[d].count(seq, plen, pk.TCPFlags)
}
