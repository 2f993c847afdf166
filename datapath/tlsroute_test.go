package datapath

import (
	"net/netip"
	"testing"

	"weir/policy"
)

// tlsConfig: two tls services on vip4:443, a rule marking b's flows 0xb8
// (and a's 0x28); the SYN's classification puts every flow in a.
func tlsConfig(t *testing.T) *policy.Config {
	t.Helper()
	vip := netip.AddrFrom4([4]byte(vip4.To4()))
	tg := func(a string) []*policy.Target {
		return []*policy.Target{{Addr: netip.MustParseAddrPort(a), Weight: 1}}
	}
	a := &policy.VirtualServer{Name: "a", VIPs: []netip.Addr{vip}, Ports: policy.PortRange{Lo: 443, Hi: 443}, Proto: policy.ProtoTLS, SNI: []string{"a.example"}, Targets: tg("198.18.1.1:443")}
	b := &policy.VirtualServer{Name: "b", VIPs: []netip.Addr{vip}, Ports: policy.PortRange{Lo: 443, Hi: 443}, Proto: policy.ProtoTLS, SNIDefault: true, Targets: tg("198.18.1.2:443")}
	ea, eb := &policy.Action{Name: "ea", OutgoingTOS: 0x28, SetTOS: true}, &policy.Action{Name: "eb", OutgoingTOS: 0xb8, SetTOS: true}
	cfg, err := policy.Compile(&policy.Config{Services: []*policy.VirtualServer{a, b}, Actions: []*policy.Action{ea, eb},
		Rules: []*policy.Rule{{Name: "rb", Service: b, Action: eb}, {Name: "ra", Service: a, Action: ea}}})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestReroute: a flow the ClientHello routed to b is marked and metered as
// b's from then on, keeps its bound target, and stays in b across a config
// swap.
func TestReroute(t *testing.T) {
	cfg := tlsConfig(t)
	r := newRig(t, cfg, EngineOptions{})
	r.ingress(t, tcp4(t, client4, vip4, 40000, 443, 0, true, false, 0))
	client := netip.AddrPortFrom(netip.AddrFrom4([4]byte(client4.To4())), 40000)
	vip := netip.AddrPortFrom(netip.AddrFrom4([4]byte(vip4.To4())), 443)
	f := r.e.Flow(client, vip, ProtoTCP)
	if f == nil || f.Service.Name != "a" {
		t.Fatalf("SYN classified into %v, want a", f)
	}
	if got := tosOf(t, r.egress(t, tcp4(t, vip4, client4, 443, 40000, 0, true, true, 0))[0]); got != 0x28 {
		t.Fatalf("before: ToS %#x, want a's 0x28", got)
	}
	f.Bind(cfg.TargetIndex(cfg.Services[1].Targets[0]))
	b := cfg.ServiceByName("b")
	nf := r.e.Reroute(client, vip, b)
	if nf == nil || nf.Service != b || nf.Action.Name != "eb" || nf.Target() != f.Target() {
		t.Fatalf("rerouted: %+v", nf)
	}
	if got := tosOf(t, r.egress(t, tcp4(t, vip4, client4, 443, 40000, 0, false, true, 100))[0]); got != 0xb8 {
		t.Fatalf("after: ToS %#x, want b's 0xb8", got)
	}
	var tot MeterTotals
	r.e.Meters().Totals(&tot)
	if tot.Services[1][Egress].Packets != 1 || tot.Services[0][Egress].Packets != 1 {
		t.Errorf("egress packets a %d b %d, want 1 and 1", tot.Services[0][Egress].Packets, tot.Services[1][Egress].Packets)
	}
	if again := r.e.Reroute(client, vip, b); again != nf {
		t.Errorf("a second Reroute replaced the flow")
	}
	// A reload: the flow is decided again under the new config, in b.
	r.e.SetConfig(tlsConfig(t))
	if got := tosOf(t, r.egress(t, tcp4(t, vip4, client4, 443, 40000, 0, false, true, 100))[0]); got != 0xb8 {
		t.Fatalf("after a swap: ToS %#x, want b's 0xb8", got)
	}
	if f := r.e.Flow(client, vip, ProtoTCP); f == nil || f.Service.Name != "b" {
		t.Fatalf("after a swap the flow is in %v, want b", f.Service.Name)
	}
}
