package config

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"
	"time"

	"weir/policy"
)

// udpSvc is a config of one udp service (dns, port 53) whose healthCheck
// mapping holds hc, after the balancer line bal.
func udpSvc(bal, hc string) string {
	return bal + "services:\n  - {name: dns, vips: [198.18.0.53], port: 53, protocol: udp, targets: [{address: 198.18.1.1:5353}], healthCheck: {" + hc + "}}\n"
}

// TestParseUDPHealth: the udp probe's forms (dns with its defaults, type
// and rcode; text; hex; expect text, hex, regexp), the interval taken from
// the balancer's check, and a udp service without a check of its own
// getting none while the balancer checks the tcp services.
func TestParseUDPHealth(t *testing.T) {
	for _, tc := range []struct {
		name, hc string
		want     policy.UDPCheck
	}{
		{"dns", `interval: 2s, udp: {send: {dns: who.test}}`, policy.UDPCheck{DNS: &policy.DNSCheck{Name: "who.test", Type: 1}}},
		{"dns root trailing dot kept", `interval: 2s, udp: {send: {dns: .}}`, policy.UDPCheck{DNS: &policy.DNSCheck{Name: ".", Type: 1}}},
		{"dns type and rcode", `interval: 2s, udp: {send: {dns: "who.test.", type: aaaa}, expect: {rcode: NXDOMAIN}}`,
			policy.UDPCheck{DNS: &policy.DNSCheck{Name: "who.test", Type: 28, RCode: 3}}},
		{"dns any rcode", `interval: 2s, udp: {send: {dns: _sip._udp.example.com, type: 33}, expect: {rcode: any}}`,
			policy.UDPCheck{DNS: &policy.DNSCheck{Name: "_sip._udp.example.com", Type: 33, RCode: policy.AnyRCode}}},
		{"text", `interval: 2s, udp: {send: "PING\n", expect: "PONG"}`, policy.UDPCheck{Send: []byte("PING\n"), Expect: []byte("PONG")}},
		{"hex", `interval: 2s, udp: {send: {hex: "de ad:BE-ef 00"}, expect: {hex: dead}}`,
			policy.UDPCheck{Send: []byte{0xde, 0xad, 0xbe, 0xef, 0}, Expect: []byte{0xde, 0xad}}},
		{"any reply", `interval: 2s, udp: {send: {hex: "00"}}`, policy.UDPCheck{Send: []byte{0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseYAML("t.yaml", []byte(udpSvc("", tc.hc)))
			if err != nil {
				t.Fatal(err)
			}
			h := c.ServiceByName("dns").Health
			if h.Interval != 2*time.Second || h.Timeout != time.Second || h.Rise != policy.DefaultHealthRise || h.Fall != policy.DefaultHealthFall {
				t.Errorf("settings %+v", h)
			}
			got := h.UDP
			if got == nil {
				t.Fatal("no udp probe")
			}
			if !bytes.Equal(got.Send, tc.want.Send) || !bytes.Equal(got.Expect, tc.want.Expect) || (got.DNS == nil) != (tc.want.DNS == nil) ||
				got.DNS != nil && *got.DNS != *tc.want.DNS {
				t.Errorf("udp probe %+v (dns %+v), want %+v (dns %+v)", got, got.DNS, tc.want, tc.want.DNS)
			}
		})
	}

	_, err := ParseYAML("t.yaml", []byte(udpSvc("balancer: {healthCheck: {interval: 3s, timeout: 700ms, rise: 1, fall: 1}}\n",
		`udp: {send: {dns: who.test}, expect: {regexp: "x"}}`)))
	if err == nil || !strings.Contains(err.Error(), "expect takes only {rcode") {
		t.Errorf("dns with a regexp: %v", err)
	}
	c, err := ParseYAML("t.yaml", []byte(udpSvc("balancer: {healthCheck: {interval: 3s, timeout: 700ms, rise: 1, fall: 4}}\n",
		`rise: 2, udp: {send: {dns: who.test}}`)))
	if err != nil {
		t.Fatal(err)
	}
	if h := c.ServiceByName("dns").Health; h.Interval != 3*time.Second || h.Timeout != 700*time.Millisecond || h.Rise != 2 || h.Fall != 4 || h.UDP == nil {
		t.Errorf("inherited settings: %+v", h)
	}

	c, err = ParseYAML("t.yaml", []byte(`balancer: {healthCheck: {interval: 2s}}
services:
  - {name: dns, vips: [198.18.0.53], port: 53, protocol: udp, targets: [{address: 198.18.1.1:5353}]}
  - {name: web, vips: [198.18.0.80], port: 80, targets: [{address: 198.18.1.1:80}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	if h := c.ServiceByName("dns").Health; h.Interval != 0 || h.UDP != nil {
		t.Errorf("a udp service without a check of its own got %+v", h)
	}
	if h := c.ServiceByName("web").Health; h.Interval != 2*time.Second {
		t.Errorf("the tcp service lost the balancer's check: %+v", h)
	}
}

// TestParseUDPHealthErrors: each mistake named at its key or value.
func TestParseUDPHealthErrors(t *testing.T) {
	tcpSvc := func(hc string) string {
		return "services:\n  - {name: web, vips: [198.18.0.80], port: 80, targets: [{address: 198.18.1.1:80}], healthCheck: {" + hc + "}}\n"
	}
	for _, tc := range []struct{ name, text, want string }{
		{"udp on a tcp service", tcpSvc(`interval: 2s, udp: {send: {dns: who.test}}`), "t.yaml:2:113: udp: a udp health check needs protocol udp, not tcp"},
		{"udp in the balancer", "balancer: {healthCheck: {interval: 2s, udp: {send: x}}}\n", "t.yaml:1:40: udp: a udp probe belongs in a udp service's own healthCheck"},
		{"http on a udp service", udpSvc("", `interval: 2s, http: {path: /}`), "http: a udp service's health check is udp: {send, expect} (http speaks TCP)"},
		{"send on a udp service", udpSvc("", `interval: 2s, send: "x"`), "send: a udp service's health check is udp: {send, expect} (send speaks TCP)"},
		{"udp and send", udpSvc("", `interval: 2s, send: "x", udp: {send: x}`), "send: a udp service's health check is udp"},
		{"no probe on a udp service", udpSvc("", `interval: 2s`), "t.yaml:2:102: healthCheck: a udp service's health check needs udp: {send, expect}"},
		{"odd hex", udpSvc("", `interval: 2s, udp: {send: {hex: "abc"}}`), `hex: hex "abc": an odd number of digits (two per byte)`},
		{"lone hex digit", udpSvc("", `interval: 2s, udp: {send: {hex: "a bc"}}`), `hex: hex "a bc": a lone digit before offset 1`},
		{"not hex", udpSvc("", `interval: 2s, udp: {send: {hex: "0x01"}}`), `hex: hex "0x01": 'x' at offset 1 is not a hex digit`},
		{"empty hex", udpSvc("", `interval: 2s, udp: {send: {hex: " "}}`), `hex " ": no bytes`},
		{"empty text", udpSvc("", `interval: 2s, udp: {send: ""}`), `send: must not be empty`},
		{"no send", udpSvc("", `interval: 2s, udp: {expect: x}`), `udp: missing "send"`},
		{"empty send mapping", udpSvc("", `interval: 2s, udp: {send: {}}`), `send: want text, {hex: BYTES} or {dns: NAME}`},
		{"hex and dns", udpSvc("", `interval: 2s, udp: {send: {hex: "00", dns: who.test}}`), `send: hex or dns, not both`},
		{"type without dns", udpSvc("", `interval: 2s, udp: {send: {type: A}}`), `send: type needs dns: NAME`},
		{"bad type", udpSvc("", `interval: 2s, udp: {send: {dns: who.test, type: AXFR2}}`), `type: dns type "AXFR2": want A, AAAA`},
		{"long label", udpSvc("", `interval: 2s, udp: {send: {dns: `+strings.Repeat("a", 64)+`.test}}`), `must be 1..63 bytes`},
		{"empty label", udpSvc("", `interval: 2s, udp: {send: {dns: "a..test"}}`), `label "" must be 1..63 bytes`},
		{"space in name", udpSvc("", `interval: 2s, udp: {send: {dns: "a b.test"}}`), `' ' is not a letter, digit`},
		{"rcode without dns", udpSvc("", `interval: 2s, udp: {send: x, expect: {rcode: NOERROR}}`), `rcode: needs send {dns: NAME}`},
		{"bad rcode", udpSvc("", `interval: 2s, udp: {send: {dns: who.test}, expect: {rcode: 16}}`), `rcode "16": want NOERROR`},
		{"dns with expect text", udpSvc("", `interval: 2s, udp: {send: {dns: who.test}, expect: "x"}`), `expect: send dns judges the reply by its ID, QR bit and rcode`},
		{"two expects", udpSvc("", `interval: 2s, udp: {send: x, expect: {hex: "00", regexp: "a"}}`), `expect: one of text, hex, regexp or rcode`},
		{"unknown key", udpSvc("", `interval: 2s, udp: {send: x, expcet: y}`), `unknown key "expcet" in udp (did you mean "expect"?)`},
		{"unknown send key", udpSvc("", `interval: 2s, udp: {send: {dnss: who.test}}`), `unknown key "dnss" in send (did you mean "dns"?)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := noFiles.ParseYAML("t.yaml", []byte(tc.text))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error\n got: %v\nwant: %s", err, tc.want)
			}
		})
	}
}

// TestCompileUDPHealthErrors: configs built in code get the same checks
// from Compile.
func TestCompileUDPHealthErrors(t *testing.T) {
	dns := &policy.UDPCheck{DNS: &policy.DNSCheck{Name: "who.test"}}
	svc := func(proto policy.ServiceProto, h *policy.HealthCheck) *policy.Config {
		return &policy.Config{Services: []*policy.VirtualServer{{Name: "s", Proto: proto,
			VIPs: []netip.Addr{netip.MustParseAddr("198.18.0.1")}, Ports: policy.PortRange{Lo: 53, Hi: 53}, Health: h,
			Targets: []*policy.Target{{Name: "a", Addr: netip.MustParseAddrPort("198.18.1.1:53"), Weight: 1}}}}}
	}
	for _, tc := range []struct {
		name string
		c    *policy.Config
		want string
	}{
		{"balancer", &policy.Config{Balancer: policy.BalancerSettings{Health: policy.HealthCheck{Interval: time.Second, UDP: dns}}}, "a udp probe belongs in a udp service's own healthCheck"},
		{"tcp service", svc(policy.ProtoTCP, &policy.HealthCheck{Interval: time.Second, UDP: dns}), `virtual server "s": a udp health check needs protocol udp, not tcp`},
		{"udp service without the probe", svc(policy.ProtoUDP, &policy.HealthCheck{Interval: time.Second}), `a udp service's healthCheck needs the udp probe`},
		{"udp and send", svc(policy.ProtoUDP, &policy.HealthCheck{Interval: time.Second, Send: "x", UDP: dns}), "udp and http or send/expect both set"},
		{"empty send", svc(policy.ProtoUDP, &policy.HealthCheck{Interval: time.Second, UDP: &policy.UDPCheck{}}), "udp send is 0 bytes, want 1..65507"},
		{"dns and bytes", svc(policy.ProtoUDP, &policy.HealthCheck{Interval: time.Second, UDP: &policy.UDPCheck{Send: []byte{1}, DNS: &policy.DNSCheck{Name: "x"}}}), "udp send is bytes and dns both"},
		{"dns and expect", svc(policy.ProtoUDP, &policy.HealthCheck{Interval: time.Second, UDP: &policy.UDPCheck{Expect: []byte{1}, DNS: &policy.DNSCheck{Name: "x"}}}), "not by expect bytes"},
		{"dns name", svc(policy.ProtoUDP, &policy.HealthCheck{Interval: time.Second, UDP: &policy.UDPCheck{DNS: &policy.DNSCheck{}}}), "dns name is empty"},
		{"rcode", svc(policy.ProtoUDP, &policy.HealthCheck{Interval: time.Second, UDP: &policy.UDPCheck{DNS: &policy.DNSCheck{Name: "x", RCode: 16}}}), "rcode 16 is not 0..15"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := policy.Compile(tc.c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Compile = %v, want %q", err, tc.want)
			}
		})
	}
	c, err := policy.Compile(svc(policy.ProtoUDP, &policy.HealthCheck{Interval: time.Second, UDP: &policy.UDPCheck{DNS: &policy.DNSCheck{Name: "who.test."}}}))
	if err != nil {
		t.Fatal(err)
	}
	if d := c.Services[0].Health.UDP.DNS; *d != (policy.DNSCheck{Name: "who.test", Type: 1}) {
		t.Errorf("compiled dns %+v", d)
	}
}
