package appliance_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"weir/bench"
	"weir/cmd/weir/api"
	"weir/cmd/weir/internal/appliance"
	"weir/cmd/weir/internal/lab"
	"weir/cmd/weir/internal/metrics"
	"weir/internal/testutil"
	"weir/policy"
)

// targetStatus is one target of the lab's first service in /status.
func targetStatus(t *testing.T, l *lab.Lab, name string) api.Target {
	t.Helper()
	for _, tg := range l.App.Status().Services[0].Targets {
		if tg.Name == name {
			return tg
		}
	}
	t.Fatalf("no target %s in /status", name)
	return api.Target{}
}

// gauge reads one sample of a metric from the lab's collector: the one
// whose labels include want.
func gauge(t *testing.T, l *lab.Lab, name string, want map[string]string) (float64, bool) {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewCollector(l.App.Status))
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range want {
				if got[k] != v {
					continue next
				}
			}
			if g := m.GetGauge(); g != nil {
				return g.GetValue(), true
			}
			return m.GetCounter().GetValue(), true
		}
	}
	return 0, false
}

// requestsAt counts the requests a lab backend answered, 500s included.
func requestsAt(b *bench.Backend) int64 { return b.Served() + b.Errored() }

// TestErrorFractionCutsAndHeals: a real http target answering 500 to every
// tenth request (10 %) gets the error fraction's first step after one
// sampling interval (errorRatioAndWeightFr [50, 25]: above 5 % cuts 25 %),
// /status and the metrics name the error part, its share of new requests
// falls from ½ to 0.75/1.75 (0.429); healed, its fraction is 0 after one
// interval and its share is back. Each SampleNow is one sampling interval.
func TestErrorFractionCutsAndHeals(t *testing.T) {
	const n = 200
	cfg := lab.WebConfig([]int{1, 1}, nil)
	cfg.Monitor.ErrorThreshold, cfg.Monitor.ErrorStep = 50, 25
	l := lab.Must(t, cfg, lab.Options{})
	k1, k2 := policy.TargetKey{Service: "web", Target: "t1"}, policy.TargetKey{Service: "web", Target: "t2"}
	t1, t2 := l.Backends[k1], l.Backends[k2]
	t1.ErrorEvery.Store(10)
	load := func() (share float64, errs int64) {
		t.Helper()
		r1, r2, e1 := requestsAt(t1), requestsAt(t2), t1.Errored()
		res := bench.Load{Dial: l.Dial, Addr: "198.19.0.80:80", Clients: 4, Requests: n, Duration: 60 * time.Second}.Run(context.Background())
		if res.Requests != n || res.Reset+res.Refused503 != 0 {
			t.Fatalf("load: %+v", res)
		}
		waitClosed(t, l.App) // every request's end counted
		d1, d2 := requestsAt(t1)-r1, requestsAt(t2)-r2
		if d1+d2 != n {
			t.Fatalf("backends answered %d+%d requests of %d", d1, d2, n)
		}
		return float64(d1) / n, t1.Errored() - e1
	}
	share, errs := load()
	if share != 0.5 || errs != n/2/10 {
		t.Fatalf("uncut: t1's share %.3f with %d 500s, want 0.5 (round robin) and %d", share, errs, n/2/10)
	}
	// One sampling interval: t1's 10 % is above 5 %, one step, 25 %.
	expl := l.App.SampleNow()
	e1 := expl[0]
	if e1.Target != "t1" || e1.Responses != n/2 || e1.ServerErrors != n/2/10 || e1.ErrorRatio != 100 || e1.ErrorFraction != 25 ||
		e1.Fraction != 25 || e1.Winner != policy.WinError {
		t.Fatalf("t1 after one interval: %d/%d 5xx, ratio %d, error %d%%, total %d%% won %v; want 10/100, 100 (10.0 %%), 25, 25, error",
			e1.ServerErrors, e1.Responses, e1.ErrorRatio, e1.ErrorFraction, e1.Fraction, e1.Winner)
	}
	if e2 := expl[1]; e2.ErrorFraction != 0 || e2.Fraction != 0 || e2.Responses != n/2 {
		t.Errorf("t2 (no errors): %+v", e2)
	}
	st := targetStatus(t, l, "t1")
	if x := st.Explanation; x == nil || x.Winner != "error" || x.ErrorFraction != 25 || x.ErrorRatio != 100 || x.ServerErrors != n/2/10 || st.Exact != 0.75 {
		t.Errorf("/status of t1: %+v exact %v, want winner error, error 25 %%, weight 0.75", st.Explanation, st.Exact)
	}
	if v, ok := gauge(t, l, "weir_target_fraction_percent", map[string]string{"target": "t1", "part": "error"}); !ok || v != 25 {
		t.Errorf("metrics: t1's part=error %v (found %v), want 25", v, ok)
	}
	// Its share of new requests falls to 0.75/1.75.
	share, _ = load()
	t.Logf("t1 at 25 %%: share of new requests %.3f (0.75/1.75 = 0.429)", share)
	if share < 0.40 || share > 0.46 {
		t.Errorf("t1 at 25 %%: share %.3f, want about 0.429", share)
	}
	// Healed: the next interval judges it at 0 %, and its share is back.
	if e := l.App.SampleNow()[0]; e.ErrorFraction != 25 {
		t.Fatalf("t1 still erring: error %d%%, want 25", e.ErrorFraction)
	}
	t1.ErrorEvery.Store(0)
	if share, errs = load(); errs != 0 || share > 0.46 {
		t.Fatalf("healed t1 in the interval still judged at 25 %%: %d 500s, share %.3f; want 0 and the cut share", errs, share)
	}
	if e := l.App.SampleNow()[0]; e.ErrorFraction != 0 || e.Fraction != 0 || e.ServerErrors != 0 {
		t.Fatalf("t1 healed for one interval: error %d%% total %d%%, want 0", e.ErrorFraction, e.Fraction)
	}
	if share, _ = load(); share != 0.5 {
		t.Errorf("healed: t1's share %.3f, want 0.5", share)
	}
}

// TestEjectionOfServerErrorTarget: with balancer.ejection {5, 30s, 50 %,
// serverErrors}, a real http target answering 500 to every request is
// ejected after 5 in a row (counted once in /status and the metrics, one
// log line), the other takes every new request while it is out, and it is
// picked again once the 30 s of the appliance's manual clock have passed.
// With 2 targets and maxPercent 50 the second one is never ejected.
func TestEjectionOfServerErrorTarget(t *testing.T) {
	cfg := lab.WebConfig([]int{1, 1}, nil)
	cfg.Balancer.Ejection = policy.Ejection{ConsecutiveFailures: 5, For: 30 * time.Second, MaxPercent: 50, ServerErrors: true}
	clk := &clock{}
	clk.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	var logBuf testutil.SyncBuffer
	log := zerolog.New(&logBuf)
	l := lab.Must(t, cfg, lab.Options{Appliance: appliance.Options{Now: clk.Now, Log: &log}})
	t1 := l.Backends[policy.TargetKey{Service: "web", Target: "t1"}]
	t2 := l.Backends[policy.TargetKey{Service: "web", Target: "t2"}]
	t2.ErrorEvery.Store(1) // every request 500
	run := func(n int) bench.Result {
		t.Helper()
		res := bench.Load{Dial: l.Dial, Addr: "198.19.0.80:80", Clients: 1, Requests: n, Duration: 60 * time.Second}.Run(context.Background())
		if res.Requests != n || res.Reset+res.Refused503 != 0 {
			t.Fatalf("load: %+v", res)
		}
		waitClosed(t, l.App)
		return res
	}
	run(40)
	if got := t2.Errored(); got != 5 {
		t.Errorf("t2 answered %d requests (all 500) before its ejection, want 5", got)
	}
	if got := t1.Served(); got != 35 {
		t.Errorf("t1 served %d of 40, want 35", got)
	}
	st2 := targetStatus(t, l, "t2")
	if !st2.Ejected || st2.Ejections != 1 || !st2.EjectedUntil.After(clk.Now()) {
		t.Errorf("t2 in /status: ejected %v until %v, %d ejections; want ejected, 1", st2.Ejected, st2.EjectedUntil, st2.Ejections)
	}
	if v, ok := gauge(t, l, "weir_target_ejections_total", map[string]string{"target": "t2"}); !ok || v != 1 {
		t.Errorf("weir_target_ejections_total{t2} %v %v, want 1", v, ok)
	}
	if v, ok := gauge(t, l, "weir_target_ejected", map[string]string{"target": "t2"}); !ok || v != 1 {
		t.Errorf("weir_target_ejected{t2} %v %v, want 1", v, ok)
	}
	if n := strings.Count(logBuf.String(), "target ejected"); n != 1 || !strings.Contains(logBuf.String(), `"target":"t2"`) {
		t.Errorf("%d ejection log lines, want 1 naming t2:\n%s", n, logBuf.String())
	}
	// t1 alone may not be ejected too (2 of 2 > 50 %): it fails 10 in a row
	// and keeps serving.
	t1.ErrorEvery.Store(1)
	run(10)
	if st := targetStatus(t, l, "t1"); st.Ejected || st.Ejections != 0 || t1.Errored() != 10 {
		t.Errorf("t1 failing while t2 is ejected: ejected %v (%d), %d 500s; want kept, 10", st.Ejected, st.Ejections, t1.Errored())
	}
	t1.ErrorEvery.Store(0)
	// Healed and 30 s later: t2 is back, with its share.
	t2.ErrorEvery.Store(0)
	clk.Advance(30 * time.Second)
	if res := run(40); res.PerTarget["t2"] != 20 || res.PerTarget["t1"] != 20 {
		t.Errorf("after the ejection: %v, want 20 each", res.PerTarget)
	}
	if st := targetStatus(t, l, "t2"); st.Ejected || st.Ejections != 1 {
		t.Errorf("t2 back: ejected %v, %d ejections; want back, 1", st.Ejected, st.Ejections)
	}
}

// TestEjectionOfRefusingTarget: a target whose server is gone (every
// connect refused), with retryInterval 1 ms so that each failed connect
// rests it only until the next request of the manual clock, is ejected
// after 5 failed connects in a row, gets no pick for the 30 s, and is
// picked again afterwards. The clients never see the failures: each
// failed dial goes on to the other target.
func TestEjectionOfRefusingTarget(t *testing.T) {
	cfg := lab.WebConfig([]int{1, 1}, nil)
	cfg.Balancer.RetryInterval = time.Millisecond
	cfg.Balancer.Ejection = policy.Ejection{ConsecutiveFailures: 5, For: 30 * time.Second, MaxPercent: 50}
	clk := &clock{}
	clk.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	l := lab.Must(t, cfg, lab.Options{Appliance: appliance.Options{Now: clk.Now}})
	l.Backends[policy.TargetKey{Service: "web", Target: "t2"}].Close() // connects refused from now on
	one := func() {
		t.Helper()
		res := bench.Load{Dial: l.Dial, Addr: "198.19.0.80:80", Clients: 1, Requests: 1, Duration: 30 * time.Second}.Run(context.Background())
		if res.OK != 1 || res.PerTarget["t1"] != 1 {
			t.Fatalf("request: %+v, want served by t1", res)
		}
		waitClosed(t, l.App)
		clk.Advance(2 * time.Millisecond) // past the retry interval
	}
	for range 20 {
		one()
	}
	st := targetStatus(t, l, "t2")
	if st.Failed != 5 || !st.Ejected || st.Ejections != 1 {
		t.Fatalf("t2 after 20 requests: %d failed connects, ejected %v (%d); want 5, ejected once", st.Failed, st.Ejected, st.Ejections)
	}
	clk.Advance(30 * time.Second)
	for range 4 {
		one()
	}
	if st := targetStatus(t, l, "t2"); st.Picked <= 5 || st.Ejected {
		t.Errorf("t2 after its 30 s: picked %d times, ejected %v; want picked again", st.Picked, st.Ejected)
	}
}
