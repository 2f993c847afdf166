package policy

import (
	"testing"
	"time"
)

// TestWindowSunExample reproduces the Sun Web Server QoS example: metric
// interval 30 s, recompute 100 ms, 5000 bytes at t = 1 s.
func TestWindowSunExample(t *testing.T) {
	w := NewWindow(30*time.Second, 100*time.Millisecond)
	t0 := time.Unix(1_000_000, 0)
	var total uint64
	want := map[time.Duration]int64{
		0:                0,
		time.Second:      166,
		15 * time.Second: 166,
		30 * time.Second: 166,
		32 * time.Second: 0,
		40 * time.Second: 0,
	}
	computations := 0
	for at := time.Duration(0); at <= 40*time.Second; at += 100 * time.Millisecond {
		if at == time.Second {
			total += 5000 // the connection's traffic, counted by the 1 s recompute
		}
		w.Tick(t0.Add(at), total)
		computations++
		if at == time.Second && computations != 11 {
			t.Fatalf("1 s is computation %d, want the 11th (the 0 s one plus 10)", computations)
		}
		if v, ok := want[at]; ok && w.Rate() != v {
			t.Errorf("at %v: rate %d B/s, want %d", at, w.Rate(), v)
		}
	}
}

func TestWindowLongGapExpiresAll(t *testing.T) {
	w := NewWindow(time.Second, 100*time.Millisecond)
	t0 := time.Unix(0, 0)
	w.Tick(t0, 0)
	w.Tick(t0.Add(50*time.Millisecond), 1000)
	if got := w.Rate(); got != 1000 {
		t.Fatalf("rate %d, want 1000", got)
	}
	w.Tick(t0.Add(time.Hour), 1000)
	if got := w.Rate(); got != 0 {
		t.Fatalf("after an hour idle rate %d, want 0", got)
	}
	w.Tick(t0.Add(time.Hour+time.Millisecond), 500) // counter reset: no credit
	if got := w.Rate(); got != 0 {
		t.Fatalf("after a counter reset rate %d, want 0", got)
	}
}

func BenchmarkWindowTick(b *testing.B) {
	w := NewWindow(0, 0)
	t0 := time.Unix(0, 0)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		w.Tick(t0.Add(time.Duration(i)*100*time.Millisecond), uint64(i)*1000)
	}
}

func TestWindowStartCreditsBytesBeforeFirstTick(t *testing.T) {
	t0 := time.Unix(0, 0)
	plain := NewWindow(time.Second, 100*time.Millisecond)
	plain.Tick(t0, 200) // no Start: the first total is the baseline
	if got := plain.Rate(); got != 0 {
		t.Fatalf("without Start: rate %d, want 0", got)
	}
	w := NewWindow(time.Second, 100*time.Millisecond)
	w.Start(0)
	w.Tick(t0, 200)
	if got := w.Rate(); got != 200 {
		t.Fatalf("with Start(0): rate %d, want 200", got)
	}
	w.Tick(t0.Add(100*time.Millisecond), 300)
	if got := w.Rate(); got != 300 {
		t.Fatalf("after another 100 bytes: rate %d, want 300", got)
	}
}

// TestWindowNoOverflow: a 300 s window holding 20 GB reads 66.7 MB/s; the
// rate was sum·1e9/window in 64 bits, which wraps above 18.4 GB and read
// 5.2 MB/s, so enforced bandwidth limits stopped working on fast links.
func TestWindowNoOverflow(t *testing.T) {
	for _, tc := range []struct {
		window time.Duration
		bytes  uint64
		want   int64
	}{
		{300 * time.Second, 20_000_000_000, 66_666_666},
		{30 * time.Second, 30 * 1_250_000_000, 1_250_000_000}, // 10 Gbit/s
		{30 * time.Second, 1 << 63, int64((1 << 63) / 30)},
	} {
		w := NewWindow(tc.window, 100*time.Millisecond)
		t0 := time.Unix(0, 0)
		w.Start(0)
		w.Tick(t0, tc.bytes)
		if got := w.Rate(); got != tc.want {
			t.Errorf("%v window holding %d B: rate %d B/s, want %d", tc.window, tc.bytes, got, tc.want)
		}
	}
	if got := rateOf(^uint64(0), time.Nanosecond); got != 1<<63-1 {
		t.Errorf("saturation: %d", got)
	}
}
