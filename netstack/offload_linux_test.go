//go:build linux

package netstack

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"

	"weir/datapath"
	"weir/datapath/tun"
	"weir/internal/netns"
	"weir/internal/testutil"
	"weir/policy"
	"weir/policy/config"
)

// offloadConfig marks every packet of the telnet service (VIP port 23)
// toward clients with ToS 0xa0.
const offloadConfig = `
services:
  - name: telnet
    vips: [198.18.0.23, "fd00::23"]
    port: 23
    protocol: tcp
    targets:
      - name: sys1
        address: 198.18.1.3:2323
actions:
  - name: gold
    outgoingTOS: "10100000"
rules:
  - name: telnet
    protocol: 6
    sourcePorts: 23
    action: gold
`

// wirePacket is one TCP packet seen on the TUN by an AF_PACKET socket with
// PACKET_VNET_HDR, so that a super-packet comes with its GSO size.
type wirePacket struct {
	toWeir   bool // the kernel sent it into the TUN
	src, dst netip.AddrPort
	tos      uint8
	ip4OK    bool // IPv4 header checksum holds (true for IPv6)
	len      int  // IP length
	segs     int  // segments it stands for
	segBytes int  // their summed IP lengths
}

// tunCapture records every TCP packet on the interface ifname of ns.
type tunCapture struct {
	fd      int
	vnet    bool
	mu      sync.Mutex
	pkts    []wirePacket // protected by mu
	quit    chan struct{}
	stopped chan struct{}
}

// startTUNCapture captures on a TUN, with virtio-net headers: super-packets
// come with their GSO size.
func startTUNCapture(t *testing.T, ns *netns.NS, ifname string) *tunCapture {
	return startCapture(t, ns, ifname, true)
}

// startCapture captures on ifname in ns; vnet asks for virtio-net headers
// (SOCK_RAW: only for an interface without a link header), else the
// packets come without their link header (SOCK_DGRAM) as cut for the wire.
func startCapture(t *testing.T, ns *netns.NS, ifname string, vnet bool) *tunCapture {
	t.Helper()
	htons := func(v uint16) uint16 { return v<<8 | v>>8 }
	c := &tunCapture{quit: make(chan struct{}), stopped: make(chan struct{})}
	err := ns.Do(func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		typ := unix.SOCK_DGRAM
		if vnet {
			typ = unix.SOCK_RAW // PACKET_VNET_HDR needs SOCK_RAW; a TUN has no link header
		}
		fd, err := unix.Socket(unix.AF_PACKET, typ, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		c.fd = fd
		if vnet {
			if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1); err != nil {
				return fmt.Errorf("PACKET_VNET_HDR: %w", err)
			}
		}
		// Room for every packet of the test, so the capture loses none.
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 256<<20); err != nil {
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}); err != nil {
			return err
		}
		return unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 50_000})
	})
	if err != nil {
		if c.fd > 0 {
			unix.Close(c.fd)
		}
		t.Fatalf("AF_PACKET capture on %s: %v", ifname, err)
	}
	c.vnet = vnet
	go c.loop()
	t.Cleanup(func() { c.stop() })
	return c
}

func (c *tunCapture) loop() {
	defer close(c.stopped)
	buf := make([]byte, 1<<17)
	var p datapath.Packet
	for {
		select {
		case <-c.quit:
			return
		default:
		}
		n, from, err := unix.Recvfrom(c.fd, buf, 0)
		if err != nil {
			continue // EAGAIN every 50 ms: look at quit
		}
		var hdr []byte
		pkt := buf[:n]
		if c.vnet {
			if n <= datapath.VirtioNetHdrLen {
				continue
			}
			hdr, pkt = buf[:datapath.VirtioNetHdrLen], buf[datapath.VirtioNetHdrLen:n]
		}
		if datapath.Parse(pkt, &p) != datapath.DropNone || p.Proto != datapath.ProtoTCP {
			continue
		}
		ll, _ := from.(*unix.SockaddrLinklayer)
		w := wirePacket{
			toWeir: ll != nil && ll.Pkttype == unix.PACKET_OUTGOING,
			src:    p.SrcAddrPort(), dst: p.DstAddrPort(),
			tos: p.TOS, len: p.Len, ip4OK: true,
		}
		if p.Version == 4 {
			w.ip4OK = ipChecksum(pkt[:p.L4Off]) == 0
		}
		w.segs, w.segBytes = datapath.Segments(hdr, pkt, &p)
		c.mu.Lock()
		c.pkts = append(c.pkts, w)
		c.mu.Unlock()
	}
}

func ipChecksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return ^uint16(s)
}

// seen returns the packets so far.
func (c *tunCapture) seen() []wirePacket {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]wirePacket(nil), c.pkts...)
}

// drops returns the packets the socket lost (PACKET_STATISTICS; reading
// resets the kernel's count, so it is summed here).
func (c *tunCapture) drops() uint32 {
	var st unix.TpacketStats
	l := uint32(unsafe.Sizeof(st))
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(c.fd), unix.SOL_PACKET, unix.PACKET_STATISTICS, uintptr(unsafe.Pointer(&st)), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 {
		return 0
	}
	return st.Drops
}

func (c *tunCapture) stop() {
	select {
	case <-c.quit:
		return
	default:
	}
	close(c.quit)
	<-c.stopped
	unix.Close(c.fd)
}

// transfer sends n pseudo-random bytes to addr's echo and reads them back
// at the same time; it fails the test unless every byte returns intact.
func transfer(t *testing.T, ns *netns.NS, addr string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := ns.Dial(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	testutil.EchoTransfer(t, c, addr, n)
}

// TestOffloadTUN runs a real TUN, the datapath engine and the stack
// together, with offload on (virtio-net headers, 64 KiB segments both
// ways) and off (the water fallback): 8 MiB (2 under -short or -race) each way over IPv4 and IPv6
// come back intact, every packet from the marked service carries its
// ToS with a valid IPv4 header checksum, the engine rewrote each exactly
// once, and the service's meters hold exactly the segments and bytes the
// capture on the TUN saw, super-packets counted as the segments they
// stand for. With offload on, super-packets are seen in both directions;
// off, none is larger than the MTU.
func TestOffloadTUN(t *testing.T) {
	for _, mode := range []tun.OffloadMode{tun.OffloadOn, tun.OffloadOff} {
		t.Run(mode.String(), func(t *testing.T) { testOffloadTUN(t, mode) })
	}
}

func testOffloadTUN(t *testing.T, mode tun.OffloadMode) {
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skipf("skipping: no /dev/net/tun: %v", err)
	}
	ns := testutil.EnterNetNS(t)
	cfg, err := config.Parser{}.Parse("offload.yaml", []byte(offloadConfig))
	if err != nil {
		t.Fatal(err)
	}
	if cfg, err = policy.Compile(cfg); err != nil {
		t.Fatal(err)
	}
	const ifname = "wgso0"
	client := clientNS(t, ns)
	devs, err := tun.Open(tun.Options{
		Name: ifname, Offload: mode,
		Addrs:  []netip.Prefix{netip.MustParsePrefix("198.18.0.1/32"), netip.MustParsePrefix("fd00::1/128")},
		Routes: []netip.Prefix{netip.MustParsePrefix("198.18.0.23/32"), netip.MustParsePrefix("fd00::23/128")},
	})
	if err != nil {
		t.Fatal(err)
	}
	dev := devs[0]
	if dev.Offload() != (mode == tun.OffloadOn) {
		t.Fatalf("Offload() = %v with %v", dev.Offload(), mode)
	}
	e := datapath.NewEngine(dev, cfg, datapath.EngineOptions{})
	s, err := New(Options{})
	if err != nil {
		dev.Close()
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.AddNIC(e, NICOptions{Name: "front", Promiscuous: true}); err != nil {
		dev.Close()
		t.Fatal(err)
	}
	cap := startTUNCapture(t, ns, ifname)
	wire := startCapture(t, client, "wgc0", false)
	for _, vip := range []string{"198.18.0.23:23", "[fd00::23]:23"} {
		l, err := s.ListenTCP(netip.MustParseAddrPort(vip))
		if err != nil {
			t.Fatal(err)
		}
		stop := serveListener(l, duplexEcho)
		defer stop()
	}

	size := 8 << 20
	if testing.Short() || testutil.Race {
		size = 2 << 20 // make race: the race detector slows the stack tenfold
	}
	// The stack's TCP endpoints' own counters, sampled during the transfer:
	// an endpoint is gone by the time a failure is logged.
	epStats := map[string]string{}
	var epMu sync.Mutex
	sampleDone := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-sampleDone:
				return
			case <-tick.C:
			}
			for _, ep := range s.s.RegisteredEndpoints() {
				te, ok := ep.(*tcp.Endpoint)
				if !ok || tcp.EndpointState(te.State()) == tcp.StateListen {
					continue
				}
				st := te.Stats().(*tcp.Stats)
				id := te.Info().(*stack.TransportEndpointInfo).ID
				epMu.Lock()
				epStats[fmt.Sprintf("%v:%d-%v:%d", id.LocalAddress, id.LocalPort, id.RemoteAddress, id.RemotePort)] = fmt.Sprintf(
					"%v rx %d tx %d segment-queue drops %d, receive buffer overflow %d, zero-window %d, want-zero-window %d, rcvbuf %d",
					tcp.EndpointState(te.State()), st.SegmentsReceived.Value(), st.SegmentsSent.Value(), st.ReceiveErrors.SegmentQueueDropped.Value(),
					st.ReceiveErrors.ReceiveBufferOverflow.Value(), st.ReceiveErrors.ZeroRcvWindowState.Value(), st.ReceiveErrors.WantZeroRcvWindow.Value(),
					te.SocketOptions().GetReceiveBufferSize())
				epMu.Unlock()
			}
		}
	}()
	stopSampling := func() {
		select {
		case <-sampleDone:
		default:
			close(sampleDone)
		}
		<-sampled
	}
	t.Cleanup(func() {
		stopSampling()
		if t.Failed() {
			epMu.Lock()
			for k, v := range epStats {
				t.Logf("endpoint %s: %s", k, v)
			}
			epMu.Unlock()
			t.Logf("gvisor: dropped packets %d", s.s.Stats().DroppedPackets.Value())
			st, _ := dev.TUNStats()
			t.Logf("device %+v, engine %+v, stack %+v", st, e.Stats(), s.Stats())
			gs := s.s.Stats()
			t.Logf("gvisor: ip rx %d, ip malformed %d, bad dst %d, tcp checksum errors %d, invalid %d, tcp rx %d", gs.IP.PacketsReceived.Value(), gs.IP.MalformedPacketsReceived.Value(), gs.IP.InvalidDestinationAddressesReceived.Value(), gs.TCP.ChecksumErrors.Value(), gs.TCP.InvalidSegmentsReceived.Value(), gs.TCP.ValidSegmentsReceived.Value())
			for _, n := range s.nics {
				t.Logf("link %s: %+v", n.name, n.Stats())
			}
			// The kernel's own drops, where the TUN's counters cannot see
			// them: the forwarding namespace and the client's.
			for name, n := range map[string]*netns.NS{"router": ns, "client": client} {
				n.Do(func() error {
					for _, f := range []string{"/proc/thread-self/net/snmp", "/proc/thread-self/net/netstat"} {
						if b, err := os.ReadFile(f); err == nil {
							t.Logf("%s %s:\n%s", name, f, b)
						}
					}
					return nil
				})
			}
		}
	})
	transfer(t, client, "198.18.0.23:23", size)
	transfer(t, client, "[fd00::23]:23", size)

	// Meters and the engine's Marked count a packet before the device
	// writes it and the capture sees it after: wait until they agree (the
	// closing FIN and ACKs), on one snapshot of all three. Marked is read
	// before and after the capture and the meters: a packet sent meanwhile
	// (a late ACK) moves it, and the snapshot is taken again (Marked read
	// once after the wait was a packet ahead of the capture once: "engine
	// marked 490 packets, the capture saw 489").
	telnet := func(p wirePacket) bool { return p.src.Port() == 23 || p.dst.Port() == 23 }
	// Weir's side sends nothing more once its connections have left the
	// stack, TIME_WAIT included: wait for that first, so that no late ACK
	// or FIN reaches the wire after the snapshot (the wire once read 3170
	// segments from the VIP for the meters' 3169).
	testutil.WithinEvery(5*time.Second, 20*time.Millisecond, func() bool {
		for _, ep := range s.s.RegisteredEndpoints() {
			if te, ok := ep.(*tcp.Endpoint); ok && tcp.EndpointState(te.State()) != tcp.StateListen {
				return false
			}
		}
		return true
	})
	// A segment can still leave after that (a reset for a client's late
	// segment once its endpoint is gone: the wire once read 3183 for the
	// meters' 3181, with one reset sent), so the wire's count is part of
	// the same snapshot, not checked after it: a late segment moves every
	// count and the snapshot is taken again.
	var tot datapath.MeterTotals
	var want [2]datapath.Counter
	var pkts, wirePkts []wirePacket
	var marked uint64
	agree := testutil.WithinEvery(5*time.Second, 20*time.Millisecond, func() bool {
		marked = e.Stats().Marked
		pkts = cap.seen()
		want = [2]datapath.Counter{}
		var fromVIP uint64
		for _, p := range pkts {
			if !telnet(p) {
				continue
			}
			d := datapath.Egress
			if p.toWeir {
				d = datapath.Ingress
			} else {
				fromVIP++
			}
			want[d].Packets += uint64(p.segs)
			want[d].Bytes += uint64(p.segBytes)
		}
		e.Meters().Totals(&tot)
		// The wire sees a segment after the TUN does.
		wirePkts = wire.seen()
		return tot.Services[0][datapath.Ingress] == want[datapath.Ingress] && tot.Services[0][datapath.Egress] == want[datapath.Egress] &&
			wireCount(wirePkts, false) == want[datapath.Egress].Packets &&
			e.Stats().Marked == marked && marked == fromVIP
	})
	cap.stop()
	wire.stop()
	if d, w := cap.drops(), wire.drops(); d > 0 || w > 0 {
		t.Fatalf("the captures lost %d packets on the TUN, %d on the wire: nothing below can be checked exactly", d, w)
	}
	if !agree {
		t.Errorf("telnet meters %+v, the capture saw %+v (ingress, egress)", tot.Services[0], want)
	}

	var super, superToWeir, fromVIP, wrongTOS, badSum, overMTU int
	for _, p := range pkts {
		if !telnet(p) {
			continue
		}
		if p.segs > 1 {
			if p.toWeir {
				superToWeir++
			} else {
				super++
			}
		}
		if p.len > 1500 {
			overMTU++
		}
		if p.toWeir {
			continue
		}
		fromVIP++
		if p.tos != 0xa0 {
			wrongTOS++
		}
		if !p.ip4OK {
			badSum++
		}
	}
	if wrongTOS > 0 || badSum > 0 {
		t.Errorf("of %d packets from the VIP, %d lack ToS 0xa0, %d have a bad IPv4 header checksum", fromVIP, wrongTOS, badSum)
	}
	if marked != uint64(fromVIP) {
		t.Errorf("engine marked %d packets, the capture saw %d from the VIP", marked, fromVIP)
	}
	// On the wire into the client's namespace, after the kernel cut the
	// super-packets (no segmentation offload on the router's veth): each
	// segment is at most the MTU and marked, and there are as many as the
	// meters counted.
	var onWire, wireTOS, wireSum, wireBig int
	for _, p := range wirePkts {
		if !telnet(p) || p.src.Port() != 23 {
			continue
		}
		onWire++
		if p.tos != 0xa0 {
			wireTOS++
		}
		if !p.ip4OK {
			wireSum++
		}
		if p.len > 1500 {
			wireBig++
		}
	}
	if wireTOS > 0 || wireSum > 0 || wireBig > 0 {
		t.Errorf("of %d segments from the VIP on the wire, %d lack ToS 0xa0, %d have a bad IPv4 header checksum, %d are over the MTU", onWire, wireTOS, wireSum, wireBig)
	}
	if uint64(onWire) != want[datapath.Egress].Packets {
		t.Errorf("%d segments from the VIP on the wire, the meters counted %d", onWire, want[datapath.Egress].Packets)
	}
	t.Logf("%v: %d segments on the wire; %d packets from the VIP (%d super-packets), %d super-packets to weir, meters %+v", mode, onWire, fromVIP, super, superToWeir, tot.Services[0])
	if mode == tun.OffloadOn {
		if super == 0 || superToWeir == 0 {
			t.Errorf("offload on: %d super-packets from weir, %d to weir; want some each way", super, superToWeir)
		}
	} else if overMTU > 0 {
		t.Errorf("offload off: %d packets over the MTU", overMTU)
	}
}

// wireCount counts the captured telnet packets from the VIP (toWeir false)
// or to it.
func wireCount(pkts []wirePacket, toVIP bool) uint64 {
	var n uint64
	for _, p := range pkts {
		if (toVIP && p.dst.Port() == 23) || (!toVIP && p.src.Port() == 23) {
			n++
		}
	}
	return n
}

// clientNS makes the client's namespace, joined to weir's (ns, where the
// test goroutine is) by a veth pair: wgr0 198.18.50.1/24, fd00:50::1/64 on
// weir's side, which forwards; wgc0 .2 / ::2 on the client's, routed
// through it. wgr0 has no segmentation offload, so the kernel cuts the
// super-packets weir writes before they go on the wire.
func clientNS(t *testing.T, ns *netns.NS) *netns.NS {
	t.Helper()
	client := testutil.NetNS(t)
	la := netlink.NewLinkAttrs()
	la.Name = "wgr0"
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "wgc0"}); err != nil {
		t.Fatal(err)
	}
	peer, err := netlink.LinkByName("wgc0")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetNsFd(peer, client.FD()); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"} {
		if err := os.WriteFile("/proc/sys/"+k, []byte("1"), 0); err != nil {
			t.Fatal(err)
		}
	}
	for _, cmd := range []uint32{ethtoolSTSO, ethtoolSGSO} {
		if err := ethtoolSet("wgr0", cmd, 0); err != nil {
			t.Fatalf("wgr0: turn segmentation offload off: %v", err)
		}
	}
	up := func(name string, addrs ...string) error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			ad, err := netlink.ParseAddr(a)
			if err != nil {
				return err
			}
			ad.Flags = unix.IFA_F_NODAD
			if err := netlink.AddrAdd(l, ad); err != nil {
				return err
			}
		}
		return netlink.LinkSetUp(l)
	}
	if err := up("wgr0", "198.18.50.1/24", "fd00:50::1/64"); err != nil {
		t.Fatal(err)
	}
	if err := client.Do(func() error {
		if err := up("wgc0", "198.18.50.2/24", "fd00:50::2/64"); err != nil {
			return err
		}
		l, err := netlink.LinkByName("wgc0")
		if err != nil {
			return err
		}
		for _, gw := range []string{"198.18.50.1", "fd00:50::1"} {
			r := netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.ParseIP(gw)}
			if err := netlink.RouteAdd(&r); err != nil {
				return fmt.Errorf("route via %s: %w", gw, err)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return client
}

// Legacy ethtool commands (linux/ethtool.h) that switch TCP segmentation
// offload and generic segmentation offload.
const (
	siocEthtool = 0x8946
	ethtoolSTSO = 0x1f
	ethtoolSGSO = 0x24
)

// ethtoolSet runs the ethtool_value command cmd with data on ifname, as
// "ethtool -K ifname tso off" does.
func ethtoolSet(ifname string, cmd, data uint32) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	v := struct{ cmd, data uint32 }{cmd, data}
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data unsafe.Pointer
		_    [16]byte
	}
	copy(ifr.name[:], ifname)
	ifr.data = unsafe.Pointer(&v)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), siocEthtool, uintptr(unsafe.Pointer(&ifr))); e != 0 {
		return e
	}
	return nil
}
