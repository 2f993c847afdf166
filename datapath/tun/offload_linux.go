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

// readVnet is Read on an offload queue: see the file comment.
func (d *Device) readVnet(bufs [][]byte, sizes []int, offset int) (int, error) {
	if offset < datapath.VirtioNetHdrLen {
		return 0, fmt.Errorf("tun: %s: offset %d leaves no room for the %d-byte virtio-net header", d.name, offset, datapath.VirtioNetHdrLen)
	}
	n := 0
	var rerr error
	var rxBytes uint64
	err := d.vnet.rc.Read(func(fd uintptr) bool {
		for n < len(bufs) && n < vnetBatch {
			b := bufs[n][offset-datapath.VirtioNetHdrLen:]
			m, err := unix.Read(int(fd), b)
			switch {
			case err == unix.EAGAIN:
				return n > 0 // nothing yet: wait in the poller
			case err == unix.EINTR:
				continue
			case err != nil:
				rerr = err
				return true
			}
			size := m - datapath.VirtioNetHdrLen
			if size <= 0 || ipLen(b[datapath.VirtioNetHdrLen:m]) > size {
				// No packet after the header, or one the buffer cut.
				d.tooBig.Add(1)
				continue
			}
			sizes[n] = size
			rxBytes += uint64(size)
			n++
		}
		return true
	})
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
// virtio-net header its writer put before offset.
func (d *Device) writeVnet(bufs [][]byte, offset int) (int, error) {
	if d.closed.Load() {
		return 0, os.ErrClosed
	}
	if offset < datapath.VirtioNetHdrLen {
		return 0, fmt.Errorf("tun: %s: offset %d leaves no room for the %d-byte virtio-net header", d.name, offset, datapath.VirtioNetHdrLen)
	}
	var h datapath.VirtioNetHdr
	var txPackets, txBytes uint64
	i := 0
	err := d.vnet.rc.Write(func(fd uintptr) bool {
		for ; i < len(bufs); i++ {
			buf := bufs[i]
			if offset > len(buf) {
				d.tooBig.Add(1)
				continue
			}
			p := buf[offset-datapath.VirtioNetHdrLen:]
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
					txPackets++
					txBytes += uint64(size)
				}
				break
			}
		}
		return true
	})
	d.txPackets.Add(txPackets)
	d.txBytes.Add(txBytes)
	if err != nil && (d.closed.Load() || errors.Is(err, os.ErrClosed)) {
		return 0, os.ErrClosed
	}
	return len(bufs), nil
}
