package cluster

import (
	"context"
	"time"

	"weir/policy"
)

// Borrow asks Redis, synchronously, for more slots of an enforced level
// whose local share is full (a policy.Refusal with Shared set), waiting at
// most the configured BorrowTimeout (policy.Cluster.BorrowTimeout) in all:
// for a renewal already in flight, the Lua round trip, and, when another
// member holds slots above its part that it does not use, for that
// member to give them back (the script nudges it; it renews at once) and
// another round trip after each that did. The slots granted are this instance's part of the
// limit with its demand raised to the burst (see alloc.lua), out of what
// the other members' leases leave. The larger lease is recorded in Redis
// first, then the local share raised (Admission.SetCapacity), and Borrow
// returns true: the caller admits the connection again. It returns false
// when the cluster has no slot for this instance, Redis did not answer in
// time, Redis is down (the onRedisDown fallback then holds), in the grace
// after an outage, when this instance's lease ended before it could renew
// it, or the level is not leased; the caller refuses as it would have.
// Safe from any goroutine.
func (c *Cluster) Borrow(ctx context.Context, kind policy.LevelKind, name string) bool {
	return c.borrow(ctx, c.levelKey("lease", kind, name))
}

// BorrowTarget is Borrow for a target's maxConnections: a pick that found
// the target at its local share of the cluster-wide limit (a
// balancer.Reason with Shared set) asks for more of its slots the same
// way, and the caller picks again when it returns true.
func (c *Cluster) BorrowTarget(ctx context.Context, service, target string) bool {
	return c.borrow(ctx, c.targetKey(service, target))
}

func (c *Cluster) borrow(ctx context.Context, key string) bool {
	ctx, cancel := context.WithTimeout(ctx, c.o.Config.BorrowTimeout)
	defer cancel()
	// The share before any wait, read without mu (a renewal holds it for
	// its round trip).
	var before int64 = -1
	if m := c.byKey.Load(); m != nil {
		if l := (*m)[key]; l != nil {
			before = l.cur.Load()
		}
	}
	if before < 0 {
		return false
	}
	for {
		nudged := c.nudgedCh()
		granted, wait := c.borrowOnce(ctx, key, before)
		if granted || !wait {
			return granted
		}
		// Another member holds slots above its part: it was nudged and
		// gives them back at its renewal, which nudges here (each member
		// that gave some back does: try again at each, within the
		// timeout).
		select {
		case <-nudged:
		case <-ctx.Done():
			return false
		}
	}
}

// borrowOnce makes one borrow round trip. wait reports that nothing was
// granted while another member holds slots above its part, and was
// nudged to give back those it does not use.
func (c *Cluster) borrowOnce(ctx context.Context, key string, before int64) (granted, wait bool) {
	select {
	case c.rt <- struct{}{}:
	case <-ctx.Done():
		return false, false
	}
	defer func() { <-c.rt }()
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.levels[key]
	if c.closed || l == nil || l.gone || c.state != stateShared || c.inGrace() ||
		c.leaseUntil.IsZero() || time.Now().After(c.leaseUntil) {
		return false, false
	}
	if l.share > before {
		// A renewal while we waited raised the share.
		return true, false
	}
	cur := l.share
	var open, refused int64
	for _, d := range c.demands() {
		if d.key == key {
			open, refused = d.open, int64(min(d.refused-l.refused, maxLimit))
		}
	}
	// Ask for the burst: the connections open, those the share refused
	// since the last renewal (each waits here or was refused), and a
	// quarter more (at least one), so that one round trip serves it.
	demand := min(l.limit, open+refused)
	want := min(l.limit, max(cur+max(1, cur/4), demand+max(1, demand/4)))
	if want <= cur {
		return false, false
	}
	// One nudge per borrowTimeout is enough while the demand it told has
	// not grown by a quarter: the members it reached are renewing already
	// and read the demand recorded when they do (a burst's every
	// connection borrowing would make each of them renew once per
	// connection). A demand a quarter larger is told at once: the members
	// that renewed already gave back only what the smaller one asked.
	now := time.Now()
	channel := ""
	if now.Sub(l.nudgeAt) >= c.o.Config.BorrowTimeout || demand >= l.nudgeDemand+max(1, l.nudgeDemand/4) {
		channel = c.nudgeChannel()
	}
	res, err := borrowScript.Run(ctx, c.rdb, []string{key},
		c.o.Config.Instance, c.hold().Milliseconds(), channel, l.limit, want, cur, open, demand).Int64Slice()
	c.renews.Add(1)
	if err != nil || len(res) != 3 {
		// No answer in time: the script may still have recorded a larger
		// lease, which only over-states what this instance holds until
		// the next renewal records its floor.
		return false, false
	}
	l.held = res[1]
	if res[0] <= cur {
		if res[2] != 0 && channel != "" {
			l.nudgeAt, l.nudgeDemand = now, demand
		}
		// Wait for the members nudged, by this call or a recent one.
		return false, res[2] != 0
	}
	c.setCap(l, res[0])
	l.setShare(res[0])
	l.record = max(l.record, res[0])
	return true, false
}
