package cluster

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"weir/balancer"
	"weir/cmd/weir/internal/cluster/clustertest"
	"weir/policy"
)

// BenchmarkAdmit is the admission of one connection (Admit, then the
// balancer's Pick, then both released) of a service with an enforced
// maxConnections and a target with a maxConnections: alone, and as a
// member of a cluster whose Loop renews the leases against a real Redis
// meanwhile (limits large enough that the share never refuses). The
// cluster adds no I/O to admission: the difference is the share check
// (an atomic load per level and target) and Loop's renewals competing for
// the CPU.
func BenchmarkAdmit(b *testing.B) {
	for _, clustered := range []bool{false, true} {
		name := "alone"
		if clustered {
			name = "cluster"
		}
		b.Run(name, func(b *testing.B) {
			const limit = 1 << 20
			c := &policy.Config{
				Services: []*policy.VirtualServer{{
					Name: "web", VIPs: []netip.Addr{netip.MustParseAddr("198.18.0.1")}, Ports: policy.PortRange{Lo: 80, Hi: 80},
					Limits:  policy.Limits{MaxConnections: limit, EnforceConnections: true},
					Targets: []*policy.Target{{Name: "app", Addr: netip.MustParseAddrPort("198.18.1.1:80"), Weight: 1, MaxConnections: limit}},
				}},
			}
			if clustered {
				c.Cluster = &policy.Cluster{Redis: clustertest.StartRedis(b).Addr(), Name: "bench", Instance: "a", LeaseInterval: 100 * time.Millisecond}
			}
			cfg, err := policy.Compile(c)
			if err != nil {
				b.Fatal(err)
			}
			adm := policy.NewAdmission(cfg, 0)
			bal := balancer.New(cfg.Services[0], cfg.Balancer)
			if clustered {
				cl, err := New(Options{Config: *cfg.Cluster, Admission: adm, Targets: balTargets{"web", bal}})
				if err != nil {
					b.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() { defer close(done); cl.Loop(ctx) }()
				defer func() { cancel(); <-done; cl.Close() }()
				for start := time.Now(); ; time.Sleep(5 * time.Millisecond) {
					st := cl.Status()
					if len(st.Levels) == 2 && st.Levels[0].Share == limit && st.Levels[1].Share == limit {
						break
					}
					if time.Since(start) > 5*time.Second {
						b.Fatalf("no leases: %+v", st)
					}
				}
			}
			vs := cfg.Services[0]
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				var tk policy.Ticket
				now := time.Now()
				for pb.Next() {
					if _, ok := adm.Admit(vs, &tk); !ok {
						b.Error("refused")
						return
					}
					l, err := bal.PickAction(now, 1, nil, nil)
					if err != nil {
						b.Error(err)
						return
					}
					l.Release()
					tk.Release()
				}
			})
		})
	}
}
