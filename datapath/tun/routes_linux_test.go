//go:build linux

package tun

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"weir/policy"
)

func TestValidName(t *testing.T) {
	for _, tt := range []struct {
		name string
		bad  string // part of the error; empty: valid
	}{
		{"weir0", ""},
		{"abcdefghijklmno", ""}, // 15: the longest
		{"tun%d", ""},           // the kernel numbers it
		{"", "empty"},
		{"abcdefghijklmnop", "at most 15"}, // 16
		{"abcdefghijklmnopq", "at most 15"},
		{"a/b", "'/'"},
		{"a b", "white space"},
		{"eth0:1", "':'"},
		{".", "not an interface name"},
		{"..", "not an interface name"},
	} {
		err := ValidName(tt.name)
		if (err == nil) != (tt.bad == "") || err != nil && !strings.Contains(err.Error(), tt.bad) {
			t.Errorf("ValidName(%q) = %v, want %q", tt.name, err, tt.bad)
		}
	}
	// Open refuses before it creates anything (no root needed to see it).
	if _, err := Open(Options{Name: "abcdefghijklmnopq"}); err == nil || !strings.Contains(err.Error(), "at most 15") {
		t.Errorf("Open with a 17-byte name: %v", err)
	}
}

func TestVIPRoutes(t *testing.T) {
	a, b, c := netip.MustParseAddr("198.18.0.10"), netip.MustParseAddr("fd00::10"), netip.MustParseAddr("::ffff:198.18.0.11")
	cfg := &policy.Config{Services: []*policy.VirtualServer{{VIPs: []netip.Addr{a, b}}, {VIPs: []netip.Addr{a, c}}}}
	got := VIPRoutes(cfg)
	want := []netip.Prefix{netip.MustParsePrefix("198.18.0.10/32"), netip.MustParsePrefix("fd00::10/128"), netip.MustParsePrefix("198.18.0.11/32")}
	if !slices.Equal(got, want) {
		t.Errorf("VIPRoutes = %v, want %v", got, want)
	}
}

// routesOf lists the non-kernel routes through the link named name, as
// prefixes, in the calling thread's namespace.
func routesOf(t *testing.T, name string) []string {
	t.Helper()
	link, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := netlink.RouteList(link, fam)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			if r.Dst != nil && r.Protocol != rtProtKernel {
				out = append(out, r.Dst.String())
			}
		}
	}
	slices.Sort(out)
	return out
}

// TestTUNSyncRoutes: Open routes the first config's VIPs; SyncVIPs, called
// from a goroutine outside the test's namespace as a reload is, adds the
// new VIPs' routes, removes the gone ones and leaves the kernel's routes
// for the interface's own addresses.
func TestTUNSyncRoutes(t *testing.T) {
	inNetns(t)
	vs := func(vips ...string) *policy.Config {
		s := &policy.VirtualServer{}
		for _, v := range vips {
			s.VIPs = append(s.VIPs, netip.MustParseAddr(v))
		}
		return &policy.Config{Services: []*policy.VirtualServer{s}}
	}
	devs, err := Open(Options{
		Name: "weirrt0", Queues: 2,
		Addrs:  []netip.Prefix{netip.MustParsePrefix("198.18.0.1/24")},
		Routes: VIPRoutes(vs("198.19.0.1", "198.19.0.2")),
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := routesOf(t, "weirrt0"); !slices.Equal(got, []string{"198.19.0.1/32", "198.19.0.2/32"}) {
		t.Fatalf("routes after Open: %v", got)
	}
	errc := make(chan error)
	go func() { errc <- devs[1].SyncVIPs(vs("198.19.0.2", "198.19.0.3", "fd01::3")) }()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if got := routesOf(t, "weirrt0"); !slices.Equal(got, []string{"198.19.0.2/32", "198.19.0.3/32", "fd01::3/128"}) {
		t.Fatalf("routes after SyncVIPs: %v", got)
	}
	if err := devs[0].SyncRoutes(nil); err != nil {
		t.Fatal(err)
	}
	if got := routesOf(t, "weirrt0"); len(got) != 0 {
		t.Fatalf("routes after SyncRoutes(nil): %v", got)
	}
	// The kernel's route for the interface's own address stays.
	if rs, err := netlink.RouteGet(net.ParseIP("198.18.0.7")); err != nil || len(rs) == 0 || rs[0].LinkIndex != devs[0].link.index {
		t.Errorf("the interface's own prefix is no longer routed through it: %v %v", rs, err)
	}
	devs[0].Close()
	if err := devs[1].SyncRoutes(nil); err != nil {
		t.Errorf("SyncRoutes with one queue still open: %v", err)
	}
	devs[1].Close()
	if err := devs[1].SyncRoutes(nil); !errors.Is(err, os.ErrClosed) {
		t.Errorf("SyncRoutes after the last Close = %v, want os.ErrClosed", err)
	}
}

// TestTUNKernelCounters: packets routed into a TUN nobody reads overflow
// its queue, and TUNStats reports the kernel's drops.
func TestTUNKernelCounters(t *testing.T) {
	inNetns(t)
	devs, err := Open(Options{Name: "weirst0", TxQueueLen: 8, Routes: []netip.Prefix{netip.MustParsePrefix("198.19.0.0/16")}})
	if err != nil {
		t.Fatal(err)
	}
	d := devs[0]
	defer d.Close()
	conn, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.MustParseAddrPort("198.19.0.7:9999")))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const sent = 200
	for range sent {
		conn.Write([]byte("x"))
	}
	st, err := d.TUNStats()
	if err != nil {
		t.Fatal(err)
	}
	// The kernel queues up to TxQueueLen packets (and a few in flight);
	// the rest are dropped before any read.
	if st.KernelTxDropped < sent/2 || st.KernelTxDropped > sent {
		t.Errorf("KernelTxDropped = %d of %d sent to a queue of 8: %+v", st.KernelTxDropped, sent, st)
	}
	if st.RxPackets != 0 || st.WriteErrors != 0 {
		t.Errorf("queue counters moved without a read or write: %+v", st)
	}
}
