package cluster

import (
	"context"

	"weir/policy"
)

// Borrow asks Redis, synchronously, for more slots of an enforced level
// whose local share is full (a policy.Refusal with Shared set), waiting at
// most the configured BorrowTimeout (policy.Cluster.BorrowTimeout) for
// the one Lua round trip and for a renewal already in flight. When slots
// are free cluster-wide it records the larger lease in Redis first, then
// raises the local share (Admission.SetCapacity), and returns true: the
// caller admits the connection again. It returns false when the cluster is
// full, Redis did not answer in time, Redis is down (the onRedisDown
// fallback then holds), in the grace after an outage, or the level is not
// leased; the caller refuses as it would have. Safe from any goroutine.
func (c *Cluster) Borrow(ctx context.Context, kind policy.LevelKind, name string) bool {
	return c.borrow(ctx, c.levelKey("lease", kind, name))
}

func (c *Cluster) borrow(ctx context.Context, key string) bool {
	ctx, cancel := context.WithTimeout(ctx, c.o.Config.BorrowTimeout)
	defer cancel()
	c.mu.Lock()
	var before int64 = -1
	if l := c.levels[key]; l != nil {
		before = l.share
	}
	c.mu.Unlock()
	if before < 0 {
		return false
	}
	select {
	case c.rt <- struct{}{}:
	case <-ctx.Done():
		return false
	}
	defer func() { <-c.rt }()
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.levels[key]
	if c.closed || l == nil || l.gone || c.state != stateShared || c.inGrace() {
		return false
	}
	if l.share > before {
		// A renewal in flight while we waited raised the share.
		return true
	}
	cur := l.share
	// Ask for a quarter more (at least one): a burst borrows a few rounds,
	// not one per connection.
	want := min(l.limit, cur+max(1, cur/4))
	if want <= cur {
		return false
	}
	res, err := borrowScript.Run(ctx, c.rdb, []string{key},
		c.o.Config.Instance, c.ttl.Milliseconds(), l.limit, want, cur).Int64Slice()
	c.renews.Add(1)
	if err != nil || len(res) != 2 {
		// No answer in time: the script may still have recorded a larger
		// lease, which only over-states what this instance holds until
		// the next renewal records its floor.
		return false
	}
	l.held = res[1]
	if res[0] <= cur {
		return false
	}
	c.setCap(l, res[0])
	l.share = res[0]
	return true
}
