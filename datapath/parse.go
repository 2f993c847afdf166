package datapath

// Parse flow
//
//	version nibble ─┬─ 4: IHL, total length, fragment offset/MF ─┐
//	                └─ 6: payload length, extension-header chain ─┤ (hop-by-hop, routing,
//	                                                              │  fragment, destination
//	                                                              │  options, AH; ≤ 8 headers)
//	        non-first fragment: stop, no L4 header ◄──────────────┤
//	        L4: TCP (ports, flags, data offset), UDP (ports), ICMP/ICMPv6 (type, code)
//
// Parse reads a raw IP datagram into a Packet value: no allocation, no
// copies of payload, every length checked against the buffer before it is
// read. A packet it cannot use returns a DropReason other than DropNone and
// the caller drops and counts it. Parse does not verify checksums: the stack
// behind the datapath does, and the ToS rewrite keeps a correct checksum
// correct.

import (
	"encoding/binary"
	"net/netip"
)

// IP protocol numbers the parser knows.
const (
	ProtoICMP   = 1
	ProtoTCP    = 6
	ProtoUDP    = 17
	ProtoICMPv6 = 58

	ipv6HopByHop = 0
	ipv6Routing  = 43
	ipv6Fragment = 44
	ipv6AH       = 51
	ipv6NoNext   = 59
	ipv6DstOpts  = 60
)

// TCP flag bits, as in the TCP header's flags byte.
const (
	TCPFin = 1 << 0
	TCPSyn = 1 << 1
	TCPRst = 1 << 2
	TCPPsh = 1 << 3
	TCPAck = 1 << 4
	TCPUrg = 1 << 5
	TCPEce = 1 << 6
	TCPCwr = 1 << 7
)

// MaxExtHeaders bounds the IPv6 extension-header chain Parse follows; a
// longer chain is dropped as DropExtChain.
const MaxExtHeaders = 8

// DropReason says why Parse rejected a packet; DropNone means it did not.
type DropReason uint8

// The reasons Parse rejects a packet.
const (
	DropNone          DropReason = iota
	DropTruncated                // shorter than a header it announces
	DropBadVersion               // version nibble neither 4 nor 6
	DropBadIHL                   // IPv4 header length below 20 bytes
	DropBadLength                // IP total/payload length inconsistent
	DropBadL4                    // TCP data offset below 20 bytes
	DropExtChain                 // IPv6 extension chain too long or misplaced
	DropUnsupported              // IPv6 jumbogram
	DropBadIPChecksum            // IPv4 header checksum wrong
	DropTinyFragment             // a first fragment too short for its transport header, or an IPv4 TCP fragment at offset 8 (RFC 1858)
	numDropReasons
)

var dropReasonNames = [numDropReasons]string{
	"none", "truncated", "bad_version", "bad_ihl", "bad_length", "bad_l4", "ext_chain", "unsupported",
	"bad_ip_checksum", "tiny_fragment",
}

// String returns the reason's metric label ("truncated", "bad_ihl", …).
func (r DropReason) String() string {
	if r < numDropReasons {
		return dropReasonNames[r]
	}
	return "unknown"
}

// Packet is what Parse learns about one IP datagram. It is a plain value:
// the parser fills one per packet in place, and it holds no reference to
// the buffer.
type Packet struct {
	// Src and Dst are the addresses, IPv4 ones IPv4-mapped
	// (::ffff:a.b.c.d) so that both versions share one layout; SrcAddr and
	// DstAddr return them as netip.Addr.
	Src, Dst [16]byte
	// Len is the datagram's length from its IP header (total length, or
	// 40 + payload length); bytes after it in the buffer are padding.
	Len int
	// L4Off is the offset of the transport header: after the IPv4 options
	// or the IPv6 extension headers. For a non-first fragment it is the
	// offset of the fragment's data.
	L4Off int
	// SrcPort and DstPort are the TCP or UDP ports; zero otherwise.
	SrcPort, DstPort uint16
	// Version is 4 or 6.
	Version uint8
	// Proto is the transport protocol: the IPv4 protocol field, or the
	// last IPv6 next-header value.
	Proto uint8
	// TOS is the IPv4 ToS byte or the IPv6 traffic class.
	TOS uint8
	// IPID is the IPv4 header's identification field; zero for IPv6 (its
	// fragment header's identification is not read). The passive loss
	// tracker reads it (ipid.go).
	IPID uint16
	// TCPFlags holds the TCP flag bits (TCPSyn, …) for TCP.
	TCPFlags uint8
	// ICMPType and ICMPCode are set for ICMP and ICMPv6.
	ICMPType, ICMPCode uint8
	// Fragment is set for any fragment; NonFirstFragment for those with a
	// non-zero offset, which carry no transport header (ports are zero).
	Fragment, NonFirstFragment bool
}

// SrcAddr returns the source address (an IPv4 one unmapped).
func (p *Packet) SrcAddr() netip.Addr { return p.addr(p.Src) }

// DstAddr returns the destination address (an IPv4 one unmapped).
func (p *Packet) DstAddr() netip.Addr { return p.addr(p.Dst) }

// addr is a stored address of p: unmapped for IPv4, as it is for IPv6 (an
// IPv6 packet from ::ffff:198.18.0.1 stays IPv6, as gVisor reads it).
func (p *Packet) addr(a [16]byte) netip.Addr {
	if p.Version == 6 {
		return netip.AddrFrom16(a)
	}
	return addrFrom16(a)
}

// SrcAddrPort returns the source address and port.
func (p *Packet) SrcAddrPort() netip.AddrPort { return netip.AddrPortFrom(p.SrcAddr(), p.SrcPort) }

// DstAddrPort returns the destination address and port.
func (p *Packet) DstAddrPort() netip.AddrPort { return netip.AddrPortFrom(p.DstAddr(), p.DstPort) }

// addrFrom16 turns a stored address back into a netip.Addr, IPv4-mapped
// ones into IPv4.
func addrFrom16(a [16]byte) netip.Addr { return netip.AddrFrom16(a).Unmap() }

// put4 stores an IPv4 address IPv4-mapped.
func put4(dst *[16]byte, src []byte) {
	binary.LittleEndian.PutUint64(dst[0:8], 0)
	binary.LittleEndian.PutUint32(dst[8:12], 0xffff0000)
	copy(dst[12:16], src[:4])
}

// Parse parses the IP datagram b into p and returns DropNone, or the reason
// the packet must be dropped (p is then partially filled). It never
// allocates and never panics, whatever b holds.
func Parse(b []byte, p *Packet) DropReason {
	*p = Packet{}
	if len(b) < 1 {
		return DropTruncated
	}
	switch b[0] >> 4 {
	case 4:
		return parse4(b, p)
	case 6:
		return parse6(b, p)
	}
	return DropBadVersion
}

func parse4(b []byte, p *Packet) DropReason {
	if len(b) < 20 {
		return DropTruncated
	}
	ihl := int(b[0]&0x0f) * 4
	if ihl < 20 {
		return DropBadIHL
	}
	total := int(binary.BigEndian.Uint16(b[2:4]))
	if total < ihl {
		return DropBadLength
	}
	if total > len(b) || ihl > len(b) {
		return DropTruncated
	}
	// The stack would drop it too, but counted only as malformed.
	if !ipv4ChecksumOK(b[:ihl]) {
		return DropBadIPChecksum
	}
	p.Version = 4
	p.TOS = b[1]
	p.IPID = binary.BigEndian.Uint16(b[4:6])
	p.Proto = b[9]
	p.Len = total
	p.L4Off = ihl
	put4(&p.Src, b[12:16])
	put4(&p.Dst, b[16:20])
	frag := binary.BigEndian.Uint16(b[6:8])
	if frag&0x3fff != 0 { // MF or an offset
		p.Fragment = true
		if off := frag & 0x1fff; off != 0 {
			// Offset 1 (8 bytes) rewrites a TCP header's flags: RFC
			// 1858's overlapping-fragment attack.
			if off == 1 && p.Proto == ProtoTCP {
				return DropTinyFragment
			}
			p.NonFirstFragment = true
			return DropNone
		}
		return tinyIfTruncated(parseL4(b[ihl:total], p))
	}
	return parseL4(b[ihl:total], p)
}

// tinyIfTruncated names a first fragment whose transport header does not
// fit a tiny fragment (RFC 1858, RFC 7112 for IPv6).
func tinyIfTruncated(r DropReason) DropReason {
	if r == DropTruncated {
		return DropTinyFragment
	}
	return r
}

// ipv4ChecksumOK verifies an IPv4 header's checksum: 10 to 30 16-bit
// words, no allocation.
func ipv4ChecksumOK(h []byte) bool {
	var s uint32
	for i := 0; i+1 < len(h); i += 2 {
		s += uint32(h[i])<<8 | uint32(h[i+1])
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return s == 0xffff
}

func parse6(b []byte, p *Packet) DropReason {
	if len(b) < 40 {
		return DropTruncated
	}
	payload := int(binary.BigEndian.Uint16(b[4:6]))
	next := b[6]
	if payload == 0 && next == ipv6HopByHop {
		return DropUnsupported // a jumbogram; nothing weir serves sends one
	}
	total := 40 + payload
	if total > len(b) {
		return DropTruncated
	}
	p.Version = 6
	p.TOS = b[0]<<4 | b[1]>>4
	p.Len = total
	p.Src = [16]byte(b[8:24])
	p.Dst = [16]byte(b[24:40])
	off := 40
	for i := 0; ; i++ {
		switch next {
		case ipv6HopByHop, ipv6Routing, ipv6DstOpts, ipv6AH, ipv6Fragment:
		default:
			p.Proto = next
			p.L4Off = off
			if next == ipv6NoNext {
				return DropNone
			}
			if p.Fragment {
				return tinyIfTruncated(parseL4(b[off:total], p))
			}
			return parseL4(b[off:total], p)
		}
		if i == MaxExtHeaders {
			return DropExtChain
		}
		if next == ipv6HopByHop && i != 0 {
			return DropExtChain // hop-by-hop must come first (RFC 8200 4.1)
		}
		if off+8 > total {
			return DropTruncated
		}
		h := b[off:total]
		var hlen int
		switch next {
		case ipv6Fragment:
			hlen = 8
			p.Fragment = true
			if binary.BigEndian.Uint16(h[2:4])&0xfff8 != 0 {
				p.NonFirstFragment = true
				p.Proto = h[0]
				p.L4Off = off + 8
				return DropNone
			}
		case ipv6AH:
			hlen = (int(h[1]) + 2) * 4
		default:
			hlen = (int(h[1]) + 1) * 8
		}
		if off+hlen > total {
			return DropTruncated
		}
		next = h[0]
		off += hlen
	}
}

// parseL4 reads the transport header at the start of b, which ends at the
// IP datagram's end.
func parseL4(b []byte, p *Packet) DropReason {
	switch p.Proto {
	case ProtoTCP:
		if len(b) < 20 {
			return DropTruncated
		}
		doff := int(b[12]>>4) * 4
		if doff < 20 {
			return DropBadL4
		}
		if doff > len(b) {
			return DropTruncated
		}
		p.SrcPort = binary.BigEndian.Uint16(b[0:2])
		p.DstPort = binary.BigEndian.Uint16(b[2:4])
		p.TCPFlags = b[13]
	case ProtoUDP:
		if len(b) < 8 {
			return DropTruncated
		}
		p.SrcPort = binary.BigEndian.Uint16(b[0:2])
		p.DstPort = binary.BigEndian.Uint16(b[2:4])
	case ProtoICMP, ProtoICMPv6:
		if len(b) < 4 {
			return DropTruncated
		}
		p.ICMPType = b[0]
		p.ICMPCode = b[1]
	}
	return DropNone
}
