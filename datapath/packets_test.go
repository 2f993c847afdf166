package datapath

import (
	"net"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// Test packet builders: every good and bad packet in the tests is built with
// gopacket, then (for the bad ones) damaged byte by byte.

var (
	client4 = net.IP{198, 18, 0, 2}
	vip4    = net.IP{198, 18, 0, 1}
	client6 = net.ParseIP("fd00::2")
	vip6    = net.ParseIP("fd00::1")
)

func serialize(t testing.TB, ls ...gopacket.SerializableLayer) []byte {
	t.Helper()
	buf := gopacket.NewSerializeBuffer()
	opts := gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}
	if err := gopacket.SerializeLayers(buf, opts, ls...); err != nil {
		t.Fatalf("serialize: %v", err)
	}
	return append([]byte(nil), buf.Bytes()...)
}

func ip4(src, dst net.IP, proto layers.IPProtocol) *layers.IPv4 {
	return &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: proto, SrcIP: src, DstIP: dst}
}

func tcp(sport, dport uint16) *layers.TCP {
	return &layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: layers.TCPPort(dport), Seq: 1, Window: 65535}
}

// tcp4 builds an IPv4 TCP packet with the given flags set on the TCP layer
// and payload bytes.
func tcp4(t testing.TB, src, dst net.IP, sport, dport uint16, tos uint8, syn, ack bool, payload int) []byte {
	t.Helper()
	ip := ip4(src, dst, layers.IPProtocolTCP)
	ip.TOS = tos
	tc := tcp(sport, dport)
	tc.SYN, tc.ACK = syn, ack
	tc.SetNetworkLayerForChecksum(ip)
	return serialize(t, ip, tc, gopacket.Payload(make([]byte, payload)))
}

func tcp6(t testing.TB, src, dst net.IP, sport, dport uint16, tc8 uint8, syn, ack bool, payload int) []byte {
	t.Helper()
	ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolTCP, SrcIP: src, DstIP: dst, TrafficClass: tc8, FlowLabel: 0x12345}
	tc := tcp(sport, dport)
	tc.SYN, tc.ACK = syn, ack
	tc.SetNetworkLayerForChecksum(ip)
	return serialize(t, ip, tc, gopacket.Payload(make([]byte, payload)))
}

// ext6 builds an IPv6 packet whose payload is the raw extension headers ext
// (already chained by the caller) followed by l4; first is the next-header
// value of the fixed header.
func ext6(t testing.TB, first layers.IPProtocol, ext []byte, l4 []byte) []byte {
	t.Helper()
	ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: first, SrcIP: client6, DstIP: vip6}
	return serialize(t, ip, gopacket.Payload(append(append([]byte(nil), ext...), l4...)))
}

// optHdr is an 8-byte generic IPv6 extension header (hop-by-hop, routing
// or destination options) with a PadN option filling it.
func optHdr(next layers.IPProtocol) []byte {
	return []byte{byte(next), 0, 1, 4, 0, 0, 0, 0}
}

// fragHdr is an IPv6 fragment header with the given offset in 8-byte units
// and more-fragments flag.
func fragHdr(next layers.IPProtocol, offset uint16, more bool) []byte {
	v := offset << 3
	if more {
		v |= 1
	}
	return []byte{byte(next), 0, byte(v >> 8), byte(v), 0, 0, 0, 42}
}
