package netstack

import (
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"weir/internal/testutil"
	"weir/netstack/proxy"
	"weir/policy"
)

// TestSampleDeltas: a long-lived connection contributes to each proxy.Sample only
// what it moved in that interval; the MinRate verdict flags a connection
// slower than its action's MinRate and not a fast one; Conns lists open
// connections with a current throughput.
func TestSampleDeltas(t *testing.T) {
	live, stop := echoServer(t, "tcp4", "127.0.0.1:0")
	defer stop()
	vs := &policy.VirtualServer{Name: "echo", VIPs: []netip.Addr{vipV4}, Ports: policy.PortRange{Lo: 80, Hi: 81}}
	target := &policy.Target{Name: "t", Addr: live}
	// 1 Gbit/s: nothing in this test reaches it. 1 Kbit/s: everything
	// does. The verdict is policy's, on the counts netstack reports.
	slowAct := &policy.Action{Name: "gold", MinRate: 1_000_000, MeanRate: 1}
	fastAct := &policy.Action{Name: "bronze", MinRate: 1, MeanRate: 1}
	adm := &testAdmitter{admit: func(r *proxy.ConnRequest) proxy.Decision {
		a := slowAct
		if r.VIP.Port() == 81 {
			a = fastAct
		}
		return proxy.Decision{Verdict: proxy.Accept, Target: target, Action: a}
	}}
	clock := newManualClock()
	r := newRig(t, rigOptions{fwd: fwdOptions{Services: services(vs), Admitter: adm, Now: clock.Now}})
	c1 := dial(t, r.client, netip.AddrPortFrom(vipV4, 80))
	defer c1.Close()
	c2 := dial(t, r.client, netip.AddrPortFrom(vipV4, 81))
	defer c2.Close()
	testutil.Eventually(t, 10*time.Second, func() bool { return r.stats().Open == 2 }, "r.stats().Open == 2")

	echo := func(c *Conn, n int) {
		t.Helper()
		buf := make([]byte, n)
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
	}
	r.px.Sample() // the intervals start now
	total := uint64(0)
	for _, n := range []int{10_000, 30_000} {
		echo(c1, n)
		echo(c2, n)
		total += uint64(n)
		settled(t, r.px, total, total)
		clock.Advance(time.Second)
		s := r.px.Sample()
		if len(s.Targets) != 1 || len(s.TargetActions) != 2 {
			t.Fatalf("sample %+v", s)
		}
		tg := s.Targets[0]
		// Each connection moved n bytes each way in this interval only.
		if tg.Active != 2 || tg.Bytes != 4*uint64(n) {
			t.Errorf("interval with %d B: target active %d, bytes %d, want 2 and %d", n, tg.Active, tg.Bytes, 4*n)
		}
		if tg.SegmentsSent == 0 {
			t.Errorf("target sample %+v", tg)
		}
		bronze, gold := s.TargetActions[0], s.TargetActions[1]
		interval := s.End.Sub(s.Start)
		if interval != time.Second {
			t.Errorf("interval %v, want the clock's 1s", interval)
		}
		if gold.Action != "gold" || gold.Active != 1 || gold.Bytes != 2*uint64(n) {
			t.Errorf("gold %+v: want 1 connection, %d bytes", gold, 2*n)
		}
		if bronze.Action != "bronze" || bronze.Active != 1 || bronze.Bytes != 2*uint64(n) {
			t.Errorf("bronze %+v: want 1 connection, %d bytes", bronze, 2*n)
		}
		if f := policy.MinRateFraction(slowAct, int64(gold.Active), gold.Bytes, interval); f != 100 {
			t.Errorf("gold's MinRate fraction %d, want 100 (below its MinRate)", f)
		}
		if f := policy.MinRateFraction(fastAct, int64(bronze.Active), bronze.Bytes, interval); f != 0 {
			t.Errorf("bronze's MinRate fraction %d, want 0", f)
		}
	}
	// The two listeners (ports 80 and 81) accept concurrently: which
	// connection got the lower ID is not fixed, so find them by action.
	conns := r.px.Conns()
	if len(conns) != 2 || conns[0].ID >= conns[1].ID {
		t.Fatalf("Conns %+v: want two, by ID", conns)
	}
	actions := map[string]proxy.ConnStats{conns[0].Action: conns[0], conns[1].Action: conns[1]}
	if g, ok := actions["gold"]; !ok || actions["bronze"].Action != "bronze" || g.ClientLeg.BytesSent != 40_000 {
		t.Errorf("Conns %+v: want one gold (40000 B sent) and one bronze", conns)
	}
	// A connection that closes in an interval still reports its last deltas.
	echo(c1, 5000)
	c1.Close()
	testutil.Eventually(t, 10*time.Second, func() bool { return adm.nClosed.Load() == 1 }, "adm.nClosed.Load() == 1")
	s := r.px.Sample()
	if tg := s.Targets[0]; tg.Closed != 1 || tg.Active != 1 || tg.Bytes != 10_000 {
		t.Errorf("after close: %+v, want 1 closed, 1 active, 10000 bytes", tg)
	}
}

// settled waits until the splice has counted every byte the test's
// clients got back: a client may read an echo before its splice half adds
// the write to its counters. Each of the two open connections must have
// sent its client one of the totals.
func settled(t *testing.T, f *proxy.Proxy, a, b uint64) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, func() bool {
		cs := f.Conns()
		if len(cs) != 2 {
			return false
		}
		got := map[uint64]int{}
		for _, c := range cs {
			if c.ClientLeg.BytesSent != c.ClientLeg.BytesReceived {
				return false
			}
			got[c.ClientLeg.BytesSent]++
		}
		want := map[uint64]int{a: 1}
		want[b]++
		return got[a] == want[a] && got[b] == want[b]
	}, "every echoed byte counted (%d and %d B): %+v", a, b, f.Conns())
}

// TestSampleWaiting: a connection whose data keeps coming (1000 B every
// 20 ms, well above proxy.StreamRate, for most of the interval) counts as having had data
// waiting; an idle one that sent a few bytes once does not, so MinRate
// without a MeanRate never calls an idle session slow.
func TestSampleWaiting(t *testing.T) {
	live, stop := echoServer(t, "tcp4", "127.0.0.1:0")
	defer stop()
	vs := &policy.VirtualServer{Name: "echo", VIPs: []netip.Addr{vipV4}, Ports: policy.PortRange{Lo: 80, Hi: 81}}
	target := &policy.Target{Name: "t", Addr: live}
	stream, idle := &policy.Action{Name: "stream"}, &policy.Action{Name: "idle"}
	adm := &testAdmitter{admit: func(r *proxy.ConnRequest) proxy.Decision {
		a := stream
		if r.VIP.Port() == 81 {
			a = idle
		}
		return proxy.Decision{Verdict: proxy.Accept, Target: target, Action: a}
	}}
	clock := newManualClock()
	r := newRig(t, rigOptions{fwd: fwdOptions{Services: services(vs), Admitter: adm, Now: clock.Now}})
	c1 := dial(t, r.client, netip.AddrPortFrom(vipV4, 80))
	defer c1.Close()
	c2 := dial(t, r.client, netip.AddrPortFrom(vipV4, 81))
	defer c2.Close()
	testutil.Eventually(t, 10*time.Second, func() bool { return r.stats().Open == 2 }, "r.stats().Open == 2")
	buf := make([]byte, 1000)
	r.px.Sample()
	if _, err := c2.Write(buf[:10]); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c2, buf[:10]); err != nil {
		t.Fatal(err)
	}
	for range 30 { // 600 ms of a 1000-byte write every 20 ms
		if _, err := c1.Write(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c1, buf); err != nil {
			t.Fatal(err)
		}
		clock.Advance(20 * time.Millisecond)
	}
	settled(t, r.px, 30_000, 10)
	s := r.px.Sample()
	if iv := s.End.Sub(s.Start); iv != 600*time.Millisecond {
		t.Errorf("interval %v, want the clock's 600ms", iv)
	}
	if len(s.TargetActions) != 2 {
		t.Fatalf("sample %+v", s)
	}
	id, st := s.TargetActions[0], s.TargetActions[1]
	// Reads every 20 ms of the clock: 29 gaps of 20 ms credited (the
	// first read has none), 580 of the interval's 600 ms.
	if st.Action != "stream" || st.Waiting != 1 || st.WaitingBytes != st.Bytes || st.WaitingTime != 580*time.Millisecond {
		t.Errorf("streaming connection: %+v, want 1 waiting with all its bytes", st)
	}
	if id.Action != "idle" || id.Waiting != 0 || id.Bytes != 20 {
		t.Errorf("idle connection: %+v, want none waiting", id)
	}
	if tg := s.Targets[0]; tg.Waiting != 1 || tg.TimeoutsUnknown != 0 && tg.TimeoutsUnknown != 2 {
		t.Errorf("target: %+v", tg)
	}
}

// cappedLink is a target behind one rate-capped link that its connections
// share: it serves them in turns, chunk bytes (at least 1448) to one
// connection, then waits the chunk's time at rate bytes/s before the next. With n connections each
// gets chunk bytes every n·chunk/rate: gappy, but with data always waiting.
func cappedLink(t *testing.T, rate, chunk int) (netip.AddrPort, func()) {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	quit := make(chan struct{})
	wg.Add(2)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	go func() {
		defer wg.Done()
		buf := make([]byte, chunk)
		turn := time.Duration(chunk) * time.Second / time.Duration(rate)
		// Turns keep to a fixed schedule from the start: a turn that came
		// late (a loaded host) is followed at once by the next, so the link
		// keeps its rate over an interval instead of slowing with the host
		// (a relative wait delivered half the bytes in one interval beside
		// a parallel load, and 2 of 8 connections stopped counting as
		// waiting).
		start := time.Now()
		for i := 0; ; i++ {
			mu.Lock()
			var c net.Conn
			if len(conns) > 0 {
				c = conns[i%len(conns)]
			}
			mu.Unlock()
			if c != nil {
				// The turn's first segment arrives alone, the rest just
				// after it, as from a link that serves one packet at a
				// time: the read that ends the long gap is a small one.
				_ = c.SetWriteDeadline(time.Now().Add(time.Second))
				_, _ = c.Write(buf[:1448])
				time.Sleep(5 * time.Millisecond)
				_, _ = c.Write(buf[1448:])
			}
			select {
			case <-quit:
				return
			case <-time.After(time.Until(start.Add(time.Duration(i+1) * turn))):
			}
		}
	}()
	return l.Addr().(*net.TCPAddr).AddrPort(), func() {
		close(quit)
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}
}

// verdict is policy's MinRate verdict on one target-action aggregate, as
// the appliance asks for it (a MinRate without a MeanRate judges the
// waiting connections by their streaming time).
func verdict(a *policy.Action, ag proxy.AggSample, interval time.Duration) int {
	tg := &policy.Target{Name: ag.Name, Weight: 1}
	s := policy.TargetSample{Interval: interval, ActiveConns: int64(ag.Active), Bytes: ag.Bytes, Actions: []policy.ActionSample{{
		Action: a, ActiveConns: int64(ag.Active), Bytes: ag.Bytes,
		WaitingConns: int64(ag.Waiting), WaitingBytes: ag.WaitingBytes, WaitingTime: ag.WaitingTime,
	}}}
	e := policy.Explain(&policy.Monitor{}, tg, &s, nil)
	if len(e.Levels) != 1 {
		return -1
	}
	return e.Levels[0].MinRateFraction
}

// TestSampleWaitingCappedLink reproduces the lapse of the MinRate verdict
// under contention: 8 gold connections (MinRate 500 Kbit/s, no MeanRate)
// share a link capped at 1.92 Mbit/s, so each gets 9000 B every 300 ms
// (240 Kbit/s): reads more than 250 ms apart, which the old fixed gap
// limit judged idle (verdict 0). Every interval, all 8 must count as
// waiting, at about their real rate, and the verdict must read 100.
func TestSampleWaitingCappedLink(t *testing.T) {
	const conns, perConn, chunk = 8, 30_000, 9000 // B/s each, B per turn
	addr, stopLink := cappedLink(t, conns*perConn, chunk)
	defer stopLink()
	vs := &policy.VirtualServer{Name: "dl", VIPs: []netip.Addr{vipV4}, Ports: policy.PortRange{Lo: 80, Hi: 80}}
	target := &policy.Target{Name: "a", Addr: addr}
	gold := &policy.Action{Name: "gold", MinRate: 500}
	adm := &testAdmitter{admit: func(r *proxy.ConnRequest) proxy.Decision {
		return proxy.Decision{Verdict: proxy.Accept, Target: target, Action: gold}
	}}
	r := newRig(t, rigOptions{fwd: fwdOptions{Services: services(vs), Admitter: adm}})
	var wg sync.WaitGroup
	defer wg.Wait() // after the connections close
	for range conns {
		c := dial(t, r.client, netip.AddrPortFrom(vipV4, 80))
		defer c.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = io.Copy(io.Discard, c)
		}()
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return r.stats().Open == conns }, "all connections open")
	time.Sleep(500 * time.Millisecond) // every connection past its first turn
	r.px.Sample()
	for i := range 3 {
		time.Sleep(time.Second)
		s := r.px.Sample()
		interval := s.End.Sub(s.Start)
		if len(s.TargetActions) != 1 {
			t.Fatalf("interval %d: sample %+v", i, s)
		}
		g := s.TargetActions[0]
		kbps := -1.0
		if g.WaitingTime > 0 {
			kbps = float64(g.WaitingBytes) * 8 / g.WaitingTime.Seconds() / 1000
		}
		t.Logf("interval %d (%v): %d active, %d waiting, %d B, %.0f Kbit/s per connection while streaming (noisy on a loaded host)",
			i, interval.Round(time.Millisecond), g.Active, g.Waiting, g.WaitingBytes, kbps)
		if g.Active != conns || g.Waiting != conns {
			t.Errorf("interval %d: %d active, %d waiting; want all %d waiting", i, g.Active, g.Waiting, conns)
		}
		if f := verdict(gold, g, interval); f != 100 {
			t.Errorf("interval %d: MinRate verdict %d, want 100 (about 240 Kbit/s each, MinRate 500)", i, f)
		}
	}
}

// TestSampleWaitingInteractive: sessions that are idle or interactive
// never count as waiting, so the MinRate verdict stays 0 for them: an idle
// one, a fast typist (a byte every 100 ms, echoed: gaps well under the old
// 250 ms limit, which called it streaming and slow) and a status screen
// the target redraws with 1000 B every 500 ms.
func TestSampleWaitingInteractive(t *testing.T) {
	echo, stopEcho := echoServer(t, "tcp4", "127.0.0.1:0")
	defer stopEcho()
	sl, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	quit := make(chan struct{})
	stopScreen := serveListener(sl, func(c net.Conn) {
		defer c.Close()
		screen := make([]byte, 1000)
		for {
			if _, err := c.Write(screen); err != nil {
				return
			}
			select {
			case <-quit:
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
	})
	defer stopScreen()
	defer close(quit)
	vs := &policy.VirtualServer{Name: "telnet", VIPs: []netip.Addr{vipV4}, Ports: policy.PortRange{Lo: 80, Hi: 82}}
	acts := map[uint16]*policy.Action{
		80: {Name: "idle", MinRate: 500}, 81: {Name: "typist", MinRate: 500}, 82: {Name: "screen", MinRate: 500},
	}
	adm := &testAdmitter{admit: func(r *proxy.ConnRequest) proxy.Decision {
		tg := &policy.Target{Name: "echo", Addr: echo}
		if r.VIP.Port() == 82 {
			tg = &policy.Target{Name: "screen", Addr: sl.Addr().(*net.TCPAddr).AddrPort()}
		}
		return proxy.Decision{Verdict: proxy.Accept, Target: tg, Action: acts[r.VIP.Port()]}
	}}
	r := newRig(t, rigOptions{fwd: fwdOptions{Services: services(vs), Admitter: adm}})
	var wg sync.WaitGroup
	defer wg.Wait() // after the connections close
	idle := dial(t, r.client, netip.AddrPortFrom(vipV4, 80))
	defer idle.Close()
	typist := dial(t, r.client, netip.AddrPortFrom(vipV4, 81))
	defer typist.Close()
	screen := dial(t, r.client, netip.AddrPortFrom(vipV4, 82))
	defer screen.Close()
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = io.Copy(io.Discard, screen)
	}()
	testutil.Eventually(t, 10*time.Second, func() bool { return r.stats().Open == 3 }, "all connections open")
	r.px.Sample()
	key := []byte{'x'}
	for i := range 2 {
		for range 10 { // 1 s of typing
			if _, err := typist.Write(key); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(typist, key); err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		s := r.px.Sample()
		interval := s.End.Sub(s.Start)
		seen := map[string]bool{}
		for _, g := range s.TargetActions {
			a := acts[80]
			for _, x := range acts {
				if x.Name == g.Action {
					a = x
				}
			}
			seen[g.Action] = true
			t.Logf("interval %d: %s: %d B, %d waiting, streaming %v", i, g.Action, g.Bytes, g.Waiting, g.WaitingTime)
			if g.Waiting != 0 {
				t.Errorf("interval %d: %s counted as waiting: %+v", i, g.Action, g)
			}
			if f := verdict(a, g, interval); f != 0 {
				t.Errorf("interval %d: %s reads MinRate verdict %d, want 0", i, g.Action, f)
			}
		}
		if !seen["idle"] || !seen["typist"] || !seen["screen"] {
			t.Errorf("interval %d: aggregates %+v, want idle, typist and screen", i, s.TargetActions)
		}
	}
}

// TestSampleOpenTime: an interval's OpenTime is the sum of each
// connection's time open in it, a closed one's up to its end, a new one's
// from its start, so that policy's MinRate takes the rate per connection
// as bytes / OpenTime (N7: bytes divided by the connections still open
// read 900 Kbit/s for 20 connections at 45 when 19 closed before the end).
func TestSampleOpenTime(t *testing.T) {
	live, stop := echoServer(t, "tcp4", "127.0.0.1:0")
	defer stop()
	vs := &policy.VirtualServer{Name: "echo", VIPs: []netip.Addr{vipV4}, Ports: policy.PortRange{Lo: 80, Hi: 80}}
	target := &policy.Target{Name: "t", Addr: live}
	gold := &policy.Action{Name: "gold", MinRate: 1, MeanRate: 1}
	adm := &testAdmitter{admit: func(r *proxy.ConnRequest) proxy.Decision {
		return proxy.Decision{Verdict: proxy.Accept, Target: target, Action: gold}
	}}
	clock := newManualClock()
	r := newRig(t, rigOptions{fwd: fwdOptions{Services: services(vs), Admitter: adm, Now: clock.Now}})
	c1 := dial(t, r.client, netip.AddrPortFrom(vipV4, 80))
	defer c1.Close()
	c2 := dial(t, r.client, netip.AddrPortFrom(vipV4, 80))
	defer c2.Close()
	testutil.Eventually(t, 10*time.Second, func() bool { return r.stats().Open == 2 }, "r.stats().Open == 2")
	r.px.Sample() // the interval starts now
	clock.Advance(400 * time.Millisecond)
	c1.Close()
	testutil.Eventually(t, 10*time.Second, func() bool { return adm.nClosed.Load() == 1 }, "adm.nClosed.Load() == 1")
	clock.Advance(200 * time.Millisecond)
	c3 := dial(t, r.client, netip.AddrPortFrom(vipV4, 80))
	defer c3.Close()
	testutil.Eventually(t, 10*time.Second, func() bool { return r.stats().Open == 2 }, "c3 open")
	clock.Advance(400 * time.Millisecond)
	s := r.px.Sample()
	// c1 0.4 s, c2 1 s, c3 0.4 s.
	const want = 1800 * time.Millisecond
	if tg := s.Targets[0]; tg.OpenTime != want || tg.Closed != 1 || tg.Active != 2 {
		t.Errorf("target: open time %v, %d closed, %d active; want %v, 1, 2", tg.OpenTime, tg.Closed, tg.Active, want)
	}
	if ta := s.TargetActions[0]; ta.OpenTime != want {
		t.Errorf("gold: open time %v, want %v", ta.OpenTime, want)
	}
}
