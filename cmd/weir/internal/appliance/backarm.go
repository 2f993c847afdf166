package appliance

import (
	"net/netip"
	"os"
	"sync"

	"weir/datapath"
)

// A back arm through the front device
//
// `weir run` has one transport, the TUN. Its back arm is a second gVisor
// NIC with its own addresses (BackArm.Addrs, routed into the TUN by the
// host) whose packets leave through the front device and come back through
// it:
//
//	dial ─► back NIC (source: the arm's address) ─► egressOnly.Write ─►
//	        engine Port (measures to_target) ─► TUN ─► kernel routes to the target
//	reply ─► kernel routes the arm's address into the TUN ─► engine (measures
//	        from_target) ─► front NIC (promiscuous: it takes any destination)
//	        ─► the stack's demuxer hands it to the dialed endpoint, whatever
//	        NIC it arrived on
//
// So the back NIC only sends: egressOnly's Read blocks until Close.

// egressOnly is a Device that writes through another and reads nothing.
type egressOnly struct {
	out       datapath.Device
	closed    chan struct{}
	closeOnce sync.Once
}

var _ datapath.Device = (*egressOnly)(nil)

func newEgressOnly(out datapath.Device) *egressOnly {
	return &egressOnly{out: out, closed: make(chan struct{})}
}

// Read implements datapath.Device: it blocks until Close, then returns
// os.ErrClosed.
func (d *egressOnly) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	<-d.closed
	return 0, os.ErrClosed
}

// Write implements datapath.Device through the front device.
func (d *egressOnly) Write(bufs [][]byte, offset int) (int, error) {
	select {
	case <-d.closed:
		return 0, os.ErrClosed
	default:
	}
	return d.out.Write(bufs, offset)
}

// BatchSize implements datapath.Device.
func (d *egressOnly) BatchSize() int { return d.out.BatchSize() }

// MTU implements datapath.Device.
func (d *egressOnly) MTU() int { return d.out.MTU() }

// Close implements datapath.Device: it ends Read; the front device stays
// open (the front NIC owns it).
func (d *egressOnly) Close() error {
	d.closeOnce.Do(func() { close(d.closed) })
	return nil
}

// backPrefixes are the back arms' own addresses, each as a host prefix: the
// engine measures the TCP flows whose weir end is one of them.
func backPrefixes(arms []BackArm) []netip.Prefix {
	var out []netip.Prefix
	for _, arm := range arms {
		for _, p := range arm.Addrs {
			out = append(out, netip.PrefixFrom(p.Addr().Unmap(), p.Addr().Unmap().BitLen()))
		}
	}
	return out
}

// GSOMaxSize implements datapath.Offloader: the front device's, so that
// the arm's link writes the virtio-net headers an offload TUN needs (and
// may send super-packets) like the front NIC's.
func (d *egressOnly) GSOMaxSize() int { return datapath.GSOMaxSize(d.out) }
