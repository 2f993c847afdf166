package netstack

// Pure ACKs coalesced within a read batch
//
//	readLoop: Device.Read(batch) ──► markSuperseded: a pure ACK whose flow's
//	          next packet in the same batch is a pure ACK acknowledging more
//	          ──► skipped (counted in RxCoalesced) ──► the rest delivered in order
//
// A download through weir is ACK-clocked: every ACK the client sends makes
// gVisor's sender put out what that ACK freed, one TUN write each. With
// several of a flow's ACKs in one batch, each was a super-packet of its
// own; delivering only the last hands the sender all the room at once, so
// it writes one larger super-packet (what Linux's TSO deferral gets by
// waiting). Only ACKs the later one subsumes are skipped: no payload, the
// ACK flag alone (no SYN, FIN, RST, URG, ECE or CWR), no SACK blocks (only
// NOP, EOL and timestamp options), the same sequence number, and an
// acknowledgment number strictly ahead. A duplicate ACK (the same
// acknowledgment number) is never skipped: fast retransmit counts them.
// The datapath engine below the link has metered every packet already.

import (
	"encoding/binary"
	"net/netip"

	"weir/datapath"
)

// ackInfo is what markSuperseded learns about one packet of a batch.
type ackInfo struct {
	pure     bool // a pure ACK (see the file comment)
	src, dst netip.AddrPort
	seq, ack uint32
}

// maxPureACK is the longest pure ACK: an IPv6 header and a TCP header with
// 40 bytes of options (IPv6 extension headers make a packet no pure ACK
// here).
const maxPureACK = 40 + 60

// pureACK reports whether pkt is a pure ACK as the file comment defines it,
// with its flow and numbers. It does not allocate.
func pureACK(pkt []byte, a *ackInfo) bool {
	if len(pkt) > maxPureACK {
		return false // the common case on a busy link: a data segment
	}
	var p datapath.Packet
	if datapath.Parse(pkt, &p) != datapath.DropNone || p.Proto != datapath.ProtoTCP || p.Fragment {
		return false
	}
	tcp := pkt[p.L4Off:p.Len]
	doff := int(tcp[12]>>4) * 4
	if p.TCPFlags != datapath.TCPAck || doff != len(tcp) {
		return false // other flags, or a payload
	}
	for opts := tcp[20:doff]; len(opts) > 0; {
		switch opts[0] {
		case 0: // EOL
			opts = nil
			continue
		case 1: // NOP
			opts = opts[1:]
			continue
		case 8: // timestamps
			if len(opts) >= 10 && opts[1] == 10 {
				opts = opts[10:]
				continue
			}
		}
		return false // SACK blocks, or anything else
	}
	a.src, a.dst = p.SrcAddrPort(), p.DstAddrPort()
	a.seq = binary.BigEndian.Uint32(tcp[4:8])
	a.ack = binary.BigEndian.Uint32(tcp[8:12])
	return true
}

// markSuperseded sets skip[i] for every packet of the batch pkts a later
// pure ACK of the same flow in the batch supersedes: packet i is a pure
// ACK, the flow's next packet in the batch is one too, with the same
// sequence number and an acknowledgment number ahead of i's. info is
// scratch of at least len(pkts). It returns how many it marked.
func markSuperseded(pkts [][]byte, info []ackInfo, skip []bool) int {
	for i, pkt := range pkts {
		skip[i] = false
		info[i].pure = pureACK(pkt, &info[i])
	}
	marked := 0
	for i := range pkts {
		a := &info[i]
		if !a.pure {
			continue
		}
		for j := i + 1; j < len(pkts); j++ {
			b := &info[j]
			if !b.pure {
				// Not a pure ACK: it may be any flow's, this one's
				// included; only a packet known to be another flow's
				// may be passed over.
				if sameFlowOrUnknown(pkts[j], a) {
					break
				}
				continue
			}
			if b.src != a.src || b.dst != a.dst {
				continue
			}
			if b.seq == a.seq && int32(b.ack-a.ack) > 0 {
				skip[i] = true
				marked++
			}
			break
		}
	}
	return marked
}

// sameFlowOrUnknown reports whether pkt, not a pure ACK, may belong to a's
// flow: a TCP packet of that 4-tuple, or one whose flow cannot be told.
func sameFlowOrUnknown(pkt []byte, a *ackInfo) bool {
	var p datapath.Packet
	if datapath.Parse(pkt, &p) != datapath.DropNone || p.NonFirstFragment {
		return true
	}
	return p.Proto == datapath.ProtoTCP && p.SrcAddrPort() == a.src && p.DstAddrPort() == a.dst
}
