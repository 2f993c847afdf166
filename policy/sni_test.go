package policy

import (
	"net/netip"
	"strings"
	"testing"
)

func tlsService(name string, port uint16, def bool, sni ...string) *VirtualServer {
	return &VirtualServer{Name: name, VIPs: []netip.Addr{netip.MustParseAddr("198.18.0.10"), netip.MustParseAddr("fd00::10")},
		Ports: PortRange{port, port}, Proto: ProtoTLS, SNI: sni, SNIDefault: def,
		Targets: []*Target{{Addr: netip.MustParseAddrPort("198.18.1.1:443"), Weight: 1}}}
}

func TestRouteSNI(t *testing.T) {
	c := &Config{Services: []*VirtualServer{
		tlsService("a", 443, false, "A.example.com."),
		tlsService("wild", 443, false, "*.example.com"),
		tlsService("def", 443, true),
		tlsService("other-port", 8443, false, "a.example.com"),
	}}
	if _, err := Compile(c); err != nil {
		t.Fatal(err)
	}
	for _, vip := range []string{"198.18.0.10", "fd00::10", "::ffff:198.18.0.10"} {
		a := netip.MustParseAddr(vip)
		for name, want := range map[string]string{
			"a.example.com":   "a",
			"b.example.com":   "wild",
			"example.com":     "def",
			"x.b.example.com": "def",
			"":                "def",
			"other.org":       "def",
		} {
			if got := c.RouteSNI(a, 443, name); got == nil || got.Name != want {
				t.Errorf("%s:443 %q: %v, want %s", vip, name, got, want)
			}
		}
		if got := c.RouteSNI(a, 8443, "b.example.com"); got != nil {
			t.Errorf("8443 without a default: %v, want none", got.Name)
		}
		if got := c.RouteSNI(a, 8443, "a.example.com"); got == nil || got.Name != "other-port" {
			t.Errorf("8443 a.example.com: %v", got)
		}
	}
	if got := c.Service(netip.MustParseAddr("198.18.0.10"), 443, IPProtoTCP); got == nil || got.Proto != ProtoTLS {
		t.Errorf("Service on a tls port: %v", got)
	}
	if n := testing.AllocsPerRun(100, func() { c.RouteSNI(netip.MustParseAddr("198.18.0.10"), 443, "b.example.com") }); n != 0 {
		t.Errorf("RouteSNI allocates %v", n)
	}
}

func TestSNIConfigErrors(t *testing.T) {
	tcp := tlsService("plain", 443, false)
	tcp.Proto = ProtoTCP
	for _, tc := range []struct {
		name     string
		services []*VirtualServer
		want     string
	}{
		{"same name", []*VirtualServer{tlsService("a", 443, false, "x.example"), tlsService("b", 443, false, "X.Example.")}, `sni "x.example" claimed by both "a" and "b"`},
		{"same wildcard", []*VirtualServer{tlsService("a", 443, false, "*.example"), tlsService("b", 443, false, "*.example")}, `claimed by both`},
		{"two defaults", []*VirtualServer{tlsService("a", 443, true), tlsService("b", 443, true)}, `both sni default`},
		{"tcp and tls", []*VirtualServer{tcp, tlsService("b", 443, false, "x.example")}, `only tls services may share a port`},
		{"no names", []*VirtualServer{tlsService("a", 443, false)}, `needs sni`},
		{"bad name", []*VirtualServer{tlsService("a", 443, false, "a b")}, `not a host name`},
		{"wildcard in the middle", []*VirtualServer{tlsService("a", 443, false, "a.*.example")}, `not a host name`},
		{"twice in one", []*VirtualServer{tlsService("a", 443, false, "x.example", "x.example.")}, `given twice`},
		{"sni on tcp", []*VirtualServer{func() *VirtualServer { v := tlsService("a", 443, false, "x.example"); v.Proto = ProtoTCP; return v }()}, `sni needs protocol tls`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Compile(&Config{Services: tc.services})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v, want %q", err, tc.want)
			}
		})
	}
	// Disjoint names and one default on a shared port are fine; the same
	// names on another port too.
	ok := []*VirtualServer{tlsService("a", 443, false, "x.example"), tlsService("b", 443, true, "*.example"), tlsService("c", 444, true, "x.example")}
	if _, err := Compile(&Config{Services: ok}); err != nil {
		t.Fatal(err)
	}
}
