package appliance

import (
	"context"
	"time"

	"weir/cmd/weir/internal/cluster"
	"weir/policy"
)

// clusterTargets is the cluster's view of the balancers: each target with
// a maxConnections is leased like an enforced level (cluster.Targets).
type clusterTargets struct{ a *Appliance }

var _ cluster.Targets = clusterTargets{}

// TargetLimits lists every balancer's targets with a maxConnections.
func (ct clusterTargets) TargetLimits() []cluster.TargetLimit {
	a := ct.a
	var out []cluster.TargetLimit
	now := a.now()
	for _, name := range sortedNames(*a.bals.Load()) {
		for _, t := range a.balancer(name).Snapshot(now).Targets {
			if t.Max > 0 {
				out = append(out, cluster.TargetLimit{Service: name, Target: t.Name, Max: t.Max, Open: t.Open, Refused: t.SkippedAtShare})
			}
		}
	}
	return out
}

// SetTargetCapacity sets one target's share in its balancer.
func (ct clusterTargets) SetTargetCapacity(service, target string, c int64) (int64, bool) {
	b := ct.a.balancer(service)
	if b == nil {
		return 0, false
	}
	return b.SetCapacity(target, c)
}

// SetDefaultTargetCapacity sets every balancer's default share, and the
// one a balancer built by a later reload starts with.
func (ct clusterTargets) SetDefaultTargetCapacity(c int64) {
	a := ct.a
	a.balMu.Lock()
	defer a.balMu.Unlock()
	a.cluDefCap = c
	for _, b := range *a.bals.Load() {
		b.SetDefaultCapacity(c)
	}
}

// borrow asks the cluster for more slots of a level whose local share
// refused a connection or request (admit.Options.Borrow); false without a
// cluster. a.clu is set in New before the forwarder admits anything.
func (a *Appliance) borrow(ctx context.Context, kind policy.LevelKind, name string) bool {
	if a.clu == nil {
		return false
	}
	return a.clu.Borrow(ctx, kind, name)
}

// borrowTarget asks the cluster for a slot of a target whose local share
// of its cluster-wide maxConnections is full (admit.Options.BorrowTarget);
// false without a cluster.
func (a *Appliance) borrowTarget(ctx context.Context, service, target string) bool {
	if a.clu == nil {
		return false
	}
	return a.clu.BorrowTarget(ctx, service, target)
}

// shareSamples publishes this instance's samples of the interval and the
// down-state of its targets, marks down the targets another member saw
// fail, and returns the cluster-wide sums the sampler judges (the local
// samples when Redis does not answer).
func (a *Appliance) shareSamples(cfg *policy.Config, local map[policy.TargetKey]*policy.TargetSample) map[policy.TargetKey]*policy.TargetSample {
	now := a.now()
	down := map[policy.TargetKey]time.Time{}
	for name, b := range *a.bals.Load() {
		for _, t := range b.Snapshot(now).Targets {
			if t.Down {
				down[policy.TargetKey{Service: name, Target: t.Name}] = t.DownUntil
			}
		}
	}
	sh := a.clu.ShareSamples(context.Background(), cfg, local, down)
	for k, until := range sh.Down {
		if b := a.balancer(k.Service); b != nil {
			b.MarkDown(k.Target, until)
		}
	}
	return sh.Samples
}
