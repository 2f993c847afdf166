package config

import (
	"strings"
	"testing"
	"time"

	"weir/policy"
)

// TestParseUDPService: protocol udp with its udp keys, the defaults Compile
// fills, a rule covering it only by protocol 17, and the errors.
func TestParseUDPService(t *testing.T) {
	c, err := ParseYAML("t.yaml", []byte(`services:
- {name: dns, vips: [198.18.0.53, "fd00::53"], port: 53, protocol: udp, udp: {responses: 1, idleTimeout: 5s, responseTimeout: 1s, maxSessions: 100},
   targets: [{address: "198.18.1.1:53"}]}
- {name: quic, vips: [198.18.0.54], port: 443, protocol: udp, targets: [{address: "198.18.1.1:443"}]}
actions: [{name: ef, outgoingTOS: "10111000"}]
rules:
- {name: tcp, protocol: 6, sourcePorts: 53, action: ef}
- {name: udp, protocol: 17, sourcePorts: 53, action: ef}
`))
	if err != nil {
		t.Fatal(err)
	}
	dns, quic := c.ServiceByName("dns"), c.ServiceByName("quic")
	if dns.Proto != policy.ProtoUDP || dns.UDP != (policy.UDPOptions{IdleTimeout: 5 * time.Second, Responses: 1, ResponseTimeout: time.Second, MaxSessions: 100}) {
		t.Errorf("dns: %v %+v", dns.Proto, dns.UDP)
	}
	if quic.UDP != (policy.UDPOptions{IdleTimeout: policy.DefaultUDPIdleTimeout, ResponseTimeout: policy.DefaultUDPResponseTimeout, MaxSessions: policy.DefaultUDPMaxSessions}) {
		t.Errorf("quic defaults: %+v", quic.UDP)
	}
	if dns.Health == nil || dns.Health.Interval != 0 {
		t.Errorf("a udp service got a health check: %+v", dns.Health)
	}
	if c.Rules[0].Covers(dns) || !c.Rules[1].Covers(dns) {
		t.Error("rule coverage does not follow the udp service's protocol 17")
	}
	for _, tc := range []struct{ text, want string }{
		{"services:\n- {name: a, vips: [198.18.0.1], port: 53, protocol: udp, udp: {responses: -1}, targets: [{address: 198.18.1.1:53}]}\n", "responses"},
		{"services:\n- {name: a, vips: [198.18.0.1], port: 53, protocol: udp, udp: {maxSessions: 0}, targets: [{address: 198.18.1.1:53}]}\n", "maxSessions"},
		{"services:\n- {name: a, vips: [198.18.0.1], port: 53, protocol: udp, udp: {idleTimeout: 0s}, targets: [{address: 198.18.1.1:53}]}\n", "idleTimeout"},
		{"services:\n- {name: a, vips: [198.18.0.1], port: 53, protocol: udp, udp: {bogus: 1}, targets: [{address: 198.18.1.1:53}]}\n", "bogus"},
		{"services:\n- {name: a, vips: [198.18.0.1], port: 53, protocol: udp, healthCheck: {interval: 5s}, targets: [{address: 198.18.1.1:53}]}\n", "needs udp: {send, expect}"},
	} {
		_, err := ParseYAML("t.yaml", []byte(tc.text))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one naming %q", tc.text, err, tc.want)
		}
	}
}
