package udp

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// HostDialer dials targets with kernel UDP sockets, one connected socket
// per session (so the target's replies come back to that session alone).
// The zero value works.
type HostDialer struct {
	// Dialer is the net.Dialer used; its zero value works.
	Dialer net.Dialer
}

// DialUDP implements Dialer.
func (d *HostDialer) DialUDP(ctx context.Context, addr netip.AddrPort) (Target, error) {
	c, err := d.Dialer.DialContext(ctx, "udp", addr.String())
	if err != nil {
		return nil, err
	}
	uc, ok := c.(*net.UDPConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("udp: dial %v: not a UDP socket (%T)", addr, c)
	}
	rc, err := uc.SyscallConn()
	if err != nil {
		uc.Close()
		return nil, err
	}
	t := &hostTarget{UDPConn: uc, rc: rc, gso: true}
	if addr.Addr().Unmap().Is4() {
		t.bc = ipv4.NewPacketConn(uc)
	} else {
		t.bc = ipv6.NewPacketConn(uc)
	}
	return t, nil
}

// batchConn is x/net's ipv4 or ipv6 PacketConn: sendmmsg.
type batchConn interface {
	WriteBatch(ms []ipv4.Message, flags int) (int, error)
}

// hostTarget is a connected kernel UDP socket whose reader waits for a
// datagram holding no buffer (the poller's readiness, then one read).
type hostTarget struct {
	*net.UDPConn
	rc   syscall.RawConn
	bc   batchConn
	msgs []ipv4.Message // WriteBatch's, reused: one writer (the VIP reader)
	// gso: UDP_SEGMENT sends work on this socket (cleared by the first
	// that the kernel refuses as unsupported); gsoBuf and oob are its
	// send buffer and control message, reused; gsoSends counts them.
	gso      bool
	gsoBuf   []byte
	oob      []byte
	gsoSends uint64
	// gsoTooBig is the smallest datagram size the kernel refused to
	// segment (EINVAL: a segment beyond the route's MTU); runs of that
	// size or more go by sendmmsg. Zero: none refused.
	gsoTooBig int
}

// A UDP_SEGMENT send carries at most gsoSegments datagrams (the kernel's
// UDP_MAX_SEGMENTS) and gsoBytes of payload (an IP datagram's 65 535
// bytes less the IPv6 and UDP headers, with room to spare).
const (
	gsoSegments = 64
	gsoBytes    = 65000
)

// gsoRun is how many datagrams from the start of bs one UDP_SEGMENT send
// can carry: each the size of the first, the last of them no larger.
func gsoRun(bs [][]byte) int {
	size := len(bs[0])
	if size == 0 {
		return 1
	}
	n, total := 1, size
	for n < len(bs) && n < gsoSegments && total+len(bs[n]) <= gsoBytes && len(bs[n]) <= size && len(bs[n]) > 0 {
		total += len(bs[n])
		n++
		if len(bs[n-1]) < size {
			break
		}
	}
	return n
}

// WriteBatch implements BatchWriter: each run of equal datagrams in one
// UDP_SEGMENT send (the kernel passes them through its UDP and IP output,
// the route and the device once, and cuts them at the end), the others in
// as few sendmmsg calls as the socket takes them.
func (t *hostTarget) WriteBatch(bs [][]byte) (int, error) {
	done := 0
	for t.gso && done < len(bs) {
		n := gsoRun(bs[done:])
		size := len(bs[done])
		if n < 2 || t.gsoTooBig > 0 && size >= t.gsoTooBig {
			break
		}
		err := t.sendGSO(bs[done : done+n])
		switch {
		case err == nil:
			done += n
			continue
		case errors.Is(err, unix.EINVAL):
			t.gsoTooBig = size
		case errors.Is(err, unix.EIO), errors.Is(err, unix.ENOPROTOOPT), errors.Is(err, unix.EOPNOTSUPP):
			t.gso = false // the kernel or the device cannot: sendmmsg from now on
		default:
			return done, err
		}
		break
	}
	if done == len(bs) {
		return done, nil
	}
	n, err := t.writeMsgs(bs[done:])
	return done + n, err
}

// sendGSO sends bs, every datagram but the last of one size, as one
// buffer with a UDP_SEGMENT control message of that size. The kernel
// refuses it with EINVAL when a segment would exceed the route's MTU, and
// with EIO (or ENOPROTOOPT, EOPNOTSUPP) when it or the device cannot
// segment UDP at all.
func (t *hostTarget) sendGSO(bs [][]byte) error {
	if t.gsoBuf == nil {
		t.gsoBuf = make([]byte, 0, gsoBytes)
		t.oob = make([]byte, unix.CmsgSpace(2))
		h := (*unix.Cmsghdr)(unsafe.Pointer(&t.oob[0]))
		h.Level, h.Type = unix.IPPROTO_UDP, unix.UDP_SEGMENT
		h.SetLen(unix.CmsgLen(2))
	}
	buf := t.gsoBuf[:0]
	for _, b := range bs {
		buf = append(buf, b...)
	}
	binary.NativeEndian.PutUint16(t.oob[unix.CmsgLen(0):], uint16(len(bs[0])))
	var serr error
	err := t.rc.Write(func(fd uintptr) bool {
		_, serr = unix.SendmsgN(int(fd), buf, t.oob, nil, 0)
		return !errors.Is(serr, unix.EAGAIN) // full: wait for the poller
	})
	if err == nil {
		err = serr
	}
	if err == nil {
		t.gsoSends++
	}
	return err
}

// writeMsgs writes bs with sendmmsg, in as few calls as the socket takes
// them.
func (t *hostTarget) writeMsgs(bs [][]byte) (int, error) {
	if cap(t.msgs) < len(bs) {
		t.msgs = make([]ipv4.Message, len(bs))
		for i := range t.msgs {
			t.msgs[i].Buffers = make([][]byte, 1)
		}
	}
	ms := t.msgs[:len(bs)]
	for i, b := range bs {
		ms[i].Buffers[0] = b
	}
	// The poller waits while the socket's buffer is full; a short count
	// is a datagram the kernel refused (the next call reports why).
	done := 0
	var err error
	for done < len(ms) && err == nil {
		var n int
		n, err = t.bc.WriteBatch(ms[done:], 0)
		if n == 0 && err == nil {
			err = io.ErrShortWrite
		}
		done += n
	}
	for i := range ms {
		ms[i].Buffers[0] = nil
	}
	return done, err
}

// ReadDatagram implements Target.
func (t *hostTarget) ReadDatagram(pool *sync.Pool) (*[]byte, int, error) {
	var (
		bp   *[]byte
		n    int
		rerr error
	)
	err := t.rc.Read(func(fd uintptr) bool {
		bp = pool.Get().(*[]byte)
		var e error
		n, _, e = syscall.Recvfrom(int(fd), *bp, syscall.MSG_DONTWAIT)
		if errors.Is(e, syscall.EAGAIN) || errors.Is(e, syscall.EINTR) {
			pool.Put(bp)
			bp = nil
			return false // not ready: wait for the poller, no buffer held
		}
		rerr = e
		return true
	})
	if err == nil {
		err = rerr
	}
	if err != nil {
		if bp != nil {
			pool.Put(bp)
		}
		return nil, 0, err
	}
	return bp, n, nil
}
