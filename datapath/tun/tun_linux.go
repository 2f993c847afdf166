//go:build linux

package tun

import (
	"errors"
	"fmt"
	"golang.org/x/sys/unix"
	"io"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/songgao/water"
	"github.com/vishvananda/netlink"

	"weir/datapath"
)

// Options configure Open. The zero value opens one queue of a TUN named by
// the kernel, MTU 1500, txqueuelen 10000, link up, no address.
type Options struct {
	// Name is the interface name; empty lets the kernel pick (tun0, …).
	Name string
	// MTU is the interface MTU in bytes; zero means 1500.
	MTU int
	// Queues is the number of queues, each its own Device (read by its own
	// worker); zero means 1. More than one sets IFF_MULTI_QUEUE.
	Queues int
	// TxQueueLen is the interface's transmit queue length in packets; zero
	// means 10000. The kernel default (500) drops silently under bursts
	// toward a slow reader.
	TxQueueLen int
	// Addrs are assigned to the interface (e.g. 198.18.0.1/15).
	Addrs []netip.Prefix
	// Routes are routed through the interface.
	Routes []netip.Prefix
	// Down leaves the link down; by default Open sets it up.
	Down bool
}

// Device is one queue of a TUN interface.
type Device struct {
	ifce   *water.Interface
	name   string
	mtu    int
	closed atomic.Bool

	rxPackets, rxBytes, txPackets, txBytes, tooBig, txErrors atomic.Uint64
}

var (
	_ datapath.Device        = (*Device)(nil)
	_ datapath.StatsReporter = (*Device)(nil)
)

// Open creates the TUN interface described by o in the calling thread's
// network namespace, configures it through netlink and returns one Device
// per queue. On error nothing stays open.
func Open(o Options) ([]*Device, error) {
	if o.MTU <= 0 {
		o.MTU = 1500
	}
	if o.Queues <= 0 {
		o.Queues = 1
	}
	if o.TxQueueLen <= 0 {
		o.TxQueueLen = 10000
	}
	var devs []*Device
	fail := func(err error) ([]*Device, error) {
		for _, d := range devs {
			d.Close()
		}
		return nil, err
	}
	name := o.Name
	for q := range o.Queues {
		ifce, err := water.New(water.Config{DeviceType: water.TUN, PlatformSpecificParams: water.PlatformSpecificParams{
			Name: name, MultiQueue: o.Queues > 1,
		}})
		if err != nil {
			return fail(fmt.Errorf("tun: open queue %d of %q: %w", q, name, err))
		}
		name = ifce.Name()
		devs = append(devs, &Device{ifce: ifce, name: name, mtu: o.MTU})
	}
	if err := configure(name, o); err != nil {
		return fail(err)
	}
	return devs, nil
}

// configure sets the link's MTU, txqueuelen, addresses, state and routes.
func configure(name string, o Options) error {
	// Only rtnetlink: a handle for every family would also open XFRM and
	// netfilter sockets, which fail on kernels without those modules.
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("tun: netlink: %w", err)
	}
	defer h.Close()
	link, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("tun: %s: %w", name, err)
	}
	if err := h.LinkSetMTU(link, o.MTU); err != nil {
		return fmt.Errorf("tun: %s: set MTU %d: %w", name, o.MTU, err)
	}
	if err := h.LinkSetTxQLen(link, o.TxQueueLen); err != nil {
		return fmt.Errorf("tun: %s: set txqueuelen %d: %w", name, o.TxQueueLen, err)
	}
	for _, p := range o.Addrs {
		a := &netlink.Addr{IPNet: prefixNet(p)}
		if p.Addr().Is6() {
			a.Flags = syscall.IFA_F_NODAD // usable at once, no duplicate detection on a point-to-point TUN
		}
		if err := h.AddrAdd(link, a); err != nil {
			return fmt.Errorf("tun: %s: add address %v: %w", name, p, err)
		}
	}
	if o.Down {
		return nil
	}
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("tun: %s: set up: %w", name, err)
	}
	waitLocal(h, o.Addrs)
	for _, p := range o.Routes {
		r := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: prefixNet(p.Masked())}
		if err := h.RouteReplace(r); err != nil {
			return fmt.Errorf("tun: %s: route %v: %w", name, p, err)
		}
	}
	return nil
}

// rtnLocal is RTN_LOCAL, the route type of an address of this host.
const rtnLocal = 2

// waitLocal waits, up to a second, until each IPv6 address's local route
// exists. The kernel installs it from a workqueue after the link comes up;
// until then a packet to the address is taken for one to forward and
// dropped (Ip6InAddrErrors). IPv4 local routes are synchronous.
func waitLocal(h *netlink.Handle, addrs []netip.Prefix) {
	deadline := time.Now().Add(time.Second)
	for _, p := range addrs {
		if !p.Addr().Is6() {
			continue
		}
		for time.Now().Before(deadline) {
			rs, err := h.RouteGet(p.Addr().AsSlice())
			if err == nil && len(rs) > 0 && rs[0].Type == rtnLocal {
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// Name returns the interface name.
func (d *Device) Name() string { return d.name }

// Read implements datapath.Device: it blocks until one packet arrives and
// returns it in bufs[0][offset:]. A packet longer than the buffer is
// dropped and counted, and Read waits for the next. After Close it
// returns os.ErrClosed.
func (d *Device) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	if len(bufs) == 0 {
		return 0, nil
	}
	for {
		b := bufs[0][offset:]
		n, err := d.ifce.Read(b)
		if err != nil {
			if d.closed.Load() || errors.Is(err, os.ErrClosed) || errors.Is(err, syscall.EBADFD) || errors.Is(err, io.EOF) {
				return 0, os.ErrClosed
			}
			if errors.Is(err, syscall.EMSGSIZE) || errors.Is(err, syscall.EINVAL) {
				d.tooBig.Add(1)
				continue
			}
			return 0, fmt.Errorf("tun: %s: read: %w", d.name, err)
		}
		if n == len(b) && n < d.mtu {
			// A buffer shorter than the MTU came back full: the packet
			// was probably longer and truncated by the kernel.
			d.tooBig.Add(1)
			continue
		}
		sizes[0] = n
		d.rxPackets.Add(1)
		d.rxBytes.Add(uint64(n))
		return 1, nil
	}
}

// Write implements datapath.Device: one write(2) per packet. A packet over
// the MTU, or one the kernel rejects (a malformed header), is dropped and
// counted, and the rest of the batch is still written.
func (d *Device) Write(bufs [][]byte, offset int) (int, error) {
	if d.closed.Load() {
		return 0, os.ErrClosed
	}
	for _, buf := range bufs {
		if offset > len(buf) || len(buf)-offset > d.mtu {
			d.tooBig.Add(1)
			continue
		}
		p := buf[offset:]
		if _, err := d.ifce.Write(p); err != nil {
			if d.closed.Load() || errors.Is(err, os.ErrClosed) {
				return 0, os.ErrClosed
			}
			d.txErrors.Add(1)
			continue
		}
		d.txPackets.Add(1)
		d.txBytes.Add(uint64(len(p)))
	}
	return len(bufs), nil
}

// BatchSize implements datapath.Device: water reads one packet per call.
func (d *Device) BatchSize() int { return 1 }

// MTU implements datapath.Device.
func (d *Device) MTU() int { return d.mtu }

// Close implements datapath.Device: it closes the queue, which wakes a
// pending Read. The interface goes away with its last queue.
func (d *Device) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	return d.ifce.Close()
}

// Stats implements datapath.StatsReporter. DroppedTooBig counts packets
// over the MTU or the buffer; WriteErrors those the kernel refused.
func (d *Device) Stats() datapath.DeviceStats {
	return datapath.DeviceStats{
		RxPackets: d.rxPackets.Load(), RxBytes: d.rxBytes.Load(),
		TxPackets: d.txPackets.Load(), TxBytes: d.txBytes.Load(),
		DroppedTooBig: d.tooBig.Load(),
	}
}

// WriteErrors returns the number of packets the kernel refused on write.
func (d *Device) WriteErrors() uint64 { return d.txErrors.Load() }
