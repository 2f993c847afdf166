package udp

import (
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// Reply latency of request/response sessions (udp.responses set): the time
// from a client's datagram to the target's next datagram back, the first
// reply to it. A session holds the time of its oldest unanswered datagram;
// the reply takes it and records the difference in its target's histogram.
// A datagram sent while one is unanswered waits with it (a retry is not a
// new request), so a late reply counts from the first try, as a client
// waiting on it sees.

// latBuckets is the histogram's size: log-linear buckets of nanoseconds,
// subBits bits of mantissa per power of two (a value's bucket is within
// 1/16 of it), up to 2^maxExp ns (about 137 s; longer lands in the last).
const (
	subBits    = 4
	subBuckets = 1 << subBits
	maxExp     = 37
	latBuckets = (maxExp - subBits + 2) * subBuckets
)

// bucketOf is the index of the bucket holding ns.
func bucketOf(ns int64) int {
	if ns < subBuckets {
		return int(max(ns, 0))
	}
	e := bits.Len64(uint64(ns)) - 1 // ns in [2^e, 2^(e+1))
	i := (e-subBits+1)*subBuckets + int(ns>>(e-subBits))&(subBuckets-1)
	return min(i, latBuckets-1)
}

// bucketMid is the middle of bucket i, ns: the value reported for it.
func bucketMid(i int) int64 {
	if i < subBuckets {
		return int64(i)
	}
	e := i/subBuckets + subBits - 1
	lo := int64(subBuckets+i%subBuckets) << (e - subBits)
	return lo + int64(1)<<(e-subBits)/2
}

// hist is a histogram of reply latencies; observe is lock-free.
type hist struct {
	n [latBuckets]atomic.Uint64
}

func (h *hist) observe(d int64) { h.n[bucketOf(d)].Add(1) }

// counts is a histogram's snapshot.
type counts [latBuckets]uint64

// LatencySummary is a histogram's count and quantiles.
type LatencySummary struct {
	Replies  uint64
	P50, P99 time.Duration
}

func (c *counts) summary() LatencySummary {
	var n uint64
	for _, v := range c {
		n += v
	}
	s := LatencySummary{Replies: n}
	if n == 0 {
		return s
	}
	s.P50, s.P99 = c.quantile(n, 0.50), c.quantile(n, 0.99)
	return s
}

// quantile is the value at rank ⌈q·n⌉ of the n values counted.
func (c *counts) quantile(n uint64, q float64) time.Duration {
	rank := max(uint64(math.Ceil(q*float64(n))), 1)
	var seen uint64
	for i, v := range c {
		if seen += v; seen >= rank {
			return time.Duration(bucketMid(i))
		}
	}
	return time.Duration(bucketMid(latBuckets - 1))
}

// replyLatency is one target's reply latencies: the current sampling
// interval's (cur), the last complete one's (last) and the total since the
// target's first reply.
type replyLatency struct {
	cur, total hist
	mu         sync.Mutex
	last       counts // by mu
}

func (l *replyLatency) observe(d time.Duration) {
	l.cur.observe(int64(d))
	l.total.observe(int64(d))
}

// rotate ends the current interval: its counts become last.
func (l *replyLatency) rotate() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range l.cur.n {
		l.last[i] = l.cur.n[i].Swap(0)
	}
}

// ReplyLatency is a target's reply latency over the last complete sampling
// interval and since start.
type ReplyLatency struct {
	Interval, Total LatencySummary
}

func (l *replyLatency) snapshot() ReplyLatency {
	var tot counts
	for i := range l.total.n {
		tot[i] = l.total.n[i].Load()
	}
	l.mu.Lock()
	last := l.last
	l.mu.Unlock()
	return ReplyLatency{Interval: last.summary(), Total: tot.summary()}
}
