package policy

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

func compileTestConfig(mod func(c *Config)) (*Config, error) {
	vs := &VirtualServer{
		Name: "web", VIPs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}, Ports: PortRange{Lo: 80, Hi: 80},
		Targets: []*Target{
			{Addr: netip.MustParseAddrPort("10.0.0.1:80"), Weight: 1},
			{Name: "b", Addr: netip.MustParseAddrPort("10.0.0.2:80"), Weight: 2},
		},
	}
	c := &Config{Services: []*VirtualServer{vs}}
	if mod != nil {
		mod(c)
	}
	return Compile(c)
}

// TestCompileDefaults: Compile is the one place defaults are filled; the
// balancer and the datapath take its values as they are.
func TestCompileDefaults(t *testing.T) {
	c, err := compileTestConfig(func(c *Config) { c.Balancer.Health.Interval = 10 * time.Second })
	if err != nil {
		t.Fatal(err)
	}
	b := c.Balancer
	if b.MaxAttempts != DefaultMaxAttempts || b.RetryInterval != DefaultRetryInterval {
		t.Errorf("balancer defaults %+v", b)
	}
	if h := b.Health; h.Timeout != 5*time.Second || h.Rise != DefaultHealthRise || h.Fall != DefaultHealthFall {
		t.Errorf("health defaults %+v", h)
	}
	if got := c.Services[0].Targets[0].Name; got != "10.0.0.1:80" {
		t.Errorf("unnamed target called %q, want its address", got)
	}
	if c.Instance.Name != "weir" || c.Instance.MetricInterval != DefaultMetricInterval || c.Instance.RecomputeInterval != DefaultRecomputeInterval {
		t.Errorf("instance defaults %+v", c.Instance)
	}
	if c.Services[0].Targets[1].Weight != 2 {
		t.Error("Compile changed a weight")
	}
}

// TestCompileTimeouts: the instance's timeouts default to the Default…
// constants, a virtual server's zero fields inherit the instance's, and
// "off" (negative) is kept where it means off.
func TestCompileTimeouts(t *testing.T) {
	c, err := compileTestConfig(func(c *Config) {
		c.Instance.Timeouts = Timeouts{Connect: time.Second, Idle: -1}
		c.Services[0].Timeouts = Timeouts{FirstByte: 7 * time.Second, InFlightPerVIP: 9}
	})
	if err != nil {
		t.Fatal(err)
	}
	in := Timeouts{Handshake: DefaultHandshakeTimeout, Connect: time.Second, FirstByte: DefaultFirstByteTimeout,
		Idle: -1, RequestRead: DefaultRequestReadTimeout, InFlightPerVIP: DefaultInFlightPerVIP}
	if c.Instance.Timeouts != in {
		t.Errorf("instance timeouts %+v, want %+v", c.Instance.Timeouts, in)
	}
	vs := in
	vs.FirstByte, vs.InFlightPerVIP = 7*time.Second, 9
	if c.Services[0].Timeouts != vs {
		t.Errorf("service timeouts %+v, want %+v", c.Services[0].Timeouts, vs)
	}
}

func TestCompileRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(c *Config)
		want string
	}{
		{"attempts beyond the tried-set", func(c *Config) { c.Balancer.MaxAttempts = MaxAttemptsLimit + 1 }, "maxAttempts 17 is out of range 1..16"},
		{"negative attempts", func(c *Config) { c.Balancer.MaxAttempts = -1 }, "maxAttempts -1 is out of range"},
		{"negative retry", func(c *Config) { c.Balancer.RetryInterval = -time.Second }, "retryInterval -1s is negative"},
		{"negative slow start", func(c *Config) { c.Balancer.SlowStart = -time.Second }, "slowStart -1s is negative"},
		{"negative health", func(c *Config) { c.Balancer.Health = HealthCheck{Interval: time.Second, Rise: -1} }, "none may be negative"},
		{"negative health interval", func(c *Config) { c.Balancer.Health.Interval = -time.Second }, "interval -1s is negative"},
		{"nil target", func(c *Config) { c.Services[0].Targets = append(c.Services[0].Targets, nil) }, `"web": nil target`},
		{"duplicate", func(c *Config) { c.Services[0].Targets[1].Name = "10.0.0.1:80" }, `target "10.0.0.1:80" defined twice`},
		{"negative weight", func(c *Config) { c.Services[0].Targets[1].Weight = -1 }, `target "b": negative weight`},
		{"nil service", func(c *Config) { c.Services = append(c.Services, nil) }, "nil virtual server"},
		{"negative connect", func(c *Config) { c.Instance.Timeouts.Connect = -time.Second }, "instance timeouts: connect -1s is negative"},
		{"negative service handshake", func(c *Config) { c.Services[0].Timeouts.Handshake = -1 }, `virtual server "web" timeouts: handshake -1ns is negative`},
		{"in-flight too big", func(c *Config) { c.Services[0].Timeouts.InFlightPerVIP = MaxInFlightPerVIP + 1 }, "inFlightPerVIP 65536 is out of range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := compileTestConfig(tc.mod)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
	for _, n := range []int{1, MaxAttemptsLimit} {
		if _, err := compileTestConfig(func(c *Config) { c.Balancer.MaxAttempts = n }); err != nil {
			t.Errorf("maxAttempts %d: %v", n, err)
		}
	}
}

// TestTargetIndex: targets are numbered over the services in order, the
// numbering of datapath.Meters' target rows; a target of another config has
// none.
func TestTargetIndex(t *testing.T) {
	c, err := compileTestConfig(func(c *Config) {
		c.Services = append(c.Services, &VirtualServer{
			Name: "db", VIPs: []netip.Addr{netip.MustParseAddr("192.0.2.2")}, Ports: PortRange{Lo: 5432, Hi: 5432},
			Targets: []*Target{{Name: "d", Addr: netip.MustParseAddrPort("10.0.1.1:5432")}},
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []int{0, 1, 2}
	i := 0
	for _, vs := range c.Services {
		for _, tg := range vs.Targets {
			if got := c.TargetIndex(tg); got != want[i] {
				t.Errorf("TargetIndex(%s) = %d, want %d", tg.Name, got, want[i])
			}
			i++
		}
	}
	if got := c.TargetIndex(&Target{Name: "d"}); got != -1 {
		t.Errorf("foreign target: %d, want -1", got)
	}
	if n := testing.AllocsPerRun(100, func() { c.TargetIndex(c.Services[1].Targets[0]) }); n != 0 {
		t.Errorf("TargetIndex allocates %v", n)
	}
}

// TestRuleCovers: a rule covers a service when some TCP connection to one of
// its VIPs and ports matches it, and Match agrees on that connection.
func TestRuleCovers(t *testing.T) {
	web := &VirtualServer{Name: "web", VIPs: []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")}, Ports: PortRange{Lo: 80, Hi: 80}}
	other := &VirtualServer{Name: "other"}
	anyPort := &VirtualServer{Name: "any", VIPs: []netip.Addr{netip.MustParseAddr("192.0.2.9")}}
	for _, tt := range []struct {
		name string
		r    Rule
		vs   *VirtualServer
		want bool
	}{
		{"empty rule", Rule{}, web, true},
		{"its service", Rule{Service: web}, web, true},
		{"another service", Rule{Service: other}, web, false},
		{"tcp", Rule{ProtoLo: 6, ProtoHi: 6}, web, true},
		{"protocol range with tcp", Rule{ProtoLo: 1, ProtoHi: 17}, web, true},
		{"udp only", Rule{ProtoLo: 17, ProtoHi: 17}, web, false},
		{"its port", Rule{SrcPort: PortRange{Lo: 80, Hi: 80}}, web, true},
		{"port range around it", Rule{SrcPort: PortRange{Lo: 1, Hi: 1023}}, web, true},
		{"another port", Rule{SrcPort: PortRange{Lo: 443, Hi: 443}}, web, false},
		{"any-port service", Rule{SrcPort: PortRange{Lo: 443, Hi: 443}}, anyPort, true},
		{"its v4 VIP", Rule{Src: netip.MustParsePrefix("192.0.2.0/24")}, web, true},
		{"its v6 VIP", Rule{Src: netip.MustParsePrefix("2001:db8::/64")}, web, true},
		{"another prefix", Rule{Src: netip.MustParsePrefix("198.51.100.0/24")}, web, false},
		{"client port and prefix are free", Rule{DstPort: PortRange{Lo: 1024, Hi: 65535}, Dst: netip.MustParsePrefix("203.0.113.0/24")}, web, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.r.Covers(tt.vs); got != tt.want {
				t.Errorf("Covers = %v, want %v", got, tt.want)
			}
			if !tt.want || len(tt.vs.VIPs) == 0 {
				return
			}
			// A covering rule matches a real connection: Match and
			// Covers are one matcher.
			port := tt.vs.Ports.Lo
			if tt.r.SrcPort.Lo != 0 && tt.vs.Ports.Any() {
				port = tt.r.SrcPort.Lo
			}
			dst := netip.MustParseAddrPort("203.0.113.5:40000")
			hit := false
			for _, v := range tt.vs.VIPs {
				hit = hit || tt.r.Match(IPProtoTCP, netip.AddrPortFrom(v, port), dst, tt.vs)
			}
			if !hit {
				t.Errorf("Covers but Match holds for no connection to %s", tt.vs.Name)
			}
		})
	}
}

// TestTCPAndUDPShareAPort: DNS answers on 53 over both protocols, so a
// tcp and a udp service may share a VIP and port; each protocol's lookup
// finds its own, and two services of one protocol on one port stay an
// error.
func TestTCPAndUDPShareAPort(t *testing.T) {
	vip := netip.MustParseAddr("198.18.0.53")
	svc := func(name string, p ServiceProto) *VirtualServer {
		return &VirtualServer{Name: name, Proto: p, VIPs: []netip.Addr{vip}, Ports: PortRange{Lo: 53, Hi: 53},
			Targets: []*Target{{Addr: netip.MustParseAddrPort("198.18.1.1:53"), Weight: 1}}}
	}
	c, err := Compile(&Config{Services: []*VirtualServer{svc("dns-tcp", ProtoTCP), svc("dns-udp", ProtoUDP)}})
	if err != nil {
		t.Fatalf("a tcp and a udp service on one VIP and port: %v", err)
	}
	if vs := c.Service(vip, 53, IPProtoTCP); vs == nil || vs.Name != "dns-tcp" {
		t.Errorf("TCP lookup found %v", vs)
	}
	if vs := c.Service(vip, 53, IPProtoUDP); vs == nil || vs.Name != "dns-udp" {
		t.Errorf("UDP lookup found %v", vs)
	}
	if vs := c.TCPService(vip, 54); vs != nil {
		t.Errorf("port 54 found %q", vs.Name)
	}
	if _, err := Compile(&Config{Services: []*VirtualServer{svc("a", ProtoUDP), svc("b", ProtoUDP)}}); err == nil ||
		!strings.Contains(err.Error(), "claimed by both") {
		t.Errorf("two udp services on one port: %v", err)
	}
}
