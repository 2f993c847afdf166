package lab

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"weir/bench"
	"weir/datapath/fault"
	"weir/internal/testutil"
	"weir/policy"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

func oneService(via policy.DialVia, addrs ...string) *policy.Config {
	vs := &policy.VirtualServer{
		Name: "web", VIPs: []netip.Addr{netip.MustParseAddr("198.19.0.80")},
		Ports: policy.PortRange{Lo: 80, Hi: 80}, Proto: policy.ProtoHTTP,
	}
	for i, a := range addrs {
		vs.Targets = append(vs.Targets, &policy.Target{Name: "t" + string(rune('1'+i)), Addr: netip.MustParseAddrPort(a), Weight: 1, Via: via})
	}
	return &policy.Config{Services: []*policy.VirtualServer{vs}}
}

func TestNewRejectsHostTargets(t *testing.T) {
	_, err := New(oneService(policy.DialHost, "198.19.1.10:8080"), Options{})
	if err == nil || !strings.Contains(err.Error(), "must be via netstack") {
		t.Fatalf("New with a via: host target = %v, want an error saying it must be via netstack", err)
	}
}

// TestFaultsAreEachTargetsOwn: every target has its backend and its own
// fault injector; dropping everything on t2's leg leaves t1 serving every
// request and the drops counted on t2's injector only.
func TestFaultsAreEachTargetsOwn(t *testing.T) {
	// A dial to t2 gives up after 300 ms; weir then marks t2 down and
	// serves the connection from t1.
	cfg := oneService(policy.DialNetstack, "198.19.1.10:8080", "198.19.1.11:8080")
	cfg.Instance.Timeouts.Connect = 300 * time.Millisecond
	l, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	t1, t2 := policy.TargetKey{Service: "web", Target: "t1"}, policy.TargetKey{Service: "web", Target: "t2"}
	if l.Backends[t1] == nil || l.Backends[t2] == nil || l.Faults[t1] == nil || l.Faults[t2] == nil {
		t.Fatalf("backends %v, faults %v: want one of each per target", l.Backends, l.Faults)
	}
	l.Faults[t2].SetRates(fault.Rates{Drop: 1}, fault.Rates{Drop: 1})
	res := bench.Load{Dial: l.Dial, Addr: "198.19.0.80:80", Clients: 1, Requests: 4, Duration: 20 * time.Second}.Run(context.Background())
	if res.OK != 4 || res.PerTarget["t1"] != 4 {
		t.Errorf("with t2's leg dropping everything: %+v", res)
	}
	if l.Faults[t2].Stats().Write.Dropped == 0 || l.Faults[t1].Stats().Write.Dropped != 0 {
		t.Errorf("drops t1 %+v, t2 %+v: want t2's only", l.Faults[t1].Stats(), l.Faults[t2].Stats())
	}
}

// TestTargetKeepsClientPort: a service on ports 8000-8002 whose target has
// no port connects each client to the port it asked for (the backend
// listens on every port of the range; a dial to port 0 would fail).
func TestTargetKeepsClientPort(t *testing.T) {
	cfg := oneService(policy.DialNetstack, "198.19.1.10:0")
	cfg.Services[0].Ports = policy.PortRange{Lo: 8000, Hi: 8002}
	cfg.Instance.Timeouts.Connect = time.Second
	l, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, port := range []string{"8000", "8002"} {
		res := bench.Load{Dial: l.Dial, Addr: "198.19.0.80:" + port, Clients: 1, Requests: 2, Duration: 10 * time.Second}.Run(context.Background())
		if res.OK != 2 || res.PerTarget["t1"] != 2 {
			t.Errorf("port %s: %+v", port, res)
		}
	}
	if f := l.App.TargetFailures(policy.TargetKey{Service: "web", Target: "t1"}); f != 0 {
		t.Errorf("%d connects failed", f)
	}
}
