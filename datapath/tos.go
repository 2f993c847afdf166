package datapath

// ToS rewrite flow
//
//	IPv4: old word = bytes 0-1 (version/IHL, ToS) ─► write the new ToS ─►
//	      checksum' = ~(~checksum + ~old word + new word)   (RFC 1624, eqn. 3)
//	IPv6: traffic class = low nibble of byte 0, high nibble of byte 1;
//	      no header checksum, and the transport pseudo-header does not cover it.
//
// The two ECN bits (the low two bits of the ToS byte) are kept: marking sets
// the DSCP, and overwriting ECN would break congestion signalling.

import "encoding/binary"

// ecnMask selects the ECN bits of a ToS byte or traffic class.
const ecnMask = 0x03

// SetTOS writes tos into the IP header at the start of b, keeping the
// packet's ECN bits, and updates the IPv4 header checksum incrementally. It
// reports whether the byte changed. b must hold at least the fixed IP header
// (a packet Parse accepted does); a shorter b or an unknown version is left
// alone. It does not allocate.
func SetTOS(b []byte, tos uint8) bool {
	if len(b) < 1 {
		return false
	}
	switch b[0] >> 4 {
	case 4:
		if len(b) < 20 {
			return false
		}
		old := b[1]
		nv := tos&^ecnMask | old&ecnMask
		if nv == old {
			return false
		}
		m := binary.BigEndian.Uint16(b[0:2])
		b[1] = nv
		m2 := binary.BigEndian.Uint16(b[0:2])
		hc := binary.BigEndian.Uint16(b[10:12])
		binary.BigEndian.PutUint16(b[10:12], csumUpdate(hc, m, m2))
		return true
	case 6:
		if len(b) < 40 {
			return false
		}
		old := b[0]<<4 | b[1]>>4
		nv := tos&^ecnMask | old&ecnMask
		if nv == old {
			return false
		}
		b[0] = b[0]&0xf0 | nv>>4
		b[1] = b[1]&0x0f | nv<<4
		return true
	}
	return false
}

// csumUpdate returns the Internet checksum hc updated for one 16-bit word
// changing from m to m2: HC' = ~(~HC + ~m + m'), RFC 1624 eqn. 3, in one's
// complement arithmetic.
func csumUpdate(hc, m, m2 uint16) uint16 {
	s := uint32(^hc) + uint32(^m) + uint32(m2)
	s = s&0xffff + s>>16
	s = s&0xffff + s>>16
	return ^uint16(s)
}

// IPv4HeaderChecksum computes the header checksum of the IPv4 header at the
// start of b (its IHL bytes) from scratch, treating the checksum field as
// zero. Tests and tools use it to check the incremental update.
func IPv4HeaderChecksum(b []byte) uint16 {
	ihl := int(b[0]&0x0f) * 4
	if ihl < 20 || ihl > len(b) {
		return 0
	}
	var s uint32
	for i := 0; i < ihl; i += 2 {
		if i == 10 {
			continue
		}
		s += uint32(binary.BigEndian.Uint16(b[i : i+2]))
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}
