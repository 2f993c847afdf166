package vmtest_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"weir/bench"
	"weir/cmd/weir/api"
	"weir/internal/testutil/weirproc"
	"weir/policy"
	"weir/vmtest"
)

// TestVMWeirRunLoss runs the real weir binary (`weir run`) inside the VM in
// front of two HTTP targets, each in its own network namespace behind its
// own veth pair, with 5 % netem loss toward target b only. An upload load
// through the VIP makes weir's own TCP legs to the targets carry the bulk
// data, so the QoS monitor measures b's loss from TCP_INFO, cuts b's weight
// (z/OS LossRatioAndWeightFr 20 25: 25 % per whole 2 % exceeded) and the
// balancer then sends b fewer connections than a.
//
//	root namespace: clients → 198.18.0.80:80 → weir0 (TUN, weir run)
//	  weir → wa0 198.18.1.1/30 ↔ wa1 198.18.1.2 (ns a): bench.Backend "a"
//	  weir → wb0 198.18.2.1/30 ↔ wb1 198.18.2.2 (ns b): bench.Backend "b"
//	  netem loss 5 % on wb0 (weir's data segments toward b)
func TestVMWeirRunLoss(t *testing.T) {
	if !inWeirVM(t) {
		return
	}
	const lossPct = 5
	newWeirTarget(t, "a", "wa", netip.MustParsePrefix("198.18.1.1/30"), netip.MustParsePrefix("198.18.1.2/30"))
	lossy := newWeirTarget(t, "b", "wb", netip.MustParsePrefix("198.18.2.1/30"), netip.MustParsePrefix("198.18.2.2/30"))
	lossy.setNetem(t, lossPct, 0)

	w := startWeir(t, weirRunConfig)

	// The load: new connection per request (the balancer decides per
	// connection), each a POST of 64 KiB, bounded in count and time.
	dials := &dialLog{start: time.Now()}
	load := bench.Load{
		Dial:     dials.dial,
		Addr:     weirVIP,
		Clients:  4,
		Requests: loadRequests,
		Duration: loadDuration + 10*time.Second, // a backstop: the cancel below ends it
		Timeout:  10 * time.Second,
		Upload:   64 << 10,
	}
	var (
		res      bench.Result
		loadDone = make(chan struct{})
	)
	// The load ends by a cancel, not by its own Duration: past a timer's
	// deadline its context reports no error until the timer fires, and in
	// that window the clients would start requests that fail at once.
	loadCtx, stopLoad := context.WithCancel(context.Background())
	defer stopLoad()
	loadStart := time.Now()
	stopTimer := time.AfterFunc(loadDuration, stopLoad)
	defer stopTimer.Stop()
	go func() {
		defer close(loadDone)
		res = load.Run(loadCtx)
	}()

	// Poll /status while the load runs; keep one snapshot per sampling
	// interval, only those whose interval ended while the load still ran.
	var snaps []weirSnapshot
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
				continue // may describe an interval after the load
			default:
			}
			sn, ok := snapshotOf(st)
			if !ok || !sn.at.After(loadStart) || (len(snaps) > 0 && !sn.at.After(snaps[len(snaps)-1].at)) {
				continue
			}
			snaps = append(snaps, sn)
		}
	}
	t.Logf("load: %d requests in %v: %d OK %v, %d 503, %d reset, %d failed %q",
		res.Requests, res.Elapsed.Round(time.Millisecond), res.OK, res.PerTarget, res.Refused503, res.Reset, res.Failed, res.Errors)
	t.Logf("dials: %s", dials)
	for i, sn := range snaps {
		t.Logf("interval %d (sampled %s): a %s | b %s", i, sn.at.Format("15:04:05.000"), sn.a, sn.b)
	}
	w.stop(t)

	// The requests in flight when the load is stopped fail ("operation was
	// canceled"), at most one per client; of the rest, 90 % must pass.
	if res.OK == 0 || res.OK < (res.Requests-load.Clients)*9/10 {
		t.Errorf("load: %d of %d requests answered 200, want at least 90 %% of those not cut off by the time bound", res.OK, res.Requests)
	}
	// The first interval ran at equal weights; the rest (at least three)
	// show the measurement and its effect. One interval carries a few
	// hundred segments under emulation, so its ratio is noisy (one
	// retransmission more or less moves it by about 0.5 %): the ratios are
	// checked over all of them, the weights interval by interval.
	if len(snaps) < 4 {
		t.Fatalf("only %d sampling intervals observed under load, want at least 4", len(snaps))
	}
	steady := snaps[1:]
	var aSent, aRetr, bSent, bRetr uint64
	var bCut, aFull, measured int
	for _, sn := range steady {
		ea, eb := sn.a.Explanation, sn.b.Explanation
		aSent += ea.SegmentsSent
		aRetr += ea.Retransmits
		bSent += eb.SegmentsSent
		bRetr += eb.Retransmits
		if eb.LossFraction > 0 && sn.b.Effective < sn.a.Effective {
			bCut++
		}
		if ea.Fraction == 0 && sn.a.Effective == sn.a.Weight {
			aFull++
		}
		if !eb.Held {
			measured++
		}
	}
	if aSent < 2*policy.MinSegments || bSent < 2*policy.MinSegments {
		t.Fatalf("too little traffic to measure: a sent %d segments, b %d, want at least %d each", aSent, bSent, 2*policy.MinSegments)
	}
	aRatio, bRatio := float64(aRetr)/float64(aSent), float64(bRetr)/float64(bSent)
	t.Logf("intervals 1..%d: a sent %d segments, %d retransmitted (%.2f%%), at full weight in %d; b sent %d, %d retransmitted (%.2f%%), cut below a in %d (%d measured, not held)",
		len(steady), aSent, aRetr, 100*aRatio, aFull, bSent, bRetr, 100*bRatio, bCut, measured)
	checkRatio(t, "weir's loss ratio to b over intervals 1..n", bRatio, lossPct)
	// a's leg has no netem; an emulator stalled for a few hundred
	// milliseconds fires a spurious retransmission timeout now and then.
	// Below 2 % (the LossRatioAndWeightFr threshold) it costs no weight.
	if aRatio >= 0.02 {
		t.Errorf("weir's loss ratio to a over intervals 1..n = %.2f%% with no netem, want about 0 (under 2 %%)", 100*aRatio)
	}
	if 2*bCut <= len(steady) {
		t.Errorf("b's loss fraction cut its weight below a's in %d of %d intervals, want most", bCut, len(steady))
	}
	if 2*aFull <= len(steady) {
		t.Errorf("a kept its full weight in %d of %d intervals, want most", aFull, len(steady))
	}
	last := snaps[len(snaps)-1]
	la, lb := last.a, last.b
	t.Logf("last interval under load: a LossRatio %d‰ LossFraction %d%% Fraction %d%% Weight %d Effective %d; b LossRatio %d‰ LossFraction %d%% Fraction %d%% Weight %d Effective %d",
		la.Explanation.LossRatio, la.Explanation.LossFraction, la.Explanation.Fraction, la.Weight, la.Effective,
		lb.Explanation.LossRatio, lb.Explanation.LossFraction, lb.Explanation.Fraction, lb.Weight, lb.Effective)

	// b's share of new connections since its weight was first cut.
	cut := -1
	for i, sn := range snaps {
		if sn.b.Effective < sn.a.Effective {
			cut = i
			break
		}
	}
	if cut < 0 || cut == len(snaps)-1 {
		t.Fatalf("b's effective weight was below a's in no interval but the last (cut at %d of %d)", cut, len(snaps))
	}
	pa := last.a.Picked - snaps[cut].a.Picked
	pb := last.b.Picked - snaps[cut].b.Picked
	t.Logf("connections picked over intervals %d..%d (after b's cut): a %d, b %d (b's share %.1f%%); whole load a %d, b %d",
		cut+1, len(snaps)-1, pa, pb, 100*float64(pb)/float64(max(pa+pb, 1)), last.a.Picked, last.b.Picked)
	if pa+pb == 0 || pb >= pa {
		t.Errorf("after b's weight was cut, a got %d connections and b %d; want b fewer", pa, pb)
	}
}

// The scenario's bounds and addresses.
const (
	weirVIP      = "198.18.0.80:80"
	loadRequests = 4000
	loadDuration = 12 * time.Second
	weirStopWait = 15 * time.Second
)

const weirRunConfig = `instance:
  name: vmtest
services:
  - name: web
    vips: [198.18.0.80]
    port: 80
    protocol: http
    targets:
      - {name: a, address: "198.18.1.2:8080", weight: 10, via: host}
      - {name: b, address: "198.18.2.2:8080", weight: 10, via: host}
monitor:
  enabled: true
  samplingInterval: 1s
  lossRatioAndWeightFr: [20, 25]
  # The load uploads (netem drops weir's segments toward b): weir's own
  # resends, read from TCP_INFO; no policy rule covers the service, so
  # every connection is monitored.
  direction: toTarget
  scope: all
balancer:
  algorithm: round-robin
  # A dial to b fails when netem drops its SYN twice (3 s dial timeout),
  # about once in 400; b then rests one interval, not the default minute.
  retryInterval: 1s
`

// newWeirTarget builds a veth pair prefix<0> (here, address local) ↔
// prefix<1> (in a new namespace, address remote), one segment per packet
// both ways, and serves a bench.Backend named name on remote:8080 in that
// namespace. It returns the local end, where netem goes.
func newWeirTarget(t *testing.T, name, prefix string, local, remote netip.Prefix) *topology {
	t.Helper()
	veth, ln, _ := newVethListener(t, prefix, local, remote, 8080)
	b := &bench.Backend{Name: name}
	go b.Serve(ln)
	t.Cleanup(func() { b.Close() })
	return &topology{veth: veth}
}

// weirProc is a running `weir run`.
type weirProc struct{ *weirproc.Proc }

// startWeir writes cfg and starts /bin/weir run on it with the TUN weir0
// (198.18.0.1/32) and the admin API on a free loopback port
// (weirproc.Start), and waits for it to be ready. A cleanup kills it if the
// test ends before stop.
func startWeir(t *testing.T, cfg string) *weirProc {
	t.Helper()
	cfgPath := filepath.Join(t.TempDir(), "weir.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	// If weir exits before it is ready, its own error message may be
	// missing (`weir run` closes its log, stderr, before main prints the
	// error): say whether the VM has a TUN.
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Logf("no /dev/net/tun in the VM: %v", err)
	}
	return &weirProc{weirproc.Start(t, weirproc.Options{Binary: "/bin/weir", Config: cfgPath, Extra: []string{"--grace", "5s"}})}
}

// status reads /status.
func (w *weirProc) status() (*api.Status, error) {
	var st api.Status
	if err := w.GetJSON("/status", &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// stop sends SIGTERM and expects weir to exit 0 within weirStopWait.
func (w *weirProc) stop(t *testing.T) {
	t.Helper()
	start := time.Now()
	if err := w.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	code, err := w.Wait(weirStopWait)
	if err != nil {
		t.Fatalf("weir run after SIGTERM: %v\n%s", err, w.Tail(4096))
	}
	if code != 0 {
		t.Fatalf("weir run after SIGTERM: exit %d\n%s", code, w.Tail(4096))
	}
	t.Logf("weir run exited 0 %v after SIGTERM", time.Since(start).Round(time.Millisecond))
	var warned []string
	for _, l := range strings.Split(w.Log(), "\n") {
		if strings.Contains(l, `"level":"warn"`) || strings.Contains(l, `"level":"error"`) {
			warned = append(warned, l)
		}
	}
	for _, l := range warned[:min(len(warned), 10)] {
		t.Logf("weir log: %s", l)
	}
	if len(warned) > 10 {
		t.Logf("weir log: %d more warnings and errors", len(warned)-10)
	}
}

// weirTarget is one target of weir's /status, printed in the test log.
type weirTarget api.Target

func (tg weirTarget) String() string {
	e := tg.Explanation
	return fmt.Sprintf("picked %d (failed %d, down %v), weight %d → %d, sent %d retr %d ratio %d‰ lossFr %d%% fr %d%% held %v",
		tg.Picked, tg.Failed, tg.Down, tg.Weight, tg.Effective, e.SegmentsSent, e.Retransmits, e.LossRatio, e.LossFraction, e.Fraction, e.Held)
}

// weirSnapshot is targets a and b of service web at one sampling interval.
type weirSnapshot struct {
	at   time.Time
	a, b weirTarget
}

func snapshotOf(st *api.Status) (weirSnapshot, bool) {
	sn := weirSnapshot{at: st.SampledAt}
	var ok [2]bool
	for _, s := range st.Services {
		if s.Name != "web" {
			continue
		}
		for _, tg := range s.Targets {
			if tg.Explanation == nil {
				continue
			}
			switch tg.Name {
			case "a":
				sn.a, ok[0] = weirTarget(tg), true
			case "b":
				sn.b, ok[1] = weirTarget(tg), true
			}
		}
	}
	return sn, ok[0] && ok[1] && !sn.at.IsZero()
}

// dialLog dials the VIP with kernel sockets and remembers when the failed
// dials started and how long they took.
type dialLog struct {
	start  time.Time
	mu     sync.Mutex
	n      int
	failed []string
}

func (d *dialLog) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	t0 := time.Now()
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.n++
	if err != nil && len(d.failed) < 20 {
		dl, _ := ctx.Deadline()
		d.failed = append(d.failed, fmt.Sprintf("at %v took %v (deadline in %v): %v",
			t0.Sub(d.start).Round(time.Millisecond), time.Since(t0).Round(time.Millisecond), dl.Sub(t0).Round(time.Millisecond), err))
	}
	return c, err
}

func (d *dialLog) String() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return fmt.Sprintf("%d dials, failed: %q", d.n, d.failed)
}

// inWeirVM boots the VM for a weir run scenario and returns false on the
// host (the VM ran the test); inside the VM, as root, it returns true and
// the test runs its scenario.
func inWeirVM(t *testing.T) bool {
	t.Helper()
	if !vmtest.InVM() {
		vmtest.Require(t)
		weir, err := vmtest.WeirBinary()
		if err != nil {
			t.Fatal(err)
		}
		vmtest.RunTest(t, vmtest.Options{
			// xfrm_user, nfnetlink: weir's TUN setup (netlink.NewHandle
			// with no families) opens a socket for every family, route,
			// XFRM and netfilter, and fails without them.
			Modules:   []string{"tun", "veth", "sch_netem", "xfrm_user", "nfnetlink"},
			Files:     map[string]string{"/bin/weir": weir},
			MemoryMiB: 768,
			Timeout:   10 * time.Minute,
		})
		return false
	}
	if os.Getuid() != 0 {
		t.Fatal("the in-VM scenario must run as root")
	}
	return true
}
