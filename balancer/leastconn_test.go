package balancer

import (
	"fmt"
	"testing"

	"weir/policy"
)

func TestLeastConnExact(t *testing.T) {
	b := mustNew(t, makeVS("a:2", "b:1", "c:1"), policy.BalancerSettings{Algorithm: policy.LeastConn})
	var held []Lease
	open := map[string]int{}
	for i := range 40 {
		l, err := b.PickAction(t0, 0, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
		open[l.Name()]++
		// open/weight never differs by more than one connection's worth.
		if i%4 == 3 && (open["a"] != 2*open["b"] || open["b"] != open["c"]) {
			t.Fatalf("after %d picks: %v, want a twice b, b equal c", i+1, open)
		}
	}
	// Connections on a close: a gets the next ones until it catches up.
	for _, l := range held {
		if l.Name() == "a" && open["a"] > 14 {
			l.Release()
			open["a"]--
		}
	}
	for range 6 {
		l, err := b.PickAction(t0, 0, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if l.Name() != "a" {
			t.Errorf("picked %s with a at %d, b and c at 10; want a", l.Name(), open["a"])
		}
		open[l.Name()]++
	}
}

// TestLeastConnManyTargets uses the power-of-two-choices path (more than
// lcExact primaries): a target that already carries connections from before a
// reload gets no new ones until the others catch up, and the rest stay even.
func TestLeastConnManyTargets(t *testing.T) {
	const n = 100
	specs := make([]string, n)
	for i := range specs {
		specs[i] = fmt.Sprintf("t%03d", i)
	}
	s := policy.BalancerSettings{Algorithm: policy.LeastConn}
	b := mustNew(t, makeVS(specs[0]), s)
	for range 20 {
		if _, err := b.PickAction(t0, 0, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	b.Update(compile(t, makeVS(specs...), s))
	for i := range 1000 {
		if _, err := b.PickAction(t0, mix(uint64(i)), nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	lo, hi := int64(1<<62), int64(0)
	for _, ts := range b.Snapshot(t0).Targets {
		if ts.Name == "t000" {
			if ts.Open != 20 {
				t.Errorf("t000: %d open, want the 20 it had (no new ones)", ts.Open)
			}
			continue
		}
		lo, hi = min(lo, ts.Open), max(hi, ts.Open)
	}
	t.Logf("others: open between %d and %d (mean 10.1)", lo, hi)
	if lo < 8 || hi > 12 {
		t.Errorf("others: open between %d and %d, want within 10 ± 2", lo, hi)
	}
}
