package proxy

import (
	"testing"
	"time"
)

// TestStreamMeter pins the streaming rule on sequences of reads (gap in
// ms since the previous read, bytes): the streaming time credited is the
// gaps of spans that reached StreamRate (4000 B/s) within StreamWindow.
func TestStreamMeter(t *testing.T) {
	type rd struct {
		gapMs int64
		n     int
	}
	rep := func(k int, r ...rd) []rd {
		var out []rd
		for range k {
			out = append(out, r...)
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		reads  []rd
		wantMs int64
	}{
		{"full segments every 50 ms (231 Kbit/s)", rep(20, rd{50, 1448}), 1000},
		{"a turn on a shared capped link: one segment after 300 ms, the rest of the turn right after", rep(3, rd{300, 1448}, rd{1, 1448}, rd{1, 1448}, rd{1, 1448}), 909},
		{"a 1.5 s stall after a loss, then the queue behind it", []rd{{50, 1448}, {1500, 1448}, {1, 32768}}, 1551},
		{"a fast typist: a byte every 200 ms, each echoed 1 ms later", rep(10, rd{199, 1}, rd{1, 1}), 0},
		{"a status screen of 1000 B every 500 ms", rep(20, rd{500, 1000}), 0},
		{"a status screen of 3000 B every second", rep(10, rd{1000, 3000}), 0},
		{"a paste after a pause longer than StreamWindow", []rd{{int64(StreamWindow/time.Millisecond) + 1, 1 << 20}}, 0},
		{"a 3 s stall in a bufferbloated queue, then the queue behind it", []rd{{50, 1448}, {3000, 1448}, {1, 32768}}, 3051},
		{"a few keystrokes, then a long quiet, then a big output", []rd{{100, 1}, {100, 1}, {5500, 1}, {1, 64 << 10}}, 1},
	} {
		var m StreamMeter
		now := int64(1e18)
		var got int64
		for _, r := range tc.reads {
			gap := r.gapMs * int64(time.Millisecond)
			now += gap
			got += m.Read(now, gap, r.n)
		}
		if got != tc.wantMs*int64(time.Millisecond) {
			t.Errorf("%s: credited %v, want %v", tc.name, time.Duration(got), time.Duration(tc.wantMs)*time.Millisecond)
		}
	}
	var m StreamMeter
	if m.Read(100, -1, 1000) != 0 {
		t.Error("a clock step backwards credited")
	}
	now := int64(1e18)
	if a := testing.AllocsPerRun(100, func() { now += 1e7; m.Read(now, 1e7, 1448) }); a != 0 {
		t.Errorf("read allocates %v times, want 0 (it runs once per read)", a)
	}
}
