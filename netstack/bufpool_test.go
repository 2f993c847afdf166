package netstack

import (
	"errors"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"weir/internal/testutil"
	"weir/netstack/proxy"
)

// TestReadableLegs pins readable and waitReadable on a gVisor Conn (the
// client's end through weir): not readable while the peer is silent, woken
// by data, readable at EOF, woken by the read deadline.
func TestReadableLegs(t *testing.T) {
	type pair struct {
		leg interface {
			readable() bool
			waitReadable()
			net.Conn
		}
		peer chan net.Conn // the far end, once connected
	}
	gvisorPair := func(t *testing.T) pair {
		peer := make(chan net.Conn, 1)
		r, vip := benchRig(t, true, func(c net.Conn) { peer <- c; io.Copy(io.Discard, c) })
		return pair{leg: dial(t, r.client, vip), peer: peer}
	}
	for name, mk := range map[string]func(*testing.T) pair{"gvisor": gvisorPair} {
		t.Run(name, func(t *testing.T) {
			p := mk(t)
			defer p.leg.Close()
			var peer net.Conn
			select {
			case peer = <-p.peer:
			case <-time.After(10 * time.Second):
				t.Fatal("no peer connection")
			}
			if p.leg.readable() {
				t.Fatal("readable before the peer sent anything")
			}
			woke := make(chan struct{})
			go func() { p.leg.waitReadable(); close(woke) }()
			select {
			case <-woke:
				t.Fatal("waitReadable returned with nothing to read")
			case <-time.After(50 * time.Millisecond):
			}
			peer.Write([]byte("x"))
			select {
			case <-woke:
			case <-time.After(10 * time.Second):
				t.Fatal("waitReadable not woken by data")
			}
			if !p.leg.readable() {
				t.Fatal("not readable with a byte waiting")
			}
			buf := make([]byte, 8)
			if n, err := p.leg.Read(buf); n != 1 || err != nil {
				t.Fatalf("Read = %d, %v", n, err)
			}
			// The read deadline ends a wait.
			p.leg.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			within(t, 10*time.Second, "waitReadable past the read deadline", p.leg.waitReadable)
			p.leg.SetReadDeadline(time.Time{})
			// EOF is readable.
			peer.Close()
			within(t, 10*time.Second, "waitReadable at EOF", p.leg.waitReadable)
			if !p.leg.readable() {
				t.Fatal("not readable at EOF")
			}
		})
	}
}

// TestHostConnReadLent pins ReadLent on a HostConn (loopback): it holds no
// buffer while the peer is silent, reads into the one it takes once data
// comes, keeps a given buffer only while data is waiting, and ends its wait
// at the read deadline (an error), at EOF and at Close.
func TestHostConnReadLent(t *testing.T) {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	peers := make(chan net.Conn, 2)
	t.Cleanup(serveListener(l, func(c net.Conn) { peers <- c; io.Copy(io.Discard, c) }))
	open := func() (*HostConn, net.Conn) {
		tc, err := net.DialTCP("tcp4", nil, l.Addr().(*net.TCPAddr))
		if err != nil {
			t.Fatal(err)
		}
		select {
		case p := <-peers:
			return &HostConn{TCPConn: tc}, p
		case <-time.After(10 * time.Second):
			t.Fatal("no peer connection")
		}
		return nil, nil
	}
	var gets atomic.Int64
	pool := &sync.Pool{New: func() any { gets.Add(1); b := make([]byte, 8); return &b }}
	type result struct {
		bp  *[]byte
		n   int
		err error
	}
	read := func(c *HostConn, bp *[]byte) <-chan result {
		ch := make(chan result, 1)
		go func() { bp, n, err := c.ReadLent(pool, bp); ch <- result{bp, n, err} }()
		return ch
	}
	wait := func(ch <-chan result, what string) result {
		t.Helper()
		select {
		case r := <-ch:
			return r
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: ReadLent still blocked", what)
		}
		return result{}
	}

	c, peer := open()
	defer c.Close()
	ch := read(c, nil)
	select {
	case r := <-ch:
		t.Fatalf("ReadLent returned with nothing to read: %+v", r)
	case <-time.After(50 * time.Millisecond):
	}
	peer.Write([]byte("abc"))
	r := wait(ch, "data")
	if r.n != 3 || r.err != nil || r.bp == nil || string((*r.bp)[:3]) != "abc" {
		t.Fatalf("readLent = %d, %v, buffer %v", r.n, r.err, r.bp)
	}
	// Data waiting: the buffer given is the buffer used.
	peer.Write([]byte("d"))
	time.Sleep(20 * time.Millisecond)
	if r2 := wait(read(c, r.bp), "more data"); r2.n != 1 || r2.bp != r.bp {
		t.Fatalf("with data waiting: %d bytes into %p, want 1 into the given %p", r2.n, r2.bp, r.bp)
	}
	// Nothing waiting: the buffer goes back while readLent waits, and the
	// read deadline ends the wait with a timeout.
	c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	r3 := wait(read(c, r.bp), "the read deadline")
	var ne net.Error
	if r3.bp != nil || r3.n != 0 || !errors.As(r3.err, &ne) || !ne.Timeout() {
		t.Fatalf("past the read deadline: buffer %v, %d, %v; want none, 0, a timeout", r3.bp, r3.n, r3.err)
	}
	c.SetReadDeadline(time.Time{})
	// EOF.
	peer.Close()
	if r4 := wait(read(c, nil), "EOF"); r4.n != 0 || r4.err != io.EOF {
		t.Fatalf("at EOF: %d, %v", r4.n, r4.err)
	}

	// Close ends a wait.
	c2, _ := open()
	ch = read(c2, nil)
	time.Sleep(20 * time.Millisecond)
	c2.Close()
	if r5 := wait(ch, "Close"); r5.err == nil || r5.bp != nil {
		t.Fatalf("after Close: %v, buffer %v", r5.err, r5.bp)
	}
	if n := gets.Load(); n > 4 {
		t.Errorf("%d buffers made for 4 reads that found data", n)
	}
}

// within runs f and fails the test if it takes longer than d.
func within(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { f(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s: still blocked after %v", what, d)
	}
}

// TestIdleSpliceHoldsNoBuffer: idle spliced connections (one request and
// its answer each, then silence) cost far less than the two splice buffers
// a connection used to hold while blocked in Read (2 × BufferSize = 64 KiB):
// the Go heap in use grows by less than 1.5 BufferSize per connection, for
// everything (weir's legs and splice, the client stack's endpoints, the
// target's handler) together.
func TestIdleSpliceHoldsNoBuffer(t *testing.T) {
	const n = 200
	r, vip := benchRig(t, true, func(c net.Conn) {
		b := make([]byte, 1)
		if _, err := c.Read(b); err == nil {
			c.Write(b)
			io.Copy(io.Discard, c)
		}
	})
	// Warm the pools and the stacks' tables with one connection first.
	warm := dial(t, r.client, vip)
	warm.Write([]byte("w"))
	io.ReadFull(warm, make([]byte, 1))
	heap := func() (heap, stacks int64) {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return int64(ms.HeapInuse), int64(ms.StackInuse)
	}
	// Earlier tests' rigs may still be winding down: start from a heap
	// that has stopped shrinking.
	heap0, stacks0 := heap()
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		h, s := heap()
		settled := h > heap0-64<<10
		heap0, stacks0 = h, s
		if settled {
			break
		}
	}
	conns := make([]*Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
		warm.Close()
	}()
	for range n {
		c := dial(t, r.client, vip)
		conns = append(conns, c)
		if _, err := c.Write([]byte("q")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond) // the last halves block in their waits
	heap1, stacks1 := heap()
	per := float64(heap1-heap0) / n
	perStack := float64(stacks1-stacks0) / n
	t.Logf("%d idle spliced connections: %.1f KiB heap, %.1f KiB stacks each (the client's and the target's ends included)",
		n, per/1024, perStack/1024)
	// Measured: 28 KiB with the buffers lent, 91 KiB with them held (the
	// race detector adds ~20 KiB of its own).
	if per >= 1.5*proxy.DefaultBufferSize && !testutil.Race {
		t.Errorf("an idle spliced connection costs %.1f KiB of heap, want < %d KiB: the splice holds its buffers while idle", per/1024, 3*proxy.DefaultBufferSize/2>>10)
	}
	// Measured: 16 KiB with each half on a goroutine of its own, 44 KiB
	// with one half parked under the serving goroutine's frames (its stack
	// could not shrink below 8 KiB; the others' stacks are in both).
	if perStack >= 28<<10 && !testutil.Race {
		t.Errorf("an idle spliced connection holds %.1f KiB of goroutine stacks, want < 28 KiB: a splice half parks deep in a stack the runtime cannot shrink", perStack/1024)
	}
}

// TestHostConnCounters: a host leg's TCP_INFO reading counts what moved
// (the segments both ways, the data segments of 64 KiB sent and echoed)
// without allocating, and after Close returns the last values read.
func TestHostConnCounters(t *testing.T) {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(serveListener(l, func(c net.Conn) { io.Copy(c, c) }))
	tc, err := net.DialTCP("tcp4", nil, l.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	c := &HostConn{TCPConn: tc}
	defer c.Close()
	if got := c.Counters(); got.SegmentsSent == 0 || got.DataSegmentsOut != 0 {
		t.Errorf("after the handshake: %+v; want segments sent, no data", got)
	}
	const size = 64 << 10
	go c.Write(make([]byte, size))
	if _, err := io.ReadFull(c, make([]byte, size)); err != nil {
		t.Fatal(err)
	}
	got := c.Counters()
	if got.DataSegmentsOut == 0 || got.DataSegmentsIn == 0 || got.SegmentsReceived < got.DataSegmentsIn || got.RTT == 0 {
		t.Errorf("after 64 KiB each way: %+v", got)
	}
	if allocs := testing.AllocsPerRun(100, func() { c.Counters() }); allocs != 0 {
		t.Errorf("Counters: %.1f allocations per call, want 0", allocs)
	}
	c.Close()
	if after := c.Counters(); after.DataSegmentsOut < got.DataSegmentsOut || after.SegmentsSent < got.SegmentsSent {
		t.Errorf("after Close: %+v, before %+v", after, got)
	}
}
