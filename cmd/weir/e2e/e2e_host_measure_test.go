//go:build linux

package e2e

import (
	"context"
	"os/exec"
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

// What a via: host leg measures, through the real binary: the targets of
// TestE2EMeasureBackArm dialed by weir's kernel sockets, 5 % of t2's packets
// dropped by nftables, once toward weir (downloads: the target's segments,
// from_target), once toward t2 (uploads: weir's, to_target). The drops are
// on the receiving side's input path (prerouting), so neither sender's TCP
// hears of them. The figures are the closing note's for this dialer:
// to_target is the kernel sender's own count (TCP_INFO data_segs_out,
// total_retrans), exact; from_target is an estimate (data_segs_in and
// rcv_ooopack: the kernel counts no retransmissions it receives), so the
// target's own kernel (its RetransSegs) is logged beside it.

// nftIn runs nft inside ns.
func nftIn(t *testing.T, ns *netns.NS, args ...string) {
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
}

// dropInput adds a prerouting chain to ns dropping 5 % of the packets
// matching match (nft words).
func dropInput(t *testing.T, ns *netns.NS, match ...string) {
	t.Helper()
	nftIn(t, ns, "add", "table", "inet", "weirhost")
	nftIn(t, ns, "add", "chain", "inet", "weirhost", "pre", "{ type filter hook prerouting priority 0; }")
	nftIn(t, ns, append(append([]string{"add", "rule", "inet", "weirhost", "pre"}, match...), "numgen", "random", "mod", "100", "<", "5", "counter", "drop")...)
}

func TestE2EMeasureHostDialer(t *testing.T) {
	w := startWeir(t, "measure_host.yaml")
	tns := w.targetNS()
	// weir's side of the veth sends one segment per packet too, so that a
	// drop toward t2 costs one of weir's segments, not a GSO burst.
	if err := w.ns.Do(func() error {
		vw, err := netlink.LinkByName("vw")
		if err != nil {
			return err
		}
		return netlink.LinkSetGSOMaxSegs(vw, 1)
	}); err != nil {
		t.Fatal(err)
	}
	w.bodyBackend(tns, "t1", "198.18.3.1:8081", 128<<10)
	w.bodyBackend(tns, "t2", "198.18.3.2:8082", 128<<10)
	if res := w.downloads(2, 20); res.OK != 20 || res.PerTarget["t1"] == 0 || res.PerTarget["t2"] == 0 {
		t.Fatalf("through the host dialer: %+v", res)
	}
	base := w.waitSampled(time.Now())
	clean, _ := segmentsOf(base, "t1")
	if clean.FromTarget.Source != "estimate" || clean.ToTarget.Source != "measured" {
		t.Fatalf("t1's sources: from_target %q, to_target %q; want estimate and measured", clean.FromTarget.Source, clean.ToTarget.Source)
	}

	// 1. 5 % of t2's packets toward weir dropped, downloads.
	dropInput(t, w.ns, "ip", "saddr", "198.18.3.2", "tcp", "sport", "8082")
	b1, _ := segmentsOf(base, "t1")
	b2, _ := segmentsOf(base, "t2")
	kr0, kp0 := kernelRetrans(t, tns)
	dl := w.downloads(4, 400)
	if dl.OK != 400 {
		t.Fatalf("downloads under loss from t2: %+v", dl)
	}
	kr1, kp1 := kernelRetrans(t, tns)
	st := w.waitSampled(time.Now())
	a1, _ := segmentsOf(st, "t1")
	a2, t2 := segmentsOf(st, "t2")
	f1, f2 := sub(a1.FromTarget, b1.FromTarget), sub(a2.FromTarget, b2.FromTarget)
	t.Logf("5 %% dropped toward weir, 400 downloads of 128 KiB: t2 from_target (estimate) %d data segments, %d out of order (%.1f %%), retransmitted %d (unknown); "+
		"clean t1 %d data segments, %d out of order; the targets' kernel resent %d segments (%d tail-loss probes), %.2f %% of both targets' data segments",
		f2.DataSegments, f2.OutOfOrder, 100*float64(f2.OutOfOrder)/float64(max(f2.DataSegments, 1)), f2.Retransmitted,
		f1.DataSegments, f1.OutOfOrder, kr1-kr0, kp1-kp0, 100*float64(kr1-kr0)/float64(max(f1.DataSegments+f2.DataSegments, 1)))
	if f2.Source != "estimate" || f2.Retransmitted != 0 || f2.Timeouts != 0 {
		t.Errorf("t2 from_target through a host socket: %+v; want an estimate with no retransmission count", f2)
	}
	// The estimate sees the loss: every hole makes the segments after it
	// arrive out of order. The clean leg has some too (3–5 % measured:
	// veth's per-CPU backlogs reorder a burst now and then), far fewer.
	o1 := float64(f1.OutOfOrder) / float64(max(f1.DataSegments, 1))
	o2 := float64(f2.OutOfOrder) / float64(max(f2.DataSegments, 1))
	if o2 < 0.05 || o2 < 2*o1 {
		t.Errorf("t2 out of order %.1f %% of its data segments under 5 %% loss, clean t1 %.1f %%: want t2's clearly more", 100*o2, 100*o1)
	}
	// Its data segments are the responses': about 90 per 128 KiB (a
	// 1448-byte MSS), resends included.
	if n := f1.DataSegments + f2.DataSegments; n < 400*85 || n > 400*130 {
		t.Errorf("from_target data segments %d for 400 × 128 KiB", n)
	}
	// The unmeasured direction gives way to to_target: weir's data
	// segments (the requests), whose only loss is the target's ACKs lost
	// with its segments (a request resent after a timeout when no answer
	// came back), so a host leg judges download loss only through that.
	if t2 == nil || t2.Segments == nil {
		t.Fatalf("t2 has no segments in /status: %+v", t2)
	}
	tq := sub(a2.ToTarget, b2.ToTarget)
	t.Logf("t2 to_target meanwhile (kernel) %d/%d resent, %d timeouts; t2 weight %d → %d (last interval read %s)",
		tq.Retransmitted, tq.DataSegments, tq.Timeouts, t2.Weight, t2.Effective, t2.Segments.Direction)
	// One data segment per request, and its resends; never the ACKs.
	if n := uint64(dl.PerTarget["t2"]); tq.Source != "measured" || tq.DataSegments < n || tq.DataSegments > 2*n+50 {
		t.Errorf("t2 to_target during %d downloads from t2: %+v", n, tq)
	}
	// Which direction the last interval read is not checked: an interval
	// with no traffic measured neither.
	nftIn(t, w.ns, "delete", "table", "inet", "weirhost")

	// 2. 5 % of the packets toward t2 dropped, uploads of 64 KiB: weir's
	// own data segments, counted by its kernel.
	dropInput(t, tns, "ip", "daddr", "198.18.3.2", "tcp", "dport", "8082")
	b2 = a2
	var res bench.Result
	done := make(chan struct{})
	go func() {
		defer close(done)
		res = bench.Load{Dial: w.ns.Dial, Addr: "198.18.0.10:80", Clients: 4, Requests: 400, Upload: 64 << 10,
			Duration: 90 * time.Second, Timeout: 30 * time.Second}.Run(context.Background())
	}()
	// The first interval that judged t2 on its segments with a cut.
	var cut *api.Target
	testutil.WithinEvery(95*time.Second, 100*time.Millisecond, func() bool {
		select {
		case <-done:
			return true
		default:
		}
		if _, t2 := segmentsOf(w.status(), "t2"); cut == nil && t2 != nil && t2.Explanation != nil && !t2.Explanation.Held && t2.Explanation.LossFraction > 0 {
			cut = t2
		}
		return false
	})
	<-done
	if res.OK != 400 {
		t.Fatalf("uploads under loss toward t2: %+v", res)
	}
	st = w.waitSampled(time.Now())
	a2, _ = segmentsOf(st, "t2")
	tt := sub(a2.ToTarget, b2.ToTarget)
	r := float64(tt.Retransmitted) / float64(max(tt.DataSegments, 1))
	t.Logf("5 %% dropped toward t2, 400 uploads of 64 KiB: t2 to_target (kernel) %d/%d = %.2f %% (timeouts %d)",
		tt.Retransmitted, tt.DataSegments, 100*r, tt.Timeouts)
	if tt.Source != "measured" || r < 0.025 || r > 0.10 {
		t.Errorf("t2 to_target %+v = %.2f %%, want within a factor 2 of 5 %%", tt, 100*r)
	}
	if cut == nil {
		t.Fatal("t2 was never cut while the uploads toward it lost packets")
	}
	e := cut.Explanation
	t.Logf("t2 cut: loss %d‰ → fraction %d %%, weight %d → %d", e.LossRatio, e.LossFraction, cut.Weight, cut.Effective)
	if want := policy.StepFraction(e.Retransmits, e.SegmentsSent, 20, 25, 95); e.LossFraction != want || cut.Effective >= cut.Weight {
		t.Errorf("t2: loss %d‰ → fraction %d %% (want %d), effective %d of %d", e.LossRatio, e.LossFraction, want, cut.Effective, cut.Weight)
	}
}
