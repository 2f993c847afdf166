// The appliance's scenario tests run it whole in a lab (clients and
// backends on gVisor stacks joined by in-memory pairs), through its exported
// API only: the lab imports the appliance, so these live in an external test
// package.
package appliance_test

import (
	"context"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"weir/bench"
	"weir/cmd/weir/internal/admin"
	"weir/cmd/weir/internal/appliance"
	"weir/cmd/weir/internal/lab"
	"weir/cmd/weir/internal/metrics"
	"weir/cmd/weir/internal/obs"
	"weir/datapath/fault"
	"weir/internal/testutil"
	"weir/netstack"
	"weir/policy"
)

// labConfig is a config with one http service "web" on 198.19.0.80:80 whose
// targets are named t1.. with the given weights and maxConnections.
// TestMain fails the package if any test leaves a goroutine running: the
// lab's stacks, splices and loops must all end with Close.
func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

func labConfig(weights []int, maxConns []int64) *policy.Config {
	vs := &policy.VirtualServer{
		Name:  "web",
		VIPs:  []netip.Addr{netip.MustParseAddr("198.19.0.80"), netip.MustParseAddr("fd00::80")},
		Ports: policy.PortRange{Lo: 80, Hi: 80},
		Proto: policy.ProtoHTTP,
	}
	for i, w := range weights {
		t := &policy.Target{
			Name:   "t" + string(rune('1'+i)),
			Addr:   netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 19, 1, byte(10 + i)}), 8080),
			Weight: w,
			Via:    policy.DialNetstack,
		}
		if maxConns != nil {
			t.MaxConnections = maxConns[i]
		}
		vs.Targets = append(vs.Targets, t)
	}
	act := &policy.Action{Name: "gold", OutgoingTOS: 0xA0, SetTOS: true}
	return &policy.Config{
		Services: []*policy.VirtualServer{vs},
		Actions:  []*policy.Action{act},
		Rules:    []*policy.Rule{{Name: "web", ProtoLo: 6, ProtoHi: 6, SrcPort: policy.PortRange{Lo: 80, Hi: 80}, Action: act}},
		Monitor:  policy.Monitor{Enabled: true, SamplingInterval: time.Hour},
	}
}

func newLab(t *testing.T, cfg *policy.Config, o lab.Options) *lab.Lab {
	t.Helper()
	l, err := lab.New(cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func TestWeightedDistribution(t *testing.T) {
	l := newLab(t, labConfig([]int{3, 1}, nil), lab.Options{})
	for _, vip := range []string{"198.19.0.80:80", "[fd00::80]:80"} {
		res := bench.Load{Dial: l.Dial, Addr: vip, Clients: 1, Requests: 200, Duration: 30 * time.Second}.Run(context.Background())
		if res.OK != 200 {
			t.Fatalf("%s: %d of 200 OK: %+v", vip, res.OK, res)
		}
		// Smooth weighted round robin is exact over whole rounds.
		if res.PerTarget["t1"] != 150 || res.PerTarget["t2"] != 50 {
			t.Errorf("%s: per target %v, want t1 150, t2 50", vip, res.PerTarget)
		}
	}
	if st := l.App.DatapathStats(); st.Marked == 0 {
		t.Errorf("no packet toward clients was ToS-marked: %+v", st)
	}
}

// TestWebSphereMaxConnections is the WebSphere plug-in scenario: members
// with MaxConnections 3 and 4 and 30 concurrent slow clients. At most 7 are
// served at once, the rest get a 503 naming both members at their limit, and
// both serve again once their backlog drains.
func TestWebSphereMaxConnections(t *testing.T) {
	cfg := labConfig([]int{1, 1}, []int64{3, 4})
	var accessBuf testutil.SyncBuffer
	access := obs.NewAccessLog(&accessBuf, true)
	// The members hold every request until the 23 refusals are counted:
	// the 7 served stay open however slowly a loaded machine brings the
	// 30 clients in.
	hold := make(chan struct{})
	l := newLab(t, cfg, lab.Options{
		Backend:   func(_ policy.TargetKey, b *bench.Backend) { b.Hold = hold },
		Appliance: appliance.Options{Access: access},
	})
	done := make(chan bench.Result, 1)
	go func() {
		done <- bench.Load{Dial: l.Dial, Addr: "198.19.0.80:80", Clients: 30, Requests: 30, Duration: 30 * time.Second}.Run(context.Background())
	}()
	held := testutil.Within(20*time.Second, func() bool { return l.App.Status().Services[0].Refused >= 23 })
	close(hold)
	res := <-done
	if !held {
		t.Fatalf("23 refusals not counted while 7 requests were held: %+v", res)
	}
	b1, b2 := l.Backends[policy.TargetKey{Service: "web", Target: "t1"}], l.Backends[policy.TargetKey{Service: "web", Target: "t2"}]
	if b1.MaxActive() > 3 || b2.MaxActive() > 4 {
		t.Errorf("max active t1=%d (limit 3) t2=%d (limit 4)", b1.MaxActive(), b2.MaxActive())
	}
	if res.OK != 7 || res.OK+res.Refused503 != 30 {
		t.Fatalf("ok=%d 503=%d of 30, want 7 (3+4) and 23: %+v", res.OK, res.Refused503, res)
	}
	var reason string
	for r := range res.Reasons {
		reason = r
	}
	if !strings.Contains(reason, "t1 (at limit 3/3)") || !strings.Contains(reason, "t2 (at limit 4/4)") {
		t.Errorf("503 reason %q does not name both members at their limit", reason)
	}
	// The access log has the request line and 503 for each refusal, as the
	// plug-in's web server logs it. A refused client has its page a
	// moment before weir writes the line, as a served one has its answer
	// before weir sees both legs end: wait for both.
	waitClosed(t, l.App)
	testutil.Within(5*time.Second, func() bool {
		access.Flush()
		return strings.Count(accessBuf.String(), `"GET / HTTP/1.1" 503 `) >= res.Refused503
	})
	if n := strings.Count(accessBuf.String(), `"GET / HTTP/1.1" 503 `); n != res.Refused503 {
		t.Errorf("access log has %d 503 lines, want %d:\n%s", n, res.Refused503, accessBuf.String())
	}
	// One line per request (an http service is proxied request by
	// request), as the plug-in's web server logs them.
	if n := strings.Count(accessBuf.String(), `"GET / HTTP/1.1" 200 `); n != res.OK {
		t.Errorf("access log has %d served lines, want %d:\n%s", n, res.OK, accessBuf.String())
	}
	// Backlog drained: both serve again.
	res = bench.Load{Dial: l.Dial, Addr: "198.19.0.80:80", Clients: 2, Requests: 4, Duration: 30 * time.Second}.Run(context.Background())
	if res.PerTarget["t1"] == 0 || res.PerTarget["t2"] == 0 {
		t.Errorf("after the backlog: %v, want both serving", res.PerTarget)
	}
}

func TestEnforcedLimitRefusesWithPage(t *testing.T) {
	cfg := labConfig([]int{1}, nil)
	cfg.Services[0].Limits = policy.Limits{MaxConnections: 2, EnforceConnections: true}
	hold := make(chan struct{}) // the 2 served wait until the 4 refusals are counted
	l := newLab(t, cfg, lab.Options{Backend: func(_ policy.TargetKey, b *bench.Backend) { b.Hold = hold }})
	done := make(chan bench.Result, 1)
	go func() {
		done <- bench.Load{Dial: l.Dial, Addr: "198.19.0.80:80", Clients: 6, Requests: 6, Duration: 30 * time.Second}.Run(context.Background())
	}()
	testutil.Within(20*time.Second, func() bool { return refusals(l.App, "virtual server", "maxConnections") >= 4 })
	close(hold)
	res := <-done
	if res.OK != 2 || res.Refused503 != 4 {
		t.Fatalf("ok=%d 503=%d, want 2 and 4: %+v", res.OK, res.Refused503, res)
	}
	for r := range res.Reasons {
		if !strings.Contains(r, "maxConnections 2") {
			t.Errorf("503 reason %q does not name the limit", r)
		}
	}
}

func TestLossMovesWeight(t *testing.T) {
	cfg := labConfig([]int{10, 10}, nil)
	// Loss on weir → t2: weir's own segments to t2 are retransmitted, so
	// the load uploads and the monitor reads that direction (to_target).
	cfg.Monitor.Direction = policy.ToTarget
	l := newLab(t, cfg, lab.Options{})
	l.Faults[policy.TargetKey{Service: "web", Target: "t2"}].SetRates(fault.Rates{Drop: 0.05}, fault.Rates{})
	res := bench.Load{Dial: l.Dial, Addr: "198.19.0.80:80", Clients: 4, Requests: 80, Upload: 64 << 10, Duration: 90 * time.Second, Timeout: 30 * time.Second}.Run(context.Background())
	if res.OK != 80 {
		t.Fatalf("load under loss: %+v", res)
	}
	expl := l.App.SampleNow()
	var e1, e2 policy.Explanation
	for _, e := range expl {
		switch e.Target {
		case "t1":
			e1 = e
		case "t2":
			e2 = e
		}
	}
	if e2.LossFraction == 0 || e2.Weight >= e2.BaseWeight {
		t.Errorf("lossy t2: %s", e2)
	}
	// The clean target reads about 0; under the race detector a starved
	// stack retransmits spuriously now and then, so compare the two.
	if e1.LossRatio >= e2.LossRatio || e1.Weight <= e2.Weight {
		t.Errorf("clean t1 (%s) not better than lossy t2 (%s)", e1, e2)
	}
	st := l.App.Status()
	for _, tg := range st.Services[0].Targets {
		if tg.Name == "t2" && tg.Effective != e2.Weight {
			t.Errorf("balancer effective weight %d, sampler %d", tg.Effective, e2.Weight)
		}
	}
}

func TestReloadKeepsCountersAndConnections(t *testing.T) {
	cfg := labConfig([]int{1, 1}, nil)
	l := newLab(t, cfg, lab.Options{Backend: func(_ policy.TargetKey, b *bench.Backend) { b.Delay = 400 * time.Millisecond }})
	done := make(chan bench.Result)
	go func() {
		done <- bench.Load{Dial: l.Dial, Addr: "198.19.0.80:80", Clients: 4, Requests: 8, Duration: 30 * time.Second}.Run(context.Background())
	}()
	// Reload while connections are open.
	testutil.Eventually(t, 10*time.Second, func() bool { return l.App.OpenConnections() > 0 }, "no connection open under load")
	next := labConfig([]int{1, 5}, nil)
	next.Services[0].Limits = policy.Limits{MaxConnections: 100, EnforceConnections: true}
	if err := l.App.Reload(next); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.OK != 8 {
		t.Fatalf("reload under load lost connections: %+v", res)
	}
	st := l.App.Status()
	if st.Generation != 2 {
		t.Errorf("generation %d, want 2", st.Generation)
	}
	var picked uint64
	for _, tg := range st.Services[0].Targets {
		picked += tg.Picked
	}
	if picked != 8 {
		t.Errorf("picked counters after reload sum to %d, want 8", picked)
	}
	bad := labConfig([]int{1}, nil)
	bad.Services[0].Ports = policy.PortRange{Lo: 9, Hi: 1}
	if err := l.App.Reload(bad); err == nil {
		t.Fatal("bad config accepted")
	}
	if st := l.App.Status(); st.ReloadError == nil || st.Generation != 2 {
		t.Errorf("after a bad reload: generation %d, error %v", st.Generation, st.ReloadError)
	}
}

func TestMetricsScrape(t *testing.T) {
	reg := prometheus.NewRegistry()
	l := newLab(t, labConfig([]int{1}, nil), lab.Options{})
	reg.MustRegister(metrics.NewCollector(l.App.Status))
	bench.Load{Dial: l.Dial, Addr: "198.19.0.80:80", Clients: 1, Requests: 3}.Run(context.Background())
	waitClosed(t, l.App)
	l.App.SampleNow()
	srv := httptest.NewServer(admin.Handler(admin.Options{}, l.App, reg))
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("metrics do not parse: %v", err)
	}
	for _, name := range []string{"weir_connections_closed_total", "weir_target_picked_total", "weir_target_weight",
		"weir_target_fraction_percent", "weir_datapath_marked_total", "weir_datapath_dropped_total", "weir_connections_accepted_total", "weir_level_connections",
		"weir_nic_packets_total", "weir_datapath_flows_created_total"} {
		if fams[name] == nil {
			t.Errorf("metric %s missing", name)
		}
	}
	documented := map[string]bool{}
	for _, m := range metrics.Defs {
		documented[m.Name] = true
	}
	for name := range fams {
		if strings.HasPrefix(name, "weir_") && !documented[name] {
			t.Errorf("metric %s is exported but not in metrics.Defs (the README table)", name)
		}
	}
	if v := fams["weir_connections_closed_total"].Metric[0].Counter.GetValue(); v != 3 {
		t.Errorf("closed total %v, want 3", v)
	}
}

// TestNoGoroutineLeak: a lab under load, closed, leaves no goroutine behind
// (the stacks' workers, the splices, the loops, the health checkers).
func TestNoGoroutineLeak(t *testing.T) {
	testutil.CheckNoLeaks(t)
	l, err := lab.New(labConfig([]int{1, 1}, nil), lab.Options{})
	if err != nil {
		t.Fatal(err)
	}
	l.App.Start()
	if res := (bench.Load{Dial: l.Dial, Addr: "198.19.0.80:80", Clients: 8, Requests: 200}).Run(context.Background()); res.OK != 200 {
		t.Errorf("load: %d of 200 OK: %+v", res.OK, res)
	}
	l.Close()
}

// refusals is the number of connections refused by the given level's limit.
func refusals(a *appliance.Appliance, level, limit string) uint64 {
	for _, r := range a.Status().Refusals {
		if r.Level == level && r.Limit == limit {
			return r.Count
		}
	}
	return 0
}

// waitClosed waits until every admitted connection has been reported closed:
// a client has its answer a moment before weir sees both legs end.
func waitClosed(t *testing.T, a *appliance.Appliance) {
	t.Helper()
	testutil.Eventually(t, 5*time.Second, func() bool { return a.OpenConnections() == 0 }, "every connection reported closed")
}

func TestHealthChecksTakeDeadTargetOut(t *testing.T) {
	cfg := labConfig([]int{1, 1}, nil)
	cfg.Balancer.Health = policy.HealthCheck{Interval: 50 * time.Millisecond, Timeout: 40 * time.Millisecond, Rise: 1, Fall: 2}
	l := newLab(t, cfg, lab.Options{})
	l.App.Start()
	l.Backends[policy.TargetKey{Service: "web", Target: "t2"}].Close()
	testutil.Eventually(t, 5*time.Second, func() bool {
		for _, tg := range l.App.Status().Services[0].Targets {
			if tg.Name == "t2" {
				return !tg.HealthUp
			}
		}
		return false
	}, "t2's backend is closed but health checks still report it up")
	res := bench.Load{Dial: l.Dial, Addr: "198.19.0.80:80", Clients: 2, Requests: 20}.Run(context.Background())
	if res.OK != 20 || res.PerTarget["t1"] != 20 {
		t.Errorf("with t2 unhealthy: %+v", res)
	}
}

// TestMaxAttemptsOneOwner: with maxAttempts 5 and three refusing targets
// ahead of a healthy one, the balancer's tried-set alone bounds the dials.
// The client is served by the fourth pick, each refusing target is marked
// down for having failed, and the healthy target is never marked down (the
// forwarder used to stop after 3 dials of its own and report the fourth,
// never-dialed pick as failed: a 503, and a healthy target down for the
// retry interval).
func TestMaxAttemptsOneOwner(t *testing.T) {
	cfg := labConfig([]int{1, 1, 1, 1}, nil)
	cfg.Balancer.MaxAttempts = 5
	var accessBuf testutil.SyncBuffer
	access := obs.NewAccessLog(&accessBuf, false)
	l := newLab(t, cfg, lab.Options{Appliance: appliance.Options{Access: access}})
	for _, name := range []string{"t1", "t2", "t3"} {
		l.Backends[policy.TargetKey{Service: "web", Target: name}].Close() // its stack answers SYNs with RST
	}
	res := bench.Load{Dial: l.Dial, Addr: "198.19.0.80:80", Clients: 1, Requests: 1, Duration: 30 * time.Second}.Run(context.Background())
	if res.OK != 1 || res.PerTarget["t4"] != 1 {
		t.Fatalf("client not served by t4: %+v", res)
	}
	waitClosed(t, l.App)
	for _, tg := range l.App.Status().Services[0].Targets {
		switch tg.Name {
		case "t4":
			if tg.Down || tg.Failed != 0 || tg.Picked != 1 {
				t.Errorf("healthy t4: down %v, failed %d, picked %d; want up, 0 failed, 1 picked", tg.Down, tg.Failed, tg.Picked)
			}
		default:
			if !tg.Down || tg.Failed != 1 {
				t.Errorf("refusing %s: down %v, failed %d; want down after 1 failed dial", tg.Name, tg.Down, tg.Failed)
			}
		}
	}
	// The access line says what happened: served, by t4.
	access.Flush()
	if line := accessBuf.String(); !strings.Contains(line, `"target":"t4"`) || !strings.Contains(line, `"outcome":"ok"`) {
		t.Errorf("access log %q, want t4 and outcome ok", line)
	}
}

// TestAccessOutcomes: the access log's outcomes are the forwarder's, each
// with its Common Log Format status.
func TestAccessOutcomes(t *testing.T) {
	for o, code := range map[netstack.Outcome]string{
		netstack.Served: "200", netstack.IdleClosed: "200", netstack.RefusedReset: "503", netstack.RefusedPage: "503",
		netstack.HandshakeFailed: "408", netstack.HandshakeTimedOut: "408", netstack.Aborted: "500",
	} {
		line := obs.CLF(obs.AccessRecord{Client: "198.18.0.2:4000", VIP: "198.19.0.80:80", Target: "t1", Outcome: o.String()})
		if !strings.Contains(line, `"TCP 198.19.0.80:80 t1" `+code+" ") {
			t.Errorf("outcome %s: %s, want status %s", o, line, code)
		}
	}
}

// TestRawStats: the raw counters of every part reach the control plane
// through one call, NIC by NIC, for the metrics table to export.
func TestRawStats(t *testing.T) {
	l := newLab(t, labConfig([]int{1, 1}, nil), lab.Options{})
	res := bench.Load{Dial: l.Dial, Addr: "198.19.0.80:80", Clients: 2, Requests: 10, Duration: 30 * time.Second}.Run(context.Background())
	if res.OK != 10 {
		t.Fatalf("load: %+v", res)
	}
	waitClosed(t, l.App)
	st := l.App.RawStats()
	if st.Forwarder.Accepted != 10 || st.Flows.Inserted == 0 || st.Datapath.Marked == 0 {
		t.Errorf("forwarder %+v, flows %+v, datapath %+v", st.Forwarder, st.Flows, st.Datapath)
	}
	var names []string
	for _, n := range st.NICs {
		names = append(names, n.Name)
		if n.Link.RxPackets == 0 || n.Link.TxPackets == 0 {
			t.Errorf("NIC %s moved nothing: %+v", n.Name, n.Link)
		}
	}
	if len(names) != 3 || names[0] != "front" || st.NICs[0].Back || !st.NICs[1].Back {
		t.Errorf("NICs %v, want the front, then the two back arms", names)
	}
	if !st.NICs[0].HasDevice || st.NICs[0].Device.RxPackets == 0 {
		t.Errorf("front device counters %+v (has %v)", st.NICs[0].Device, st.NICs[0].HasDevice)
	}
}
