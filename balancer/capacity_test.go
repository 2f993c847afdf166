package balancer

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"weir/policy"
)

// TestCapacityShare: a target's share of a cluster-wide MaxConnections
// bounds its picks below Max, is counted as SkippedAtShare (not
// SkippedAtLimit), names the share in the refusal, and a share shrunk
// under concurrent picks is bounded by the count SetCapacity returns.
func TestCapacityShare(t *testing.T) {
	for _, algo := range []policy.Algorithm{policy.RoundRobin, policy.LeastConn, policy.Maglev} {
		t.Run(algo.String(), func(t *testing.T) {
			b := mustNew(t, makeVS("a:1:max=4"), policy.BalancerSettings{Algorithm: algo})
			b.SetDefaultCapacity(0)
			if _, err := b.PickAction(t0, 1, nil, nil); err == nil {
				t.Fatal("picked a target at share 0")
			} else if !strings.Contains(err.Error(), "a (at share 0/0 of cluster-wide limit 4)") {
				t.Errorf("refusal %q", err)
			}
			if open, ok := b.SetCapacity("a", 2); !ok || open != 0 {
				t.Fatalf("SetCapacity: %d %v", open, ok)
			}
			if _, ok := b.SetCapacity("nope", 2); ok {
				t.Error("SetCapacity of an unknown target")
			}
			var ls []Lease
			for i := range 3 {
				l, err := b.PickAction(t0, uint64(i), nil, nil)
				if err == nil {
					ls = append(ls, l)
				}
			}
			ts := b.Snapshot(t0).Targets[0]
			if len(ls) != 2 || ts.Capacity != 2 || ts.SkippedAtShare == 0 || ts.SkippedAtLimit != 0 {
				t.Errorf("share 2: %d picked, %+v", len(ls), ts)
			}
			// Max still bounds a larger share; no share: Max alone.
			b.SetCapacity("a", 10)
			for i := range 4 {
				if l, err := b.PickAction(t0, uint64(i), nil, nil); err == nil {
					ls = append(ls, l)
				}
			}
			if len(ls) != 4 {
				t.Errorf("share 10 of max 4: %d open", len(ls))
			}
			_, err := b.PickAction(t0, 9, nil, nil)
			var nt *NoTargetError
			if !errors.As(err, &nt) || nt.Reasons[0].Shared || !strings.Contains(err.Error(), "at limit 4/4") {
				t.Errorf("at max under a larger share: %v", err)
			}
			for i := range ls {
				ls[i].Release()
			}
			b.SetCapacity("a", -1)
			if ts := b.Snapshot(t0).Targets[0]; ts.Capacity != -1 {
				t.Errorf("share removed: %+v", ts)
			}

			// Shrinking under concurrent picks: after SetCapacity(1)
			// returned open, no more than max(1, open) are ever held.
			b.SetCapacity("a", 4)
			var held, peak atomic.Int64
			var bound atomic.Int64
			bound.Store(4)
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
						l, err := b.PickAction(t0, mix(uint64(g<<20|i)), nil, nil)
						if err != nil {
							continue
						}
						bd := bound.Load()
						if n := held.Add(1); n > bd {
							bad.Store(n)
						}
						for p := peak.Load(); held.Load() > p && !peak.CompareAndSwap(p, held.Load()); p = peak.Load() {
						}
						held.Add(-1)
						l.Release()
					}
				}()
			}
			for range 200 {
				open, _ := b.SetCapacity("a", 1)
				// Slots reserved under the old share are in open; new ones
				// see the share of 1.
				bound.Store(max(open, 1) + 0)
				b.SetCapacity("a", 4)
				bound.Store(4)
			}
			close(stop)
			wg.Wait()
			if v := bad.Load(); v != nil {
				t.Errorf("%v held over the bound", v)
			}
			if ts := b.Snapshot(t0).Targets[0]; ts.Open != 0 {
				t.Errorf("%d open after all released", ts.Open)
			}
		})
	}
}

// TestCapacityDefaultForNewTargets: a target added by a reload starts at
// the default share.
func TestCapacityDefaultForNewTargets(t *testing.T) {
	b := mustNew(t, makeVS("a:1:max=4"), policy.BalancerSettings{})
	b.SetDefaultCapacity(0)
	vs, s := compile(t, makeVS("a:1:max=4", "b:1:max=2"), policy.BalancerSettings{})
	b.Update(vs, s)
	for _, ts := range b.Snapshot(t0).Targets {
		if ts.Capacity != 0 {
			t.Errorf("%s: capacity %d, want the default 0", ts.Name, ts.Capacity)
		}
	}
	if _, err := b.PickAction(t0, 1, nil, nil); err == nil {
		t.Error("picked at share 0")
	}
}

// TestMarkDown: a down-state another instance saw keeps the target out
// until its end, never shortens a longer one, and names an unknown target.
func TestMarkDown(t *testing.T) {
	b := mustNew(t, makeVS("a", "b"), policy.BalancerSettings{})
	if !b.MarkDown("a", t0.Add(5*time.Second)) || b.MarkDown("nope", t0) {
		t.Fatal("MarkDown: wrong ok")
	}
	b.MarkDown("a", t0.Add(time.Second)) // shorter: ignored
	for i := range 20 {
		l, err := b.PickAction(t0.Add(4*time.Second), uint64(i), nil, nil)
		if err != nil || l.Name() != "b" {
			t.Fatalf("pick %d while a is down: %v %v", i, l.Name(), err)
		}
		l.Release()
	}
	if ts := b.Snapshot(t0).Targets[0]; !ts.Down || !ts.DownUntil.Equal(t0.Add(5*time.Second)) {
		t.Errorf("a: %+v", ts)
	}
	if ts := b.Snapshot(t0.Add(6 * time.Second)).Targets[0]; ts.Down {
		t.Errorf("a still down after its retry interval: %+v", ts)
	}
}
