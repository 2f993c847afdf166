package balancer

import (
	"fmt"
	"testing"
	"time"

	"weir/policy"
)

// TestExactWeights: the balancer balances on policy.ExactWeight, so small
// weights are cut exactly: weight 1 at 25 % gets ¾ of an uncut weight-1
// target's share (today's rounding kept it at 1), and weight 2 at 25 % is
// 1.5, not 1.
func TestExactWeights(t *testing.T) {
	for _, algo := range []policy.Algorithm{policy.RoundRobin, policy.LeastConn, policy.Maglev} {
		for _, tc := range []struct {
			specs      []string
			fractions  map[string]int
			n          int
			want       map[string]int // exact for round robin
			tolPercent float64        // for the others
		}{
			{[]string{"a:1", "b:1"}, map[string]int{"b": 25}, 70000, map[string]int{"a": 40000, "b": 30000}, 2},
			{[]string{"a:2", "b:2"}, map[string]int{"b": 25}, 70000, map[string]int{"a": 40000, "b": 30000}, 2},
			{[]string{"a:1", "b:1"}, map[string]int{"b": 95}, 21000, map[string]int{"a": 20000, "b": 1000}, 15},
			{[]string{"a:40", "b:40"}, map[string]int{"b": 50}, 30000, map[string]int{"a": 20000, "b": 10000}, 2},
		} {
			t.Run(fmt.Sprintf("%v/%v/%v", algo, tc.specs, tc.fractions), func(t *testing.T) {
				b := mustNew(t, makeVS(tc.specs...), policy.BalancerSettings{Algorithm: algo})
				b.SetFractions(tc.fractions, nil)
				got := countPicks(t, b, tc.n, t0)
				t.Logf("%v at %v: %v of %d picks (share of b / share of a = %.4f)", tc.specs, tc.fractions, got, tc.n, float64(got["b"])/float64(got["a"]))
				for name, want := range tc.want {
					if algo == policy.RoundRobin {
						if got[name] != want {
							t.Errorf("%s: %d picks, want exactly %d", name, got[name], want)
						}
						continue
					}
					if d := 100 * float64(got[name]-want) / float64(want); d > tc.tolPercent || d < -tc.tolPercent {
						t.Errorf("%s: %d picks, want %d ± %.0f %%", name, got[name], want, tc.tolPercent)
					}
				}
			})
		}
	}
}

// TestPickActionLevels: each service level is balanced on its own
// fractions; a connection under no action, or under an action without
// weights of its own, on the default level's.
func TestPickActionLevels(t *testing.T) {
	b := mustNew(t, makeVS("a:1", "b:1"), policy.BalancerSettings{})
	b.SetFractions(map[string]int{"a": 50}, map[string]map[string]int{"gold": {"a": 100}, "silver": {"b": 75}})
	gold, silver, other := &policy.Action{Name: "gold"}, &policy.Action{Name: "silver"}, &policy.Action{Name: "bronze"}
	count := func(a *policy.Action, n int) map[string]int {
		got := map[string]int{}
		for i := range n {
			l, err := b.PickAction(t0, mix(uint64(i)), a, nil)
			if err != nil {
				t.Fatal(err)
			}
			got[l.Name()]++
			l.Release()
		}
		return got
	}
	if got := count(gold, 100); got["a"] != 0 || got["b"] != 100 {
		t.Errorf("gold (a at 100 %%): %v, want b only", got)
	}
	if got := count(silver, 500); got["a"] != 400 || got["b"] != 100 {
		t.Errorf("silver (b at 75 %%): %v, want a 400 b 100", got)
	}
	if got := count(nil, 300); got["a"] != 100 || got["b"] != 200 {
		t.Errorf("no action (a at 50 %%): %v, want a 100 b 200", got)
	}
	if got := count(other, 300); got["a"] != 100 || got["b"] != 200 {
		t.Errorf("action without weights: %v, want the default level's a 100 b 200", got)
	}
	st := b.Snapshot(t0)
	if a := st.Targets[0]; a.Exact != 0.5 || a.Levels["gold"] != 0 || a.Levels["silver"] != 1 || a.Effective != 1 {
		t.Errorf("snapshot of a: %+v", a)
	}
	// A reload keeps the levels of targets whose base did not change.
	vs := makeVS("a:1", "b:3")
	b.Update(compile(t, vs, policy.BalancerSettings{}))
	if got := count(gold, 100); got["a"] != 0 {
		t.Errorf("gold after reload: %v, want a still cut", got)
	}
	// SetWeights drops the levels.
	b.SetWeights(nil)
	if got := count(gold, 400); got["a"] != 100 || got["b"] != 300 {
		t.Errorf("gold after SetWeights(nil): %v, want base weights", got)
	}
	if n := testing.AllocsPerRun(1000, func() {
		l, _ := b.PickAction(t0, 1, silver, nil)
		l.Release()
	}); n != 0 {
		t.Errorf("PickAction allocates %.1f times", n)
	}
}

// TestDrainingPrimaries: a target configured with weight 0 is draining, as
// HAProxy's weight 0: it takes no new connection, not even when every
// other target is full (a weight-0 primary with a full backup took 4 of 5),
// and the refusal says why.
func TestDrainingPrimaries(t *testing.T) {
	b := mustNew(t, makeVS("p1:0", "p2:0", "z:1:backup:max=2", "y:0:backup"), policy.BalancerSettings{})
	var held []Lease
	for i := range 2 {
		l, err := b.PickAction(t0, uint64(i), nil, nil)
		if err != nil || l.Name() != "z" {
			t.Fatalf("pick %d: %q %v, want the backup z", i, l.Name(), err)
		}
		held = append(held, l)
	}
	for i := range 3 {
		l, err := b.PickAction(t0, uint64(i), nil, nil)
		if err == nil {
			t.Fatalf("backup full: %q took a new connection, want a refusal", l.Name())
		}
		const want = "all targets unavailable: p1 (draining (weight 0)), p2 (draining (weight 0)), z (at limit 2/2), y (draining (weight 0))"
		if err.Error() != want {
			t.Errorf("refusal %q, want %q", err, want)
		}
	}
	for i := range held {
		held[i].Release()
	}
	// QoS weights do not revive a draining target.
	b.SetWeights(map[string]int{"p1": 5, "y": 5})
	if got := countPicks(t, b, 10, t0); got["z"] != 10 {
		t.Errorf("after SetWeights: %v, want z 10", got)
	}
}

// TestSoleDrainingTarget: a sole weight-0 target took 5 of 5; it takes 0.
func TestSoleDrainingTarget(t *testing.T) {
	for _, algo := range []policy.Algorithm{policy.RoundRobin, policy.LeastConn, policy.Maglev} {
		b := mustNew(t, makeVS("a:0"), policy.BalancerSettings{Algorithm: algo})
		for i := range 5 {
			if l, err := b.PickAction(t0, uint64(i), nil, nil); err == nil {
				l.Release()
				t.Fatalf("%v: the draining sole target took connection %d", algo, i+1)
			}
		}
	}
}

// TestSkippedAtLimitCountsPicks: a target found at its limit is counted
// once per pick, however many probes looked at it.
func TestSkippedAtLimitCountsPicks(t *testing.T) {
	for _, algo := range []policy.Algorithm{policy.RoundRobin, policy.LeastConn, policy.Maglev} {
		t.Run(algo.String(), func(t *testing.T) {
			b := mustNew(t, makeVS("a:1:max=1", "z:1:backup"), policy.BalancerSettings{Algorithm: algo})
			l, err := b.PickAction(t0, 0, nil, nil)
			if err != nil || l.Name() != "a" {
				t.Fatalf("first pick %q %v", l.Name(), err)
			}
			defer l.Release()
			got := countPicks(t, b, 10, t0.Add(time.Millisecond))
			if got["z"] != 10 {
				t.Fatalf("picks %v", got)
			}
			if s := b.Snapshot(t0).Targets[0].SkippedAtLimit; s != 10 {
				t.Errorf("SkippedAtLimit %d after 10 picks passed a over, want 10", s)
			}
		})
	}
}
