package datapath

import (
	"bytes"
	"errors"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"
)

func makeBatch(n, size, offset int) [][]byte {
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, offset+size)
	}
	return bufs
}

func TestPipeDelivers(t *testing.T) {
	tests := []struct {
		name    string
		opts    PipeOptions
		packets []int // lengths written from a to b
		offset  int
	}{
		{"one", PipeOptions{}, []int{60}, 0},
		{"batch", PipeOptions{}, []int{40, 1500, 0, 576}, 0},
		{"offset", PipeOptions{}, []int{40, 100}, 16},
		{"small mtu", PipeOptions{MTU: 128}, []int{128, 1}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := NewPipe(tt.opts)
			defer a.Close()
			var out [][]byte
			for i, n := range tt.packets {
				p := make([]byte, tt.offset+n)
				for j := range p[tt.offset:] {
					p[tt.offset+j] = byte(i + j)
				}
				out = append(out, p)
			}
			n, err := a.Write(out, tt.offset)
			if err != nil || n != len(out) {
				t.Fatalf("Write = %d, %v; want %d, nil", n, err, len(out))
			}
			in := makeBatch(len(out), 1500, tt.offset)
			sizes := make([]int, len(in))
			n, err = b.Read(in, sizes, tt.offset)
			if err != nil || n != len(out) {
				t.Fatalf("Read = %d, %v; want %d, nil", n, err, len(out))
			}
			for i := range out {
				got := in[i][tt.offset : tt.offset+sizes[i]]
				if !bytes.Equal(got, out[i][tt.offset:]) {
					t.Errorf("packet %d: got % x, want % x", i, got, out[i][tt.offset:])
				}
			}
			st := b.Stats()
			if st.RxPackets != uint64(len(out)) {
				t.Errorf("b RxPackets = %d, want %d", st.RxPackets, len(out))
			}
			if a.Stats().TxPackets != uint64(len(out)) {
				t.Errorf("a TxPackets = %d, want %d", a.Stats().TxPackets, len(out))
			}
		})
	}
}

func TestPipeFullQueueDropsAndCounts(t *testing.T) {
	a, b := NewPipe(PipeOptions{QueueLen: 4})
	defer a.Close()
	pkts := makeBatch(10, 20, 0)
	n, err := a.Write(pkts, 0)
	if err != nil || n != 10 {
		t.Fatalf("Write = %d, %v; want 10, nil", n, err)
	}
	st := a.Stats()
	if st.TxPackets != 4 || st.DroppedFull != 6 {
		t.Fatalf("stats = %+v; want 4 sent, 6 dropped full", st)
	}
	in := makeBatch(10, 20, 0)
	sizes := make([]int, 10)
	if n, err := b.Read(in, sizes, 0); n != 4 || err != nil {
		t.Fatalf("Read = %d, %v; want 4, nil", n, err)
	}
}

func TestPipeTooBig(t *testing.T) {
	a, b := NewPipe(PipeOptions{MTU: 100})
	defer a.Close()
	if _, err := a.Write([][]byte{make([]byte, 101), make([]byte, 100)}, 0); err != nil {
		t.Fatal(err)
	}
	if got := a.Stats().DroppedTooBig; got != 1 {
		t.Errorf("write DroppedTooBig = %d, want 1", got)
	}
	// A reader buffer too small for the queued packet drops it too.
	if _, err := a.Write([][]byte{make([]byte, 10)}, 0); err != nil {
		t.Fatal(err)
	}
	in := [][]byte{make([]byte, 50)}
	sizes := []int{0}
	n, err := b.Read(in, sizes, 0)
	if n != 1 || err != nil || sizes[0] != 10 {
		t.Fatalf("Read = %d, %v, size %d; want 1, nil, 10", n, err, sizes[0])
	}
	if got := b.Stats().DroppedTooBig; got != 1 {
		t.Errorf("read DroppedTooBig = %d, want 1", got)
	}
}

func TestPipeReadBlocksUntilWrite(t *testing.T) {
	a, b := NewPipe(PipeOptions{})
	defer a.Close()
	got := make(chan int, 1)
	go func() {
		in := makeBatch(4, 1500, 0)
		sizes := make([]int, 4)
		n, _ := b.Read(in, sizes, 0)
		got <- n
	}()
	select {
	case n := <-got:
		t.Fatalf("Read returned %d before any Write", n)
	case <-time.After(20 * time.Millisecond):
	}
	if _, err := a.Write(makeBatch(1, 30, 0), 0); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-got:
		if n != 1 {
			t.Fatalf("Read = %d, want 1", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Read did not return after Write")
	}
}

func TestPipeCloseWakesReaders(t *testing.T) {
	for _, closer := range []string{"reader end", "peer end"} {
		t.Run(closer, func(t *testing.T) {
			a, b := NewPipe(PipeOptions{})
			errs := make(chan error, 2)
			var wg sync.WaitGroup
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := b.Read(makeBatch(1, 1500, 0), make([]int, 1), 0)
					errs <- err
				}()
			}
			time.Sleep(10 * time.Millisecond)
			if closer == "reader end" {
				b.Close()
			} else {
				a.Close()
			}
			wg.Wait()
			for range 2 {
				if err := <-errs; !errors.Is(err, os.ErrClosed) {
					t.Errorf("pending Read error = %v, want os.ErrClosed", err)
				}
			}
			if _, err := a.Write(makeBatch(1, 10, 0), 0); !errors.Is(err, os.ErrClosed) {
				t.Errorf("Write after Close = %v, want os.ErrClosed", err)
			}
			if _, err := a.Read(makeBatch(1, 10, 0), make([]int, 1), 0); !errors.Is(err, os.ErrClosed) {
				t.Errorf("Read after Close = %v, want os.ErrClosed", err)
			}
			if err := a.Close(); err != nil {
				t.Errorf("second Close = %v", err)
			}
		})
	}
}

func TestPipeZeroAllocs(t *testing.T) {
	a, b := NewPipe(PipeOptions{})
	defer a.Close()
	out := makeBatch(32, 100, 0)
	in := makeBatch(32, 1500, 0)
	sizes := make([]int, 32)
	allocs := testing.AllocsPerRun(100, func() {
		a.Write(out, 0)
		b.Read(in, sizes, 0)
	})
	if allocs != 0 {
		t.Errorf("Write+Read allocate %.1f times per batch, want 0", allocs)
	}
}

// BenchmarkPipeSameGoroutine measures the cost of one batch of 64 100-byte
// packets written and read back by one goroutine: the copy and lock cost
// without scheduling.
func BenchmarkPipeSameGoroutine(b *testing.B) {
	const batch = 64
	x, y := NewPipe(PipeOptions{})
	defer x.Close()
	out := makeBatch(batch, 100, 0)
	in := makeBatch(batch, 1500, 0)
	sizes := make([]int, batch)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		x.Write(out, 0)
		y.Read(in, sizes, 0)
	}
	b.ReportMetric(float64(b.N)*batch/time.Since(start).Seconds(), "pkts/s")
}

// BenchmarkPipe measures a writer and a reader goroutine moving 100-byte
// packets through a pair in batches of 64. The writer paces itself on the
// queue depth (Pending), as a sender with flow control would, so pkts/s is
// the pair's throughput and drop-ratio stays near zero.
func BenchmarkPipe(b *testing.B) {
	const batch, queue = 64, 4096
	x, y := NewPipe(PipeOptions{QueueLen: queue})
	out := makeBatch(batch, 100, 0)
	done := make(chan uint64)
	go func() {
		in := makeBatch(batch, 1500, 0)
		sizes := make([]int, batch)
		var got uint64
		for {
			n, err := y.Read(in, sizes, 0)
			got += uint64(n)
			if err != nil {
				done <- got
				return
			}
		}
	}()
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		for y.Pending() > queue-batch {
			runtime.Gosched()
		}
		x.Write(out, 0)
	}
	for deadline := time.Now().Add(5 * time.Second); y.Pending() > 0 && time.Now().Before(deadline); {
		runtime.Gosched()
	}
	elapsed := time.Since(start)
	x.Close()
	got := <-done
	b.StopTimer()
	sent := uint64(b.N) * batch
	b.ReportMetric(float64(got)/elapsed.Seconds(), "pkts/s")
	b.ReportMetric(float64(sent-got)/float64(sent), "drop-ratio")
}
