package config

import (
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"weir/policy"
)

// TestExamples loads every example config of the repository and checks the
// values each seed scenario is about.
func TestExamples(t *testing.T) {
	tests := []struct {
		file  string
		check func(t *testing.T, c *policy.Config)
	}{
		{"sun-qos.yaml", func(t *testing.T, c *policy.Config) {
			in := c.Instance
			if in.MetricInterval != 30*time.Second || in.RecomputeInterval != 100*time.Millisecond {
				t.Errorf("intervals %v %v", in.MetricInterval, in.RecomputeInterval)
			}
			if in.Limits != (policy.Limits{MaxBandwidth: 10_000_000, EnforceBandwidth: true, MaxConnections: 1000}) {
				t.Errorf("instance limits %+v", in.Limits)
			}
			if len(c.Classes) != 1 || c.Classes[0].Limits != (policy.Limits{MaxBandwidth: 1_000_000, EnforceBandwidth: true, MaxConnections: 200, EnforceConnections: true}) {
				t.Errorf("class limits %+v", c.Classes[0].Limits)
			}
			shop := c.ServiceByName("shop")
			if shop == nil || shop.Class != c.Classes[0] || shop.Proto != policy.ProtoHTTP {
				t.Fatalf("shop = %+v", shop)
			}
			if shop.Limits != (policy.Limits{MaxBandwidth: 100_000, EnforceBandwidth: true, MaxConnections: 50, EnforceConnections: true, BurstBytes: 65536}) {
				t.Errorf("shop limits %+v", shop.Limits)
			}
			if c.Service(netip.MustParseAddr("fd00::10"), 80, policy.IPProtoTCP) != shop {
				t.Errorf("shop does not answer on [fd00::10]:80")
			}
			if blog := c.ServiceByName("blog"); blog == nil || blog.Limits.Any() || blog.Class != c.Classes[0] {
				t.Errorf("blog = %+v", blog)
			}
		}},
		{"websphere-cluster.yaml", func(t *testing.T, c *policy.Config) {
			vs := c.ServiceByName("wlm-cluster")
			if vs == nil || vs.Proto != policy.ProtoHTTP || len(vs.Targets) != 3 {
				t.Fatalf("service = %+v", vs)
			}
			want := []struct {
				name string
				max  int64
				role policy.Role
			}{{"wasmember05", 3, policy.RolePrimary}, {"wasmember06", 4, policy.RolePrimary}, {"wasbackup", 10, policy.RoleBackup}}
			for i, w := range want {
				tg := vs.Targets[i]
				if tg.Name != w.name || tg.MaxConnections != w.max || tg.Role != w.role {
					t.Errorf("target %d = %+v, want %+v", i, tg, w)
				}
			}
			if c.Balancer.RetryInterval != 60*time.Second || c.Balancer.RefreshInterval != 60*time.Second {
				t.Errorf("balancer %+v", c.Balancer)
			}
		}},
		{"zos-telnet.pa", checkSeed},
		{"zos-telnet.yaml", func(t *testing.T, c *policy.Config) {
			checkSeed(t, c)
			vs := c.ServiceByName("telnet")
			if vs == nil || vs.Ports != (policy.PortRange{Lo: 23, Hi: 23}) || vs.Targets[0].Weight != 40 {
				t.Fatalf("telnet = %+v", vs)
			}
			vip := netip.AddrPortFrom(vs.VIPs[0], 23)
			if a := c.Classify(6, vip, netip.MustParseAddrPort("198.18.9.9:50000"), vs); a == nil || a.Name != "telnetGold" {
				t.Errorf("telnet traffic classified as %v", a)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			c, err := Load(filepath.Join("..", "..", "examples", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, c)
		})
	}
	// Every example must be covered above.
	all, _ := filepath.Glob(filepath.Join("..", "..", "examples", "*"))
	if len(all) != len(tests) {
		t.Errorf("examples/ holds %d files, the test checks %d", len(all), len(tests))
	}
}
