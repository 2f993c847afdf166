package config

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"weir/policy"
)

func TestParseProxyProtocol(t *testing.T) {
	text := `
services:
  - name: front
    vips: [198.18.0.1]
    port: 80
    acceptProxyProtocol: any
    trustedProxies: [198.18.9.0/24, "fd00:9::1"]
    targets:
      - {address: 198.18.1.1:80, proxyProtocol: v2}
      - {address: 198.18.1.2:80, proxyProtocol: v1}
      - {address: 198.18.1.3:80}
  - {name: plain, vips: [198.18.0.1], port: 81, targets: [{address: 198.18.1.1:80}]}
`
	c, err := noFiles.ParseYAML("t.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	vs := c.ServiceByName("front")
	want := []netip.Prefix{netip.MustParsePrefix("198.18.9.0/24"), netip.MustParsePrefix("fd00:9::1/128")}
	if vs.AcceptProxy != policy.ProxyAny || !slices.Equal(vs.TrustedProxies, want) {
		t.Errorf("front: accept %v from %v, want any from %v", vs.AcceptProxy, vs.TrustedProxies, want)
	}
	for i, w := range []policy.ProxyProtocol{policy.ProxyV2, policy.ProxyV1, policy.ProxyNone} {
		if got := vs.Targets[i].ProxyProtocol; got != w {
			t.Errorf("target %d: proxyProtocol %v, want %v", i, got, w)
		}
	}
	for _, a := range []string{"198.18.9.77", "::ffff:198.18.9.1", "fd00:9::1"} {
		if !vs.Trusted(netip.MustParseAddr(a)) {
			t.Errorf("%s not trusted", a)
		}
	}
	for _, a := range []string{"198.18.8.1", "fd00:9::2"} {
		if vs.Trusted(netip.MustParseAddr(a)) {
			t.Errorf("%s trusted", a)
		}
	}
	if p := c.ServiceByName("plain"); p.AcceptProxy != policy.ProxyNone || p.Trusted(netip.MustParseAddr("198.18.9.1")) {
		t.Errorf("plain accepts %v", p.AcceptProxy)
	}
}

func TestParseProxyProtocolErrors(t *testing.T) {
	svc := func(keys, target string) string {
		return "services:\n  - {name: a, vips: [198.18.0.1], port: 80, " + keys + "targets: [{address: 198.18.1.1:80" + target + "}]}\n"
	}
	for _, tt := range []struct{ name, text, want string }{
		{"no trusted", svc("acceptProxyProtocol: v2, ", ""), `virtual server "a": acceptProxyProtocol v2 needs trustedProxies`},
		{"trusted alone", svc("trustedProxies: [198.18.9.1], ", ""), `virtual server "a": trustedProxies without acceptProxyProtocol`},
		{"bad version", svc("acceptProxyProtocol: v3, trustedProxies: [198.18.9.1], ", ""), `want v1, v2 or any, got "v3"`},
		{"bad prefix", svc("acceptProxyProtocol: v1, trustedProxies: [198.18.9.1/33], ", ""), "trustedProxies"},
		{"host bits", svc("acceptProxyProtocol: v1, trustedProxies: [198.18.9.1/24], ", ""), "host bits set"},
		{"any on a target", svc("", ", proxyProtocol: any"), `want v1 or v2, got "any"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := noFiles.ParseYAML("t.yaml", []byte(tt.text))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want %q", err, tt.want)
			}
		})
	}
}
