package health

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"weir/balancer"
	"weir/internal/testutil"
	"weir/policy"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// live is a loopback listener that accepts and closes every connection, as
// a target's server that is up.
type live struct {
	ln   net.Listener
	done chan struct{}
}

func listen(t *testing.T, addr string) *live {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	l := &live{ln: ln, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(l.close)
	return l
}

func (l *live) addr() netip.AddrPort { return l.ln.Addr().(*net.TCPAddr).AddrPort() }

func (l *live) close() {
	l.ln.Close()
	<-l.done
}

// deadAddr returns a loopback address nothing listens on.
func deadAddr(t *testing.T) netip.AddrPort {
	t.Helper()
	l := listen(t, "127.0.0.1:0")
	a := l.addr()
	l.close()
	return a
}

// rig is a compiled service, its balancer and a checker reporting into it,
// as the appliance wires them.
type rig struct {
	cfg *policy.Config
	b   *balancer.Balancer
	c   *Checker
}

func newRig(t *testing.T, hc policy.HealthCheck, dial func(policy.DialVia) DialFunc, targets ...*policy.Target) *rig {
	t.Helper()
	vs := &policy.VirtualServer{Name: "web", VIPs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}, Ports: policy.PortRange{Lo: 80, Hi: 80}, Targets: targets}
	cfg, err := policy.Compile(&policy.Config{Services: []*policy.VirtualServer{vs}, Balancer: policy.BalancerSettings{Health: hc}})
	if err != nil {
		t.Fatal(err)
	}
	b := balancer.New(cfg.Services[0], cfg.Balancer)
	if dial == nil {
		dial = func(policy.DialVia) DialFunc { return HostDial }
	}
	r := &rig{cfg: cfg, b: b}
	r.c = &Checker{
		Plan: func() Plan {
			vs := cfg.ServiceByName("web")
			return Plan{Settings: *vs.Health, Targets: ServiceTargets(vs, dial, nil)}
		},
		Report: func(name string, r Result, now time.Time) { b.ReportCheck(name, r.OK, r.Reason, now) },
		Now:    func() time.Time { return t0 },
	}
	return r
}

// up is each target's health by the balancer, in configured order.
func (r *rig) up() []bool {
	var out []bool
	for _, ts := range r.b.Snapshot(t0).Targets {
		out = append(out, ts.HealthUp)
	}
	return out
}

// TestCheckerRiseFall: a dead port goes down after Fall failed rounds, a
// live one stays up; when the live one's listener closes it goes down after
// Fall rounds, and when it listens again it comes back after Rise rounds.
func TestCheckerRiseFall(t *testing.T) {
	srv := listen(t, "127.0.0.1:0")
	addr := srv.addr()
	r := newRig(t, policy.HealthCheck{Interval: time.Second, Timeout: 5 * time.Second, Rise: 3, Fall: 2}, nil,
		&policy.Target{Name: "live", Addr: addr, Weight: 1},
		&policy.Target{Name: "dead", Addr: deadAddr(t), Weight: 1})
	ctx := context.Background()
	step := func(what string, want ...bool) {
		t.Helper()
		r.c.CheckOnce(ctx)
		got := r.up()
		if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
			t.Fatalf("%s: up %v, want %v", what, got, want)
		}
	}
	step("round 1", true, true) // one failure of Fall 2
	step("round 2", true, false)
	srv.close()
	step("live closed, round 1", true, false)
	step("live closed, round 2", false, false)
	listen(t, addr.String())
	step("live again, round 1", false, false)
	step("live again, round 2", false, false)
	step("live again, round 3", true, false)
}

// TestCheckerDialsThroughTheTargetsVia: each target is checked with the
// dial function of its own via, at the address its connections go to (a
// target keeping the client's port is checked on the service's first port).
func TestCheckerDialsThroughTheTargetsVia(t *testing.T) {
	host := listen(t, "127.0.0.1:0")
	backArm := listen(t, "127.0.0.1:0")
	var mu sync.Mutex
	var viaNetstack []netip.AddrPort
	// The back arm here is a second loopback listener the dial function
	// reaches, whatever address it is asked for: only a target dialed
	// through it can pass.
	dial := func(v policy.DialVia) DialFunc {
		if v != policy.DialNetstack {
			return HostDial
		}
		return func(ctx context.Context, addr netip.AddrPort) (net.Conn, error) {
			mu.Lock()
			viaNetstack = append(viaNetstack, addr)
			mu.Unlock()
			return HostDial(ctx, backArm.addr())
		}
	}
	r := newRig(t, policy.HealthCheck{Interval: time.Second, Timeout: 5 * time.Second, Rise: 1, Fall: 1}, dial,
		&policy.Target{Name: "host", Addr: host.addr(), Weight: 1},
		&policy.Target{Name: "arm", Addr: netip.MustParseAddrPort("198.51.100.7:0"), Via: policy.DialNetstack, Weight: 1})
	r.c.CheckOnce(context.Background())
	if got := r.up(); !got[0] || !got[1] {
		t.Errorf("up %v, want both up", got)
	}
	if want := netip.MustParseAddrPort("198.51.100.7:80"); len(viaNetstack) != 1 || viaNetstack[0] != want {
		t.Errorf("back-arm dials %v, want one to %v", viaNetstack, want)
	}
	// The host target is not dialed through the back arm: with its
	// listener gone it fails although the back arm still answers.
	host.close()
	r.c.CheckOnce(context.Background())
	if got := r.up(); got[0] || !got[1] {
		t.Errorf("host target's listener closed: up %v, want false, true", got)
	}
}

// hang is a dial that completes no handshake: it returns when its context
// ends, as a dial to a target that drops SYNs.
func hang(started chan<- struct{}) DialFunc {
	return func(ctx context.Context, addr netip.AddrPort) (net.Conn, error) {
		if started != nil {
			started <- struct{}{}
		}
		<-ctx.Done()
		return nil, ctx.Err()
	}
}

// TestCheckerTimeoutAndCancel: a check that outlives its timeout fails; a
// check cut short by the checker's own context is no verdict at all.
func TestCheckerTimeoutAndCancel(t *testing.T) {
	type verdict struct {
		name string
		ok   bool
	}
	got := make(chan verdict, 4)
	target := []Target{{Name: "silent", Addr: netip.MustParseAddrPort("127.0.0.1:9"), Dial: hang(nil)}}
	c := &Checker{
		Plan: func() Plan {
			return Plan{Settings: policy.HealthCheck{Interval: time.Second, Timeout: time.Millisecond}, Targets: target}
		},
		Report: func(name string, r Result, _ time.Time) { got <- verdict{name, r.OK} },
	}
	c.CheckOnce(context.Background())
	if v := <-got; v != (verdict{"silent", false}) {
		t.Errorf("timed-out check: %+v, want silent failed", v)
	}

	started := make(chan struct{})
	target[0].Dial = hang(started)
	c.Plan = func() Plan {
		return Plan{Settings: policy.HealthCheck{Interval: time.Second, Timeout: time.Hour}, Targets: target}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.CheckOnce(ctx)
	}()
	<-started
	cancel()
	<-done
	select {
	case v := <-got:
		t.Errorf("cancelled check reported %+v", v)
	default:
	}
}

// TestCheckerInvalidAddrFailsWithoutDial: a target without an address is
// down, and nothing is dialed for it.
func TestCheckerInvalidAddrFailsWithoutDial(t *testing.T) {
	dialed := false
	var verdicts []bool
	c := &Checker{
		Plan: func() Plan {
			return Plan{Settings: policy.HealthCheck{Interval: time.Second, Timeout: time.Second}, Targets: []Target{{Name: "x", Dial: func(context.Context, netip.AddrPort) (net.Conn, error) {
				dialed = true
				return nil, errors.New("dialed")
			}}}}
		},
		Report: func(_ string, r Result, _ time.Time) { verdicts = append(verdicts, r.OK) },
	}
	c.CheckOnce(context.Background())
	if dialed || len(verdicts) != 1 || verdicts[0] {
		t.Errorf("dialed %v, verdicts %v; want no dial, one failure", dialed, verdicts)
	}
}

// TestLoopIdleWhenChecksOff: with Interval 0 the loop dials nothing.
func TestLoopIdleWhenChecksOff(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	dialed := false
	plans := 0
	c := &Checker{
		Plan: func() Plan {
			plans++
			cancel() // the loop returns after this plan
			return Plan{Targets: []Target{{Name: "a", Addr: netip.MustParseAddrPort("127.0.0.1:9"), Dial: func(context.Context, netip.AddrPort) (net.Conn, error) {
				dialed = true
				return nil, errors.New("dialed")
			}}}}
		},
		Report: func(string, Result, time.Time) { t.Error("a verdict with checks off") },
	}
	if err := c.Loop(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Loop: %v", err)
	}
	if dialed || plans != 1 {
		t.Errorf("dialed %v after %d plans; want no dial after 1", dialed, plans)
	}
	c.CheckOnce(context.Background())
	if dialed {
		t.Errorf("CheckOnce dialed with checks off")
	}
}

// TestLoopTakesDeadTargetOutAndStops: the loop's rounds mark a target whose
// listener closed down, and it returns once cancelled, its checks done (the
// package's leak check sees no goroutine left).
func TestLoopTakesDeadTargetOutAndStops(t *testing.T) {
	srv := listen(t, "127.0.0.1:0")
	r := newRig(t, policy.HealthCheck{Interval: 10 * time.Millisecond, Timeout: 5 * time.Second, Rise: 1, Fall: 1}, nil,
		&policy.Target{Name: "a", Addr: srv.addr(), Weight: 1},
		&policy.Target{Name: "b", Addr: deadAddr(t), Weight: 1})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.c.Loop(ctx) }()
	testutil.Eventually(t, 10*time.Second, func() bool { u := r.up(); return u[0] && !u[1] }, "b not marked down: %v", r.up())
	srv.close()
	testutil.Eventually(t, 10*time.Second, func() bool { return !r.up()[0] }, "a's closed listener not marked down")
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Loop returned %v, want context.Canceled", err)
	}
}

func TestServiceTargets(t *testing.T) {
	vs := &policy.VirtualServer{Ports: policy.PortRange{Lo: 8080, Hi: 8090}, Targets: []*policy.Target{
		{Name: "fixed", Addr: netip.MustParseAddrPort("10.0.0.1:9000")},
		{Name: "keeps-port", Addr: netip.MustParseAddrPort("10.0.0.2:0"), Via: policy.DialNetstack},
		{Name: "none"},
	}}
	var vias []policy.DialVia
	ts := ServiceTargets(vs, func(v policy.DialVia) DialFunc { vias = append(vias, v); return nil }, nil)
	want := []Target{
		{Name: "fixed", Addr: netip.MustParseAddrPort("10.0.0.1:9000")},
		{Name: "keeps-port", Addr: netip.MustParseAddrPort("10.0.0.2:8080")},
		{Name: "none"},
	}
	if len(ts) != len(want) {
		t.Fatalf("%d targets, want %d", len(ts), len(want))
	}
	for i := range want {
		if ts[i].Name != want[i].Name || ts[i].Addr != want[i].Addr {
			t.Errorf("target %d: %s %v, want %s %v", i, ts[i].Name, ts[i].Addr, want[i].Name, want[i].Addr)
		}
	}
	if len(vias) != 3 || vias[1] != policy.DialNetstack || vias[0] != policy.DialHost {
		t.Errorf("dial asked for %v", vias)
	}
}
