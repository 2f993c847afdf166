package netstack

import (
	"net/netip"
	"testing"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"weir/datapath"
)

func TestIsPureSYN(t *testing.T) {
	syn := rawSYN(netip.MustParseAddrPort("198.18.0.2:1234"), netip.MustParseAddrPort("198.19.0.80:80"))
	synAck := append([]byte(nil), syn...)
	synAck[20+13] |= 0x10
	frag := append([]byte(nil), syn...)
	frag[7] = 1 // fragment offset 8
	for _, tc := range []struct {
		name string
		pkt  []byte
		want bool
	}{
		{"syn", syn, true},
		{"syn-ack", synAck, false},
		{"later fragment", frag, false},
		{"truncated", syn[:30], false},
		{"udp", append(append([]byte(nil), syn[:9]...), append([]byte{17}, syn[10:]...)...), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := isPureSYN(tc.pkt); got != tc.want {
				t.Errorf("isPureSYN = %v, want %v", got, tc.want)
			}
		})
	}
	k, ok := synKey(syn)
	if !ok || k.local != netip.MustParseAddrPort("198.19.0.80:80") || k.remote != netip.MustParseAddrPort("198.18.0.2:1234") {
		t.Errorf("synKey = %v, %v", k, ok)
	}
}

// nopDispatcher swallows delivered packets.
type nopDispatcher struct{}

func (nopDispatcher) DeliverNetworkPacket(tcpip.NetworkProtocolNumber, *stack.PacketBuffer) {}
func (nopDispatcher) DeliverLinkPacket(tcpip.NetworkProtocolNumber, *stack.PacketBuffer)    {}

// TestPerPacketAllocs pins the per-packet paths of the link at zero
// allocations: the SYN check, ingress delivery and egress queueing.
func TestPerPacketAllocs(t *testing.T) {
	syn := rawSYN(netip.MustParseAddrPort("198.18.0.2:1234"), netip.MustParseAddrPort("198.19.0.80:80"))
	if n := testing.AllocsPerRun(1000, func() {
		isPureSYN(syn)
		synKey(syn)
	}); n != 0 {
		t.Errorf("SYN check: %v allocs", n)
	}
	a, b := datapath.NewPipe(datapath.PipeOptions{})
	defer b.Close()
	le := newLinkEndpoint(a, 0, 16)
	le.dispatcher.Store(&dispatcherBox{nopDispatcher{}})
	if n := testing.AllocsPerRun(1000, func() { le.deliver(syn) }); n != 0 {
		t.Errorf("deliver: %v allocs", n)
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
