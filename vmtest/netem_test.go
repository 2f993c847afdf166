package vmtest_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"weir/internal/netns"
	"weir/netstack"
	"weir/netstack/proxy"
	"weir/vmtest"
)

// The scenarios' topology, inside the VM: the VM's own network namespace
// (the sender, 198.18.0.1) and a second one it creates (the receiver,
// 198.18.0.2), joined by a veth pair. netem on the sender's veth drops a
// share of the data segments; ACKs travel back unharmed.
var (
	senderAddr   = netip.MustParsePrefix("198.18.0.1/24")
	receiverAddr = netip.MustParsePrefix("198.18.0.2/24")
	receiverPort = uint16(5001)
)

// Transfer bounds: every transfer is at most 4 MB and transferTimeout.
const (
	transferBytes   = 4 << 20
	transferTimeout = 20 * time.Second
)

// vmModules are the kernel modules the scenarios need (Debian builds them
// as modules; the harness skips any that are built in).
var vmModules = []string{"veth", "sch_netem"}

// TestVMNetemLoss shows that netem inside the VM gives real segment loss
// that the sender's TCP_INFO sees: a bulk transfer through 5 % loss
// retransmits about 5 % of its segments, and one without netem retransmits
// none.
func TestVMNetemLoss(t *testing.T) {
	if !vmtest.InVM() {
		vmtest.RunTest(t, vmtest.Options{Modules: vmModules})
		return
	}
	link := newTopology(t)
	for _, tc := range []struct {
		name    string
		lossPct float32
		bytes   int64
	}{
		{"no-netem", 0, transferBytes},
		{"loss-5pct", 5, transferBytes},
		// Half the data: at 10 % loss retransmission timeouts make the
		// transfer several times slower under software emulation.
		{"loss-10pct", 10, transferBytes / 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			link.setNetem(t, tc.lossPct, 0)
			c, err := net.DialTimeout("tcp4", netip.AddrPortFrom(receiverAddr.Addr(), receiverPort).String(), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			tc2 := c.(*net.TCPConn)
			n, elapsed := transfer(t, tc2, tc.bytes)
			info := tcpInfo(t, tc2)
			c.Close()
			ratio := float64(info.Total_retrans) / float64(info.Segs_out)
			t.Logf("netem loss %.0f%%: %d bytes in %v; segs_out %d, total_retrans %d (ratio %.2f%%), lost %d, rto %v, backoff %d, total_rto %d",
				tc.lossPct, n, elapsed.Round(time.Millisecond), info.Segs_out, info.Total_retrans, 100*ratio,
				info.Lost, time.Duration(info.Rto)*time.Microsecond, info.Backoff, info.Total_rto)
			checkRatio(t, "TCP_INFO total_retrans/segs_out", ratio, tc.lossPct)
		})
	}
}

// TestVMWeirHostDialerLoss measures the same loss through weir's own target
// leg: netstack.HostDialer's connection and its Counters, which the QoS
// sampler turns into a target's loss ratio. A netem delay shows in the
// leg's RTT.
func TestVMWeirHostDialerLoss(t *testing.T) {
	if !vmtest.InVM() {
		vmtest.RunTest(t, vmtest.Options{Modules: vmModules})
		return
	}
	link := newTopology(t)
	for _, tc := range []struct {
		name    string
		lossPct float32
		delay   time.Duration
		bytes   int64
	}{
		{"no-netem", 0, 0, transferBytes},
		{"loss-5pct", 5, 0, transferBytes},
		// Less data: slow start at 50 ms RTT would need many round trips
		// and must stay below netem's 1000-packet queue.
		{"delay-50ms", 0, 50 * time.Millisecond, transferBytes / 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			link.setNetem(t, tc.lossPct, tc.delay)
			dupsBefore := link.duplicatesReceived(t)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			leg, err := (&netstack.HostDialer{}).DialTarget(ctx, netip.AddrPortFrom(receiverAddr.Addr(), receiverPort))
			if err != nil {
				t.Fatal(err)
			}
			n, elapsed := transfer(t, leg, tc.bytes)
			leg.Close()
			// Counters after Close returns the last values read, which
			// transfer's final read took: Close must not lose them.
			lc := leg.Counters()
			if lc.SegmentsSent == 0 {
				t.Fatalf("HostDialer leg counted no segments after sending %d bytes", n)
			}
			ratio := float64(lc.Retransmits) / float64(lc.SegmentsSent)
			t.Logf("netem loss %.0f%% delay %v: %d bytes in %v; leg SegmentsSent %d, Retransmits %d (ratio %.2f%%), Timeouts %d (known %v), RTT %v",
				tc.lossPct, tc.delay, n, elapsed.Round(time.Millisecond), lc.SegmentsSent, lc.Retransmits, 100*ratio,
				lc.Timeouts, lc.TimeoutsKnown, lc.RTT)
			if tc.lossPct > 0 {
				checkRatio(t, "HostDialer Retransmits/SegmentsSent", ratio, tc.lossPct)
			} else {
				// Without netem loss every resend is the VM kernel's own
				// spurious one (a tail-loss probe or a timeout when an
				// emulated ACK is late: under TCG 16 of 382 segments were
				// seen at 50 ms), and each reaches the receiver as a
				// duplicate it reports in a D-SACK. The leg must count
				// no resend the receiver did not see twice.
				dups := link.duplicatesReceived(t) - dupsBefore
				t.Logf("receiver: %d duplicate segments (D-SACKs sent)", dups)
				if extra := int64(lc.Retransmits) - dups; extra > 2 {
					t.Errorf("HostDialer Retransmits %d with no netem loss, but the receiver got only %d duplicates: %d resends unexplained", lc.Retransmits, dups, extra)
				}
			}
			// netem delays every data segment, so no RTT sample can be
			// shorter; emulation and the ACK path add, within reason.
			if tc.delay > 0 && (lc.RTT < tc.delay || lc.RTT > 5*tc.delay) {
				t.Errorf("HostDialer RTT %v with %v netem delay, want within [%v, %v]", lc.RTT, tc.delay, tc.delay, 5*tc.delay)
			}
		})
	}
}

// checkRatio asserts a measured retransmission ratio against the injected
// loss: within a factor of 2.5 either way, and under 1 % without loss (a
// heavily loaded emulator can fire a few spurious timeouts).
// Retransmissions are not losses one for one (a tail loss costs a probe, a
// lost retransmission costs another), hence the band.
func checkRatio(t *testing.T, what string, ratio float64, lossPct float32) {
	t.Helper()
	want := float64(lossPct) / 100
	if lossPct == 0 {
		if ratio > 0.01 {
			t.Errorf("%s = %.2f%% with no netem, want about 0", what, 100*ratio)
		}
		return
	}
	if lo, hi := want/2.5, want*2.5; ratio < lo || ratio > hi {
		t.Errorf("%s = %.2f%% with %.0f%% netem loss, want within [%.2f%%, %.2f%%]", what, 100*ratio, lossPct, 100*lo, 100*hi)
	}
}

// topology is the veth pair between the VM's namespace and the receiver's,
// with a discard server listening in the receiver's.
type topology struct {
	veth     netlink.Link // the sender's end, where netem goes
	receiver *netns.NS    // the receiver's namespace
}

// newTopology builds the namespaces, the veth pair, the addresses and the
// receiver. Everything lives in the VM, which is discarded after the test.
func newTopology(t *testing.T) *topology {
	t.Helper()
	if os.Getuid() != 0 {
		t.Fatal("the in-VM scenario must run as root")
	}
	veth, ln, ns := newVethListener(t, "wv", senderAddr, receiverAddr, receiverPort)
	t.Cleanup(func() { ln.Close() })
	go discardLoop(ln)
	return &topology{veth: veth, receiver: ns}
}

// duplicatesReceived reads the receiver namespace's count of D-SACKs sent
// (TcpExt TCPDSACKOldSent + TCPDSACKOfoSent): Linux sends one for every
// segment whose data it already had, so it counts the resends that
// arrived as duplicates.
func (tp *topology) duplicatesReceived(t *testing.T) int64 {
	t.Helper()
	var n int64
	err := tp.receiver.Do(func() error {
		b, err := os.ReadFile("/proc/thread-self/net/netstat")
		if err != nil {
			return err
		}
		lines := strings.Split(string(b), "\n")
		for i := 0; i+1 < len(lines); i += 2 {
			names, vals := strings.Fields(lines[i]), strings.Fields(lines[i+1])
			if len(names) == 0 || names[0] != "TcpExt:" {
				continue
			}
			for j := 1; j < len(names) && j < len(vals); j++ {
				if names[j] == "TCPDSACKOldSent" || names[j] == "TCPDSACKOfoSent" {
					v, err := strconv.ParseInt(vals[j], 10, 64)
					if err != nil {
						return fmt.Errorf("netstat %s: %w", names[j], err)
					}
					n += v
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("receiver's TcpExt counters: %v", err)
	}
	return n
}

// newVethListener builds a veth pair prefix0 (here, address local) ↔
// prefix1 (moved into a new namespace, address remote), one segment per
// packet both ways, and listens on remote:port inside that namespace. It
// returns the local end, where netem goes, the listener and the far
// namespace (closed when the test ends).
func newVethListener(t *testing.T, prefix string, local, remote netip.Prefix, port uint16) (netlink.Link, net.Listener, *netns.NS) {
	t.Helper()
	la := netlink.NewLinkAttrs()
	la.Name = prefix + "0"
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: prefix + "1"}); err != nil {
		t.Fatalf("veth %s: %v", la.Name, err)
	}
	veth, err := netlink.LinkByName(prefix + "0")
	if err != nil {
		t.Fatal(err)
	}
	peer, err := netlink.LinkByName(prefix + "1")
	if err != nil {
		t.Fatal(err)
	}
	// One segment per packet: with TSO/GSO a netem drop would take a whole
	// 64 KB super-packet, turning 5 % random loss into rare bursts.
	for _, l := range []netlink.Link{veth, peer} {
		if err := netlink.LinkSetGSOMaxSegs(l, 1); err != nil {
			t.Fatalf("gso_max_segs: %v", err)
		}
	}
	ns, err := netns.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	if err := netlink.LinkSetNsFd(peer, ns.FD()); err != nil {
		t.Fatalf("move veth peer: %v", err)
	}
	if err := netlink.AddrAdd(veth, &netlink.Addr{IPNet: ipNet(local)}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(veth); err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	err = ns.Do(func() error {
		// The package-level netlink calls open their socket on this
		// thread, so they act inside the far namespace.
		p, err := netlink.LinkByName(prefix + "1")
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(p, &netlink.Addr{IPNet: ipNet(remote)}); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(p); err != nil {
			return err
		}
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(remote.Addr(), port).String())
		return err
	})
	if err != nil {
		t.Fatalf("namespace behind %s: %v", prefix+"1", err)
	}
	return veth, ln, ns
}

// setNetem replaces the root qdisc of the sender's veth with netem dropping
// lossPct percent of packets and delaying each by delay, or removes it when
// both are 0.
func (tp *topology) setNetem(t *testing.T, lossPct float32, delay time.Duration) {
	t.Helper()
	attrs := netlink.QdiscAttrs{
		LinkIndex: tp.veth.Attrs().Index,
		Handle:    netlink.MakeHandle(1, 0),
		Parent:    netlink.HANDLE_ROOT,
	}
	q := netlink.NewNetem(attrs, netlink.NetemQdiscAttrs{Loss: lossPct, Latency: uint32(delay.Microseconds())})
	if err := netlink.QdiscDel(q); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
		t.Fatalf("remove netem: %v", err)
	}
	if lossPct == 0 && delay == 0 {
		return
	}
	if err := netlink.QdiscAdd(q); err != nil {
		t.Fatalf("netem loss %v%% delay %v: %v", lossPct, delay, err)
	}
}

// discardLoop accepts connections and reads each to EOF, then closes it,
// which tells the sender every byte arrived. It runs in its own goroutine
// until ln is closed.
func discardLoop(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(transferTimeout + 5*time.Second))
			_, _ = io.Copy(io.Discard, c)
		}()
	}
}

// halfCloser is a stream that can send its FIN: *net.TCPConn and weir's
// proxy.Leg.
type halfCloser interface {
	net.Conn
	CloseWrite() error
}

// transfer sends size bytes on c, half-closes, and waits for the
// receiver's close, so every segment has been acknowledged when it returns.
// It fails t past transferTimeout.
func transfer(t *testing.T, c halfCloser, size int64) (int64, time.Duration) {
	t.Helper()
	start := time.Now()
	if err := c.SetDeadline(start.Add(transferTimeout)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	var n int64
	for n < min(size, transferBytes) {
		m, err := c.Write(buf[:min(int64(len(buf)), size-n)])
		n += int64(m)
		if err != nil {
			t.Fatalf("after %d bytes in %v: %v", n, time.Since(start), err)
		}
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, c); err != nil {
		t.Fatalf("waiting for the receiver's close: %v", err)
	}
	if l, ok := c.(proxy.Leg); ok {
		l.Counters() // the last read while the socket is open
	}
	return n, time.Since(start)
}

// tcpInfo reads the kernel's TCP_INFO for c.
func tcpInfo(t *testing.T, c *net.TCPConn) *unix.TCPInfo {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var info *unix.TCPInfo
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil {
		t.Fatal(err)
	}
	if ierr != nil {
		t.Fatalf("TCP_INFO: %v", ierr)
	}
	return info
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
