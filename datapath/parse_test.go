package datapath

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

func cat(bs ...[]byte) []byte { return bytes.Join(bs, nil) }

func TestParse(t *testing.T) {
	a16 := func(s string) [16]byte { return netip.MustParseAddr(s).As16() }
	c4, v4 := a16("198.18.0.2"), a16("198.18.0.1")
	c6, v6 := a16("fd00::2"), a16("fd00::1")

	withOpts := func() []byte {
		ip := ip4(client4, vip4, layers.IPProtocolTCP)
		ip.Options = []layers.IPv4Option{{OptionType: 1}, {OptionType: 1}, {OptionType: 1}, {OptionType: 0}}
		tc := tcp(40000, 80)
		tc.SetNetworkLayerForChecksum(ip)
		return serialize(t, ip, tc)
	}
	frag4 := func(offset uint16, mf bool, l4 gopacket.SerializableLayer) []byte {
		ip := ip4(client4, vip4, layers.IPProtocolUDP)
		ip.FragOffset = offset
		if mf {
			ip.Flags = layers.IPv4MoreFragments
		}
		if l4 == nil {
			return serialize(t, ip, gopacket.Payload(make([]byte, 16)))
		}
		if c, ok := l4.(*layers.UDP); ok {
			c.SetNetworkLayerForChecksum(ip)
		}
		return serialize(t, ip, l4, gopacket.Payload(make([]byte, 16)))
	}
	udp := func() *layers.UDP { return &layers.UDP{SrcPort: 5353, DstPort: 53} }

	good := []struct {
		name string
		pkt  []byte
		want Packet
	}{
		{"ipv4 tcp syn", tcp4(t, client4, vip4, 40000, 80, 0x10, true, false, 0),
			Packet{Version: 4, Proto: ProtoTCP, Src: c4, Dst: v4, SrcPort: 40000, DstPort: 80, TOS: 0x10, TCPFlags: TCPSyn, L4Off: 20, Len: 40}},
		{"ipv4 tcp payload", tcp4(t, vip4, client4, 80, 40000, 0, false, true, 100),
			Packet{Version: 4, Proto: ProtoTCP, Src: v4, Dst: c4, SrcPort: 80, DstPort: 40000, TCPFlags: TCPAck, L4Off: 20, Len: 140}},
		{"ipv4 options", withOpts(),
			Packet{Version: 4, Proto: ProtoTCP, Src: c4, Dst: v4, SrcPort: 40000, DstPort: 80, L4Off: 24, Len: 44}},
		{"ipv4 udp", func() []byte {
			ip := ip4(client4, vip4, layers.IPProtocolUDP)
			u := udp()
			u.SetNetworkLayerForChecksum(ip)
			return serialize(t, ip, u)
		}(),
			Packet{Version: 4, Proto: ProtoUDP, Src: c4, Dst: v4, SrcPort: 5353, DstPort: 53, L4Off: 20, Len: 28}},
		{"ipv4 icmp echo", serialize(t, ip4(client4, vip4, layers.IPProtocolICMPv4), &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(8, 0), Id: 7}),
			Packet{Version: 4, Proto: ProtoICMP, Src: c4, Dst: v4, ICMPType: 8, L4Off: 20, Len: 28}},
		{"ipv4 trailing padding", append(tcp4(t, client4, vip4, 1, 2, 0, false, true, 0), 0, 0, 0, 0, 0, 0),
			Packet{Version: 4, Proto: ProtoTCP, Src: c4, Dst: v4, SrcPort: 1, DstPort: 2, TCPFlags: TCPAck, L4Off: 20, Len: 40}},
		{"ipv4 first fragment", frag4(0, true, udp()),
			Packet{Version: 4, Proto: ProtoUDP, Src: c4, Dst: v4, SrcPort: 5353, DstPort: 53, L4Off: 20, Len: 44, Fragment: true}},
		{"ipv4 non-first fragment", frag4(185, false, nil),
			Packet{Version: 4, Proto: ProtoUDP, Src: c4, Dst: v4, L4Off: 20, Len: 36, Fragment: true, NonFirstFragment: true}},
		{"ipv4 unknown l4", serialize(t, ip4(client4, vip4, layers.IPProtocolGRE), gopacket.Payload{1, 2, 3}),
			Packet{Version: 4, Proto: 47, Src: c4, Dst: v4, L4Off: 20, Len: 23}},
		{"ipv6 tcp", tcp6(t, client6, vip6, 40000, 80, 0xa0, true, false, 0),
			Packet{Version: 6, Proto: ProtoTCP, Src: c6, Dst: v6, SrcPort: 40000, DstPort: 80, TOS: 0xa0, TCPFlags: TCPSyn, L4Off: 40, Len: 60}},
		{"ipv6 udp", func() []byte {
			ip := &layers.IPv6{Version: 6, NextHeader: layers.IPProtocolUDP, HopLimit: 1, SrcIP: client6, DstIP: vip6}
			u := udp()
			u.SetNetworkLayerForChecksum(ip)
			return serialize(t, ip, u)
		}(),
			Packet{Version: 6, Proto: ProtoUDP, Src: c6, Dst: v6, SrcPort: 5353, DstPort: 53, L4Off: 40, Len: 48}},
		{"ipv6 icmpv6", func() []byte {
			ip := &layers.IPv6{Version: 6, NextHeader: layers.IPProtocolICMPv6, HopLimit: 1, SrcIP: client6, DstIP: vip6}
			ic := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(128, 0)}
			ic.SetNetworkLayerForChecksum(ip)
			return serialize(t, ip, ic, gopacket.Payload{0, 1, 0, 1})
		}(),
			Packet{Version: 6, Proto: ProtoICMPv6, Src: c6, Dst: v6, ICMPType: 128, L4Off: 40, Len: 48}},
		{"ipv6 hbh routing dstopts", ext6(t, layers.IPProtocolIPv6HopByHop, cat(optHdr(43), optHdr(60), optHdr(6)), tcpRaw),
			Packet{Version: 6, Proto: ProtoTCP, Src: c6, Dst: v6, SrcPort: 40000, DstPort: 443, TCPFlags: TCPSyn, L4Off: 64, Len: 84}},
		{"ipv6 ah", ext6(t, 51, []byte{6, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1}, tcpRaw),
			Packet{Version: 6, Proto: ProtoTCP, Src: c6, Dst: v6, SrcPort: 40000, DstPort: 443, TCPFlags: TCPSyn, L4Off: 52, Len: 72}},
		{"ipv6 first fragment", ext6(t, 44, fragHdr(6, 0, true), tcpRaw),
			Packet{Version: 6, Proto: ProtoTCP, Src: c6, Dst: v6, SrcPort: 40000, DstPort: 443, TCPFlags: TCPSyn, L4Off: 48, Len: 68, Fragment: true}},
		{"ipv6 non-first fragment", ext6(t, 44, fragHdr(6, 100, false), make([]byte, 12)),
			Packet{Version: 6, Proto: ProtoTCP, Src: c6, Dst: v6, L4Off: 48, Len: 60, Fragment: true, NonFirstFragment: true}},
		{"ipv6 no next header", ext6(t, 60, optHdr(59), nil),
			Packet{Version: 6, Proto: 59, Src: c6, Dst: v6, L4Off: 48, Len: 48}},
	}
	for _, tt := range good {
		t.Run(tt.name, func(t *testing.T) {
			var p Packet
			if r := Parse(tt.pkt, &p); r != DropNone {
				t.Fatalf("Parse = %v, want none", r)
			}
			if p != tt.want {
				t.Errorf("Parse =\n  %+v\nwant\n  %+v", p, tt.want)
			}
			if got, want := p.SrcAddrPort(), netip.AddrPortFrom(netip.AddrFrom16(tt.want.Src).Unmap(), tt.want.SrcPort); got != want {
				t.Errorf("SrcAddrPort = %v, want %v", got, want)
			}
			if got := p.DstAddr(); got.Is4() != (p.Version == 4) {
				t.Errorf("DstAddr %v for version %d", got, p.Version)
			}
		})
	}

	set := func(b []byte, i int, v byte) []byte { b = append([]byte(nil), b...); b[i] = v; return b }
	v4syn := tcp4(t, client4, vip4, 40000, 80, 0, true, false, 0)
	v6syn := tcp6(t, client6, vip6, 40000, 80, 0, true, false, 0)
	var longChain []byte
	for range MaxExtHeaders {
		longChain = append(longChain, optHdr(60)...)
	}
	bad := []struct {
		name string
		pkt  []byte
		want DropReason
	}{
		{"empty", nil, DropTruncated},
		{"version 5", set(v4syn, 0, 0x55), DropBadVersion},
		{"version 0", make([]byte, 40), DropBadVersion},
		{"ipv4 short header", v4syn[:19], DropTruncated},
		{"ipv4 ihl 4", set(v4syn, 0, 0x44), DropBadIHL},
		{"ipv4 ihl past end", set(set(v4syn, 0, 0x4f), 3, 60), DropTruncated},
		{"ipv4 ihl past total", set(v4syn, 0, 0x4f), DropBadLength},
		{"ipv4 total below ihl", set(v4syn, 3, 19), DropBadLength},
		{"ipv4 total past buffer", v4syn[:39], DropTruncated},
		{"ipv4 tcp short", serialize(t, ip4(client4, vip4, layers.IPProtocolTCP), gopacket.Payload(make([]byte, 19))), DropTruncated},
		{"ipv4 tcp data offset 4", set(v4syn, 32, 0x40), DropBadL4},
		{"ipv4 tcp data offset past end", set(v4syn, 32, 0x60), DropTruncated},
		{"ipv4 udp short", serialize(t, ip4(client4, vip4, layers.IPProtocolUDP), gopacket.Payload(make([]byte, 7))), DropTruncated},
		{"ipv4 icmp short", serialize(t, ip4(client4, vip4, layers.IPProtocolICMPv4), gopacket.Payload(make([]byte, 3))), DropTruncated},
		{"ipv4 first fragment cuts tcp", func() []byte {
			ip := ip4(client4, vip4, layers.IPProtocolTCP)
			ip.Flags = layers.IPv4MoreFragments
			return serialize(t, ip, gopacket.Payload(make([]byte, 8)))
		}(), DropTinyFragment},
		{"ipv4 tcp fragment at offset 8", func() []byte {
			ip := ip4(client4, vip4, layers.IPProtocolTCP)
			ip.FragOffset = 1
			return serialize(t, ip, gopacket.Payload(make([]byte, 16)))
		}(), DropTinyFragment},
		{"ipv4 bad header checksum", func() []byte {
			b := serialize(t, ip4(client4, vip4, layers.IPProtocolTCP), gopacket.Payload(make([]byte, 20)))
			b[10] ^= 0xff
			return b
		}(), DropBadIPChecksum},
		{"ipv6 short header", v6syn[:39], DropTruncated},
		{"ipv6 payload past buffer", v6syn[:59], DropTruncated},
		{"ipv6 jumbogram", set(set(ext6(t, 0, optHdr(6), tcpRaw), 4, 0), 5, 0), DropUnsupported},
		{"ipv6 hbh not first", ext6(t, 60, cat(optHdr(0), optHdr(6)), tcpRaw), DropExtChain},
		{"ipv6 chain too long", ext6(t, 60, cat(longChain, optHdr(6)), tcpRaw), DropExtChain},
		{"ipv6 ext header past end", ext6(t, 60, []byte{6, 4, 0, 0, 0, 0, 0, 0}, nil), DropTruncated},
		{"ipv6 ext header cut", ext6(t, 60, []byte{6, 0, 0, 0}, nil), DropTruncated},
		{"ipv6 tcp short", ext6(t, 6, nil, make([]byte, 10)), DropTruncated},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			var p Packet
			if r := Parse(tt.pkt, &p); r != tt.want {
				t.Errorf("Parse = %v, want %v", r, tt.want)
			}
		})
	}
}

var tcpRaw = []byte{0x9c, 0x40, 0x01, 0xbb, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0}

func TestParseZeroAllocs(t *testing.T) {
	pkts := [][]byte{
		tcp4(t, client4, vip4, 40000, 80, 0, true, false, 0),
		tcp6(t, client6, vip6, 40000, 80, 0, true, false, 0),
		ext6(t, 0, cat(optHdr(43), fragHdr(6, 0, true)), tcpRaw),
	}
	var p Packet
	allocs := testing.AllocsPerRun(1000, func() {
		for _, b := range pkts {
			Parse(b, &p)
		}
	})
	if allocs != 0 {
		t.Errorf("Parse allocates %.1f times, want 0", allocs)
	}
}

func TestDropReasonString(t *testing.T) {
	for r := DropNone; r < numDropReasons; r++ {
		if s := r.String(); s == "" || s == "unknown" {
			t.Errorf("DropReason(%d) has no name", r)
		}
	}
	if s := numDropReasons.String(); s != "unknown" {
		t.Errorf("out-of-range reason = %q", s)
	}
}

// FuzzParse checks that Parse never panics and that what it accepts is
// consistent with the buffer.
func FuzzParse(f *testing.F) {
	f.Add(tcp4(f, client4, vip4, 40000, 80, 0, true, false, 0))
	f.Add(tcp6(f, client6, vip6, 40000, 80, 0, true, false, 10))
	f.Add(ext6(f, 0, cat(optHdr(43), optHdr(44), fragHdr(17, 3, true)), make([]byte, 8)))
	f.Add([]byte{0x45})
	f.Fuzz(func(t *testing.T, b []byte) {
		var p Packet
		if Parse(b, &p) != DropNone {
			return
		}
		if p.Len > len(b) || p.L4Off > p.Len {
			t.Fatalf("accepted packet with Len %d, L4Off %d in %d bytes", p.Len, p.L4Off, len(b))
		}
		if p.Version != 4 && p.Version != 6 {
			t.Fatalf("accepted version %d", p.Version)
		}
		if p.NonFirstFragment && (p.SrcPort != 0 || p.DstPort != 0) {
			t.Fatalf("non-first fragment with ports")
		}
		if id := uint16(b[4])<<8 | uint16(b[5]); (p.Version == 4 && p.IPID != id) || (p.Version == 6 && p.IPID != 0) {
			t.Fatalf("IPID %#x from header bytes %#x", p.IPID, id)
		}
	})
}

func BenchmarkParse(b *testing.B) {
	for _, c := range []struct {
		name string
		pkt  []byte
	}{
		{"ipv4-tcp", tcp4(b, client4, vip4, 40000, 80, 0, false, true, 0)},
		{"ipv6-tcp", tcp6(b, client6, vip6, 40000, 80, 0, false, true, 0)},
		{"ipv6-ext-tcp", ext6(b, 0, cat(optHdr(43), optHdr(60), optHdr(6)), tcpRaw)},
	} {
		b.Run(c.name, func(b *testing.B) {
			var p Packet
			b.ReportAllocs()
			for b.Loop() {
				Parse(c.pkt, &p)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pkts/s")
		})
	}
}
