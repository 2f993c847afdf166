package appliance

import (
	"net/netip"
	"testing"
	"time"

	"weir/netstack/proxy"
	"weir/policy"
)

// TestCaptureLossMakesPartial: a host leg counted by the host capture is
// measured; in an interval in which the capture lost packets it is
// partial, not measured, so the monitor reads the other direction where
// that one is measured (status.TestTotalsPartial: /status says partial and
// why).
func TestCaptureLossMakesPartial(t *testing.T) {
	tg := &policy.Target{Name: "t", Addr: netip.MustParseAddrPort("198.18.3.1:80"), Weight: 1}
	cfg := &policy.Config{Services: []*policy.VirtualServer{{Name: "web", Targets: []*policy.Target{tg}}},
		Monitor: policy.Monitor{Enabled: true, Scope: policy.ScopeAll}}
	now := time.Now()
	s := proxy.Sample{Start: now, End: now.Add(time.Second), Targets: []proxy.AggSample{{Service: "web", Name: "t",
		FromTarget: proxy.DirCounters{DataSegments: 1000, Retransmitted: 10, Source: proxy.DirCapture},
		ToTarget:   proxy.DirCounters{DataSegments: 100, Retransmitted: 5, Source: proxy.DirKernel}}}}
	k := policy.TargetKey{Service: "web", Target: "t"}

	ts := samplesFrom(cfg, s, nil, false)[k]
	if !ts.FromTarget.Measured || ts.FromTarget.Partial || ts.SegmentsSent != 1000 {
		t.Fatalf("no capture loss: %+v, read %d segments; want from_target measured and read", ts.FromTarget, ts.SegmentsSent)
	}
	ts = samplesFrom(cfg, s, nil, true)[k]
	if ts.FromTarget.Measured || !ts.FromTarget.Partial {
		t.Fatalf("capture loss: from_target %+v; want partial, not measured", ts.FromTarget)
	}
	if ts.SegmentsSent != 100 || ts.Retransmits != 5 {
		t.Errorf("capture loss: the monitor read %d/%d; want to_target's 5/100", ts.Retransmits, ts.SegmentsSent)
	}
}
