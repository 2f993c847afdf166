package balancer

import (
	"fmt"
	"sync/atomic"
	"testing"

	"weir/policy"
)

// BenchmarkPick measures Pick plus Release for each algorithm over 4, 100 and
// 10 000 primaries (weights 1–4, no limits), serially and from GOMAXPROCS
// goroutines at once.
func BenchmarkPick(b *testing.B) {
	for _, algo := range []policy.Algorithm{policy.RoundRobin, policy.LeastConn, policy.Maglev} {
		for _, n := range []int{4, 100, 10000} {
			bl := mustNew(b, benchVS(n), policy.BalancerSettings{Algorithm: algo})
			b.Run(fmt.Sprintf("%v/%d/serial", algo, n), func(b *testing.B) {
				b.ReportAllocs()
				var h uint64
				for b.Loop() {
					h++
					l, err := bl.PickAction(t0, mix(h), nil, nil)
					if err != nil {
						b.Fatal(err)
					}
					l.Release()
				}
			})
			b.Run(fmt.Sprintf("%v/%d/parallel", algo, n), func(b *testing.B) {
				b.ReportAllocs()
				var seed atomic.Uint64
				b.RunParallel(func(pb *testing.PB) {
					h := seed.Add(1) << 40
					for pb.Next() {
						h++
						l, err := bl.PickAction(t0, mix(h), nil, nil)
						if err != nil {
							b.Error(err)
							return
						}
						l.Release()
					}
				})
			})
		}
	}
}

// BenchmarkPickAtLimit measures the path where the scheduled target is full
// and the pick moves on: half the primaries sit at MaxConnections.
func BenchmarkPickAtLimit(b *testing.B) {
	for _, n := range []int{4, 100, 10000} {
		vs := benchVS(n)
		for i, t := range vs.Targets {
			if i%2 == 0 {
				t.MaxConnections = 1
			}
		}
		bl := mustNew(b, vs, policy.BalancerSettings{})
		for _, e := range bl.tab.Load().entries {
			if e.max > 0 {
				e.st.open.Store(e.max) // at its limit
			}
		}
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.ReportAllocs()
			var h uint64
			for b.Loop() {
				h++
				l, err := bl.PickAction(t0, mix(h), nil, nil)
				if err != nil {
					b.Fatal(err)
				}
				l.Release()
			}
		})
	}
}

// BenchmarkBuild measures building a table over n primaries: SetWeights
// alternating between two weight sets, so that every call rebuilds.
func BenchmarkBuild(b *testing.B) {
	for _, algo := range []policy.Algorithm{policy.RoundRobin, policy.Maglev} {
		for _, n := range []int{100, 10000} {
			bl := mustNew(b, benchVS(n), policy.BalancerSettings{Algorithm: algo})
			w := [2]map[string]int{{}, {}}
			for i, t := range benchVS(n).Targets {
				w[0][t.Name] = 40
				w[1][t.Name] = 20 + i%3
			}
			b.Run(fmt.Sprintf("%v/%d", algo, n), func(b *testing.B) {
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					i++
					bl.SetWeights(w[i%2])
				}
			})
		}
	}
}
