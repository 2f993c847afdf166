package policy

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

// Window is the Sun Web Server bandwidth meter: bytes in the last metric
// interval divided by the metric interval, recomputed every recompute
// interval. It keeps a ring of one bucket per recompute interval.
//
// Tick is called by a single goroutine (the recompute loop) with the running
// byte total read from the meters; Rate may be called by any goroutine at any
// time and never blocks.
//
// The seed's example, with a 30 s window and 100 ms recompute: 5000 bytes at
// t = 1 s read 5000/30 = 166 B/s from the 1 s recompute through the 30 s one,
// and 0 B/s at 32 s, once the sample is older than the window.
type Window struct {
	metric    time.Duration
	recompute time.Duration

	// Owned by the Tick goroutine.
	buckets []uint64 // bytes per recompute slot, ring
	slot    int64    // absolute slot index of the newest bucket
	sum     uint64   // sum of buckets
	last    uint64   // running total seen at the previous Tick
	started bool
	based   bool // Start set last: the first Tick credits what came since
	origin  time.Time

	rate atomic.Int64 // bytes per second, as of the last Tick
}

// NewWindow returns a window of metric averaged over slots of recompute.
// Zero values take the defaults (30 s, 100 ms).
func NewWindow(metric, recompute time.Duration) *Window {
	if metric <= 0 {
		metric = DefaultMetricInterval
	}
	if recompute <= 0 {
		recompute = DefaultRecomputeInterval
	}
	if recompute > metric {
		recompute = metric
	}
	n := int(metric / recompute)
	return &Window{metric: metric, recompute: recompute, buckets: make([]uint64, n)}
}

// Interval returns the metric interval the window averages over.
func (w *Window) Interval() time.Duration { return w.metric }

// Tick records the running byte total at now and recomputes the rate. total
// must not decrease between calls (a reset is treated as zero new bytes).
// The bytes since the previous Tick are credited to now's slot.
func (w *Window) Tick(now time.Time, total uint64) {
	if !w.started {
		w.started = true
		w.origin = now
		if !w.based {
			w.last = total
			w.rate.Store(0)
			return
		}
	}
	var delta uint64
	if total > w.last {
		delta = total - w.last
	}
	w.last = total
	w.advance(now)
	w.buckets[int(w.slot%int64(len(w.buckets)))] += delta
	w.sum += delta
	w.rate.Store(rateOf(w.sum, w.metric))
}

// rateOf is sum bytes over d in bytes per second, rounded down, computed in
// 128 bits: sum·1e9 overflows 64 bits above 18.4 GB (a 300 s window at
// 62 MB/s, a 30 s one above about 4.9 Gbit/s). It saturates at MaxInt64.
func rateOf(sum uint64, d time.Duration) int64 {
	hi, lo := bits.Mul64(sum, uint64(time.Second))
	if hi >= uint64(d) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(d))
	return int64(min(q, math.MaxInt64))
}

// advance moves the ring to now's slot, expiring buckets older than the
// window. A sample taken in slot s is counted while now's slot is below
// s + len(buckets) + 1, i.e. until it is more than one metric interval old.
func (w *Window) advance(now time.Time) {
	s := int64(now.Sub(w.origin) / w.recompute)
	if s <= w.slot {
		return
	}
	n := int64(len(w.buckets))
	steps := s - w.slot
	if steps > n {
		steps = n
	}
	for i := int64(1); i <= steps; i++ {
		b := &w.buckets[int((w.slot+i)%n)]
		w.sum -= *b
		*b = 0
	}
	w.slot = s
}

// Start sets the running total the window counts from, before the first
// Tick: that Tick then credits every byte since, instead of taking its total
// as the starting point. A counter that starts at zero with the window
// (a new admission level) calls Start(0), so that bytes counted before the
// first recompute are not lost. Tick goroutine only.
func (w *Window) Start(total uint64) {
	if !w.started {
		w.last, w.based = total, true
	}
}

// Rate returns the bandwidth in bytes per second as of the last Tick.
func (w *Window) Rate() int64 { return w.rate.Load() }

// Sum returns the bytes counted in the current window. Tick goroutine only.
func (w *Window) Sum() uint64 { return w.sum }
