package config

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"weir/policy"
)

// noFiles is a Parser that reads nothing from disk.
var noFiles = Parser{ReadFile: func(name string) ([]byte, error) {
	return nil, errors.New("no such file")
}}

func TestParseYAMLGood(t *testing.T) {
	tests := []struct {
		name  string
		text  string
		check func(t *testing.T, c *policy.Config)
	}{
		{"empty file", "", func(t *testing.T, c *policy.Config) {
			if c.Instance.Name != "weir" || c.Instance.MetricInterval != 30*time.Second || len(c.Services) != 0 {
				t.Errorf("defaults not applied: %+v", c.Instance)
			}
		}},
		{"http options and their defaults", `
services:
  - name: web
    vips: [198.19.0.80]
    port: 80
    protocol: http
    http: {headerTimeout: 3s, maxHeaderBytes: 8KiB, maxClients: 500, forwarded: both}
    targets: [{address: 127.0.0.1:8080}]
  - name: plain
    vips: [198.19.0.81]
    port: 80
    protocol: http
    targets: [{address: 127.0.0.1:8080}]
`, func(t *testing.T, c *policy.Config) {
			got := c.Services[0].HTTP
			want := policy.HTTPOptions{HeaderTimeout: 3 * time.Second, MaxHeaderBytes: 8 << 10, KeepAliveIdle: policy.DefaultKeepAliveIdle,
				MaxClients: 500, BackendIdle: policy.DefaultBackendIdle, MaxIdlePerTarget: policy.DefaultMaxIdlePerTarget, Forwarded: policy.ForwardBoth}
			if got != want {
				t.Errorf("http %+v, want %+v", got, want)
			}
			def := policy.HTTPOptions{HeaderTimeout: policy.DefaultHeaderTimeout, MaxHeaderBytes: policy.DefaultMaxHeaderBytes, KeepAliveIdle: policy.DefaultKeepAliveIdle,
				MaxClients: policy.DefaultMaxClients, BackendIdle: policy.DefaultBackendIdle, MaxIdlePerTarget: policy.DefaultMaxIdlePerTarget}
			if c.Services[1].HTTP != def {
				t.Errorf("http defaults %+v, want %+v", c.Services[1].HTTP, def)
			}
		}},
		{"timeouts: instance defaults, a service's override, off", `
instance:
  timeouts: {connect: 1s, firstByte: off, idle: 10m, handshake: 2s, requestRead: 1s, inFlightPerVIP: 32}
services:
  - name: web
    vips: [198.19.0.80]
    port: 80
    timeouts: {firstByte: 10s, inFlightPerVIP: 64}
    targets: [{address: 127.0.0.1:8080}]
`, func(t *testing.T, c *policy.Config) {
			in := policy.Timeouts{Handshake: 2 * time.Second, Connect: time.Second, FirstByte: -1, Idle: 10 * time.Minute, RequestRead: time.Second, InFlightPerVIP: 32}
			if c.Instance.Timeouts != in {
				t.Errorf("instance timeouts %+v, want %+v", c.Instance.Timeouts, in)
			}
			vs := in
			vs.FirstByte, vs.InFlightPerVIP = 10*time.Second, 64
			if got := c.Services[0].Timeouts; got != vs {
				t.Errorf("service timeouts %+v, want %+v", got, vs)
			}
		}},
		{"instance limits and intervals", `
instance:
  name: edge
  metricInterval: 1m
  recomputeInterval: 200ms
  limits: {maxBandwidth: 2MiB, enforceBandwidth: true, maxConnections: 10, burstBytes: 1kB}
`, func(t *testing.T, c *policy.Config) {
			in := c.Instance
			want := policy.Limits{MaxBandwidth: 2 << 20, EnforceBandwidth: true, MaxConnections: 10, BurstBytes: 1000}
			if in.Name != "edge" || in.MetricInterval != time.Minute || in.RecomputeInterval != 200*time.Millisecond || in.Limits != want {
				t.Errorf("instance = %+v", in)
			}
		}},
		{"queue and per-client limits", `
instance:
  clientLimits: {maxConnections: 50, enforceConnections: true, clientPrefix: {ipv4: 24, ipv6: 64}, tableSize: 1000}
services:
  - name: web
    vips: [198.18.0.10]
    port: 80
    limits: {maxConnections: 2, enforceConnections: true, queue: 8, queueTimeout: 3s}
    clientLimits: {maxConnections: 2, enforceConnections: true, maxBandwidth: 100kB, queue: 1}
    targets: [{address: 198.18.1.1:80}]
`, func(t *testing.T, c *policy.Config) {
			in := policy.ClientLimits{Limits: policy.Limits{MaxConnections: 50, EnforceConnections: true}, PrefixV4: 24, PrefixV6: 64, TableSize: 1000}
			if c.Instance.ClientLimits != in {
				t.Errorf("instance clientLimits %+v, want %+v", c.Instance.ClientLimits, in)
			}
			vs := c.Services[0]
			if want := (policy.Limits{MaxConnections: 2, EnforceConnections: true, Queue: 8, QueueTimeout: 3 * time.Second}); vs.Limits != want {
				t.Errorf("limits %+v, want %+v", vs.Limits, want)
			}
			if want := (policy.ClientLimits{Limits: policy.Limits{MaxConnections: 2, EnforceConnections: true, MaxBandwidth: 100_000, Queue: 1}}); vs.ClientLimits != want {
				t.Errorf("clientLimits %+v, want %+v", vs.ClientLimits, want)
			}
		}},
		{"service with port range, v4 and v6 VIPs, backups after primaries", `
classes:
  - {name: top}
  - {name: gold, parent: top, limits: {maxConnections: 5, enforceConnections: true}}
services:
  - name: web
    class: gold
    vips: [198.18.0.1, "fd00::1"]
    port: "8000-8010"
    protocol: http
    targets:
      - {name: b, address: "[fd00::9]:80", role: backup}
      - {address: 198.18.1.1:80, weight: 0, maxConnections: -1, via: netstack}
      - {name: p2, address: 198.18.1.2:80, weight: 1000, maxConnections: 4}
`, func(t *testing.T, c *policy.Config) {
			vs := c.Services[0]
			if vs.Class == nil || vs.Class.Name != "gold" || vs.Class.Parent == nil || vs.Class.Parent.Name != "top" {
				t.Fatalf("class chain wrong: %+v", vs.Class)
			}
			if vs.Ports != (policy.PortRange{Lo: 8000, Hi: 8010}) || vs.Proto != policy.ProtoHTTP {
				t.Errorf("ports %v proto %v", vs.Ports, vs.Proto)
			}
			if len(vs.VIPs) != 2 || vs.VIPs[1] != netip.MustParseAddr("fd00::1") {
				t.Errorf("vips %v", vs.VIPs)
			}
			var got []string
			for _, tg := range vs.Targets {
				got = append(got, tg.Name+"/"+tg.Role.String())
			}
			if strings.Join(got, " ") != "198.18.1.1:80/primary p2/primary b/backup" {
				t.Errorf("target order %v", got)
			}
			if tg := vs.Targets[0]; tg.Weight != 0 || tg.Via != policy.DialNetstack || tg.MaxConnections != -1 {
				t.Errorf("target 0 = %+v", tg)
			}
			if c.Service(netip.MustParseAddr("198.18.0.1"), 8005, policy.IPProtoTCP) != vs {
				t.Errorf("Service lookup failed")
			}
		}},
		{"rules and actions, TOS forms", `
actions:
  - {name: a1, outgoingTOS: 10100000, minRate: 500, meanRate: 2000, maxConnections: 100}
  - {name: a2, outgoingTOS: 0xB8}
  - {name: a3, outgoingTOS: 0d32}
  - {name: a4}
rules:
  - {name: r1, protocol: 6, sourcePorts: 23, destinationPorts: "1024-65535", sourcePrefix: 198.18.0.0/15, destinationPrefix: "fd00::5", action: a1}
  - {name: r2, protocol: "6-17", action: a2}
  - {name: r3, action: a3}
`, func(t *testing.T, c *policy.Config) {
			a := c.Actions
			if !a[0].SetTOS || a[0].OutgoingTOS != 0xA0 || a[0].MinRate != 500 || a[0].MeanRate != 2000 || a[0].MaxConnections != 100 {
				t.Errorf("a1 = %+v", a[0])
			}
			if a[1].OutgoingTOS != 0xB8 || a[2].OutgoingTOS != 32 || a[3].SetTOS {
				t.Errorf("TOS forms: %+v %+v %+v", a[1], a[2], a[3])
			}
			r := c.Rules[0]
			if r.ProtoLo != 6 || r.ProtoHi != 6 || r.SrcPort != (policy.PortRange{Lo: 23, Hi: 23}) ||
				r.DstPort != (policy.PortRange{Lo: 1024, Hi: 65535}) || r.Src != netip.MustParsePrefix("198.18.0.0/15") ||
				r.Dst != netip.MustParsePrefix("fd00::5/128") || r.Action != a[0] {
				t.Errorf("r1 = %+v", r)
			}
			if c.Rules[1].ProtoLo != 6 || c.Rules[1].ProtoHi != 17 || c.Rules[2].Action != a[2] {
				t.Errorf("r2, r3 = %+v %+v", c.Rules[1], c.Rules[2])
			}
		}},
		{"monitor and balancer", `
monitor:
  samplingInterval: 10s
  lossRatioAndWeightFr: [10, 20]
  timeoutRatioAndWeightFr: [30, 40]
  lossMaxWeightFr: 90
  timeoutMaxWeightFr: 80
  maxConnWeightFr: [40, 60, 90]
  direction: both
  scope: all
balancer:
  algorithm: maglev
  retryInterval: 5s
  maxAttempts: 2
  refreshInterval: 30s
  slowStart: 20s
  healthCheck: {interval: 4s, rise: 3, fall: 5}
`, func(t *testing.T, c *policy.Config) {
			want := policy.Monitor{Enabled: true, SamplingInterval: 10 * time.Second, LossThreshold: 10, LossStep: 20,
				TimeoutThreshold: 30, TimeoutStep: 40, LossMax: 90, TimeoutMax: 80, MaxConnLevels: [3]int{40, 60, 90}, MinSegments: policy.DefaultMinSegments,
				Direction: policy.DirectionBoth, Scope: policy.ScopeAll}
			if c.Monitor != want {
				t.Errorf("monitor = %+v", c.Monitor)
			}
			b := c.Balancer
			if b.Algorithm != policy.Maglev || b.RetryInterval != 5*time.Second || b.MaxAttempts != 2 ||
				b.RefreshInterval != 30*time.Second || b.SlowStart != 20*time.Second ||
				b.Health != (policy.HealthCheck{Interval: 4 * time.Second, Timeout: 2 * time.Second, Rise: 3, Fall: 5}) {
				t.Errorf("balancer = %+v", b)
			}
		}},
		{"monitor section disabled", "monitor: {enabled: false}\n", func(t *testing.T, c *policy.Config) {
			if c.Monitor.Enabled || c.Monitor.LossThreshold != policy.DefaultLossThreshold {
				t.Errorf("monitor = %+v", c.Monitor)
			}
		}},
		{"anchors and aliases", `
classes:
  - name: a
    limits: &l {maxConnections: 7}
  - name: b
    limits: *l
`, func(t *testing.T, c *policy.Config) {
			if c.Classes[1].Limits.MaxConnections != 7 {
				t.Errorf("alias not followed: %+v", c.Classes[1].Limits)
			}
		}},
		{"same VIP, disjoint ports", `
services:
  - {name: a, vips: [198.18.0.1], port: 80, targets: [{address: 198.18.1.1:80}]}
  - {name: b, vips: [198.18.0.1], port: 81-90, targets: [{address: 198.18.1.1:80}]}
`, func(t *testing.T, c *policy.Config) {
			if c.Service(netip.MustParseAddr("198.18.0.1"), 85, policy.IPProtoTCP).Name != "b" {
				t.Errorf("wrong service for port 85")
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := noFiles.ParseYAML("t.yaml", []byte(tt.text))
			if err != nil {
				t.Fatalf("ParseYAML: %v", err)
			}
			tt.check(t, c)
		})
	}
}

func TestParseYAMLErrors(t *testing.T) {
	tests := []struct {
		name string
		text string
		want string
	}{
		{"unknown key with suggestion", "instance:\n  limits:\n    maxConection: 3\n",
			`t.yaml:3:5: unknown key "maxConection" in limits (did you mean "maxConnections"?)`},
		{"unknown top-level key", "servces: []\n",
			`t.yaml:1:1: unknown key "servces" in config (did you mean "services"?)`},
		{"duplicate key", "instance: {name: a}\ninstance: {name: b}\n",
			`t.yaml:2:1: duplicate key "instance" in config (first at line 1)`},
		{"wrong type: string for integer", "instance:\n  limits: {maxConnections: lots}\n",
			`t.yaml:2:28: maxConnections: want an integer, got "lots"`},
		{"wrong type: list for mapping", "instance: [1]\n",
			`t.yaml:1:11: instance: want a mapping, got a list`},
		{"wrong type: bool", "instance:\n  limits: {enforceBandwidth: 1}\n",
			`t.yaml:2:30: enforceBandwidth: want true or false, got "1"`},
		{"bad bandwidth", "instance:\n  limits: {maxBandwidth: 5 furlongs}\n",
			`t.yaml:2:26: maxBandwidth: want a byte count like 1000000, 1MB or 1MiB, got "5 furlongs"`},
		{"bad duration", "instance: {metricInterval: 30}\n",
			`t.yaml:1:28: metricInterval: want a duration like 30s or 100ms, got "30"`},
		{"interval not a multiple", "instance: {metricInterval: 1s, recomputeInterval: 300ms}\n",
			`t.yaml:1:32: metricInterval 1s must be a multiple of recomputeInterval 300ms`},
		{"timeouts: zero connect", "instance:\n  timeouts: {connect: 0s}\n",
			`t.yaml:2:23: connect: must be more than 0`},
		{"timeouts: unknown key", "instance:\n  timeouts: {idel: 1s}\n",
			`t.yaml:2:14: unknown key "idel" in timeouts (did you mean "idle"?)`},
		{"timeouts: off where it is not allowed", "instance:\n  timeouts: {handshake: off}\n",
			`t.yaml:2:25: handshake: want a duration like 30s or 100ms, got "off"`},
		{"bad bandwidthBytes", "instance: {bandwidthBytes: headers}\n",
			`t.yaml:1:28: bandwidthBytes: unknown bandwidthBytes "headers" (want payload or wire)`},
		{"zero minSegments", "monitor: {minSegments: 0}\n",
			`t.yaml:1:24: minSegments: 0 is out of range 1..1073741824`},
		{"noServices with services", "noServices: true\nservices:\n- {name: a, vips: [198.18.0.1], port: 80, targets: [{address: 198.18.1.1:80}]}\n",
			`t.yaml:1:1: noServices: true, but the file defines 1 services: remove the key or the services`},
		{"noServices not a bool", "noServices: yes please\n",
			`t.yaml:1:13: noServices: want true or false, got "yes please"`},
		{"zero interval", "monitor: {samplingInterval: 0s}\n",
			`t.yaml:1:29: samplingInterval: must be more than 0`},
		{"maxAttempts beyond the tried-set", "balancer: {maxAttempts: 17}\n",
			`t.yaml:1:25: maxAttempts: 17 is out of range 1..16`},
		{"weight out of range", "services:\n- {name: a, vips: [198.18.0.1], port: 80, targets: [{address: 198.18.1.1:80, weight: 1001}]}\n",
			`t.yaml:2:86: weight: 1001 is out of range 0..1000`},
		{"port out of range", "services:\n- {name: a, vips: [198.18.0.1], port: 70000, targets: [{address: 198.18.1.1:80}]}\n",
			`t.yaml:2:39: port: port 70000 is out of range 1..65535`},
		{"reversed port range", "services:\n- {name: a, vips: [198.18.0.1], port: 90-80, targets: [{address: 198.18.1.1:80}]}\n",
			`t.yaml:2:39: port: port range 90-80 is reversed`},
		{"bad VIP", "services:\n- {name: a, vips: [198.18.0.300], port: 80, targets: [{address: 198.18.1.1:80}]}\n",
			`t.yaml:2:20: vips: want an IPv4 or IPv6 address, got "198.18.0.300"`},
		{"host name target", "services:\n- {name: a, vips: [198.18.0.1], port: 80, targets: [{address: \"backend:80\"}]}\n",
			`t.yaml:2:63: address: want IP:port like 198.18.1.5:8080 or [fd00::5]:8080, or an IP alone to keep the client's port, got "backend:80"`},
		{"missing required keys", "services:\n- {name: a, vips: [198.18.0.1]}\n",
			"t.yaml:2:3: service: missing \"port\"\nt.yaml:2:3: service: missing \"targets\""},
		{"no targets", "services:\n- {name: a, vips: [198.18.0.1], port: 80, targets: []}\n",
			`t.yaml:2:52: targets: a service needs at least one target`},
		{"unknown protocol", "services:\n- {name: a, vips: [198.18.0.1], port: 80, protocol: sctp, targets: [{address: 198.18.1.1:80}]}\n",
			`t.yaml:2:53: protocol: unknown protocol "sctp" (want tcp, http, tls or udp)`},
		{"bad role", "services:\n- {name: a, vips: [198.18.0.1], port: 80, targets: [{address: 198.18.1.1:80, role: spare}]}\n",
			`t.yaml:2:84: role: want primary or backup, got "spare"`},
		{"duplicate service", "services:\n- {name: a, vips: [198.18.0.1], port: 80, targets: [{address: 198.18.1.1:80}]}\n- {name: a, vips: [198.18.0.2], port: 80, targets: [{address: 198.18.1.1:80}]}\n",
			`t.yaml:3:10: duplicate service "a" (first defined at t.yaml:2:10)`},
		{"duplicate target", "services:\n- {name: a, vips: [198.18.0.1], port: 80, targets: [{address: 198.18.1.1:80}, {address: 198.18.1.1:80}]}\n",
			`t.yaml:2:89: duplicate target "198.18.1.1:80" (first defined at t.yaml:2:63)`},
		{"VIP:port claimed twice", "services:\n- {name: a, vips: [198.18.0.1], port: 80-89, targets: [{address: 198.18.1.1:80}]}\n- {name: b, vips: [\"fd00::1\", 198.18.0.1], port: 85-99, targets: [{address: 198.18.1.1:80}]}\n",
			`t.yaml:3:31: 198.18.0.1 port 85-89 already claimed by service "a" at t.yaml:2:20`},
		{"VIP listed twice", "services:\n- {name: a, vips: [198.18.0.1, 198.18.0.1], port: 80, targets: [{address: 198.18.1.1:80}]}\n",
			`t.yaml:2:32: service "a" lists VIP 198.18.0.1 twice (first at t.yaml:2:20)`},
		{"rule names a missing action", "actions: [{name: gold}]\nrules: [{name: r, action: glod}]\n",
			`t.yaml:2:27: rule "r" names unknown action "glod" (did you mean "gold"?)`},
		{"rule names a missing service", "actions: [{name: gold}]\nrules: [{name: r, action: gold, service: web}]\n",
			`t.yaml:2:42: rule "r" names unknown service "web"`},
		{"class cycle", "classes:\n- {name: a, parent: c}\n- {name: b, parent: a}\n- {name: c, parent: b}\n",
			`t.yaml:2:21: class "a": parent chain loops (a → c → b → a)`},
		{"class is its own parent", "classes:\n- {name: a, parent: a}\n",
			`t.yaml:2:21: class "a": parent chain loops (a → a)`},
		{"unknown class", "classes:\n- {name: gold}\nservices:\n- {name: a, class: gold2, vips: [198.18.0.1], port: 80, targets: [{address: 198.18.1.1:80}]}\n",
			`t.yaml:4:20: unknown class "gold2" (did you mean "gold"?)`},
		{"unknown parent class", "classes:\n- {name: a, parent: b}\n",
			`t.yaml:2:21: unknown class "b"`},
		{"TOS out of range", "actions: [{name: a, outgoingTOS: 256}]\n",
			`t.yaml:1:34: outgoingTOS: want a ToS byte: 8 binary digits (10100000), 0x and hex (0xA0), 0b and binary (0b101) or 0d and decimal 0..255 (0d160), got "256"`},
		{"monitor direction unknown", "monitor: {direction: fromClient}\n",
			`t.yaml:1:22: direction: unknown direction "fromClient" (want fromTarget, toTarget or both)`},
		{"monitor scope unknown", "monitor: {scope: some}\n",
			`t.yaml:1:18: scope: unknown scope "some" (want policy or all)`},
		{"monitor fraction out of range", "monitor: {lossMaxWeightFr: 101}\n",
			`t.yaml:1:28: lossMaxWeightFr: 101 is out of range 1..100`},
		{"monitor ratio out of range", "monitor: {lossRatioAndWeightFr: [1001, 25]}\n",
			`t.yaml:1:34: lossRatioAndWeightFr: 1001 is out of range 1..1000`},
		{"monitor pair fraction out of range", "monitor: {lossRatioAndWeightFr: [20, 250]}\n",
			`t.yaml:1:38: lossRatioAndWeightFr: 250 is out of range 1..100`},
		{"monitor pair wrong length", "monitor: {timeoutRatioAndWeightFr: [20]}\n",
			`t.yaml:1:36: timeoutRatioAndWeightFr: want [ratio, fraction], two integers, got a list of 1`},
		{"maxConnWeightFr not ascending", "monitor: {maxConnWeightFr: [50, 50, 80]}\n",
			`t.yaml:1:28: maxConnWeightFr: levels 50 50 80 must ascend`},
		{"maxConnWeightFr wrong length", "monitor: {maxConnWeightFr: [50, 80]}\n",
			`t.yaml:1:28: maxConnWeightFr: want a list of 3 integers, got a list of 2`},
		{"unknown algorithm", "balancer: {algorithm: random}\n",
			`t.yaml:1:23: algorithm: unknown algorithm "random" (want round-robin, least-conn or maglev)`},
		{"health timeout too long", "balancer: {healthCheck: {interval: 2s, timeout: 2s}}\n",
			`t.yaml:1:40: timeout 2s must be shorter than interval 2s`},
		{"burst without bandwidth", "instance: {limits: {burstBytes: 10}}\n",
			`t.yaml:1:21: burstBytes needs maxBandwidth (the bucket refills at that rate)`},
		{"prefix with host bits", "actions: [{name: a}]\nrules: [{name: r, action: a, sourcePrefix: 198.18.0.1/15}]\n",
			`t.yaml:2:44: sourcePrefix: prefix 198.18.0.1/15 has host bits set (want 198.18.0.0/15)`},
		{"YAML syntax error", "instance:\n  name: [a\n",
			`t.yaml:1:1: YAML syntax: did not find expected ',' or ']'`},
		{"two documents", "instance: {}\n---\nclasses: []\n",
			`t.yaml:2:1: a config file holds one YAML document; this is a second one`},
		{"top level not a mapping", "- a\n",
			`t.yaml:1:1: config: want a mapping, got a list`},
		{"missing include", "include: [nope.pa]\n",
			`t.yaml:1:11: include "nope.pa": no such file`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := noFiles.ParseYAML("t.yaml", []byte(tt.text))
			if err == nil {
				t.Fatalf("no error, want %q", tt.want)
			}
			if err.Error() != tt.want {
				t.Errorf("error\n got: %s\nwant: %s", err, tt.want)
			}
			var list ErrorList
			if !errors.As(err, &list) {
				t.Errorf("error is %T, want an ErrorList", err)
			}
		})
	}
}

// TestParseYAMLAllErrors checks that one file with many problems reports
// every one of them, in line order.
func TestParseYAMLAllErrors(t *testing.T) {
	text := `instance:
  limits:
    maxBandwidth: fast
    colour: blue
classes:
  - {name: a, parent: b}
  - {name: b, parent: a}
services:
  - name: web
    class: nope
    vips: [198.18.0.1]
    port: 80
    targets: [{address: 198.18.1.1:80, weight: -1}]
  - name: web2
    vips: [198.18.0.1]
    port: 80
    targets: [{address: 198.18.1.1:80}]
rules:
  - {name: r, action: missing}
`
	_, err := noFiles.ParseYAML("many.yaml", []byte(text))
	want := []string{
		`many.yaml:3:19: maxBandwidth: want a byte count like 1000000, 1MB or 1MiB, got "fast"`,
		`many.yaml:4:5: unknown key "colour" in limits`,
		`many.yaml:6:23: class "a": parent chain loops (a → b → a)`,
		`many.yaml:10:12: unknown class "nope"`,
		`many.yaml:13:48: weight: -1 is out of range 0..1000`,
		`many.yaml:15:12: 198.18.0.1 port 80 already claimed by service "web" at many.yaml:11:12`,
		`many.yaml:19:23: rule "r" names unknown action "missing"`,
	}
	if err == nil {
		t.Fatal("no error")
	}
	var list ErrorList
	if !errors.As(err, &list) {
		t.Fatalf("error is %T, want an ErrorList", err)
	}
	if got := err.Error(); got != strings.Join(want, "\n") {
		t.Errorf("errors\n got:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
	if len(list) != len(want) {
		t.Errorf("%d errors, want %d", len(list), len(want))
	}
	if list[0].Line != 3 || list[0].Col != 19 || list[0].File != "many.yaml" {
		t.Errorf("first error position %v", list[0].Pos)
	}
}

// TestParseYAMLAliasBomb checks that aliases cannot make a small file
// expensive: 1000 services, each an alias of one whose targets are 1000
// aliases of one target, would be a million targets to check.
func TestParseYAMLAliasBomb(t *testing.T) {
	text := "t: &t {address: 198.18.1.1:80}\n" +
		"s: &s {name: a, vips: [198.18.0.1], port: 80, targets: [" + strings.Repeat("*t, ", 999) + "*t]}\n" +
		"services: [" + strings.Repeat("*s, ", 999) + "*s]\n"
	_, err := noFiles.ParseYAML("bomb.yaml", []byte(text))
	if err == nil {
		t.Fatal("no error")
	}
	if !strings.Contains(err.Error(), "document too large once aliases are expanded (over 1048576 nodes)") {
		t.Errorf("error does not say the document was cut short: %.300s", err)
	}
}

// TestParseQoSOptions: instance.bandwidthBytes and monitor.minSegments reach
// the model; unset, they are the seed's payload bytes and 100 segments.
func TestParseQoSOptions(t *testing.T) {
	c, err := ParseYAML("t.yaml", []byte("instance: {bandwidthBytes: wire}\nmonitor: {minSegments: 20}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Instance.BandwidthBytes != policy.CountWire || c.Monitor.MinSegments != 20 {
		t.Errorf("bandwidthBytes %v minSegments %d, want wire 20", c.Instance.BandwidthBytes, c.Monitor.MinSegments)
	}
	c, err = ParseYAML("t.yaml", []byte("monitor: {enabled: true}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Instance.BandwidthBytes != policy.CountPayload || c.Monitor.MinSegments != policy.DefaultMinSegments {
		t.Errorf("defaults: bandwidthBytes %v minSegments %d", c.Instance.BandwidthBytes, c.Monitor.MinSegments)
	}
}

// TestParseYAMLNoServices pins the key a file uses to say it has no
// services on purpose: a reload refuses an empty config without it.
func TestParseYAMLNoServices(t *testing.T) {
	for _, tt := range []struct {
		text string
		want bool
	}{
		{"", false},
		{"noServices: false\n", false},
		{"noServices: true\n", true},
		{"noServices: true\nbalancer: {refreshInterval: 1s}\n", true},
	} {
		cfg, err := noFiles.ParseYAML("t.yaml", []byte(tt.text))
		if err != nil {
			t.Fatalf("%q: %v", tt.text, err)
		}
		if cfg.NoServices != tt.want || len(cfg.Services) != 0 {
			t.Errorf("%q: NoServices %v with %d services, want %v", tt.text, cfg.NoServices, len(cfg.Services), tt.want)
		}
	}
}

// TestTargetKeepsClientPort: an address without a port, or with port 0,
// keeps the client's port; a malformed one says what is wanted.
func TestTargetKeepsClientPort(t *testing.T) {
	for _, tc := range []struct{ addr, want, name string }{
		{"198.18.1.5", "198.18.1.5:0", "198.18.1.5"},
		{"198.18.1.5:0", "198.18.1.5:0", "198.18.1.5"},
		{`"fd00::5"`, "[fd00::5]:0", "fd00::5"},
		{`"[fd00::5]"`, "[fd00::5]:0", "fd00::5"},
		{"198.18.1.5:8080", "198.18.1.5:8080", "198.18.1.5:8080"},
	} {
		text := "services:\n- {name: a, vips: [198.19.0.1], port: 8000-8010, targets: [{address: " + tc.addr + "}]}\n"
		c, err := noFiles.ParseYAML("t.yaml", []byte(text))
		if err != nil {
			t.Errorf("%s: %v", tc.addr, err)
			continue
		}
		tg := c.Services[0].Targets[0]
		if tg.Addr.String() != tc.want || tg.Name != tc.name {
			t.Errorf("%s: address %v named %q, want %s named %q", tc.addr, tg.Addr, tg.Name, tc.want, tc.name)
		}
		if got := tg.DialAddr(8003); tg.KeepsPort() != (tg.Addr.Port() == 0) || (tg.KeepsPort() && got.Port() != 8003) {
			t.Errorf("%s: DialAddr(8003) = %v", tc.addr, got)
		}
	}
	for _, bad := range []string{`"[198.18.1.5]"`, `"[fd00::5"`, "0.0.0.0", "host.example"} {
		text := "services:\n- {name: a, vips: [198.19.0.1], port: 80, targets: [{address: " + bad + "}]}\n"
		if _, err := noFiles.ParseYAML("t.yaml", []byte(text)); err == nil || !strings.Contains(err.Error(), "an IP alone to keep the client's port") {
			t.Errorf("%s: %v, want an error saying what an address is", bad, err)
		}
	}
}
