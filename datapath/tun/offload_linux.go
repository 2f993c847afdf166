//go:build linux

package tun

// Offload queue flow
//
//	open: /dev/net/tun, TUNSETIFF with IFF_TUN|IFF_NO_PI|IFF_VNET_HDR
//	      ─► TUNSETOFFLOAD TUN_F_CSUM|TUN_F_TSO4|TUN_F_TSO6 (refused: the
//	      kernel cannot offload; auto falls back to water) ─► non-blocking,
//	      in the Go poller
//	Read: in one wake-up of the poller, read(2) until the batch is full or
//	      the queue is empty: each read is one packet or one TCP
//	      super-packet of up to 64 KiB, its virtio-net header in the
//	      VirtioNetHdrLen bytes before offset
//	Write: in one poller call, write(2) each packet with the header before
//	      it; the kernel cuts super-packets into MSS segments (copying the
//	      IP header, ToS included, into each) and finishes partial
//	      checksums
//
// This is what wireguard-go's tun package does at the file level
// (IFF_VNET_HDR, TUNSETOFFLOAD), without its gsoSplit and handleGRO: weir
// wants the super-packets whole, through its datapath and into gVisor,
// rather than split into MTU-sized packets on read.

//go:generate go run golang.org/x/tools/cmd/stringer@v0.52.0 -type=OffloadMode -linecomment -output=offloadmode_string_linux.go
import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"weir/datapath"
)

// OffloadMode says whether Open uses virtio-net headers and GSO offload.
type OffloadMode uint8

const (
	// OffloadOff opens plain queues through water: one packet per read.
	OffloadOff OffloadMode = iota // off
	// OffloadAuto offloads when the kernel accepts TUNSETOFFLOAD and
	// falls back to OffloadOff otherwise.
	OffloadAuto // auto
	// OffloadOn offloads or fails.
	OffloadOn // on
)

// ParseOffload parses "auto", "on" or "off".
func ParseOffload(s string) (OffloadMode, error) {
	switch s {
	case "auto":
		return OffloadAuto, nil
	case "on":
		return OffloadOn, nil
	case "off":
		return OffloadOff, nil
	}
	return 0, fmt.Errorf("offload %q: want auto, on or off", s)
}

// GSOMax is the largest packet, IP header included, an offload queue reads
// or writes: the IPv4 total length limit, which bounds the kernel's TSO
// segments too.
const GSOMax = 65535

// vnetBatch is the most packets one offload Read returns.
const vnetBatch = 64

// offloadFlags are the offloads weir asks of the TUN: checksum, TCP
// segmentation for IPv4 and IPv6. No UDP (USO): gVisor emits no UDP GSO.
const offloadFlags = unix.TUN_F_CSUM | unix.TUN_F_TSO4 | unix.TUN_F_TSO6

// vnetQueue is one queue opened with IFF_VNET_HDR and offload on.
type vnetQueue struct {
	f  *os.File
	rc syscall.RawConn

	rmu sync.Mutex
	r   vnetRead // protected by rmu
	wmu sync.Mutex
	w   vnetWrite // protected by wmu
}

// openVnet opens one offload queue of the TUN called name ("" lets the
// kernel pick) and returns it with the interface's name. An error wrapping
// errNoOffload means the kernel refused the offload itself.
func openVnet(name string, multi bool) (*vnetQueue, string, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, "", fmt.Errorf("open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, "", err
	}
	flags := uint16(unix.IFF_TUN | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if multi {
		flags |= unix.IFF_MULTI_QUEUE
	}
	ifr.SetUint16(flags)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, "", fmt.Errorf("TUNSETIFF: %w", err)
	}
	if err := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, offloadFlags); err != nil {
		unix.Close(fd)
		return nil, "", fmt.Errorf("%w: TUNSETOFFLOAD: %w", errNoOffload, err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, "", err
	}
	f := os.NewFile(uintptr(fd), "/dev/net/tun")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, "", err
	}
	return &vnetQueue{f: f, rc: rc}, ifr.Name(), nil
}

// errNoOffload marks a kernel that opened the TUN but refused offload.
var errNoOffload = errors.New("offload unavailable")

// Offload reports whether the queue carries GSO super-packets with
// virtio-net headers.
func (d *Device) Offload() bool { return d.vnet != nil }

// GSOMaxSize implements datapath.Offloader: GSOMax on an offload queue,
// zero on a plain one.
func (d *Device) GSOMaxSize() int {
	if d.vnet != nil {
		return GSOMax
	}
	return 0
}

var _ datapath.Offloader = (*Device)(nil)

// readVnet is Read on an offload queue: see the file comment. The
// poller's callback and its state live in the queue (vnetRead), made
// once: a closure here cost a few allocations per call, per packet
// batch. The poll descriptor's read lock serializes RawConn.Read
// callers already; rmu guards the state around it.
func (d *Device) readVnet(bufs [][]byte, sizes []int, offset int) (int, error) {
	if offset < datapath.VirtioNetHdrLen {
		return 0, fmt.Errorf("tun: %s: offset %d leaves no room for the %d-byte virtio-net header", d.name, offset, datapath.VirtioNetHdrLen)
	}
	q := d.vnet
	q.rmu.Lock()
	r := &q.r
	if r.fn == nil {
		r.d, r.fn = d, r.read
	}
	r.bufs, r.sizes, r.offset, r.n, r.err, r.bytes = bufs, sizes, offset, 0, nil, 0
	err := q.rc.Read(r.fn)
	n, rerr, rxBytes := r.n, r.err, r.bytes
	r.bufs, r.sizes, r.err = nil, nil, nil
	q.rmu.Unlock()
	if n > 0 {
		d.rxPackets.Add(uint64(n))
		d.rxBytes.Add(rxBytes)
	}
	if err == nil {
		err = rerr
	}
	if err != nil {
		if d.closed.Load() || errors.Is(err, os.ErrClosed) || errors.Is(err, syscall.EBADFD) {
			return n, os.ErrClosed
		}
		return n, fmt.Errorf("tun: %s: read: %w", d.name, err)
	}
	return n, nil
}

// vnetRead is an offload queue's state for one readVnet.
type vnetRead struct {
	d      *Device
	bufs   [][]byte
	sizes  []int
	offset int
	n      int    // packets read into bufs
	err    error  // a read error other than EAGAIN and EINTR
	bytes  uint64 // of the n packets
	fn     func(fd uintptr) bool
}

// read is the RawConn.Read callback: false makes the poller wait for
// readability and call it again.
func (r *vnetRead) read(fd uintptr) bool {
	for r.n < len(r.bufs) && r.n < vnetBatch {
		b := r.bufs[r.n][r.offset-datapath.VirtioNetHdrLen:]
		m, err := unix.Read(int(fd), b)
		switch {
		case err == unix.EAGAIN:
			return r.n > 0 // nothing yet: wait in the poller
		case err == unix.EINTR:
			continue
		case err != nil:
			r.err = err
			return true
		}
		size := m - datapath.VirtioNetHdrLen
		if size <= 0 || ipLen(b[datapath.VirtioNetHdrLen:m]) > size {
			// No packet after the header, or one the buffer cut.
			r.d.tooBig.Add(1)
			continue
		}
		r.sizes[r.n] = size
		r.bytes += uint64(size)
		r.n++
	}
	return true
}

// ipLen returns the length the IP header of p claims, or 0 when p is too
// short to say.
func ipLen(p []byte) int {
	switch {
	case len(p) >= 4 && p[0]>>4 == 4:
		return int(p[2])<<8 | int(p[3])
	case len(p) >= 6 && p[0]>>4 == 6:
		return 40 + (int(p[4])<<8 | int(p[5]))
	}
	return 0
}

// writeVnet is Write on an offload queue: each packet goes out with the
// virtio-net header its writer put before offset. Its poller callback and
// state live in the queue (vnetWrite), as readVnet's do.
func (d *Device) writeVnet(bufs [][]byte, offset int) (int, error) {
	if d.closed.Load() {
		return 0, os.ErrClosed
	}
	if offset < datapath.VirtioNetHdrLen {
		return 0, fmt.Errorf("tun: %s: offset %d leaves no room for the %d-byte virtio-net header", d.name, offset, datapath.VirtioNetHdrLen)
	}
	q := d.vnet
	q.wmu.Lock()
	w := &q.w
	if w.fn == nil {
		w.d, w.fn = d, w.write
	}
	w.bufs, w.offset, w.i, w.packets, w.bytes = bufs, offset, 0, 0, 0
	err := q.rc.Write(w.fn)
	txPackets, txBytes := w.packets, w.bytes
	w.bufs = nil
	q.wmu.Unlock()
	d.txPackets.Add(txPackets)
	d.txBytes.Add(txBytes)
	if err != nil && (d.closed.Load() || errors.Is(err, os.ErrClosed)) {
		return 0, os.ErrClosed
	}
	return len(bufs), nil
}

// vnetWrite is an offload queue's state for one writeVnet.
type vnetWrite struct {
	d       *Device
	bufs    [][]byte
	offset  int
	i       int // the next packet of bufs
	packets uint64
	bytes   uint64
	fn      func(fd uintptr) bool
}

// write is the RawConn.Write callback: false (the queue full) makes the
// poller wait for writability and call it again, from packet i on.
func (w *vnetWrite) write(fd uintptr) bool {
	d := w.d
	var h datapath.VirtioNetHdr
	for ; w.i < len(w.bufs); w.i++ {
		buf := w.bufs[w.i]
		if w.offset > len(buf) {
			d.tooBig.Add(1)
			continue
		}
		p := buf[w.offset-datapath.VirtioNetHdrLen:]
		size := len(p) - datapath.VirtioNetHdrLen
		h.Decode(p)
		if size > GSOMax || (size > d.mtu && !h.IsGSO()) {
			d.tooBig.Add(1)
			continue
		}
		for {
			_, err := unix.Write(int(fd), p)
			if err == unix.EINTR {
				continue
			}
			if err == unix.EAGAIN {
				return false // the queue is full: wait until writable
			}
			if err != nil {
				d.txErrors.Add(1)
			} else {
				w.packets++
				w.bytes += uint64(size)
			}
			break
		}
	}
	return true
}
