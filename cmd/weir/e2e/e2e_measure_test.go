//go:build linux

package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"weir/bench"
	"weir/cmd/weir/api"
	"weir/internal/netns"
	"weir/internal/testutil"
	"weir/policy"
)

// The seed's measurement through the real binary: via: netstack targets
// dialed by weir's back arm through the TUN, downloads (a few bytes up,
// 128 KiB down), and 5 % of one target's packets dropped by nftables in the
// namespace: first toward weir (the target's own segments: from_target),
// then toward the target (weir's: to_target).

// nft runs nft inside the test's namespace and returns its output.
func (w *weirProc) nft(args ...string) string {
	w.t.Helper()
	return nftIn(w.t, w.ns, args...)
}

// targetNS puts the targets in a namespace of their own, behind a veth
// from weir's namespace (vw 198.18.2.1 ⇄ vt 198.18.2.2), with the target
// addresses 198.18.3.x on its loopback: weir's namespace forwards the back
// leg, as a host in front of real targets does, and its nftables drops are
// losses neither TCP stack hears of (a drop in the sender's own output
// hook is reported to its TCP, which just sends again later). The target
// side sends unsegmented packets (gso_max_segs 1), so a drop costs one
// segment, not a TSO burst.
func (w *weirProc) targetNS() *netns.NS {
	w.t.Helper()
	tns := testutil.NetNS(w.t)
	must := func(err error) {
		if err != nil {
			w.t.Fatal(err)
		}
	}
	must(w.ns.Do(func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "vw"}, PeerName: "vt"}); err != nil {
			return fmt.Errorf("veth: %w", err)
		}
		vw, err := netlink.LinkByName("vw")
		if err != nil {
			return err
		}
		vt, err := netlink.LinkByName("vt")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetNsFd(vt, tns.FD()); err != nil {
			return err
		}
		a, _ := netlink.ParseAddr("198.18.2.1/24")
		if err := netlink.AddrAdd(vw, a); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(vw); err != nil {
			return err
		}
		_, dst, _ := net.ParseCIDR("198.18.3.0/24")
		if err := netlink.RouteAdd(&netlink.Route{Dst: dst, Gw: net.ParseIP("198.18.2.2"), LinkIndex: vw.Attrs().Index}); err != nil {
			return fmt.Errorf("route to the targets: %w", err)
		}
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644)
	}))
	must(tns.Do(func() error {
		vt, err := netlink.LinkByName("vt")
		if err != nil {
			return err
		}
		a, _ := netlink.ParseAddr("198.18.2.2/24")
		if err := netlink.AddrAdd(vt, a); err != nil {
			return err
		}
		if err := netlink.LinkSetGSOMaxSegs(vt, 1); err != nil {
			return fmt.Errorf("gso_max_segs: %w", err)
		}
		if err := netlink.LinkSetUp(vt); err != nil {
			return err
		}
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		for _, s := range []string{"198.18.3.1/32", "198.18.3.2/32"} {
			a, _ := netlink.ParseAddr(s)
			if err := netlink.AddrAdd(lo, a); err != nil {
				return err
			}
		}
		return netlink.RouteAdd(&netlink.Route{Gw: net.ParseIP("198.18.2.1"), LinkIndex: vt.Attrs().Index})
	}))
	return tns
}

// kernelRetrans reads, in ns, the kernel's count of retransmitted TCP
// segments (RetransSegs) and of tail-loss probes (TCPLossProbes): the
// targets' own view of what they resent.
func kernelRetrans(t *testing.T, ns *netns.NS) (retrans, probes int) {
	t.Helper()
	err := ns.Do(func() error {
		for _, f := range []struct {
			file, key string
			dst       *int
		}{{"/proc/thread-self/net/snmp", "Tcp:RetransSegs", &retrans}, {"/proc/thread-self/net/netstat", "TcpExt:TCPLossProbes", &probes}} {
			b, err := os.ReadFile(f.file)
			if err != nil {
				return err
			}
			lines := strings.Split(string(b), "\n")
			for i := 0; i+1 < len(lines); i += 2 {
				names, vals := strings.Fields(lines[i]), strings.Fields(lines[i+1])
				for j := 1; j < len(names) && j < len(vals); j++ {
					if names[0]+names[j] == f.key {
						fmt.Sscan(vals[j], f.dst)
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return retrans, probes
}

// bodyBackend serves a bench.Backend answering body bytes on addr in ns.
func (w *weirProc) bodyBackend(ns *netns.NS, name, addr string, body int) {
	w.t.Helper()
	b := &bench.Backend{Name: name, Body: body}
	ln, err := ns.Listen("tcp", addr)
	if err != nil {
		w.t.Fatal(err)
	}
	go b.Serve(ln)
	w.t.Cleanup(func() { b.Close(); ln.Close() })
}

func segmentsOf(st api.Status, target string) (api.Segments, *api.Target) {
	if s := statusService(st, "web"); s != nil {
		for i := range s.Targets {
			if t := &s.Targets[i]; t.Name == target {
				if t.Segments != nil {
					return *t.Segments, t
				}
				return api.Segments{}, t
			}
		}
	}
	return api.Segments{}, nil
}

func sub(a, b api.DirTotals) api.DirTotals {
	return api.DirTotals{DataSegments: a.DataSegments - b.DataSegments, Retransmitted: a.Retransmitted - b.Retransmitted,
		Timeouts: a.Timeouts - b.Timeouts, OutOfOrder: a.OutOfOrder - b.OutOfOrder, Source: a.Source}
}

// downloads runs n downloads from the namespace through the VIP.
func (w *weirProc) downloads(clients, n int) bench.Result {
	return bench.Load{Dial: w.ns.Dial, Addr: "198.18.0.10:80", Clients: clients, Requests: n, Duration: 90 * time.Second, Timeout: 30 * time.Second}.Run(context.Background())
}

// waitSampled waits for a sampling interval that began after now.
func (w *weirProc) waitSampled(after time.Time) api.Status {
	w.t.Helper()
	return w.waitStatus(15*time.Second, "sampled", func(st api.Status) bool { return st.SampledAt.After(after.Add(3 * time.Second)) })
}

func TestE2EMeasureBackArm(t *testing.T) {
	w := startWeir(t, "measure.yaml")
	tns := w.targetNS()
	w.bodyBackend(tns, "t1", "198.18.3.1:8081", 128<<10)
	w.bodyBackend(tns, "t2", "198.18.3.2:8082", 128<<10)

	// The back arm works: every download is served through it, by both.
	res := w.downloads(2, 20)
	if res.OK != 20 || res.PerTarget["t1"] == 0 || res.PerTarget["t2"] == 0 {
		t.Fatalf("through the back arm: %+v", res)
	}
	base := w.waitSampled(time.Now())
	clean, _ := segmentsOf(base, "t1")
	// 128 KiB is 90 full segments or more (MSS 1460 or less).
	if n := res.PerTarget["t1"]; clean.FromTarget.Source != "measured" || clean.FromTarget.DataSegments < uint64(n)*90 {
		t.Fatalf("t1 from_target after %d × 128 KiB: %+v", n, clean.FromTarget)
	}

	// 1. 5 % of t2's packets toward weir dropped.
	w.nft("add", "table", "inet", "weirtest")
	w.nft("add", "chain", "inet", "weirtest", "forw", "{ type filter hook forward priority 0; }")
	w.nft("add", "rule", "inet", "weirtest", "forw", "ip", "saddr", "198.18.3.2", "tcp", "sport", "8082", "numgen", "random", "mod", "100", "<", "5", "counter", "drop")
	before2, _ := segmentsOf(base, "t2")
	before1, _ := segmentsOf(base, "t1")
	// Downloads run until t2 was cut and 60 more connections were picked
	// under the cut (bounded: 90 s). The first interval that judged t2 on
	// its segments (not held by the noise guard) is kept: its cut must
	// follow the seed's steps, and the picks after it show the share.
	kr0, kp0 := kernelRetrans(t, tns)
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
			if r := w.downloads(4, 40); r.OK != 40 {
				t.Errorf("downloads under loss from t2: %+v", r)
				return
			}
		}
	}()
	var cut, clean1 *api.Target
	var picked0, picked1 map[string]uint64
	var sum0 uint64
	testutil.WithinEvery(90*time.Second, 100*time.Millisecond, func() bool {
		st := w.status()
		sum, by := pickedSum(st, "web")
		if cut == nil {
			if _, t2 := segmentsOf(st, "t2"); t2 != nil && t2.Explanation != nil && !t2.Explanation.Held && t2.Explanation.LossFraction > 0 {
				cut, picked0, sum0 = t2, by, sum
				_, clean1 = segmentsOf(st, "t1")
			}
			return false
		}
		picked1 = by
		return sum >= sum0+60
	})
	close(stop)
	<-done
	if cut == nil || picked1 == nil {
		t.Fatal("t2 was never cut while its packets were lost")
	}
	kr1, kp1 := kernelRetrans(t, tns)
	t.Logf("the targets' kernel resent %d segments (%d tail-loss probes)", kr1-kr0, kp1-kp0)
	st := w.waitSampled(time.Now())
	after2, _ := segmentsOf(st, "t2")
	after1, _ := segmentsOf(st, "t1")
	d2, d1 := sub(after2.FromTarget, before2.FromTarget), sub(after1.FromTarget, before1.FromTarget)
	t.Logf("5 %% dropped toward weir: t2 from_target %d/%d = %.2f %% (timeouts %d, ooo %d), to_target %+v; clean t1 from_target %d/%d",
		d2.Retransmitted, d2.DataSegments, 100*float64(d2.Retransmitted)/float64(d2.DataSegments), d2.Timeouts, d2.OutOfOrder,
		sub(after2.ToTarget, before2.ToTarget), d1.Retransmitted, d1.DataSegments)
	// The passive count agrees with the targets' own kernel.
	if got, want := int(d1.Retransmitted+d2.Retransmitted), kr1-kr0; got < want*3/4-5 || got > want*5/4+5 {
		t.Errorf("weir counted %d retransmissions from the targets, their kernel %d", got, want)
	}
	// Within a factor 2 of the injected 5 %, over what the clean target
	// resends by itself in the same run (its kernel's spurious resends on a
	// loaded host, 0.7–2.2 % measured, happen on t2 as well).
	r1 := float64(d1.Retransmitted) / float64(max(d1.DataSegments, 1))
	if r := float64(d2.Retransmitted)/float64(d2.DataSegments) - r1; r < 0.025 || r > 0.10 {
		t.Errorf("t2 from_target loss %.2f %% above the clean target's %.2f %%, want within a factor 2 of 5 %%", 100*r, 100*r1)
	}
	// The clean target's own retransmissions are few (its tail-loss probes
	// when a loaded machine delays weir's ACKs past 2 ms): under the first
	// loss threshold, 2 %.
	if r := float64(d1.Retransmitted) / float64(d1.DataSegments); r >= 0.02 {
		t.Errorf("clean t1 from_target loss %.2f %%", 100*r)
	}
	// The cut follows the seed's steps: > 2 % → 25 %, > 4 % → 50 %.
	if cut == nil {
		t.Fatal("t2 was never cut while its packets were lost")
	}
	e := cut.Explanation
	t.Logf("t2 cut: %+v", *e)
	if want := policy.StepFraction(e.Retransmits, e.SegmentsSent, 20, 25, 95); e.LossFraction != want || cut.Effective >= cut.Weight {
		t.Errorf("t2: loss %d‰ → fraction %d %% (want %d), effective %d of %d", e.LossRatio, e.LossFraction, want, cut.Effective, cut.Weight)
	}
	// The clean target keeps its weight, unless its own kernel resent
	// beyond the first step in that interval: a loaded host (make soak
	// runs packages side by side) delays weir's ACKs past the targets'
	// tail-loss probe timer, and those resends are real ones, counted and
	// judged like any (the whole phase's ratio, under 2 %, is checked
	// above).
	switch {
	case clean1 == nil:
		t.Error("clean t1 missing from /status")
	case clean1.Effective != clean1.Weight && (clean1.Explanation == nil || clean1.Explanation.LossRatio <= 20):
		t.Errorf("clean t1 cut without a loss of its own: %+v, %+v", clean1, clean1.Explanation)
	case clean1.Effective != clean1.Weight:
		t.Logf("clean t1 cut for its own kernel's resends in that interval (a loaded host): %d‰ of %d segments, effective %d of %d",
			clean1.Explanation.LossRatio, clean1.Explanation.SegmentsSent, clean1.Effective, clean1.Weight)
	}
	// Its share of new connections fell while it was cut.
	n1, n2 := picked1["t1"]-picked0["t1"], picked1["t2"]-picked0["t2"]
	t.Logf("picks while cut: t1 %d, t2 %d (t2 effective %d)", n1, n2, cut.Effective)
	if n2 >= n1 {
		t.Errorf("t2's share did not fall: t1 %d, t2 %d", n1, n2)
	}

	// 2. The same downloads, 5 % of the packets toward t2 dropped: weir's
	// own data segments (the requests) are resent, the ACK stream does not
	// dilute the ratio. nftables counts the data segments it dropped and
	// passed (IP length over 100: a request of about 60 bytes with its
	// headers; weir's pure ACKs, SACK blocks included, stay under 81), so
	// the passive count is judged against what was really lost, then
	// against the loss injected into them (nftables' own drop ratio of
	// data segments). The downloads go on until 600 data segments toward
	// t2 passed the hook (60 s at most): every download sends one, and t2,
	// often still cut from the first phase, gets only a share of them.
	// The bound is the count, not a time: a loaded host that ran the
	// downloads slowly stopped them at 60 s with 99 segments, too few to
	// judge (14 dropped of 99 read as a broken 5 % rule); the time bound
	// (4 min) only stops a load that makes no progress, and fails saying
	// so. Judged against the nominal 5 % instead, as before, the few drops
	// (t2 got 276–547 of 1200 downloads: 14–27 drops expected) read
	// 2.4–6.8 % by their binomial spread alone: the "undercount" issue 10
	// noted was that, the count itself is exact.
	w.nft("flush", "chain", "inet", "weirtest", "forw")
	t2data := []string{"ip", "daddr", "198.18.3.2", "tcp", "dport", "8082", "ip", "length", ">", "100"}
	w.nft(append(append([]string{"add", "rule", "inet", "weirtest", "forw"}, t2data...), "numgen", "random", "mod", "100", "<", "5", "counter", "drop")...)
	w.nft(append(append([]string{"add", "rule", "inet", "weirtest", "forw"}, t2data...), "counter", "accept")...)
	w.nft("add", "rule", "inet", "weirtest", "forw", "ip", "daddr", "198.18.3.2", "tcp", "dport", "8082", "numgen", "random", "mod", "100", "<", "5", "counter", "drop")
	// dataCounts reads the first two rules' counters: data segments
	// dropped and passed.
	dataCounts := func() (dropped, passed uint64) {
		var n []uint64
		for _, line := range strings.Split(w.nft("list", "chain", "inet", "weirtest", "forw"), "\n") {
			if i := strings.Index(line, "counter packets "); i >= 0 && strings.Contains(line, "ip length > 100") {
				var v uint64
				fmt.Sscan(line[i+len("counter packets "):], &v)
				n = append(n, v)
			}
		}
		if len(n) != 2 {
			t.Fatalf("nft counters of t2's data segments: %v", n)
		}
		return n[0], n[1]
	}
	st = w.status()
	before2, _ = segmentsOf(st, "t2")
	var requests int
	const enough = 600
	for end := time.Now().Add(4 * time.Minute); ; {
		res = w.downloads(8, 200)
		if res.OK != 200 {
			t.Fatalf("downloads under loss toward t2: %+v", res)
		}
		requests += res.PerTarget["t2"]
		_, passed := dataCounts()
		if passed >= enough {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("only %d data segments toward t2 passed in 4 min (%d downloads at t2): too few to judge a 5 %% rule", passed, requests)
		}
	}
	st = w.waitSampled(time.Now())
	after2, _ = segmentsOf(st, "t2")
	dropped, passed := dataCounts()
	dt := sub(after2.ToTarget, before2.ToTarget)
	df := sub(after2.FromTarget, before2.FromTarget)
	t.Logf("5 %% dropped toward t2: to_target %d/%d = %.2f %% (timeouts %d) for %d downloads; nft dropped %d of %d data segments (%.2f %%); from_target %d/%d",
		dt.Retransmitted, dt.DataSegments, 100*float64(dt.Retransmitted)/float64(dt.DataSegments), dt.Timeouts, requests,
		dropped, dropped+passed, 100*float64(dropped)/float64(dropped+passed), df.Retransmitted, df.DataSegments)
	// Every data segment weir sent passed the hook once (dropped or not),
	// and every dropped one was resent (the downloads all succeeded); a
	// few spurious resends on a loaded host may come on top.
	if sent := dropped + passed; dt.DataSegments < sent*98/100 || dt.DataSegments > sent*102/100+2 {
		t.Errorf("to_target counted %d data segments, nftables saw %d", dt.DataSegments, sent)
	}
	if dt.Retransmitted < dropped*98/100 || dt.Retransmitted > dropped+dt.DataSegments/50+3 {
		t.Errorf("to_target counted %d retransmissions, nftables dropped %d data segments", dt.Retransmitted, dropped)
	}
	injected := float64(dropped) / float64(max(dropped+passed, 1))
	if r := float64(dt.Retransmitted) / float64(max(dt.DataSegments, 1)); injected == 0 || r < injected/2 || r > injected*2 {
		t.Errorf("t2 to_target loss %.2f %%, want within a factor 2 of the %.2f %% injected", 100*r, 100*injected)
	}
	// nftables' numgen drops 5 % of them, give or take the binomial
	// spread (4.8 standard deviations at 600 segments).
	if injected < 0.01 || injected > 0.10 {
		t.Errorf("nftables dropped %d of %d data segments toward t2 for a 5 %% rule", dropped, dropped+passed)
	}
	if _, t2 := segmentsOf(st, "t2"); t2 != nil && t2.Explanation != nil {
		t.Logf("t2 after the to_target phase: effective %d of %d, %+v", t2.Effective, t2.Weight, *t2.Explanation)
	}
	if dt.DataSegments > 2*uint64(requests)+50 {
		t.Errorf("to_target counted %d data segments for %d requests: ACKs counted?", dt.DataSegments, requests)
	}
	fams := w.metrics()
	for _, m := range []struct {
		name        string
		target, dir string
		atLeast     float64
	}{
		{"weir_target_data_segments_total", "t2", "from_target", 1000},
		{"weir_target_retransmitted_segments_total", "t2", "to_target", 1},
		{"weir_target_data_segments_total", "t1", "to_target", 1},
		{"weir_target_timeouts_total", "t1", "from_target", 0},
	} {
		v := metricSum(fams, m.name, map[string]string{"service": "web", "target": m.target, "direction": m.dir})
		if _, ok := fams[m.name]; !ok || v < m.atLeast {
			t.Errorf("%s{target=%s,direction=%s} = %v, want ≥ %v", m.name, m.target, m.dir, v, m.atLeast)
		}
	}
}
