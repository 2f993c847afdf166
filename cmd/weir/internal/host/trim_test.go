package host

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestShouldTrim: only a free heap over TrimMinFree and over the live heap
// is given back.
func TestShouldTrim(t *testing.T) {
	for _, tc := range []struct {
		h    HeapFigures
		want bool
	}{
		{HeapFigures{Live: 10 << 20, Free: 20 << 20}, false},  // under TrimMinFree
		{HeapFigures{Live: 100 << 20, Free: 60 << 20}, false}, // a steady load's slack
		{HeapFigures{Live: 10 << 20, Free: 200 << 20}, true},  // after a load
	} {
		if got := ShouldTrim(tc.h); got != tc.want {
			t.Errorf("ShouldTrim(%+v) = %v, want %v", tc.h, got, tc.want)
		}
	}
}

var sink [][]byte

// TestTrimLoopAfterLoad: 256 MiB allocated and dropped, then nothing
// allocates (a load that ended): with no GC cycle for the quiet time the
// loop collects and gives the heap back, and a second quiet spell with
// nothing to find waits twice as long.
func TestTrimLoopAfterLoad(t *testing.T) {
	for range 256 {
		sink = append(sink, make([]byte, 1<<20))
	}
	sink = nil
	type trim struct {
		before, after HeapFigures
		quiet         bool
		at            time.Time
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	trims := make(chan trim, 16)
	start := time.Now()
	go TrimLoop(ctx, TrimOptions{Period: 10 * time.Millisecond, Quiet: 200 * time.Millisecond,
		Trimmed: func(before, after HeapFigures, quiet bool) {
			select {
			case trims <- trim{before, after, quiet, time.Now()}:
			default:
			}
		}})
	var first trim
	select {
	case first = <-trims:
	case <-time.After(30 * time.Second):
		t.Fatal("no trim in 30 s after 256 MiB was dropped")
	}
	t.Logf("trimmed %v after the load (quiet %v): heap %d MiB + %d MiB free -> %d MiB + %d MiB free",
		first.at.Sub(start).Round(time.Millisecond), first.quiet, first.before.Live>>20, first.before.Free>>20, first.after.Live>>20, first.after.Free>>20)
	if first.after.Live >= TrimMinFree || first.after.Free >= TrimMinFree {
		t.Errorf("after the trim: %+v, want the 256 MiB collected and returned", first.after)
	}
}

var held [][]byte

// TestTrimLoopBacksOff: a quiet process holding a 64 MiB live heap is
// collected after the quiet time, and each collection that finds nothing
// doubles the wait for the next: 100 ms, 200, 400, 800 over 1.6 s, not a
// collection every 100 ms.
func TestTrimLoopBacksOff(t *testing.T) {
	for range 64 {
		held = append(held, make([]byte, 1<<20))
	}
	defer func() { held = nil }()
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var at []time.Duration
	start := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		TrimLoop(ctx, TrimOptions{Period: 5 * time.Millisecond, Quiet: 100 * time.Millisecond,
			Trimmed: func(_, _ HeapFigures, quiet bool) {
				mu.Lock()
				at = append(at, time.Since(start))
				mu.Unlock()
			}})
	}()
	time.Sleep(1600 * time.Millisecond)
	cancel()
	<-done
	t.Logf("forced collections at %v", at)
	if len(at) == 0 || len(at) > 5 {
		t.Errorf("%d forced collections in 1.6 s of a quiet 64 MiB heap, want 1 to 5 (the wait doubling from 100 ms)", len(at))
	}
}
