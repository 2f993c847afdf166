package balancer

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"weir/internal/testutil"
	"weir/policy"
)

// TestMain fails the package if a test leaves a goroutine running (a health
// checker's loop or one of its checks).
func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

// t0 is the manual clock's start.
var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// spec describes a target compactly: "name:weight", with options after
// further colons: "max=3", "backup".
func makeVS(specs ...string) *policy.VirtualServer {
	vs := &policy.VirtualServer{Name: "vs"}
	for i, s := range specs {
		f := strings.Split(s, ":")
		t := &policy.Target{
			Name:   f[0],
			Addr:   netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), 80),
			Weight: 1,
		}
		for _, o := range f[1:] {
			switch {
			case o == "backup":
				t.Role = policy.RoleBackup
			case strings.HasPrefix(o, "max="):
				fmt.Sscan(o[4:], &t.MaxConnections)
			default:
				fmt.Sscan(o, &t.Weight)
			}
		}
		vs.Targets = append(vs.Targets, t)
	}
	return vs
}

// compile passes vs and s through policy.Compile, as every caller of New and
// Update does: it fills the defaults and checks the targets. A vs without
// VIPs gets a test VIP and port.
func compile(t testing.TB, vs *policy.VirtualServer, s policy.BalancerSettings) (*policy.VirtualServer, policy.BalancerSettings) {
	t.Helper()
	if len(vs.VIPs) == 0 {
		vs.VIPs = []netip.Addr{netip.MustParseAddr("192.0.2.1")}
	}
	if vs.Ports == (policy.PortRange{}) {
		vs.Ports = policy.PortRange{Lo: 80, Hi: 80}
	}
	cfg, err := policy.Compile(&policy.Config{Services: []*policy.VirtualServer{vs}, Balancer: s})
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Services[0], cfg.Balancer
}

func mustNew(t testing.TB, vs *policy.VirtualServer, s policy.BalancerSettings) *Balancer {
	t.Helper()
	b := New(compile(t, vs, s))
	return b
}

// countPicks picks n times at now, releasing each lease, and counts targets.
func countPicks(t testing.TB, b *Balancer, n int, now time.Time) map[string]int {
	t.Helper()
	got := map[string]int{}
	for i := range n {
		l, err := b.PickAction(now, mix(uint64(i)), nil, nil)
		if err != nil {
			t.Fatalf("pick %d: %v", i, err)
		}
		got[l.Name()]++
		l.Release()
	}
	return got
}

// checkShares asserts that counts follow weights within tol (relative to each
// expected count).
func checkShares(t *testing.T, got map[string]int, weights map[string]int, n int, tol float64) {
	t.Helper()
	total := 0
	for _, w := range weights {
		total += w
	}
	worst := 0.0
	for name, w := range weights {
		want := float64(n) * float64(w) / float64(total)
		if w == 0 {
			if got[name] != 0 {
				t.Errorf("%s: %d picks, want 0", name, got[name])
			}
			continue
		}
		d := math.Abs(float64(got[name])-want) / want
		worst = max(worst, d)
		if d > tol {
			t.Errorf("%s: %d picks, want %.0f (error %.2f%% > %.2f%%)", name, got[name], want, 100*d, 100*tol)
		}
	}
	t.Logf("%d picks over weights %v: worst error %.3f%% of a target's expected count", n, weights, 100*worst)
}

func TestDistributionFollowsEffectiveWeights(t *testing.T) {
	const n = 100000
	for _, algo := range []policy.Algorithm{policy.RoundRobin, policy.LeastConn, policy.Maglev} {
		for _, tc := range []struct {
			name    string
			specs   []string
			weights map[string]int // the configured ones
			changed map[string]int // SetWeights, then measure again
		}{
			{"equal", []string{"a", "b", "c", "d"}, map[string]int{"a": 1, "b": 1, "c": 1, "d": 1}, map[string]int{"a": 3, "b": 1, "c": 1, "d": 1}},
			{"5-3-1-1", []string{"a:5", "b:3", "c:1", "d:1"}, map[string]int{"a": 5, "b": 3, "c": 1, "d": 1}, map[string]int{"a": 2, "b": 3, "c": 0, "d": 5}},
			{"40 at 50%", []string{"a:40", "b:40"}, map[string]int{"a": 40, "b": 40}, map[string]int{"a": 20, "b": 40}},
			{"coprime", []string{"a:7", "b:11", "c:13"}, map[string]int{"a": 7, "b": 11, "c": 13}, map[string]int{"a": 13, "b": 11, "c": 7}},
		} {
			t.Run(algo.String()+"/"+tc.name, func(t *testing.T) {
				b := mustNew(t, makeVS(tc.specs...), policy.BalancerSettings{Algorithm: algo})
				tol := 0.01
				if algo == policy.Maglev {
					tol = 0.03 // hashing: shares follow slot counts, sampled
				}
				checkShares(t, countPicks(t, b, n, t0), tc.weights, n, tol)
				b.SetWeights(tc.changed)
				checkShares(t, countPicks(t, b, n, t0), tc.changed, n, tol)
			})
		}
	}
}

// TestFrequentWeightUpdates swaps tables (with the same and with changed
// weights) every few picks, far more often than a schedule cycle: the round
// robin must go on where it stopped, not restart and favour the first entries.
func TestFrequentWeightUpdates(t *testing.T) {
	b := mustNew(t, makeVS("a:1", "b:2", "c:3", "d:4"), policy.BalancerSettings{})
	weights := []map[string]int{
		{"a": 1, "b": 2, "c": 3, "d": 4},
		{"a": 2, "b": 4, "c": 6, "d": 8}, // same proportions, other schedule
	}
	got := map[string]int{}
	const n = 30000
	for i := range n / 3 {
		b.SetWeights(weights[i%2])
		for k, v := range countPicks(t, b, 3, t0) {
			got[k] += v
		}
	}
	checkShares(t, got, weights[0], n, 0.01)
}

func TestRoundRobinIsSmooth(t *testing.T) {
	b := mustNew(t, makeVS("a:5", "b:1", "c:1"), policy.BalancerSettings{})
	var seq []string
	for range 14 {
		l, err := b.PickAction(t0, 0, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		seq = append(seq, l.Name())
		l.Release()
	}
	if got, want := strings.Join(seq, ""), "aabacaaaabacaa"; got != want {
		t.Errorf("sequence %s, want %s (nginx's)", got, want)
	}

	// Every prefix of a cycle stays within one pick of proportional with
	// nginx's algorithm, within two with earliest-deadline-first; both give
	// each target exactly its weight per cycle.
	builders := []struct {
		name  string
		build func(w []int, total int) []uint32
		bound float64
	}{
		{"nginx", scheduleNginx, 1},
		{"edf", scheduleEDF, 2},
	}
	heavy := []int{1000}
	for range 40 {
		heavy = append(heavy, 1)
	}
	weightSets := [][]int{{5, 1, 1}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {100, 1, 1, 1, 1}, {97, 89, 3}, {0, 3, 0, 2}, heavy}
	rng := rand.New(rand.NewPCG(1, 2))
	for k := range 200 {
		n := 2 + rng.IntN(20)
		if k%50 == 0 {
			n = 300
		}
		ws := make([]int, n)
		for i := range ws {
			ws[i] = rng.IntN(50)
		}
		weightSets = append(weightSets, ws)
	}
	for _, bl := range builders {
		t.Run(bl.name, func(t *testing.T) {
			worst := 0.0
			for _, ws := range weightSets {
				total := 0
				for _, w := range ws {
					total += w
				}
				if total == 0 {
					continue
				}
				s := bl.build(ws, total)
				if len(s) != total {
					t.Fatalf("%v: schedule length %d, want %d", ws, len(s), total)
				}
				count := make([]int, len(ws))
				for k, i := range s {
					count[i]++
					for j, w := range ws {
						d := math.Abs(float64(count[j]) - float64((k+1)*w)/float64(total))
						worst = max(worst, d)
						if d > bl.bound {
							t.Fatalf("%v: target %d after %d picks: %d, %.2f from proportional (bound %.1f)", ws, j, k+1, count[j], d, bl.bound)
						}
					}
				}
				for j, w := range ws {
					if count[j] != w {
						t.Errorf("%v: target %d: %d entries, want %d", ws, j, count[j], w)
					}
				}
			}
			t.Logf("%s: worst prefix deviation %.3f picks over %d weight sets", bl.name, worst, len(weightSets))
		})
	}
	// Thousands of targets with large weights use the O(log n) builder.
	big := make([]int, 3000)
	for i := range big {
		big[i] = 10 + i%7
	}
	s := schedule(big)
	if e := scheduleEDF(reduceWeights(big), len(s)); len(s)*len(big) <= nginxBudget || !slices.Equal(s, e) {
		t.Errorf("3000 targets, %d entries: schedule did not use the EDF builder", len(s))
	}
}

func TestScheduleScalesHugeWeights(t *testing.T) {
	ws := []int{1 << 30, 1 << 29, 3, 0}
	s := schedule(ws)
	if len(s) > maxSchedule {
		t.Fatalf("schedule %d entries, over the cap %d", len(s), maxSchedule)
	}
	count := make([]int, len(ws))
	for _, i := range s {
		count[i]++
	}
	if r := float64(count[0]) / float64(count[1]); math.Abs(r-2) > 0.001 {
		t.Errorf("ratio %.4f, want 2", r)
	}
	if count[2] < 1 || count[3] != 0 {
		t.Errorf("small weight %d entries (want ≥ 1), zero weight %d (want 0)", count[2], count[3])
	}
}

func TestWeightZero(t *testing.T) {
	t.Run("no new connections while another primary can serve", func(t *testing.T) {
		b := mustNew(t, makeVS("a:1", "b:1", "c:1"), policy.BalancerSettings{})
		b.SetWeights(map[string]int{"c": 0})
		got := countPicks(t, b, 3000, t0)
		if got["c"] != 0 || got["a"] != 1500 || got["b"] != 1500 {
			t.Errorf("picks %v, want a and b 1500 each, c none", got)
		}
	})
	t.Run("others at limit: the cut primary serves", func(t *testing.T) {
		b := mustNew(t, makeVS("a:1:max=1", "c:1", "z:1:backup"), policy.BalancerSettings{})
		b.SetWeights(map[string]int{"c": 0})
		l, err := b.PickAction(t0, 0, nil, nil)
		if err != nil || l.Name() != "a" {
			t.Fatalf("first pick %q, %v; want a", l.Name(), err)
		}
		// a is full: c, cut to 0, is the only primary that can serve, and
		// a primary that can serve comes before the backups.
		for i := range 3 {
			if l, err := b.PickAction(t0, 0, nil, nil); err != nil || l.Name() != "c" {
				t.Fatalf("pick %d: %q, %v; want c", i, l.Name(), err)
			}
		}
	})
	t.Run("the other primary down: the cut primary serves", func(t *testing.T) {
		b := mustNew(t, makeVS("a:1", "c:1"), policy.BalancerSettings{RetryInterval: time.Minute})
		b.SetFractions(map[string]int{"c": 100}, nil)
		for i := range 4 {
			l, err := b.PickAction(t0, 0, nil, nil)
			if err != nil {
				t.Fatalf("pick %d: %v", i, err)
			}
			if l.Name() == "a" {
				l.Failed(t0)
				continue
			}
			if l.Name() != "c" {
				t.Fatalf("pick %d: %s", i, l.Name())
			}
		}
		if got := countPicks(t, b, 10, t0.Add(time.Second)); got["c"] != 10 {
			t.Errorf("a down: picks %v, want c 10", got)
		}
	})
	t.Run("all zero: balanced as equal", func(t *testing.T) {
		b := mustNew(t, makeVS("a:4", "b:2"), policy.BalancerSettings{})
		b.SetWeights(map[string]int{"a": 0, "b": 0})
		got := countPicks(t, b, 1000, t0)
		if got["a"] != 500 || got["b"] != 500 {
			t.Errorf("picks %v, want 500 each", got)
		}
	})
	t.Run("missing names revert to base weight", func(t *testing.T) {
		b := mustNew(t, makeVS("a:1", "b:1"), policy.BalancerSettings{})
		b.SetWeights(map[string]int{"a": 0, "nosuch": 5})
		b.SetWeights(map[string]int{"b": 3})
		got := countPicks(t, b, 400, t0)
		if got["a"] != 100 || got["b"] != 300 {
			t.Errorf("picks %v, want a 100, b 300", got)
		}
	})
}

func TestPickDoesNotAllocate(t *testing.T) {
	for _, algo := range []policy.Algorithm{policy.RoundRobin, policy.LeastConn, policy.Maglev} {
		for _, n := range []int{4, 100} {
			t.Run(fmt.Sprintf("%v/%d", algo, n), func(t *testing.T) {
				b := mustNew(t, benchVS(n), policy.BalancerSettings{Algorithm: algo, SlowStart: time.Minute})
				var h uint64
				allocs := testing.AllocsPerRun(1000, func() {
					h++
					l, err := b.PickAction(t0, mix(h), nil, nil)
					if err != nil {
						t.Fatal(err)
					}
					l.Release()
				})
				if allocs != 0 {
					t.Errorf("%v allocs per PickAction, want 0", allocs)
				}
				var tried Tried
				allocs = testing.AllocsPerRun(1000, func() {
					h++
					tried = Tried{}
					l, err := b.PickAction(t0, mix(h), nil, &tried)
					if err != nil {
						t.Fatal(err)
					}
					l.Release()
				})
				if allocs != 0 {
					t.Errorf("%v allocs per PickAction with a Tried, want 0", allocs)
				}
			})
		}
	}
}

// benchVS is n primaries with weights 1..4 and no limits.
func benchVS(n int) *policy.VirtualServer {
	vs := &policy.VirtualServer{Name: "bench"}
	for i := range n {
		vs.Targets = append(vs.Targets, &policy.Target{
			Name:   fmt.Sprintf("t%05d", i),
			Addr:   netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 80),
			Weight: 1 + i%4,
		})
	}
	return vs
}
