package config

import (
	"net/netip"
	"strings"
	"testing"

	"weir/policy"
)

// TestParseSNI: tls services sharing VIP:443, each with its names, one the
// default (as a list element and as the scalar), route by server name; the
// errors a user meets say what is wrong.
func TestParseSNI(t *testing.T) {
	const text = `services:
- {name: a, vips: [198.18.0.10, "fd00::10"], port: 443, protocol: tls, sni: [A.Example.com, "*.a.example.com"], targets: [{address: 198.18.1.1:443}]}
- {name: b, vips: [198.18.0.10, "fd00::10"], port: 443, protocol: tls, sni: [b.example.com, default], targets: [{address: 198.18.1.2:443}]}
- {name: c, vips: [198.18.0.11], port: 443, protocol: tls, sni: default, targets: [{address: 198.18.1.3:443}]}
`
	cfg, err := noFiles.ParseYAML("t.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	a, b := cfg.ServiceByName("a"), cfg.ServiceByName("b")
	if a.Proto != policy.ProtoTLS || strings.Join(a.SNI, ",") != "a.example.com,*.a.example.com" || a.SNIDefault || !b.SNIDefault || !cfg.ServiceByName("c").SNIDefault {
		t.Fatalf("a %v %v %v, b %v %v", a.Proto, a.SNI, a.SNIDefault, b.SNI, b.SNIDefault)
	}
	for name, want := range map[string]string{"a.example.com": "a", "x.a.example.com": "a", "b.example.com": "b", "": "b", "z.org": "b"} {
		if got := cfg.RouteSNI(netip.MustParseAddr("fd00::10"), 443, name); got == nil || got.Name != want {
			t.Errorf("%q: %v, want %s", name, got, want)
		}
	}
	for _, tt := range []struct{ name, text, want string }{
		{"overlapping names", `services:
- {name: a, vips: [198.18.0.10], port: 443, protocol: tls, sni: [x.example.com], targets: [{address: 198.18.1.1:443}]}
- {name: b, vips: [198.18.0.10], port: 443, protocol: tls, sni: [X.example.com.], targets: [{address: 198.18.1.2:443}]}
`, `sni "x.example.com" claimed by both "a" and "b"`},
		{"two defaults", `services:
- {name: a, vips: [198.18.0.10], port: 443, protocol: tls, sni: default, targets: [{address: 198.18.1.1:443}]}
- {name: b, vips: [198.18.0.10], port: 443, protocol: tls, sni: [default], targets: [{address: 198.18.1.2:443}]}
`, `tls services "a" and "b" are both sni default`},
		{"tcp beside tls", `services:
- {name: a, vips: [198.18.0.10], port: 443, targets: [{address: 198.18.1.1:443}]}
- {name: b, vips: [198.18.0.10], port: 443, protocol: tls, sni: default, targets: [{address: 198.18.1.2:443}]}
`, `t.yaml:3:20: 198.18.0.10 port 443 already claimed by service "a" at t.yaml:2:20 (only tls services share a port, routed by sni)`},
		{"tls without sni", `services:
- {name: a, vips: [198.18.0.10], port: 443, protocol: tls, targets: [{address: 198.18.1.1:443}]}
`, `protocol tls needs sni`},
		{"sni on http", `services:
- {name: a, vips: [198.18.0.10], port: 443, protocol: http, sni: [a.example], targets: [{address: 198.18.1.1:443}]}
`, `sni needs protocol tls`},
		{"empty sni", `services:
- {name: a, vips: [198.18.0.10], port: 443, protocol: tls, sni: [], targets: [{address: 198.18.1.1:443}]}
`, `sni: want server names or default`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := noFiles.ParseYAML("t.yaml", []byte(tt.text))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("%v, want %q", err, tt.want)
			}
		})
	}
}
