package cluster

import (
	"context"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"weir/policy"
)

// samplesNode is an instance with one service of two targets, sampling
// every 200 ms, and an action "gold".
func samplesNode(t *testing.T, redisAddr, id string) (*Cluster, *policy.Config) {
	t.Helper()
	cfg, err := policy.Compile(&policy.Config{
		Monitor: policy.Monitor{Enabled: true, SamplingInterval: 200 * time.Millisecond},
		Actions: []*policy.Action{{Name: "gold"}},
		Services: []*policy.VirtualServer{{
			Name: "web", VIPs: []netip.Addr{netip.MustParseAddr("198.18.0.1")}, Ports: policy.PortRange{Lo: 80, Hi: 80},
			Targets: []*policy.Target{
				{Name: "t1", Addr: netip.MustParseAddrPort("198.18.1.1:80"), Weight: 1},
				{Name: "t2", Addr: netip.MustParseAddrPort("198.18.1.2:80"), Weight: 1},
			},
		}},
		Cluster: &policy.Cluster{Redis: redisAddr, Name: "test", Instance: id, LeaseInterval: interval},
	})
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(Options{Config: *cfg.Cluster, Admission: policy.NewAdmission(cfg, 0)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, cfg
}

func sample(cfg *policy.Config, segs, retrans uint64, conns int64) map[policy.TargetKey]*policy.TargetSample {
	out := map[policy.TargetKey]*policy.TargetSample{}
	for _, tg := range []string{"t1", "t2"} {
		s := &policy.TargetSample{Interval: 200 * time.Millisecond, ActiveConns: conns,
			FromTarget: policy.DirSample{DataSegments: segs, Retransmitted: retrans, Measured: true},
			Actions:    []policy.ActionSample{{Action: cfg.Actions[0], ActiveConns: conns, Bytes: 10}},
			Responses:  segs / 10, ServerErrors: retrans / 10, FailedRequests: 1}
		if tg == "t2" {
			s.FromTarget.Retransmitted = 0
		}
		policy.SelectDirection(&cfg.Monitor, s)
		out[policy.TargetKey{Service: "web", Target: tg}] = s
	}
	return out
}

// TestShareSamples: two instances publish different samples each
// interval; from the second epoch on both judge the same cluster-wide
// sums (segments, retransmissions, connections, per action, http
// responses and 5xx), the
// direction selected again, and a target one of them saw fail is down for
// the other.
func TestShareSamples(t *testing.T) {
	r := startRedis(t)
	a, cfgA := samplesNode(t, r.Addr(), "a")
	b, cfgB := samplesNode(t, r.Addr(), "b")
	ctx := context.Background()
	k1 := policy.TargetKey{Service: "web", Target: "t1"}
	k2 := policy.TargetKey{Service: "web", Target: "t2"}
	downUntil := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	// Start right after an epoch boundary of Redis's clock, so that both
	// publish in the same epoch however slow the machine is.
	var sa, sb Shared
	for i := range 4 {
		time.Sleep(time.Until(time.Now().Truncate(200 * time.Millisecond).Add(200*time.Millisecond + 20*time.Millisecond)))
		sa = a.ShareSamples(ctx, cfgA, sample(cfgA, 1000, 50, 3), nil)
		sb = b.ShareSamples(ctx, cfgB, sample(cfgB, 3000, 10, 5), map[policy.TargetKey]time.Time{k2: downUntil})
		if i == 0 && (sa.OK || sb.OK) {
			t.Logf("first epoch already shared: %+v %+v (a previous epoch of the same key)", sa, sb)
		}
	}
	if !sa.OK || !sb.OK || sa.Members != 2 || sb.Members != 2 {
		t.Fatalf("not shared: a %+v, b %+v", sa, sb)
	}
	s := sa.Samples[k1]
	if s.SegmentsSent != 4000 || s.Retransmits != 60 || s.ActiveConns != 8 || len(s.Actions) != 1 ||
		s.Actions[0].ActiveConns != 8 || s.Actions[0].Bytes != 20 || s.Actions[0].Action != cfgA.Actions[0] ||
		s.Responses != 400 || s.ServerErrors != 6 || s.FailedRequests != 2 {
		t.Errorf("a's sums for t1: %+v", s)
	}
	for _, k := range []policy.TargetKey{k1, k2} {
		x, y := *sa.Samples[k], *sb.Samples[k]
		x.Actions[0].Action, y.Actions[0].Action = nil, nil
		if !reflect.DeepEqual(x, y) {
			t.Errorf("%v: a judges %+v, b %+v", k, x, y)
		}
	}
	if u := sa.Down[k2]; !u.Equal(downUntil) {
		t.Errorf("a: t2 down until %v, want %v (b saw it fail)", u, downUntil)
	}
	if len(sb.Down) != 0 {
		t.Errorf("b: its own down-state came back: %v", sb.Down)
	}
	if st := a.Status(); st.SampleRounds != 4 || st.SampleMembers != 2 || st.SampleFallbacks != 0 {
		t.Errorf("status %+v", st)
	}
	r.Kill()
	sa = a.ShareSamples(ctx, cfgA, sample(cfgA, 1000, 50, 3), nil)
	if sa.OK || sa.Samples[k1].SegmentsSent != 1000 || a.Status().SampleFallbacks != 1 {
		t.Errorf("Redis gone: %+v, want the local samples", sa)
	}
}

// TestWireDirRoundTrip: every DirSample field crosses the wire, the IP-ID
// packets (which /status's signal reads) included.
func TestWireDirRoundTrip(t *testing.T) {
	d := policy.DirSample{DataSegments: 10, Retransmitted: 2, Timeouts: 1, OutOfOrder: 3, IPIDPackets: 12, Measured: true, Estimate: true, Partial: true}
	var got policy.DirSample
	addWire(&got, toWire(d))
	if got != d {
		t.Errorf("round trip %+v, want %+v", got, d)
	}
}
