package fault

import (
	"encoding/binary"
	"errors"
	"os"
	"runtime"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"

	"weir/datapath"
	"weir/internal/testutil"
)

// rig is a fault wrapper over one end of a memory pair; peer is the other
// end.
type rig struct {
	d    *Device
	peer *datapath.MemDevice
}

func newRig(t *testing.T, o Options) *rig {
	t.Helper()
	a, b := datapath.NewPipe(datapath.PipeOptions{QueueLen: 8192})
	d := New(a, o)
	t.Cleanup(func() { d.Close() })
	return &rig{d: d, peer: b}
}

func pkt(i int) []byte {
	p := make([]byte, 64)
	binary.BigEndian.PutUint32(p, uint32(i))
	return p
}

func batch(from, n int) [][]byte {
	var out [][]byte
	for i := from; i < from+n; i++ {
		out = append(out, pkt(i))
	}
	return out
}

// drain reads from dev until want packets arrived or quiet passes with
// nothing new, and returns their sequence numbers in arrival order.
func drain(t *testing.T, dev datapath.Device, want int, quiet time.Duration) []int {
	t.Helper()
	var got []int
	res := make(chan []int, 1)
	go func() {
		bufs := make([][]byte, 64)
		for i := range bufs {
			bufs[i] = make([]byte, 1500)
		}
		sizes := make([]int, 64)
		var seqs []int
		for len(seqs) < want {
			n, err := dev.Read(bufs, sizes, 0)
			for i := range n {
				seqs = append(seqs, int(binary.BigEndian.Uint32(bufs[i])))
			}
			if err != nil {
				break
			}
			res <- slices.Clone(seqs)
		}
		close(res)
	}()
	timer := time.NewTimer(quiet)
	defer timer.Stop()
	for {
		select {
		case s, ok := <-res:
			if !ok {
				return got
			}
			got = s
			if len(got) >= want {
				return got
			}
			timer.Reset(quiet)
		case <-timer.C:
			return got
		}
	}
}

func TestFaultPassThrough(t *testing.T) {
	r := newRig(t, Options{})
	r.d.Write(batch(0, 100), 0)
	if got := drain(t, r.peer, 100, time.Second); !slices.Equal(got, seq(0, 100)) {
		t.Fatalf("write side got %v", got)
	}
	r.peer.Write(batch(100, 100), 0)
	if got := drain(t, r.d, 100, time.Second); !slices.Equal(got, seq(100, 100)) {
		t.Fatalf("read side got %v", got)
	}
}

func seq(from, n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = from + i
	}
	return s
}

func TestFaultRates(t *testing.T) {
	const n = 4000
	tests := []struct {
		name     string
		opts     Options
		read     bool
		min, max int // packets expected to arrive
		check    func(t *testing.T, got []int, st DirStats)
	}{
		{"write drop 30%", Options{Seed: 1, Write: Rates{Drop: 0.3}}, false, 2600, 3000, func(t *testing.T, got []int, st DirStats) {
			if int(st.Dropped)+len(got) != n {
				t.Errorf("dropped %d + arrived %d != %d", st.Dropped, len(got), n)
			}
			if !slices.IsSorted(got) {
				t.Error("drops reordered packets")
			}
		}},
		{"read drop 10%", Options{Seed: 2, Read: Rates{Drop: 0.1}, ReadQueue: n}, true, 3450, 3750, func(t *testing.T, got []int, st DirStats) {
			if int(st.Dropped)+len(got) != n {
				t.Errorf("dropped %d + arrived %d != %d", st.Dropped, len(got), n)
			}
		}},
		{"duplicate all", Options{Seed: 3, Write: Rates{Duplicate: 1}}, false, 2 * n, 2 * n, func(t *testing.T, got []int, st DirStats) {
			if st.Duplicated != n {
				t.Errorf("Duplicated = %d", st.Duplicated)
			}
		}},
		{"reorder 20%", Options{Seed: 4, Write: Rates{Reorder: 0.2}, ReorderDelay: 5 * time.Millisecond}, false, n, n, func(t *testing.T, got []int, st DirStats) {
			if slices.IsSorted(got) {
				t.Error("nothing reordered")
			}
			sorted := slices.Sorted(slices.Values(got))
			if !slices.Equal(sorted, seq(0, n)) {
				t.Error("reordering lost or invented packets")
			}
			if st.Reordered < n/10 || st.Reordered > n*3/10 {
				t.Errorf("Reordered = %d, want about %d", st.Reordered, n/5)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, tt.opts)
			var got []int
			for i := 0; i < n; i += 100 {
				if tt.read {
					r.peer.Write(batch(i, 100), 0)
				} else {
					r.d.Write(batch(i, 100), 0)
				}
			}
			var st DirStats
			if tt.read {
				got = drain(t, r.d, tt.max, 200*time.Millisecond)
				st = r.d.Stats().Read
			} else {
				got = drain(t, r.peer, tt.max, 200*time.Millisecond)
				st = r.d.Stats().Write
			}
			if len(got) < tt.min || len(got) > tt.max {
				t.Errorf("%d packets arrived, want %d..%d", len(got), tt.min, tt.max)
			}
			if st.Packets != n {
				t.Errorf("Packets = %d, want %d", st.Packets, n)
			}
			tt.check(t, got, st)
		})
	}
}

func TestFaultSeedRepeats(t *testing.T) {
	run := func(seed uint64) []int {
		r := newRig(t, Options{Seed: seed, Write: Rates{Drop: 0.5}})
		r.d.Write(batch(0, 500), 0)
		return drain(t, r.peer, 500, 100*time.Millisecond)
	}
	a, b, c := run(7), run(7), run(8)
	if !slices.Equal(a, b) {
		t.Error("one seed gave two drop patterns")
	}
	if slices.Equal(a, c) {
		t.Error("two seeds gave one drop pattern")
	}
}

func TestFaultDelayDoesNotBlock(t *testing.T) {
	const delay = 50 * time.Millisecond
	r := newRig(t, Options{Write: Rates{Delay: delay}})
	start := time.Now()
	r.d.Write(batch(0, 10), 0)
	if el := time.Since(start); el > delay/2 {
		t.Fatalf("Write blocked %v", el)
	}
	got := drain(t, r.peer, 10, 2*time.Second)
	if el := time.Since(start); el < delay {
		t.Errorf("delayed packets arrived after %v, want ≥ %v", el, delay)
	}
	if !slices.Equal(got, seq(0, 10)) {
		t.Errorf("a fixed delay changed the order: %v", got)
	}
	if st := r.d.Stats().Write; st.Delayed != 10 {
		t.Errorf("Delayed = %d", st.Delayed)
	}
}

func TestFaultReadQueueFullCounted(t *testing.T) {
	r := newRig(t, Options{ReadQueue: 16})
	r.peer.Write(batch(0, 100), 0)
	got := drain(t, r.d, 100, 200*time.Millisecond)
	st := r.d.Stats().Read
	if int(st.QueueFull)+len(got) != 100 || st.QueueFull == 0 {
		t.Errorf("QueueFull %d + arrived %d, want 100 with some full drops", st.QueueFull, len(got))
	}
}

func TestFaultDelayQueueBound(t *testing.T) {
	r := newRig(t, Options{Write: Rates{Delay: time.Hour}, MaxDelayed: 4})
	r.d.Write(batch(0, 10), 0)
	if st := r.d.Stats().Write; st.DelayOverflow != 6 || st.Delayed != 10 {
		t.Errorf("stats = %+v, want 6 overflowed of 10 delayed", st)
	}
}

// TestMain fails the package if a test leaves a goroutine running (a
// delay line after Close).
func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

func TestFaultCloseStopsGoroutines(t *testing.T) {
	before := goleak.IgnoreCurrent()
	a, _ := datapath.NewPipe(datapath.PipeOptions{})
	d := New(a, Options{Write: Rates{Delay: time.Hour}})
	d.Write(batch(0, 3), 0)
	errc := make(chan error)
	go func() {
		_, err := d.Read([][]byte{make([]byte, 1500)}, []int{0}, 0)
		errc <- err
	}()
	time.Sleep(10 * time.Millisecond)
	d.Close()
	if err := <-errc; !errors.Is(err, os.ErrClosed) {
		t.Errorf("pending Read = %v, want os.ErrClosed", err)
	}
	if _, err := d.Write(batch(0, 1), 0); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Write after Close = %v", err)
	}
	goleak.VerifyNone(t, before) // the delay line's goroutine is gone
}

// BenchmarkFault measures packets through the wrapper's write path into a
// memory pair drained by another goroutine, with no faults and with 1 %
// drops and 1 % duplicates, in batches of 64. The writer paces itself on
// the queue depth, so pkts/s counts packets delivered, not shed.
func BenchmarkFault(b *testing.B) {
	const queue = 8192
	for _, c := range []struct {
		name  string
		rates Rates
	}{{"none", Rates{}}, {"drop1%+dup1%", Rates{Drop: 0.01, Duplicate: 0.01}}} {
		b.Run(c.name, func(b *testing.B) {
			x, y := datapath.NewPipe(datapath.PipeOptions{QueueLen: queue})
			d := New(x, Options{Seed: 1, Write: c.rates})
			got := make(chan uint64)
			go func() {
				bufs := make([][]byte, 64)
				for i := range bufs {
					bufs[i] = make([]byte, 1500)
				}
				sizes := make([]int, 64)
				var n uint64
				for {
					k, err := y.Read(bufs, sizes, 0)
					n += uint64(k)
					if err != nil {
						got <- n
						return
					}
				}
			}()
			out := batch(0, 64)
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				for y.Pending() > queue-2*64 {
					runtime.Gosched()
				}
				d.Write(out, 0)
			}
			for deadline := time.Now().Add(5 * time.Second); y.Pending() > 0 && time.Now().Before(deadline); {
				runtime.Gosched()
			}
			el := time.Since(start)
			b.StopTimer()
			d.Close()
			n := <-got
			b.ReportMetric(float64(n)/el.Seconds(), "pkts/s")
			b.ReportMetric(float64(x.Stats().DroppedFull)/float64(b.N*64), "queue-drop-ratio")
		})
	}
}
