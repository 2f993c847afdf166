package balancer

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"weir/policy"
)

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
	b.Update(compile(t, vs2, s))
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
	b.Update(compile(t, makeVS("b:1"), policy.BalancerSettings{}))
	// a comes back while its old connection is still open: still at its limit.
	b.Update(compile(t, makeVS("a:1:max=1"), policy.BalancerSettings{}))
	if _, err := b.PickAction(t0, 0, nil, nil); err == nil || !strings.Contains(err.Error(), "a (at limit 1/1)") {
		t.Errorf("pick with a's old connection open: %v, want a at limit", err)
	}
	l.Release()
	if l2, err := b.PickAction(t0, 0, nil, nil); err != nil || l2.Name() != "a" {
		t.Errorf("after release: %q, %v, want a", l2.Name(), err)
	}
}

// TestUncompiledAttemptsStayBounded: the balancer does not repeat
// policy.Compile's defaults and checks (TestCompile in policy has them), and
// building or reloading one cannot fail; a MaxAttempts outside 1..MaxTried
// (which Compile refuses) is held to it, so that a connection's retries end
// even where no failed target is marked down (no retry interval) and there
// are more targets than the tried-set holds.
func TestUncompiledAttemptsStayBounded(t *testing.T) {
	names := make([]string, MaxTried+4)
	for i := range names {
		names[i] = fmt.Sprintf("t%d", i)
	}
	vs, _ := compile(t, makeVS(names...), policy.BalancerSettings{})
	for _, tc := range []struct {
		attempts, want int
	}{{0, 1}, {-3, 1}, {MaxTried + 5, MaxTried}, {2, 2}} {
		b := New(vs, policy.BalancerSettings{MaxAttempts: tc.attempts})
		var tried Tried
		n := 0
		for ; n < 3*MaxTried; n++ {
			l, err := b.PickAction(t0, 0, nil, &tried)
			if err != nil {
				var nt *NoTargetError
				if !errors.As(err, &nt) || !nt.Exhausted {
					t.Errorf("maxAttempts %d: after %d attempts %v, want the attempts used up", tc.attempts, n, err)
				}
				break
			}
			l.Failed(t0)
		}
		if n != tc.want {
			t.Errorf("maxAttempts %d: %d attempts, want %d", tc.attempts, n, tc.want)
		}
		b.Update(vs, policy.BalancerSettings{MaxAttempts: 1}) // a reload of the same, uncompiled: no error to return
	}
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
			b.Update(configs[i/3%len(configs)], s)
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
