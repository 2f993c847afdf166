package balancer

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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
	b, err := New(compile(t, vs, s))
	if err != nil {
		t.Fatal(err)
	}
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

func TestBackupsOnlyWhenNoPrimaryCan(t *testing.T) {
	// Configured order interleaves roles on purpose: the roles decide.
	vs := makeVS("p1:1:max=1", "b1:1:backup:max=1", "p2:1:max=1", "b2:5:backup:max=2")
	b := mustNew(t, vs, policy.BalancerSettings{})
	var leases []Lease
	pick := func() string {
		l, err := b.PickAction(t0, 0, nil, nil)
		if err != nil {
			return "refused: " + err.Error()
		}
		leases = append(leases, l)
		return l.Name()
	}
	var got []string
	for range 6 {
		got = append(got, pick())
	}
	want := []string{"p1", "p2", "b1", "b2", "b2",
		"refused: all targets unavailable: p1 (at limit 1/1), p2 (at limit 1/1), b1 (at limit 1/1), b2 (at limit 2/2)"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("picks\n%q\nwant\n%q", got, want)
	}
	for _, l := range leases {
		if (l.Name()[0] == 'b') != l.Backup() {
			t.Errorf("%s: Backup() = %v", l.Name(), l.Backup())
		}
	}
	// A primary frees up: it is chosen again before the backups.
	leases[0].Release()
	if got := pick(); got != "p1" {
		t.Errorf("after p1 released: %s, want p1", got)
	}
	// A primary down and the others full: first backup with room, in order.
	leases[2].Release() // b1
	if got := pick(); got != "b1" {
		t.Errorf("after b1 released: %s, want b1", got)
	}
}

func TestMaxConnectionsUnderConcurrency(t *testing.T) {
	for _, algo := range []policy.Algorithm{policy.RoundRobin, policy.LeastConn, policy.Maglev} {
		t.Run(algo.String(), func(t *testing.T) {
			vs := makeVS("a:3:max=3", "b:1:max=4", "c:2:max=2", "z:1:backup:max=1")
			b := mustNew(t, vs, policy.BalancerSettings{Algorithm: algo})
			limit := map[string]int64{"a": 3, "b": 4, "c": 2, "z": 1}
			var live sync.Map // name → *atomic.Int64, counted independently of the balancer
			for name := range limit {
				live.Store(name, new(atomic.Int64))
			}
			var served, refused atomic.Int64
			var wg sync.WaitGroup
			var bad atomic.Value
			for g := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 2000 {
						l, err := b.PickAction(t0, mix(uint64(g*100000+i)), nil, nil)
						if err != nil {
							var nt *NoTargetError
							if !errors.As(err, &nt) {
								bad.Store(err.Error())
							}
							refused.Add(1)
							continue
						}
						c, _ := live.Load(l.Name())
						if n := c.(*atomic.Int64).Add(1); n > limit[l.Name()] {
							bad.Store(fmt.Sprintf("%s has %d open, limit %d", l.Name(), n, limit[l.Name()]))
						}
						served.Add(1)
						if i%3 == 0 {
							time.Sleep(time.Microsecond)
						}
						c.(*atomic.Int64).Add(-1)
						l.Release()
					}
				}()
			}
			wg.Wait()
			if v := bad.Load(); v != nil {
				t.Fatal(v)
			}
			for _, ts := range b.Snapshot(t0).Targets {
				if ts.Open != 0 {
					t.Errorf("%s: %d open after all released", ts.Name, ts.Open)
				}
			}
			t.Logf("served %d, refused %d", served.Load(), refused.Load())
		})
	}
}

// TestWebSphereSeed replays the WebSphere plug-in scenario: wasmember05 with
// MaxConnections 3 and wasmember06 with 4, 30 concurrent slow clients. At most
// 7 are served at once, the rest get the 503 reason naming both members at
// their limit, and each member serves again once its backlog drains.
func TestWebSphereSeed(t *testing.T) {
	vs := makeVS("wasmember05:1:max=3", "wasmember06:1:max=4")
	b := mustNew(t, vs, policy.BalancerSettings{})
	const clients = 30
	type result struct {
		l   Lease
		err error
	}
	results := make(chan result, clients)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			l, err := b.PickAction(t0, uint64(i), nil, nil)
			results <- result{l, err}
		}()
	}
	close(start)
	wg.Wait()
	close(results)
	var held []Lease
	perMember := map[string]int{}
	const reason = "all targets unavailable: wasmember05 (at limit 3/3), wasmember06 (at limit 4/4)"
	for r := range results {
		if r.err != nil {
			if r.err.Error() != reason {
				t.Errorf("refusal %q, want %q", r.err, reason)
			}
			continue
		}
		held = append(held, r.l)
		perMember[r.l.Name()]++
	}
	if len(held) != 7 || perMember["wasmember05"] != 3 || perMember["wasmember06"] != 4 {
		t.Fatalf("served %d (%v), want 7: 3 on wasmember05 and 4 on wasmember06", len(held), perMember)
	}
	st := b.Snapshot(t0)
	if st.Refused != clients-7 {
		t.Errorf("Refused = %d, want %d", st.Refused, clients-7)
	}
	for _, ts := range st.Targets {
		if ts.SkippedAtLimit == 0 {
			t.Errorf("%s: SkippedAtLimit 0, want the skips counted", ts.Name)
		}
	}
	// wasmember05 works off its backlog: it is back in business while
	// wasmember06 is still at its limit.
	for _, l := range held {
		if l.Name() == "wasmember05" {
			l.Release()
		}
	}
	for range 3 {
		l, err := b.PickAction(t0, 0, nil, nil)
		if err != nil || l.Name() != "wasmember05" {
			t.Fatalf("after wasmember05 drained: %q, %v", l.Name(), err)
		}
		l.Release()
	}
	// wasmember06 drains below 4: both serve again, interleaved.
	for _, l := range held {
		if l.Name() == "wasmember06" {
			l.Release()
		}
	}
	got := countPicks(t, b, 10, t0)
	if got["wasmember05"] != 5 || got["wasmember06"] != 5 {
		t.Errorf("after both drained: %v, want 5 each", got)
	}
}

func TestReloadCarriesStateOver(t *testing.T) {
	s := policy.BalancerSettings{RetryInterval: 5 * time.Second}
	b := mustNew(t, makeVS("a:1:max=2", "b:1", "c:1"), s)
	// a: two open connections; b: failed connect at t0 → down until 12:00:05.
	var la []Lease
	for len(la) < 2 {
		l, err := b.PickAction(t0, 0, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		switch l.Name() {
		case "a":
			la = append(la, l)
		case "b":
			l.Failed(t0)
		default:
			l.Release()
		}
	}
	b.SetWeights(map[string]int{"c": 3})

	// Reload: c removed, d added, a's limit unchanged, b's weight changed.
	vs2 := makeVS("a:1:max=2", "b:2", "d:1")
	if err := b.Update(compile(t, vs2, s)); err != nil {
		t.Fatal(err)
	}
	snap := map[string]TargetStatus{}
	for _, ts := range b.Snapshot(t0.Add(time.Second)).Targets {
		snap[ts.Name] = ts
	}
	if snap["a"].Open != 2 {
		t.Errorf("a: %d open after reload, want 2", snap["a"].Open)
	}
	if !snap["b"].Down || !snap["b"].DownUntil.Equal(t0.Add(5*time.Second)) {
		t.Errorf("b: down %v until %v after reload, want down until 12:00:05", snap["b"].Down, snap["b"].DownUntil)
	}
	if _, ok := snap["c"]; ok {
		t.Errorf("c still listed after reload removed it")
	}
	// Only d can serve (a full, b down) until b's retry interval passes.
	got := countPicks(t, b, 30, t0.Add(time.Second))
	if got["d"] != 30 {
		t.Errorf("while b down: %v, want all on d", got)
	}
	// Then b (weight 2) and d (weight 1) share what full a cannot take.
	got = countPicks(t, b, 30000, t0.Add(5*time.Second))
	checkShares(t, got, map[string]int{"a": 0, "b": 2, "d": 1}, 30000, 0.03)
	// Leases taken before the reload release into the carried-over count.
	for i := range la {
		la[i].Release()
		la[i].Release() // idempotent
	}
	if o := b.Snapshot(t0).Targets[0].Open; o != 0 {
		t.Errorf("a: %d open after release, want 0", o)
	}
}

func TestRemovedTargetKeepsCountUntilReleased(t *testing.T) {
	b := mustNew(t, makeVS("a:1:max=1", "b:1"), policy.BalancerSettings{})
	l, err := b.PickAction(t0, 0, nil, nil)
	if err != nil || l.Name() != "a" {
		t.Fatalf("pick %q, %v", l.Name(), err)
	}
	if err := b.Update(compile(t, makeVS("b:1"), policy.BalancerSettings{})); err != nil {
		t.Fatal(err)
	}
	// a comes back while its old connection is still open: still at its limit.
	if err := b.Update(compile(t, makeVS("a:1:max=1"), policy.BalancerSettings{})); err != nil {
		t.Fatal(err)
	}
	if _, err := b.PickAction(t0, 0, nil, nil); err == nil || !strings.Contains(err.Error(), "a (at limit 1/1)") {
		t.Errorf("pick with a's old connection open: %v, want a at limit", err)
	}
	l.Release()
	if l2, err := b.PickAction(t0, 0, nil, nil); err != nil || l2.Name() != "a" {
		t.Errorf("after release: %q, %v, want a", l2.Name(), err)
	}
}

func TestFailedAndRetry(t *testing.T) {
	s := policy.BalancerSettings{RetryInterval: 5 * time.Second, MaxAttempts: 3}
	b := mustNew(t, makeVS("a", "b", "c", "d", "z:1:backup"), s)
	var tried Tried
	var names []string
	for {
		l, err := b.PickAction(t0, 0, nil, &tried)
		if err != nil {
			want := "gave up after 3 attempts: a (down until 12:00:05), b (down until 12:00:05), c (down until 12:00:05)"
			if err.Error() != want {
				t.Errorf("error %q, want %q", err, want)
			}
			var nt *NoTargetError
			if !errors.As(err, &nt) || !nt.Exhausted || nt.Attempts != 3 {
				t.Errorf("error %#v, want exhausted after 3", err)
			}
			break
		}
		names = append(names, l.Name())
		l.Failed(t0)
		if l.Held() {
			t.Errorf("lease still held after Failed")
		}
	}
	if got := strings.Join(names, ","); got != "a,b,c" {
		t.Errorf("tried %s, want a,b,c", got)
	}
	// A new connection: a, b and c are down, d serves; then the backup.
	l, err := b.PickAction(t0.Add(time.Second), 0, nil, nil)
	if err != nil || l.Name() != "d" {
		t.Fatalf("pick: %q, %v; want d", l.Name(), err)
	}
	l.Failed(t0.Add(time.Second))
	l, err = b.PickAction(t0.Add(time.Second), 0, nil, nil)
	if err != nil || l.Name() != "z" || !l.Backup() {
		t.Fatalf("pick: %q, %v; want backup z", l.Name(), err)
	}
	l.Release()
	// Retry intervals over: all four are back.
	got := countPicks(t, b, 40, t0.Add(6*time.Second))
	if got["a"] != 10 || got["b"] != 10 || got["c"] != 10 || got["d"] != 10 {
		t.Errorf("after retry interval: %v", got)
	}
}

func TestPickExceptSkipsTriedButOthersMayServe(t *testing.T) {
	b := mustNew(t, makeVS("a:1:max=1", "b"), policy.BalancerSettings{MaxAttempts: 5})
	var tried Tried
	l1, err := b.PickAction(t0, 0, nil, &tried)
	if err != nil || l1.Name() != "a" {
		t.Fatalf("first: %q %v", l1.Name(), err)
	}
	l1.Release() // say the connection was reset: try another target
	l2, err := b.PickAction(t0, 0, nil, &tried)
	if err != nil || l2.Name() != "b" {
		t.Fatalf("second: %q %v", l2.Name(), err)
	}
	l2.Release()
	_, err = b.PickAction(t0, 0, nil, &tried)
	want := "all targets unavailable: a (already tried), b (already tried)"
	if err == nil || err.Error() != want {
		t.Errorf("third: %v, want %q", err, want)
	}
	if tried.Len() != 2 {
		t.Errorf("tried %d, want 2", tried.Len())
	}
}

func TestNoTargetErrorText(t *testing.T) {
	for _, tc := range []struct {
		name  string
		specs []string
		setup func(b *Balancer)
		want  string
	}{
		{"no targets", nil, func(*Balancer) {}, "all targets unavailable: no targets configured"},
		{"mixed", []string{"a:1:max=3", "b:1", "c:1:max=1"}, func(b *Balancer) {
			b.SetWeights(map[string]int{"c": 0})
			for range 3 {
				l, _ := b.PickAction(t0, 0, nil, nil)
				if l.Name() == "b" {
					l.Failed(t0)
				}
			}
			for range 3 {
				b.PickAction(t0, 0, nil, nil)
			}
		}, "all targets unavailable: a (at limit 3/3), b (down until 12:00:05), c (at limit 1/1)"},
		{"health", []string{"a"}, func(b *Balancer) {
			for range 3 {
				b.ReportHealth("a", false, t0)
			}
		}, "all targets unavailable: a (health check failed)"},
		{"many", []string{"t00:1:max=0", "t01", "t02", "t03", "t04", "t05", "t06", "t07", "t08", "t09", "t10", "t11", "t12", "t13", "t14", "t15", "t16", "t17"}, func(b *Balancer) {
			for range 18 {
				l, _ := b.PickAction(t0, 0, nil, nil)
				l.Failed(t0)
			}
		}, "all targets unavailable: t00 (down until 12:00:05), t01 (down until 12:00:05), t02 (down until 12:00:05), t03 (down until 12:00:05), t04 (down until 12:00:05), t05 (down until 12:00:05), t06 (down until 12:00:05), t07 (down until 12:00:05), t08 (down until 12:00:05), t09 (down until 12:00:05), t10 (down until 12:00:05), t11 (down until 12:00:05), t12 (down until 12:00:05), t13 (down until 12:00:05), t14 (down until 12:00:05), t15 (down until 12:00:05) and 2 more"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := mustNew(t, makeVS(tc.specs...), policy.BalancerSettings{RetryInterval: 5 * time.Second})
			tc.setup(b)
			_, err := b.PickAction(t0, 0, nil, nil)
			var nt *NoTargetError
			if !errors.As(err, &nt) {
				t.Fatalf("error %v, want *NoTargetError", err)
			}
			if err.Error() != tc.want {
				t.Errorf("error\n%q\nwant\n%q", err, tc.want)
			}
			if nt.Service != "vs" {
				t.Errorf("Service %q", nt.Service)
			}
		})
	}
}

// TestNewRejectsUncompiledSettings: the balancer does not repeat
// policy.Compile's defaults and checks (TestCompile in policy has them), but
// it refuses the settings its tried-set and down-marking cannot work with,
// and a refused Update leaves it as it was.
func TestNewRejectsUncompiledSettings(t *testing.T) {
	vs, ok := compile(t, makeVS("a"), policy.BalancerSettings{})
	for _, tc := range []struct {
		name string
		vs   *policy.VirtualServer
		s    policy.BalancerSettings
		want string
	}{
		{"nil", nil, ok, "nil virtual server"},
		{"zero settings", vs, policy.BalancerSettings{}, "not compiled"},
		{"attempts beyond the tried-set", vs, policy.BalancerSettings{MaxAttempts: MaxTried + 1, RetryInterval: time.Second}, "not compiled"},
		{"no retry interval", vs, policy.BalancerSettings{MaxAttempts: 3}, "not compiled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.vs, tc.s)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
	b := mustNew(t, makeVS("a"), policy.BalancerSettings{})
	if err := b.Update(makeVS("x"), policy.BalancerSettings{}); !errors.Is(err, ErrNotCompiled) {
		t.Fatalf("Update of uncompiled settings: %v", err)
	}
	if l, err := b.PickAction(t0, 0, nil, nil); err != nil || l.Name() != "a" {
		t.Errorf("after failed Update: %q %v", l.Name(), err)
	}
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
					t.Errorf("%v allocs per Pick, want 0", allocs)
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
					t.Errorf("%v allocs per PickExcept, want 0", allocs)
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

// TestSwapsDuringConcurrentPicks reloads and re-weights while goroutines pick
// and release: limits hold throughout and every count returns to zero.
func TestSwapsDuringConcurrentPicks(t *testing.T) {
	s := policy.BalancerSettings{}
	configs := []*policy.VirtualServer{
		makeVS("a:3:max=2", "b:1:max=3", "c:1", "z:1:backup:max=1"),
		makeVS("a:1:max=2", "b:5:max=3", "z:1:backup:max=1"), // c removed
		makeVS("b:1:max=3", "c:2", "a:1:max=2"),              // reordered, z removed
	}
	for i := range configs {
		configs[i], s = compile(t, configs[i], s)
	}
	limit := map[string]int64{"a": 2, "b": 3, "z": 1}
	b := mustNew(t, configs[0], s)
	var live sync.Map
	for _, name := range []string{"a", "b", "c", "z"} {
		live.Store(name, new(atomic.Int64))
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var bad atomic.Value
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				l, err := b.PickAction(t0, mix(uint64(g<<32|i)), nil, nil)
				if err != nil {
					continue
				}
				c, _ := live.Load(l.Name())
				if n := c.(*atomic.Int64).Add(1); limit[l.Name()] > 0 && n > limit[l.Name()] {
					bad.Store(fmt.Sprintf("%s: %d open, limit %d", l.Name(), n, limit[l.Name()]))
				}
				c.(*atomic.Int64).Add(-1)
				l.Release()
			}
		}()
	}
	for i := range 300 {
		if i%3 == 0 {
			if err := b.Update(configs[i/3%len(configs)], s); err != nil {
				t.Fatal(err)
			}
		} else {
			b.SetWeights(map[string]int{"a": i % 4, "b": 2, "c": i % 3})
		}
	}
	close(stop)
	wg.Wait()
	if v := bad.Load(); v != nil {
		t.Fatal(v)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for name, st := range b.states {
		if n := st.open.Load(); n != 0 {
			t.Errorf("%s: %d open after every lease was released", name, n)
		}
	}
}

func TestLeaseZeroAndAfterRelease(t *testing.T) {
	var zero Lease
	zero.Release()
	zero.Failed(t0)
	if zero.Held() || zero.Target() != nil || zero.Name() != "" || zero.Backup() {
		t.Errorf("zero lease: %+v", zero)
	}
	b := mustNew(t, makeVS("a:1:max=1"), policy.BalancerSettings{})
	l, err := b.PickAction(t0, 0, nil, nil)
	if err != nil || !l.Held() {
		t.Fatalf("pick: %v, held %v", err, l.Held())
	}
	l.Release()
	l.Failed(t0) // after Release: no-op, a stays up
	if l.Held() || l.Name() != "a" || l.Target().Name != "a" {
		t.Errorf("after release: held %v, name %q", l.Held(), l.Name())
	}
	if st := b.Snapshot(t0).Targets[0]; st.Open != 0 || st.Down || st.Failed != 0 {
		t.Errorf("after release and late Failed: %+v", st)
	}
}
