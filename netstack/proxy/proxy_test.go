package proxy_test

import (
	"io"
	"net/netip"
	"sync"
	"testing"
	"time"

	"weir/internal/testutil"
	"weir/netstack/proxy"
	"weir/netstack/proxy/proxytest"
	"weir/policy"
)

// TestMain fails the package if a test leaves a goroutine running: every
// splice and warm goroutine must end with its Proxy.
func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

// pipeAdmitter accepts every connection to its target through its dialer,
// under the action its VIP port names; its sessions count their Ends.
type pipeAdmitter struct {
	target  *policy.Target
	dialer  proxy.Dialer
	actions map[uint16]*policy.Action

	mu   sync.Mutex
	ends []proxy.End // protected by mu
}

func (a *pipeAdmitter) Admit(r *proxy.ConnRequest) (proxy.Decision, proxy.Session) {
	return proxy.Decision{Verdict: proxy.Accept, Target: a.target, Dialer: a.dialer, Action: a.actions[r.VIP.Port()]}, &pipeSession{a: a}
}

type pipeSession struct{ a *pipeAdmitter }

func (s *pipeSession) DialFailed(proxy.Decision, error) proxy.Decision {
	return proxy.Decision{Verdict: proxy.RefuseRST}
}
func (s *pipeSession) TargetFailed(proxy.Decision, error) {}
func (*pipeSession) Spliced(int64)                        {}
func (s *pipeSession) Released()                          {}
func (s *pipeSession) End(e *proxy.End) {
	s.a.mu.Lock()
	s.a.ends = append(s.a.ends, *e)
	s.a.mu.Unlock()
}

func (a *pipeAdmitter) endCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.ends)
}

// compiledService is a tcp virtual server on ports lo..hi with policy's
// defaults filled in, as the proxy takes it.
func compiledService(t *testing.T, lo, hi uint16) *policy.VirtualServer {
	t.Helper()
	cfg, err := policy.Compile(&policy.Config{Services: []*policy.VirtualServer{{
		Name: "svc", VIPs: []netip.Addr{netip.MustParseAddr("198.19.0.80")}, Ports: policy.PortRange{Lo: lo, Hi: hi},
		Targets: []*policy.Target{{Name: "a", Addr: netip.MustParseAddrPort("198.18.0.10:80"), Weight: 1}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Services[0]
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

// TestWaitingOnManualClock is the streaming rule through the splice and
// the sampler on a manual clock: every read happens at a time the test
// sets, so the streaming times are exact. Four connections under MinRate
// 500 Kbit/s (no MeanRate):
//   - capped: the target sends 9000 B every 300 ms, its first segment
//     alone and the rest 5 ms later (a turn on a link shared by 8,
//     240 Kbit/s): data always waiting, gaps longer than the old 250 ms
//     limit; it counts as waiting all the time, and the verdict reads 100;
//   - typist: a byte every 100 ms, echoed at once;
//   - screen: the target redraws 1000 B every 500 ms;
//   - idle: nothing.
//
// The last three never count as waiting, and their verdict stays 0.
func TestWaitingOnManualClock(t *testing.T) {
	clock := proxytest.NewClock()
	targets := proxytest.NewListener()
	defer targets.Close()
	gold := map[uint16]*policy.Action{
		80: {Name: "capped", MinRate: 500}, 81: {Name: "typist", MinRate: 500},
		82: {Name: "screen", MinRate: 500}, 83: {Name: "idle", MinRate: 500},
	}
	adm := &pipeAdmitter{target: &policy.Target{Name: "a", Addr: netip.MustParseAddrPort("198.18.0.10:80")}, dialer: targets, actions: gold}
	p := proxy.New(proxy.Options{Admitter: adm, Now: clock.Now})
	defer p.Close()
	vs := compiledService(t, 80, 83)

	// client[i] is the test's end of connection i's client leg, server[i]
	// the far end of its target leg.
	var client, server [4]*proxytest.Conn
	for i := range 4 {
		near, far := proxytest.Pipe()
		client[i] = far
		accepted := make(chan *proxytest.Conn, 1)
		go func() {
			c, err := targets.Accept()
			if err == nil {
				accepted <- c.(*proxytest.Conn)
			}
		}()
		p.HandleConn(near, &proxy.ConnRequest{Client: netip.MustParseAddrPort("198.18.0.2:40000"),
			VIP: netip.AddrPortFrom(vs.VIPs[0], 80+uint16(i)), Service: vs})
		server[i] = <-accepted
		defer client[i].Close()
		defer server[i].Close()
	}
	if st := p.Stats(); st.Open != 4 {
		t.Fatalf("stats %+v, want 4 open", st)
	}
	capped, typist, screen := 0, 1, 2
	// send writes b on from and reads it on to: once it returns, the
	// splice has read it (at the clock's time) and passed it on.
	send := func(from, to *proxytest.Conn, b []byte) {
		t.Helper()
		errc := make(chan error, 1)
		go func() { _, err := from.Write(b); errc <- err }()
		if _, err := io.ReadFull(to, make([]byte, len(b))); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	chunk := make([]byte, 9000)
	p.Sample()
	// 3 s in 5 ms steps: the capped target's turns start at 0, 300, …
	// ms, the typist types at 0, 100, … ms, the screen redraws at 0,
	// 500, … ms; a sample every second.
	for step := 0; step < 600; step++ {
		ms := step * 5
		if ms%300 == 0 {
			send(server[capped], client[capped], chunk[:1448])
		}
		if ms%300 == 5 {
			send(server[capped], client[capped], chunk[1448:])
		}
		if ms%100 == 0 {
			send(client[typist], server[typist], []byte{'x'})
			send(server[typist], client[typist], []byte{'x'})
		}
		if ms%500 == 0 {
			send(server[screen], client[screen], chunk[:1000])
		}
		clock.Advance(5 * time.Millisecond)
		if (ms+5)%1000 != 0 {
			continue
		}
		s := p.Sample()
		interval := s.End.Sub(s.Start)
		if interval != time.Second {
			t.Fatalf("interval %v on the manual clock, want 1s", interval)
		}
		seen := map[string]bool{}
		for _, g := range s.TargetActions {
			seen[g.Action] = true
			a := gold[80]
			for _, x := range gold {
				if x.Name == g.Action {
					a = x
				}
			}
			f := verdict(a, g, interval)
			t.Logf("%v: %s: %d B, %d waiting, streaming %v, verdict %d", s.End.Sub(s.Start), g.Action, g.Bytes, g.Waiting, g.WaitingTime, f)
			if g.Action == "capped" {
				// Every read's gap is credited: 295 ms then 5 ms per
				// turn, the whole second but the gap before the first
				// turn of the interval that began in the last one.
				if g.Waiting != 1 || g.WaitingTime < 900*time.Millisecond || f != 100 {
					t.Errorf("second %d: capped: %d waiting, streaming %v, verdict %d; want waiting, ≥ 900ms, 100",
						ms/1000, g.Waiting, g.WaitingTime, f)
				}
				continue
			}
			if g.Waiting != 0 || g.WaitingTime != 0 || f != 0 {
				t.Errorf("second %d: %s: %d waiting, streaming %v, verdict %d; want none, 0, 0", ms/1000, g.Action, g.Waiting, g.WaitingTime, f)
			}
		}
		if len(seen) != 4 {
			t.Errorf("second %d: aggregates %+v, want all four actions", ms/1000, s.TargetActions)
		}
	}
	// Closing both ends ends each splice with its End.
	for i := range 4 {
		client[i].Close()
		server[i].Close()
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return adm.endCount() == 4 }, "4 Ends")
}
