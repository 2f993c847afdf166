package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"weir/balancer"
	"weir/internal/testutil"
	"weir/policy"
)

// balTargets is cluster.Targets over one real balancer, as the appliance
// implements it over its balancers.
type balTargets struct {
	service string
	b       *balancer.Balancer
}

func (bt balTargets) TargetLimits() []TargetLimit {
	var out []TargetLimit
	for _, t := range bt.b.Snapshot(time.Now()).Targets {
		if t.Max > 0 {
			out = append(out, TargetLimit{Service: bt.service, Target: t.Name, Max: t.Max, Open: t.Open, Refused: t.SkippedAtShare})
		}
	}
	return out
}

func (bt balTargets) SetTargetCapacity(service, target string, c int64) (int64, bool) {
	if service != bt.service {
		return 0, false
	}
	return bt.b.SetCapacity(target, c)
}

func (bt balTargets) SetDefaultTargetCapacity(c int64) { bt.b.SetDefaultCapacity(c) }

// targetNode is an instance whose service "web" has no connection limit of
// its own and one target "app" with maxConnections max, balanced by a
// real balancer whose target slots the cluster leases.
type targetNode struct {
	id  string
	b   *balancer.Balancer
	c   *Cluster
	adm *policy.Admission
}

func newTargetNode(t *testing.T, redisAddr, id string, max int64) *targetNode {
	t.Helper()
	cfg, err := policy.Compile(&policy.Config{
		Services: []*policy.VirtualServer{{
			Name: "web", VIPs: []netip.Addr{netip.MustParseAddr("198.18.0.1")}, Ports: policy.PortRange{Lo: 80, Hi: 80},
			Targets: []*policy.Target{{Name: "app", Addr: netip.MustParseAddrPort("198.18.1.1:80"), Weight: 1, MaxConnections: max}},
		}},
		// A borrow waits for the others' renewals: on a loaded test
		// machine longer than the default 20 ms (the most allowed here,
		// half the interval).
		Cluster: &policy.Cluster{Redis: redisAddr, Name: "test", Instance: id, LeaseInterval: interval, BorrowTimeout: interval / 2},
	})
	if err != nil {
		t.Fatal(err)
	}
	b := balancer.New(cfg.Services[0], cfg.Balancer)
	n := &targetNode{id: id, b: b, adm: policy.NewAdmission(cfg, 0)}
	n.c, err = New(Options{Config: *cfg.Cluster, Admission: n.adm, Targets: balTargets{"web", b}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.c.Loop(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		n.c.Close()
	})
	return n
}

func (n *targetNode) level() Level {
	for _, l := range n.c.Status().Levels {
		if l.Target == "app" {
			return l
		}
	}
	return Level{Share: -2}
}

// TestTargetLimitClusterWide: a target's maxConnections of 4 is leased
// like a level's: three instances with 6 clients each picking it never
// hold more than 4 connections to it together, and use them (4 at a
// time); Status lists the target.
func TestTargetLimitClusterWide(t *testing.T) {
	r := startRedis(t)
	var nodes []*targetNode
	for _, id := range []string{"a", "b", "c"} {
		nodes = append(nodes, newTargetNode(t, r.Addr(), id, 4))
	}
	var open, peak, picked atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, n := range nodes {
		for g := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := uint64(0); ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					l, err := n.b.PickAction(time.Now(), i<<8|uint64(g), nil, nil)
					if err != nil {
						time.Sleep(time.Millisecond)
						continue
					}
					picked.Add(1)
					o := open.Add(1)
					for p := peak.Load(); o > p && !peak.CompareAndSwap(p, o); p = peak.Load() {
					}
					time.Sleep(3 * time.Millisecond)
					open.Add(-1)
					l.Release()
				}
			}()
		}
	}
	var atFour bool
	testutil.WithinEvery(3*time.Second, time.Millisecond, func() bool {
		atFour = atFour || open.Load() == 4
		return false
	})
	close(stop)
	wg.Wait()
	if p := peak.Load(); p > 4 {
		t.Errorf("%d connections open to the target over the cluster, maxConnections 4", p)
	}
	if !atFour {
		t.Errorf("never 4 connections open to the target under demand (peak %d)", peak.Load())
	}
	for _, n := range nodes {
		l := n.level()
		if l.Name != "web" || l.Limit != 4 || l.Held > 4 || l.Share > 4 {
			t.Errorf("%s: %+v", n.id, l)
		}
	}
	var refusal string
	for _, n := range nodes {
		n.b.SetCapacity("app", 0)
		if _, err := n.b.PickAction(time.Now(), 1, nil, nil); err != nil {
			refusal = err.Error()
		}
	}
	if !strings.Contains(refusal, "of cluster-wide limit 4") {
		t.Errorf("refusal %q does not name the share", refusal)
	}
	t.Logf("peak %d, %d picks in 3 s", peak.Load(), picked.Load())
}

// threeAtThree starts three instances sharing a target's maxConnections
// of 9 and waits until each sees the three and holds its even part, 3.
func threeAtThree(t *testing.T) []*targetNode {
	t.Helper()
	r := startRedis(t)
	var nodes []*targetNode
	for _, id := range []string{"a", "b", "c"} {
		nodes = append(nodes, newTargetNode(t, r.Addr(), id, 9))
	}
	eventually(t, 5*time.Second, func() bool {
		for _, n := range nodes {
			if len(n.c.Status().Members) != 3 || n.level().Share != 3 {
				return false
			}
		}
		return true
	}, func() string {
		return fmt.Sprintf("shares %d %d %d", nodes[0].level().Share, nodes[1].level().Share, nodes[2].level().Share)
	})
	return nodes
}

// TestTargetSharesLikeLevels: a target's maxConnections gets what an
// enforced level gets. Three instances, maxConnections 9: each holds its
// even part, 3, from the renewal that first sees the three (before any
// demand); 9 connections at one instance are all picked once the idle
// two gave their parts back (a pick that finds the target at its share
// is counted and renews early, which nudges them); closed, the slots go
// back: an idle member is at its part again after at most two of its
// renewals (the one that sees it short, and the nudged one).
func TestTargetSharesLikeLevels(t *testing.T) {
	nodes := threeAtThree(t)
	a := nodes[0]
	var leases []balancer.Lease
	start := time.Now()
	atShare := 0
	if !testutil.WithinEvery(10*time.Second, time.Millisecond, func() bool {
		for len(leases) < 9 {
			l, err := a.b.PickAction(time.Now(), uint64(len(leases)), nil, nil)
			if err != nil {
				atShare++
				return false
			}
			leases = append(leases, l)
		}
		return true
	}) {
		t.Fatalf("a holds %d of the 9 slots 10 s after its demand appeared (share %d)", len(leases), a.level().Share)
	}
	took := time.Since(start)
	for _, n := range nodes[1:] {
		if l := n.level(); l.Share != 0 {
			t.Errorf("%s holds a share of %d while a has 9 open", n.id, l.Share)
		}
	}
	renewed := nodes[1].c.Status().Renewals
	for _, l := range leases {
		l.Release()
	}
	eventually(t, 10*time.Second, func() bool { return nodes[1].level().Share == 3 }, func() string { return fmt.Sprintf("b %+v", nodes[1].level()) })
	back := nodes[1].c.Status().Renewals - renewed
	t.Logf("9 picks at a: all open %v after the first (%d picks found the target at its share meanwhile); closed, b at its part again after %d of its renewals",
		took.Round(time.Millisecond), atShare, back)
	// a gives the slots back at its next renewal, up to one interval
	// after the release; b's own renewals keep their own phase, so up to
	// two of them fall in that time (one interval and the scheduler's
	// jitter: 1 run in 30 counted two), and the nudge a's give-back sends
	// makes the one that takes the part back.
	if back > 3 {
		t.Errorf("b needed %d renewals to take its part back", back)
	}
}

// TestTargetBorrowServesBurst: a target's maxConnections borrows like a
// level's. Three instances hold 3 each of maxConnections 9; 9 connections
// arrive at one of them at once and each, refused by the local share,
// borrows (as admit's pick does: a slot of the target the refusal names
// at its share, then a pick again, at most 8 borrows): all 9 are served at
// once, none refused while the cluster had a free slot, and the idle two
// hold nothing while they are open.
func TestTargetBorrowServesBurst(t *testing.T) {
	nodes := threeAtThree(t)
	a := nodes[0]
	pick := func(hash uint64) (balancer.Lease, int, error) {
		l, err := a.b.PickAction(time.Now(), hash, nil, nil)
		borrows := 0
		for ; err != nil && borrows < 8; borrows++ {
			var nte *balancer.NoTargetError
			if !errors.As(err, &nte) || len(nte.Reasons) != 1 || !nte.Reasons[0].Shared {
				break
			}
			if !a.c.BorrowTarget(context.Background(), "web", nte.Reasons[0].Target) {
				break
			}
			l, err = a.b.PickAction(time.Now(), hash, nil, nil)
		}
		return l, borrows, err
	}
	start := time.Now()
	var leases []balancer.Lease
	var wg sync.WaitGroup
	var mu sync.Mutex
	borrowed := 0
	var errs []error
	for i := range 9 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, n, err := pick(uint64(i))
			mu.Lock()
			defer mu.Unlock()
			borrowed += n
			if err != nil {
				errs = append(errs, err)
				return
			}
			leases = append(leases, l)
		}()
	}
	wg.Wait()
	took := time.Since(start)
	if len(errs) > 0 {
		t.Errorf("%d of 9 refused with the cluster's 9 slots free for them: %v", len(errs), errs[0])
	}
	if a.level().Share < int64(len(leases)) {
		t.Errorf("a's share %d below its %d open", a.level().Share, len(leases))
	}
	for _, n := range nodes[1:] {
		if l := n.level(); l.Share+a.level().Share > 9 {
			t.Errorf("%s holds %d while a holds %d of 9", n.id, l.Share, a.level().Share)
		}
	}
	var extra error
	if _, _, extra = pick(99); extra == nil {
		t.Error("a 10th connection was served over maxConnections 9")
	}
	for _, l := range leases {
		l.Release()
	}
	t.Logf("9 connections at once at one of three instances: %d served in %v, %d borrows", len(leases), took.Round(time.Millisecond), borrowed)
}
