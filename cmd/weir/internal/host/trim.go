package host

// Giving memory back after a load
//
// Once a load ends (20 000 idle http client connections closed), what
// their buffers, goroutines and gVisor endpoints took is garbage, but the
// Go runtime keeps it resident: an idle weir allocates little, so no GC
// cycle runs to find the garbage (the runtime forces one only every
// 2 minutes) and the background scavenger returns only what lies above the
// heap goal the load set, slowly. weir's RSS stayed at 420 MiB (14 times
// its 30 MiB start) a minute after such a load. TrimLoop checks the
// runtime's own figures every period and calls debug.FreeOSMemory (one
// collection and the free pages returned at once) when the free heap it
// holds is over TrimMinFree and more than the live heap, or when no GC
// cycle has run for the quiet time while the heap holds more than
// TrimMinFree (the load stopped: the garbage is found and given back). A
// forced trim that finds little garbage doubles the quiet time it waits
// for next (up to the runtime's own 2 minutes), so a quiet weir that
// holds a big live heap is not collected every few seconds; one that
// frees much, or a collection of the runtime's own (a load), resets it. Under load the runtime collects on its own and
// the free heap stays below the live heap (GOGC 50): nothing is trimmed.

import (
	"context"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// TrimMinFree is the free (or, when quiet, whole) heap below which
// TrimLoop never trims.
const TrimMinFree = 32 << 20

// Defaults of TrimOptions.
const (
	DefaultTrimPeriod = 10 * time.Second
	DefaultTrimQuiet  = 20 * time.Second
	maxTrimQuiet      = 2 * time.Minute // the runtime's own forced GC period
)

// TrimOptions configure TrimLoop; the zero value means the defaults.
type TrimOptions struct {
	Period time.Duration // how often the figures are read
	Quiet  time.Duration // no GC cycle for this long: trim (the first wait)
	// Trimmed, if set, hears of each trim: the figures before and after,
	// and whether it was forced by a quiet spell.
	Trimmed func(before, after HeapFigures, quiet bool)
}

// HeapFigures are the runtime's heap figures TrimLoop decides on.
type HeapFigures struct {
	Live   uint64 // bytes of heap objects: live, or garbage not yet collected
	Free   uint64 // bytes of heap the runtime holds free and has not returned to the OS
	Cycles uint64 // GC cycles completed
}

var heapSamples = []metrics.Sample{
	{Name: "/memory/classes/heap/objects:bytes"},
	{Name: "/memory/classes/heap/free:bytes"},
	{Name: "/gc/cycles/total:gc-cycles"},
}

// ReadHeap reads the runtime's heap figures.
func ReadHeap() HeapFigures {
	s := make([]metrics.Sample, len(heapSamples))
	copy(s, heapSamples)
	metrics.Read(s)
	return HeapFigures{Live: s[0].Value.Uint64(), Free: s[1].Value.Uint64(), Cycles: s[2].Value.Uint64()}
}

// ShouldTrim reports whether h holds enough free heap to give back.
func ShouldTrim(h HeapFigures) bool {
	return h.Free > TrimMinFree && h.Free > h.Live
}

// TrimLoop runs until ctx ends; see Giving memory back above.
func TrimLoop(ctx context.Context, o TrimOptions) {
	if o.Period <= 0 {
		o.Period = DefaultTrimPeriod
	}
	if o.Quiet <= 0 {
		o.Quiet = DefaultTrimQuiet
	}
	t := time.NewTicker(o.Period)
	defer t.Stop()
	quiet := o.Quiet
	last := ReadHeap()
	since := time.Now() // of the last GC cycle seen
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		h, now := ReadHeap(), time.Now()
		if h.Cycles != last.Cycles { // the runtime collects: a load, or its own 2-minute cycle
			since, quiet = now, o.Quiet
		}
		last = h
		forced := !ShouldTrim(h) && now.Sub(since) >= quiet && h.Live+h.Free > TrimMinFree
		if !forced && !ShouldTrim(h) {
			continue
		}
		debug.FreeOSMemory()
		after := ReadHeap()
		if forced {
			if after.Live*10 >= h.Live*9 { // little garbage: wait longer next time
				quiet = min(2*quiet, maxTrimQuiet)
			} else {
				// Much garbage: collect once more at once, for what
				// only a second cycle frees (sync.Pool's victim
				// caches, objects behind finalizers).
				quiet = o.Quiet
				debug.FreeOSMemory()
				after = ReadHeap()
			}
		}
		last, since = after, time.Now()
		if o.Trimmed != nil {
			o.Trimmed(h, after, forced)
		}
	}
}
