package netstack

import (
	"io"
	"net/netip"
	"testing"
	"time"

	"weir/internal/testutil"
	"weir/policy"
)

// TestSampleDeltas: a long-lived connection contributes to each Sample only
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
	adm := &testAdmitter{admit: func(r *ConnRequest) Decision {
		a := slowAct
		if r.VIP.Port() == 81 {
			a = fastAct
		}
		return Decision{Verdict: Accept, Target: target, Action: a}
	}}
	r := newRig(t, rigOptions{fwd: ForwarderOptions{Services: services(vs), Admitter: adm}})
	c1 := dial(t, r.client, netip.AddrPortFrom(vipV4, 80))
	defer c1.Close()
	c2 := dial(t, r.client, netip.AddrPortFrom(vipV4, 81))
	defer c2.Close()
	testutil.Eventually(t, 10*time.Second, func() bool { return r.fwd.Stats().Open == 2 }, "r.fwd.Stats().Open == 2")

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
	r.fwd.Sample() // the intervals start now
	for _, n := range []int{10_000, 30_000} {
		echo(c1, n)
		echo(c2, n)
		time.Sleep(50 * time.Millisecond)
		s := r.fwd.Sample()
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
	conns := r.fwd.Conns()
	if len(conns) != 2 || conns[0].ID >= conns[1].ID {
		t.Fatalf("Conns %+v: want two, by ID", conns)
	}
	actions := map[string]ConnStats{conns[0].Action: conns[0], conns[1].Action: conns[1]}
	if g, ok := actions["gold"]; !ok || actions["bronze"].Action != "bronze" || g.ClientLeg.BytesSent != 40_000 {
		t.Errorf("Conns %+v: want one gold (40000 B sent) and one bronze", conns)
	}
	// A connection that closes in an interval still reports its last deltas.
	echo(c1, 5000)
	c1.Close()
	testutil.Eventually(t, 10*time.Second, func() bool { return adm.nClosed.Load() == 1 }, "adm.nClosed.Load() == 1")
	s := r.fwd.Sample()
	if tg := s.Targets[0]; tg.Closed != 1 || tg.Active != 1 || tg.Bytes != 10_000 {
		t.Errorf("after close: %+v, want 1 closed, 1 active, 10000 bytes", tg)
	}
}

// TestSampleWaiting: a connection whose data keeps coming (reads under
// StreamGap apart for most of the interval) counts as having had data
// waiting; an idle one that sent a few bytes once does not, so MinRate
// without a MeanRate never calls an idle session slow.
func TestSampleWaiting(t *testing.T) {
	live, stop := echoServer(t, "tcp4", "127.0.0.1:0")
	defer stop()
	vs := &policy.VirtualServer{Name: "echo", VIPs: []netip.Addr{vipV4}, Ports: policy.PortRange{Lo: 80, Hi: 81}}
	target := &policy.Target{Name: "t", Addr: live}
	stream, idle := &policy.Action{Name: "stream"}, &policy.Action{Name: "idle"}
	adm := &testAdmitter{admit: func(r *ConnRequest) Decision {
		a := stream
		if r.VIP.Port() == 81 {
			a = idle
		}
		return Decision{Verdict: Accept, Target: target, Action: a}
	}}
	r := newRig(t, rigOptions{fwd: ForwarderOptions{Services: services(vs), Admitter: adm}})
	c1 := dial(t, r.client, netip.AddrPortFrom(vipV4, 80))
	defer c1.Close()
	c2 := dial(t, r.client, netip.AddrPortFrom(vipV4, 81))
	defer c2.Close()
	testutil.Eventually(t, 10*time.Second, func() bool { return r.fwd.Stats().Open == 2 }, "r.fwd.Stats().Open == 2")
	buf := make([]byte, 1000)
	r.fwd.Sample()
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
		time.Sleep(20 * time.Millisecond)
	}
	s := r.fwd.Sample()
	if len(s.TargetActions) != 2 {
		t.Fatalf("sample %+v", s)
	}
	id, st := s.TargetActions[0], s.TargetActions[1]
	if st.Action != "stream" || st.Waiting != 1 || st.WaitingBytes != st.Bytes || st.WaitingTime <= 0 {
		t.Errorf("streaming connection: %+v, want 1 waiting with all its bytes", st)
	}
	if id.Action != "idle" || id.Waiting != 0 || id.Bytes != 20 {
		t.Errorf("idle connection: %+v, want none waiting", id)
	}
	if tg := s.Targets[0]; tg.Waiting != 1 || tg.TimeoutsUnknown != 0 && tg.TimeoutsUnknown != 2 {
		t.Errorf("target: %+v", tg)
	}
}
