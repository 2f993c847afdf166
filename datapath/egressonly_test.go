package datapath

import (
	"bytes"
	"errors"
	"os"
	"testing"
)

// TestEgressOnly pins the back arm's device: writes reach the wrapped
// device's peer, Read returns only at Close (with os.ErrClosed), Close
// leaves the wrapped device open, and writes after Close are refused.
func TestEgressOnly(t *testing.T) {
	a, b := NewPipe(PipeOptions{MTU: 1400, BatchSize: 7})
	defer a.Close()
	e := NewEgressOnly(a)
	if e.MTU() != 1400 || e.BatchSize() != 7 {
		t.Fatalf("MTU %d batch %d, want the wrapped device's 1400 and 7", e.MTU(), e.BatchSize())
	}
	if GSOMaxSize(e) != GSOMaxSize(a) {
		t.Fatalf("GSOMaxSize %d, want the wrapped device's %d", GSOMaxSize(e), GSOMaxSize(a))
	}

	pkt := []byte("a packet through the front device")
	if n, err := e.Write([][]byte{append([]byte{0, 0}, pkt...)}, 2); n != 1 || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	bufs, sizes := makeBatch(1, 1400, 0), make([]int, 1)
	if n, err := b.Read(bufs, sizes, 0); n != 1 || err != nil || !bytes.Equal(bufs[0][:sizes[0]], pkt) {
		t.Fatalf("peer Read = %d, %v, %q; want the written packet", n, err, bufs[0][:sizes[0]])
	}

	read := make(chan error, 1)
	go func() {
		_, err := e.Read(makeBatch(1, 1400, 0), make([]int, 1), 0)
		read <- err
	}()
	// Nothing a peer writes comes out of the egress-only device.
	if _, err := b.Write([][]byte{pkt}, 0); err != nil {
		t.Fatal(err)
	}
	if n := a.Pending(); n != 1 {
		t.Fatalf("wrapped device holds %d packets, want the 1 the egress-only Read must not take", n)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-read; !errors.Is(err, os.ErrClosed) {
		t.Fatalf("Read after Close: %v, want os.ErrClosed", err)
	}
	if n, err := e.Write([][]byte{pkt}, 0); n != 0 || !errors.Is(err, os.ErrClosed) {
		t.Fatalf("Write after Close = %d, %v; want 0, os.ErrClosed", n, err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	// The wrapped device is still open.
	if n, err := a.Write([][]byte{pkt}, 0); n != 1 || err != nil {
		t.Fatalf("wrapped Write after Close = %d, %v; want it open", n, err)
	}
}
