package appliance_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"weir/bench"
	"weir/cmd/weir/api"
	"weir/cmd/weir/internal/appliance"
	"weir/cmd/weir/internal/cluster/clustertest"
	"weir/cmd/weir/internal/lab"
	"weir/internal/testutil"
	"weir/policy"
)

func webLevel(a *appliance.Appliance) (api.ClusterLevel, bool) {
	c := a.Status().Cluster
	if c == nil {
		return api.ClusterLevel{}, false
	}
	for _, l := range c.Levels {
		if l.Level == "virtual server" && l.Name == "web" {
			return l, true
		}
	}
	return api.ClusterLevel{}, false
}

// TestClusterSharesLimit: two appliances in one cluster (a real
// redis-server) enforce one maxConnections of 4 between them: with 5
// held requests on each, 4 are served at once over the two and the rest
// are refused with a page naming the share; /status shows the cluster.
func TestClusterSharesLimit(t *testing.T) {
	r := clustertest.StartRedis(t)
	hold := make(chan struct{})
	var labs []*lab.Lab
	for _, id := range []string{"a", "b"} {
		cfg := labConfig([]int{1}, nil)
		cfg.Services[0].Limits = policy.Limits{MaxConnections: 4, EnforceConnections: true}
		cfg.Cluster = &policy.Cluster{Redis: r.Addr(), Name: "lab", Instance: id, LeaseInterval: 50 * time.Millisecond}
		l := newLab(t, cfg, lab.Options{Backend: func(_ policy.TargetKey, b *bench.Backend) { b.Hold = hold }})
		l.App.Start()
		labs = append(labs, l)
	}
	for _, l := range labs {
		testutil.Eventually(t, 5*time.Second, func() bool {
			c := l.App.Status().Cluster
			return c != nil && c.Reachable && c.Mode == "shared" && len(c.Members) == 2
		}, "the cluster never formed")
	}
	// Idle, the two hold an even part each: a burst is admitted at once.
	for _, l := range labs {
		testutil.Eventually(t, 5*time.Second, func() bool {
			lv, _ := webLevel(l.App)
			return lv.Share == 2
		}, "idle shares never settled at 2 each")
	}
	results := make(chan bench.Result, len(labs))
	for _, l := range labs {
		go func() {
			results <- bench.Load{Dial: l.Dial, Addr: "198.19.0.80:80", Clients: 5, Requests: 5, Duration: 30 * time.Second}.Run(context.Background())
		}()
	}
	// Until the 10 requests are answered, the open ones never exceed 4 over
	// both (each Status is read after the other's: a bound, not a snapshot).
	var peak int64
	testutil.Within(20*time.Second, func() bool {
		var open, refused int64
		for _, l := range labs {
			lv, _ := webLevel(l.App)
			open += lv.Open
			refused += int64(lv.Refused)
		}
		peak = max(peak, open)
		return open >= 4 && refused > 0
	})
	for range 20 {
		var open int64
		for _, l := range labs {
			lv, _ := webLevel(l.App)
			open += lv.Open
		}
		peak = max(peak, open)
		time.Sleep(10 * time.Millisecond)
	}
	close(hold)
	var ok, refused int
	reasons := map[string]int{}
	for range labs {
		res := <-results
		ok += res.OK
		refused += res.Refused503
		for k, v := range res.Reasons {
			reasons[k] += v
		}
	}
	if peak > 4 {
		t.Errorf("%d requests open over the two instances, limit 4", peak)
	}
	if ok < 4 || ok+refused != 10 {
		t.Errorf("ok=%d refused=%d, want at least 4 served and the rest refused", ok, refused)
	}
	shared := false
	for k := range reasons {
		shared = shared || strings.Contains(k, "share of the cluster-wide limit")
	}
	if !shared {
		t.Errorf("no refusal names the instance's share: %v", reasons)
	}
	st := labs[0].App.Status().Cluster
	if st.Name != "lab" || st.Instance != "a" || st.Renewals == 0 || st.Members[0].ID != "a" || st.Members[1].ID != "b" {
		t.Errorf("status %+v", st)
	}
	// A reload may not change the cluster section.
	cfg := labConfig([]int{1}, nil)
	if err := labs[0].App.Reload(cfg); err == nil || !strings.Contains(err.Error(), "cluster section changed") {
		t.Errorf("reload without the cluster section: %v", err)
	}
}
