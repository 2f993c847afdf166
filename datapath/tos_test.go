package datapath

import (
	"encoding/binary"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

func TestSetTOS(t *testing.T) {
	tests := []struct {
		name    string
		pkt     []byte
		tos     uint8
		want    uint8 // ToS / traffic class after
		changed bool
	}{
		{"ipv4 mark", tcp4(t, vip4, client4, 80, 40000, 0, true, true, 0), 0xa0, 0xa0, true},
		{"ipv4 same", tcp4(t, vip4, client4, 80, 40000, 0xa0, true, true, 0), 0xa0, 0xa0, false},
		{"ipv4 keeps ecn", tcp4(t, vip4, client4, 80, 40000, 0x03, false, true, 10), 0xa0, 0xa3, true},
		{"ipv4 clears dscp", tcp4(t, vip4, client4, 80, 40000, 0xb9, false, true, 10), 0x00, 0x01, true},
		{"ipv6 mark", tcp6(t, vip6, client6, 80, 40000, 0, true, true, 0), 0xa0, 0xa0, true},
		{"ipv6 keeps ecn", tcp6(t, vip6, client6, 80, 40000, 0x02, true, true, 0), 0xb8, 0xba, true},
		{"ipv6 same", tcp6(t, vip6, client6, 80, 40000, 0x28, true, true, 0), 0x28, 0x28, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := append([]byte(nil), tt.pkt...)
			if got := SetTOS(b, tt.tos); got != tt.changed {
				t.Errorf("SetTOS changed = %v, want %v", got, tt.changed)
			}
			var p Packet
			if r := Parse(b, &p); r != DropNone {
				t.Fatalf("rewritten packet does not parse: %v", r)
			}
			if p.TOS != tt.want {
				t.Errorf("ToS = %#x, want %#x", p.TOS, tt.want)
			}
			// gopacket decodes the rewritten packet and agrees; for IPv4 the
			// header checksum must still verify, for IPv6 the flow label and
			// version must be untouched.
			if p.Version == 4 {
				ip := gopacket.NewPacket(b, layers.LayerTypeIPv4, gopacket.Default).Layer(layers.LayerTypeIPv4).(*layers.IPv4)
				if ip.TOS != tt.want {
					t.Errorf("gopacket ToS = %#x, want %#x", ip.TOS, tt.want)
				}
				if want := IPv4HeaderChecksum(b); ip.Checksum != want {
					t.Errorf("checksum = %#04x, full recomputation %#04x", ip.Checksum, want)
				}
			} else {
				ip := gopacket.NewPacket(b, layers.LayerTypeIPv6, gopacket.Default).Layer(layers.LayerTypeIPv6).(*layers.IPv6)
				if ip.TrafficClass != tt.want || ip.FlowLabel != 0x12345 || ip.Version != 6 {
					t.Errorf("gopacket IPv6 = tc %#x label %#x version %d, want tc %#x label 0x12345 version 6", ip.TrafficClass, ip.FlowLabel, ip.Version, tt.want)
				}
			}
			// The rest of the packet is unchanged.
			for i := range b {
				if i <= 1 || (p.Version == 4 && (i == 10 || i == 11)) {
					continue
				}
				if b[i] != tt.pkt[i] {
					t.Fatalf("byte %d changed from %#x to %#x", i, tt.pkt[i], b[i])
				}
			}
		})
	}
}

func TestSetTOSShortOrUnknown(t *testing.T) {
	for _, b := range [][]byte{nil, {0x45, 0}, make([]byte, 39), {0x65}, make([]byte, 60)} {
		c := append([]byte(nil), b...)
		if SetTOS(c, 0xa0) {
			t.Errorf("SetTOS(% x) changed a packet it cannot hold", b)
		}
	}
}

func TestSetTOSZeroAllocs(t *testing.T) {
	b4 := tcp4(t, vip4, client4, 80, 40000, 0, true, true, 0)
	b6 := tcp6(t, vip6, client6, 80, 40000, 0, true, true, 0)
	tos := uint8(0)
	allocs := testing.AllocsPerRun(1000, func() {
		tos += 4
		SetTOS(b4, tos)
		SetTOS(b6, tos)
	})
	if allocs != 0 {
		t.Errorf("SetTOS allocates %.1f times, want 0", allocs)
	}
}

// FuzzTOSRewrite checks that after SetTOS the incrementally updated IPv4
// header checksum equals a full recomputation, so a packet with a correct
// checksum stays correct, and that a packet whose checksum was wrong stays
// wrong by the same amount (the rewrite neither hides nor adds an error).
func FuzzTOSRewrite(f *testing.F) {
	f.Add([]byte{0x45, 0x00, 0x00, 0x28, 0x12, 0x34, 0x40, 0x00, 0x40, 0x06, 0, 0, 198, 18, 0, 1, 198, 18, 0, 2}, uint8(0xa0), true)
	f.Add([]byte{0x46, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1, 1, 0, 0}, uint8(0x00), true)
	f.Add([]byte{0x45, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, uint8(0xfc), false)
	f.Fuzz(func(t *testing.T, hdr []byte, tos uint8, fix bool) {
		if len(hdr) < 20 {
			return
		}
		hdr[0] = 0x40 | hdr[0]&0x0f
		ihl := int(hdr[0]&0x0f) * 4
		if ihl < 20 || ihl > len(hdr) {
			hdr[0] = 0x45
			ihl = 20
		}
		if fix {
			binary.BigEndian.PutUint16(hdr[10:12], IPv4HeaderChecksum(hdr))
		}
		errBefore := onesSub(IPv4HeaderChecksum(hdr), binary.BigEndian.Uint16(hdr[10:12]))
		SetTOS(hdr, tos)
		got := binary.BigEndian.Uint16(hdr[10:12])
		full := IPv4HeaderChecksum(hdr)
		if fix && got != full {
			t.Fatalf("incremental checksum %#04x, full recomputation %#04x (header % x)", got, full, hdr[:ihl])
		}
		if errAfter := onesSub(full, got); !checksumEqual(errAfter, errBefore) {
			t.Fatalf("checksum error changed from %#04x to %#04x", errBefore, errAfter)
		}
	})
}

// checksumEqual compares two one's-complement values, for which 0x0000 and
// 0xffff are both zero.
func checksumEqual(a, b uint16) bool {
	return a == b || (a == 0 || a == 0xffff) && (b == 0 || b == 0xffff)
}

// onesSub returns a - b in one's complement arithmetic.
func onesSub(a, b uint16) uint16 {
	s := uint32(a) + uint32(^b)
	s = s&0xffff + s>>16
	return uint16(s)
}

func BenchmarkSetTOS(b *testing.B) {
	pkt := tcp4(b, vip4, client4, 80, 40000, 0, false, true, 0)
	b.ReportAllocs()
	tos := uint8(0)
	for b.Loop() {
		tos ^= 0xa0
		SetTOS(pkt, tos)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pkts/s")
}
