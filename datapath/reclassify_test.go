package datapath

import (
	"net/netip"
	"testing"

	"weir/policy"
)

// TestEngineReclassify: a connection from an outer load balancer
// (198.18.0.2) on behalf of a client its PROXY-protocol header named is
// decided again for that client: the rule on the client's prefix gives
// the flow its action, and the packets toward the load balancer its ToS;
// the flow keeps its key and target binding; reclassifying for the same
// client again changes nothing, for a client no rule matches the action
// goes.
func TestEngineReclassify(t *testing.T) {
	vip := netip.MustParseAddr("198.18.0.1")
	premium := &policy.Action{Name: "premium", OutgoingTOS: 0xa0, SetTOS: true}
	www := &policy.VirtualServer{Name: "www", VIPs: []netip.Addr{vip}, Ports: policy.PortRange{Lo: 80, Hi: 80},
		Targets: []*policy.Target{{Addr: netip.MustParseAddrPort("198.18.1.1:8080")}}}
	cfg, err := policy.Compile(&policy.Config{Services: []*policy.VirtualServer{www}, Actions: []*policy.Action{premium},
		Rules: []*policy.Rule{{Name: "real", Dst: netip.MustParsePrefix("198.19.5.0/24"), Action: premium}}})
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, cfg, EngineOptions{})
	r.connect(t, client4, vip4, 40000, 80)
	lb, server := netip.MustParseAddrPort("198.18.0.2:40000"), netip.MustParseAddrPort("198.18.0.1:80")
	f := r.e.Flow(lb, server, ProtoTCP)
	if f == nil || f.Action != nil {
		t.Fatalf("the load balancer's flow: %+v, want one with no action", f)
	}
	if got := tosOf(t, r.egress(t, tcp4(t, vip4, client4, 80, 40000, 0, false, true, 10))[0]); got != 0 {
		t.Fatalf("ToS before = %#x, want none", got)
	}
	id := r.e.Meters().TargetID(0, 0)
	f.Bind(id)

	nf := r.e.Reclassify(lb, server, ProtoTCP, netip.MustParseAddrPort("198.19.5.7:1234"))
	if nf == nil || nf.Action != premium || nf.Key != f.Key || nf.Target() != id || nf.HalfOpen() {
		t.Fatalf("reclassified: %+v (target %d), want premium, the same key, target %d, confirmed", nf, nf.Target(), id)
	}
	if got := r.e.Flow(lb, server, ProtoTCP); got != nf {
		t.Fatalf("the table holds %p, not the reclassified flow %p", got, nf)
	}
	if got := tosOf(t, r.egress(t, tcp4(t, vip4, client4, 80, 40000, 0, false, true, 10))[0]); got != 0xa0 {
		t.Errorf("ToS after = %#x, want the real client's action's 0xa0", got)
	}
	// A config swap decides the flow again for the real client, not by
	// its key's (the load balancer's) address.
	gold := &policy.Action{Name: "premium", OutgoingTOS: 0x88, SetTOS: true}
	next, err := policy.Compile(&policy.Config{Services: []*policy.VirtualServer{{Name: "www", VIPs: []netip.Addr{vip}, Ports: policy.PortRange{Lo: 80, Hi: 80},
		Targets: []*policy.Target{{Addr: netip.MustParseAddrPort("198.18.1.1:8080")}}}},
		Actions: []*policy.Action{gold},
		Rules:   []*policy.Rule{{Name: "real", Dst: netip.MustParsePrefix("198.19.5.0/24"), Action: gold}}})
	if err != nil {
		t.Fatal(err)
	}
	r.e.SetConfig(next)
	if got := tosOf(t, r.egress(t, tcp4(t, vip4, client4, 80, 40000, 0, false, true, 10))[0]); got != 0x88 {
		t.Errorf("ToS after a config swap = %#x, want the new config's action for the real client, 0x88", got)
	}
	if nf = r.e.Flow(lb, server, ProtoTCP); nf == nil || nf.Action != next.Actions[0] || nf.Gen != 1 {
		t.Fatalf("after the swap: %+v", nf)
	}
	replaced := r.e.Flows().Stats().Replaced
	if again := r.e.Reclassify(lb, server, ProtoTCP, netip.MustParseAddrPort("198.19.5.7:1234")); again != nf || r.e.Flows().Stats().Replaced != replaced {
		t.Errorf("reclassifying for the same client replaced the flow")
	}
	if other := r.e.Reclassify(lb, server, ProtoTCP, netip.MustParseAddrPort("198.19.6.7:1234")); other == nil || other.Action != nil || other.Target() != id {
		t.Errorf("for a client no rule matches: %+v, want no action, the binding kept", other)
	}
	if r.e.Reclassify(netip.MustParseAddrPort("198.18.0.9:1"), server, ProtoTCP, netip.MustParseAddrPort("198.19.5.7:1234")) != nil {
		t.Errorf("a flow that does not exist was reclassified")
	}
}
