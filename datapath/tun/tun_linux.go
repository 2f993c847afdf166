//go:build linux

package tun

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/songgao/water"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"weir/datapath"
	"weir/policy"
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
	// Routes are routed through the interface (weir run: VIPRoutes of its
	// config); SyncRoutes changes them later.
	Routes []netip.Prefix
	// Down leaves the link down; by default Open sets it up.
	Down bool
	// Offload picks plain queues (OffloadOff, the zero value) or queues
	// with virtio-net headers and TCP segmentation offload (OffloadOn;
	// OffloadAuto when the kernel allows it): see offload_linux.go.
	Offload OffloadMode
}

// Device is one queue of a TUN interface.
type Device struct {
	ifce   *water.Interface // a plain queue; nil when vnet is set
	vnet   *vnetQueue       // an offload queue; nil when ifce is set
	name   string
	mtu    int
	link   *link // shared by every queue of the interface
	closed atomic.Bool

	rxPackets, rxBytes, txPackets, txBytes, tooBig, txErrors atomic.Uint64
}

// link is the interface the queues share: a netlink socket opened in the
// interface's network namespace at Open, so that routes and counters can be
// read and changed later from any goroutine (a reload runs on a thread that
// may be elsewhere), and closed with the last queue.
type link struct {
	mu    sync.Mutex // serialises requests on h
	h     *netlink.Handle
	index int
	refs  atomic.Int32
}

func (l *link) release() {
	if l.refs.Add(-1) == 0 {
		l.mu.Lock()
		l.h.Close()
		l.mu.Unlock()
	}
}

// MaxNameLen is the longest interface name Linux accepts (IFNAMSIZ - 1).
const MaxNameLen = unix.IFNAMSIZ - 1

// ValidName reports why the kernel would refuse or mangle name as an
// interface name: it must be 1 to 15 bytes, not "." or "..", without '/',
// ':' or white space. Open checks a non-empty Options.Name with it; weir run
// checks --tun before it touches anything.
func ValidName(name string) error {
	switch {
	case name == "":
		return errors.New("tun: empty interface name")
	case len(name) > MaxNameLen:
		return fmt.Errorf("tun: interface name %q is %d bytes long; Linux allows at most %d", name, len(name), MaxNameLen)
	case name == "." || name == "..":
		return fmt.Errorf("tun: %q is not an interface name", name)
	case strings.ContainsAny(name, "/: \t\n\r\v\f"):
		return fmt.Errorf("tun: interface name %q contains '/', ':' or white space", name)
	}
	return nil
}

// MaxDefaultQueues caps DefaultQueues: beyond it more readers only split
// the flows thinner without another core to run them.
const MaxDefaultQueues = 8

// DefaultQueues is the number of queues to open when the user names none:
// one per two CPU cores the process may use, at least 1 and at most
// MaxDefaultQueues. Each queue has its own worker, and the kernel keeps
// every flow on one queue, so a flow's packets stay in order (see
// TestTUNMultiqueueFlowsPinned). Half the cores, not all: every packet
// costs the kernel's side of the TUN (and the sockets to the targets) about
// as much again, on other cores. Measured with weirbench on a shared 2-core
// machine, 3 interleaved runs each: 2 queues carried 0.44/0.41/0.43 of the
// kernel's 1 stream/4 streams/reverse throughput where 1 queue carried
// 0.49/0.64/0.51, at 1.64 against 1.39 CPU seconds per GB; connection rates
// were equal. So a 2-core machine gets 1 queue, 4 cores get 2.
func DefaultQueues() int {
	return min(max(runtime.GOMAXPROCS(0)/2, 1), MaxDefaultQueues)
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
	if o.Name != "" {
		if err := ValidName(o.Name); err != nil {
			return nil, err
		}
	}
	var devs []*Device
	fail := func(err error) ([]*Device, error) {
		for _, d := range devs {
			d.Close()
		}
		return nil, err
	}
	name := o.Name
	if o.Offload != OffloadOff {
		for q := range o.Queues {
			vq, n, err := openVnet(name, o.Queues > 1)
			if err != nil {
				if q == 0 && o.Offload == OffloadAuto && errors.Is(err, errNoOffload) {
					break // fall back to water below
				}
				return fail(fmt.Errorf("tun: open offload queue %d of %q: %w", q, name, err))
			}
			name = n
			devs = append(devs, &Device{vnet: vq, name: name, mtu: o.MTU})
		}
	}
	for q := len(devs); q < o.Queues; q++ {
		ifce, err := water.New(water.Config{DeviceType: water.TUN, PlatformSpecificParams: water.PlatformSpecificParams{
			Name: name, MultiQueue: o.Queues > 1,
		}})
		if err != nil {
			return fail(fmt.Errorf("tun: open queue %d of %q: %w", q, name, err))
		}
		name = ifce.Name()
		devs = append(devs, &Device{ifce: ifce, name: name, mtu: o.MTU})
	}
	// Only rtnetlink: a handle for every family would also open XFRM and
	// netfilter sockets, which fail on kernels without those modules.
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fail(fmt.Errorf("tun: netlink: %w", err))
	}
	l := &link{h: h}
	if l.index, err = configure(h, name, o); err != nil {
		h.Close()
		return fail(err)
	}
	l.refs.Store(int32(len(devs)))
	for _, d := range devs {
		d.link = l
	}
	return devs, nil
}

// configure sets the link's MTU, txqueuelen, addresses, state and routes,
// and returns its index.
func configure(h *netlink.Handle, name string, o Options) (int, error) {
	link, err := h.LinkByName(name)
	if err != nil {
		return 0, fmt.Errorf("tun: %s: %w", name, err)
	}
	if err := h.LinkSetMTU(link, o.MTU); err != nil {
		return 0, fmt.Errorf("tun: %s: set MTU %d: %w", name, o.MTU, err)
	}
	if err := h.LinkSetTxQLen(link, o.TxQueueLen); err != nil {
		return 0, fmt.Errorf("tun: %s: set txqueuelen %d: %w", name, o.TxQueueLen, err)
	}
	for _, p := range o.Addrs {
		a := &netlink.Addr{IPNet: prefixNet(p)}
		if p.Addr().Is6() {
			a.Flags = syscall.IFA_F_NODAD // usable at once, no duplicate detection on a point-to-point TUN
		}
		if err := h.AddrAdd(link, a); err != nil {
			return 0, fmt.Errorf("tun: %s: add address %v: %w", name, p, err)
		}
	}
	index := link.Attrs().Index
	if o.Down {
		return index, nil
	}
	if err := h.LinkSetUp(link); err != nil {
		return 0, fmt.Errorf("tun: %s: set up: %w", name, err)
	}
	waitLocal(h, o.Addrs)
	if err := syncRoutes(h, index, o.Routes); err != nil {
		return 0, fmt.Errorf("tun: %s: %w", name, err)
	}
	return index, nil
}

// VIPRoutes are the host routes that send every VIP of cfg into the TUN:
// one /32 or /128 per distinct VIP, in config order.
func VIPRoutes(cfg *policy.Config) []netip.Prefix {
	seen := map[netip.Addr]bool{}
	var out []netip.Prefix
	for _, vs := range cfg.Services {
		for _, v := range vs.VIPs {
			if v = v.Unmap(); !seen[v] {
				seen[v] = true
				out = append(out, netip.PrefixFrom(v, v.BitLen()))
			}
		}
	}
	return out
}

// SyncVIPs routes exactly the VIPs of cfg through the interface: weir run
// calls it after each reload (Open routed those of the first config).
func (d *Device) SyncVIPs(cfg *policy.Config) error { return d.SyncRoutes(VIPRoutes(cfg)) }

// SyncRoutes makes the routes through the interface exactly want: it adds
// the missing ones and removes the others, except the kernel's own routes
// for the interface's addresses. Any queue of the interface may be asked;
// it works from any goroutine (the netlink socket lives in the interface's
// namespace) until the last queue is closed, and needs CAP_NET_ADMIN.
func (d *Device) SyncRoutes(want []netip.Prefix) error {
	l := d.link
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.refs.Load() <= 0 {
		return os.ErrClosed
	}
	if err := syncRoutes(l.h, l.index, want); err != nil {
		return fmt.Errorf("tun: %s: %w", d.name, err)
	}
	return nil
}

// rtProtKernel marks the routes the kernel adds for an interface's own
// addresses (RTPROT_KERNEL); they are not ours to remove.
const rtProtKernel = 2

func syncRoutes(h *netlink.Handle, index int, want []netip.Prefix) error {
	have := map[netip.Prefix]netlink.Route{}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := h.RouteList(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: index}}, fam)
		if err != nil {
			return fmt.Errorf("list routes: %w", err)
		}
		for _, r := range rs {
			if r.Dst == nil || r.Protocol == rtProtKernel {
				continue
			}
			ones, _ := r.Dst.Mask.Size()
			if a, ok := netip.AddrFromSlice(r.Dst.IP); ok {
				have[netip.PrefixFrom(a.Unmap(), ones)] = r
			}
		}
	}
	var errs []error
	wantSet := map[netip.Prefix]bool{}
	for _, p := range want {
		p = p.Masked()
		wantSet[p] = true
		if _, ok := have[p]; ok {
			continue
		}
		r := netlink.Route{LinkIndex: index, Dst: prefixNet(p)}
		if err := h.RouteReplace(&r); err != nil {
			errs = append(errs, fmt.Errorf("route %v: %w", p, err))
		}
	}
	for p, r := range have {
		if !wantSet[p] {
			if err := h.RouteDel(&r); err != nil {
				errs = append(errs, fmt.Errorf("remove route %v: %w", p, err))
			}
		}
	}
	return errors.Join(errs...)
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
// returns it in bufs[0][offset:] (an offload queue: up to BatchSize
// packets, each with its virtio-net header before offset). A packet longer than the buffer is
// dropped and counted, and Read waits for the next. After Close it
// returns os.ErrClosed.
func (d *Device) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	if len(bufs) == 0 {
		return 0, nil
	}
	if d.vnet != nil {
		return d.readVnet(bufs, sizes, offset)
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

// Write implements datapath.Device: one write(2) per packet (an offload
// queue sends each with the virtio-net header before offset). A packet over
// the MTU (and not a GSO super-packet), or one the kernel rejects (a malformed header), is dropped and
// counted, and the rest of the batch is still written.
func (d *Device) Write(bufs [][]byte, offset int) (int, error) {
	if d.vnet != nil {
		return d.writeVnet(bufs, offset)
	}
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

// BatchSize implements datapath.Device: water reads one packet per call,
// an offload queue up to vnetBatch.
func (d *Device) BatchSize() int {
	if d.vnet != nil {
		return vnetBatch
	}
	return 1
}

// MTU implements datapath.Device.
func (d *Device) MTU() int { return d.mtu }

// Close implements datapath.Device: it closes the queue, which wakes a
// pending Read. The interface goes away with its last queue.
func (d *Device) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	var err error
	if d.vnet != nil {
		err = d.vnet.f.Close()
	} else {
		err = d.ifce.Close()
	}
	if d.link != nil {
		d.link.release()
	}
	return err
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

// Stats are the raw counters of one TUN queue and of its interface. The
// kernel counts from the interface's side, the opposite of weir's: its
// "transmit" is toward weir's reader, its "receive" what weir writes.
type Stats struct {
	// This queue's, as Device.Stats counts them.
	datapath.DeviceStats
	// WriteErrors counts packets of this queue the kernel refused on write
	// (a malformed header).
	WriteErrors uint64

	// The interface's (every queue), from the kernel's link statistics.
	// KernelTxDropped counts packets routed into the TUN that the kernel
	// dropped before weir read them: its queue (TxQueueLen) was full, the
	// reader too slow. KernelTxErrors counts those it failed to queue;
	// KernelRxDropped and KernelRxErrors the packets weir wrote that the
	// kernel dropped or refused (no route back, a bad header).
	KernelRxErrors, KernelRxDropped, KernelTxErrors, KernelTxDropped uint64
}

// TUNStats returns d's counters and its interface's kernel counters. It
// asks the kernel (a netlink request): call it from the control plane,
// not per packet. After the last queue is closed the kernel part is zero
// and the error os.ErrClosed.
func (d *Device) TUNStats() (Stats, error) {
	st := Stats{DeviceStats: d.Stats(), WriteErrors: d.txErrors.Load()}
	l := d.link
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.refs.Load() <= 0 {
		return st, os.ErrClosed
	}
	lk, err := l.h.LinkByIndex(l.index)
	if err != nil {
		return st, fmt.Errorf("tun: %s: %w", d.name, err)
	}
	if ks := lk.Attrs().Statistics; ks != nil {
		st.KernelRxErrors, st.KernelRxDropped = ks.RxErrors, ks.RxDropped
		st.KernelTxErrors, st.KernelTxDropped = ks.TxErrors, ks.TxDropped
	}
	return st, nil
}
