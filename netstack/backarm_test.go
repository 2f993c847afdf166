package netstack

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"weir/datapath"
	"weir/datapath/fault"
	"weir/internal/testutil"
	"weir/netstack/proxy"
	"weir/policy"
)

// backTarget is a target server stack behind weir's back arm.
type backTarget struct {
	addr netip.AddrPort
	srv  *Stack
	stop func()
}

// backArm is weir's back stack with one NIC per target subnet.
type backArm struct {
	s       *Stack
	targets []*backTarget
}

func newBackArm(t testing.TB) *backArm {
	t.Helper()
	s, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	b := &backArm{s: s}
	t.Cleanup(func() {
		for _, tg := range b.targets {
			tg.stop()
			tg.srv.Close()
		}
		s.Close()
	})
	return b
}

// addTarget connects a new target server on subnet 198.18.<n>.0/24 and
// fd00:<n>::/64 through its own memory pair; wrap may wrap weir's end.
// handle serves each connection.
func (b *backArm) addTarget(t testing.TB, n int, v6 bool, wrap func(datapath.Device) datapath.Device, handle func(net.Conn)) *backTarget {
	t.Helper()
	a, z := datapath.NewPipe(datapath.PipeOptions{QueueLen: 4096})
	var dev datapath.Device = a
	if wrap != nil {
		dev = wrap(a)
	}
	p4 := netip.MustParsePrefix(fmt.Sprintf("198.18.%d.1/24", n))
	p6 := netip.MustParsePrefix(fmt.Sprintf("fd00:%x::1/64", n))
	if _, err := b.s.AddNIC(dev, NICOptions{Addrs: []netip.Prefix{p4, p6}, Routes: []netip.Prefix{p4.Masked(), p6.Masked()}}); err != nil {
		t.Fatal(err)
	}
	srv, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	s4 := netip.MustParsePrefix(fmt.Sprintf("198.18.%d.2/24", n))
	s6 := netip.MustParsePrefix(fmt.Sprintf("fd00:%x::2/64", n))
	if _, err := srv.AddNIC(z, NICOptions{Addrs: []netip.Prefix{s4, s6}}); err != nil {
		t.Fatal(err)
	}
	addr := netip.AddrPortFrom(s4.Addr(), 9000)
	if v6 {
		addr = netip.AddrPortFrom(s6.Addr(), 9000)
	}
	l, err := srv.ListenTCP(addr)
	if err != nil {
		t.Fatal(err)
	}
	tg := &backTarget{addr: addr, srv: srv, stop: serveListener(l, handle)}
	b.targets = append(b.targets, tg)
	return tg
}

func echoHandler(c net.Conn) { duplexEcho(c) }

// sinkHandler reads everything, answers with the byte count, and closes.
func sinkHandler(c net.Conn) {
	defer c.Close()
	n, _ := io.Copy(io.Discard, c)
	fmt.Fprintf(c, "%d\n", n)
}

// TestBackArmTarget splices through the netstack dialer to a target behind
// weir's back arm, IPv4 and IPv6 on both sides.
func TestBackArmTarget(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		t.Run(fmt.Sprintf("v6=%v", v6), func(t *testing.T) {
			back := newBackArm(t)
			tg := back.addTarget(t, 1, v6, nil, echoHandler)
			vip := vipV4
			if v6 {
				vip = vipV6
			}
			vs := &policy.VirtualServer{Name: "echo", VIPs: []netip.Addr{vip}, Ports: policy.PortRange{Lo: 80, Hi: 80}}
			adm := &testAdmitter{target: &policy.Target{Name: "back", Addr: tg.addr, Via: policy.DialNetstack}, keep: true}
			r := newRig(t, rigOptions{fwd: fwdOptions{Services: services(vs), Admitter: adm, Back: &StackDialer{Stack: back.s}}})
			c := dial(t, r.client, netip.AddrPortFrom(vip, 80))
			msg := make([]byte, 256<<10)
			rand.Read(msg)
			go func() {
				c.Write(msg)
				c.CloseWrite()
			}()
			got, err := io.ReadAll(c)
			c.Close()
			if err != nil || !bytes.Equal(got, msg) {
				t.Fatalf("echo: %d bytes, err %v", len(got), err)
			}
			testutil.Eventually(t, 10*time.Second, func() bool { return adm.nClosed.Load() == 1 }, "adm.nClosed.Load() == 1")
			cs := adm.closedStats()[0]
			if cs.TargetLeg.SegmentsSent == 0 || cs.TargetLeg.SegmentsReceived == 0 || cs.TargetLeg.RTT <= 0 || !cs.TargetLeg.TimeoutsKnown {
				t.Errorf("target leg counters implausible: %+v", cs.TargetLeg)
			}
			if cs.TargetLeg.BytesSent != uint64(len(msg)) || cs.TargetLeg.BytesReceived != uint64(len(msg)) {
				t.Errorf("target leg bytes %d/%d", cs.TargetLeg.BytesSent, cs.TargetLeg.BytesReceived)
			}
		})
	}
}

// TestLossRatio injects 2 % loss on one target's leg (weir → target) and
// checks that the sampled loss ratio of that target is within a factor of
// two of it, while a clean target reads about zero.
func TestLossRatio(t *testing.T) {
	const rate = 0.02
	size := 8 << 20
	conns := 2
	if testing.Short() {
		size = 4 << 20
	}
	back := newBackArm(t)
	clean := back.addTarget(t, 1, false, nil, sinkHandler)
	// The datapath fault injector drops 2 % of what weir's back arm sends
	// to this target (data segments and ACKs alike), seeded.
	var lossy *fault.Device
	bad := back.addTarget(t, 2, false, func(d datapath.Device) datapath.Device {
		lossy = fault.New(d, fault.Options{Seed: 1, Write: fault.Rates{Drop: rate}})
		return lossy
	}, sinkHandler)
	vs := &policy.VirtualServer{Name: "up", VIPs: []netip.Addr{vipV4}, Ports: policy.PortRange{Lo: 80, Hi: 81}}
	tClean := &policy.Target{Name: "clean", Addr: clean.addr, Via: policy.DialNetstack}
	tBad := &policy.Target{Name: "lossy", Addr: bad.addr, Via: policy.DialNetstack}
	adm := &testAdmitter{admit: func(r *proxy.ConnRequest) proxy.Decision {
		tg := tClean
		if r.VIP.Port() == 81 {
			tg = tBad
		}
		return proxy.Decision{Verdict: proxy.Accept, Target: tg}
	}}
	r := newRig(t, rigOptions{fwd: fwdOptions{Services: services(vs), Admitter: adm, Back: &StackDialer{Stack: back.s}}})
	r.px.Sample() // start the interval

	msg := make([]byte, size)
	rand.Read(msg)
	var wg sync.WaitGroup
	errs := make(chan error, 2*conns)
	start := time.Now()
	for _, port := range []uint16{80, 81} {
		for i := 0; i < conns; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := dial(t, r.client, netip.AddrPortFrom(vipV4, port))
				defer c.Close()
				if _, err := c.Write(msg); err != nil {
					errs <- err
					return
				}
				c.CloseWrite()
				b, err := io.ReadAll(c)
				if err != nil || string(b) != fmt.Sprintf("%d\n", size) {
					errs <- fmt.Errorf("port %d: reply %q, %v", port, b, err)
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	el := time.Since(start)
	testutil.Eventually(t, 10*time.Second, func() bool { return adm.nClosed.Load() == int64(2*conns) }, "adm.nClosed.Load() == int64(2*conns)")
	s := r.px.Sample()
	if len(s.Targets) != 2 {
		t.Fatalf("targets %+v", s.Targets)
	}
	cl, ls := s.Targets[0], s.Targets[1]
	if cl.Name != "clean" || ls.Name != "lossy" {
		t.Fatalf("targets %+v", s.Targets)
	}
	fs := lossy.Stats().Write
	injected := float64(fs.Dropped) / float64(fs.Packets)
	t.Logf("%d MiB up to each target in %v; injected %.2f%% (%d dropped); lossy: %d sent, %d retransmitted, %d timeouts, loss ratio %.2f%%, timeout ratio %.2f%%; clean: %d sent, %d retransmitted, %d timeouts, loss ratio %.3f%%",
		conns*size>>20, el.Round(time.Millisecond), 100*injected, fs.Dropped,
		ls.SegmentsSent, ls.Retransmits, ls.Timeouts, 100*lossRatio(ls), 100*timeoutRatio(ls),
		cl.SegmentsSent, cl.Retransmits, cl.Timeouts, 100*lossRatio(cl))
	for i, n := range back.s.nics {
		t.Logf("back NIC %d: %+v", i, n.Stats())
	}
	t.Logf("front NIC: %+v; client NIC: %+v", r.front.Stats(), r.clientNIC.Stats())
	if lossRatio(ls) < rate/2 || lossRatio(ls) > rate*2 {
		t.Errorf("lossy target's loss ratio %.4f not within a factor 2 of %.2f", lossRatio(ls), rate)
	}
	// A clean leg is not exactly 0: gVisor counts its tail-loss probes as
	// retransmits (as Linux's total_retrans does), and on a busy machine
	// with stretched ACKs some fire with no packet dropped anywhere
	// (measured 0.05-0.5 %). "About 0" is below half of the policy's
	// default 2 % loss threshold, so a clean target never trips it.
	// Under the race detector the stacks run several times slower and more
	// probes fire (measured up to 1.05 %); the clean leg must then still
	// read under half the lossy one's; so with -short, on a loaded shared
	// host (make race runs -short).
	cleanMax := 0.01
	if testutil.Race || testing.Short() {
		cleanMax = lossRatio(ls) / 2
	}
	if lossRatio(cl) >= cleanMax {
		t.Errorf("clean target's loss ratio %.4f, want about 0 (< %.2f %%)", lossRatio(cl), 100*cleanMax)
	}
	if minSegs := uint64(conns * size / 1500); cl.SegmentsSent < minSegs || ls.SegmentsSent < minSegs {
		t.Errorf("segments sent %d / %d, want ≥ %d each", cl.SegmentsSent, ls.SegmentsSent, minSegs)
	}
}

// TestNoLeak opens 1000 connections at once through the back arm, moves a
// little data on each, closes them all, and checks that goroutines and
// registry entries return to where they were.
func TestNoLeak(t *testing.T) {
	n := 1000
	if testing.Short() {
		n = 300
	}
	back := newBackArm(t)
	tg := back.addTarget(t, 1, false, nil, echoHandler)
	vs := &policy.VirtualServer{Name: "echo", VIPs: []netip.Addr{vipV4}, Ports: policy.PortRange{Lo: 80, Hi: 80}}
	adm := &testAdmitter{target: &policy.Target{Name: "back", Addr: tg.addr, Via: policy.DialNetstack}}
	r := newRig(t, rigOptions{fwd: fwdOptions{Services: services(vs), Admitter: adm, Back: &StackDialer{Stack: back.s}}})
	// Warm up: the stacks start some goroutines lazily on first use.
	for i := 0; i < 10; i++ {
		c := dial(t, r.client, netip.AddrPortFrom(vipV4, 80))
		c.Write([]byte("w"))
		io.ReadFull(c, make([]byte, 1))
		c.Close()
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return adm.nClosed.Load() == 10 }, "adm.nClosed.Load() == 10")
	// Every goroutine now running (the stacks', the rig's) may stay; any
	// other still running once the connections closed is a leak.
	before := goleak.IgnoreCurrent()

	conns := make([]*Conn, n)
	var wg sync.WaitGroup
	var failed atomic.Int64
	sem := make(chan struct{}, 128) // bound dials in flight, not open connections
	for i := range conns {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			c, err := r.client.DialTCP(ctx, netip.AddrPort{}, netip.AddrPortFrom(vipV4, 80))
			if err != nil {
				failed.Add(1)
				return
			}
			b := []byte("ping")
			if _, err := c.Write(b); err != nil {
				failed.Add(1)
			}
			if _, err := io.ReadFull(c, b); err != nil {
				failed.Add(1)
			}
			conns[i] = c
		}()
	}
	wg.Wait()
	if f := failed.Load(); f > 0 {
		t.Fatalf("%d of %d connections failed", f, n)
	}
	if open := r.stats().Open; open != int64(n) {
		t.Fatalf("open %d, want %d all at once", open, n)
	}
	if got := len(r.px.Conns()); got != n {
		t.Fatalf("Conns lists %d, want %d", got, n)
	}
	for _, c := range conns {
		c.Close()
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return adm.nClosed.Load() == int64(n+10) }, "adm.nClosed.Load() == int64(n+10)")
	// Each spliced connection runs two goroutines; all must be gone but
	// the warm ones parked for the next connections (proxy.WarmPool), at most
	// proxy.DefaultWarmIdle.
	goleak.VerifyNone(t, before, goleak.IgnoreTopFunction("weir/netstack/proxy.(*WarmPool).workLoop"))
	// Two pools: the forwarder's (hand-overs) and the proxy's (splices).
	buf := make([]byte, 8<<20)
	stacks := string(buf[:runtime.Stack(buf, true)])
	if parked := strings.Count(stacks, "weir/netstack/proxy.(*WarmPool).workLoop("); parked > 2*proxy.DefaultWarmIdle {
		t.Errorf("%d goroutines parked, want at most %d", parked, 2*proxy.DefaultWarmIdle)
	}
	st := r.stats()
	if st.Open != 0 || st.Pending != 0 || len(r.px.Conns()) != 0 {
		t.Errorf("after closing: %+v, %d listed", st, len(r.px.Conns()))
	}
}

// lossRatio and timeoutRatio are the ratios policy judges on, as fractions
// (policy.RatioTenths gives them in tenths of a percent): netstack reports
// only the counts.
func lossRatio(a proxy.AggSample) float64 {
	if a.SegmentsSent == 0 {
		return 0
	}
	return float64(a.Retransmits) / float64(a.SegmentsSent)
}

func timeoutRatio(a proxy.AggSample) float64 {
	if a.SegmentsSent == 0 {
		return 0
	}
	return float64(a.Timeouts) / float64(a.SegmentsSent)
}
