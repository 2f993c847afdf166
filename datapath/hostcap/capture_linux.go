package hostcap

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"weir/datapath"
)

// Capture is an open host-leg capture. Open starts its reader; Close stops
// it. Its methods are safe for concurrent use.
type Capture struct {
	file *os.File
	rc   syscall.RawConn
	opts Options

	mu    sync.RWMutex // guards flows' membership (the reader writes, under mu)
	flows map[flowKey]*flow
	// locals are the host's own addresses, weir's end of every host leg
	// (nil: not known, any address is). A flow whose weir end is none of
	// them is traffic the host forwards between others and a target (a
	// router's clients): not weir's, not tracked (Stats.Forwarded).
	locals  atomic.Pointer[map[netip.Addr]struct{}]
	nl      *netlink.Handle // the namespace's routing socket, for locals; the reader's
	targets atomic.Pointer[map[netip.AddrPort]struct{}]
	setMu   sync.Mutex // serialises SetTargets

	packets, malformed, refused atomic.Uint64
	forwarded                   atomic.Uint64
	statsMu                     sync.Mutex
	dropped                     uint64 // guarded by statsMu: tp_drops summed
	err                         atomic.Pointer[error]
	drainedAt                   atomic.Int64 // wall ns: everything queued before it was read
	// waiting: the reader found the queue empty and waits for the next
	// packet, every packet it took handled (see Sync).
	waiting atomic.Bool
	done    chan struct{}
	// released holds the flows whose connections' final readings took
	// them (Release), for the reader to drop after its next batch;
	// anyReleased says it is not empty.
	relMu       sync.Mutex
	released    []flowKey
	anyReleased atomic.Bool
	inqMu       sync.Mutex       // serialises idle's ioctl
	inq         int              // guarded by inqMu: readInq's SIOCINQ
	inqFn       func(fd uintptr) // guarded by inqMu: readInq, made once

	// The reader's own state.
	msgs    []mmsghdr
	iovs    []unix.Iovec
	bufs    [][]byte
	names   []unix.RawSockaddrLinklayer
	ctls    [][]byte
	scratch []byte
	t0      int64
	high    int // the most flows since the map was last made
	// sub is a routing socket subscribed to the host's address changes,
	// read without waiting (addrsChanged); addrsChecked: isLocal looked at
	// it during this batch.
	sub          int
	subBuf       [4096]byte
	addrsChecked bool
}

// mmsghdr is struct mmsghdr.
type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
}

const (
	bufLen  = datapath.VirtioNetHdrLen + SnapLen
	ctlLen  = 64
	maxIPv4 = 1 << 16
)

// Open opens the capture's socket (AF_PACKET: it needs CAP_NET_RAW), with
// a filter that keeps nothing until SetTargets, and starts its reader.
func Open(o Options) (*Capture, error) {
	if o.RcvBuf <= 0 {
		o.RcvBuf = DefaultRcvBuf
	}
	if o.TargetMinRTO <= 0 {
		o.TargetMinRTO = datapath.DefaultTargetMinRTO
	}
	if o.OwnMinRTO <= 0 {
		o.OwnMinRTO = datapath.DefaultTargetMinRTO
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.MaxFlows <= 0 {
		o.MaxFlows = DefaultMaxFlows
	}
	if o.Batch <= 0 {
		o.Batch = DefaultBatch
	}
	// Protocol 0: nothing is queued before the filter is on and the
	// socket bound.
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("hostcap: AF_PACKET socket (needs CAP_NET_RAW): %w", err)
	}
	fail := func(what string, err error) (*Capture, error) {
		unix.Close(fd)
		return nil, fmt.Errorf("hostcap: %s: %w", what, err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1); err != nil {
		return fail("PACKET_VNET_HDR", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1); err != nil {
		return fail("SO_TIMESTAMPNS", err)
	}
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, o.RcvBuf) != nil {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, o.RcvBuf); err != nil {
			return fail("SO_RCVBUF", err)
		}
	}
	if err := attach(fd, nil); err != nil {
		return fail("filter", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL)}); err != nil {
		return fail("bind", err)
	}
	// The routing sockets are this namespace's, like the packet socket,
	// whichever thread later reads the addresses through them: one
	// subscribed to address changes, first, then the addresses read.
	sub, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return fail("netlink socket", err)
	}
	if err := unix.Bind(sub, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: unix.RTMGRP_IPV4_IFADDR | unix.RTMGRP_IPV6_IFADDR}); err != nil {
		unix.Close(sub)
		return fail("netlink address subscription", err)
	}
	nl, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		unix.Close(sub)
		return fail("netlink", err)
	}
	f := os.NewFile(uintptr(fd), "hostcap")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		nl.Close()
		unix.Close(sub)
		return nil, fmt.Errorf("hostcap: %w", err)
	}
	c := &Capture{file: f, rc: rc, nl: nl, sub: sub, opts: o, flows: map[flowKey]*flow{}, done: make(chan struct{}),
		scratch: make([]byte, maxIPv4+64), t0: time.Now().UnixNano()}
	c.readLocals()
	empty := map[netip.AddrPort]struct{}{}
	c.targets.Store(&empty)
	c.msgs = make([]mmsghdr, o.Batch)
	c.iovs = make([]unix.Iovec, o.Batch)
	c.bufs = make([][]byte, o.Batch)
	c.names = make([]unix.RawSockaddrLinklayer, o.Batch)
	c.ctls = make([][]byte, o.Batch)
	for i := range c.msgs {
		c.bufs[i] = make([]byte, bufLen)
		c.ctls[i] = make([]byte, ctlLen)
		c.iovs[i].Base = &c.bufs[i][0]
		c.iovs[i].SetLen(bufLen)
		h := &c.msgs[i].hdr
		h.Name = (*byte)(unsafe.Pointer(&c.names[i]))
		h.Iov = &c.iovs[i]
		h.SetIovlen(1)
		h.Control = &c.ctls[i][0]
	}
	go c.run()
	return c, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// attach puts the filter for targets on fd (nil: keep nothing).
func attach(fd int, targets []netip.AddrPort) error {
	prog := []bpf.RawInstruction{{Op: 0x06}} // ret #0
	if len(targets) > 0 {
		var err error
		if prog, err = filterFor(targets); err != nil {
			return err
		}
	}
	// bpf.RawInstruction is struct sock_filter.
	fp := unix.SockFprog{Len: uint16(len(prog)), Filter: (*unix.SockFilter)(unsafe.Pointer(&prog[0]))}
	return unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &fp)
}

// SetTargets sets the targets whose legs are captured (the addresses and
// ports weir dials with host sockets): it replaces the kernel filter. The
// flows of targets no longer in the set stop being counted.
func (c *Capture) SetTargets(targets []netip.AddrPort) error {
	c.setMu.Lock()
	defer c.setMu.Unlock()
	set := make(map[netip.AddrPort]struct{}, len(targets))
	norm := make([]netip.AddrPort, 0, len(targets))
	for _, t := range targets {
		t = netip.AddrPortFrom(t.Addr().Unmap(), t.Port())
		set[t] = struct{}{}
		norm = append(norm, t)
	}
	c.targets.Store(&set)
	var err error
	cerr := c.rc.Control(func(fd uintptr) { err = attach(int(fd), norm) })
	if cerr != nil {
		return ErrClosed
	}
	if err != nil {
		return fmt.Errorf("hostcap: filter: %w", err)
	}
	return nil
}

// Segments returns the passive measurement of the flow from local (weir's
// socket) to remote (a target), or nil when the capture has not seen it.
func (c *Capture) Segments(local, remote netip.AddrPort) *datapath.SegStats {
	k := flowKey{netip.AddrPortFrom(local.Addr().Unmap(), local.Port()), netip.AddrPortFrom(remote.Addr().Unmap(), remote.Port())}
	c.mu.RLock()
	f := c.flows[k]
	c.mu.RUnlock()
	if f == nil {
		return nil
	}
	return &f.seg
}

// Release tells the capture that the connection's final reading has taken
// the flow's counts from local to remote: the reader drops the flow after
// its next batch, where it would otherwise keep it doneLinger (3 s) after
// its last packet: at thousands of short connections a second, most of
// the table. A packet of the flow that comes later without data (its last
// ACK, a late FIN or RST) makes no new flow; a new SYN on the same ports
// does. A flow the capture does not track (its target not captured, as
// under monitor.hostCapture: off after a reload) is not queued: with no
// packet to wake the reader, the queue would only grow.
func (c *Capture) Release(local, remote netip.AddrPort) {
	k := flowKey{netip.AddrPortFrom(local.Addr().Unmap(), local.Port()), netip.AddrPortFrom(remote.Addr().Unmap(), remote.Port())}
	c.mu.RLock()
	_, tracked := c.flows[k]
	c.mu.RUnlock()
	if !tracked {
		return
	}
	c.relMu.Lock()
	c.released = append(c.released, k)
	c.anyReleased.Store(true)
	c.relMu.Unlock()
}

// dropReleased drops the flows Release named; the reader calls it.
func (c *Capture) dropReleased() {
	c.relMu.Lock()
	keys := c.released
	c.released = nil
	c.anyReleased.Store(false)
	c.relMu.Unlock()
	c.mu.Lock()
	for _, k := range keys {
		delete(c.flows, k)
	}
	c.mu.Unlock()
}

// Stats returns the counters. It reads the kernel's drop count
// (PACKET_STATISTICS, which resets on each read) and adds it to the total.
func (c *Capture) Stats() Stats {
	c.statsMu.Lock()
	_ = c.rc.Control(func(fd uintptr) {
		if st, err := unix.GetsockoptTpacketStats(int(fd), unix.SOL_PACKET, unix.PACKET_STATISTICS); err == nil {
			c.dropped += uint64(st.Drops)
		}
	})
	d := c.dropped
	c.statsMu.Unlock()
	c.mu.RLock()
	n := len(c.flows)
	c.mu.RUnlock()
	return Stats{Packets: c.packets.Load(), Dropped: d, Malformed: c.malformed.Load(), Refused: c.refused.Load(),
		Forwarded: c.forwarded.Load(), Flows: n}
}

// Err returns why the reader stopped, or nil while it runs.
func (c *Capture) Err() error {
	if e := c.err.Load(); e != nil {
		return *e
	}
	return nil
}

// Sync waits until the reader has read every packet queued before the
// call, or for wait at most, and reports whether it had. A connection's
// final reading calls it first: the reader may lag the traffic (tens of
// ms on a loaded host), and a short connection would otherwise be read
// before its segments, or its SYN, were.
func (c *Capture) Sync(wait time.Duration) bool {
	t0 := time.Now().UnixNano()
	for end := t0 + int64(wait); ; {
		if c.drainedAt.Load() >= t0 || c.idle() {
			return true
		}
		select {
		case <-c.done:
			return false
		default:
		}
		if time.Now().UnixNano() >= end {
			return false
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// idle reports that the reader has handled every packet queued before the
// call: the socket's queue is empty (SIOCINQ: the length of its first
// packet) and, checked after it, the reader waits for the next packet,
// having handled every batch it took. Without it Sync would wait for a
// later packet (or its bound) whenever the reader had caught up before
// the call and nothing more came, the usual case.
func (c *Capture) idle() bool {
	c.inqMu.Lock()
	if c.inqFn == nil {
		c.inqFn = c.readInq
	}
	c.inq = -1
	err := c.rc.Control(c.inqFn)
	queued := c.inq
	c.inqMu.Unlock()
	if err != nil {
		return false
	}
	return queued == 0 && c.waiting.Load()
}

// readInq is idle's RawConn.Control callback (inqMu held): a method
// value made once, where a closure cost an allocation per call (about 5
// per connection, the final readings' Syncs).
func (c *Capture) readInq(fd uintptr) { c.inq, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }

// Close stops the reader and closes the socket.
func (c *Capture) Close() error {
	err := c.file.Close()
	<-c.done
	return err
}

func (c *Capture) run() {
	defer close(c.done)
	defer func() {
		c.nl.Close()
		unix.Close(c.sub)
	}()
	var lastSweep int64
	for {
		var n int
		var errno syscall.Errno
		err := c.rc.Read(func(fd uintptr) bool {
			for i := range c.msgs {
				c.msgs[i].hdr.SetControllen(ctlLen)
				c.msgs[i].hdr.Namelen = unix.SizeofSockaddrLinklayer
				c.msgs[i].n = 0
			}
			at := time.Now().UnixNano()
			c.waiting.Store(false) // before the batch it may take (idle)
			r, _, e := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&c.msgs[0])), uintptr(len(c.msgs)), unix.MSG_DONTWAIT, 0, 0)
			n, errno = int(r), e
			if e == unix.EAGAIN {
				c.drainedAt.Store(at) // the queue was empty: all before at is read
				c.waiting.Store(true)
			}
			return e != unix.EAGAIN
		})
		if err != nil {
			return // closed
		}
		switch errno {
		case 0:
		case unix.EINTR, unix.ENOBUFS:
			continue
		case unix.EINVAL:
			// A packet whose offload header the kernel could not give
			// (a GSO type other than TCP's): it is gone.
			c.malformed.Add(1)
			continue
		default:
			e := fmt.Errorf("hostcap: recvmmsg: %w", errno)
			c.err.Store(&e)
			return
		}
		c.addrsChecked = false
		for i := 0; i < n; i++ {
			c.handle(i)
		}
		if c.anyReleased.Load() {
			c.dropReleased()
		}
		if now := time.Now().UnixNano() - c.t0; now-lastSweep > int64(time.Second) {
			if c.addrsChanged() {
				c.readLocals()
			}
			c.sweep(now)
			lastSweep = now
		}
	}
}

// handle decodes message i of the last batch.
func (c *Capture) handle(i int) {
	m := &c.msgs[i]
	b := c.bufs[i][:min(int(m.n), bufLen)]
	if len(b) < datapath.VirtioNetHdrLen {
		c.malformed.Add(1)
		return
	}
	c.packets.Add(1)
	vh, pkt := b[:datapath.VirtioNetHdrLen], b[datapath.VirtioNetHdrLen:]
	sll := &c.names[i]
	off, ok := linkLen(sll.Hatype, pkt)
	if !ok || off >= len(pkt) {
		c.malformed.Add(1)
		return
	}
	ip := pkt[off:]
	ts, ok := stamp(c.ctls[i][:m.hdr.Controllen])
	if !ok {
		ts = time.Now().UnixNano()
	}
	c.segment(ip, vh, sll.Pkttype == unix.PACKET_OUTGOING, ts-c.t0)
}

// linkLen is the length of the link-layer header in front of the network
// header for ARP hardware type hatype.
func linkLen(hatype uint16, b []byte) (int, bool) {
	switch hatype {
	case unix.ARPHRD_ETHER, unix.ARPHRD_LOOPBACK:
		off := 14
		if len(b) < off {
			return 0, false
		}
		// 802.1Q / 802.1ad tags the NIC did not strip.
		for t := binary.BigEndian.Uint16(b[12:14]); t == 0x8100 || t == 0x88a8; {
			off += 4
			if len(b) < off {
				return 0, false
			}
			t = binary.BigEndian.Uint16(b[off-2 : off])
		}
		return off, true
	case unix.ARPHRD_NONE, unix.ARPHRD_IPGRE, unix.ARPHRD_TUNNEL, unix.ARPHRD_TUNNEL6, unix.ARPHRD_SIT, unix.ARPHRD_VOID:
		return 0, true
	}
	return 0, false
}

// stamp reads the SO_TIMESTAMPNS control message (a timespec).
func stamp(ctl []byte) (int64, bool) {
	for len(ctl) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&ctl[0]))
		l := int(h.Len)
		if l < unix.SizeofCmsghdr || l > len(ctl) {
			return 0, false
		}
		if h.Level == unix.SOL_SOCKET && h.Type == unix.SO_TIMESTAMPNS && l >= unix.CmsgLen(int(unsafe.Sizeof(unix.Timespec{}))) {
			ts := (*unix.Timespec)(unsafe.Pointer(&ctl[unix.CmsgLen(0)]))
			return ts.Nano(), true
		}
		ctl = ctl[min(unix.CmsgSpace(l-unix.CmsgLen(0)), len(ctl)):]
	}
	return 0, false
}

// segment records one captured packet: ip its network header onward (cut
// to the snap length), vh its virtio-net header, out whether it left the
// host, now its time (ns on the capture's clock).
func (c *Capture) segment(ip, vh []byte, out bool, now int64) {
	if len(ip) < 20 {
		c.malformed.Add(1)
		return
	}
	var total int
	switch ip[0] >> 4 {
	case 4:
		total = int(binary.BigEndian.Uint16(ip[2:4]))
	case 6:
		if len(ip) < 40 {
			c.malformed.Add(1)
			return
		}
		total = 40 + int(binary.BigEndian.Uint16(ip[4:6]))
	default:
		c.malformed.Add(1)
		return
	}
	if total > len(c.scratch) || total < 20 {
		c.malformed.Add(1) // a BIG TCP packet (length 0) or worse
		return
	}
	// Parse and the tracker want the datagram's whole length; only its
	// headers are read, so they go into a buffer of that length.
	caught := min(len(ip), total)
	b := c.scratch[:total]
	copy(b, ip[:caught])
	var pk datapath.Packet
	if datapath.Parse(b, &pk) != datapath.DropNone || pk.Proto != datapath.ProtoTCP || pk.NonFirstFragment ||
		pk.L4Off+20 > caught || pk.L4Off+int(b[pk.L4Off+12]>>4)*4 > caught {
		c.malformed.Add(1)
		return
	}
	targets := *c.targets.Load()
	src, dst := pk.SrcAddrPort(), pk.DstAddrPort()
	var k flowKey
	var fromTarget bool
	if _, ok := targets[dst]; ok {
		if !out {
			return // arriving at a target on this host, or forwarded: seen leaving
		}
		k = flowKey{local: src, remote: dst}
	} else if _, ok := targets[src]; ok {
		if out {
			return // a target on this host sending, or forwarded: seen arriving
		}
		k, fromTarget = flowKey{local: dst, remote: src}, true
	} else {
		return // the filter's fallback (every TCP segment) let it through
	}
	f := c.flows[k] // the reader is the only writer: no lock to read
	if pk.TCPFlags&(datapath.TCPSyn|datapath.TCPAck) == datapath.TCPSyn && !fromTarget && f != nil && f.closed {
		f = nil // the port reused: a new flow
	}
	if f == nil {
		if !c.isLocal(k.local.Addr()) {
			c.forwarded.Add(1)
			return
		}
		if pk.TCPFlags&datapath.TCPSyn == 0 && pk.Len <= pk.L4Off+int(b[pk.L4Off+12]>>4)*4 {
			// No SYN and no data: the tail of a flow already released or
			// swept (its last ACK, a late FIN or RST), or a keepalive of
			// one from before the capture. Nothing to measure; a flow
			// met mid-stream starts at its next data segment.
			return
		}
		c.mu.Lock()
		if len(c.flows) >= c.opts.MaxFlows {
			if _, had := c.flows[k]; !had {
				c.mu.Unlock()
				c.refused.Add(1)
				return
			}
		}
		f = &flow{}
		c.flows[k] = f
		c.high = max(c.high, len(c.flows))
		c.mu.Unlock()
	}
	f.last = now
	if pk.TCPFlags&(datapath.TCPFin|datapath.TCPRst) != 0 {
		f.closed = true
		switch {
		case pk.TCPFlags&datapath.TCPRst != 0:
			f.fins |= finRst
		case fromTarget:
			f.fins |= finIn
		default:
			f.fins |= finOut
		}
	}
	segs, _ := datapath.Segments(vh, b, &pk)
	minRTO := c.opts.OwnMinRTO
	if fromTarget {
		minRTO = c.opts.TargetMinRTO
	}
	f.seg.Observe(b, &pk, segs, fromTarget, time.Duration(now), minRTO)
}

// sweep drops the flows idle past their timeout, and those of targets no
// longer captured. A map that holds a quarter of the flows it once did is
// made anew: a Go map keeps the table of its largest size, which a burst
// (thousands of connections a second, each lingering) leaves behind.
func (c *Capture) sweep(now int64) {
	targets := *c.targets.Load()
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, f := range c.flows {
		idle := now - f.last
		_, kept := targets[k.remote]
		if !kept || idle > int64(f.linger(c.opts.IdleTimeout)) {
			delete(c.flows, k)
		}
	}
	if c.high > shrinkAbove && len(c.flows) < c.high/4 {
		m := make(map[flowKey]*flow, len(c.flows)) // not maps.Clone: it keeps the table's size
		for k, f := range c.flows {
			m[k] = f
		}
		c.flows = m
		c.high = len(c.flows)
	}
}

// shrinkAbove is the table size below which sweep leaves the map as it is.
const shrinkAbove = 1024

// isLocal reports whether a (the weir end of a new flow) is one of the
// host's addresses. The reader reads them at Open and again whenever the
// kernel has announced a change (RTM_NEWADDR, RTM_DELADDR on the
// subscription socket), looking at that socket at most once a batch: an
// address added since Open (weir started before its interface was up)
// counts from its first connection's SYN, whose announcement the kernel
// queued before the SYN could be sent.
func (c *Capture) isLocal(a netip.Addr) bool {
	l := c.locals.Load()
	if l == nil {
		return true
	}
	if _, ok := (*l)[a]; ok {
		return true
	}
	if c.addrsChecked {
		return false
	}
	c.addrsChecked = true
	if !c.addrsChanged() {
		return false
	}
	c.readLocals()
	_, ok := (*c.locals.Load())[a]
	return ok
}

// addrsChanged drains the address subscription and reports whether the
// kernel announced anything (or overran it: ENOBUFS) since the last call.
func (c *Capture) addrsChanged() bool {
	if c.nl == nil {
		return false
	}
	changed := false
	for {
		n, _, err := unix.Recvfrom(c.sub, c.subBuf[:], unix.MSG_DONTWAIT)
		switch {
		case err == unix.ENOBUFS:
			changed = true
			continue
		case err != nil:
			return changed
		case n > 0:
			changed = true
		}
	}
}

// readLocals reads the host's addresses (locals): at Open, then whenever
// the kernel announced a change (isLocal, and once a second for those
// removed). A failed read keeps the addresses known.
func (c *Capture) readLocals() {
	if c.nl == nil {
		return
	}
	addrs, err := c.nl.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return
	}
	set := make(map[netip.Addr]struct{}, len(addrs))
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			set[ip.Unmap()] = struct{}{}
		}
	}
	c.locals.Store(&set)
}
