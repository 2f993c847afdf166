//go:build linux

package tun

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/vishvananda/netlink"

	"weir/datapath"
	"weir/internal/testutil"
)

// inNetns moves the test goroutine, locked to its OS thread, into a new
// network namespace for the rest of the test (testutil.EnterNetNS); the
// namespace disappears with its last reference. It skips the test when the
// host cannot do this (not root, no /dev/net/tun).
func inNetns(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: TUN tests need root (CAP_NET_ADMIN) to create a network namespace and a TUN device")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skipf("skipping: /dev/net/tun is not available: %v", err)
	}
	testutil.EnterNetNS(t)
}

// snmp6 returns the IPv6 input counters of the test's namespace, for
// failure messages.
func snmp6() string {
	b, err := os.ReadFile("/proc/thread-self/net/snmp6")
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) == 2 && f[1] != "0" && (strings.HasPrefix(f[0], "Ip6In") || strings.HasPrefix(f[0], "Udp6")) {
			out = append(out, f[0]+"="+f[1])
		}
	}
	return strings.Join(out, " ")
}

func udpPacket(t *testing.T, src, dst netip.AddrPort, payload string) []byte {
	t.Helper()
	u := &layers.UDP{SrcPort: layers.UDPPort(src.Port()), DstPort: layers.UDPPort(dst.Port())}
	var ip gopacket.SerializableLayer
	if src.Addr().Is4() {
		ip4 := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: src.Addr().AsSlice(), DstIP: dst.Addr().AsSlice()}
		u.SetNetworkLayerForChecksum(ip4)
		ip = ip4
	} else {
		ip6 := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolUDP, SrcIP: src.Addr().AsSlice(), DstIP: dst.Addr().AsSlice()}
		u.SetNetworkLayerForChecksum(ip6)
		ip = ip6
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ip, u, gopacket.Payload(payload)); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// readOne reads one packet from d within a deadline.
func readOne(t *testing.T, d datapath.Device) []byte {
	t.Helper()
	type res struct {
		b   []byte
		err error
	}
	ch := make(chan res, 1)
	go func() {
		bufs := [][]byte{make([]byte, 2000)}
		sizes := []int{0}
		n, err := d.Read(bufs, sizes, 0)
		if n == 1 {
			ch <- res{b: bufs[0][:sizes[0]]}
			return
		}
		ch <- res{err: err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("Read: %v", r.err)
		}
		return r.b
	case <-time.After(5 * time.Second):
		d.Close()
		t.Fatal("no packet reached the TUN")
		return nil
	}
}

func TestTUNRoundTrip(t *testing.T) {
	inNetns(t)
	devs, err := Open(Options{
		Name: "weirt0", MTU: 1400, TxQueueLen: 4321,
		Addrs:  []netip.Prefix{netip.MustParsePrefix("198.18.0.1/24"), netip.MustParsePrefix("fd00::1/64")},
		Routes: []netip.Prefix{netip.MustParsePrefix("198.19.0.0/16"), netip.MustParsePrefix("fd01::/64")},
	})
	if err != nil {
		t.Fatal(err)
	}
	d := devs[0]
	t.Cleanup(func() { d.Close() })

	link, err := netlink.LinkByName("weirt0")
	if err != nil {
		t.Fatal(err)
	}
	a := link.Attrs()
	if a.MTU != 1400 || a.TxQLen != 4321 || a.Flags&net.FlagUp == 0 {
		t.Errorf("link mtu %d txqlen %d flags %v; want 1400, 4321, up", a.MTU, a.TxQLen, a.Flags)
	}
	if d.Name() != "weirt0" || d.MTU() != 1400 || d.BatchSize() != 1 {
		t.Errorf("device %q mtu %d batch %d", d.Name(), d.MTU(), d.BatchSize())
	}

	tests := []struct {
		name          string
		local, remote netip.AddrPort
	}{
		{"ipv4", netip.MustParseAddrPort("198.18.0.1:0"), netip.MustParseAddrPort("198.19.0.7:9999")},
		{"ipv6", netip.MustParseAddrPort("[fd00::1]:0"), netip.MustParseAddrPort("[fd01::7]:9999")},
	}
	// No t.Run: a subtest runs on another goroutine, outside the namespace
	// this goroutine's thread is locked in.
	for _, tt := range tests {
		func() {
			conn, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(tt.local))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			local := conn.LocalAddr().(*net.UDPAddr).AddrPort()
			// Kernel → TUN: a datagram routed through the interface.
			// Retry briefly: IPv6 addresses may still be settling.
			var got []byte
			if !testutil.Within(time.Second, func() bool {
				_, err = conn.WriteToUDPAddrPort([]byte("ping"), tt.remote)
				return err == nil
			}) {
				t.Fatalf("%s: send: %v", tt.name, err)
			}
			for range 20 { // skip router solicitations and the like
				got = readOne(t, d)
				var p datapath.Packet
				if datapath.Parse(got, &p) == datapath.DropNone && p.Proto == datapath.ProtoUDP {
					if p.DstAddrPort() != tt.remote || p.SrcAddrPort().Port() != local.Port() {
						t.Fatalf("%s: TUN read %v → %v, want → %v", tt.name, p.SrcAddrPort(), p.DstAddrPort(), tt.remote)
					}
					break
				}
			}
			// TUN → kernel: the reply reaches the socket.
			reply := udpPacket(t, tt.remote, netip.AddrPortFrom(tt.local.Addr(), local.Port()), "pong")
			if n, err := d.Write([][]byte{reply}, 0); n != 1 || err != nil {
				t.Fatalf("%s: Write = %d, %v", tt.name, n, err)
			}
			conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			buf := make([]byte, 100)
			n, from, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				t.Fatalf("%s: socket did not get the reply: %v (kernel: %s)", tt.name, err, snmp6())
			}
			if string(buf[:n]) != "pong" || from != tt.remote {
				t.Errorf("%s: socket got %q from %v", tt.name, buf[:n], from)
			}
		}()
	}
	st := d.Stats()
	if st.RxPackets < 2 || st.TxPackets != 2 {
		t.Errorf("stats = %+v", st)
	}
	// Oversized writes are dropped and counted, not sent.
	d.Write([][]byte{make([]byte, 1401)}, 0)
	if d.Stats().DroppedTooBig != 1 {
		t.Errorf("DroppedTooBig = %d, want 1", d.Stats().DroppedTooBig)
	}
}

func TestTUNMultiqueue(t *testing.T) {
	inNetns(t)
	devs, err := Open(Options{Name: "weirmq0", Queues: 2, Addrs: []netip.Prefix{netip.MustParsePrefix("198.18.0.1/24")}, Routes: []netip.Prefix{netip.MustParsePrefix("198.19.0.0/16")}})
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 2 {
		t.Fatalf("%d devices, want 2", len(devs))
	}
	const total = 200
	var got atomic.Int64
	var wg sync.WaitGroup
	for _, d := range devs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bufs := [][]byte{make([]byte, 2000)}
			sizes := []int{0}
			for {
				n, err := d.Read(bufs, sizes, 0)
				if err != nil {
					return
				}
				var p datapath.Packet
				if n == 1 && datapath.Parse(bufs[0][:sizes[0]], &p) == datapath.DropNone && p.Proto == datapath.ProtoUDP {
					got.Add(1)
				}
			}
		}()
	}
	for i := range total {
		conn, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.MustParseAddrPort("198.19.0.7:9999")))
		if err != nil {
			t.Fatal(err)
		}
		conn.Write([]byte{byte(i)})
		conn.Close()
	}
	testutil.Within(5*time.Second, func() bool { return got.Load() >= total }) // checked below, once the readers stopped
	for _, d := range devs {
		d.Close()
	}
	wg.Wait()
	if got.Load() != total {
		t.Errorf("queues read %d packets, want %d", got.Load(), total)
	}
}

func TestTUNCloseWakesRead(t *testing.T) {
	inNetns(t)
	devs, err := Open(Options{Down: true})
	if err != nil {
		t.Fatal(err)
	}
	d := devs[0]
	errc := make(chan error, 1)
	go func() {
		_, err := d.Read([][]byte{make([]byte, 1500)}, []int{0}, 0)
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	d.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, os.ErrClosed) {
			t.Errorf("Read after Close = %v, want os.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake Read")
	}
	if _, err := d.Write([][]byte{make([]byte, 40)}, 0); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Write after Close = %v", err)
	}
}
