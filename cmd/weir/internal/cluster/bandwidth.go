package cluster

import (
	"context"
	_ "embed"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"

	"weir/policy"
)

// Bandwidth shared cluster-wide, and the counts of logged limits
//
// Every level with a maxBandwidth (enforced or only logged) is judged on
// the cluster's window rate: right after each local Recompute (the
// appliance calls Recomputed), the instance publishes its own window rate
// per level and reads the sum of the other live members' in one script
// call; Admission.SetRemoteBandwidth adds that sum to the local rate at
// once. The rates add up because every instance's window is
// the same MetricInterval: the sum is the cluster's bytes over the window
// divided by it, at most one recompute interval (plus a round trip)
// behind, as Sun's own class and instance counts are. A member that dies
// stops publishing; its rate counts until its field expires (the lease
// lifetime), which errs on the strict side. When two publications in a
// row fail, the others' rate follows the fallback: localShare takes them
// to use as much as this instance (rate × (members − 1): each instance
// then gets limit ÷ members), failOpen takes it as 0, failClosed as
// unlimited (an enforced level refuses).
//
// A maxConnections that is only logged is not leased: the same round
// trip publishes each such level's open connections and reads the
// others', so that its log line counts the cluster's connections.

//go:embed bandwidth.lua
var bandwidthSrc string

var bandwidthScript = redis.NewScript(bandwidthSrc)

// Bandwidth is one level's bandwidth, here and cluster-wide.
type Bandwidth struct {
	Kind policy.LevelKind
	Name string
	// Limit is the level's maxBandwidth in bytes per second.
	Limit    int64
	Enforced bool
	// Local is this instance's window rate, Others the other members' as
	// last read (or as the fallback supposes), in bytes per second; the
	// level is judged on their sum.
	Local, Others int64
}

// Recomputed tells the bandwidth publisher that Admission recomputed its
// rates: it publishes them at once. It never blocks (a signal already
// pending covers this one). Call it from the recompute loop.
func (c *Cluster) Recomputed() {
	select {
	case c.recomputed <- struct{}{}:
	default:
	}
}

// bandwidthLoop publishes the rates after each Recomputed until ctx ends.
// Loop runs it in its own goroutine.
func (c *Cluster) bandwidthLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.recomputed:
			c.ShareBandwidth(ctx)
		}
	}
}

// ShareBandwidth publishes this instance's window rate of every level
// with a maxBandwidth, and its open connections at every level whose
// maxConnections is only logged, and sets the others' sums in Admission
// (SetRemoteBandwidth, SetRemoteConns): one round trip, none when no level
// has either. bandwidthLoop calls it after each recompute; tests call it
// directly.
func (c *Cluster) ShareBandwidth(ctx context.Context) {
	c.bwMu.Lock()
	defer c.bwMu.Unlock()
	var lv []Bandwidth
	type logged struct {
		kind         policy.LevelKind
		name         string
		open, others int64
	}
	var lc []logged
	for _, s := range c.o.Admission.Snapshot() {
		if s.Retired {
			continue
		}
		if s.Limits.MaxBandwidth > 0 {
			lv = append(lv, Bandwidth{Kind: s.Level, Name: s.Name, Limit: s.Limits.MaxBandwidth,
				Enforced: s.Limits.EnforceBandwidth, Local: s.LocalBandwidth})
		}
		if s.Limits.MaxConnections > 0 && !s.Limits.EnforceConnections {
			lc = append(lc, logged{kind: s.Level, name: s.Name, open: s.Conns})
		}
	}
	if len(lv)+len(lc) == 0 {
		c.bw = nil
		return
	}
	keys := make([]string, 0, len(lv)+len(lc))
	args := []any{c.o.Config.Instance, c.ttl.Milliseconds()}
	for _, l := range lv {
		keys = append(keys, c.levelKey("bw", l.Kind, l.Name))
		args = append(args, min(l.Local, maxLimit))
	}
	for _, l := range lc {
		keys = append(keys, c.countKey(l.kind, l.name))
		args = append(args, min(l.open, maxLimit))
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	members := c.members
	c.bwKeys = keys
	c.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, c.o.Config.LeaseInterval/2)
	res, err := bandwidthScript.Run(rctx, c.rdb, keys, args...).Int64Slice()
	cancel()
	c.bwRounds.Add(1)
	if err == nil && len(res) != len(keys) {
		err = fmt.Errorf("cluster: bandwidth script answered %d values for %d levels", len(res), len(keys))
	}
	if err != nil {
		c.bwFails++
		if c.bwFails < 2 {
			return // the others' last figures stand for one more interval
		}
		c.bwErrors.Add(1)
		for i := range lv {
			switch c.o.Config.OnRedisDown {
			case policy.FailOpen:
				lv[i].Others = 0
			case policy.FailClosed:
				lv[i].Others = math.MaxInt64 / 2
			default:
				lv[i].Others = lv[i].Local * int64(max(members-1, 0))
			}
		}
		for i := range lc {
			// Only a log line depends on it: the others taken to hold as
			// many as this instance.
			lc[i].others = lc[i].open * int64(max(members-1, 0))
		}
	} else {
		c.bwFails = 0
		for i := range lv {
			lv[i].Others = res[i]
		}
		for i := range lc {
			lc[i].others = res[len(lv)+i]
		}
	}
	for _, l := range lv {
		c.o.Admission.SetRemoteBandwidth(l.Kind, l.Name, l.Others)
	}
	for _, l := range lc {
		c.o.Admission.SetRemoteConns(l.kind, l.name, l.others)
	}
	c.bw = lv
	c.logged = c.logged[:0]
	for _, l := range lc {
		c.logged = append(c.logged, LoggedConns{Kind: l.kind, Name: l.name, Open: l.open, Others: l.others})
	}
}

func (c *Cluster) countKey(kind policy.LevelKind, name string) string {
	switch kind {
	case policy.LevelInstance:
		return c.prefix + "conns:instance"
	case policy.LevelClass:
		return c.prefix + "conns:class:" + name
	}
	return c.prefix + "conns:service:" + name
}

// LoggedConns is one level whose maxConnections is only logged: its open
// connections here and at the other members as last read; the log line
// says when their sum crosses the limit.
type LoggedConns struct {
	Kind         policy.LevelKind
	Name         string
	Open, Others int64
}

// bandwidthStatus returns the levels' bandwidth and logged connection
// counts as last shared, sorted.
func (c *Cluster) bandwidthStatus() ([]Bandwidth, []LoggedConns) {
	c.bwMu.Lock()
	defer c.bwMu.Unlock()
	logged := slices.Clone(c.logged)
	out := slices.Clone(c.bw)
	slices.SortFunc(out, func(a, b Bandwidth) int {
		if a.Kind != b.Kind {
			return int(a.Kind) - int(b.Kind)
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out, logged
}
