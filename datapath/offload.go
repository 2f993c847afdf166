package datapath

// GSO super-packets
//
// An offload-capable device (a TUN opened with IFF_VNET_HDR and
// TUNSETOFFLOAD) carries TCP super-packets of up to 64 KiB: one IP header,
// one TCP header, and the payload of many MSS-sized segments. Each packet,
// in both directions, comes with a virtio-net header (struct virtio_net_hdr)
// in the VirtioNetHdrLen bytes just before offset, the Device contract's
// scratch space. A device says it works this way by implementing Offloader
// with a GSOMaxSize above zero; the engine then
//
//   - counts a super-packet as the segments it stands for (meters: packets
//     = segments, bytes = the sum of the segments' IP lengths), so that a
//     meter reads the same whether the kernel segments or not;
//   - looks its flow up once and rewrites its ToS once: the kernel copies the
//     IP header, ToS included, into every segment it cuts;
//   - keeps the header with its packet when it compacts a batch.
//
// A writer that has no header to give (a plain packet) leaves the bytes
// zero: a zero header means "complete packet, checksums done".

import "encoding/binary"

// VirtioNetHdrLen is the length of struct virtio_net_hdr, the header an
// offload device keeps before each packet.
const VirtioNetHdrLen = 10

// Values of VirtioNetHdr.Flags and GSOType (linux/virtio_net.h).
const (
	VirtioNetFNeedsCsum = 1 // the checksum at CsumStart+CsumOffset is partial (pseudo-header only)
	VirtioNetFDataValid = 2 // the checksum was verified
	VirtioNetGSONone    = 0
	VirtioNetGSOTCPv4   = 1
	VirtioNetGSOTCPv6   = 4
	VirtioNetGSOECN     = 0x80 // set with a TCP type: the segments carry CWR as the first did
)

// VirtioNetHdr is struct virtio_net_hdr. A TUN without TUNSETVNETLE uses
// the host's byte order for its fields.
type VirtioNetHdr struct {
	Flags      uint8
	GSOType    uint8
	HdrLen     uint16 // bytes of headers (IP + TCP) in front of the payload
	GSOSize    uint16 // payload bytes per segment (the MSS); zero without GSO
	CsumStart  uint16 // offset of the transport header
	CsumOffset uint16 // offset of the checksum field within it
}

// Decode fills h from the VirtioNetHdrLen bytes of b.
func (h *VirtioNetHdr) Decode(b []byte) {
	_ = b[VirtioNetHdrLen-1]
	h.Flags, h.GSOType = b[0], b[1]
	h.HdrLen = binary.NativeEndian.Uint16(b[2:])
	h.GSOSize = binary.NativeEndian.Uint16(b[4:])
	h.CsumStart = binary.NativeEndian.Uint16(b[6:])
	h.CsumOffset = binary.NativeEndian.Uint16(b[8:])
}

// Encode writes h into the VirtioNetHdrLen bytes of b.
func (h *VirtioNetHdr) Encode(b []byte) {
	_ = b[VirtioNetHdrLen-1]
	b[0], b[1] = h.Flags, h.GSOType
	binary.NativeEndian.PutUint16(b[2:], h.HdrLen)
	binary.NativeEndian.PutUint16(b[4:], h.GSOSize)
	binary.NativeEndian.PutUint16(b[6:], h.CsumStart)
	binary.NativeEndian.PutUint16(b[8:], h.CsumOffset)
}

// IsGSO reports whether h describes a TCP super-packet to be cut into
// GSOSize segments.
func (h *VirtioNetHdr) IsGSO() bool {
	t := h.GSOType &^ VirtioNetGSOECN
	return (t == VirtioNetGSOTCPv4 || t == VirtioNetGSOTCPv6) && h.GSOSize > 0
}

// Offloader is implemented by a Device that may carry GSO super-packets,
// and by wrappers (the engine's Ports) that pass them through.
type Offloader interface {
	// GSOMaxSize returns the largest packet, IP header included, that Read
	// may return and Write takes, or zero when the device carries only
	// packets up to its MTU. Above zero, every packet has a virtio-net
	// header in the VirtioNetHdrLen bytes before offset (offset must be at
	// least that), and Read's buffers must hold GSOMaxSize bytes after
	// offset. It is constant for a device's life.
	GSOMaxSize() int
}

// GSOMaxSize returns dev's Offloader.GSOMaxSize, or zero when dev does not
// implement Offloader.
func GSOMaxSize(dev Device) int {
	if o, ok := dev.(Offloader); ok {
		return o.GSOMaxSize()
	}
	return 0
}

// Segments returns the number of wire segments the parsed packet p stands
// for and their total IP length, given the virtio-net header hdr (the
// VirtioNetHdrLen bytes before the packet): 1 and p.Len for a plain packet,
// ceil(payload / GSOSize) and the segments' summed lengths for a TCP
// super-packet. A header that does not fit the packet (no TCP, a header
// length past the end) counts it as one packet.
func Segments(hdr []byte, b []byte, p *Packet) (segs int, bytes int) {
	if len(hdr) < VirtioNetHdrLen || hdr[1]&^VirtioNetGSOECN == VirtioNetGSONone {
		return 1, p.Len
	}
	gsoSize := int(binary.NativeEndian.Uint16(hdr[4:]))
	if gsoSize == 0 || p.Proto != ProtoTCP || p.NonFirstFragment || p.L4Off+13 > p.Len {
		return 1, p.Len
	}
	hl := p.L4Off + int(b[p.L4Off+12]>>4)*4
	payload := p.Len - hl
	if payload <= gsoSize {
		return 1, p.Len
	}
	segs = (payload + gsoSize - 1) / gsoSize
	return segs, payload + segs*hl
}

// addSegs adds one packet that stands for segs segments of n bytes in all,
// payload of them transport payload (a super-packet's payload is the sum of
// its segments').
func (r *meterRun) addSegs(row, target int32, segs, n, payload int) {
	r.add(row, target, n, payload)
	r.packets += uint64(segs - 1)
}

// gsoHdr returns the virtio-net header bytes before offset in buf when the
// device d carries them, else nil.
func gsoHdr(gso bool, buf []byte, offset int) []byte {
	if !gso {
		return nil
	}
	return buf[offset-VirtioNetHdrLen : offset]
}

// offloads reports whether dev carries virtio-net headers at this offset.
func offloads(dev Device, offset int) bool {
	return offset >= VirtioNetHdrLen && GSOMaxSize(dev) > 0
}

// GSOMaxSize implements Offloader: the inner device's.
func (p *Port) GSOMaxSize() int { return GSOMaxSize(p.inner) }

// GSOMaxSize implements Offloader: the inner device's.
func (e *Engine) GSOMaxSize() int { return GSOMaxSize(e.inner) }
