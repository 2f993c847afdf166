package hostcap

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"weir/internal/netns"
	"weir/internal/testutil"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

// lab is three namespaces: the host (where the capture runs and the
// client dials, as weir does), a router that forwards and drops (nftables
// numgen in its FORWARD hook: losses neither TCP stack hears of) and the
// target.
//
//	host a0 198.18.5.1 fd00:5::1 ⇄ r0 router r1 198.18.6.1 fd00:6::1 ⇄ t0 198.18.6.2 fd00:6::2 target
type lab struct {
	t                testing.TB
	host, router, tg *netns.NS
}

func newLab(t testing.TB, hostGSO bool) *lab {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping: a netns test of real TCP connections under loss (-short)")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("skipping: nft not installed (scripts/deps.sh installs nftables)")
	}
	l := &lab{t: t, host: testutil.NetNS(t), router: testutil.NetNS(t), tg: testutil.NetNS(t)}
	veth := func(ns *netns.NS, name, peer string, peerNS *netns.NS) {
		t.Helper()
		if err := ns.Do(func() error {
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}); err != nil {
				return err
			}
			p, err := netlink.LinkByName(peer)
			if err != nil {
				return err
			}
			return netlink.LinkSetNsFd(p, peerNS.FD())
		}); err != nil {
			t.Fatal(err)
		}
	}
	veth(l.host, "a0", "r0", l.router)
	veth(l.router, "r1", "t0", l.tg)
	setup := func(ns *netns.NS, link string, addrs []string, gw []string, segs1 bool) {
		t.Helper()
		if err := ns.Do(func() error {
			ln, err := netlink.LinkByName(link)
			if err != nil {
				return err
			}
			for _, a := range addrs {
				ad, _ := netlink.ParseAddr(a)
				ad.Flags = unix.IFA_F_NODAD
				if err := netlink.AddrAdd(ln, ad); err != nil {
					return fmt.Errorf("%s on %s: %w", a, link, err)
				}
			}
			if segs1 {
				if err := netlink.LinkSetGSOMaxSegs(ln, 1); err != nil {
					return err
				}
			}
			if err := netlink.LinkSetUp(ln); err != nil {
				return err
			}
			for _, g := range gw {
				if err := netlink.RouteAdd(&netlink.Route{Gw: net.ParseIP(g), LinkIndex: ln.Attrs().Index}); err != nil {
					return fmt.Errorf("route via %s: %w", g, err)
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	setup(l.host, "a0", []string{"198.18.5.1/24", "fd00:5::1/64"}, []string{"198.18.5.2", "fd00:5::2"}, !hostGSO)
	setup(l.router, "r0", []string{"198.18.5.2/24", "fd00:5::2/64"}, nil, true)
	setup(l.router, "r1", []string{"198.18.6.1/24", "fd00:6::1/64"}, nil, true)
	setup(l.tg, "t0", []string{"198.18.6.2/24", "fd00:6::2/64"}, []string{"198.18.6.1", "fd00:6::1"}, true)
	if err := l.router.Do(func() error {
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644); err != nil {
			return err
		}
		return os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1\n"), 0o644)
	}); err != nil {
		t.Fatal(err)
	}
	l.nft("add", "table", "inet", "lab")
	l.nft("add", "chain", "inet", "lab", "forw", "{ type filter hook forward priority 0; }")
	return l
}

func (l *lab) nft(args ...string) string {
	l.t.Helper()
	var out []byte
	err := l.router.Do(func() error {
		var err error
		out, err = exec.Command("nft", args...).CombinedOutput()
		return err
	})
	if err != nil {
		l.t.Fatalf("nft %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// drop drops 5 % of the data segments (over 200 bytes: never a SYN or a
// pure ACK) matching match in the router.
func (l *lab) drop(match ...string) {
	l.nft(append(append([]string{"add", "rule", "inet", "lab", "forw"}, match...), "meta", "length", ">", "200", "numgen", "random", "mod", "100", "<", "5", "counter", "drop")...)
}

// dropped returns the packets the router's drop rule matching word (nft
// list text, e.g. "sport 9000") dropped so far.
func (l *lab) dropped(word string) uint64 {
	l.t.Helper()
	for _, line := range strings.Split(l.nft("list", "chain", "inet", "lab", "forw"), "\n") {
		if i := strings.Index(line, "counter packets "); i >= 0 && strings.Contains(line, word) {
			var n uint64
			fmt.Sscan(line[i+len("counter packets "):], &n)
			return n
		}
	}
	l.t.Fatalf("no drop rule on %q", word)
	return 0
}

// open opens a capture in the host namespace on targets.
func (l *lab) open(o Options, targets ...netip.AddrPort) *Capture {
	l.t.Helper()
	var c *Capture
	if err := l.host.Do(func() error {
		var err error
		c, err = Open(o)
		return err
	}); err != nil {
		l.t.Fatal(err)
	}
	l.t.Cleanup(func() { c.Close() })
	if err := c.SetTargets(targets); err != nil {
		l.t.Fatal(err)
	}
	return c
}

func tcpInfo(t testing.TB, c net.Conn) *unix.TCPInfo {
	t.Helper()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var info *unix.TCPInfo
	var ierr error
	rc.Control(func(fd uintptr) { info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) })
	if ierr != nil {
		t.Fatal(ierr)
	}
	return info
}

// transfer runs n connections from the host to addr, each moving size
// bytes up (upload) or down, and returns the host's sockets and the
// target's, open and idle (every byte acknowledged), for TCP_INFO.
func (l *lab) transfer(addr netip.AddrPort, n, size int, upload bool) (hostConns, tgConns []net.Conn) {
	t := l.t
	t.Helper()
	ln, err := l.tg.Listen("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var wg sync.WaitGroup
	var mu sync.Mutex
	errs := make(chan error, 2*n)
	wg.Add(2 * n)
	go func() {
		for i := 0; i < n; i++ {
			c, err := ln.Accept()
			if err != nil {
				errs <- err
				wg.Add(-(n - i))
				return
			}
			mu.Lock()
			tgConns = append(tgConns, c)
			mu.Unlock()
			go func() { defer wg.Done(); errs <- move(c, size, !upload) }()
		}
	}()
	for i := 0; i < n; i++ {
		c, err := l.host.Dial(context.Background(), "tcp", addr.String())
		if err != nil {
			t.Fatal(err)
		}
		hostConns = append(hostConns, c)
		go func() { defer wg.Done(); errs <- move(c, size, upload) }()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, c := range append(hostConns, tgConns...) {
			c.Close()
		}
	})
	// Idle: every byte acknowledged, no resend to come.
	if !testutil.WithinEvery(10*time.Second, 10*time.Millisecond, func() bool {
		for _, c := range append(hostConns, tgConns...) {
			if tcpInfo(t, c).Unacked != 0 {
				return false
			}
		}
		return true
	}) {
		t.Fatal("connections never idle")
	}
	return hostConns, tgConns
}

// move sends size bytes on c (send) or reads them; the reader answers one
// byte when it has all, which the sender waits for.
func move(c net.Conn, size int, send bool) error {
	c.SetDeadline(time.Now().Add(60 * time.Second))
	if send {
		buf := make([]byte, 64<<10)
		for left := size; left > 0; {
			n, err := c.Write(buf[:min(left, len(buf))])
			if err != nil {
				return err
			}
			left -= n
		}
		_, err := io.ReadFull(c, make([]byte, 1))
		return err
	}
	if _, err := io.CopyN(io.Discard, c, int64(size)); err != nil {
		return err
	}
	_, err := c.Write([]byte{1})
	return err
}

// sums returns the capture's counts of the flows of conns (host sockets).
func sums(c *Capture, conns []net.Conn) (toData, toRetrans, fromData, fromRetrans uint64, missing int) {
	for _, cn := range conns {
		s := c.Segments(cn.LocalAddr().(*net.TCPAddr).AddrPort(), cn.RemoteAddr().(*net.TCPAddr).AddrPort())
		if s == nil {
			missing++
			continue
		}
		to, from := s.ToTarget(), s.FromTarget()
		toData += to.DataSegments
		toRetrans += to.Retransmitted
		fromData += from.DataSegments
		fromRetrans += from.Retransmitted
	}
	return
}

func within(got, want uint64, frac float64) bool {
	d := float64(got) - float64(want)
	return d <= frac*float64(want)+1 && -d <= frac*float64(want)+1
}

// TestCaptureMatchesKernel: the capture's counts of real kernel TCP
// connections under 5 % loss in a router agree with the kernels' own:
// to_target (uploads, the host's segments) with the host sockets'
// tcpi_data_segs_out and tcpi_total_retrans within 1 %, from_target
// (downloads, the target's) with the target sockets' data segments less
// those the router dropped within 1 % and 50–120 % of their resends (a receiver does
// not see a lost tail segment as lost, and takes a resend within its
// reorder window for a reordering, a late original beyond it for a resend:
// datapath/seqtrack.go). With and without GSO on the
// host's interface (its super-packets count as their segments), IPv4 and
// IPv6.
func TestCaptureMatchesKernel(t *testing.T) {
	for _, tc := range []struct {
		name   string
		gso    bool
		target string
	}{
		{"ipv4", false, "198.18.6.2:9000"},
		{"ipv4 gso", true, "198.18.6.2:9000"},
		{"ipv6", false, "[fd00:6::2]:9000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLab(t, tc.gso)
			target := netip.MustParseAddrPort(tc.target)
			other := netip.AddrPortFrom(target.Addr(), 9001)
			c := l.open(Options{}, target)
			l.drop("tcp", "dport", "9000")
			l.drop("tcp", "sport", "9000")

			// Uploads: the host's segments toward the target.
			up, _ := l.transfer(target, 8, 4<<20, true)
			var want, wantRetrans uint64
			for _, cn := range up {
				info := tcpInfo(t, cn)
				want += uint64(info.Data_segs_out)
				wantRetrans += uint64(info.Total_retrans)
			}
			var got, gotRetrans uint64
			testutil.WithinEvery(5*time.Second, 10*time.Millisecond, func() bool {
				got, gotRetrans, _, _, _ = sums(c, up)
				return got >= want
			})
			t.Logf("to_target: capture %d data segments, %d resent (%.2f %%); kernel data_segs_out %d, total_retrans %d; capture %+v",
				got, gotRetrans, 100*float64(gotRetrans)/float64(max(got, 1)), want, wantRetrans, c.Stats())
			if wantRetrans < want/50 {
				t.Fatalf("the router dropped too little: %d resent of %d", wantRetrans, want)
			}
			if !within(got, want, 0.01) || !within(gotRetrans, wantRetrans, 0.01) {
				t.Errorf("to_target: capture %d/%d, kernel %d/%d: want within 1 %%", gotRetrans, got, wantRetrans, want)
			}

			// Downloads: the target's segments toward the host.
			drop0 := l.dropped("sport 9000")
			down, tgs := l.transfer(target, 8, 4<<20, false)
			drops := l.dropped("sport 9000") - drop0
			want, wantRetrans = 0, 0
			for _, cn := range tgs {
				info := tcpInfo(t, cn)
				want += uint64(info.Data_segs_out)
				wantRetrans += uint64(info.Total_retrans)
			}
			testutil.WithinEvery(5*time.Second, 10*time.Millisecond, func() bool {
				_, _, got, gotRetrans, _ = sums(c, down)
				return got >= want-drops
			})
			var rtts []time.Duration
			for _, cn := range down {
				if s := c.Segments(cn.LocalAddr().(*net.TCPAddr).AddrPort(), cn.RemoteAddr().(*net.TCPAddr).AddrPort()); s != nil {
					rtts = append(rtts, s.RTT())
				}
			}
			t.Logf("from_target: capture %d data segments, %d resent (%.2f %%); target kernel data_segs_out %d, total_retrans %d; the router dropped %d; handshake RTTs %v",
				got, gotRetrans, 100*float64(gotRetrans)/float64(max(got, 1)), want, wantRetrans, drops, rtts)
			// A dropped segment never reaches the host: the capture sees
			// the data segments sent less those the router dropped.
			// Of the resends, a receiver counts those that fill a hole
			// older than its reorder window, or repeat what it had: a lost
			// last segment of a burst (nothing of the target's after it)
			// leaves no hole, its resend is the first copy seen; and at
			// this lab's RTTs (handshakes 5–100 µs) half the handshake's
			// RTT, the window, takes some resends for reorderings. Counted
			// here, IPv6 (7 December 2026): 80–87 % of the kernel's resends
			// on a quiet machine, 60–87 % beside two CPU hogs (15 runs), 57 %
			// once in make soak beside the e2e packages: the busier the
			// machine, the fewer (which of the two reasons grows is not
			// pinned down; the handshake RTTs stayed 5–100 µs). The other
			// way, and the likely cause (not pinned down either): a veth
			// hands each packet to the backlog of the CPU its sender runs
			// on, so a sender that moves between the 2 CPUs under load can
			// have its packets reordered by tens of µs, beyond a window of
			// a few µs: a late original is then judged a resend, as
			// Wireshark would judge it. Counted (8 December 2026,
			// another machine): 63–93 % beside two CPU hogs (30 runs),
			// 107 % once in make soak (IPv4 with GSO, handshakes 5–24 µs).
			// The bound, 50–120 %, is for a capture that misses or invents
			// resends (a segment counted twice, a super-packet's segments
			// all judged resent: 2× and more), not for the load.
			if !within(got, want-drops, 0.01) || gotRetrans < wantRetrans/2 || gotRetrans > wantRetrans*120/100+2 {
				t.Errorf("from_target: capture %d/%d, kernel %d/%d: want 50–120 %% of the kernel's resends", gotRetrans, got, wantRetrans, want)
			}

			// The filter keeps only the targets': a connection to another
			// port of the same address is not tracked.
			o, _ := l.transfer(other, 1, 64<<10, true)
			if _, _, _, _, missing := sums(c, o); missing != 1 {
				t.Errorf("a connection to %v, not a target, was tracked", other)
			}
			if st := c.Stats(); st.Dropped != 0 || st.Malformed != 0 {
				t.Errorf("capture stats %+v: want no loss, nothing malformed", st)
			}
		})
	}
}

// TestCaptureLossCounted: with a receive buffer too small for a bulk
// transfer, the kernel drops captured packets, and Stats says so (the
// capture saw fewer segments than the kernel sent).
func TestCaptureLossCounted(t *testing.T) {
	l := newLab(t, false)
	target := netip.MustParseAddrPort("198.18.6.2:9000")
	c := l.open(Options{RcvBuf: 1}, target) // the kernel's minimum
	up, _ := l.transfer(target, 4, 8<<20, true)
	var want uint64
	for _, cn := range up {
		want += uint64(tcpInfo(t, cn).Data_segs_out)
	}
	got, _, _, _, _ := sums(c, up)
	st := c.Stats()
	t.Logf("tiny buffer: capture %d of %d data segments, %+v", got, want, st)
	if st.Dropped == 0 || got >= want {
		t.Errorf("no capture loss counted with a tiny buffer: %+v, %d of %d segments", st, got, want)
	}
}

// TestSyncCatchesUp: a request-response exchange on a kept connection,
// the way weir's HTTP proxy hands a pooled target connection back: once
// the host has read the target's answer from its socket, Sync returns true
// and the flow's counts already hold that answer, every round (the answer
// was queued on the capture's socket before the host's socket had it).
// Sync also returns at once when the reader had caught up before the call
// and nothing more comes (before, it waited out its bound for a later
// packet and said false).
func TestSyncCatchesUp(t *testing.T) {
	l := newLab(t, false)
	addr := netip.MustParseAddrPort("198.18.6.2:9300")
	c := l.open(Options{}, addr)
	ln := l.listen(addr)
	go func() {
		s, err := ln.Accept()
		if err != nil {
			return
		}
		defer s.Close()
		buf := make([]byte, 100)
		for {
			if _, err := io.ReadFull(s, buf); err != nil {
				return
			}
			if _, err := s.Write(buf); err != nil {
				return
			}
		}
	}()
	cn, err := l.host.Dial(context.Background(), "tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer cn.Close()
	cn.SetDeadline(time.Now().Add(60 * time.Second))
	local := cn.LocalAddr().(*net.TCPAddr).AddrPort()
	buf := make([]byte, 100)
	const rounds = 200
	for i := 1; i <= rounds; i++ {
		if _, err := cn.Write(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(cn, buf); err != nil {
			t.Fatal(err)
		}
		if !c.Sync(5 * time.Second) {
			t.Fatalf("round %d: Sync timed out", i)
		}
		s := c.Segments(local, addr)
		if s == nil {
			t.Fatalf("round %d: flow not seen", i)
		}
		if from, to := s.FromTarget().DataSegments, s.ToTarget().DataSegments; from != uint64(i) || to != uint64(i) {
			t.Fatalf("round %d: from_target %d, to_target %d data segments after Sync, want %d each", i, from, to, i)
		}
	}
	// Caught up, nothing more to come: at once, true.
	if !c.Sync(time.Second) {
		t.Fatal("Sync on an idle capture timed out")
	}
	// And without allocating (each final reading calls it).
	if allocs := testing.AllocsPerRun(100, func() {
		if !c.Sync(time.Second) {
			t.Error("Sync on an idle capture timed out")
		}
	}); allocs != 0 {
		t.Errorf("Sync on an idle capture: %.1f allocations, want 0", allocs)
	}
}

// TestReleaseDropsFlows: short connections, the client or the target
// closing first, each tracked to its end; once Release names them they
// leave the table at the reader's next batch (not doneLinger after their
// last packet), so the table holds only the connections not yet read.
func TestReleaseDropsFlows(t *testing.T) {
	l := newLab(t, false)
	addr := netip.MustParseAddrPort("198.18.6.2:9400")
	c := l.open(Options{}, addr)
	ln := l.listen(addr)
	go func() {
		for {
			s, err := ln.Accept()
			if err != nil {
				return
			}
			buf := make([]byte, 64)
			s.SetDeadline(time.Now().Add(30 * time.Second))
			if _, err := io.ReadFull(s, buf); err == nil {
				s.Write(buf)
			}
			s.Close() // the target closes first when the client waits
		}
	}()
	exchange := func(clientFirst bool) netip.AddrPort {
		t.Helper()
		cn, err := l.host.Dial(context.Background(), "tcp", addr.String())
		if err != nil {
			t.Fatal(err)
		}
		defer cn.Close()
		roundTrip(t, cn, 64)
		if !clientFirst {
			if _, err := cn.Read(make([]byte, 1)); err != io.EOF {
				t.Fatalf("after the answer: %v, want the target's FIN", err)
			}
		}
		return cn.LocalAddr().(*net.TCPAddr).AddrPort()
	}
	const n = 100
	var locals []netip.AddrPort
	for i := range n {
		locals = append(locals, exchange(i%2 == 0))
	}
	if !c.Sync(5 * time.Second) {
		t.Fatal("Sync timed out")
	}
	for _, local := range locals {
		s := c.Segments(local, addr)
		if s == nil || s.ToTarget().DataSegments != 1 || s.FromTarget().DataSegments != 1 {
			t.Fatalf("%v: %v, want one data segment each way", local, s)
		}
		c.Release(local, addr)
	}
	// The next connection's packets are a batch after the releases.
	next := exchange(true)
	if !c.Sync(5 * time.Second) {
		t.Fatal("Sync timed out")
	}
	for _, local := range locals {
		if c.Segments(local, addr) != nil {
			t.Fatalf("%v still tracked after Release", local)
		}
	}
	if c.Segments(next, addr) == nil {
		t.Fatal("the connection not released was dropped")
	}
	if st := c.Stats(); st.Flows > 2 { // next, and at most a late packet's
		t.Errorf("%d flows after releasing %d of %d, want 1", st.Flows, n, n+1)
	}
}

// TestForwardedNotTracked: a capture on a router that forwards others'
// connections to a target (the lab's host dialing through it) tracks
// none of them, and counts their packets as forwarded; the router's own
// connection to the target is tracked.
func TestForwardedNotTracked(t *testing.T) {
	l := newLab(t, false)
	addr := netip.MustParseAddrPort("198.18.6.2:9500")
	var c *Capture
	if err := l.router.Do(func() error {
		var err error
		c, err = Open(Options{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetTargets([]netip.AddrPort{addr}); err != nil {
		t.Fatal(err)
	}
	ln := l.listen(addr)
	go func() {
		for {
			s, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer s.Close()
				s.SetDeadline(time.Now().Add(30 * time.Second))
				io.Copy(s, s)
			}()
		}
	}()
	exchange := func(ns interface {
		Dial(context.Context, string, string) (net.Conn, error)
	}) netip.AddrPort {
		t.Helper()
		cn, err := ns.Dial(context.Background(), "tcp", addr.String())
		if err != nil {
			t.Fatal(err)
		}
		defer cn.Close()
		roundTrip(t, cn, 1000)
		return cn.LocalAddr().(*net.TCPAddr).AddrPort()
	}
	for range 20 {
		exchange(l.host)
	}
	own := exchange(l.router)
	if !c.Sync(5 * time.Second) {
		t.Fatal("Sync timed out")
	}
	st := c.Stats()
	t.Logf("capture on the router: %+v", st)
	if s := c.Segments(own, addr); s == nil || s.ToTarget().DataSegments != 1 || s.FromTarget().DataSegments != 1 {
		t.Errorf("the router's own connection: %v, want tracked, one data segment each way", s)
	}
	if st.Flows != 1 || st.Forwarded < 20*4 {
		t.Errorf("%d flows, %d packets forwarded; want 1 flow (the router's own), the 20 forwarded connections' packets counted", st.Flows, st.Forwarded)
	}

	// An address the router gets after the capture opened (weir started
	// before its interface was up) counts from its first connection.
	added := netip.MustParseAddr("198.18.6.9")
	var cn net.Conn
	if err := l.router.Do(func() error {
		ln, err := netlink.LinkByName("r1")
		if err != nil {
			return err
		}
		ad, _ := netlink.ParseAddr(added.String() + "/24")
		ad.Flags = unix.IFA_F_NODAD
		if err := netlink.AddrAdd(ln, ad); err != nil {
			return err
		}
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: added.AsSlice()}}
		cn, err = d.Dial("tcp", addr.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer cn.Close()
	roundTrip(t, cn, 1000)
	if !c.Sync(5 * time.Second) {
		t.Fatal("Sync timed out")
	}
	if s := c.Segments(cn.LocalAddr().(*net.TCPAddr).AddrPort(), addr); s == nil || s.ToTarget().DataSegments != 1 || s.RTT() == 0 {
		t.Errorf("a connection from an address added after Open: %v, want tracked from its SYN", s)
	}
}

// roundTrip writes size bytes on cn and reads as many back (the lab's
// targets answer each request whole), within 30 s.
func roundTrip(t testing.TB, cn net.Conn, size int) {
	t.Helper()
	cn.SetDeadline(time.Now().Add(30 * time.Second))
	buf := make([]byte, size)
	if _, err := cn.Write(buf); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(cn, buf); err != nil {
		t.Fatal(err)
	}
}

// listen listens on the target at addr until the test ends.
func (l *lab) listen(addr netip.AddrPort) net.Listener {
	l.t.Helper()
	ln, err := l.tg.Listen("tcp", addr.String())
	if err != nil {
		l.t.Fatal(err)
	}
	l.t.Cleanup(func() { ln.Close() })
	return ln
}
