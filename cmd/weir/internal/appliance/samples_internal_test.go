package appliance

import (
	"testing"
	"time"

	"weir/netstack/proxy"
	"weir/policy"
)

// TestSamplesFromOpenTime: the forwarder's per-action open time reaches the
// policy sample MinRate judges (N7: bytes / the sum of each connection's
// time open in the interval).
func TestSamplesFromOpenTime(t *testing.T) {
	gold := &policy.Action{Name: "gold", MinRate: 50, MeanRate: 1000}
	cfg := &policy.Config{
		Services: []*policy.VirtualServer{{Name: "web", Targets: []*policy.Target{{Name: "t1", Weight: 1}}}},
		Actions:  []*policy.Action{gold},
	}
	t0 := time.Unix(1_000_000, 0)
	s := proxy.Sample{Start: t0, End: t0.Add(10 * time.Second),
		Targets:       []proxy.AggSample{{Service: "web", Name: "t1", Active: 1, Closed: 19, Bytes: 1000, OpenTime: 198 * time.Second}},
		TargetActions: []proxy.AggSample{{Service: "web", Name: "t1", Action: "gold", Active: 1, Closed: 19, Bytes: 1000, OpenTime: 198 * time.Second}},
	}
	ts := samplesFrom(cfg, s, nil, false)[policy.TargetKey{Service: "web", Target: "t1"}]
	if ts == nil || len(ts.Actions) != 1 || ts.Actions[0].OpenTime != 198*time.Second || ts.Actions[0].Bytes != 1000 {
		t.Fatalf("sample %+v, want gold's 1000 B over 198 s open", ts)
	}
}
