package hostcap

import (
	"math/rand"
	"net"
	"net/netip"
	"runtime"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// bare is a Capture without a socket, for segment's rules.
func bare(targets ...netip.AddrPort) *Capture {
	c := &Capture{flows: map[flowKey]*flow{}, scratch: make([]byte, maxIPv4+64),
		opts: Options{MaxFlows: 4, TargetMinRTO: 200e6, OwnMinRTO: 200e6}}
	set := map[netip.AddrPort]struct{}{}
	for _, t := range targets {
		set[t] = struct{}{}
	}
	c.targets.Store(&set)
	return c
}

func seg(t *testing.T, src, dst netip.AddrPort, seq uint32, syn bool, payload int) []byte {
	t.Helper()
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: net.IP(src.Addr().AsSlice()), DstIP: net.IP(dst.Addr().AsSlice())}
	tc := &layers.TCP{SrcPort: layers.TCPPort(src.Port()), DstPort: layers.TCPPort(dst.Port()), Seq: seq, SYN: syn, ACK: !syn, Window: 1000}
	tc.SetNetworkLayerForChecksum(ip)
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ip, tc, gopacket.Payload(make([]byte, payload))); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	return b[:min(len(b), SnapLen-14)] // cut as the filter cuts it
}

// TestSegmentDirections: the packet type and the addresses decide the
// direction; each copy of a segment counts once: weir's toward a target
// where it leaves (outgoing), the target's where it arrives. A target on
// the host itself is seen both ways and counted once each.
func TestSegmentDirections(t *testing.T) {
	local := netip.MustParseAddrPort("198.18.2.1:40000")
	target := netip.MustParseAddrPort("198.18.3.1:80")
	other := netip.MustParseAddrPort("198.18.3.1:81")
	c := bare(target)
	vh := make([]byte, 10)
	c.segment(seg(t, local, target, 100, true, 0), vh, true, 1)
	c.segment(seg(t, local, target, 100, true, 0), vh, false, 2) // the same SYN arriving (loopback): not again
	c.segment(seg(t, target, local, 5000, true, 0), vh, false, 3)
	for i := 0; i < 3; i++ {
		c.segment(seg(t, local, target, 101+uint32(i)*100, false, 100), vh, true, int64(10+i))
		c.segment(seg(t, local, target, 101+uint32(i)*100, false, 100), vh, false, int64(10+i)) // loopback copy
		c.segment(seg(t, target, local, 5001+uint32(i)*1000, false, 1000), vh, false, int64(20+i))
		c.segment(seg(t, target, local, 5001+uint32(i)*1000, false, 1000), vh, true, int64(20+i)) // the target's own copy leaving
	}
	// A resend of weir's second segment, 300 ms later.
	c.segment(seg(t, local, target, 201, false, 100), vh, true, 300e6)
	c.segment(seg(t, local, other, 1, false, 100), vh, true, 400e6) // not a target
	s := c.Segments(local, target)
	if s == nil {
		t.Fatal("flow not tracked")
	}
	to, from := s.ToTarget(), s.FromTarget()
	if to.DataSegments != 4 || to.Retransmitted != 1 || from.DataSegments != 3 || from.Retransmitted != 0 {
		t.Errorf("to_target %+v, from_target %+v; want 4 data, 1 resent; 3 data, none resent", to, from)
	}
	if c.Segments(local, other) != nil || len(c.flows) != 1 {
		t.Errorf("a non-target flow was tracked: %d flows", len(c.flows))
	}
	// MaxFlows bounds the table; the packets of a flow beyond it are
	// counted as refused.
	for p := uint16(1); p <= 5; p++ {
		c.segment(seg(t, netip.AddrPortFrom(local.Addr(), 50000+p), target, 1, true, 0), vh, true, 500e6)
	}
	if len(c.flows) != 4 || c.refused.Load() != 2 {
		t.Errorf("table of 4: %d flows, %d refused; want 4, 2", len(c.flows), c.refused.Load())
	}
}

// TestSegmentBadInput: garbage, truncated and odd packets are counted
// as malformed, never a panic.
func TestSegmentBadInput(t *testing.T) {
	target := netip.MustParseAddrPort("198.18.3.1:80")
	c := bare(target)
	good := seg(t, netip.MustParseAddrPort("198.18.2.1:40000"), target, 1, false, 100)
	r := rand.New(rand.NewSource(1))
	vh := make([]byte, 10)
	for i := 0; i < 20000; i++ {
		b := append([]byte(nil), good...)
		switch i % 3 {
		case 0:
			b = b[:r.Intn(len(b)+1)]
		case 1:
			b[r.Intn(len(b))] = byte(r.Intn(256))
			b[r.Intn(len(b))] = byte(r.Intn(256))
		default:
			b = make([]byte, r.Intn(200))
			r.Read(b)
		}
		r.Read(vh)
		c.segment(b, vh, r.Intn(2) == 0, int64(i))
	}
	if c.malformed.Load() == 0 {
		t.Error("no malformed packet counted")
	}
	if _, ok := linkLen(1, []byte{1, 2, 3}); ok {
		t.Error("a short Ethernet header accepted")
	}
	if off, ok := linkLen(1, append(make([]byte, 12), 0x81, 0x00, 0, 0, 0x08, 0x00)); !ok || off != 18 {
		t.Errorf("a VLAN-tagged frame: offset %d %v, want 18", off, ok)
	}
	if _, ok := stamp([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0}); ok {
		t.Error("a broken control message read as a timestamp")
	}
}

// flagged is a segment with the given flags (ACK always set).
func flagged(t *testing.T, src, dst netip.AddrPort, seq uint32, fin, rst bool) []byte {
	t.Helper()
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: net.IP(src.Addr().AsSlice()), DstIP: net.IP(dst.Addr().AsSlice())}
	tc := &layers.TCP{SrcPort: layers.TCPPort(src.Port()), DstPort: layers.TCPPort(dst.Port()), Seq: seq, ACK: true, FIN: fin, RST: rst, Window: 1000}
	tc.SetNetworkLayerForChecksum(ip)
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ip, tc); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestSweepLinger: a finished flow (a FIN each way, or a RST) leaves the
// table doneLinger after its last packet; one with a single FIN (the
// connection half-open) stays closedLinger, an open one the idle timeout.
// The counts stay readable until then.
func TestSweepLinger(t *testing.T) {
	target := netip.MustParseAddrPort("198.18.3.1:80")
	c := bare(target)
	c.opts.IdleTimeout = DefaultIdleTimeout
	vh := make([]byte, 10)
	port := func(p uint16) netip.AddrPort { return netip.AddrPortFrom(netip.MustParseAddr("198.18.2.1"), p) }
	both, half, reset, open := port(40001), port(40002), port(40003), port(40004)
	for _, l := range []netip.AddrPort{both, half, reset, open} {
		c.segment(seg(t, l, target, 100, true, 0), vh, true, 1)
		c.segment(seg(t, target, l, 5000, true, 0), vh, false, 2)
		c.segment(seg(t, l, target, 101, false, 100), vh, true, 3)
	}
	const at = int64(10e6)
	c.segment(flagged(t, both, target, 201, true, false), vh, true, at)
	c.segment(flagged(t, target, both, 5001, true, false), vh, false, at)
	c.segment(flagged(t, half, target, 201, true, false), vh, true, at)
	c.segment(flagged(t, target, reset, 5001, false, true), vh, false, at)
	c.sweep(at + int64(doneLinger) - 1)
	for _, l := range []netip.AddrPort{both, half, reset, open} {
		if s := c.Segments(l, target); s == nil || s.ToTarget().DataSegments != 1 {
			t.Fatalf("%v: gone or miscounted before doneLinger: %v", l, s)
		}
	}
	c.sweep(at + int64(doneLinger) + 1)
	if c.Segments(both, target) != nil || c.Segments(reset, target) != nil {
		t.Error("a finished flow outlived doneLinger")
	}
	if c.Segments(half, target) == nil || c.Segments(open, target) == nil {
		t.Fatal("a half-closed or open flow went with the finished ones")
	}
	c.sweep(at + int64(closedLinger) + 1)
	if c.Segments(half, target) != nil || c.Segments(open, target) == nil {
		t.Errorf("after closedLinger: half-closed kept %v, open gone %v", c.Segments(half, target) != nil, c.Segments(open, target) == nil)
	}
	c.sweep(3 + int64(DefaultIdleTimeout) + 1)
	if len(c.flows) != 0 {
		t.Errorf("%d flows after the idle timeout", len(c.flows))
	}
}

// TestReleaseDropsFlow: a released flow leaves at dropReleased; the
// packets of its tail that carry no data (the last ACK, a late FIN or RST)
// make no new flow, a data segment met mid-stream does, and so does a new
// SYN on the same ports.
func TestReleaseDropsFlow(t *testing.T) {
	target := netip.MustParseAddrPort("198.18.3.1:80")
	local := netip.MustParseAddrPort("198.18.2.1:40001")
	c := bare(target)
	vh := make([]byte, 10)
	c.segment(seg(t, local, target, 100, true, 0), vh, true, 1)
	c.segment(seg(t, target, local, 5000, true, 0), vh, false, 2)
	c.segment(seg(t, local, target, 101, false, 100), vh, true, 3)
	c.segment(flagged(t, target, local, 5001, true, false), vh, false, 4)
	for p := range uint16(1000) { // flows never tracked: nothing queued
		c.Release(netip.AddrPortFrom(local.Addr(), 50000+p), target)
	}
	if len(c.released) != 0 {
		t.Fatalf("%d untracked flows queued for release", len(c.released))
	}
	c.Release(local, target)
	if c.Segments(local, target) == nil {
		t.Fatal("dropped before the reader's batch ended")
	}
	c.dropReleased()
	if c.Segments(local, target) != nil || len(c.flows) != 0 {
		t.Fatal("a released flow stayed")
	}
	c.segment(flagged(t, local, target, 201, true, false), vh, true, 5)    // weir's FIN, late
	c.segment(flagged(t, target, local, 5002, false, false), vh, false, 6) // the last ACK
	c.segment(flagged(t, target, local, 5002, false, true), vh, false, 7)  // a RST
	if len(c.flows) != 0 {
		t.Fatalf("a released flow's tail made %d new flows", len(c.flows))
	}
	c.segment(seg(t, target, local, 5002, false, 10), vh, false, 8) // data: a flow met mid-stream
	if s := c.Segments(local, target); s == nil || s.FromTarget().DataSegments != 1 {
		t.Fatalf("a data segment met mid-stream: %v, want a flow with it", s)
	}
	c.Release(local, target)
	c.dropReleased()
	c.segment(seg(t, local, target, 9000, true, 0), vh, true, 9) // the ports reused
	if c.Segments(local, target) == nil {
		t.Fatal("a new SYN on a released flow's ports made no flow")
	}
}

// TestForwardedAndShrink: with the host's addresses known, a flow whose
// weir end is not one of them (forwarded traffic) is not tracked but
// counted; and once a burst of flows has gone, sweep makes the map anew.
func TestForwardedAndShrink(t *testing.T) {
	target := netip.MustParseAddrPort("198.18.3.1:80")
	own := netip.MustParseAddr("198.18.2.1")
	c := bare(target)
	c.opts.MaxFlows = 1 << 16
	c.opts.IdleTimeout = DefaultIdleTimeout
	c.locals.Store(&map[netip.Addr]struct{}{own: {}})
	vh := make([]byte, 10)
	other := netip.MustParseAddrPort("198.19.7.7:40000")
	c.segment(seg(t, other, target, 100, true, 0), vh, true, 1)
	c.segment(seg(t, target, other, 5000, true, 0), vh, false, 2)
	if len(c.flows) != 0 || c.forwarded.Load() != 2 {
		t.Fatalf("forwarded: %d flows, %d counted; want none tracked, 2 counted", len(c.flows), c.forwarded.Load())
	}
	live := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	base := live()
	for p := range uint16(40000) {
		c.segment(seg(t, netip.AddrPortFrom(own, 10000+p), target, 1, true, 0), vh, true, 3)
	}
	if len(c.flows) != 40000 || c.high != 40000 {
		t.Fatalf("%d flows, high %d; want 40000", len(c.flows), c.high)
	}
	for p := range uint16(39500) {
		c.Release(netip.AddrPortFrom(own, 10000+p), target)
	}
	c.dropReleased()
	c.sweep(4)
	// 500 flows hold some 250 KB; the map of 40 000, kept, over 3 MB.
	if grown := int64(live()) - int64(base); len(c.flows) != 500 || c.high != 500 || grown > 1<<20 {
		t.Errorf("after the burst: %d flows, high %d, the heap %d KiB above its start; want 500, the map made anew (< 1 MiB)", len(c.flows), c.high, grown>>10)
	}
	if c.Segments(netip.AddrPortFrom(own, 49999), target) == nil {
		t.Error("a flow kept was lost making the map anew")
	}
}
