package datapath

import (
	"os"
	"sync"
)

// EgressOnly is a Device that writes through another and reads nothing.
//
// It is the back arm through the front device: `weir run` has one
// transport, the TUN, and its back arm is a second gVisor NIC with its own
// addresses (routed into the TUN by the host) whose packets leave through
// the front device and whose replies come back through it:
//
//	dial ─► back NIC (source: the arm's address) ─► EgressOnly.Write ─►
//	        engine Port (measures to_target) ─► TUN ─► kernel routes to the target
//	reply ─► kernel routes the arm's address into the TUN ─► engine (measures
//	        from_target) ─► front NIC (promiscuous: it takes any destination)
//	        ─► the stack's demuxer hands it to the dialed endpoint, whatever
//	        NIC it arrived on
//
// So the back NIC only sends: Read blocks until Close.
type EgressOnly struct {
	out       Device
	closed    chan struct{}
	closeOnce sync.Once
}

var (
	_ Device    = (*EgressOnly)(nil)
	_ Offloader = (*EgressOnly)(nil)
)

// NewEgressOnly returns a Device whose writes go to out and whose reads
// block until Close. Closing it leaves out open (its owner closes it).
func NewEgressOnly(out Device) *EgressOnly {
	return &EgressOnly{out: out, closed: make(chan struct{})}
}

// Read implements Device: it blocks until Close, then returns os.ErrClosed.
func (d *EgressOnly) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	<-d.closed
	return 0, os.ErrClosed
}

// Write implements Device through the wrapped device; after Close it
// returns os.ErrClosed and writes nothing.
func (d *EgressOnly) Write(bufs [][]byte, offset int) (int, error) {
	select {
	case <-d.closed:
		return 0, os.ErrClosed
	default:
	}
	return d.out.Write(bufs, offset)
}

// BatchSize implements Device: the wrapped device's.
func (d *EgressOnly) BatchSize() int { return d.out.BatchSize() }

// MTU implements Device: the wrapped device's.
func (d *EgressOnly) MTU() int { return d.out.MTU() }

// Close implements Device: it ends Read; the wrapped device stays open.
func (d *EgressOnly) Close() error {
	d.closeOnce.Do(func() { close(d.closed) })
	return nil
}

// GSOMaxSize implements Offloader: the wrapped device's, so that the arm's
// link writes the virtio-net headers an offload TUN needs (and may send
// super-packets) like the front NIC's.
func (d *EgressOnly) GSOMaxSize() int { return GSOMaxSize(d.out) }
