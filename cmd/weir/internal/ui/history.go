package ui

import (
	"sync"
	"time"
	"unsafe"

	"weir/cmd/weir/api"
)

// DefaultSamples is how many samples each series keeps when
// Recorder's n is 0: 720 sampling intervals, 12 minutes at the demo's 1 s
// and 12 hours at the default 60 s.
const DefaultSamples = 720

// Per-sample memory of each kind of series: a series' ring is allocated
// whole (capacity × this) when the series first appears.
const (
	TargetSampleBytes  = int(unsafe.Sizeof(targetPoint{})) + 8
	LevelSampleBytes   = int(unsafe.Sizeof(levelPoint{})) + 8
	RefusalSampleBytes = int(unsafe.Sizeof(uint64(0))) + 8
)

// Recorder keeps the appliance's recent past: a bounded ring per series (one
// per target, per QoS level and per refusal kind), fed one api.Status per
// sampling interval. Memory is bounded: each series holds at most the
// recorder's capacity of samples (TargetSampleBytes and the like per
// sample), and a series that got no sample for a whole capacity (a target or
// level a reload removed) is dropped, so the number of series follows the
// configuration. It is safe for concurrent use.
type Recorder struct {
	mu       sync.Mutex
	n        int
	times    ring[struct{}] // every sample's time
	targets  series[[2]string, targetPoint]
	levels   series[[2]string, levelPoint]
	refusals series[[2]string, uint64]
	reloads  []api.ReloadEvent // within the window, oldest first
	lastGen  int64
	lastFail uint64
	lastSeg  map[[2]string]api.Segments // each target's direction totals at the previous sample
	started  bool
}

// NewRecorder returns a recorder keeping n samples per series; n ≤ 0 means
// DefaultSamples.
func NewRecorder(n int) *Recorder {
	if n <= 0 {
		n = DefaultSamples
	}
	return &Recorder{n: n, times: newRing[struct{}](n)}
}

// Capacity is the number of samples each series keeps.
func (r *Recorder) Capacity() int { return r.n }

// targetPoint is one target's sample, packed: the ring is the memory cost.
type targetPoint struct {
	weight, effective                   int32
	loss, timeout, pressure, conn, rate int8 // percent
	lossFrom, lossTo                    int16
	open, max                           int32
}

type levelPoint struct {
	bandwidth, maxBandwidth int64
	conns, maxConns         int32
}

// Record adds one sample: the status at the end of a sampling interval.
func (r *Recorder) Record(st api.Status) {
	at := st.SampledAt
	if at.IsZero() {
		at = time.Now()
	}
	ms := at.UnixMilli()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.times.len > 0 && ms <= r.times.newest() {
		ms = r.times.newest() + 1 // keep the time axis strictly increasing
	}
	r.times.push(ms, struct{}{})
	oldest := r.times.oldest()

	if r.started && st.Generation != r.lastGen {
		r.reloads = append(r.reloads, api.ReloadEvent{At: clampMs(st.LoadedAt.UnixMilli(), oldest, ms), Generation: st.Generation})
	}
	if r.started && st.ReloadFailures > r.lastFail {
		e := api.ReloadEvent{At: ms, Generation: st.Generation, Error: "rejected"}
		if st.ReloadError != nil {
			e.At, e.Error = clampMs(st.ReloadError.At.UnixMilli(), oldest, ms), st.ReloadError.Err
		}
		r.reloads = append(r.reloads, e)
	}
	r.started, r.lastGen, r.lastFail = true, st.Generation, st.ReloadFailures
	for len(r.reloads) > 0 && r.reloads[0].At < oldest {
		r.reloads = r.reloads[1:]
	}
	if len(r.reloads) > r.n { // more reloads than samples: keep the newest
		r.reloads = append([]api.ReloadEvent(nil), r.reloads[len(r.reloads)-r.n:]...)
	}

	segs := make(map[[2]string]api.Segments, len(r.lastSeg))
	for _, s := range st.Services {
		for _, t := range s.Targets {
			k := [2]string{s.Name, t.Name}
			p := targetSample(t)
			p.lossFrom, p.lossTo = -1, -1
			if t.Segments != nil {
				if prev, ok := r.lastSeg[k]; ok {
					p.lossFrom = lossRatio(prev.FromTarget, t.Segments.FromTarget)
					p.lossTo = lossRatio(prev.ToTarget, t.Segments.ToTarget)
				}
				segs[k] = *t.Segments
			} else if t.Explanation != nil {
				p.lossFrom = int16(min(t.Explanation.LossRatio, 1000)) // the monitor's input, one direction
			}
			r.targets.push(r.n, k, ms, p)
		}
	}
	r.lastSeg = segs
	for _, l := range st.Levels {
		r.levels.push(r.n, [2]string{l.Level, l.Name}, ms, levelPoint{
			bandwidth: l.Bandwidth, maxBandwidth: l.MaxBandwidth,
			conns: clamp32(l.Connections), maxConns: clamp32(l.MaxConnections),
		})
	}
	for _, f := range st.Refusals {
		r.refusals.push(r.n, [2]string{f.Level, f.Limit}, ms, f.Count)
	}
	r.targets.expire(oldest)
	r.levels.expire(oldest)
	r.refusals.expire(oldest)
}

// targetSample packs a target's state, splitting its fraction into the parts
// that add up to it.
func targetSample(t api.Target) targetPoint {
	p := targetPoint{weight: int32(t.Weight), effective: int32(t.Effective), open: clamp32(t.Open), max: clamp32(t.Max), lossTo: -1}
	e := t.Explanation
	if e == nil {
		return p
	}
	loss := min(e.LossFraction, e.Fraction)
	timeout := min(e.TimeoutFraction, e.Fraction-loss)
	rest := e.Fraction - loss - timeout
	p.loss, p.timeout = int8(loss), int8(timeout)
	if rest > 0 {
		switch {
		case e.ConnFraction >= e.MinRateFraction && e.ConnFraction > e.DefaultFraction:
			p.conn = int8(rest)
		case e.MinRateFraction > e.DefaultFraction:
			p.rate = int8(rest)
		default:
			p.pressure = int8(rest) // the default fraction's 100 % at 90 % of maxConnections
		}
	}
	return p
}

// lossRatio is one direction's loss ratio over a sampling interval, in
// tenths of a percent: retransmitted data segments / data segments between
// two totals. -1 where it is not measured (source "none", or "estimate",
// whose retransmissions are unknown).
func lossRatio(prev, cur api.DirTotals) int16 {
	if cur.Source != "measured" || cur.DataSegments < prev.DataSegments || cur.Retransmitted < prev.Retransmitted {
		return -1
	}
	d := cur.DataSegments - prev.DataSegments
	if d == 0 {
		return 0
	}
	return int16(min((cur.Retransmitted-prev.Retransmitted)*1000/d, 1000))
}

// History returns the recorded series, oldest sample first.
func (r *Recorder) History() api.History {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := api.History{
		Capacity: r.n, Now: time.Now(),
		Reloads: append([]api.ReloadEvent{}, r.reloads...),
		Targets: []api.TargetSeries{}, Levels: []api.LevelSeries{}, Refusals: []api.RefusalSeries{},
	}
	if r.times.len > 1 {
		h.Interval = time.Duration(r.times.newest()-r.times.at[r.times.index(r.times.len-2)]) * time.Millisecond
	}
	for _, s := range r.targets.list {
		ts := api.TargetSeries{Service: s.key[0], Target: s.key[1]}
		s.ring.each(func(at int64, p targetPoint) {
			ts.At = append(ts.At, at)
			ts.Weight = append(ts.Weight, int(p.weight))
			ts.Effective = append(ts.Effective, int(p.effective))
			ts.LossPart = append(ts.LossPart, int(p.loss))
			ts.TimeoutPart = append(ts.TimeoutPart, int(p.timeout))
			ts.PressurePart = append(ts.PressurePart, int(p.pressure))
			ts.ConnPart = append(ts.ConnPart, int(p.conn))
			ts.MinRatePart = append(ts.MinRatePart, int(p.rate))
			ts.LossFromTarget = append(ts.LossFromTarget, int(p.lossFrom))
			ts.LossToTarget = append(ts.LossToTarget, int(p.lossTo))
			ts.Open = append(ts.Open, int64(p.open))
			ts.Max = append(ts.Max, int64(p.max))
		})
		h.Targets = append(h.Targets, ts)
	}
	for _, s := range r.levels.list {
		ls := api.LevelSeries{Level: s.key[0], Name: s.key[1]}
		s.ring.each(func(at int64, p levelPoint) {
			ls.At = append(ls.At, at)
			ls.Bandwidth = append(ls.Bandwidth, p.bandwidth)
			ls.MaxBandwidth = append(ls.MaxBandwidth, p.maxBandwidth)
			ls.Connections = append(ls.Connections, int64(p.conns))
			ls.MaxConnections = append(ls.MaxConnections, int64(p.maxConns))
		})
		h.Levels = append(h.Levels, ls)
	}
	for _, s := range r.refusals.list {
		rs := api.RefusalSeries{Level: s.key[0], Limit: s.key[1]}
		s.ring.each(func(at int64, n uint64) {
			rs.At = append(rs.At, at)
			rs.Count = append(rs.Count, n)
		})
		h.Refusals = append(h.Refusals, rs)
	}
	return h
}

// Bytes is the memory the rings hold now: every series' full ring (they are
// allocated whole) and the time axis.
func (r *Recorder) Bytes() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n*8 + len(r.targets.list)*r.n*TargetSampleBytes +
		len(r.levels.list)*r.n*LevelSampleBytes + len(r.refusals.list)*r.n*RefusalSampleBytes
}

func clamp32(v int64) int32 { return int32(max(min(v, 1<<31-1), -1<<31)) }

func clampMs(v, lo, hi int64) int64 { return max(min(v, hi), lo) }

// ring is a fixed-capacity ring of timestamped values.
type ring[T any] struct {
	at        []int64
	v         []T
	head, len int // head: index of the oldest element
}

func newRing[T any](n int) ring[T] { return ring[T]{at: make([]int64, n), v: make([]T, n)} }

func (r *ring[T]) index(i int) int { return (r.head + i) % len(r.at) }
func (r *ring[T]) oldest() int64   { return r.at[r.head] }
func (r *ring[T]) newest() int64   { return r.at[r.index(r.len-1)] }

func (r *ring[T]) push(at int64, v T) {
	if r.len < len(r.at) {
		i := r.index(r.len)
		r.at[i], r.v[i] = at, v
		r.len++
		return
	}
	r.at[r.head], r.v[r.head] = at, v
	r.head = (r.head + 1) % len(r.at)
}

func (r *ring[T]) each(f func(int64, T)) {
	for i := range r.len {
		j := r.index(i)
		f(r.at[j], r.v[j])
	}
}

// series is a set of rings by key, in the order they first appeared.
type series[K comparable, T any] struct {
	byKey map[K]*keyed[K, T]
	list  []*keyed[K, T]
}

type keyed[K comparable, T any] struct {
	key  K
	ring ring[T]
}

func (s *series[K, T]) push(n int, k K, at int64, v T) {
	e := s.byKey[k]
	if e == nil {
		if s.byKey == nil {
			s.byKey = map[K]*keyed[K, T]{}
		}
		e = &keyed[K, T]{key: k, ring: newRing[T](n)}
		s.byKey[k] = e
		s.list = append(s.list, e)
	}
	e.ring.push(at, v)
}

// expire drops the series whose newest sample is older than the window.
func (s *series[K, T]) expire(oldest int64) {
	kept := s.list[:0]
	for _, e := range s.list {
		if e.ring.newest() < oldest {
			delete(s.byKey, e.key)
			continue
		}
		kept = append(kept, e)
	}
	clear(s.list[len(kept):])
	s.list = kept
}
