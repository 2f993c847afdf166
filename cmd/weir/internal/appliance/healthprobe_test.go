package appliance_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"weir/bench"
	"weir/cmd/weir/api"
	"weir/cmd/weir/internal/lab"
	"weir/internal/testutil"
	"weir/policy"
)

// TestHTTPHealthCheckTakes503TargetOut: with the service's own HTTP check
// (the balancer's checks off), a target whose /healthz answers 503, though
// it serves "/" well, is marked down through the back arm, shown in the
// status with its reason, and gets no traffic; answering 200 again, it is
// back after rise checks and gets its share.
func TestHTTPHealthCheckTakes503TargetOut(t *testing.T) {
	const interval, fall = 50 * time.Millisecond, 2
	cfg := lab.WebConfig([]int{1, 1}, nil)
	cfg.Services[0].Health = &policy.HealthCheck{Interval: interval, Timeout: 40 * time.Millisecond, Rise: 1, Fall: fall,
		HTTP: &policy.HTTPCheck{Path: "/healthz"}}
	l := lab.Must(t, cfg, lab.Options{Backend: func(k policy.TargetKey, b *bench.Backend) {
		b.HealthPath = "/healthz"
		if k.Target == "t2" {
			b.HealthStatus.Store(http.StatusServiceUnavailable)
		}
	}})
	t2 := l.Backends[policy.TargetKey{Service: "web", Target: "t2"}]
	target := func(name string) api.Target {
		for _, tg := range l.App.Status().Services[0].Targets {
			if tg.Name == name {
				return tg
			}
		}
		t.Fatalf("no target %s", name)
		return api.Target{}
	}
	start := time.Now()
	l.App.Start()
	testutil.Eventually(t, 10*time.Second, func() bool { return !target("t2").HealthUp }, "t2 answers 503 on /healthz but is still up")
	t.Logf("t2 (503 from the start) marked down %v after Start (fall %d × interval %v = %v)", time.Since(start), fall, interval, fall*interval)
	if c := target("t2").Check; c == nil || c.OK || c.Reason != "status 503" || c.Need != 1 {
		t.Errorf("t2's check in /status: %+v, want failed, status 503, toward rise 1", c)
	}
	if c := target("t1").Check; c == nil || !c.OK || c.Need != fall {
		t.Errorf("t1's check in /status: %+v, want ok toward fall %d", c, fall)
	}
	res := bench.Load{Dial: l.Dial, Addr: "198.19.0.80:80", Clients: 2, Requests: 20}.Run(context.Background())
	if res.OK != 20 || res.PerTarget["t1"] != 20 || t2.Served() != 0 {
		t.Errorf("with t2 failing its check: %+v, t2 served %d", res, t2.Served())
	}
	t2.HealthStatus.Store(http.StatusOK)
	testutil.Eventually(t, 10*time.Second, func() bool { return target("t2").HealthUp }, "t2 answers 200 again but stays down")
	res = bench.Load{Dial: l.Dial, Addr: "198.19.0.80:80", Clients: 2, Requests: 20}.Run(context.Background())
	if res.OK != 20 || res.PerTarget["t2"] == 0 {
		t.Errorf("t2 healthy again: %+v", res)
	}
}
