package netstack

// GSO through the stack
//
//	egress:  TCP endpoint (host GSO: payload up to GSOMaxSize, checksum
//	         partial) ──► WritePackets ──► txHdr: virtio-net header from
//	         pkt.GSOOptions into the headroom ──► device (the kernel cuts
//	         the segments and finishes the checksums)
//	ingress: device Read (super-packets the kernel did not cut, with their
//	         header) ──► rxChecksumDone: the stack skips verification of a
//	         checksum the kernel left partial or checked ──► one
//	         DeliverNetworkPacket per super-packet (GRO for free: the kernel
//	         never segmented what its own TCP or its GRO built)
//
// Only a device whose datapath.GSOMaxSize is above zero turns this on;
// every other link stays a plain MTU-sized one.

import (
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"weir/datapath"
)

var _ stack.GSOEndpoint = (*linkEndpoint)(nil)

// GSOMaxSize implements stack.GSOEndpoint: the device's largest
// super-packet, zero without offload.
func (e *linkEndpoint) GSOMaxSize() uint32 { return uint32(e.gsoMax) }

// SupportedGSO implements stack.GSOEndpoint: host GSO (the kernel behind
// the device segments) when the device offloads, none otherwise.
func (e *linkEndpoint) SupportedGSO() stack.SupportedGSO {
	if e.gsoMax > 0 {
		return stack.HostGSOSupported
	}
	return stack.GSONotSupported
}

// rxHdr returns the virtio-net header before the packet in buf (headroom
// bytes, then the packet), or nil on a link without offload.
func (e *linkEndpoint) rxHdr(buf []byte) []byte {
	if e.gsoMax == 0 {
		return nil
	}
	return buf[e.headroom-datapath.VirtioNetHdrLen : e.headroom]
}

// checksumOK verifies the TCP or UDP checksum of a raw IP packet the
// kernel sent complete (no partial-checksum or verified flag): the stack,
// told the link offloads receive checksums, skips it. Other protocols and
// fragments pass unchecked; an IPv4 UDP checksum of zero means none. It
// does not allocate.
func checksumOK(pkt []byte) bool {
	var p datapath.Packet
	if datapath.Parse(pkt, &p) != datapath.DropNone || p.Fragment {
		return true
	}
	var proto tcpip.TransportProtocolNumber
	switch p.Proto {
	case datapath.ProtoTCP:
		proto = header.TCPProtocolNumber
	case datapath.ProtoUDP:
		proto = header.UDPProtocolNumber
		if p.Version == 4 && p.L4Off+8 <= p.Len && pkt[p.L4Off+6] == 0 && pkt[p.L4Off+7] == 0 {
			return true
		}
	default:
		return true
	}
	l4 := pkt[p.L4Off:p.Len]
	var src, dst tcpip.Address
	if p.Version == 4 {
		src, dst = tcpip.AddrFrom4Slice(pkt[12:16]), tcpip.AddrFrom4Slice(pkt[16:20])
	} else {
		src, dst = tcpip.AddrFrom16Slice(pkt[8:24]), tcpip.AddrFrom16Slice(pkt[24:40])
	}
	sum := header.PseudoHeaderChecksum(proto, src, dst, uint16(len(l4)))
	return checksum.Checksum(l4, sum) == 0xffff
}

// rxChecksumDone reports whether the stack may skip checksum verification
// of an inbound packet with virtio-net header hdr: the kernel sent it with
// a partial checksum (its own TCP with checksum offload: there is no full
// checksum to verify) or had verified it.
func rxChecksumDone(hdr []byte) bool {
	return len(hdr) >= datapath.VirtioNetHdrLen && hdr[0]&(datapath.VirtioNetFNeedsCsum|datapath.VirtioNetFDataValid) != 0
}

// txHdr writes the virtio-net header of pkt into the last
// VirtioNetHdrLen bytes of head (the headroom): zero for a plain packet,
// checksum and segmentation requests for one the stack built for host GSO,
// as gVisor's fdbased endpoint does for a TAP. A headroom too short for a
// header is left alone (a link without offload and without headroom).
func (e *linkEndpoint) txHdr(head []byte, pkt *stack.PacketBuffer) {
	if len(head) < datapath.VirtioNetHdrLen {
		return
	}
	head = head[len(head)-datapath.VirtioNetHdrLen:]
	var h datapath.VirtioNetHdr
	if e.gsoMax > 0 && pkt.GSOOptions.Type != stack.GSONone {
		l3 := uint16(len(pkt.NetworkHeader().Slice()))
		h.HdrLen = uint16(pkt.HeaderSize())
		if pkt.GSOOptions.NeedsCsum {
			h.Flags = datapath.VirtioNetFNeedsCsum
			h.CsumStart = l3
			h.CsumOffset = pkt.GSOOptions.CsumOffset
		}
		if pkt.Data().Size() > int(pkt.GSOOptions.MSS) {
			switch pkt.GSOOptions.Type {
			case stack.GSOTCPv4:
				h.GSOType = datapath.VirtioNetGSOTCPv4
			case stack.GSOTCPv6:
				h.GSOType = datapath.VirtioNetGSOTCPv6
			}
			if h.GSOType != datapath.VirtioNetGSONone {
				h.GSOSize = pkt.GSOOptions.MSS
			}
		}
	}
	h.Encode(head)
}

// getBuf returns a pooled buffer for a packet of size bytes: an MTU-sized
// one, or a super-packet one.
func (e *linkEndpoint) getBuf(size int) *[]byte {
	if size > int(e.mtu) {
		return e.bigPool.Get().(*[]byte)
	}
	return e.bufPool.Get().(*[]byte)
}

// putBuf returns a buffer from getBuf to its pool.
func (e *linkEndpoint) putBuf(b *[]byte) {
	*b = (*b)[:cap(*b)]
	if len(*b) > e.headroom+int(e.mtu) {
		e.bigPool.Put(b)
		return
	}
	e.bufPool.Put(b)
}
