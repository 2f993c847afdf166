package netstack

import (
	"net"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"weir/datapath"
)

// TestChecksumOK: an offload link verifies the checksums the stack will
// not: a good TCP or UDP packet (IPv4 and IPv6) passes, one with a flipped
// payload byte fails, an IPv4 UDP checksum of zero (none) passes, and the
// header flags that say the kernel checked or left the sum partial skip
// the check.
func TestChecksumOK(t *testing.T) {
	build := func(v6, udp bool) []byte {
		var ip gopacket.NetworkLayer
		var ipl gopacket.SerializableLayer
		if v6 {
			l := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolTCP, SrcIP: net.ParseIP("fd00::2"), DstIP: net.ParseIP("fd00::23")}
			if udp {
				l.NextHeader = layers.IPProtocolUDP
			}
			ip, ipl = l, l
		} else {
			l := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: net.IP{198, 18, 0, 2}, DstIP: net.IP{198, 18, 0, 23}}
			if udp {
				l.Protocol = layers.IPProtocolUDP
			}
			ip, ipl = l, l
		}
		var l4 gopacket.SerializableLayer
		if udp {
			u := &layers.UDP{SrcPort: 4000, DstPort: 53}
			u.SetNetworkLayerForChecksum(ip)
			l4 = u
		} else {
			c := &layers.TCP{SrcPort: 40000, DstPort: 23, Seq: 7, ACK: true, Window: 1000}
			c.SetNetworkLayerForChecksum(ip)
			l4 = c
		}
		buf := gopacket.NewSerializeBuffer()
		if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ipl, l4, gopacket.Payload("hello, weir")); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	for _, tt := range []struct {
		name    string
		v6, udp bool
	}{{"tcp4", false, false}, {"udp4", false, true}, {"tcp6", true, false}, {"udp6", true, true}} {
		t.Run(tt.name, func(t *testing.T) {
			p := build(tt.v6, tt.udp)
			if !checksumOK(p) {
				t.Fatal("good packet refused")
			}
			p[len(p)-1] ^= 0x40
			if checksumOK(p) {
				t.Fatal("corrupted packet accepted")
			}
			for _, f := range []byte{datapath.VirtioNetFNeedsCsum, datapath.VirtioNetFDataValid} {
				if !rxChecksumDone([]byte{f, 0, 0, 0, 0, 0, 0, 0, 0, 0}) {
					t.Errorf("flags %#x: not taken as checked", f)
				}
			}
			if rxChecksumDone(make([]byte, datapath.VirtioNetHdrLen)) || rxChecksumDone(nil) {
				t.Error("a zero or missing header taken as checked")
			}
		})
	}
	p := build(false, true)
	p[20+6], p[20+7] = 0, 0 // no UDP checksum
	p[len(p)-1] ^= 0x40
	if !checksumOK(p) {
		t.Error("IPv4 UDP without checksum refused")
	}
	if n := testing.AllocsPerRun(100, func() { checksumOK(p) }); n != 0 {
		t.Errorf("checksumOK: %v allocs", n)
	}
}
