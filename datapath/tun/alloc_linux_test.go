package tun

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"weir/datapath"
	"weir/internal/testutil"
)

// TestOffloadNoAllocs: Read and Write on an offload queue allocate
// nothing per call (each used to allocate its poller callback and the
// state it captured: 7 allocations per connection at c16 through weir),
// and the packets still go both ways: datagrams routed into the TUN are
// read whole, packets written to it reach a socket.
func TestOffloadNoAllocs(t *testing.T) {
	inNetns(t)
	devs, err := Open(Options{Name: "weira0", Offload: OffloadOn,
		Addrs:  []netip.Prefix{netip.MustParsePrefix("198.18.0.1/24")},
		Routes: []netip.Prefix{netip.MustParsePrefix("198.19.0.0/16")}})
	if err != nil {
		t.Fatal(err)
	}
	d := devs[0]
	t.Cleanup(func() { d.Close() })
	conn, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("198.18.0.1:0")))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	local := conn.LocalAddr().(*net.UDPAddr).AddrPort()
	remote := netip.MustParseAddrPort("198.19.0.7:9999")
	const runs = 50
	off := datapath.VirtioNetHdrLen

	// Kernel → TUN: runs+1 datagrams queued (AllocsPerRun calls once
	// more), then one Read each.
	for i := 0; i <= runs; i++ {
		if _, err := conn.WriteToUDPAddrPort([]byte("ping"), remote); err != nil {
			t.Fatal(err)
		}
	}
	bufs := [][]byte{make([]byte, off+GSOMax)}
	sizes := []int{0}
	udp := 0
	// The first packets may be the kernel's own (router solicitations
	// and the like): wait until the first datagram is there.
	if !testutil.Within(5*time.Second, func() bool {
		n, err := d.Read(bufs, sizes, off)
		if err != nil || n != 1 {
			return false
		}
		var p datapath.Packet
		return datapath.Parse(bufs[0][off:off+sizes[0]], &p) == datapath.DropNone && p.Proto == datapath.ProtoUDP && p.DstAddrPort() == remote
	}) {
		t.Fatal("no datagram reached the TUN")
	}
	udp++
	allocs := testing.AllocsPerRun(runs-1, func() {
		if n, err := d.Read(bufs, sizes, off); n == 1 && err == nil {
			var p datapath.Packet
			if datapath.Parse(bufs[0][off:off+sizes[0]], &p) == datapath.DropNone && p.Proto == datapath.ProtoUDP {
				udp++
			}
		}
	})
	if allocs != 0 {
		t.Errorf("Read: %.1f allocations per call, want 0", allocs)
	}
	// A packet of the kernel's own may have come between the datagrams:
	// the rest are queued still (a lost one: Close ends the wait).
	stop := time.AfterFunc(5*time.Second, func() { d.Close() })
	for extra := 0; udp < runs+1 && extra < 10; extra++ {
		n, err := d.Read(bufs, sizes, off)
		if err != nil {
			break
		}
		var p datapath.Packet
		if n == 1 && datapath.Parse(bufs[0][off:off+sizes[0]], &p) == datapath.DropNone && p.Proto == datapath.ProtoUDP {
			udp++
		}
	}
	if !stop.Stop() {
		t.Fatalf("read %d of the %d datagrams; the rest never came", udp, runs+1)
	}
	if udp != runs+1 {
		t.Errorf("read %d of the %d datagrams", udp, runs+1)
	}

	// TUN → kernel: one packet per Write, each reaching the socket.
	reply := udpPacket(t, remote, local, "pong")
	pkt := make([]byte, off+len(reply)) // a zero virtio-net header: no offload
	copy(pkt[off:], reply)
	out := [][]byte{pkt}
	allocs = testing.AllocsPerRun(runs, func() {
		if n, err := d.Write(out, off); n != 1 || err != nil {
			t.Errorf("Write = %d, %v", n, err)
		}
	})
	if allocs != 0 {
		t.Errorf("Write: %.1f allocations per call, want 0", allocs)
	}
	buf := make([]byte, 100)
	for i := 0; i <= runs; i++ {
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, from, err := conn.ReadFromUDPAddrPort(buf)
		if err != nil || string(buf[:n]) != "pong" || from != remote {
			t.Fatalf("reply %d: %q from %v, %v", i, buf[:n], from, err)
		}
	}
}
