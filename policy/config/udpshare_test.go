package config

import (
	"strings"
	"testing"

	"weir/policy"
)

// TestParseTCPAndUDPShareAPort: the file may give a VIP and port to a tcp
// and a udp service (DNS on 53 over both, iperf3 -u's control connection
// and datagrams), as policy.Compile allows; two services of one IP
// protocol on one VIP and port stay an error, with both positions.
func TestParseTCPAndUDPShareAPort(t *testing.T) {
	c, err := ParseYAML("t.yaml", []byte(`services:
- {name: dns-tcp, vips: [198.18.0.53], port: 53, protocol: tcp, targets: [{address: "198.18.1.1:53"}]}
- {name: dns-udp, vips: [198.18.0.53], port: 53, protocol: udp, targets: [{address: "198.18.1.1:53"}]}
`))
	if err != nil {
		t.Fatalf("a tcp and a udp service on one VIP and port: %v", err)
	}
	vip := c.ServiceByName("dns-tcp").VIPs[0]
	if vs := c.Service(vip, 53, policy.IPProtoUDP); vs == nil || vs.Name != "dns-udp" {
		t.Errorf("UDP lookup found %v", vs)
	}
	for _, text := range []string{
		"services:\n- {name: a, vips: [198.18.0.1], port: 53, protocol: udp, targets: [{address: 198.18.1.1:53}]}\n- {name: b, vips: [198.18.0.1], port: 53, protocol: udp, targets: [{address: 198.18.1.1:53}]}\n",
		"services:\n- {name: a, vips: [198.18.0.1], port: 53, protocol: tcp, targets: [{address: 198.18.1.1:53}]}\n- {name: b, vips: [198.18.0.1], port: 53, protocol: http, targets: [{address: 198.18.1.1:53}]}\n",
	} {
		if _, err := ParseYAML("t.yaml", []byte(text)); err == nil || !strings.Contains(err.Error(), `t.yaml:3:20: 198.18.0.1 port 53 already claimed by service "a" at t.yaml:2:20`) {
			t.Errorf("%q: %v", text, err)
		}
	}
}
