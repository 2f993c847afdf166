package status

import (
	"net/netip"
	"strings"
	"testing"

	"weir/cmd/weir/api"
	"weir/policy"
)

// TestDirTotalsSignal: /status says which signal found the losses of the
// last interval that measured packets; a quiet interval keeps it.
func TestDirTotalsSignal(t *testing.T) {
	var d api.DirTotals
	for _, tc := range []struct {
		s    policy.DirSample
		want string
	}{
		{policy.DirSample{}, ""},
		{policy.DirSample{Measured: true, DataSegments: 10}, "sequence"},
		{policy.DirSample{Measured: true, DataSegments: 10, Retransmitted: 1, IPIDPackets: 12}, "sequence+ip_id"},
		{policy.DirSample{Measured: true}, "sequence+ip_id"},
		{policy.DirSample{Measured: true, DataSegments: 5}, "sequence"},
	} {
		addDirTotals(&d, tc.s)
		if d.Signal != tc.want {
			t.Errorf("after %+v: signal %q, want %q", tc.s, d.Signal, tc.want)
		}
	}
	if d.DataSegments != 25 || d.Retransmitted != 1 || d.Source != "measured" {
		t.Errorf("totals %+v", d)
	}
}

// TestTotalsPartial: a via: host leg the capture lost packets of is partial
// in /status, with the loss in its why, and the direction's why says the
// monitor read the other direction because of it.
func TestTotalsPartial(t *testing.T) {
	tg := &policy.Target{Name: "t", Addr: netip.MustParseAddrPort("198.18.3.1:80"), Weight: 1}
	cfg := &policy.Config{Services: []*policy.VirtualServer{{Name: "web", Targets: []*policy.Target{tg}}},
		Monitor: policy.Monitor{Enabled: true, Scope: policy.ScopeAll, Direction: policy.FromTarget}}
	k := policy.TargetKey{Service: "web", Target: "t"}
	ts := &policy.TargetSample{FromTarget: policy.DirSample{Partial: true, DataSegments: 1000, Retransmitted: 10},
		ToTarget: policy.DirSample{Measured: true, DataSegments: 100, Retransmitted: 5}}
	var tot Totals
	if _, ok := tot.Of(k); ok {
		t.Fatal("totals before the first sample")
	}
	tot.Add(cfg, map[policy.TargetKey]*policy.TargetSample{k: ts}, &api.HostCapture{State: "on", DroppedLastInterval: 7})
	sg, ok := tot.Of(k)
	if !ok {
		t.Fatal("no totals after a sample")
	}
	if sg.FromTarget.Source != "partial" || !strings.Contains(sg.FromTarget.Why, "lost 7 packets") {
		t.Errorf("from_target %+v: want partial, why naming the 7 lost packets", sg.FromTarget)
	}
	if sg.ToTarget.Source != "measured" || !strings.Contains(sg.ToTarget.Why, "host capture's count") {
		t.Errorf("to_target %+v: want measured by the host capture", sg.ToTarget)
	}
	if sg.Direction != "to_target" || !strings.Contains(sg.DirectionWhy, "partial") {
		t.Errorf("direction %q (%s): want to_target, from_target partial", sg.Direction, sg.DirectionWhy)
	}
	if sg.FromTarget.DataSegments != 1000 || sg.ToTarget.Retransmitted != 5 {
		t.Errorf("totals %+v", sg)
	}
}
