package udp

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestBuckets: every value lands in a bucket whose middle is within 1/16
// of it (exact below 16 ns), buckets are in order, and quantiles of a
// known sample come out within that error.
func TestBuckets(t *testing.T) {
	prev := -1
	for _, ns := range []int64{0, 1, 15, 16, 17, 31, 32, 1000, 999_999, 1e6, 5e6, 40e6, 1e9, 60e9, 1 << 36} {
		i := bucketOf(ns)
		if i < prev {
			t.Fatalf("bucketOf(%d) = %d, below %d's", ns, i, prev)
		}
		prev = i
		mid := bucketMid(i)
		if d := mid - ns; d < 0 && -d > ns/16 || d > 0 && d > ns/16 {
			t.Errorf("%d ns: bucket %d middle %d, off by more than 1/16", ns, i, mid)
		}
	}
	if bucketOf(-5) != 0 || bucketOf(1<<62) != latBuckets-1 {
		t.Errorf("out of range: %d, %d", bucketOf(-5), bucketOf(1<<62))
	}

	var c counts
	rng := rand.New(rand.NewPCG(1, 2))
	vals := make([]int64, 10000)
	for i := range vals {
		vals[i] = int64(rng.ExpFloat64() * 5e6) // mean 5 ms
		c[bucketOf(vals[i])]++
	}
	slices.Sort(vals)
	s := c.summary()
	for _, q := range []struct {
		got  time.Duration
		want int64
	}{{s.P50, vals[4999]}, {s.P99, vals[9899]}} {
		if d := int64(q.got) - q.want; d < -q.want/16 || d > q.want/16 {
			t.Errorf("quantile %v, want %v within 1/16", q.got, time.Duration(q.want))
		}
	}
	if s.Replies != 10000 {
		t.Errorf("replies %d", s.Replies)
	}
}

// TestReplyLatency: a request/response session's reply latency is the time
// from the client's datagram to the target's answer, per target: target a
// answers in 5 ms and b in 40 ms on the relay's clock, and their p50 and
// p99 say so; the interval's figures are the last complete sampling
// interval's (none before the first Sample, none in an empty one) while
// the totals stay; a session of two requests records two replies.
func TestReplyLatency(t *testing.T) {
	g := newRig(t, UDPTestOptions{responses: 2, delay: map[string]time.Duration{"a": 5 * time.Millisecond, "b": 40 * time.Millisecond}})
	for i := range 10 {
		c := g.client()
		for j := range 2 {
			q := fmt.Sprintf("query-%d-%d", i, j)
			if a := ask(t, c, q, 5*time.Second); len(a) < 2 || a[2:] != q {
				t.Fatalf("query %q: reply %q", q, a)
			}
		}
	}
	waitFor(t, "10 ended sessions", func() bool { return g.r.Stats().EndedResponses == 10 })
	want := map[string]time.Duration{"a": 5 * time.Millisecond, "b": 40 * time.Millisecond}
	near := func(got, want time.Duration) bool { return got >= want-want/16 && got <= want+want/16 }
	for name, d := range want {
		l, ok := g.r.ReplyLatency(TargetKey{"dns", name})
		if !ok {
			t.Fatalf("target %s: no reply latency", name)
		}
		if l.Total.Replies != 10 || !near(l.Total.P50, d) || !near(l.Total.P99, d) {
			t.Errorf("target %s total %+v, want 10 replies at %v", name, l.Total, d)
		}
		if l.Interval.Replies != 0 {
			t.Errorf("target %s: interval %+v before the first Sample", name, l.Interval)
		}
	}
	g.r.Sample()
	for name, d := range want {
		l, _ := g.r.ReplyLatency(TargetKey{"dns", name})
		if l.Interval.Replies != 10 || !near(l.Interval.P50, d) || !near(l.Interval.P99, d) {
			t.Errorf("target %s interval %+v, want 10 replies at %v", name, l.Interval, d)
		}
	}
	g.r.Sample()
	for name := range want {
		if l, _ := g.r.ReplyLatency(TargetKey{"dns", name}); l.Interval.Replies != 0 || l.Total.Replies != 10 {
			t.Errorf("target %s after an empty interval: %+v", name, l)
		}
	}
}

// TestNoReplyLatencyWithoutResponses: a session with no udp.responses is no
// request/response session: its replies have no latency to measure.
func TestNoReplyLatencyWithoutResponses(t *testing.T) {
	g := newRig(t, UDPTestOptions{})
	c := g.client()
	if a := ask(t, c, "hello", 5*time.Second); a == "" {
		t.Fatal("no reply")
	}
	for _, n := range []string{"a", "b"} {
		if l, ok := g.r.ReplyLatency(TargetKey{"dns", n}); ok {
			t.Errorf("target %s: %+v", n, l)
		}
	}
}
