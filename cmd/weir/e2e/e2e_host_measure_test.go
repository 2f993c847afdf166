//go:build linux

package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"weir/bench"
	"weir/cmd/weir/api"
	"weir/internal/netns"
	"weir/internal/testutil"
	"weir/policy"
)

// What a via: host leg measures, through the real binary, in the user's
// default: no via: key, so weir dials the targets with kernel sockets and
// its host capture (datapath/hostcap) counts their segments. The targets
// sit in a namespace of their own behind a router namespace, whose FORWARD
// hook drops 5 % of t2's packets (nftables numgen): once toward weir
// (downloads: the target's segments, from_target), once toward t2
// (uploads: weir's, to_target). Neither TCP stack hears of the drops. Each
// phase checks what the user is after: t2's loss reads 2.5–10 % with
// source measured, its loss fraction is at least 25 %, its share of the
// new connections while cut is below 40 %, and the clean t1 is not cut.

// nftIn runs nft inside ns and returns its output.
func nftIn(t *testing.T, ns *netns.NS, args ...string) string {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("skipping: nft not installed (scripts/deps.sh installs nftables)")
	}
	var out []byte
	err := ns.Do(func() error {
		var err error
		out, err = exec.Command("nft", args...).CombinedOutput()
		return err
	})
	if err != nil {
		t.Fatalf("nft %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// dropInput adds a prerouting chain to ns dropping 5 % of the packets
// matching match (nft words).
func dropInput(t *testing.T, ns *netns.NS, match ...string) {
	t.Helper()
	nftIn(t, ns, "add", "table", "inet", "weirhost")
	nftIn(t, ns, "add", "chain", "inet", "weirhost", "pre", "{ type filter hook prerouting priority 0; }")
	nftIn(t, ns, append(append([]string{"add", "rule", "inet", "weirhost", "pre"}, match...), "numgen", "random", "mod", "100", "<", "5", "counter", "drop")...)
}

// routedTargets puts the targets (198.18.3.x and fd00:3::x on a loopback)
// in a namespace of their own behind a router namespace:
//
//	weir vw 198.18.2.1 fd00:2::1 ⇄ vr router rt 198.18.4.1 fd00:4::1 ⇄ vt 198.18.4.2 fd00:4::2 targets
//
// Every interface sends one segment per packet (gso_max_segs 1), so that
// a drop costs one segment, not a TSO burst. It returns the router and
// the targets' namespace.
func (w *weirProc) routedTargets() (router, tns *netns.NS) {
	t := w.t
	t.Helper()
	router, tns = testutil.NetNS(t), testutil.NetNS(t)
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
	veth(w.ns, "vw", "vr", router)
	veth(router, "rt", "vt", tns)
	type route struct{ dst, gw string }
	setup := func(ns *netns.NS, link string, addrs []string, routes []route) {
		t.Helper()
		if err := ns.Do(func() error {
			ln, err := netlink.LinkByName(link)
			if err != nil {
				return err
			}
			for _, a := range addrs {
				ad, _ := netlink.ParseAddr(a)
				ad.Flags = 0x02 // IFA_F_NODAD: usable at once
				if err := netlink.AddrAdd(ln, ad); err != nil {
					return fmt.Errorf("%s on %s: %w", a, link, err)
				}
			}
			if err := netlink.LinkSetGSOMaxSegs(ln, 1); err != nil {
				return fmt.Errorf("gso_max_segs: %w", err)
			}
			if err := netlink.LinkSetUp(ln); err != nil {
				return err
			}
			for _, r := range routes {
				rt := &netlink.Route{Gw: net.ParseIP(r.gw), LinkIndex: ln.Attrs().Index}
				if r.dst != "" {
					_, rt.Dst, _ = net.ParseCIDR(r.dst)
				}
				if err := netlink.RouteAdd(rt); err != nil {
					return fmt.Errorf("route %s via %s: %w", r.dst, r.gw, err)
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	setup(w.ns, "vw", []string{"198.18.2.1/24", "fd00:2::1/64"}, []route{{"198.18.3.0/24", "198.18.2.2"}, {"fd00:3::/64", "fd00:2::2"}})
	setup(router, "vr", []string{"198.18.2.2/24", "fd00:2::2/64"}, nil)
	setup(router, "rt", []string{"198.18.4.1/24", "fd00:4::1/64"}, []route{{"198.18.3.0/24", "198.18.4.2"}, {"fd00:3::/64", "fd00:4::2"}})
	setup(tns, "vt", []string{"198.18.4.2/24", "fd00:4::2/64"}, []route{{"", "198.18.4.1"}, {"", "fd00:4::1"}})
	if err := router.Do(func() error {
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644); err != nil {
			return err
		}
		return os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1\n"), 0o644)
	}); err != nil {
		t.Fatal(err)
	}
	if err := tns.Do(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		for _, s := range []string{"198.18.3.1/32", "198.18.3.2/32", "fd00:3::1/128", "fd00:3::2/128"} {
			a, _ := netlink.ParseAddr(s)
			a.Flags = 0x02 // IFA_F_NODAD
			if err := netlink.AddrAdd(lo, a); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	nftIn(t, router, "add", "table", "inet", "weirhost")
	nftIn(t, router, "add", "chain", "inet", "weirhost", "forw", "{ type filter hook forward priority 0; }")
	return router, tns
}

func TestE2EMeasureHostDialer(t *testing.T) {
	for _, tc := range []struct{ name, cfg, t1, t2 string }{
		{"ipv4", "measure_host.yaml", "198.18.3.1:8081", "198.18.3.2:8082"},
		{"ipv6", "measure_host6.yaml", "[fd00:3::1]:8081", "[fd00:3::2]:8082"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := startWeir(t, tc.cfg)
			router, tns := w.routedTargets()
			w.bodyBackend(tns, "t1", tc.t1, 128<<10)
			w.bodyBackend(tns, "t2", tc.t2, 128<<10)
			res := w.downloads(2, 20)
			if res.OK != 20 || res.PerTarget["t1"] == 0 || res.PerTarget["t2"] == 0 {
				t.Fatalf("through the host dialer: %+v", res)
			}
			// Each connection's flow leaves the capture once its final
			// reading has taken it, not doneLinger (3 s) after its last
			// packet: within 2 s at most the two clients' last
			// connections are left (their releases wait for the
			// reader's next packet).
			var hc *api.HostCapture
			if !testutil.WithinEvery(2*time.Second, 20*time.Millisecond, func() bool {
				hc = w.status().HostCapture
				return hc != nil && hc.Flows <= 2
			}) {
				t.Errorf("host capture after 20 ended connections: %+v; want at most 2 flows left", hc)
			}
			base := w.waitSampled(time.Now())
			if hc := base.HostCapture; hc == nil || hc.State != "on" || hc.Targets != 2 {
				t.Fatalf("host capture in /status: %+v; want on, 2 targets", hc)
			}
			clean, _ := segmentsOf(base, "t1")
			for _, d := range []api.DirTotals{clean.FromTarget, clean.ToTarget} {
				if d.Source != "measured" || !strings.Contains(d.Why, "host capture") {
					t.Fatalf("t1's directions: %+v; want measured by the host capture (capture %+v)", clean, *base.HostCapture)
				}
			}

			// 1. 5 % of t2's packets toward weir dropped, downloads.
			nftIn(t, router, "add", "rule", "inet", "weirhost", "forw", "tcp", "sport", "8082", "numgen", "random", "mod", "100", "<", "5", "counter", "drop")
			w.judgeHost(base, "from_target", func() bench.Result { return w.downloads(4, 40) })
			nftIn(t, router, "flush", "chain", "inet", "weirhost", "forw")

			// 2. 5 % of the packets toward t2 dropped, uploads of 64 KiB.
			nftIn(t, router, "add", "rule", "inet", "weirhost", "forw", "tcp", "dport", "8082", "numgen", "random", "mod", "100", "<", "5", "counter", "drop")
			w.judgeHost(w.status(), "to_target", func() bench.Result {
				return bench.Load{Dial: w.ns.Dial, Addr: "198.18.0.10:80", Clients: 4, Requests: 40, Upload: 64 << 10,
					Duration: 90 * time.Second, Timeout: 30 * time.Second}.Run(context.Background())
			})
		})
	}
}

// judgeHost runs load (40 requests a round) until t2 was cut reading dir
// and 60 more connections were picked under the cut (90 s at most), then
// checks the phase: t2's dir loss over the phase 2.5–10 %, source
// measured; the cut's loss fraction at least 25 % and by the seed's steps;
// t2's share of the picks under the cut below 40 %; clean t1 uncut.
func (w *weirProc) judgeHost(before api.Status, dir string, load func() bench.Result) {
	t := w.t
	t.Helper()
	pick := func(s api.Segments) api.DirTotals {
		if dir == "to_target" {
			return s.ToTarget
		}
		return s.FromTarget
	}
	b2, _ := segmentsOf(before, "t2")
	b1, _ := segmentsOf(before, "t1")
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for end := time.Now().Add(90 * time.Second); time.Now().Before(end); {
			select {
			case <-stop:
				return
			default:
			}
			if r := load(); r.OK != 40 {
				t.Errorf("%s phase: load under loss: %+v", dir, r)
				return
			}
		}
	}()
	var cut, clean1 *api.Target
	var cutSegs api.Segments
	var picked0, picked1 map[string]uint64
	var sum0 uint64
	testutil.WithinEvery(90*time.Second, 100*time.Millisecond, func() bool {
		select {
		case <-done:
			return true
		default:
		}
		st := w.status()
		sum, by := pickedSum(st, "web")
		if cut == nil {
			s2, t2 := segmentsOf(st, "t2")
			if t2 != nil && t2.Explanation != nil && !t2.Explanation.Held && t2.Explanation.LossFraction > 0 && s2.Direction == dir {
				cut, cutSegs, picked0, sum0 = t2, s2, by, sum
				_, clean1 = segmentsOf(st, "t1")
			}
			return false
		}
		picked1 = by
		return sum >= sum0+60
	})
	close(stop)
	<-done
	st := w.waitSampled(time.Now())
	a2, _ := segmentsOf(st, "t2")
	a1, _ := segmentsOf(st, "t1")
	d2, d1 := sub(pick(a2), pick(b2)), sub(pick(a1), pick(b1))
	r2 := float64(d2.Retransmitted) / float64(max(d2.DataSegments, 1))
	r1 := float64(d1.Retransmitted) / float64(max(d1.DataSegments, 1))
	t.Logf("%s phase, 5 %% dropped: t2 %s %d/%d = %.2f %% (timeouts %d, source %s: %s); clean t1 %d/%d = %.2f %%; capture %+v",
		dir, dir, d2.Retransmitted, d2.DataSegments, 100*r2, d2.Timeouts, d2.Source, pick(a2).Why, d1.Retransmitted, d1.DataSegments, 100*r1, *st.HostCapture)
	if d2.Source != "measured" || r2 < 0.025 || r2 > 0.10 {
		t.Errorf("t2 %s loss %.2f %% (source %s), want 2.5–10 %% measured", dir, 100*r2, d2.Source)
	}
	if cut == nil || picked1 == nil {
		t.Fatalf("t2 was never cut reading %s while its packets were lost", dir)
	}
	e := cut.Explanation
	t.Logf("t2 cut on %s (%s): loss %d‰ → fraction %d %%, weight %d → %d", cutSegs.Direction, cutSegs.DirectionWhy, e.LossRatio, e.LossFraction, cut.Weight, cut.Effective)
	if want := policy.StepFraction(e.Retransmits, e.SegmentsSent, 20, 25, 95); e.LossFraction != want || e.LossFraction < 25 || cut.Effective >= cut.Weight {
		t.Errorf("t2: loss %d‰ → fraction %d %% (seed's steps: %d, want ≥ 25), effective %d of %d", e.LossRatio, e.LossFraction, want, cut.Effective, cut.Weight)
	}
	if clean1 == nil || clean1.Effective != clean1.Weight {
		t.Errorf("clean t1 cut: %+v", clean1)
	}
	n1, n2 := picked1["t1"]-picked0["t1"], picked1["t2"]-picked0["t2"]
	share := float64(n2) / float64(max(n1+n2, 1))
	t.Logf("picks while cut: t1 %d, t2 %d (share %.0f %%)", n1, n2, 100*share)
	if share >= 0.40 {
		t.Errorf("t2's share of new connections while cut: %d of %d (%.0f %%), want below 40 %%", n2, n1+n2, 100*share)
	}
	if st.HostCapture == nil || st.HostCapture.Dropped != 0 {
		t.Logf("note: the capture lost packets: %+v", st.HostCapture)
	}
}

// TestE2EHostCaptureAfterDrop: weir run --user opens the host capture
// before it drops its privileges (CAP_NET_RAW goes), keeps measuring with
// it, and a reload that adds a via: host target points the capture's
// filter at it too (setting a filter needs no capability).
func TestE2EHostCaptureAfterDrop(t *testing.T) {
	requireE2E(t)
	if _, err := user.Lookup("nobody"); err != nil {
		t.Skip("skipping: no user nobody")
	}
	cfg, err := os.ReadFile(filepath.Join("testdata", "e2e", "measure_host.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	w := startWeirText(t, staticWeir(t), string(cfg), "--user", "nobody")
	_, tns := w.routedTargets()
	w.bodyBackend(tns, "t1", "198.18.3.1:8081", 64<<10)
	w.bodyBackend(tns, "t2", "198.18.3.2:8082", 64<<10)
	w.bodyBackend(tns, "t3", "198.18.3.1:8083", 64<<10)
	// CAP_NET_RAW (bit 13) is gone from the effective set.
	var eff uint64
	fmt.Sscanf(procStatus(t, fmt.Sprintf("/proc/%d/status", w.pid()))["CapEff"], "%x", &eff)
	if eff&(1<<13) != 0 {
		t.Fatalf("weir kept CAP_NET_RAW: CapEff %x", eff)
	}
	measured := func(target string) {
		t.Helper()
		st := w.waitSampled(time.Now())
		s, _ := segmentsOf(st, target)
		if st.HostCapture == nil || st.HostCapture.State != "on" || s.FromTarget.Source != "measured" || s.FromTarget.DataSegments == 0 {
			t.Fatalf("%s after the drop: %+v, capture %+v; want measured by the capture", target, s, st.HostCapture)
		}
	}
	if res := w.downloads(2, 20); res.OK != 20 {
		t.Fatalf("downloads: %+v", res)
	}
	measured("t1")
	more := strings.Replace(string(cfg), `      - {name: t2, address: "198.18.3.2:8082", weight: 10}`,
		`      - {name: t2, address: "198.18.3.2:8082", weight: 10}
      - {name: t3, address: "198.18.3.1:8083", weight: 10}`, 1)
	if err := os.WriteFile(w.cfgPath, []byte(more), 0o644); err != nil {
		t.Fatal(err)
	}
	w.signal(syscall.SIGHUP)
	w.waitStatus(5*time.Second, "reloaded", func(st api.Status) bool { return st.Generation == 2 })
	if res := w.downloads(3, 30); res.OK != 30 || res.PerTarget["t3"] == 0 {
		t.Fatalf("downloads after the reload: %+v", res)
	}
	measured("t3")
}
