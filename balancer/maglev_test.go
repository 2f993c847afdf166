package balancer

import (
	"fmt"
	"slices"
	"testing"

	"weir/policy"
)

func TestMaglevSizesArePrime(t *testing.T) {
	for _, m := range maglevSizes {
		for d := 2; d*d <= m; d++ {
			if m%d == 0 {
				t.Errorf("%d is divisible by %d", m, d)
				break
			}
		}
	}
	for _, tc := range []struct{ n, want int }{{1, 65537}, {100, 65537}, {655, 65537}, {656, 262147}, {10000, 1048583}, {100000, 4194319}} {
		if got := maglevSize(tc.n); got != tc.want {
			t.Errorf("maglevSize(%d) = %d, want %d", tc.n, got, tc.want)
		}
	}
}

func maglevNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("backend-%03d", i)
	}
	return names
}

func ones(n int) []int {
	ws := make([]int, n)
	for i := range ws {
		ws[i] = 1
	}
	return ws
}

// TestMaglevBalance checks the paper's bound: with equal weights each of N
// targets owns ⌊M/N⌋ or ⌈M/N⌉ of the M slots.
func TestMaglevBalance(t *testing.T) {
	for _, n := range []int{3, 100, 1000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			m := 65537
			tab := buildMaglev(maglevNames(n), ones(n), m)
			count := make([]int, n)
			for _, x := range tab {
				count[x]++
			}
			lo, hi := slices.Min(count), slices.Max(count)
			mean := float64(m) / float64(n)
			t.Logf("M=%d N=%d: slots per target min %d max %d mean %.2f (max/mean %.4f, min/mean %.4f)",
				m, n, lo, hi, mean, float64(hi)/mean, float64(lo)/mean)
			if lo < m/n || hi > (m+n-1)/n {
				t.Errorf("slots per target in [%d, %d], want within [⌊M/N⌋, ⌈M/N⌉] = [%d, %d]", lo, hi, m/n, (m+n-1)/n)
			}
		})
	}
}

func TestMaglevWeighted(t *testing.T) {
	ws := []int{1, 2, 3, 4}
	tab := buildMaglev(maglevNames(4), ws, 65537)
	count := make([]int, 4)
	for _, x := range tab {
		count[x]++
	}
	for i, w := range ws {
		want := 65537 * w / 10
		if d := count[i] - want; d < -4 || d > 4 {
			t.Errorf("target %d (weight %d): %d slots, want %d ± 4", i, w, count[i], want)
		}
	}
}

// TestMaglevDisruption removes one of 100 targets and counts how many of the
// 65537 slots change target. The removed target's own ≈1 % must move; the
// paper's point is that few others do.
func TestMaglevDisruption(t *testing.T) {
	const n, m = 100, 65537
	names := maglevNames(n)
	before := buildMaglev(names, ones(n), m)
	for _, gone := range []int{0, 37, 99} {
		t.Run(names[gone], func(t *testing.T) {
			rest := slices.Delete(slices.Clone(names), gone, gone+1)
			after := buildMaglev(rest, ones(n-1), m)
			own, moved := 0, 0
			for s := range m {
				was := names[before[s]]
				if was == names[gone] {
					own++
					continue
				}
				if rest[after[s]] != was {
					moved++
				}
			}
			total := float64(own+moved) / m
			extra := float64(moved) / m
			t.Logf("removing %s: its own slots %.3f %%, other slots moved %.3f %%, total %.3f %%",
				names[gone], 100*float64(own)/m, 100*extra, 100*total)
			// The removed target's share is 1 %; allow at most as much again
			// of disruption to other flows.
			if extra > 0.01 || total > 0.02 {
				t.Errorf("disruption %.3f %% of other slots (total %.3f %%), want ≤ 1 %% (≤ 2 %%)", 100*extra, 100*total)
			}
		})
	}
}

func TestMaglevAffinityAndOrderIndependence(t *testing.T) {
	s := policy.BalancerSettings{Algorithm: policy.Maglev}
	b1 := mustNew(t, makeVS("a", "b", "c", "d"), s)
	b2 := mustNew(t, makeVS("d", "c", "b", "a"), s) // another instance, another order
	for h := range uint64(10000) {
		h := mix(h)
		l1, err1 := b1.PickAction(t0, h, nil, nil)
		l2, err2 := b2.PickAction(t0, h, nil, nil)
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		again, _ := b1.PickAction(t0, h, nil, nil)
		if l1.Name() != l2.Name() || again.Name() != l1.Name() {
			t.Fatalf("flow %x: %s, %s on the other instance, %s again", h, l1.Name(), l2.Name(), again.Name())
		}
		l1.Release()
		l2.Release()
		again.Release()
	}
}

func TestMaglevFallsBackWhenFullOrDown(t *testing.T) {
	b := mustNew(t, makeVS("a:1:max=1", "b", "c"), policy.BalancerSettings{Algorithm: policy.Maglev})
	// Find a flow that maps to a, and one that maps to b.
	var fa, fb uint64
	var hold Lease
	for h := uint64(1); fa == 0 || fb == 0; h++ {
		l, err := b.PickAction(t0, mix(h), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case l.Name() == "a" && fa == 0:
			fa, hold = mix(h), l
			continue
		case l.Name() == "b" && fb == 0:
			fb = mix(h)
		}
		l.Release()
	}
	// a is full: its flow goes elsewhere, b's flow stays on b.
	l, err := b.PickAction(t0, fa, nil, nil)
	if err != nil || l.Name() == "a" {
		t.Errorf("flow of full a: %q %v, want another target", l.Name(), err)
	}
	l.Release()
	if l, _ := b.PickAction(t0, fb, nil, nil); l.Name() != "b" {
		t.Errorf("flow of b moved to %q while a was full", l.Name())
	} else {
		l.Release()
	}
	// Down: b fails, its flow moves; after the retry interval it is back.
	l, _ = b.PickAction(t0, fb, nil, nil)
	l.Failed(t0)
	if l, _ := b.PickAction(t0, fb, nil, nil); l.Name() == "b" {
		t.Errorf("flow went to b while b is down")
	}
	hold.Release()
	if l, _ := b.PickAction(t0, fa, nil, nil); l.Name() != "a" {
		t.Errorf("flow of a went to %q after a had room again", l.Name())
	}
	if l, _ := b.PickAction(t0.Add(policy.DefaultRetryInterval), fb, nil, nil); l.Name() != "b" {
		t.Errorf("flow of b went to %q after b's retry interval", l.Name())
	}
}
