package vmtest_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"weir/bench"
	"weir/cmd/weir/api"
	"weir/internal/netns"
)

// TestVMWeirRunDownloadLoss is the seed's own direction in the VM: the
// target's packets toward weir are lost, on the target's egress, with
// downloads (small requests, 128 KiB responses). weir run dials both targets
// through its back arm (via: netstack: gVisor's own stack, whose packets
// leave and come back through the TUN), so that the datapath counts every
// data segment each target sends and every one it sends again. netem in b's
// namespace drops 5 % of what b sends and delays it by 5 ms (the target's
// own qdisc: its TCP is not told, as a drop on the wire). b's from_target
// loss must read within a factor 2 of 5 %, b be cut and its share fall, a
// stay uncut.
//
//	root namespace (forwarding): clients → 198.18.0.80:80 → weir0 (TUN)
//	  weir's back arm 198.19.254.1 → weir0 → wa0 198.18.1.1/30 ↔ wa1 198.18.1.2 (ns a)
//	                               → weir0 → wb0 198.18.2.1/30 ↔ wb1 198.18.2.2 (ns b)
//	  netem loss 5 %, delay 5 ms on wb1, in ns b (b's segments toward weir)
//	  replies to 198.19.254.1: the targets' default route, then weir's route into the TUN
func TestVMWeirRunDownloadLoss(t *testing.T) {
	if !inWeirVM(t) {
		return
	}
	const lossPct = 5
	// The back arm's packets are forwarded between the TUN and the veths.
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	newDownloadTarget(t, "a", "wa", netip.MustParsePrefix("198.18.1.1/30"), netip.MustParsePrefix("198.18.1.2/30"))
	nsB := newDownloadTarget(t, "b", "wb", netip.MustParsePrefix("198.18.2.1/30"), netip.MustParsePrefix("198.18.2.2/30"))

	w := startWeir(t, downloadRunConfig)
	// The back arm works before any loss: both targets serve through it.
	warm := bench.Load{Addr: weirVIP, Clients: 2, Requests: 10, Duration: 30 * time.Second, Timeout: 10 * time.Second}.Run(context.Background())
	if warm.OK != 10 || warm.PerTarget["a"] == 0 || warm.PerTarget["b"] == 0 {
		t.Fatalf("downloads through the back arm before the loss: %+v", warm)
	}
	netemIn(t, nsB, "wb1", lossPct, 5*time.Millisecond)

	loadCtx, stopLoad := context.WithCancel(context.Background())
	defer stopLoad()
	loadStart := time.Now()
	stopTimer := time.AfterFunc(loadDuration, stopLoad)
	defer stopTimer.Stop()
	load := bench.Load{Addr: weirVIP, Clients: 4, Requests: loadRequests, Duration: loadDuration + 10*time.Second, Timeout: 10 * time.Second}
	var res bench.Result
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		res = load.Run(loadCtx)
	}()

	// One snapshot per sampling interval that ended while the load ran.
	var snaps []downloadSnapshot
	poll := time.NewTicker(200 * time.Millisecond)
	defer poll.Stop()
	for running := true; running; {
		select {
		case <-loadDone:
			running = false
		case <-poll.C:
			st, err := w.status()
			if err != nil {
				t.Logf("/status: %v", err)
				continue
			}
			select {
			case <-loadDone:
				running = false
				continue
			default:
			}
			sn, ok := downloadSnapshotOf(st)
			if !ok || !sn.at.After(loadStart) || (len(snaps) > 0 && !sn.at.After(snaps[len(snaps)-1].at)) {
				continue
			}
			snaps = append(snaps, sn)
		}
	}
	t.Logf("load: %d requests in %v: %d OK %v, %d 503, %d reset, %d failed %q",
		res.Requests, res.Elapsed.Round(time.Millisecond), res.OK, res.PerTarget, res.Refused503, res.Reset, res.Failed, res.Errors)
	for i, sn := range snaps {
		t.Logf("interval %d (sampled %s): a %s from %+v | b %s from %+v", i, sn.at.Format("15:04:05.000"),
			weirTarget(sn.a), sn.a.Segments.FromTarget, weirTarget(sn.b), sn.b.Segments.FromTarget)
	}
	w.stop(t)

	if res.OK == 0 || res.OK < (res.Requests-load.Clients)*9/10 {
		t.Errorf("load: %d of %d requests answered 200, want at least 90 %% of those not cut off by the time bound", res.OK, res.Requests)
	}
	if len(snaps) < 4 {
		t.Fatalf("only %d sampling intervals observed under load, want at least 4", len(snaps))
	}
	// The ratios over intervals 1..n (interval 0 may have begun before the
	// netem), from the per-direction totals.
	first, last := snaps[0], snaps[len(snaps)-1]
	da := sub(last.a.Segments.FromTarget, first.a.Segments.FromTarget)
	db := sub(last.b.Segments.FromTarget, first.b.Segments.FromTarget)
	tb := sub(last.b.Segments.ToTarget, first.b.Segments.ToTarget)
	if da.Source != "measured" || db.Source != "measured" {
		t.Fatalf("from_target source a %q, b %q: want measured (the back arm's passive count)", da.Source, db.Source)
	}
	if da.DataSegments < 1000 || db.DataSegments < 500 {
		t.Fatalf("too little traffic to measure: a sent %d data segments, b %d", da.DataSegments, db.DataSegments)
	}
	ra := float64(da.Retransmitted) / float64(da.DataSegments)
	rb := float64(db.Retransmitted) / float64(db.DataSegments)
	t.Logf("intervals 1..%d, %d %% netem on b's egress: b from_target %d/%d = %.2f %% (timeouts %d, out of order %d), to_target %d/%d; clean a from_target %d/%d = %.2f %%",
		len(snaps)-1, lossPct, db.Retransmitted, db.DataSegments, 100*rb, db.Timeouts, db.OutOfOrder, tb.Retransmitted, tb.DataSegments,
		da.Retransmitted, da.DataSegments, 100*ra)
	if lo, hi := float64(lossPct)/100/2, float64(lossPct)/100*2; rb < lo || rb > hi {
		t.Errorf("b's from_target loss %.2f %% with %d %% netem on its egress, want within a factor 2 (%.1f..%.1f %%)", 100*rb, lossPct, 100*lo, 100*hi)
	}
	// a's leg has no netem; a stalled emulator makes a's kernel resend now
	// and then. Below 2 % (the first LossRatioAndWeightFr step) it costs
	// no weight.
	if ra >= 0.02 {
		t.Errorf("a's from_target loss %.2f %% with no netem, want under 2 %%", 100*ra)
	}

	steady := snaps[1:]
	var bCut, aFull int
	for _, sn := range steady {
		if eb := sn.b.Explanation; eb.LossFraction > 0 && sn.b.Effective < sn.b.Weight {
			bCut++
		}
		if ea := sn.a.Explanation; ea.Fraction == 0 && sn.a.Effective == sn.a.Weight {
			aFull++
		}
	}
	t.Logf("b cut in %d of %d intervals, a at full weight in %d", bCut, len(steady), aFull)
	if 2*bCut <= len(steady) {
		t.Errorf("b's loss fraction cut its weight in %d of %d intervals, want most", bCut, len(steady))
	}
	if 2*aFull <= len(steady) {
		t.Errorf("a kept its full weight in %d of %d intervals, want most", aFull, len(steady))
	}
	cut := -1
	for i, sn := range snaps {
		if sn.b.Effective < sn.b.Weight {
			cut = i
			break
		}
	}
	if cut < 0 || cut == len(snaps)-1 {
		t.Fatalf("b was cut in no interval but the last (cut at %d of %d)", cut, len(snaps))
	}
	pa := last.a.Picked - snaps[cut].a.Picked
	pb := last.b.Picked - snaps[cut].b.Picked
	t.Logf("connections picked after b's cut (intervals %d..%d): a %d, b %d (b's share %.1f %%)",
		cut+1, len(snaps)-1, pa, pb, 100*float64(pb)/float64(max(pa+pb, 1)))
	if pa+pb == 0 || pb >= pa {
		t.Errorf("after b's weight was cut, a got %d connections and b %d; want b fewer", pa, pb)
	}
}

// downloadRunConfig: two equal targets dialed by the back arm, serving
// 128 KiB answers; a rule covers the service so that its connections are
// monitored (monitor.scope policy, the default), and the monitor reads the
// targets' own segments (monitor.direction fromTarget, the default).
const downloadRunConfig = `instance:
  name: vmtest-download
services:
  - name: web
    vips: [198.18.0.80]
    port: 80
    protocol: http
    targets:
      - {name: a, address: "198.18.1.2:8080", weight: 10, via: netstack}
      - {name: b, address: "198.18.2.2:8080", weight: 10, via: netstack}
actions:
  - {name: bulk, outgoingTOS: "00100000"}
rules:
  - {name: web, protocol: 6, sourcePorts: 80, action: bulk}
monitor:
  enabled: true
  samplingInterval: 1s
  lossRatioAndWeightFr: [20, 25]
balancer:
  algorithm: round-robin
  retryInterval: 1s
`

// newDownloadTarget is newWeirTarget for the back arm: a backend answering
// 128 KiB, and a default route in its namespace toward the VM's end of the
// veth, where the replies to the back arm's address are routed into the
// TUN. It returns the target's namespace.
func newDownloadTarget(t *testing.T, name, prefix string, local, remote netip.Prefix) *netns.NS {
	t.Helper()
	_, ln, ns := newVethListener(t, prefix, local, remote, 8080)
	err := ns.Do(func() error {
		p, err := netlink.LinkByName(prefix + "1")
		if err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{Gw: net.IP(local.Addr().AsSlice()), LinkIndex: p.Attrs().Index})
	})
	if err != nil {
		t.Fatalf("default route in %s's namespace: %v", name, err)
	}
	b := &bench.Backend{Name: name, Body: 128 << 10}
	go b.Serve(ln)
	t.Cleanup(func() { b.Close() })
	return ns
}

// netemIn puts netem (loss, delay) on link in ns: the target's own egress.
func netemIn(t *testing.T, ns *netns.NS, link string, lossPct float32, delay time.Duration) {
	t.Helper()
	err := ns.Do(func() error {
		l, err := netlink.LinkByName(link)
		if err != nil {
			return err
		}
		q := netlink.NewNetem(netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT},
			netlink.NetemQdiscAttrs{Loss: lossPct, Latency: uint32(delay.Microseconds())})
		if err := netlink.QdiscDel(q); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
			return err
		}
		return netlink.QdiscAdd(q)
	})
	if err != nil {
		t.Fatalf("netem on %s: %v", link, err)
	}
}

// downloadSnapshot is targets a and b of service web, with their segments,
// at one sampling interval.
type downloadSnapshot struct {
	at   time.Time
	a, b api.Target
}

func downloadSnapshotOf(st *api.Status) (downloadSnapshot, bool) {
	sn := downloadSnapshot{at: st.SampledAt}
	var ok [2]bool
	for _, s := range st.Services {
		if s.Name != "web" {
			continue
		}
		for _, tg := range s.Targets {
			if tg.Explanation == nil || tg.Segments == nil {
				continue
			}
			switch tg.Name {
			case "a":
				sn.a, ok[0] = tg, true
			case "b":
				sn.b, ok[1] = tg, true
			}
		}
	}
	return sn, ok[0] && ok[1] && !sn.at.IsZero()
}

// sub is a minus b, one direction's totals.
func sub(a, b api.DirTotals) api.DirTotals {
	return api.DirTotals{DataSegments: a.DataSegments - b.DataSegments, Retransmitted: a.Retransmitted - b.Retransmitted,
		Timeouts: a.Timeouts - b.Timeouts, OutOfOrder: a.OutOfOrder - b.OutOfOrder, Source: a.Source}
}
