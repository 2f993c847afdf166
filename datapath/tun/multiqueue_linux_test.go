//go:build linux

package tun

import (
	"encoding/binary"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"weir/datapath"
	"weir/internal/testutil"
)

// TestTUNMultiqueueFlowsPinned: with several queues (plain and offload),
// the kernel spreads flows over the queues but keeps each flow on one:
// every packet of a flow is read by the same queue, in the order it was
// sent, so one worker per queue sees each flow's packets in order. 32 UDP
// flows (distinct source ports) of 40 numbered datagrams each.
func TestTUNMultiqueueFlowsPinned(t *testing.T) {
	for _, mode := range []OffloadMode{OffloadOff, OffloadAuto} {
		t.Run(mode.String(), func(t *testing.T) { testFlowsPinned(t, mode) })
	}
}

func testFlowsPinned(t *testing.T, mode OffloadMode) {
	inNetns(t)
	const queues, flows, perFlow = 2, 32, 40
	devs, err := Open(Options{Name: "weirmq1", Queues: queues, Offload: mode,
		Addrs:  []netip.Prefix{netip.MustParsePrefix("198.18.0.1/24")},
		Routes: []netip.Prefix{netip.MustParsePrefix("198.19.0.0/16")}})
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != queues {
		t.Fatalf("%d devices, want %d", len(devs), queues)
	}
	type seen struct {
		queue int
		seq   uint32
	}
	var (
		mu      sync.Mutex
		byFlow  = map[uint16][]seen{} // source port → what the queues read, in read order per queue
		perQ    [queues]int
		readers sync.WaitGroup
	)
	for qi, d := range devs {
		readers.Add(1)
		go func() {
			defer readers.Done()
			const off = datapath.VirtioNetHdrLen
			bufs := make([][]byte, 64)
			sizes := make([]int, len(bufs))
			for i := range bufs {
				bufs[i] = make([]byte, off+65535)
			}
			for {
				n, err := d.Read(bufs, sizes, off)
				if err != nil {
					return
				}
				for i := range n {
					var p datapath.Packet
					b := bufs[i][off : off+sizes[i]]
					if datapath.Parse(b, &p) != datapath.DropNone || p.Proto != datapath.ProtoUDP || p.DstPort != 9999 {
						continue
					}
					pl := b[p.L4Off+8:] // after the UDP header
					if len(pl) < 4 {
						continue
					}
					mu.Lock()
					byFlow[p.SrcPort] = append(byFlow[p.SrcPort], seen{queue: qi, seq: binary.BigEndian.Uint32(pl)})
					perQ[qi]++
					mu.Unlock()
				}
			}
		}()
	}
	dst := net.UDPAddrFromAddrPort(netip.MustParseAddrPort("198.19.0.7:9999"))
	for f := range flows {
		c, err := net.DialUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr("198.18.0.1"), uint16(20000+f))), dst)
		if err != nil {
			t.Fatal(err)
		}
		var b [4]byte
		for s := range perFlow {
			binary.BigEndian.PutUint32(b[:], uint32(s))
			if _, err := c.Write(b[:]); err != nil {
				t.Fatal(err)
			}
		}
		c.Close()
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return perQ[0] + perQ[1]
	}
	testutil.Within(10*time.Second, func() bool { return count() >= flows*perFlow })
	for _, d := range devs {
		d.Close()
	}
	readers.Wait()
	if got := count(); got != flows*perFlow {
		t.Fatalf("the queues read %d datagrams, want %d", got, flows*perFlow)
	}
	for port, ss := range byFlow {
		for i, s := range ss {
			if s.queue != ss[0].queue {
				t.Errorf("flow from port %d: datagram %d on queue %d, the flow's first on queue %d", port, s.seq, s.queue, ss[0].queue)
				break
			}
			if s.seq != uint32(i) {
				t.Errorf("flow from port %d: datagram %d read as the %d-th: out of order", port, s.seq, i)
				break
			}
		}
	}
	for q, n := range perQ {
		if n == 0 {
			t.Errorf("queue %d read nothing: %d flows all on the other queue", q, flows)
		}
	}
	t.Logf("%s (offload active: %v): %d flows over %d queues: %v datagrams per queue", mode, devs[0].Offload(), flows, queues, perQ)
}
