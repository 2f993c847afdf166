package netstack

import (
	"io"
	"net"
	"runtime"
	"testing"
	"time"
)

// TestReadableLegs pins readable and waitReadable on both kinds of leg: a
// gVisor Conn (the client's end through weir) and a HostConn (loopback):
// not readable while the peer is silent, woken by data, readable at EOF,
// woken by the read deadline and by Close.
func TestReadableLegs(t *testing.T) {
	type pair struct {
		leg interface {
			readableLeg
			net.Conn
		}
		peer chan net.Conn // the far end, once connected
	}
	gvisorPair := func(t *testing.T) pair {
		peer := make(chan net.Conn, 1)
		r, vip := benchRig(t, true, func(c net.Conn) { peer <- c; io.Copy(io.Discard, c) })
		return pair{leg: dial(t, r.client, vip), peer: peer}
	}
	hostPair := func(t *testing.T) pair {
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		peer := make(chan net.Conn, 1)
		t.Cleanup(serveListener(l, func(c net.Conn) { peer <- c; io.Copy(io.Discard, c) }))
		tc, err := net.DialTCP("tcp4", nil, l.Addr().(*net.TCPAddr))
		if err != nil {
			t.Fatal(err)
		}
		return pair{leg: &HostConn{TCPConn: tc}, peer: peer}
	}
	for name, mk := range map[string]func(*testing.T) pair{"gvisor": gvisorPair, "host": hostPair} {
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
	t.Logf("%d idle spliced connections: %.1f KiB heap, %.1f KiB stacks each (the client's and the target's ends included)",
		n, per/1024, float64(stacks1-stacks0)/n/1024)
	// Measured: 28 KiB with the buffers lent, 91 KiB with them held.
	if per >= 1.5*DefaultBufferSize {
		t.Errorf("an idle spliced connection costs %.1f KiB of heap, want < %d KiB: the splice holds its buffers while idle", per/1024, 3*DefaultBufferSize/2>>10)
	}
}
