package netstack

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"weir/datapath"
	"weir/internal/testutil"
)

// rawSYN6 builds an IPv6 TCP SYN from src to dst behind a hop-by-hop and a
// destination-options header (8 bytes each), which the SYN inspection must
// walk to find the TCP header.
func rawSYN6(src, dst netip.AddrPort) []byte {
	b := make([]byte, 40+8+8+header.TCPMinimumSize)
	b[0] = 6 << 4
	binary.BigEndian.PutUint16(b[4:6], uint16(len(b)-40))
	b[6] = 0 // hop-by-hop
	b[7] = 64
	s16, d16 := src.Addr().As16(), dst.Addr().As16()
	copy(b[8:24], s16[:])
	copy(b[24:40], d16[:])
	b[40] = 60 // then destination options
	b[48] = 6  // then TCP
	tcph := header.TCP(b[56:])
	tcph.Encode(&header.TCPFields{SrcPort: src.Port(), DstPort: dst.Port(), SeqNum: 1, DataOffset: header.TCPMinimumSize, Flags: header.TCPFlagSyn, WindowSize: 65535})
	return b
}

func TestSYNKey(t *testing.T) {
	client, vip := netip.MustParseAddrPort("198.18.0.2:1234"), netip.MustParseAddrPort("198.19.0.80:80")
	client6, vip6 := netip.MustParseAddrPort("[fd00::2]:1234"), netip.MustParseAddrPort("[fd00::80]:80")
	syn := rawSYN(client, vip)
	with := func(b []byte, f func(b []byte)) []byte {
		c := append([]byte(nil), b...)
		f(c)
		return c
	}
	syn6 := rawSYN6(client6, vip6)
	for _, tc := range []struct {
		name          string
		pkt           []byte
		want          bool
		local, remote netip.AddrPort
	}{
		{"syn", syn, true, vip, client},
		{"syn-ack", with(syn, func(b []byte) { b[20+13] |= 0x10 }), false, netip.AddrPort{}, netip.AddrPort{}},
		{"later fragment", with(syn, func(b []byte) { b[7] = 1 }), false, netip.AddrPort{}, netip.AddrPort{}},
		{"truncated", syn[:30], false, netip.AddrPort{}, netip.AddrPort{}},
		{"udp", with(syn, func(b []byte) { b[9] = 17 }), false, netip.AddrPort{}, netip.AddrPort{}},
		// An IHL below 5 would have put the "TCP header" inside the IP one.
		{"ipv4 ihl 4", with(syn, func(b []byte) { b[0] = 0x44 }), false, netip.AddrPort{}, netip.AddrPort{}},
		{"empty", nil, false, netip.AddrPort{}, netip.AddrPort{}},
		{"ipv6 with extension headers", syn6, true, vip6, client6},
		{"ipv6 syn-ack", with(syn6, func(b []byte) { b[56+13] |= 0x10 }), false, netip.AddrPort{}, netip.AddrPort{}},
		{"ipv6 chain cut short", syn6[:52], false, netip.AddrPort{}, netip.AddrPort{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, ok := synKey(tc.pkt)
			if ok != tc.want || ok && (k.local != tc.local || k.remote != tc.remote) {
				t.Errorf("synKey = %v %v, want %v (local %v, remote %v)", k, ok, tc.want, tc.local, tc.remote)
			}
		})
	}
}

// FuzzSYNKey: the SYN inspection never panics, and whatever it calls a pure
// SYN, gVisor's header package reads the same way: version, addresses,
// ports, flags, and for IPv4 an IHL of at least 5 and no later fragment.
func FuzzSYNKey(f *testing.F) {
	f.Add(rawSYN(netip.MustParseAddrPort("198.18.0.2:1234"), netip.MustParseAddrPort("198.19.0.80:80")))
	f.Add(rawSYN6(netip.MustParseAddrPort("[fd00::2]:1234"), netip.MustParseAddrPort("[fd00::80]:80")))
	f.Add([]byte{0x44, 0, 0, 40, 0, 0, 0, 0, 64, 6})
	f.Add([]byte{0x60})
	f.Fuzz(func(t *testing.T, pkt []byte) {
		k, ok := synKey(pkt)
		if !ok {
			return
		}
		var tcpOff int
		switch pkt[0] >> 4 {
		case 4:
			ip := header.IPv4(pkt)
			if ip.HeaderLength() < header.IPv4MinimumSize || ip.Protocol() != uint8(header.TCPProtocolNumber) || ip.FragmentOffset() != 0 {
				t.Fatalf("SYN accepted with IHL %d, protocol %d, fragment offset %d", ip.HeaderLength(), ip.Protocol(), ip.FragmentOffset())
			}
			if k.local.Addr() != netip.AddrFrom4(ip.DestinationAddress().As4()) || k.remote.Addr() != netip.AddrFrom4(ip.SourceAddress().As4()) {
				t.Fatalf("addresses %v %v, gVisor reads %v %v", k.local, k.remote, ip.DestinationAddress(), ip.SourceAddress())
			}
			tcpOff = int(ip.HeaderLength())
		case 6:
			ip := header.IPv6(pkt)
			if k.local.Addr() != netip.AddrFrom16(ip.DestinationAddress().As16()) || k.remote.Addr() != netip.AddrFrom16(ip.SourceAddress().As16()) {
				t.Fatalf("addresses %v %v, gVisor reads %v %v", k.local, k.remote, ip.DestinationAddress(), ip.SourceAddress())
			}
			// Walk the extension headers as the IPv6 payload iterator does.
			it := header.MakeIPv6PayloadIterator(header.IPv6ExtensionHeaderIdentifier(ip.NextHeader()), buffer.MakeWithData(pkt[40:]))
			defer it.Release()
			for {
				h, done, err := it.Next()
				if done || err != nil {
					t.Fatalf("gVisor finds no TCP header (err %v)", err)
				}
				raw, isRaw := h.(header.IPv6RawPayloadHeader)
				if !isRaw {
					h.Release()
					continue
				}
				if raw.Identifier == 51 {
					// An authentication header: datapath.Parse walks it,
					// gVisor's iterator stops there; nothing to compare.
					raw.Release()
					return
				}
				if raw.Identifier != header.IPv6ExtensionHeaderIdentifier(header.TCPProtocolNumber) {
					t.Fatalf("gVisor finds protocol %d, not TCP", raw.Identifier)
				}
				tcpOff = len(pkt) - int(raw.Buf.Size())
				raw.Release()
				break
			}
		default:
			t.Fatalf("SYN accepted with version %d", pkt[0]>>4)
		}
		if len(pkt) < tcpOff+header.TCPMinimumSize {
			t.Fatalf("SYN accepted with %d bytes for a TCP header at %d", len(pkt), tcpOff)
		}
		tcph := header.TCP(pkt[tcpOff:])
		if tcph.Flags()&(header.TCPFlagSyn|header.TCPFlagAck) != header.TCPFlagSyn {
			t.Fatalf("flags %v accepted as a pure SYN", tcph.Flags())
		}
		if k.local.Port() != tcph.DestinationPort() || k.remote.Port() != tcph.SourcePort() {
			t.Fatalf("ports %v %v, gVisor reads %d %d", k.local, k.remote, tcph.DestinationPort(), tcph.SourcePort())
		}
	})
}

// nopDispatcher swallows delivered packets.
type nopDispatcher struct{}

func (nopDispatcher) DeliverNetworkPacket(tcpip.NetworkProtocolNumber, *stack.PacketBuffer) {}
func (nopDispatcher) DeliverLinkPacket(tcpip.NetworkProtocolNumber, *stack.PacketBuffer)    {}

// TestPerPacketAllocs pins the per-packet paths of the link at zero
// allocations: the SYN check, ingress delivery and egress queueing.
func TestPerPacketAllocs(t *testing.T) {
	if testutil.Race {
		t.Skip("under the race detector sync.Pool drops items at random: allocation counts mean nothing")
	}
	syn := rawSYN(netip.MustParseAddrPort("198.18.0.2:1234"), netip.MustParseAddrPort("198.19.0.80:80"))
	syn6 := rawSYN6(netip.MustParseAddrPort("[fd00::2]:1234"), netip.MustParseAddrPort("[fd00::80]:80"))
	if n := testing.AllocsPerRun(1000, func() {
		synKey(syn)
		synKey(syn6)
	}); n != 0 {
		t.Errorf("SYN check: %v allocs", n)
	}
	a, b := datapath.NewPipe(datapath.PipeOptions{})
	defer b.Close()
	le := newLinkEndpoint(a, 0, 16)
	le.dispatcher.Store(&dispatcherBox{nopDispatcher{}})
	if n := testing.AllocsPerRun(1000, func() { le.deliver(syn, nil) }); n != 0 {
		t.Errorf("deliver: %v allocs", n)
	}
	var seen int
	hook := func(twKey) { seen++ }
	le.synHook.Store(&hook)
	if n := testing.AllocsPerRun(1000, func() { le.deliver(syn, nil) }); n != 0 || seen == 0 {
		t.Errorf("deliver through the SYN hook: %v allocs, %d SYNs seen", n, seen)
	}
	var list stack.PacketBufferList
	list.PushBack(stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(syn)}))
	defer list.DecRef()
	drain := func() {
		for {
			select {
			case bp := <-le.queue:
				le.bufPool.Put(bp)
			default:
				return
			}
		}
	}
	le.WritePackets(list)
	drain()
	if n := testing.AllocsPerRun(1000, func() {
		le.WritePackets(list)
		drain()
	}); n != 0 {
		t.Errorf("WritePackets: %v allocs", n)
	}
	le.shutdown()
}
